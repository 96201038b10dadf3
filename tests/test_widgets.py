"""The Jupyter player, driven without a browser: moving the slider updates the same FigureWidget."""
from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import pytest

import speclab
from speclab.figures import step_dict
from speclab.widgets import Player, show


@pytest.fixture(scope="module")
def result(target):
    return speclab.generate(target, "def parse(line):\n    ", method="recycling", width=2, k=4,
                            max_new_tokens=16, record="full")


def data(fig) -> list[dict]:
    """Trace properties without plotly's per-trace uid (FigureWidgets get one, Figures do not)."""
    return [{k: v for k, v in t.to_plotly_json().items() if k != "uid"} for t in fig.data]


def expected(trace, step):
    return data(go.Figure(step_dict(trace, step)))


def test_slider_updates_the_same_figure_in_place(result):
    v = show(result)
    assert isinstance(v, Player) and v.play.max == v.slider.max == len(result.trace.rounds) - 1
    fig, first, uids = v.figure, data(v.figure), [t.uid for t in v.figure.data]
    last = v.slider.max
    v.slider.value = last                                   # what dragging the slider does
    assert v.figure is fig and v.step == last
    now = data(fig)
    assert now != first and now == expected(result.trace, last)
    assert [t.uid for t in fig.data] == uids               # the same traces, updated, not re-created
    assert fig.layout.annotations[0].text.startswith(f"round {last + 1}/")
    assert list(v.strip.data[2].x) == [last + 1, last + 1]  # the summary strip marks the round (1-based)
    v.update(0)                                             # the callback, called directly
    assert v.slider.value == 0 and data(fig) == first


def test_mask_view_follows_the_step_in_place(result):
    from speclab.figures.mask import mask_dict
    v = show(result)
    mask = v.mask
    step = max(range(len(result.trace.rounds)), key=lambda k: len(result.trace.rounds[k].nodes))
    v.slider.value = step
    assert v.mask is mask                                   # the same FigureWidget, moved
    assert [list(r) for r in mask.data[0].z] == mask_dict(result.trace, step)["data"][0]["z"]
    assert mask.layout.title.text.startswith(f"round {step + 1} of")


def test_detail_panel_follows_the_step(result):
    v = show(result.trace)
    for k, r in enumerate(result.trace.rounds):
        v.slider.value = k
        assert f"round {k + 1} of" in v.detail.value
        assert v.detail.value.count("<tr") == (len(r.nodes) + 1 if r.nodes else 0)


def test_show_opens_a_saved_trace_without_a_model(result, tmp_path):
    path = result.trace.save(tmp_path / "run.json")
    for src in (path, str(path), result.trace.to_dict()):
        v = show(src)
        v.update(1)
        assert data(v.figure) == expected(result.trace, 1)
    with pytest.raises(TypeError, match="show"):
        show(42)
    with pytest.raises(speclab.TraceError):
        show(tmp_path / "missing.json")


def test_dag_player_walks_the_strategies():
    from speclab.decoding.dag import run_dag
    from speclab.models.dag import load_dag
    model = load_dag(Path(speclab.__file__).parent / "zoo" / "dates-dat")
    trace = run_dag(model, "2024-03-05", strategy="all", record="light")
    v = show(trace)
    names = list(trace.dag.paths)
    assert v.slider.max == len(names) - 1 and v.strip is None
    fig = v.figure
    for k, name in enumerate(names):
        v.slider.value = k
        widths = {t.name.split(":")[0]: t.line.width for t in fig.data if t.name and t.name.split(":")[0] in names}
        assert widths[name] == 4 and all(w == 2 for n, w in widths.items() if n != name)
        assert name in v.detail.value and v.figure is fig


def test_jupyterlab_layout_fixes(result):
    """What JupyterLab showed wrong, pinned: a figure with no width (titles clipped at 700 px),
    legend markers shrinking to dots on rounds without such nodes, the token strip's legend over its title."""
    from speclab.figures import token_strip
    from speclab.widgets.player import WIDTH
    v = show(result)
    assert v.figure.layout.width == WIDTH and (v.strip is None or v.strip.layout.width == WIDTH)
    assert v.figure.layout.legend.itemsizing == "constant"
    strip = token_strip(result.trace, 0)
    assert strip.layout.legend.y <= 0 and strip.layout.legend.itemsizing == "constant"


def test_whitespace_tokens_read_on_a_projector():
    from speclab.figures._util import show_token
    assert show_token("\n        return") == "⏎·×8return"       # an indentation run as a count
    assert show_token(" the") == "·the" and show_token("  x") == "··x" and show_token("") == "∅"
