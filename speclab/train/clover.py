"""Train Clover's heads (speclab/models/clover.py) on the target's own text: `smollm2-clover`,
`code-clover`.

    speclab train clover --target smollm2-135m --init-from speclab/zoo/smollm2-medusa \\
        --data-dirs ~/.cache/speclab/smollm2-draft-data13 --out DIR --minutes 30
    speclab train clover --target code-target --self-text 400 --out speclab/zoo/code-clover --minutes 4

Medusa's trainer (speclab/train/heads.py) with the regressive connection: the same text and
features (speclab/train/head_data.py: the target's last-layer state x_t at every position, cached),
the same loss (head k at position t: soft cross-entropy to the target's distribution of token
t+1+k, averaged over heads), the same budget loop, held-out split and saves. Teacher forcing: head k
reads the tokens t+1..t+k the target wrote, which is what it reads at run time on the path the
target accepts.

The text: `--data-dirs`, sets written by `speclab train smollm2-draft --gen-only` (as for Medusa),
and / or `--self-text N`: the target's greedy continuations of N training-side stdlib prefixes and
its greedy answers to the seed questions where its tokenizer has a chat template
(speclab/train/specdecpp.py's writer), cached in ~/.cache/speclab/clover/.

`--init-from` a Medusa (or Clover) directory copies its blocks W1_k / W2_k and trimmed vocabulary:
the new parts start as the identity, so training starts from those heads exactly. The heads are
saved when the held-out agreement (mean over heads) is the best so far, with `speclab_train.json`
(options, steps, held-out agreement per head) beside them.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.head_data import DATA_DIRS, batch, first_rows, load_data, set_features, target_features, windows
from speclab.train.heads import soft_ce
from speclab.train.loop import BudgetLoop, add_options, cosine_lr, set_lr, slot_agreement
from speclab.train.smollm2_data import merge, split_rows

CACHE = "~/.cache/speclab/clover"


def clover_loss(heads, x: torch.Tensor, tok: torch.Tensor, lp: torch.Tensor, m: torch.Tensor):
    """Head k (1..K) at t reads tokens t+1..t+k: soft CE to p_{t+k}, the target's distribution of
    token t+1+k. Returns the loss and per head the top-1 agreement with the target's greedy token."""
    logits = heads.train_logits(x, tok)                                      # (K, B, T, N)
    K, T = heads.n_heads, x.shape[1]
    total, stats = 0.0, {}
    for k in range(1, K + 1):
        valid = m[:, :T - k] & m[:, k:]
        ce = soft_ce(logits[k - 1, :, :T - k], lp[:, k:])
        total = total + (ce * valid).sum() / valid.sum().clamp(min=1)
        hit = (logits[k - 1, :, :T - k].argmax(-1) == lp[:, k:].argmax(-1)) & valid
        stats[f"acc{k}"] = float(hit.sum()) / max(int(valid.sum()), 1)
        stats[f"n{k}"] = int(valid.sum())
    return total / K, stats


# ----------------------------------------------------------------------------------------------
# the text

def self_text(target, tok, name: str, n_code: int, max_new: int, seed: int) -> dict:
    """The target's own text in head_data's row format: greedy answers to the seed questions (with a
    chat template) and greedy continuations of n_code stdlib prefixes, cached."""
    from speclab.train.specdecpp import cached_text, prompts_for, write_text
    n_chat = 120 if getattr(tok, "chat_template", None) else 0
    key = {"target": name, "dtype": str(target.dtype), "chat": n_chat, "code": n_code, "max_new": max_new, "seed": seed}
    cache = Path(CACHE).expanduser() / f"{Path(name).name}-text.safetensors"
    rows = cached_text(cache, key, lambda: write_text(target, tok, prompts_for(tok, n_chat, n_code, seed), max_new))
    lens = torch.tensor([len(r) for r, _ in rows])
    return {"tokens": torch.tensor([x for r, _ in rows for x in r], dtype=torch.int32),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
            "is_code": torch.tensor([int(i >= n_chat) for i in range(len(rows))], dtype=torch.uint8),
            "top_ids": torch.zeros(int(lens.sum()), 1, dtype=torch.int32),
            "has_top": torch.zeros(int(lens.sum()), dtype=torch.uint8)}


