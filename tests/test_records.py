"""Typed records (speclab/records.py): every info key a method writes is declared, checked on load,
read typed, and drawn by the figure that declares the record, in every front end alike."""
from __future__ import annotations

import glob
import json
import re
from dataclasses import replace
from pathlib import Path

import plotly.graph_objects as go
import pytest

from speclab import records
from speclab.figures.views import FigureSpec, added_record_figure, view_of
from speclab.records import Record, SkipMask, record, registered_record
from speclab.trace import DenoiseStep, Round, Trace, TraceError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(glob.glob(str(ROOT / "speclab/apps/examples/*.json")))


def rounds_trace(infos: list[dict], method: str = "anything") -> Trace:
    return Trace(engine="speculative", method=method, prompt_ids=[1], output_ids=[2] * len(infos),
                 rounds=[Round(emitted=2, emitted_kind="target", kept=1, info=dict(i)) for i in infos])


def test_every_recorded_example_writes_declared_keys_of_their_types():
    """The recorded runs of every method the dashboard offers (real models): no key undeclared."""
    assert len(EXAMPLES) >= 40
    seen = set()
    for f in EXAMPLES:
        t = Trace.load(f)                                  # types checked against the records
        assert not records.undeclared(t), (f, records.undeclared(t))
        seen |= {k for r in t.rounds for k in r.info} | {k for s in t.denoise for k in s.info}
    assert {"skip", "draft_version", "forced", "entropy", "shape"} <= seen


def test_a_declared_key_of_the_wrong_type_fails_on_load_naming_it(tmp_path):
    d = rounds_trace([{"skip": "..a.", "k": 3}]).to_dict()
    Trace.from_dict(json.loads(json.dumps(d)))
    d["rounds"][0]["info"]["skip"] = 7
    with pytest.raises(TraceError, match=r"rounds\[0\]\.info\.skip is 7, not a string"):
        Trace.from_dict(d)
    d["rounds"][0]["info"] = {"k": "three"}
    with pytest.raises(TraceError, match=r"info\.k is 'three', not an integer"):
        Trace.from_dict(d)
    step = DenoiseStep(block=(0, 2), masked=[0], top1=[3], conf=[0.5], margin=[0.1], info={"forced": "all"})
    dl = Trace(engine="diffusion", method="x", params={"gen_length": 2}, prompt_ids=[1], denoise=[step]).to_dict()
    with pytest.raises(TraceError, match=r"denoise\[0\]\.info\.forced is 'all', not a list"):
        Trace.from_dict(dl)


def test_undeclared_keys_load_but_strict_mode_refuses_them(monkeypatch):
    d = rounds_trace([{"made_up": 1}]).to_dict()
    monkeypatch.setenv(records.STRICT_ENV, "0")
    t = Trace.from_dict(d)                                 # an old or foreign trace still opens
    assert records.undeclared(t) == {"made_up"}
    monkeypatch.setenv(records.STRICT_ENV, "1")
    with pytest.raises(TraceError, match=r"info\['made_up'\] is declared by no record type"):
        Trace.from_dict(d)


def test_records_read_typed_and_write_only_what_was_recorded():
    r = Round(info={"skip": "..m", "gate": "spec"})
    assert SkipMask.of(r) == SkipMask(skip="..m") and SkipMask(skip="..m").info() == {"skip": "..m"}
    assert records.DraftVersion.of(r) is None
    t = rounds_trace([{"skip": "x."}, {}])
    assert records.holds(t, SkipMask) and not records.holds(t, records.DraftVersion)
    assert records.column(t, SkipMask, "skip") == ["x.", None]
    assert records.owner("round", "skip") is SkipMask and records.owner("step", "skip") is None


def test_a_key_has_one_owner_and_a_record_one_name():
    with pytest.raises(ValueError, match="'skip' belongs to SkipMask"):
        @record("round")
        class Clash(Record):
            skip: str | None = None
    with pytest.raises(ValueError, match="must default to None"):
        @record("step")
        class Required(Record):
            n: int = 0
    with pytest.raises(ValueError, match="level must be one of"):
        @record("page")
        class Nowhere(Record):
            x: int | None = None
    assert "clash" not in records.RECORDS["round"] and records.owner("round", "skip") is SkipMask


