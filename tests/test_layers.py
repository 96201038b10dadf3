"""Dependencies point one way: apps -> widgets -> figures -> trace <- decoding -> models.

Every module of the package (speclab/, and widgets/ and apps/ shipped as speclab.widgets and
speclab.apps) is read with `ast`, and every import in it counts, function-level (lazy) ones too:
a lazy import that points up is still a cycle, only a later one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"speclab": ROOT / "speclab", "speclab.widgets": ROOT / "widgets", "speclab.apps": ROOT / "apps"}

UPPER = ("speclab.api", "speclab.cli", "speclab.bench", "speclab.apps", "speclab.widgets", "speclab.train")
LOWER = ("speclab.decoding", "speclab.models", "speclab.trace", "speclab.figures", "speclab.metrics",
         "speclab.params")
UI = ("panel", "ipywidgets", "bokeh")


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder).with_suffix("")
            if pkg == "speclab" and rel.parts[0] == "zoo":
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


MODULES = modules()


def imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports; `from a import b` counts as a.b when a.b is a module."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                  # relative: resolve against this package
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES}
            found |= subs
            if len(subs) < len(node.names):                 # names from the module itself
                found.add(mod)
    return found


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def offenders(src_prefixes, dst_prefixes, exact_dst=()) -> list[str]:
    return sorted(f"{src} -> {dst}" for src, deps in GRAPH.items() if under(src, src_prefixes)
                  for dst in deps if under(dst, dst_prefixes) or dst in exact_dst)


def test_the_walk_sees_the_whole_package():
    for name in ("speclab.api", "speclab.trace", "speclab.decoding.speculative", "speclab.models.hf",
                 "speclab.figures.tree", "speclab.widgets.player", "speclab.apps.dashboard", "speclab.bench.runner"):
        assert name in MODULES, name
    assert "speclab.decoding.drafters.lookup" in GRAPH["speclab.decoding.registry"]   # lazy imports count


def test_lower_layers_never_import_upper_ones():
    # `import speclab` from below would run speclab/__init__, i.e. the API
    assert offenders(LOWER, UPPER, exact_dst=("speclab",)) == []


def test_trace_imports_no_view_and_no_engine():
    assert offenders(("speclab.trace",), ("speclab.export", "speclab.figures", "speclab.decoding",
                                           "speclab.models")) == []


def test_decoding_never_imports_training_or_views():
    assert offenders(("speclab.decoding",), ("speclab.train", "speclab.figures", "speclab.export")) == []


def test_views_never_touch_a_model():
    assert offenders(("speclab.figures", "speclab.export", "speclab.widgets"),
                     ("speclab.decoding", "speclab.models", "speclab.api")) == []


def test_models_never_import_engines_or_views():
    assert offenders(("speclab.models",), ("speclab.decoding", "speclab.figures", "speclab.export")) == []


def test_widgets_never_import_the_dashboard():
    assert offenders(("speclab.widgets",), ("speclab.apps",)) == []


def test_core_never_imports_a_ui_toolkit():
    core = [n for n in MODULES if not under(n, ("speclab.widgets", "speclab.apps"))]
    assert sorted(f"{src} -> {dst}" for src in core for dst in GRAPH[src] if under(dst, UI)) == []
    assert offenders(("speclab.apps",), ("panel",))                 # the check does see UI imports


@pytest.mark.parametrize("src,dst", [("speclab.decoding.dllm_run", "speclab.api"),
                                     ("speclab.bench.runner", "speclab.cli"), ("speclab.apps.runs", "speclab.cli"),
                                     ("speclab.trace", "speclab.export"), ("speclab.decoding.dag", "speclab.train.dag")])
def test_the_cycles_issue_15_named_are_gone(src, dst):
    assert not any(under(d, (dst,)) for d in GRAPH[src])
