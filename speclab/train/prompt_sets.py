"""Build the code-* prompt sets of speclab/prompts/ from the HELD-OUT split of the corpus (modules
the zoo never trained on), committed as JSONL so every machine benchmarks the same prompts
(speclab/prompts/__init__.py says what each set is).

    python -m speclab.train.prompt_sets       # only needed after changing this file
"""
from __future__ import annotations

import json
import os
import random
import re

from speclab.prompts import PROMPT_DIR, SETS
from speclab.train.corpus import read_text, source_files

DEF_RE = re.compile(r"^( *)def \w+\(.*\):\s*$", re.M)


def _functions(text: str) -> list[tuple[int, int]]:
    """(start, end) of top-level-or-method functions whose body is 4..30 lines."""
    out = []
    lines = text.splitlines(keepends=True)
    offs = [0]
    for ln in lines:
        offs.append(offs[-1] + len(ln))
    for m in DEF_RE.finditer(text):
        indent = len(m.group(1))
        i = text.count("\n", 0, m.start())
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            j += 1
        if 4 <= j - i <= 30:
            out.append((offs[i], offs[j]))
    return out


def build(n: int = 40, seed: int = 0, max_chars: int = 700):
    rng = random.Random(seed)
    files = [f for f in source_files("heldout")]
    texts = [read_text(f.path) for f in files]
    complete, edit = [], []
    while len(complete) < n or len(edit) < n:
        t = rng.choice(texts)
        fns = _functions(t)
        if not fns:
            continue
        s, e = rng.choice(fns)
        if len(complete) < n:
            cut = t.index("\n", s)                           # at the end of the def line
            complete.append(t[max(0, cut - max_chars):cut])
        if len(edit) < n and e - s < max_chars - 100:
            fn = t[s:e].rstrip() + "\n\n"
            first = fn.splitlines()[0]
            edit.append(fn + first.replace("def ", "def copy_of_", 1))
    mixed = [x for pair in zip(complete, edit) for x in pair][:n]
    for name, rows in zip(SETS, (complete, edit, mixed)):
        _write(name, rows)


def build_long(n: int = 20, seed: int = 1, context_chars: int = 5000, max_chars: int = 700):
    """code-edit-long: a held-out function after the module's text before it (from a line start,
    at most context_chars), then the near-duplicate's first line, as in code-edit."""
    rng = random.Random(seed)
    texts = [read_text(f.path) for f in source_files("heldout")]
    rows = []
    while len(rows) < n:
        t = rng.choice(texts)
        fns = [(s, e) for s, e in _functions(t) if s >= context_chars // 2 and e - s < max_chars - 100]
        if not fns:
            continue
        s, e = rng.choice(fns)
        start = 0 if s <= context_chars else t.index("\n", s - context_chars) + 1
        fn = t[s:e].rstrip() + "\n\n"
        row = t[start:s] + fn + fn.splitlines()[0].replace("def ", "def copy_of_", 1)
        if row not in rows:
            rows.append(row)
    _write("code-edit-long", rows)


def _write(name: str, rows: list[str]):
    """One set's JSONL, written whole or not at all."""
    PROMPT_DIR.mkdir(exist_ok=True)
    out = PROMPT_DIR / f"{name}.jsonl"
    tmp = out.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps({"prompt": r}) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, out)


if __name__ == "__main__":
    build()
    build_long()
