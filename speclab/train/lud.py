"""Train LUD's fine-tune (speclab/models/lud.py): a low-rank delta on every projection of the target
and one placeholder embedding, on the target's own text, marked into lexical units by the target's
own confidence.

    speclab train lud --target code-target --self-text 400 --out speclab/zoo/code-lud --minutes 8
    speclab train lud --target smollm2-135m --self-text 240 --max-new 96 --out DIR --minutes 40

LUD (Sun et al. 2024) marks lexical units in its training text: runs of contiguous tokens the model
already predicts with confidence. speclab's reading, per window of the target's own text:

  1. the frozen target (the delta switched off) reads the window once: its distribution p_i of token
     i+1 at every position and the confidence c_i = p_i(x_{i+1}) of the text's own token;
  2. each of `--anchors` positions a gets k - 1 placeholder rows at positions a+1 .. a+k-1, which see
     the text up to a and the placeholders before them (models.ppd.prompt_mask, what a decoding
     forward gives them); placeholder j is taught p at row a+j, the token j+1 past the text's next;
  3. placeholder j lies inside the anchor's lexical unit when c_{a+1} .. c_{a+j} all reach
     `--unit-alpha` (the target is sure of every token between); its loss weighs 1 there and
     `--outside-weight` past the unit's end, so the delta spends itself where parallel decoding is
     sound and stays unsure past a boundary (the decoding rule reads that);
  4. the text rows are taught the frozen target's p (KL): the fine-tuned model keeps the target's
     own next token. Loss per row: KL(p || q) + `--hard-weight` x cross-entropy to p's argmax.

Held out (`--held-frac` of the rows): per placeholder the top-1 agreement with p (acc_j) and the
share inside a unit (unit_j); at the decoding rule's `--threshold`, the tokens a forward emits
(`tau_rule`: 1 + the confident run), the share of those run tokens equal to p's argmax (`precision`)
and the tokens a forward emits before the first wrong one (`tau_good`: what a verify would keep);
the text rows' KL to the target (`drift`). Saved when tau_good is the best so far (the untrained
start is written first and replaced by the first trained evaluation).
"""
from __future__ import annotations

import contextlib
import shlex
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from speclab.train.loop import BudgetLoop, add_options, command_line, cosine_lr, held_out, optimizer_step, set_lr


