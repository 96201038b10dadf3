"""Recipes that produced the embedded zoo. `speclab train <recipe>` calls `main()`.

    speclab train tokenizer --out DIR
    speclab train target    --out DIR --tokenizer DIR --minutes 75
    speclab train draft     --out DIR --tokenizer DIR --minutes 20 [--distill-from TARGET_DIR]
    speclab train zoo-ar    --out DIR --minutes 100      (all of the above, in order)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from speclab.train.ar import DRAFT_SHAPE, TARGET_SHAPE, TrainConfig, train_lm

TARGET_EXITS = [2, 4, 6]


def train_tokenizer_recipe(out: Path, vocab_size: int = 8192):
    from speclab.train.corpus import iter_texts
    from speclab.train.tokenizer import train_tokenizer
    return train_tokenizer(iter_texts("train"), out, vocab_size)


def train_target(out, tokenizer, minutes, resume=False, **kw):
    cfg = TrainConfig(minutes=minutes, exit_layers=TARGET_EXITS, **kw)
    return train_lm(out, tokenizer, TARGET_SHAPE, cfg, resume=resume)


def train_draft(out, tokenizer, minutes, distill_from=None, resume=False, init_from=None, **kw):
    cfg = TrainConfig(minutes=minutes, lr=2e-3, distill_from=str(distill_from) if distill_from else None, **kw)
    return train_lm(out, tokenizer, DRAFT_SHAPE, cfg, resume=resume, init_from=init_from)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", choices=["tokenizer", "target", "draft", "zoo-ar"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer", type=Path, help="tokenizer dir (default: OUT/../tokenizer)")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--distill-from", type=Path)
    ap.add_argument("--init-from", type=Path, help="start the draft from these weights")
    ap.add_argument("--selfgen-minutes", type=float, default=0.0,
                    help="with --distill-from: minutes spent writing teacher greedy text to distil on")
    ap.add_argument("--selfgen-share", type=float, default=0.5,
                    help="share of each batch taken from the teacher's text (1 = distil on it alone)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--corpus", choices=["stdlib", "stdlib+tests"], default="stdlib",
                    help="stdlib+tests adds the standard library's test suite to the training side")
    a = ap.parse_args(argv)
    tok = a.tokenizer or a.out.parent / "tokenizer"
    kw = dict(threads=a.threads, max_steps=a.max_steps, batch_size=a.batch_size, corpus=a.corpus,
              selfgen_minutes=a.selfgen_minutes, selfgen_share=a.selfgen_share)
    if a.recipe == "tokenizer":
        train_tokenizer_recipe(a.out)
    elif a.recipe == "target":
        train_target(a.out, tok, a.minutes, resume=a.resume, **kw)
    elif a.recipe == "draft":
        train_draft(a.out, tok, a.minutes, a.distill_from, resume=a.resume, init_from=a.init_from, **kw)
    else:  # the whole pair, in order, splitting the budget 70 / 20 / 10
        tok = a.out / "tokenizer"
        train_tokenizer_recipe(tok)
        train_target(a.out / "code-target", tok, 0.7 * a.minutes, **kw)
        train_draft(a.out / "code-draft", tok, 0.2 * a.minutes, **kw)
        train_draft(a.out / "code-draft", tok, 0.1 * a.minutes, a.out / "code-target",
                    init_from=a.out / "code-draft", **kw)


if __name__ == "__main__":
    main()
