"""Train Falcon's semi-autoregressive head (speclab/models/falcon.py) on the target's own text:
`code-falcon`, and SmolLM2 heads measured against `smollm2-eagle`.

    speclab train falcon --target code-target --self-text 400 --out speclab/zoo/code-falcon --minutes 6
    speclab train falcon --target smollm2-135m --init-from smollm2-eagle \\
        --data-dirs ~/.cache/speclab/smollm2-draft-data13 --out DIR --minutes 60

The text and features are Clover's (speclab/train/clover.py: `--data-dirs` sets written by
`speclab train smollm2-draft --gen-only`, and / or `--self-text N`, the target's own greedy
continuations, cached), plus the target's states after each of the head's `--layers` (EAGLE-3's
fusion, speclab/train/head_data.py). Each step is CSGD, Falcon's coupled sequential glancing
distillation, over windows cut into blocks of k positions:

  1. pass 1, teacher-forced: every real entry reads the target's feature f_t and token t+1, every
     mask slot runs beside it (FalconHead.train_forward); m = the slots' mismatches with the
     target's greedy tokens in each window.
  2. pass 2, the glance: a real entry in a block reads instead the feature pass 1 predicted for it
     from the block's last position before it, slot j+1 for the block's j-th position (what the
     next forward reads at run time), except in int(lambda m) blocks chosen at random, which keep
     the target's features; lambda = 0.35 (1 - e) + 0.1, e the fraction of the budget spent
     (Falcon's 0.35 (E - e) / E + 0.1 over epochs). Tokens stay the target's: a drafted node's
     children matter only where the verify accepted it, i.e. where its token is the target's.

Loss, per pass and slot: EAGLE's (speclab/train/heads.py) for the token the slot guesses: soft
cross-entropy to the target's distribution (the KL to it, up to a constant) + `--hard-weight` x
cross-entropy to the target's greedy token + `--reg-weight` x smooth L1 between the normed output and
the target's feature it predicts. Falcon trains on pass 2 alone; speclab keeps pass 1's loss too (mean
of both), since the committed entries a run reads are all the target's own.

`--init-from` an EAGLE head (or a Falcon head) copies its fusion, its layer(s) and its trimmed
vocabulary, so slot 1 starts as that head exactly. Saves when the held-out agreement (mean over
slots) is the best so far, with `speclab_train.json` beside the head.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.clover import describe, head_parser, save_head, text_and_states, train_and_held_windows
from speclab.train.heads import soft_ce
from speclab.train.loop import (BudgetLoop, add_options, command_line, cosine_lr, held_out_agreement,
                                optimizer_step, saver, set_lr)


def falcon_loss(head, fin, f, tok, lp, m, reg_weight=0.5, hard_weight=0.1):
    """The real entries read fin (B, T, C); slot s (1..k) at t guesses token t+1+s (target log-probs
    lp[:, t+s]) and predicts f_{t+s}, the target's post-norm last-layer state. Returns the loss, the
    outputs (k, B, T, C) and per slot the top-1 agreement with the target's greedy token."""
    o = head.train_forward(fin, tok)                                         # (k, B, T, C)
    k, T = head.k, f.shape[1]
    fo = head.rms(o)
    logits = fo @ head.lm_head.weight.t().to(fo.dtype)                       # (k, B, T, N)
    total, stats = 0.0, {}
    for s in range(1, k + 1):
        valid = m[:, :T - s] & m[:, s:]
        ce = soft_ce(logits[s - 1, :, :T - s], lp[:, s:])
        greedy = lp[:, s:].argmax(-1)
        if hard_weight:
            ce = ce + hard_weight * F.cross_entropy(logits[s - 1, :, :T - s].float().transpose(1, 2), greedy,
                                                    reduction="none")
        reg = F.smooth_l1_loss(fo[s - 1, :, :T - s].float(), f[:, s:].float(), reduction="none").mean(-1)
        total = total + ((ce + reg_weight * reg) * valid).sum() / valid.sum().clamp(min=1)
        hit = (logits[s - 1, :, :T - s].argmax(-1) == greedy) & valid
        stats[f"acc{s}"] = float(hit.sum()) / max(int(valid.sum()), 1)
        stats[f"n{s}"] = int(valid.sum())
        stats[f"miss{s}"] = (~hit & valid).sum(1)                           # (B,) per window
    return total / k, o, stats


