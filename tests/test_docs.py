"""The prose says what the code does: no project-history names anywhere, a README that fits a front
door and lists every notebook and method, the methods page's parameters equal to the code's
defaults, every relative link in README.md and docs/*.md resolves, and every short command there
runs as written.

Which commands run (the rest are long by this rule, and are run by hand or by the bench):
  - `speclab methods`, and any `speclab ...` line with -h / --help;
  - `speclab run` on a toy zoo target (TOY) with at most 64 new tokens or canvas slots;
  - `speclab export` (its trace must come from an earlier command of the same file);
  - every fenced python block right after a `<!-- test: run -->` line.
Never: `make`, `speclab serve | bench | train` (without -h), the real model's runs (smollm2-*).
Commands of one file run in order in one temporary directory, in this process (speclab.cli.main,
what the console script calls); one subprocess checks the console script itself.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

HISTORY = re.compile(r"(first|second|third|[a-z]+th) stop", re.I)
# "this" or "last" before "stop" names a moment in the project's history too (before "stop token" it does not)
STOP = re.compile(r"\b(this|last) stop\b(?![-_ ]?(token|string|id|word|sequence|criteri))", re.I)
SKIP_DIRS = {".git", ".venv", ".venv-vllm", "node_modules", "__pycache__", ".pytest_cache", "build", "dist"}
TEXT = {".py", ".md", ".ipynb", ".txt", ".toml", ".cfg", ".sh", ".yml", ".yaml", ".cpp", ".h", ".js", ".html",
        ".json", ".jsonl", ""}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOY = {"code-target", "code-draft", "code-dllm", "digits-dllm", "digits-dgemma", "numwords-dat", "dates-dat"}
MAX_QUICK_TOKENS = 64


def repo_text_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix in TEXT and path.stat().st_size < 20_000_000:
                yield path


def test_no_project_history_names_anywhere():
    """An ordinal followed by 'stop' names a moment in the project's history: git keeps history,
    the files say what is true now (code, tests, docs, notebooks, README, BENCHMARKS)."""
    hits = []
    for path in repo_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                 for m in HISTORY.finditer(text)]
    assert hits == []


def package_comments(path: Path):
    """(line, text) of every comment and string literal of a .py file (docstrings included), or of
    every line of a .cpp file that holds a comment."""
    if path.suffix == ".py":
        with path.open(encoding="utf-8") as f:
            for tok in tokenize.generate_tokens(f.readline):
                if tok.type in (tokenize.COMMENT, tokenize.STRING):
                    yield tok.start[0], tok.string
    else:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "//" in line or "/*" in line or line.lstrip().startswith("*"):
                yield n, line


def test_no_this_stop_or_last_stop_in_prose_or_comments():
    """The README, BENCHMARKS.md, docs/*.md and the package's comments say what is true now, never
    name a moment of the project's history by the stop it happened at (STOP)."""
    prose = [ROOT / "BENCHMARKS.md", *DOCS]
    code = sorted(p for p in (ROOT / "speclab").rglob("*") if p.suffix in (".py", ".cpp")
                  and STOP.search(p.read_text(encoding="utf-8")))      # only those files are parsed
    hits = [f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for p in prose for text in [p.read_text(encoding="utf-8")] for m in STOP.finditer(text)]
    hits += [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}"
             for p in code for n, text in package_comments(p) for m in STOP.finditer(text)]
    assert hits == []
    moment, token = " ".join(["as measured at the Last", "Stop"]), " ".join(["the last", "stop token"])
    assert STOP.search(moment) and not STOP.search(token)


# -- every relative link resolves ----------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text (outside fenced blocks), -1, -2 ... for repeats."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        base = slug(m.group(1))
        out.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return out


def relative_links(text: str) -> list[str]:
    """The targets of inline links and images and of reference definitions, outside code, that are
    not URLs."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", text, flags=re.M)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{path.name}: {target} (no such heading)")
    return bad


def test_the_link_rule_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## A `code` heading (x)\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-code-heading-x) ![img](b.md) [top](#here) [web](https://x.org/a.md)\n"
                    "`[not a link](nowhere.md)`\n[gone](missing.md) [bad](b.md#not-a-heading)\n"
                    "[also](b.md#not-a-heading-1)\n\n# Here\n")
    assert slug("The draft (`smollm2-draft`)") == "the-draft-smollm2-draft"
    assert broken_links(page) == ["a.md: missing.md (no such file)", "a.md: b.md#not-a-heading (no such heading)",
                                  "a.md: b.md#not-a-heading-1 (no such heading)"]


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_relative_links_resolve(path):
    """Every relative link of README.md and docs/*.md names a file that exists, and its #anchor a
    heading of that file where it is markdown."""
    assert broken_links(path) == []


# -- the README is a front door -------------------------------------------------------------------
def test_readme_is_short_and_lists_every_notebook_and_method():
    from speclab.decoding.registry import METHODS
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks and [n for n in notebooks if n not in readme] == []
    assert [m for m in METHODS if f"`{m}`" not in readme] == []


def test_readme_methods_table_is_the_registrys():
    """The table is generated from the registry (scripts/readme_methods.py): paste its output over
    the README's table after a change to the registry."""
    from readme_methods import table
    assert table() in (ROOT / "README.md").read_text()


# -- BENCHMARKS.md: current numbers only, each beside the data it came from ------------------------
BENCHMARKS_MAX_LINES = 600        # each topic's newest measurement; git keeps the older ones
# a data file under benchmarks/ named in full (not a "-run2.json" tail that shares a named file's stem)
BENCH_FILE = re.compile(r"(?<![\w/.-])benchmarks/[\w./-]*?\.(?:json|log)\b")


def test_the_benchmarks_rule_finds_data_paths():
    text = ("JSON `benchmarks/gpu/2026-11-28-h100-device-loop.json`, log benchmarks/a.log;\n"
            "    --json benchmarks/2026-11-28-dllm-report-20.json --plot x.png\n"
            "`-run2.json`, x/benchmarks/no.json, benchmarks/README.md")
    assert BENCH_FILE.findall(text) == ["benchmarks/gpu/2026-11-28-h100-device-loop.json", "benchmarks/a.log",
                                        "benchmarks/2026-11-28-dllm-report-20.json"]


def test_benchmarks_is_short():
    """BENCHMARKS.md keeps each topic's newest measurement with its machine, command and JSON, no
    before / now history (git has it): at most BENCHMARKS_MAX_LINES lines."""
    lines = len((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines())
    assert lines <= BENCHMARKS_MAX_LINES, (f"BENCHMARKS.md has {lines} lines (at most {BENCHMARKS_MAX_LINES}): "
                                          "drop superseded rows and narrative, keep the newest measurement")


def test_benchmarks_data_paths_exist():
    """Every benchmarks/... .json or .log that BENCHMARKS.md names is in the checkout."""
    paths = BENCH_FILE.findall((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert len(paths) >= 5, "BENCHMARKS.md names almost no data: the pattern is out of date"
    assert [p for p in dict.fromkeys(paths) if not (ROOT / p).is_file()] == []


def params_line(name: str) -> str:
    """A method's parameters with their defaults as docs/methods.md writes them: `name=default`."""
    from speclab.decoding.registry import DLLM_RUN_PARAMS, method_defaults
    items = [(k, v) for k, v in method_defaults(name).items() if k not in DLLM_RUN_PARAMS]
    return ", ".join(f"`{k}={v}`" for k, v in items) or "none"


def test_methods_page_gives_every_method_its_parameters_and_defaults():
    from speclab.decoding.registry import METHODS
    page = (ROOT / "docs" / "methods.md").read_text()
    listed = re.findall(r"^Parameters[^:]*: (.*)$", page, flags=re.M)
    missing = [m for m in METHODS if f"`{m}`" not in page]
    wrong = [f"{m}: {params_line(m)}" for m in METHODS if params_line(m) not in listed]
    assert missing == [] and wrong == []


# -- every short command runs as written ----------------------------------------------------------
def fenced_blocks(text: str):
    """(info string, the line before the fence, body) of every fenced block."""
    for m in re.finditer(r"(?:^([^\n]*)\n)?^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        yield m.group(2), (m.group(1) or "").strip(), m.group(3)


def shell_commands(text: str) -> list[str]:
    out = []
    for info, _, body in fenced_blocks(text):
        if info not in ("sh", "bash", "shell", "console", ""):
            continue
        body = re.sub(r"\\\n\s*", " ", body)                      # join continued lines
        for line in body.splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())           # a trailing comment
            if line.startswith("speclab "):
                out.append(line)
    return out


def value_of(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def is_quick(argv: list[str]) -> bool:
    sub = argv[1] if len(argv) > 1 else ""
    if "-h" in argv or "--help" in argv:
        return True
    if sub in ("methods", "export"):
        return True
    if sub == "run":
        n = value_of(argv, "--gen-length") or value_of(argv, "--max-new-tokens")
        dag = (value_of(argv, "--method") or "").startswith("dag-")
        return value_of(argv, "--target") in TOY and (dag or (n is not None and int(n) <= MAX_QUICK_TOKENS))
    return False


def quick_commands(path: Path) -> list[list[str]]:
    return [argv for argv in map(shlex.split, shell_commands(path.read_text())) if is_quick(argv)]


def test_the_command_rule_finds_commands_and_skips_the_long_ones():
    text = ("```sh\nspeclab methods\nspeclab run --target code-target --method ar --prompt x \\\n"
            "    --max-new-tokens 8   # a comment\nspeclab run --target smollm2-135m --prompt x --max-new-tokens 8\n"
            "speclab serve --port 5006\nspeclab bench -h\nmake demo\n```\n")
    found = [shlex.split(c) for c in shell_commands(text)]
    assert [c[1] for c in found] == ["methods", "run", "run", "serve", "bench"]
    assert [is_quick(c) for c in found] == [True, True, False, False, True]
    assert sum(len(quick_commands(p)) for p in DOCS) >= 5       # the docs do show commands that run


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_short_commands_run_as_written(path, tmp_path, monkeypatch):
    from speclab.cli import main
    monkeypatch.chdir(tmp_path)
    for argv in quick_commands(path):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                rc = main(argv[1:])
            except SystemExit as e:                      # -h exits 0 from argparse
                rc = e.code or 0
        assert rc == 0, f"{path.name}: `{shlex.join(argv)}` exited {rc}"


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_python_blocks_marked_runnable_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = [body for info, before, body in fenced_blocks(path.read_text())
              if info == "python" and before == "<!-- test: run -->"]
    for body in blocks:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(body, f"{path.name} (python block)", "exec"), {"__name__": "__docs__"})


def test_the_console_script_runs():
    exe = Path(sys.executable).with_name("speclab")
    r = subprocess.run([str(exe), "methods"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0 and "draft-model" in r.stdout
