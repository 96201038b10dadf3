"""The wheel's projected size, from the checkout, without building it.

PyPI takes at most 100 MB a file, and speclab's two wheels carry trained weights: `speclab` the toy
zoo, `speclab-zoo` (the folder speclab-zoo/) the SmolLM2 parts. For each, this script
lists what the build packages, as pyproject.toml says (every .py of every package found under the
include patterns, plus the package-data patterns less the exclude-package-data ones), and adds up
each file's size once deflated, as the wheel's zip stores it: small files are compressed (zlib level
6, what zipfile writes); files over 1 MiB, the weights, are priced at their bytes' order-0 entropy,
which deflate reaches on float weights within ~1.5% a file and ~0.2% in all (measured against a
built wheel) at a fraction of the time. Plus the zip's headers and the .dist-info files.

    python scripts/wheel_size.py            # each wheel's total, the budget, and its largest parts

tests/test_wheel_size.py fails when either projection passes BUDGET; docs/architecture.md ("The
wheel's size") says which split to make then.
"""
from __future__ import annotations

import argparse
import sys
import tomllib
import zlib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PYPI_LIMIT = 100_000_000      # PyPI's limit per file, read as decimal megabytes (the stricter reading)
BUDGET = 95_000_000           # the test's line, for each wheel: 5 MB below the limit
DISTRIBUTIONS = {"speclab": ROOT, "speclab-zoo": ROOT / "speclab-zoo"}    # name -> its project folder
DEFLATE_BELOW = 1 << 20       # files smaller than this are compressed for real
ZIP_OVERHEAD = 30 + 46        # a zip entry's local header + central directory record, besides the name twice
RECORD_LINE = 100             # a RECORD line: name, sha256 and size


@dataclass(frozen=True)
class Part:
    path: Path                # relative to the project root
    size: int                 # bytes on disk
    packed: int               # bytes once deflated (projected)


def _deflated(data: bytes) -> int:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)      # raw deflate, as a zip member
    return len(c.compress(data)) + len(c.flush())


def deflated_size(path: Path) -> int:
    """The projected deflated size of one file (see the module's docstring)."""
    size = path.stat().st_size
    if size < DEFLATE_BELOW:
        return _deflated(path.read_bytes())
    counts = np.bincount(np.fromfile(path, dtype=np.uint8), minlength=256)
    p = counts[counts > 0] / size
    return int(np.ceil(-(p * np.log2(p)).sum() * size / 8))


def _matches(base: Path, patterns: list[str]) -> set[Path]:
    return {p for pattern in patterns for p in base.glob(pattern) if p.is_file()}


def _packages_under(root: Path, namespaces: bool, prefix: tuple[str, ...] = ()):
    """Dotted names of the packages under root as setuptools' find sees them: every folder without a
    dot in its name that has an __init__.py, or every such folder at all where namespaces are on
    (PEP 420: pyproject.toml's default), descending only into packages."""
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if "." in d.name or not (namespaces or (d / "__init__.py").is_file()):
            continue
        yield ".".join(prefix + (d.name,))
        yield from _packages_under(d, namespaces, prefix + (d.name,))


def packaged_files(root: Path = ROOT) -> list[Path]:
    """The files the wheel holds under its packages, relative to root, as pyproject.toml's setuptools
    table says. Raises on a setting this reading does not model, so it never guesses."""
    tool = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("tool", {})
    st = tool.get("setuptools", {})
    if st.get("include-package-data", True) or st.get("package-dir") or st.get("py-modules"):
        raise ValueError("pyproject.toml: only include-package-data = false, no package-dir and no "
                         "py-modules are modelled here; teach scripts/wheel_size.py the new setting")
    packages = st.get("packages")
    if isinstance(packages, dict) and set(packages) == {"find"}:
        find = packages["find"]
        if set(find) - {"include", "exclude", "namespaces"}:
            raise ValueError(f"packages.find: {sorted(set(find) - {'include', 'exclude', 'namespaces'})} "
                             "not modelled")
        include, exclude = find.get("include", ["*"]), find.get("exclude", [])
        names = {n for n in _packages_under(root, find.get("namespaces", True))
                 if any(fnmatchcase(n, pat) for pat in include) and not any(fnmatchcase(n, pat) for pat in exclude)}
    elif isinstance(packages, list):
        names = set(packages)
    else:
        raise ValueError(f"[tool.setuptools] packages = {packages!r}: not modelled")
    out: set[Path] = set()
    for name in names:
        base = root.joinpath(*name.split("."))
        out |= {p for p in base.glob("*.py") if p.is_file()}
    excluded: set[Path] = set()
    for name, patterns in st.get("package-data", {}).items():
        out |= _matches(root.joinpath(*name.split(".")), patterns)
    for name, patterns in st.get("exclude-package-data", {}).items():
        excluded |= _matches(root.joinpath(*name.split(".")), patterns)
    return sorted(p.relative_to(root) for p in out - excluded)


def projected_parts(root: Path = ROOT) -> list[Part]:
    return [Part(rel, (root / rel).stat().st_size, deflated_size(root / rel)) for rel in packaged_files(root)]


def projected_size(root: Path = ROOT, parts: list[Part] | None = None) -> int:
    """The wheel's projected size in bytes: the parts deflated, their zip entries and RECORD lines,
    and the .dist-info (its METADATA carries the README)."""
    parts = projected_parts(root) if parts is None else parts
    entries = sum(p.packed + ZIP_OVERHEAD + 2 * len(str(p.path)) + RECORD_LINE for p in parts)
    readme = root / "README.md"
    dist_info = (_deflated(readme.read_bytes()) if readme.is_file() else 0) + 4_000
    return entries + dist_info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=12, help="how many of the largest parts to list")
    args = ap.parse_args(argv)
    over = False
    for name, root in DISTRIBUTIONS.items():
        parts = projected_parts(root)
        total = projected_size(root, parts=parts)
        over |= total > BUDGET
        groups: dict[str, int] = {}
        for p in parts:
            key = "/".join(p.path.parts[:3]) if p.path.parts[1:2] == ("zoo",) else "/".join(p.path.parts[:2])
            groups[key] = groups.get(key, 0) + p.packed
        print(f"{name}: {len(parts)} files, {sum(p.size for p in parts) / 1e6:.1f} MB unpacked; projected wheel "
              f"{total / 1e6:.1f} MB (budget {BUDGET / 1e6:.0f} MB, PyPI {PYPI_LIMIT / 1e6:.0f} MB)")
        for key, packed in sorted(groups.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {packed / 1e6:7.2f} MB  {key}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