def glance(head, f, o, misses, lam: float, gen: torch.Generator) -> torch.Tensor:
    """Pass 2's inputs (B, T, C): in each block [s, s+k) the features pass 1's slots predicted from
    position s-1 (slot j+1 for position s+j), except in int(lam * misses) random blocks per window
    (and the first block, which has no position before it), which keep the teacher-forced f."""
    B, T, C = f.shape
    k = head.k
    pred = f.clone()
    fo = head.rms(o.detach())                                                # (k, B, T, C)
    for j in range(k):
        pos = torch.arange(k + j, T, k)                                     # block starts s >= k, plus j
        pred[:, pos] = fo[j][:, pos - j - 1].to(pred.dtype)
    n_blocks = (T + k - 1) // k
    keep = torch.zeros(B, n_blocks, dtype=torch.bool)
    for b in range(B):
        n = min(int(lam * int(misses[b])), n_blocks)
        keep[b, torch.randperm(n_blocks, generator=gen)[:n]] = True
    keep[:, 0] = True
    keep = keep.repeat_interleave(k, 1)[:, :T]                               # (B, T)
    return torch.where(keep[..., None], f, pred)


def csgd_loss(head, fin, f, tok, lp, m, lam: float, gen: torch.Generator, reg_weight=0.5, hard_weight=0.1):
    """Both passes (fin: what pass 1's real entries read); the loss is their mean. Stats: pass 2's
    agreement per slot."""
    loss1, o, st1 = falcon_loss(head, fin, f, tok, lp, m, reg_weight, hard_weight)
    misses = sum(st1[f"miss{s}"] for s in range(1, head.k + 1))
    fin2 = glance(head, fin, o, misses, lam, gen)
    loss2, _, st2 = falcon_loss(head, fin2, f, tok, lp, m, reg_weight, hard_weight)
    return (loss1 + loss2) / 2, st2


# ----------------------------------------------------------------------------------------------
# main

