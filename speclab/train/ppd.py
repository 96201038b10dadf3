"""Train Parallel Prompt Decoding's prompt tokens (speclab/models/ppd.py) on the target's own text:
`code-ppd`, and SmolLM2's measured against `smollm2-medusa`.

    speclab train ppd --target code-target --self-text 400 --out speclab/zoo/code-ppd --minutes 8
    speclab train ppd --target smollm2-135m --self-text 200 --out DIR --minutes 40

The target is frozen; the m prompt vectors are the only parameters (m x C numbers). Each step runs
the target once over a batch of text windows with m prompt rows after each of `--anchors` positions
per window (every position with 0), under the mask a verify gives them (models.ppd.prompt_mask:
prompt row (a, j) at position a + j sees the text up to a and prompt rows (a, < j)). The text rows
see only text, so the same forward gives the teacher: the target's distribution of token a+1+j
given the true text, at text row a + j. Loss per prompt row: soft cross-entropy to that distribution
(PPD's distillation) + `--hard-weight` x cross-entropy to its greedy token.

The text: `--data-dirs` sets (rows.safetensors, as the heads read them) and / or `--self-text N`
(Clover's cached greedy continuations of N stdlib prefixes, plus answers to the seed questions when
the target has a chat template). Each eval measures, on held-out windows, per offset how often the
rank-r guess was the target's greedy token (ranks 0..`--ranks`-1: `ppd_rank_acc` in the saved
config, which sizes the drafter's candidate tree). Saved when the tokens a round of 8 candidates
would commit by those rates (tau8) is the best so far: the training loss can fall while rank 0 alone
stalls (the target's guess for a token two ahead hedges), and the tree reads every rank.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.loop import BudgetLoop, add_options, command_line, cosine_lr, held_out, optimizer_step, set_lr


def get_args(argv):
    from speclab.train.clover import head_parser
    ap = head_parser("ppd", __doc__)
    add_options(ap, minutes=40.0, batch=4, seq_len=128, lr=1e-2, warmup=10, dev_help="unused: the prompt tokens "
                "are kept by held-out agreement on the training text's own split")
    ap.add_argument("--tokens", type=int, default=3, help="prompt tokens m: guesses for tokens t+2 .. t+1+m")
    ap.add_argument("--anchors", type=int, default=32, help="positions per window that get prompt rows (0: all)")
    ap.add_argument("--hard-weight", type=float, default=0.1, help="CE weight on the target's greedy token")
    ap.add_argument("--ranks", type=int, default=4, help="ranks measured per offset for ppd_rank_acc")
    ap.add_argument("--eval-windows", type=int, default=32, help="held-out windows an eval reads (at most)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the --minutes budget)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.minutes <= 0 or args.anchors < 0 or args.ranks < 1:
        ap.error("--tokens and --ranks must be >= 1, --anchors >= 0 and --minutes > 0")
    return args


def training_text(base, tok, args) -> dict:
    """The --data-dirs sets, then the --self-text continuations, in head_data's row format."""
    from speclab.train.clover import self_text
    from speclab.train.head_data import first_rows, load_data
    from speclab.train.smollm2_data import merge
    parts = []
    if args.data_dirs:
        parts.append(first_rows(load_data(args.data_dirs), args.limit_rows))
    if args.self_text:
        parts.append(self_text(base, tok, args.target, args.self_text, args.max_new, args.seed))
    if not parts:
        raise SystemExit("no training text: give --data-dirs (sets written by `speclab train smollm2-draft "
                         "--gen-only`) or --self-text N")
    data = parts[0]
    for d in parts[1:]:
        data = merge({k: data[k] for k in d}, d)
    return data


