"""Train Clover's heads (speclab/models/clover.py) on the target's own text: `smollm2-clover`,
`code-clover`.

    speclab train clover --target smollm2-135m --init-from speclab-zoo/speclab_zoo/smollm2-medusa \\
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
import shlex
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.head_data import DATA_DIRS, batch, first_rows, load_data, set_features, target_features, windows
from speclab.train.heads import heads_loss
from speclab.train.loop import (BudgetLoop, add_options, command_line, cosine_lr, held_out_agreement,
                                optimizer_step, saver, set_lr)
from speclab.train.smollm2_data import merge, split_rows

CACHE = "~/.cache/speclab/clover"


def clover_loss(heads, x: torch.Tensor, tok: torch.Tensor, lp: torch.Tensor, m: torch.Tensor):
    """Head k (1..K) at t reads tokens t+1..t+k: soft CE to p_{t+k}, the target's distribution of
    token t+1+k. Returns the loss and per head the top-1 agreement with the target's greedy token."""
    return heads_loss(heads.train_logits(x, tok), lp, m)                   # logits (K, B, T, N)


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


def text_and_states(base, tok, args, layers: list[int]) -> tuple[dict, list[torch.Tensor]]:
    """The training text (the --data-dirs sets, then --self-text) and the target's pre-norm states
    after each of `layers` over it [(sum T, C)] (the last layer's: Clover's features; Falcon's fusion
    may take more)."""
    dirs = args.data_dirs if args.data_dirs is not None else ([] if args.self_text else DATA_DIRS)
    parts = []
    if dirs:
        feats = set_features(base, dirs, layers, args.limit_rows)
        parts.append((first_rows(load_data(dirs), args.limit_rows), [feats[l] for l in layers]))
    if args.self_text:
        data = self_text(base, tok, args.target, args.self_text, args.max_new, args.seed)
        L = base.config.num_hidden_layers
        name = Path(args.target).name
        caches = {l: Path(CACHE).expanduser() / (f"{name}-features" + (f"-l{l}" if l != L else "") + ".safetensors")
                  for l in layers}
        feats = target_features(base, data, caches)
        parts.append((data, [feats[l] for l in layers]))
    if not parts:
        raise SystemExit("no training text: give --data-dirs (sets written by `speclab train smollm2-draft --gen-only`) "
                         "or --self-text N")
    data, X = parts[0]
    for d, x in parts[1:]:
        data, X = merge(data, d), [torch.cat([a, b]) for a, b in zip(X, x)]
    return data, X