def get_args(argv):
    from speclab.train.clover import head_parser
    ap = head_parser("lud", __doc__)
    add_options(ap, minutes=40.0, batch=4, seq_len=128, lr=2e-3, warmup=10, dev_help="unused: kept by held-out "
                "tau_good on the training text's own split")
    ap.add_argument("--k", type=int, default=6, help="tokens a forward may emit: the real row's + k - 1 placeholders")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--anchors", type=int, default=16, help="positions per window that get placeholder rows")
    ap.add_argument("--unit-alpha", type=float, default=0.6, help="the target's confidence that marks a unit")
    ap.add_argument("--outside-weight", type=float, default=0.2, help="loss weight of a placeholder past its unit")
    ap.add_argument("--keep-weight", type=float, default=4.0, help="weight of the text rows' KL to the target")
    ap.add_argument("--hard-weight", type=float, default=0.1, help="CE weight on the target's greedy token")
    ap.add_argument("--threshold", type=float, default=0.9, help="the decoding rule's threshold the eval applies (saved: "
                    "the drafter's default)")
    ap.add_argument("--eval-windows", type=int, default=32, help="held-out windows an eval reads (at most)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the --minutes budget)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    args = ap.parse_args(argv)
    if args.k < 2 or args.rank < 1 or args.anchors < 1 or not 0 < args.threshold < 1 or args.minutes <= 0:
        ap.error("--k must be >= 2, --rank and --anchors >= 1, --threshold in (0, 1) and --minutes > 0")
    return args


class Tuned(nn.Module):
    """The base with its LoRA wrappers and the placeholder vector: what the optimizer and the
    checkpoint see (trainable: the deltas and `pad`)."""

    def __init__(self, base, rank: int, alpha: float):
        from speclab.models.lora import add_lora
        super().__init__()
        self.base = base
        add_lora(base, rank, alpha)
        self.pad = nn.Parameter(base.get_input_embeddings().weight.detach().float().mean(0))


@contextlib.contextmanager
def lora_off(model):
    """Inside: every LoRA wrapper adds nothing (the frozen target)."""
    from speclab.models.lora import LoRALinear
    mods = [m for m in model.modules() if isinstance(m, LoRALinear)]
    scales = [m.scale for m in mods]
    for m in mods:
        m.scale = 0.0
    try:
        yield
    finally:
        for m, s in zip(mods, scales):
            m.scale = s


def lud_forward(tuned: Tuned, tok, vis, pos, anc, n, args):
    """One batch (ppd.batch_rows' tensors: text (B, T), visibility / positions over R = T + A m rows,
    anchors (B, A), text lengths (B,)) -> (loss, stats)."""
    base = tuned.base
    B, T = tok.shape
    A, m = anc.shape[1], args.k - 1
    emb = base.get_input_embeddings()(tok)                                           # (B, T, C)
    with torch.no_grad(), lora_off(base):                                            # 1. the target's p
        lp = base(inputs_embeds=emb).logits.float().log_softmax(-1)                  # (B, T, V)
        nxt = tok[:, 1:].clamp(min=0)
        conf = lp[:, :-1].gather(-1, nxt[..., None])[..., 0].exp()                   # (B, T-1): c_i
        conf = torch.cat([conf, conf.new_zeros(B, 1)], 1)
    x = torch.cat([emb, tuned.pad.to(emb.dtype)[None, None].expand(B, A * m, -1)], 1)
    mask = torch.where(vis, 0.0, float("-inf")).to(emb.dtype)[:, None]               # (B, 1, R, R)
    h = base.model(inputs_embeds=x, attention_mask=mask, position_ids=pos).last_hidden_state
    lq = base.lm_head(h).float().log_softmax(-1)                                     # (B, R, V)
    # 4. the text rows keep the target's next token
    text_ok = (torch.arange(T)[None] < (n[:, None] - 1)).float()                      # (B, T)
    drift = ((lp.exp() * (lp - lq[:, :T])).sum(-1) * text_ok).sum() / text_ok.sum().clamp(min=1)
    # 2-3. placeholders, weighed by the anchor's unit
    j = torch.arange(1, m + 1)
    rows = (anc[:, :, None] + j).clamp(max=T - 1)                                    # (B, A, m): text row a + j
    valid = ((anc[:, :, None] + j) < n[:, None, None] - 1).float()
    lp_j = lp.gather(1, rows.reshape(B, -1, 1).expand(-1, -1, lp.shape[-1])).view(B, A, m, -1)
    lq_j = lq[:, T:].reshape(B, A, m, -1)
    unit = (conf.gather(1, rows.reshape(B, -1)).view(B, A, m) >= args.unit_alpha).long().cumprod(-1).float()
    greedy = lp_j.argmax(-1)
    per = (lp_j.exp() * (lp_j - lq_j)).sum(-1) + args.hard_weight * F.nll_loss(
        lq_j.flatten(0, 2), greedy.flatten(), reduction="none").view(B, A, m)
    w = (unit + args.outside_weight * (1 - unit)) * valid
    loss = (per * w).sum() / valid.sum().clamp(min=1) + args.keep_weight * drift
    return loss, span_stats(lq_j.detach(), greedy, unit, valid, args.threshold) | {"drift": float(drift.detach())}


def span_stats(lq_j, greedy, unit, valid, threshold: float) -> dict:
    """The decoding rule on the placeholders (B, A, m): the run of slots whose top probability
    reaches `threshold` (stopped at the first that does not), how many of its tokens are the target's,
    and the run before the first wrong one. Sums and counts, for weighing batches."""
    top, tok = lq_j.exp().max(-1)
    ok = valid.bool()
    run = ((top >= threshold) & ok).long().cumprod(-1)                               # (B, A, m)
    right = (tok == greedy) & ok
    good = (run.bool() & right).long().cumprod(-1)
    n_anchor = int(ok[..., 0].sum())
    out = {"anchors": n_anchor, "run": int((run * ok[..., :1]).sum()), "good": int((good * ok[..., :1]).sum()),
           "run_right": int((run.bool() & right).sum())}
    for s in range(greedy.shape[-1]):
        v = ok[..., s]
        out[f"acc{s + 1}"] = int((right[..., s] & v).sum())
        out[f"unit{s + 1}"] = int((unit[..., s].bool() & v).sum())
        out[f"n{s + 1}"] = int(v.sum())
    return out


@torch.no_grad()
def evaluate(tuned, data, spans, args) -> dict:
    from speclab.train.ppd import batch_rows
    gen = torch.Generator().manual_seed(1)
    tot, drift = {}, []
    for i in range(0, len(spans), args.batch):
        _, st = lud_forward(tuned, *batch_rows(data, spans[i:i + args.batch], args.k - 1, args.anchors, gen), args)
        drift.append(st.pop("drift"))
        for key, v in st.items():
            tot[key] = tot.get(key, 0) + v
    m, a = args.k - 1, max(tot["anchors"], 1)
    return {"tau_rule": round(1 + tot["run"] / a, 4), "tau_good": round(1 + tot["good"] / a, 4),
            "precision": round(tot["run_right"] / max(tot["run"], 1), 4), "drift": round(sum(drift) / len(drift), 5),
            "acc": [round(tot[f"acc{s}"] / max(tot[f"n{s}"], 1), 4) for s in range(1, m + 1)],
            "unit": [round(tot[f"unit{s}"] / max(tot[f"n{s}"], 1), 4) for s in range(1, m + 1)]}


def save_lud(tuned: Tuned, out: Path, argv, args, state: dict, data: dict, ev: dict) -> None:
    """The fine-tune as an adapter directory (kind "lud", fp16) with speclab_train.json beside."""
    from speclab.models.adapter import write_adapter
    from speclab.models.lora import lora_state
    from speclab.models.lud import key_of, lud_config
    tensors = {"pad_embedding": tuned.pad}
    for name, v in lora_state(tuned.base).items():
        mod, ab = name.rsplit(".", 1)
        tensors["lora." + key_of(mod) + ("__A" if ab == "lora_A" else "__B")] = v
    cfg = lud_config(tuned.base.config, args.rank, args.alpha, args.k, args.unit_alpha, args.threshold).to_dict()
    write_adapter(out, cfg, {"base": args.target, "kind": "lud", "shared": [], "head": "target"}, tensors,
                  {"command": shlex.join(["speclab", "train", "lud", *argv]), "options": vars(args),
                   "steps": state["step"], "positions": len(data["tokens"]), "curve": state["log"], "held_out": ev})
    print(f"saved {out}", flush=True)


def main(argv=None):
    from speclab.models import zoo
    from speclab.train.checkpoint import save_checkpoint, start
    from speclab.train.clover import train_and_held_windows
    from speclab.train.ppd import batch_rows, training_text
    from speclab.train.smollm2_data import split_rows

    argv, args = command_line(get_args, argv)
    out = Path(args.out or "speclab-zoo/speclab_zoo/smollm2-lud")
    base, tok = zoo.load(args.target)
    data = training_text(base, tok, args)                              # the self-text cache is keyed by dtype
    base = zoo.load(args.target, dtype="fp32")[0]                     # fp32 master weights, frozen
    for p in base.parameters():
        p.requires_grad_(False)
    tuned = Tuned(base, args.rank, args.alpha)
    params = [p for p in tuned.parameters() if p.requires_grad]
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    print(f"lud: {sum(p.numel() for p in params) / 1e6:.3f}M trained numbers (rank {args.rank}, k {args.k}), "
          f"{len(train_rows)} train rows, {len(held_rows)} held out, {len(data['tokens'])} positions", flush=True)
    opt, ckpt, state = start(tuned, params, out, args.lr, args.resume)
    spans, held = train_and_held_windows(data, train_rows, held_rows, args.seq_len)
    held = held[::max(1, len(held) // args.eval_windows)][:args.eval_windows]
    gen = torch.Generator().manual_seed(args.seed)

    def save():
        ev = evaluate(tuned, data, held, args)
        if held_out(state, {"tau_good": ev["tau_good"]}):
            state["log"][-1].update(ev)
            save_lud(tuned, out, argv, args, state, data, ev)
        else:
            state["log"][-1].update(ev)
        save_checkpoint(ckpt, tuned, opt, state)

    if not state["log"]:
        save()                                                    # step 0: the target itself, an untrained pad,
        state["best"] = -1.0                                      # kept until the first trained step replaces it
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save, "train lud",
                      args.max_steps)
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        rows = batch_rows(data, [spans[j] for j in idx], args.k - 1, args.anchors, gen)
        loss, st = lud_forward(tuned, *rows, args)
        optimizer_step(opt, loss, params)
        a = max(st["anchors"], 1)
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}", drift=f"{st['drift']:.4f}",
                             tau=f"{1 + st['good'] / a:.2f}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