def test_the_docs_list_every_record_with_its_keys():
    doc = (ROOT / "docs/trace-format.md").read_text(encoding="utf-8")
    for level in records.LEVELS:
        for name, cls in records.RECORDS[level].items():
            line = next((ln for ln in doc.splitlines() if ln.startswith(f"| {level} | {name} |")), None)
            assert line is not None, f"docs/trace-format.md lacks the {level} record {name!r}"
            assert all(f"`{k}`" in line for k in cls.keys()), line


def test_a_records_figure_follows_the_record_not_the_method(tmp_path):
    """A record declared here and its figure: every trace holding it shows the figure in the Jupyter
    player, the dashboard and the export, whatever method wrote it; a trace without it does not."""
    from dataclasses import dataclass   # noqa: F401 (the record decorator makes the dataclass)

    class Beam(Record):
        """Test record: the beam's width this round."""
        toy_beam_width: int | None = None
    Beam.level, Beam.name = "round", "test beam"
    Beam = __import__("dataclasses").dataclass(frozen=True)(Beam)

    def beam_figure(trace, step):
        xs = records.column(trace, Beam, "toy_beam_width")
        return go.Figure(go.Bar(y=xs, name="beam"), layout=dict(title=f"beam width, {trace.method}", height=200))

    spec = FigureSpec("beam width", beam_figure, record=Beam, height=220)
    with registered_record(Beam), added_record_figure(spec):
        for method in ("one-method", "another"):
            t = rounds_trace([{"toy_beam_width": 2}, {"toy_beam_width": 3}], method)
            assert "beam width" in view_of(t).names
        assert "beam width" not in view_of(rounds_trace([{}, {}])).names
        t = Trace.from_dict(json.loads(json.dumps(t.to_dict())))   # declared: it loads and type-checks
        assert shown_everywhere(t, tmp_path) == view_of(t).names
        bad = t.to_dict()
        bad["rounds"][0]["info"]["toy_beam_width"] = "wide"
        with pytest.raises(TraceError, match="toy_beam_width"):
            Trace.from_dict(bad)
    assert records.owner("round", "toy_beam_width") is None and "beam width" not in view_of(t).names


def shown_everywhere(trace: Trace, tmp_path) -> list[str]:
    """The spec names the Jupyter player, the dashboard viewer and the export each show; asserted
    equal, and returned."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("panel")
    from speclab.apps.viewer import Viewer
    from speclab.export import to_html
    from speclab.widgets import show
    player = show(trace)
    viewer = Viewer()
    viewer.show(trace)
    view = view_of(trace)
    in_viewer = [view.main.name] + [spec.name for _, spec in viewer.shown]
    page = to_html(trace, tmp_path / "t.html").read_text(encoding="utf-8")
    in_export = [html_unescape(n) for n in re.findall(r'data-figure="([^"]+)"', page)]
    drawn = lambda names: [n for n in names if n in player.shown]    # a maker with nothing to draw: none
    assert player.shown == drawn(in_viewer) == drawn(in_export), (player.shown, in_viewer, in_export)
    return in_viewer


def html_unescape(s: str) -> str:
    import html
    return html.unescape(s)


@pytest.mark.parametrize("example", ["swift--", "dllm-lowconf--", "dag-all--", "osd--", "pearl--", "superposed--"])
def test_the_player_the_dashboard_and_the_export_show_the_same_set(example, tmp_path):
    trace = Trace.load(next(f for f in EXAMPLES if Path(f).name.startswith(example)))
    if example == "osd--":
        trace = replace(trace, record="full")     # p and q, where its nodes recorded them
    names = shown_everywhere(trace, tmp_path)
    assert names == view_of(trace).names and "step detail" in names