def head_parser(kind: str, doc: str) -> argparse.ArgumentParser:
    """The command line of a head trained on the target's own text (Clover's, Falcon's), up to its own
    options: the target, the directory written (default speclab-zoo/speclab_zoo/smollm2-<kind>) and the options
    that choose the training text (text_and_states)."""
    ap = argparse.ArgumentParser(prog=f"speclab train {kind}", description=doc.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", default=None, help=f"default: speclab-zoo/speclab_zoo/smollm2-{kind}")
    ap.add_argument("--data-dirs", nargs="*", default=None,
                    help=f"sets written by `speclab train smollm2-draft --gen-only` (default: {' '.join(DATA_DIRS)}, "
                         "unless --self-text is given)")
    ap.add_argument("--self-text", type=int, default=0, metavar="N",
                    help="the target writes greedy continuations of N stdlib prefixes (+ answers to the seed "
                         "questions where it has a chat template) to train on, cached in " + CACHE)
    ap.add_argument("--max-new", type=int, default=64, help="--self-text: tokens the target writes per prompt")
    ap.add_argument("--limit-rows", type=int, default=0, help="use only the first N rows of --data-dirs (a smoke run)")
    return ap


def save_head(head, out: Path, kind: str, argv: list[str], args, state: dict, data: dict, ev: dict) -> None:
    """A head trained on the target's text into `out` (save_draft), with speclab_train.json beside it:
    the command, its options, the steps, the training positions and the held-out agreement."""
    from speclab.models.adapter import save_draft
    from speclab.train.checkpoint import write_json
    save_draft(head, out, args.target, kind=kind)
    write_json(out / "speclab_train.json", {"command": shlex.join(["speclab", "train", kind, *argv]),
                                            "options": vars(args), "steps": state["step"],
                                            "positions": len(data["tokens"]), "held_out": ev})
    print(f"saved {out}", flush=True)


def describe(kind: str, params: list, what: str, head_ids, train_rows, held_rows, data: dict) -> None:
    """One line on what a head trainer trains (`what`: the head's own shape) and on how much text."""
    print(f"{kind}: {sum(p.numel() for p in params) / 1e6:.2f}M trained params, {what}, head {len(head_ids)} ids, "
          f"{len(train_rows)} train rows, {len(held_rows)} held out, {len(data['tokens'])} positions")


def train_and_held_windows(data: dict, train_rows, held_rows, T: int) -> tuple[list, list]:
    """The training windows and the held-out ones (the first twentieth of the training windows when
    the held-out rows make none)."""
    spans = windows(data, train_rows, T)
    return spans, windows(data, held_rows, T) or spans[:max(1, len(spans) // 20)]


# ----------------------------------------------------------------------------------------------
# main

def get_args(argv):
    ap = head_parser("clover", __doc__)
    add_options(ap, minutes=30.0, batch=8, seq_len=256, lr=1e-3, warmup=50, dev_help="unused: the heads are "
                "kept by held-out agreement on the training text's own split")
    ap.add_argument("--heads", type=int, default=4, help="draft depth: head k guesses token t+1+k")
    ap.add_argument("--ffn", type=int, default=None, help="augmenting block's MLP width (default: the hidden size; "
                    "0: attention only)")
    ap.add_argument("--head-size", type=int, default=12288, help="trimmed vocabulary: most frequent ids")
    ap.add_argument("--init-from", default=None,
                    help="start from the Medusa or Clover heads in this directory (their blocks and trimmed vocabulary)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    args = ap.parse_args(argv)
    if args.heads < 1 or args.minutes <= 0:
        ap.error("--heads must be >= 1 and --minutes > 0")
    if args.init_from and not (init_dir(args.init_from) / "model.safetensors").exists():
        ap.error(f"--init-from {args.init_from}: no heads there; give a Medusa or Clover directory "
                 "(e.g. speclab-zoo/speclab_zoo/smollm2-medusa)")
    return args


def init_dir(name: str) -> Path:
    """--init-from: a directory, or a zoo name."""
    from speclab.models.zoo import ZOO_DIR, zoo_path
    return Path(name) if Path(name).is_dir() else zoo_path(name) or ZOO_DIR / name


def build(base, head_ids, args):
    from speclab.models.clover import CloverHeads, clover_config
    head = CloverHeads(base, clover_config(base.config, args.heads, args.ffn), head_ids)
    for p in head.lm_head.parameters():
        p.requires_grad_(False)
    return head.float().train()


@torch.no_grad()
def evaluate(head, data, X, spans, norm, W_sub, args, autocast: bool) -> dict:
    """Held-out top-1 agreement with the target's greedy token, per head."""

    def stats():
        for i in range(0, len(spans), args.batch):
            tok, xs, _, lp, m = batch(data, [X], spans[i:i + args.batch], norm, W_sub)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                yield clover_loss(head, xs[-1], tok, lp, m)[1]
    return held_out_agreement(head, stats(), head.n_heads)


def main(argv=None):
    from speclab.models import zoo
    from speclab.train.checkpoint import start, start_from, trainable
    from speclab.train.vocab import text_head_ids

    argv, args = command_line(get_args, argv)
    out = Path(args.out or "speclab-zoo/speclab_zoo/smollm2-clover")
    base, tok = zoo.load(args.target)
    for p in base.parameters():
        p.requires_grad_(False)
    data, (X,) = text_and_states(base, tok, args, [base.config.num_hidden_layers])
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
    start_from(head, init, args.init_from)
    W_sub = head.lm_head.weight.detach().float()
    nw, eps = base.model.norm.weight.detach().float(), base.config.rms_norm_eps
    norm = lambda x: F.rms_norm(x.float(), x.shape[-1:], nw, eps)         # noqa: E731
    params = list(trainable(head).values())
    describe("clover", params, f"{head.n_heads} heads", head_ids, train_rows, held_rows, data)
    opt, ckpt, state = start(head, params, out, args.lr, args.resume)
    spans, held = train_and_held_windows(data, train_rows, held_rows, args.seq_len)

    save = saver(lambda: evaluate(head, data, X, held, norm, W_sub, args, autocast),
                 lambda ev: save_head(head, out, "clover", argv, args, state, data, ev), head, opt, ckpt, state)

    if not state["log"]:
        save()                                                    # step 0: the heads it starts from
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save, "train clover")
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        tok_b, xs, _, lp, m = batch(data, [X], [spans[j] for j in idx], norm, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, st = clover_loss(head, xs[-1], tok_b, lp, m)
        optimizer_step(opt, loss, params)
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k: f"{v:.2f}" for k, v in st.items()
                                                                  if k.startswith("acc")})
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
