"""The training corpus: the Python standard library of the interpreter that runs this file.

Every machine with Python has it, so the zoo can be retrained offline anywhere. The split is by
whole top-level modules (a package and all its files go to the same side), fixed by a hash of the
module name, so held-out prompts come from code the models never saw:

    held out  <=>  sha256(top_level_name) % 10 == HELD_OUT_BUCKET

Test suites (test/, tests/, idle_test/) and site-packages are excluded.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

HELD_OUT_BUCKET = 3
EXCLUDED_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}


@dataclass(frozen=True)
class SourceFile:
    path: Path
    module: str  # top-level module name, e.g. "email" for email/mime/text.py


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(module: str) -> bool:
    return int(hashlib.sha256(module.encode()).hexdigest(), 16) % 10 == HELD_OUT_BUCKET


def source_files(split: str = "train", root: Path | None = None) -> list[SourceFile]:
    """All .py files of one split ("train", "heldout" or "all"), sorted for reproducibility."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"unknown split {split!r}: use 'train', 'heldout' or 'all'")
    root = Path(root) if root else stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_PARTS & set(rel.parts[:-1]):
            continue
        module = rel.parts[0].removesuffix(".py")
        held = is_held_out(module)
        if split == "all" or (split == "heldout") == held:
            out.append(SourceFile(path, module))
    return out


def read_text(path: Path) -> str:
    """Some stdlib files are not valid UTF-8 (latin-1 test data): repair instead of failing."""
    return path.read_bytes().decode("utf-8", errors="replace")


def iter_texts(split: str = "train", root: Path | None = None) -> Iterator[str]:
    for f in source_files(split, root):
        text = read_text(f.path)
        if text.strip():
            yield text