def get_args(argv):
    ap = head_parser("falcon", __doc__)
    add_options(ap, minutes=60.0, batch=8, seq_len=128, lr=1e-3, warmup=20, dev_help="unused: the head is kept "
                "by held-out agreement on the training text's own split")
    ap.add_argument("--k", type=int, default=2, help="tokens a forward drafts (k_mask: 1 real + k-1 mask slots)")
    ap.add_argument("--n-layers", type=int, default=2, help="the head's transformer layers")
    ap.add_argument("--ffn", type=int, default=None, help="their MLP width (default: the target's)")
    ap.add_argument("--layers", default=None, help="target layers whose states feed the head, e.g. 8,16,30 "
                    "(EAGLE-3's fusion; default: the last only; --init-from an EAGLE head takes its own)")
    ap.add_argument("--head-size", type=int, default=12288, help="trimmed vocabulary: most frequent ids")
    ap.add_argument("--reg-weight", type=float, default=0.5, help="smooth L1 weight on the predicted features")
    ap.add_argument("--hard-weight", type=float, default=0.1, help="CE weight on the target's greedy token")
    ap.add_argument("--init-from", default=None, help="start from the EAGLE or Falcon head in this directory or zoo "
                    "name (its fusion, layers and trimmed vocabulary)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    args = ap.parse_args(argv)
    if args.k < 2 or args.n_layers < 1 or args.minutes <= 0:
        ap.error("--k must be >= 2, --n-layers >= 1 and --minutes > 0")
    return args


def init_state(name: str | None) -> tuple[dict | None, dict | None]:
    """--init-from: the head's tensors renamed to a Falcon head's, and its config."""
    if not name:
        return None, None
    from safetensors.torch import load_file
    from speclab.train.clover import init_dir
    d = init_dir(name)
    if not (d / "model.safetensors").exists():
        raise SystemExit(f"--init-from {name}: no head there; give an EAGLE or Falcon directory (e.g. smollm2-eagle)")
    cfg = json.loads((d / "config.json").read_text())
    state = {}
    for key, v in load_file(str(d / "model.safetensors")).items():
        key = key.replace("model.layers.", "layers.").replace("eagle_fc3.", "fc3.").replace("eagle_fc.", "fc.")
        state[key] = v
    return state, cfg


def build(base, head_ids, args, layers=None):
    from speclab.models.falcon import FalconHead, falcon_config
    head = FalconHead(base, falcon_config(base.config, args.n_layers, args.k, args.ffn, layers), head_ids)
    with torch.no_grad():               # each layer starts as the identity: slot 1 as the fused feature's guess
        for layer in head.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    for p in head.lm_head.parameters():
        p.requires_grad_(False)
    return head.float().train()


def batch_of(data, X, spans, head, W_sub):
    """tokens (B, T), the real entries' features fin (B, T, C) (through the head's fusion, with
    gradient), the target's post-norm last-layer states f (B, T, C), its log-probs (B, T, N), mask."""
    from speclab.train.head_data import batch
    tok, xs, f, lp, m = batch(data, X, spans, head.rms, W_sub)
    return tok, head.feature(xs), f, lp, m


@torch.no_grad()
def evaluate(head, data, X, spans, W_sub, args) -> dict:
    """Held-out top-1 agreement with the target's greedy token per slot, teacher-forced."""

    def stats():
        for i in range(0, len(spans), args.batch):
            tok, fin, f, lp, m = batch_of(data, X, spans[i:i + args.batch], head, W_sub)
            yield falcon_loss(head, fin, f, tok, lp, m)[2]
    return held_out_agreement(head, stats(), head.k)


def main(argv=None):
    from speclab.models import zoo
    from speclab.train.checkpoint import start, start_from, trainable
    from speclab.train.heads import parse_layers
    from speclab.train.smollm2_data import split_rows
    from speclab.train.vocab import text_head_ids

    argv, args = command_line(get_args, argv)
    out = Path(args.out or "speclab-zoo/speclab_zoo/smollm2-falcon")
    init, init_cfg = init_state(args.init_from)
    base, tok = zoo.load(args.target)
    L = base.config.num_hidden_layers
    layers = (init_cfg or {}).get("eagle_layers") or parse_layers(args.layers, L)
    data, X = text_and_states(base, tok, args, layers or [L])
    base = zoo.load(args.target, dtype="fp32")[0]                     # fp32 master weights
    for p in base.parameters():
        p.requires_grad_(False)
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    head_ids = init.pop("head_ids") if init else text_head_ids(tok, data, train_rows, args.head_size,
                                                               base.config.vocab_size)
    head = build(base, head_ids, args, layers)
    start_from(head, init, args.init_from)
    W_sub = head.lm_head.weight.detach().float()
    params = list(trainable(head).values())
    describe("falcon", params, f"k={head.k}, {len(head.layers)} layers", head_ids, train_rows, held_rows, data)
    opt, ckpt, state = start(head, params, out, args.lr, args.resume)
    spans, held = train_and_held_windows(data, train_rows, held_rows, args.seq_len)
    gen = torch.Generator().manual_seed(args.seed)

    save = saver(lambda: evaluate(head, data, X, held, W_sub, args),
                 lambda ev: save_head(head, out, "falcon", argv, args, state, data, ev), head, opt, ckpt, state)

    if not state["log"]:
        save()                                                    # step 0: the head it starts from
    autocast = zoo.native_bf16(torch.device("cpu"))
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save, "train falcon")
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        lam = 0.35 * (1 - min(loop.frac, 1.0)) + 0.1
        tok_b, fin, f, lp, m = batch_of(data, X, [spans[j] for j in idx], head, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, st = csgd_loss(head, fin, f, tok_b, lp, m, lam, gen, args.reg_weight, args.hard_weight)
        optimizer_step(opt, loss, params)
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}", lam=f"{lam:.2f}",
                             **{key: f"{v:.2f}" for key, v in st.items() if key.startswith("acc")})
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
