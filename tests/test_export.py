"""The static export: one self-contained HTML file with frames and a slider, no model needed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BAD_TRACES

import speclab
from speclab.figures.views import view_of
from speclab.export import animated, main, to_html
from speclab.trace import Trace, TraceError


@pytest.fixture(scope="module")
def trace(target, draft):
    return speclab.generate(target, "import os\n", method="draft-model", draft=draft, k=3,
                            max_new_tokens=12, record="light").trace


def frames_in(page: str) -> list[dict]:
    """The frames plotly's HTML passes to Plotly.addFrames, parsed back."""
    i = page.index("Plotly.addFrames(")
    start = page.index("[", i)
    return json.JSONDecoder().raw_decode(page[start:])[0]


def test_html_is_self_contained_with_frames_and_slider(trace, tmp_path):
    out = to_html(trace, tmp_path / "run.html")
    page = out.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    assert "plotly.js v" in page and len(page) > 3_000_000          # plotly.js inline, not fetched
    frames = frames_in(page)
    assert [f["name"] for f in frames] == [str(k) for k in range(len(trace.rounds))]
    assert 0 not in frames[0]["traces"]              # the big token-strip trace is not repeated per frame
    assert '"sliders"' in page and len(animated(trace)["layout"]["sliders"][0]["steps"]) == len(trace.rounds)
    # the view spec's figures (figures.views), each once: the step view, then the run strip (tokens per
    # round), the acceptance summary, timing and the cost model
    names = re.findall(r'data-figure="([^"]+)"', page)
    assert names[0] == "round" and names[-5:] == ["tokens per round", "acceptance", "timing", "cost model",
                                                  "cost model explorer"]
    assert names == view_of(trace).names                 # every spec of the view, in its order
    # one plot a figure, but the step detail (HTML, a table a round) and the mask (a plot a round)
    assert names[1:3] == ["step detail", "attention mask"] and page.count("<details>") == 1
    assert page.count("Plotly.newPlot(") == len(names) - 2 + len(trace.rounds)
    assert page.count('class="speclab-per-step speclab-detail-step"') == len(trace.rounds)


def test_cli_exports_a_saved_trace_in_a_fresh_process_without_loading_a_model(trace, tmp_path):
    src = trace.save(tmp_path / "run.json")
    code = ("import sys; from speclab.export import main; from speclab.models.zoo import _load_shared\n"
            f"main([{str(src)!r}, '--html', {str(tmp_path / 'out.html')!r}])\n"
            "assert _load_shared.cache_info().currsize == 0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and (tmp_path / "out.html").stat().st_size > 3_000_000
    main([str(src)])                                  # default output: run.html beside the trace
    assert (tmp_path / "run.html").exists()


@pytest.mark.parametrize("content, match", [(None, "not found"), *BAD_TRACES])
def test_bad_traces_give_one_line_errors(tmp_path, content, match):
    src = tmp_path / "run.json"
    if content is not None:
        src.write_text(content)
    with pytest.raises(TraceError, match=match) as e:
        main([str(src), "--html", str(tmp_path / "out.html")])
    assert "\n" not in str(e.value)
    with pytest.raises(TraceError, match="folder"):
        main([str(tmp_path)])


def test_deeply_nested_json_is_refused_before_parsing(tmp_path, capsys):
    """2,000 levels would exhaust the JSON parser's recursion: the depth is checked first."""
    from speclab.cli import main as cli
    from speclab.trace import MAX_JSON_DEPTH, json_depth
    src = tmp_path / "deep.json"
    src.write_text("[" * 2000 + "]" * 2000)
    with pytest.raises(TraceError, match="nests 2000 levels deep"):
        Trace.load(src)
    assert cli(["export", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speclab: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert json_depth('{"a": "[[[[{{", "b": [[1], {"c": [2]}]}') == 4     # brackets in strings do not count
    assert json_depth('"\\"[[["') == 0
    deep_dict = '{"schema": "speclab.trace/1", "params": ' + '{"a": ' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 2)
    with pytest.raises(TraceError, match="levels deep"):
        Trace.from_json(deep_dict)


def test_oversized_trace_is_refused_before_reading(tmp_path):
    src = tmp_path / "big.json"
    src.write_text('{"schema": "speclab.trace/1"}' + " " * 2000)
    with pytest.raises(TraceError, match="more than a trace"):
        Trace.load(src, limit=1000)


def test_unwritable_output_is_a_value_error(trace, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        to_html(trace, tmp_path / "nowhere" / "out.html")


def test_dag_export_has_a_frame_per_strategy(tmp_path):
    from speclab.decoding.dag import run_dag
    from speclab.models.dag import load_dag
    model = load_dag(Path(speclab.__file__).parent / "zoo" / "numwords-dat")
    dag = run_dag(model, "1205", strategy="all", record="light")
    page = to_html(dag, tmp_path / "dag.html").read_text(encoding="utf-8")
    frames = frames_in(page)
    assert len(frames) == len(dag.dag.paths) and page.count("Plotly.newPlot(") == 1


def test_export_help_lists_its_options(capsys):
    from speclab.cli import main
    with pytest.raises(SystemExit) as done:
        main(["export", "-h"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage: speclab export" in out and "--html" in out


@pytest.mark.parametrize("rule,params,temperature", [("typical", {}, 0.7), ("lantern", dict(delta=0.3), 0.0),
                                                     ("judge", dict(judge="code-judge", threshold=0.05), 0.0)])
def test_a_lossy_rules_export_shows_its_rescued_tokens_and_both_verdicts(rule, params, temperature, tmp_path):
    """Issue 55: each lossy rule's trace, exported, carries per drafted node both verdicts and the
    ring of a token the rule rescued (accepted where `exact` rejected it)."""
    r = speclab.generate("code-target", "def parse(line):", "draft-model", draft="code-draft", k=4, rule=rule,
                         rule_params=params, temperature=temperature, max_new_tokens=24, record="light")
    saved = [n for rnd in r.trace.rounds for n in rnd.nodes
             if n.verdicts.get(rule) == "accepted" and n.verdicts.get("exact") == "rejected"]
    assert saved, f"{rule} rescued nothing here: pick a looser setting"
    page = to_html(r.trace, tmp_path / f"{rule}.html").read_text(encoding="utf-8")
    hovers = [t for f in frames_in(page) for d in f["data"] for t in (d.get("hovertext") or [])
              if isinstance(t, str)]
    both = [t for t in hovers if f"{rule}: accepted" in t and "exact: rejected" in t]
    assert both and any("rescued" in t for t in both)
    assert any(d.get("name", "").startswith("rescued") for f in frames_in(page) for d in f["data"])
