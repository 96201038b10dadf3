"""Prompt sets shipped with speclab, built once from the HELD-OUT split of the corpus (modules the
zoo never trained on) and committed as JSONL, so every machine benchmarks the same prompts.

  code-complete  a prefix of a held-out module, cut at the colon of a `def ...:` line
  code-edit      a held-out function, then a near-duplicate's first line: the continuation
                 mostly repeats material already in the prompt (prompt lookup's home ground)
  code-mixed     alternating items of the two
  code-edit-long code-edit's task inside its file: the function follows up to ~5,000 characters of
                 the module before it (prompts of 752-1,631 tokens), so a verify attends over a
                 context like an editor's, not a snippet's
  chat           questions for an instruction-tuned model ({"chat": "..."} rows: the model's chat
                 template wraps each one), written by hand, so no draft trained on them
  chat-dev       60 more such questions, on other topics: the development split, to steer training
                 by (the trainers' dev score, scripts/head_agreement.py) while `chat` stays the test;
                 no draft trained on them. The first 20 were the whole set before 2026-11-26.

Prompts end at the colon, not after the newline: the byte-level BPE merges a newline with the
indentation that follows ("\n   " is one token), so a prompt ending in a bare "\n" asks for the
token after a token the models only ever saw before unindented code (they answered with a new
top-level `class`, ignoring the function just opened).

Rebuild (only needed after changing this file): python -m speclab.bench.prompts
Users may pass their own JSONL: one {"prompt": "..."} (raw text) or {"chat": "..."} (a user message)
object per line.
"""
from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
SETS = ("code-complete", "code-edit", "code-mixed", "chat", "chat-dev", "code-edit-long")
DEF_RE = re.compile(r"^( *)def \w+\(.*\):\s*$", re.M)


def load_prompts(name_or_path: str, limit: int | None = None) -> list[str | dict]:
    """Raw prompts as str, chat questions as {"chat": question}."""
    p = PROMPT_DIR / f"{name_or_path}.jsonl"
    if not p.exists():
        p = Path(name_or_path)
        if not p.exists():
            raise ValueError(f"unknown prompt set {name_or_path!r}: use one of {', '.join(SETS)} or a JSONL file")
    rows = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({"chat": str(row["chat"])} if "chat" in row else row["prompt"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{p}:{i + 1}: each line must be a JSON object with a 'prompt' "
                             f"or 'chat' string ({e})") from e
    return rows[:limit] if limit else rows


def encode(tokenizer, item: str | dict, max_new_tokens: int, max_positions: int | None) -> list[int]:
    """Token ids of one prompt-set item: chat questions through the tokenizer's chat template."""
    from speclab.api import chat_prompt, encode_prompt
    prompt = chat_prompt(tokenizer, item["chat"]) if isinstance(item, dict) else item
    return encode_prompt(tokenizer, prompt, max_new_tokens, max_positions)


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
    from speclab.train.corpus import read_text, source_files
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
    from speclab.train.corpus import read_text, source_files
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
