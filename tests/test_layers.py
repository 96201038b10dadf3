"""Dependencies point one way: apps -> widgets -> figures -> trace <- decoding -> models.

Every module of the package (speclab/, the front ends speclab/widgets and speclab/apps too) is
read with `ast`, and every import in it counts, function-level (lazy) ones too:
a lazy import that points up is still a cycle, only a later one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"speclab": ROOT / "speclab"}

UPPER = ("speclab.api", "speclab.cli", "speclab.bench", "speclab.apps", "speclab.widgets", "speclab.train")
LOWER = ("speclab.decoding", "speclab.models", "speclab.trace", "speclab.trace_schema", "speclab.trace_check",
         "speclab.records", "speclab.record_types", "speclab.figures",
         "speclab.metrics", "speclab.scoped",
         "speclab.params", "speclab.prompts")
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
        elif isinstance(node, ast.Call) and _called(node.func) == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.add(node.args[0].value)                   # importlib.import_module("speclab.x") counts too
    return found


def _called(func) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def offenders(src_prefixes, dst_prefixes, exact_dst=()) -> list[str]:
    return sorted(f"{src} -> {dst}" for src, deps in GRAPH.items() if under(src, src_prefixes)
                  for dst in deps if under(dst, dst_prefixes) or dst in exact_dst)


def circles(graph: dict[str, set[str]], inside: str) -> list[list[str]]:
    """The import circles among the modules of package `inside` (the package and every module below
    it): the strongly connected components of the graph with more than one module (Tarjan), each sorted."""
    nodes = sorted(n for n in graph if n == inside or n.startswith(inside + "."))
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph or not (w == inside or w.startswith(inside + ".")):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(out)


# every package and subpackage (a folder with __init__.py), from speclab itself down
PACKAGE_NAMES = sorted(n for n, f in MODULES.items() if f.name == "__init__.py")


def test_an_import_module_string_counts_as_an_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import importlib\nfrom importlib import import_module\n"
                 "def f():\n    importlib.import_module('speclab.api')\n    import_module('speclab.cli')\n")
    assert {"speclab.api", "speclab.cli"} <= imports("speclab.decoding.m", f)


def test_the_circle_check_finds_a_circle_and_nothing_else():
    g = {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c", "q.x"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "q.x": {"p.a"}}
    assert circles(g, "p") == [["p.a", "p.b", "p.c"]]
    assert circles(g, "q") == []                         # p.a -> q.x -> p.a crosses packages: not inside q
    assert circles({"p.a": {"p.b"}, "p.b": set()}, "p") == []


@pytest.mark.parametrize("package", PACKAGE_NAMES)
def test_no_import_circle_inside_a_package(package):
    """Module-level and lazy imports alike: a lazy import that closes a circle only delays it."""
    assert circles(GRAPH, package) == []


def test_training_never_imports_the_bench_or_a_front_end():
    # both read the prompt sets, which live below them (speclab.prompts)
    assert offenders(("speclab.train",), ("speclab.bench", "speclab.apps", "speclab.widgets", "speclab.cli")) == []


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
def test_a_module_never_imports_the_layer_that_calls_it(src, dst):
    assert not any(under(d, (dst,)) for d in GRAPH[src])