def text_and_features(base, tok, args) -> tuple[dict, torch.Tensor]:
    """The training text (the --data-dirs sets, then --self-text) and the target's last-layer
    states over it (sum T, C)."""
    L = base.config.num_hidden_layers
    dirs = args.data_dirs if args.data_dirs is not None else ([] if args.self_text else DATA_DIRS)
    parts = []
    if dirs:
        parts.append((first_rows(load_data(dirs), args.limit_rows), set_features(base, dirs, [L], args.limit_rows)[L]))
    if args.self_text:
        data = self_text(base, tok, args.target, args.self_text, args.max_new, args.seed)
        cache = Path(CACHE).expanduser() / f"{Path(args.target).name}-features.safetensors"
        parts.append((data, target_features(base, data, {L: cache})[L]))
    if not parts:
        raise SystemExit("no training text: give --data-dirs (sets written by `speclab train smollm2-draft --gen-only`) "
                         "or --self-text N")
    data, X = parts[0]
    for d, x in parts[1:]:
        data, X = merge(data, d), torch.cat([X, x])
    return data, X


# ----------------------------------------------------------------------------------------------
# main

def get_args(argv):
    ap = argparse.ArgumentParser(prog="speclab train clover", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", default=None, help="default: speclab/zoo/smollm2-clover")
    ap.add_argument("--data-dirs", nargs="*", default=None,
                    help=f"sets written by `speclab train smollm2-draft --gen-only` (default: {' '.join(DATA_DIRS)}, "
                         "unless --self-text is given)")
    ap.add_argument("--self-text", type=int, default=0, metavar="N",
                    help="the target writes greedy continuations of N stdlib prefixes (+ answers to the seed "
                         "questions where it has a chat template) to train on, cached in " + CACHE)
    ap.add_argument("--max-new", type=int, default=64, help="--self-text: tokens the target writes per prompt")
    add_options(ap, minutes=30.0, batch=8, seq_len=256, lr=1e-3, warmup=50, dev_help="unused: the heads are "
                "kept by held-out agreement on the training text's own split")
    ap.add_argument("--heads", type=int, default=4, help="draft depth: head k guesses token t+1+k")
    ap.add_argument("--ffn", type=int, default=None, help="augmenting block's MLP width (default: the hidden size; "
                    "0: attention only)")
    ap.add_argument("--head-size", type=int, default=12288, help="trimmed vocabulary: most frequent ids")
    ap.add_argument("--init-from", default=None,
                    help="start from the Medusa or Clover heads in this directory (their blocks and trimmed vocabulary)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    ap.add_argument("--limit-rows", type=int, default=0, help="use only the first N rows of --data-dirs (a smoke run)")
    args = ap.parse_args(argv)
    if args.heads < 1 or args.minutes <= 0:
        ap.error("--heads must be >= 1 and --minutes > 0")
    if args.init_from and not (init_dir(args.init_from) / "model.safetensors").exists():
        ap.error(f"--init-from {args.init_from}: no heads there; give a Medusa or Clover directory "
                 "(e.g. speclab/zoo/smollm2-medusa)")
    return args


def init_dir(name: str) -> Path:
    """--init-from: a directory, or a zoo name."""
    from speclab.models.zoo import ZOO_DIR
    return Path(name) if Path(name).is_dir() else ZOO_DIR / name


def build(base, head_ids, args):
    from speclab.models.clover import CloverHeads, clover_config
    head = CloverHeads(base, clover_config(base.config, args.heads, args.ffn), head_ids)
    for p in head.lm_head.parameters():
        p.requires_grad_(False)
    return head.float().train()


@torch.no_grad()
def evaluate(head, data, X, spans, norm, W_sub, args, autocast: bool) -> dict:
    """Held-out top-1 agreement with the target's greedy token, per head."""
    head.eval()

    def stats():
        for i in range(0, len(spans), args.batch):
            tok, xs, _, lp, m = batch(data, [X], spans[i:i + args.batch], norm, W_sub)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                yield clover_loss(head, xs[-1], tok, lp, m)[1]
    out = slot_agreement(stats(), head.n_heads)
    head.train()
    return out


def main(argv=None):
    from speclab.models import zoo
    from speclab.models.adapter import save_draft
    from speclab.train.checkpoint import load_matching, resume_state, save_checkpoint, trainable
    from speclab.train.vocab import text_head_ids

    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out or "speclab/zoo/smollm2-clover")
    base, tok = zoo.load(args.target)
    for p in base.parameters():
        p.requires_grad_(False)
    data, X = text_and_features(base, tok, args)
    if base.dtype != torch.float32:                             # fp32 master weights (bf16 autocast where native)
        base = zoo.load(args.target, dtype="fp32")[0]
        for p in base.parameters():
            p.requires_grad_(False)
    autocast = zoo.native_bf16(torch.device("cpu"))
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    head_ids = text_head_ids(tok, data, train_rows, args.head_size, base.config.vocab_size)
    init = None
    if args.init_from:
        from safetensors.torch import load_file
        init = load_file(str(init_dir(args.init_from) / "model.safetensors"))
        head_ids = init.pop("head_ids")
    head = build(base, head_ids, args)
    if init is not None:
        got = load_matching(head, init)
        print(f"started from {args.init_from}: {len(got)} of its {len(init)} tensors")
    W_sub = head.lm_head.weight.detach().float()
    nw, eps = base.model.norm.weight.detach().float(), base.config.rms_norm_eps
    norm = lambda x: F.rms_norm(x.float(), x.shape[-1:], nw, eps)         # noqa: E731
    params = trainable(head)
    print(f"clover: {sum(p.numel() for p in params.values()) / 1e6:.2f}M trained params, {head.n_heads} heads, "
          f"head {len(head_ids)} ids, {len(train_rows)} train rows, {len(held_rows)} held out, "
          f"{len(data['tokens'])} positions")
    opt = torch.optim.AdamW(list(params.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    from speclab.models.gguf import cache_root
    ckpt = cache_root() / "ckpt" / out.name
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "pos": 0, "log": []}
    if args.resume:
        state = resume_state(ckpt, out, head, opt, state)
    spans = windows(data, train_rows, args.seq_len)
    held = windows(data, held_rows, args.seq_len) or spans[:max(1, len(spans) // 20)]

    def save():
        ev = evaluate(head, data, X, held, norm, W_sub, args, autocast)
        score = sum(ev.values()) / len(ev)
        state["log"].append({"step": state["step"], "min": round(state["elapsed"] / 60, 1), **ev})
        print(f"\nheld-out agreement step {state['step']}: {ev}", flush=True)
        if score >= state.get("best", -1.0):
            state["best"] = score
            save_draft(head, out, args.target, kind="clover")
            info = {"command": shlex.join(["speclab", "train", "clover", *argv]), "options": vars(args),
                    "steps": state["step"],
                    "positions": len(data["tokens"]), "held_out": ev}
            tmp = out / "speclab_train.tmp"
            tmp.write_text(json.dumps(info, indent=2))
            tmp.replace(out / "speclab_train.json")
            print(f"saved {out}", flush=True)
        save_checkpoint(ckpt, head, opt, state)

    if not state["log"]:
        save()                                                    # step 0: the heads it starts from
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save, "train clover")
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        tok_b, xs, _, lp, m = batch(data, [X], [spans[j] for j in idx], norm, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, st = clover_loss(head, xs[-1], tok_b, lp, m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k: f"{v:.2f}" for k, v in st.items()
                                                                  if k.startswith("acc")})
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
