"""Train the heads that draft from the target's own hidden state: `smollm2-eagle`, `smollm2-medusa`.

    speclab train eagle  --target smollm2-135m --out speclab-zoo/speclab_zoo/smollm2-eagle  --minutes 40
    speclab train medusa --target smollm2-135m --out speclab-zoo/speclab_zoo/smollm2-medusa --minutes 20

The text is the one the target wrote for `smollm2-draft` (speclab/train/smollm2_data.py: Magpie chat,
code continuations, stdlib windows it read). The target is frozen and runs once over that text:

  1. features (speclab/train/head_data.py): the hidden state x_t after its last layer (and, for
     an EAGLE-3 head, after each of `--layers`), pre-norm, bf16, at every position, cached next
     to the data.
  2. eagle (EAGLE's recipe with EAGLE-3's training-time test): entry t reads fc([f_t; e(x_{t+1})])
     and predicts f_{t+1} (smooth L1) and p_{t+1} (soft CE). Steps 2..U feed the head's own
     prediction back in place of f_t, with the attention a draft step sees at run time: the true
     entries before it and its own chain (a mask over the concatenated steps). With --layers
     (EAGLE-3's fusion), f_t = norm(fc3([rms(x_t^(l)) for l in layers])).
  3. medusa: head k at position t predicts p_{t+k}, the target's distribution of token t+1+k.

Progress bar, checkpoints (resumable with --resume), a held-out split, the head saved only when
held-out agreement did not drop. Never in CI: the exact commands and wall times are in the README.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.head_data import DATA_DIRS, batch, first_rows, load_data, set_features, windows
from speclab.train.loop import BudgetLoop, add_options, cosine_lr, set_lr
from speclab.train.smollm2_data import split_rows
from speclab.train.ttt import eagle_forward, eagle_step1, ttt_mask  # noqa: F401  (ttt_mask: for readers)
from speclab.train.vocab import select_head_ids


def soft_ce(logits: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    """-sum p log q per row, q = softmax(logits), p = exp(lp)."""
    return -(lp.exp() * logits.float().log_softmax(-1)).sum(-1)


# ----------------------------------------------------------------------------------------------
# 2. eagle: training-time test over U steps

def eagle_loss(head, tok, xs, f, lp, m, U: int, reg_weight: float, hard_weight: float = 0.0):
    """Per step: soft CE to the target's p_{t+1} + reg_weight x smooth L1 to f_{t+1} (the last
    layer's post-norm state) + hard_weight x CE to the target's greedy token (what a greedy verify
    accepts), over valid entries (t >= s-1, real tokens)."""
    o = eagle_forward(head, eagle_step1(head, xs), tok, U)          # (U, B, Tn, C)
    fo = head.model.norm(o)
    logits = fo @ head.lm_head.weight.t()                           # (U, B, Tn, N)
    total, stats = 0.0, {}
    for s in range(U):
        valid = (m[:, 1:] & m[:, :-1]).clone()
        valid[:, :s] = False
        ce = soft_ce(logits[s], lp[:, 1:])                          # (B, Tn)
        reg = F.smooth_l1_loss(fo[s].float(), f[:, 1:].float(), reduction="none").mean(-1)
        if hard_weight:
            greedy = lp[:, 1:].argmax(-1)                           # (B, Tn) over the trimmed ids
            ce = ce + hard_weight * F.cross_entropy(logits[s].float().transpose(1, 2), greedy, reduction="none")
        loss = ((ce + reg_weight * reg) * valid).sum() / valid.sum().clamp(min=1)
        total = total + loss
        hit = (logits[s].argmax(-1) == lp[:, 1:].argmax(-1)) & valid
        stats[f"acc{s + 1}"] = float(hit.sum()) / max(int(valid.sum()), 1)
        stats[f"n{s + 1}"] = int(valid.sum())
    return total / U, stats


# ----------------------------------------------------------------------------------------------
# 3. medusa

def medusa_loss(heads, xs, lp, m):
    """Head k (1..K) at position t: soft CE to p_{t+k}."""
    return heads_loss(heads.hidden(xs[-1]) @ heads.lm_head.weight.t(), lp, m)


def heads_loss(logits: torch.Tensor, lp: torch.Tensor, m: torch.Tensor):
    """logits (K, B, T, N) of K heads; head k (1..K) at t: soft CE to p_{t+k}, the target's
    distribution of token t+1+k, averaged over heads. Returns the loss and per head the top-1
    agreement with the target's greedy token (acc{k}) over its n{k} valid positions."""
    K, T = logits.shape[0], logits.shape[2]
    total, stats = 0.0, {}
    for k in range(1, K + 1):
        valid = m[:, :T - k] & m[:, k:]
        ce = soft_ce(logits[k - 1, :, :T - k], lp[:, k:])
        total = total + (ce * valid).sum() / valid.sum().clamp(min=1)
        hit = (logits[k - 1, :, :T - k].argmax(-1) == lp[:, k:].argmax(-1)) & valid
        stats[f"acc{k}"] = float(hit.sum()) / max(int(valid.sum()), 1)
        stats[f"n{k}"] = int(valid.sum())
    return total / K, stats