def batch_rows(data: dict, spans, m: int, n_anchors: int, gen: torch.Generator):
    """tokens (B, T), visibility (B, R, R), positions (B, R), anchors (B, A) and the text length per
    window (B,); R = T + A m. Anchors are positions whose next token exists, drawn per window."""
    from speclab.models.ppd import prompt_mask
    T = max(e - s for s, e in spans)
    A = T - 1 if not n_anchors else min(n_anchors, T - 1)
    B = len(spans)
    tok = torch.zeros(B, T, dtype=torch.long)
    vis, pos, anc, n = [], [], [], torch.zeros(B, dtype=torch.long)
    for i, (s, e) in enumerate(spans):
        tok[i, :e - s] = data["tokens"][s:e].long()
        n[i] = e - s
        a = torch.randperm(max(e - s - 1, 1), generator=gen)[:A].sort().values
        a = torch.cat([a, a.new_zeros(A - len(a))])                    # a short window repeats anchor 0
        v, p = prompt_mask(T, m, a)
        vis.append(v), pos.append(p), anc.append(a)
    return tok, torch.stack(vis), torch.stack(pos), torch.stack(anc), n


def ppd_forward(base, prompts, tok, vis, pos, anc, n, ranks: int = 1, hard_weight: float = 0.1,
                soft_weight: float = 1.0):
    """The target over text + prompt rows. Returns the loss and per offset j (1..m) the top-1
    agreement with the target's greedy token (acc{j}, n{j}) and rank hits (rank{j}: (ranks,) counts)."""
    B, T = tok.shape
    m, A = prompts.shape[0], anc.shape[1]
    emb = base.get_input_embeddings()(tok)                                           # (B, T, C)
    x = torch.cat([emb, prompts.to(emb.dtype)[None, None].expand(B, A, m, -1).reshape(B, A * m, -1)], 1)
    mask = torch.where(vis, 0.0, float("-inf")).to(emb.dtype)[:, None]               # (B, 1, R, R)
    h = base.model(inputs_embeds=x, attention_mask=mask, position_ids=pos).last_hidden_state   # (B, R, C)
    j = torch.arange(1, m + 1)
    teach_row = (anc[:, :, None] + j).clamp(max=T - 1)                               # (B, A, m): text row a + j
    valid = (anc[:, :, None] + j) < n[:, None, None]
    with torch.no_grad():
        t_logits = base.lm_head(h.gather(1, teach_row.reshape(B, -1, 1).expand(-1, -1, h.shape[-1])))
        lp = t_logits.float().log_softmax(-1).view(B, A, m, -1)
    logits = base.lm_head(h[:, T:]).float().view(B, A, m, -1)
    greedy = lp.argmax(-1)                                                           # (B, A, m)
    ce = -soft_weight * (lp.exp() * logits.log_softmax(-1)).sum(-1)
    if hard_weight:
        ce = ce + hard_weight * F.cross_entropy(logits.permute(0, 3, 1, 2), greedy, reduction="none")
    loss = (ce * valid).sum() / valid.sum().clamp(min=1)
    stats = {}
    top = logits.detach().topk(ranks, -1).indices                                    # (B, A, m, ranks)
    for jj in range(m):
        v = valid[..., jj]
        hits = (top[..., jj, :] == greedy[..., jj, None]) & v[..., None]             # (B, A, ranks)
        stats[f"acc{jj + 1}"] = float(hits[..., 0].sum()) / max(int(v.sum()), 1)
        stats[f"n{jj + 1}"] = int(v.sum())
        stats[f"rank{jj + 1}"] = hits.sum((0, 1)).tolist()
    return loss, stats


@torch.no_grad()
def evaluate(base, prompts, data, spans, args) -> tuple[dict, list[list[float]]]:
    """Held-out top-1 agreement per offset (--anchors positions of every held-out window, the same
    ones at every eval) and the rank accuracies per offset."""
    gen = torch.Generator().manual_seed(1)
    m = prompts.shape[0]
    hit, cnt, rk = [0.0] * m, [0] * m, [[0] * args.ranks for _ in range(m)]
    for i in range(0, len(spans), args.batch):
        _, st = ppd_forward(base, prompts, *batch_rows(data, spans[i:i + args.batch], m, args.anchors, gen),
                            ranks=args.ranks)
        for j in range(m):
            hit[j] += st[f"acc{j + 1}"] * st[f"n{j + 1}"]
            cnt[j] += st[f"n{j + 1}"]
            rk[j] = [a + b for a, b in zip(rk[j], st[f"rank{j + 1}"])]
    ev = {f"acc{j + 1}": round(hit[j] / max(cnt[j], 1), 4) for j in range(m)}
    return ev, [[round(c / max(cnt[j], 1), 4) for c in rk[j]] for j in range(m)]


