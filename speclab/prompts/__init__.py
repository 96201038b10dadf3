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
                 no draft trained on them.
  category-NAME  8 chat questions of one task category (coding, math, extraction, ...): the category
                 bench's (`speclab bench --categories`, speclab/bench/categories.py)

Prompts end at the colon, not after the newline: the byte-level BPE merges a newline with the
indentation that follows ("\n   " is one token), so a prompt ending in a bare "\n" asks for the
token after a token the models only ever saw before unindented code (they answered with a new
top-level `class`, ignoring the function just opened).

The sets are data that training (its dev score) and the bench both read, so they live here, below
both; the code-* sets are built from the corpus by speclab/train/prompt_sets.py
(`python -m speclab.train.prompt_sets`, only needed after changing it). Users may pass their own
JSONL: one {"prompt": "..."} (raw text) or {"chat": "..."} (a user message) object per line.
"""
from __future__ import annotations

import json
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent
SETS = ("code-complete", "code-edit", "code-mixed", "chat", "chat-dev", "code-edit-long") + tuple(
    sorted(f.stem for f in PROMPT_DIR.glob("category-*.jsonl")))


def load_prompts(name_or_path: str, limit: int | None = None) -> list[str | dict]:
    """Raw prompts as str, chat questions as {"chat": question}. ValueError, naming the file and
    line, for a file that is not UTF-8 text, a line that is not such an object, or no prompt at all."""
    p = PROMPT_DIR / f"{name_or_path}.jsonl" if name_or_path in SETS else Path(name_or_path)
    try:
        found = p.is_file()
    except (OSError, ValueError):           # a name no file system takes: too long, a NUL byte
        found = False
    if not found:
        raise ValueError(f"unknown prompt set {name_or_path!r}: use one of {', '.join(SETS)} or a JSONL file")
    rows = []
    for i, line in enumerate(read_text(p).splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            kind = "chat" if isinstance(row, dict) and "chat" in row else "prompt"
            text = row[kind]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{p}:{i + 1}: each line must be a JSON object with a 'prompt' "
                             f"or 'chat' string ({e})") from e
        text = prompt_text(text, f"{p}:{i + 1}: {kind!r}")
        rows.append({"chat": text} if kind == "chat" else text)
    if not rows:
        raise ValueError(f"{p} holds no prompts: write one JSON object a line, e.g. {{\"prompt\": \"def f(\"}}")
    return rows[:limit] if limit else rows


def read_text(path: Path) -> str:
    """A prompt file's text (a byte-order mark, as some editors write, dropped); ValueError naming the
    file where it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise ValueError(f"cannot read the prompt file {path}: {e.strerror}") from None


def prompt_text(v, where: str) -> str:
    """A prompt as a tokenizer takes it: a string of valid text (JSON's \\ud800 escapes can write
    a lone surrogate, which no tokenizer encodes)."""
    if not isinstance(v, str):
        raise ValueError(f"{where} must be a string, not {type(v).__name__}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): "
                         "not valid text") from None
    return v


def encode(tokenizer, item: str | dict, max_new_tokens: int, max_positions: int | None) -> list[int]:
    """Token ids of one prompt-set item: chat questions through the tokenizer's chat template."""
    from speclab.models.loading import chat_prompt, encode_prompt
    prompt = chat_prompt(tokenizer, item["chat"]) if isinstance(item, dict) else item
    return encode_prompt(tokenizer, prompt, max_new_tokens, max_positions)
