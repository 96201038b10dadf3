"""The training corpus: the Python standard library of the interpreter that runs this file.

Every machine with Python has it, so the zoo can be retrained offline anywhere. The split is by
whole top-level modules (a package and all its files go to the same side), fixed by a hash of the
module name, so held-out prompts come from code the models never saw:

    held out  <=>  sha256(top_level_name) % 10 == HELD_OUT_BUCKET

Test suites (test/, tests/, idle_test/) and site-packages are excluded, except that the
`stdlib+tests` corpus adds the standard library's own test suite to the TRAINING side (about 3x
the tokens; the held-out split is the same either way). Why: on the 2.8M-token `stdlib` corpus
alone the 12.5M-parameter target's training loss keeps falling while its held-out loss stops: it
memorises, so it needs more text.
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


CORPORA = ("stdlib", "stdlib+tests")


def source_files(split: str = "train", root: Path | None = None, corpus: str = "stdlib") -> list[SourceFile]:
    """All .py files of one split ("train", "heldout" or "all"), sorted for reproducibility."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"unknown split {split!r}: use 'train', 'heldout' or 'all'")
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}: use one of {', '.join(CORPORA)}")
    root = Path(root) if root else stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = set(rel.parts[:-1])
        tests_ok = corpus == "stdlib+tests" and split == "train" and rel.parts[0] == "test"
        if EXCLUDED_PARTS & parts and not (tests_ok and not parts & {"site-packages", "__pycache__"}):
            continue
        module = rel.parts[0].removesuffix(".py")
        held = is_held_out(module)
        if split == "all" or (split == "heldout") == held:
            out.append(SourceFile(path, module))
    return out


def read_text(path: Path) -> str:
    """Some stdlib files are not valid UTF-8 (latin-1 test data): repair instead of failing."""
    return path.read_bytes().decode("utf-8", errors="replace")


def iter_texts(split: str = "train", root: Path | None = None, corpus: str = "stdlib") -> Iterator[str]:
    for f in source_files(split, root, corpus):
        text = read_text(f.path)
        if text.strip():
            yield text