def expected_tokens(rank_acc, nodes: int = 8) -> float:
    """Tokens a round commits by the rank accuracies' estimate, with the calibrated tree of `nodes`
    candidates (1 + the paths' chances): what the drafter's tree is worth, every rank counted, where
    top-1 agreement counts rank 0 alone."""
    from speclab.decoding.drafters.ppd import path_chances
    from speclab.decoding.drafters.trees import calibrated_paths
    return round(1.0 + sum(path_chances(calibrated_paths(rank_acc, nodes), rank_acc)), 4)


def save_prompts(model, out: Path, argv, args, state: dict, data: dict, ev: dict, rank_acc) -> None:
    """The prompt tokens as an adapter directory (kind "ppd", fp16) with speclab_train.json beside."""
    from speclab.models.adapter import write_adapter
    write_adapter(out, {**model.config.to_dict(), "ppd_rank_acc": rank_acc},
                  {"base": args.target, "kind": "ppd", "shared": [], "head": "target"}, {"prompt": model.prompt},
                  {"command": shlex.join(["speclab", "train", "ppd", *argv]), "options": vars(args),
                   "steps": state["step"], "positions": len(data["tokens"]), "curve": state["log"], "held_out": ev,
                   "rank_acc": rank_acc})
    model.config.ppd_rank_acc = rank_acc
    print(f"saved {out}", flush=True)


def main(argv=None):
    from speclab.models import zoo
    from speclab.models.ppd import PromptTokens, ppd_config
    from speclab.train.checkpoint import save_checkpoint, start
    from speclab.train.clover import train_and_held_windows
    from speclab.train.smollm2_data import split_rows

    argv, args = command_line(get_args, argv)
    out = Path(args.out or "speclab-zoo/speclab_zoo/smollm2-ppd")
    base, tok = zoo.load(args.target)
    data = training_text(base, tok, args)
    base = zoo.load(args.target, dtype="fp32")[0]                     # fp32 master weights, frozen
    for p in base.parameters():
        p.requires_grad_(False)
    model = PromptTokens(base, ppd_config(base.config, args.tokens)).float()
    params = [model.prompt]
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    print(f"ppd: {model.prompt.numel()} trained numbers ({args.tokens} prompt tokens), {len(train_rows)} train rows, "
          f"{len(held_rows)} held out, {len(data['tokens'])} positions", flush=True)
    opt, ckpt, state = start(model, params, out, args.lr, args.resume)
    spans, held = train_and_held_windows(data, train_rows, held_rows, args.seq_len)
    held = held[::max(1, len(held) // args.eval_windows)][:args.eval_windows]     # spread over the held-out rows
    gen = torch.Generator().manual_seed(args.seed)

    def save():
        ev, rank_acc = evaluate(base, model.prompt, data, held, args)
        tau = expected_tokens(rank_acc)
        if held_out(state, {"tau8": tau}):                  # kept by the tree's expected tokens, not top-1
            state["log"][-1].update(ev)
            save_prompts(model, out, argv, args, state, data, {**ev, "tau8": tau}, rank_acc)
        else:
            state["log"][-1].update(ev)
        save_checkpoint(ckpt, model, opt, state)

    if not state["log"]:
        save()                                                    # step 0: where the vectors start
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save, "train ppd",
                      args.max_steps)
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        rows = batch_rows(data, [spans[j] for j in idx], args.tokens, args.anchors, gen)
        loss, st = ppd_forward(base, model.prompt, *rows, hard_weight=args.hard_weight)   # fp32: autocast ran slower
        optimizer_step(opt, loss, params)
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}",
                             **{k: f"{v:.2f}" for k, v in st.items() if k.startswith("acc")})
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