def medusa_rank_hits(heads, xs, lp, m, ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hits (K, ranks): how often head k's rank-r guess at t was the target's greedy token t+1+k,
    and n (K,) the positions counted: what Medusa-1's calibrated tree is built from."""
    x = xs[-1]
    K, T = heads.n_heads, x.shape[1]
    logits = heads.hidden(x) @ heads.lm_head.weight.t()              # (K, B, T, N)
    hits, n = torch.zeros(K, ranks), torch.zeros(K)
    for k in range(1, K + 1):
        valid = m[:, :T - k] & m[:, k:]
        top = logits[k - 1, :, :T - k].topk(ranks, -1).indices         # (B, T-k, ranks)
        hit = (top == lp[:, k:].argmax(-1, keepdim=True)) & valid[..., None]
        hits[k - 1], n[k - 1] = hit.sum((0, 1)).float(), valid.sum()
    return hits, n


# ----------------------------------------------------------------------------------------------
# main

def get_args(argv):
    ap = argparse.ArgumentParser(prog="speclab train eagle|medusa", description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["eagle", "medusa"])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", default=None, help="default: speclab-zoo/speclab_zoo/smollm2-<kind>")
    ap.add_argument("--data-dirs", nargs="*", default=DATA_DIRS)
    add_options(ap, minutes=30.0, batch=8, seq_len=256, lr=1e-3, warmup=50,
                dev_help="eagle: a prompt set people wrote; each eval also measures the head's step-1 agreement on "
                         "the target's answers to it, and the head is saved when THAT improves ('' to select by "
                         "the held-out split of the training text, which overstates agreement on such questions)")
    ap.add_argument("--head-size", type=int, default=12288, help="trimmed vocabulary: most frequent ids")
    ap.add_argument("--unroll", type=int, default=3, help="eagle: training-time test steps")
    ap.add_argument("--reg-weight", type=float, default=0.5, help="eagle: smooth L1 weight on the features")
    ap.add_argument("--hard-weight", type=float, default=0.0,
                    help="eagle: weight of an extra CE term on the target's greedy token (0: soft CE only)")
    ap.add_argument("--medusa-heads", type=int, default=4)
    ap.add_argument("--init-layer", type=int, default=-1, help="eagle: copy this target layer first (-1: the last)")
    ap.add_argument("--layers", default=None,
                    help="eagle: target layers whose states feed the head, e.g. 10,20,30 (EAGLE-3's low / mid / "
                         "high fusion; default: the last layer only)")
    ap.add_argument("--init-from", default=None,
                    help="start from the head in this directory (its weights and trimmed vocabulary); weights "
                         "it lacks (e.g. the layer fusion when --layers is new) keep their initialisation. With a dev set, "
                         "--out gets a head only when one beats this head's dev score")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    ap.add_argument("--calibrate", action="store_true",
                    help="medusa: only measure the heads in --out on held-out text and store their rank "
                         "accuracies (the calibrated tree's input); no training")
    ap.add_argument("--limit-rows", type=int, default=0, help="use only the first N rows (a smoke run)")
    return ap.parse_args(argv)


def parse_layers(spec: str | None, n_layers: int) -> list[int] | None:
    """--layers "10,20,30" -> [10, 20, 30], checked; the last must be the target's last layer (its
    state is what the regression and the target's distribution are computed from)."""
    if not spec:
        return None
    try:
        layers = sorted({int(v) for v in spec.split(",")})
    except ValueError:
        raise SystemExit(f"--layers takes comma-separated layer numbers like 10,20,{n_layers}, got {spec!r}")
    if layers[0] < 1 or layers[-1] != n_layers:
        raise SystemExit(f"--layers must lie in 1..{n_layers} and end with the last layer, {n_layers}: got {spec!r}")
    return layers


def build(kind: str, base, head_ids, args):
    from speclab.models.heads import build_eagle, build_medusa, head_config
    if kind == "eagle":
        layers = parse_layers(args.layers, base.config.num_hidden_layers)
        head = build_eagle(base, head_config(base.config, "eagle", layers=layers), head_ids)
        if args.init_layer is not None:            # a prior in the right space; EAGLE starts at random
            head.model.layers[0].load_state_dict(base.model.layers[args.init_layer].state_dict())
    else:
        head = build_medusa(base, head_config(base.config, "medusa", args.medusa_heads), head_ids)
    for p in head.lm_head.parameters():
        p.requires_grad_(False)
    return head.float().train()


@torch.no_grad()
def evaluate(kind, head, data, X: list, spans, norm, W_sub, args, U, ranks: int = 8) -> dict:
    """Held-out top-1 agreement per step (eagle) or head (medusa). For medusa the same pass counts
    each head's rank accuracies (medusa_rank_hits) into the heads' config as `medusa_rank_acc`,
    so a save carries what the drafter builds the paper's calibrated tree from."""
    head.eval()
    agg: dict[str, float] = {}
    hits, n = 0, 0
    for i in range(0, len(spans), args.batch):
        tok, xs, f, lp, m = batch(data, X, spans[i:i + args.batch], norm, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if kind == "eagle":
                _, st = eagle_loss(head, tok, xs, f, lp, m, U, 0.0)
            else:
                h, c = medusa_rank_hits(head, xs, lp, m, ranks)
                hits, n = hits + h, n + c
                continue
        for k in [k for k in st if k.startswith("acc")]:
            agg[k] = agg.get(k, 0.0) + st[k] * st["n" + k[3:]]
            agg["n" + k[3:]] = agg.get("n" + k[3:], 0) + st["n" + k[3:]]
    head.train()
    if kind == "medusa":
        acc = [[round(float(v), 4) for v in row] for row in hits / n.clamp(min=1)[:, None]]
        head.config.medusa_rank_acc = acc
        return {f"acc{k + 1}": row[0] for k, row in enumerate(acc)}
    return {k: round(v / max(agg["n" + k[3:]], 1), 4) for k, v in agg.items() if k.startswith("acc")}


def main(argv=None):
    from speclab.models import zoo
    from speclab.models.adapter import save_draft
    from speclab.train.checkpoint import resume_state, save_checkpoint, trainable

    args = get_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out or f"speclab-zoo/speclab_zoo/smollm2-{args.kind}")
    data = first_rows(load_data(args.data_dirs), args.limit_rows)
    base, tok = zoo.load(args.target, dtype="bf16")
    L = base.config.num_hidden_layers
    layers = (parse_layers(args.layers, L) if args.kind == "eagle" else None) or [L]
    feats = set_features(base, args.data_dirs, layers, args.limit_rows)
    X = [feats[l] for l in layers]
    dev = []
    if args.kind == "eagle" and args.dev_prompts:
        from speclab.train.dev_eval import answers, mean_agreement
        print(f"dev set: the target answers {args.dev_prompts} ...")
        dev = answers(base, tok, args.dev_prompts, layers)
    del base
    base = zoo.load(args.target, dtype="fp32")[0]               # fp32 master weights, bf16 autocast
    for p in base.parameters():
        p.requires_grad_(False)
    V = base.config.vocab_size
    specials = [i for i in tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
                if i is not None and i != tok.unk_token_id]      # the chat template's, where the tokenizer has them
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    pos = torch.cat([torch.arange(int(data["offsets"][r]), int(data["offsets"][r + 1])) for r in train_rows])
    counts = torch.bincount(data["tokens"][pos].long(), minlength=V).float()
    top = data["top_ids"][pos][data["has_top"][pos].bool()].long()
    counts += torch.bincount(top[:, 0], minlength=V) + 0.1 * torch.bincount(top.flatten(), minlength=V)
    head_ids = select_head_ids(None, args.head_size, specials, V, counts=counts, fill=True)
    init = None
    if args.init_from:
        from safetensors.torch import load_file
        init = load_file(str(Path(args.init_from) / "model.safetensors"))
        head_ids = init.pop("head_ids")
    head = build(args.kind, base, head_ids, args)
    if init is not None:
        new = [k for k in trainable(head) if k not in init]
        with torch.no_grad():
            for k, p in head.named_parameters():
                if k in init:
                    p.copy_(init[k].to(p.dtype))
        print(f"started from {args.init_from}" + (f"; new: {', '.join(new)}" if new else ""))
    W_sub = head.lm_head.weight.detach().float()                    # (N, C): the target's rows
    nw, eps = base.model.norm.weight.detach().float(), base.config.rms_norm_eps
    norm = lambda x: F.rms_norm(x.float(), x.shape[-1:], nw, eps)
    params = trainable(head)
    print(f"{args.kind}: {sum(p.numel() for p in params.values()) / 1e6:.2f}M trained params, "
          f"head {len(head_ids)} ids, {len(train_rows)} train rows, {len(held_rows)} held out, "
          f"{len(data['tokens'])} positions")
    opt = torch.optim.AdamW(list(params.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    from speclab.models.gguf import cache_root
    ckpt = cache_root() / "ckpt" / out.name          # optimizer state stays out of the package
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "pos": 0, "log": []}
    if args.resume:
        state = resume_state(ckpt, out, head, opt, state)
    spans = windows(data, train_rows, args.seq_len)
    held = windows(data, held_rows, args.seq_len)
    if args.calibrate:
        if args.kind != "medusa":
            raise SystemExit("--calibrate is for medusa heads (eagle grows its tree from its own probabilities)")
        from speclab.models.heads import load_draft
        head = load_draft(out, base, torch.float32)
        W_sub = head.lm_head.weight.detach().float()             # its own trimmed vocabulary
        print("held-out agreement:", evaluate("medusa", head, data, X, held, norm, W_sub, args, 0))
        print("rank accuracies per head:", head.config.medusa_rank_acc)
        save_draft(head, out, args.target, kind=args.kind)
        print(f"saved {out}")
        return 0
    if dev:
        a = mean_agreement(head, dev)
        print(f"dev ({args.dev_prompts}) step-1 agreement at step {state['step']}: top-1 {a[0]:.4f}, top-3 {a[1]:.4f}")
        if args.init_from and "init_dev" not in state:   # the head started from is the one to beat
            state["init_dev"] = round(float(a[0]), 4)
    U = args.unroll

    def save():
        ev = evaluate(args.kind, head, data, X, held, norm, W_sub, args, U)
        score, best = sum(ev.values()) / len(ev), "best"
        if dev:                                                  # step-1 top-1 / top-3 on the dev answers
            ev["dev1"], ev["dev3"] = (round(float(v), 4) for v in mean_agreement(head, dev))
            score, best = ev["dev1"], "best_dev"
        state["log"].append({"step": state["step"], "min": round(state["elapsed"] / 60, 1), **ev})
        print(f"\nheld-out agreement step {state['step']}: {ev}")
        if score >= state.get(best, -1.0) and score > state.get("init_dev", -1.0):
            state[best] = score
            if args.kind == "medusa":
                print("rank accuracies per head:", head.config.medusa_rank_acc)
            save_draft(head, out, args.target, kind=args.kind)
            print(f"saved {out}")
        save_checkpoint(ckpt, head, opt, state)

    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save,
                      f"train {args.kind}")
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        tok_b, xs, f, lp, m = batch(data, X, [spans[j] for j in idx], norm, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, st = (eagle_loss(head, tok_b, xs, f, lp, m, U, args.reg_weight, args.hard_weight) if args.kind == "eagle"
                        else medusa_loss(head, xs, lp, m))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k_: f"{v:.2f}" for k_, v in st.items()
                                                                   if k_.startswith("acc")})
    save()
    (ckpt / "state.json").write_text(json.dumps(state, indent=2))
    if "init_dev" in state and not (out / "model.safetensors").exists():
        print(f"no checkpoint beat {args.init_from} on {args.dev_prompts} (top-1 {state['init_dev']:.4f}): "
              f"nothing saved to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
