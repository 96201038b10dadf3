"""Fuzzed user input: what a user hands speclab is either used or refused with one clear line.

Three kinds of input come from users and are fuzzed here with hypothesis:

  trace files      the dashboard's upload, `speclab export FILE`, Trace.load in a notebook: real
                   traces of the zoo (a draft tree, a rule's verdicts, lanes, a diffusion run with
                   edits, a DAG), mutated as JSON (a value swapped for a hostile one, a field dropped
                   or added, ids and positions pushed out of range, a tree given cycles) and as text
                   (truncated, bytes flipped, the schema renamed). Loading, replay, the player's
                   figures at every step and the HTML export must work or raise ONE TraceError whose
                   message is one line, within a time limit, and a refused export leaves no file.
  method strings   `draft-model[k=6;rule.eps=0.1]` (the bench), NAME=VALUE (`speclab run --param`,
                   the dashboard's box): parsed, or a ValueError of one line; a parsed value of the
                   wrong type for its method's parameter ("abc" for k) runs, or one ValueError.
  prompt files     speclab.prompts.load_prompts and `speclab run --prompt-file`: read, or a
                   ValueError of one line.

Examples are derandomized (the same ones every run, so CI never flakes and a failure reproduces);
SPECLAB_FUZZ_EXAMPLES=2000 runs more of them, seeded afresh, to hunt for new failures.
"""
from __future__ import annotations

import copy
import json
import math
import os
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import speclab
from speclab.export import to_html
from speclab.figures import n_steps, step_title, view_of
from speclab.figures.views import lesson_of
from speclab.trace import MAX_TRACE_BYTES, Trace, TraceError, replay

HUNT = int(os.environ.get("SPECLAB_FUZZ_EXAMPLES", "0"))
# a budget per test that keeps the file within about 40 s on 2 cores (the export dominates)
FUZZ = settings(max_examples=HUNT or 25, deadline=None, derandomize=not HUNT, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHEAP = settings(FUZZ, max_examples=HUNT or 300)
HANG_S = 20                 # far more than the slowest legitimate load and render of these small traces


@contextmanager
def time_limit(seconds: float):
    """A hang fails the test (SIGALRM) instead of stalling the run."""
    def stop(*_):
        raise TimeoutError(f"still running after {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line(e: BaseException) -> None:
    msg = str(e)
    assert msg.strip() and "\n" not in msg, f"not a one-line message: {msg!r}"


# -- the traces: real runs on the zoo ---------------------------------------------------------------
def record_traces() -> dict[str, dict]:
    """One trace per shape a view draws, as the JSON a file holds: a sampled tree with verdicts and
    decisions (spectr), a chain recorded "full" (draft-model: the p / q panels), lanes and an
    "accepted" emitted kind (pearl), a method's own figure (specdec++), the committed tokens only
    (ar, record=None), a diffusion run with edits and decisions, one with its committed tokens
    listed (freedave), and a DAG."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec = lambda method, **kw: speclab.generate("code-target", "def parse(", method=method, max_new_tokens=8,
                                                     **kw).trace
        dllm = lambda method: speclab.run("digits-dllm", "SUM 27=", method, gen_length=8, record="full").trace
        traces = dict(
            spectr=spec("spectr", draft="code-draft", record="full", temperature=1.0),
            chain=spec("draft-model", draft="code-draft", k=3, record="full"),
            pearl=spec("pearl", draft="code-draft", record="light"),
            specdecpp=spec("specdec++", draft="code-draft", record="light"),
            ar=spec("ar", record=None),
            edits=dllm("dllm-llada21-edit"),
            freedave=dllm("dllm-freedave"),
            dag=speclab.run("dates-dat", "2024-03-05", "dag-all").trace,
        )
    finally:
        torch.set_num_threads(threads)
    return {name: json.loads(json.dumps(t.to_dict())) for name, t in traces.items()}


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict]:
    return record_traces()


def render(trace: Trace, out: Path) -> None:
    """What a user renders: every spec of the view at every step (the step figures, the detail
    table, p and q, the attention mask; the run strip and summary moved to the step), the lesson,
    then the HTML export."""
    view = view_of(trace)
    whole = {f.name: (f, f.draw(trace, 0)) for f in view.whole_run}
    for k in range(n_steps(trace)):
        step_title(trace, k)
        for spec in view.step:
            spec.draw(trace, k) if spec.kind == "html" else spec.at(trace, k, static=False)
        for spec, fig in whole.values():
            if fig is not None:
                spec.follow(fig, trace, k)
    lesson_of(trace)
    to_html(trace, out)


def opens_or_refuses(data: str | bytes) -> Trace | None:
    """Load, replay and render `data`: all of it works, or one TraceError of one line stops it and
    the export leaves nothing behind."""
    with tempfile.TemporaryDirectory() as tmp, time_limit(HANG_S):
        out = Path(tmp) / "run.html"
        try:
            trace = Trace.from_json(data)
            replay(trace)
            render(trace, out)
        except TraceError as e:
            one_line(e)
            assert list(Path(tmp).iterdir()) == [], "a refused export left a file behind"
            return None
        assert [p.name for p in Path(tmp).iterdir()] == ["run.html"]
        return trace


def test_every_recorded_trace_opens_replays_and_renders(recorded):
    for name, d in recorded.items():
        trace = opens_or_refuses(json.dumps(d))
        assert trace is not None, f"the {name} trace was refused"
        assert replay(trace) == trace.output_ids, name


# -- mutations of the JSON ------------------------------------------------------------------------
HOSTILE = [None, True, False, 0, 1, -1, -2, 0.5, 1.5, -0.5, 2**31, 2**63, 10**30, -10**30,
           math.nan, math.inf, -math.inf, 1e308, "", "x", "accepted", "dag", "\ud800", "<script>", "\n",
           [], [0], [-1], [1, 2, 3], [[1, 0.5]], [[1, math.nan]], [["a", 1]], [[-5, 2.0]], [None], [[]],
           {}, {"a": 1}, {"0": "x"}, {"-1": 3}]
# method names whose own figures read their own records (figures.views: add_figure)
METHOD_NAMES = ["pearl", "specdec++", "dllm-draft", "osd", "flexdraft", "swift", "layer-skip", "draft-model",
                "no-such-method"]


# an unknown field, or a key of a round's or step's info that some view reads (a skip mask, PEARL's
# mode, OSD's draft version, FreeDave's tree, per-position entropy, a record=None tree's depth)
EXTRA_KEYS = ["extra", "id", "parent", "schema", "skip", "mode", "draft_version", "tree", "accepted_node",
              "entropy", "depth", "accepted", "stop", "forced", "finish", "gap", "steps", "k"]


def hostile(more=()) -> st.SearchStrategy:
    """A hostile value, a fresh copy each time: a later mutation may change it in place."""
    return st.sampled_from(HOSTILE + list(more)).map(copy.deepcopy)


def locations(doc) -> list[tuple]:
    """Every path into the document (dict keys and list indices), the root included."""
    out, todo = [], [()]
    while todo:
        path = todo.pop()
        out.append(path)
        node = at(doc, path)
        keys = node.keys() if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else ()
        todo += [path + (k,) for k in keys]
    return out


def at(doc, path: tuple):
    for k in path:
        doc = doc[k]
    return doc


def shape(path: tuple) -> tuple:
    """A path with its list indices as "*": all draft nodes' `parent` are one field to fuzz."""
    return tuple("*" if isinstance(k, int) else k for k in path)


def fields_of(doc) -> dict[tuple, list[tuple]]:
    """Field shape -> its paths, so each field is picked as often, however long its lists."""
    out: dict[tuple, list[tuple]] = {}
    for p in locations(doc):
        out.setdefault(shape(p), []).append(p)
    return out


@st.composite
def mutated(draw, recorded, names=None):
    """A recorded trace (as a dict) with one to four mutations of its JSON."""
    name = draw(st.sampled_from(sorted(names or recorded)))
    doc = copy.deepcopy(recorded[name])
    for _ in range(draw(st.integers(1, 4))):
        groups = fields_of(doc)
        path = draw(st.sampled_from(groups[draw(st.sampled_from(sorted(groups, key=repr)))]))
        kind = draw(st.sampled_from(["hostile", "hostile", "drop", "extra", "nudge", "wrap", "copy", "grow"]))
        parent, key = (at(doc, path[:-1]), path[-1]) if path else (None, None)
        value = at(doc, path)
        if kind == "hostile" and path:
            parent[key] = draw(hostile(METHOD_NAMES))
        elif kind == "drop" and path:
            del parent[key]
        elif kind == "extra" and isinstance(value, dict):
            value[draw(st.sampled_from(EXTRA_KEYS))] = draw(hostile())
        elif kind == "nudge" and path and isinstance(value, (int, float)) and not isinstance(value, bool):
            # off by one, negated, scaled: ids and positions just out of range, sizes huge
            parent[key] = draw(st.sampled_from([value + 1, value - 1, -value - 1, value * 10**9, value + 0.5]))
        elif kind == "wrap" and path:
            parent[key] = draw(st.sampled_from([[value], {"v": value}, str(value)]))
        elif kind == "copy" and path:
            parent[key] = copy.deepcopy(at(doc, draw(st.sampled_from(locations(doc)))))
        elif kind == "grow" and isinstance(value, list) and value:
            value.extend(copy.deepcopy(value[:1]) * draw(st.sampled_from([1, 3])))
    return doc


@given(data=st.data())
@CHEAP
def test_a_mutated_trace_loads_or_is_refused_in_one_line(recorded, data):
    """Loading and replay alone, many more examples than the render takes."""
    with time_limit(HANG_S):
        try:
            replay(Trace.from_json(json.dumps(data.draw(mutated(recorded)))))
        except TraceError as e:
            one_line(e)


FREE_FORM = ("params", "info", "inputs", "output", "threshold", "note", "policy", "at", "source", "rule", "reason",
             "what", "name", "token_text", "models", "valid", "method", "guarantee", "verdicts")


@st.composite
def free_form(draw, recorded):
    """A recorded trace with hostile values where the schema leaves the content to the method (a
    round's info, a decision's inputs and output, params, names) and the method renamed, so that
    another method's own figure reads what this one recorded."""
    doc = copy.deepcopy(recorded[draw(st.sampled_from(sorted(recorded)))])
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in locations(doc) if p and any(k in FREE_FORM for k in p if isinstance(k, str))]
        path = draw(st.sampled_from(sorted(paths, key=repr)))
        parent, key = at(doc, path[:-1]), path[-1]
        if draw(st.booleans()) and isinstance(parent, dict) and len(path) > 1:
            del parent[key]
        else:
            parent[key] = draw(hostile(METHOD_NAMES))
    if draw(st.booleans()):
        doc["method"] = draw(st.sampled_from(METHOD_NAMES))
    return doc


@st.composite
def bad_tree(draw, recorded):
    """A speculative trace whose draft tree lies: a node its own parent, two nodes each other's, a
    parent later in the list, a parent that is no node, ids repeated, the accepted path through a
    node that is not there."""
    doc = copy.deepcopy(recorded[draw(st.sampled_from(["spectr", "chain", "pearl"]))])
    rounds = [r for r in doc["rounds"] if len(r["nodes"]) >= 2]
    r = draw(st.sampled_from(rounds))
    nodes = r["nodes"]
    i, j = draw(st.integers(0, len(nodes) - 1)), draw(st.integers(0, len(nodes) - 1))
    how = draw(st.sampled_from(["self", "cycle", "later", "missing", "same-id", "accepted", "depth"]))
    if how == "self":
        nodes[i]["parent"] = nodes[i]["id"]
    elif how == "cycle":
        nodes[i]["parent"], nodes[j]["parent"] = nodes[j]["id"], nodes[i]["id"]
    elif how == "later":
        nodes[0]["parent"] = nodes[-1]["id"]
    elif how == "missing":
        nodes[i]["parent"] = draw(st.sampled_from([len(nodes) + 7, -2, -10**12, 10**12]))
    elif how == "same-id":
        nodes[i]["id"] = nodes[j]["id"]
    elif how == "accepted":
        r["accepted"] = r["accepted"] + [draw(st.sampled_from([len(nodes) + 3, -1, nodes[i]["id"]]))]
    else:
        nodes[i]["depth"] = draw(st.sampled_from([0, -1, 10**9]))
    return doc


def test_a_draft_chain_deeper_than_the_recursion_limit_is_drawn(recorded):
    doc = copy.deepcopy(recorded["chain"])
    r = doc["rounds"][1]
    node = dict(r["nodes"][0], decision="not_reached", p_topk=None, q_topk=None)
    r["nodes"] = [dict(node, id=i, parent=i - 1, depth=i + 1) for i in range(1500)]
    r["accepted"], r["drafted"] = [], 1500
    assert opens_or_refuses(json.dumps(doc)) is not None


@st.composite
def bad_canvas(draw, recorded):
    """A diffusion or DAG trace whose positions and vertices point outside the canvas or graph, or
    whose sizes are huge."""
    doc = copy.deepcopy(recorded[draw(st.sampled_from(["edits", "freedave", "dag"]))])
    far = st.sampled_from([-1, -3, 8, 9, 47, 48, 10**6, 10**12, 2**63])
    if doc["engine"] == "dag":
        g = doc["dag"]
        where = draw(st.sampled_from(["num_vertices", "path", "link", "chosen", "outputs"]))
        if where == "num_vertices":
            g["num_vertices"] = draw(st.sampled_from([0, -1, 3, 10**12]))
        elif where == "path":
            g["paths"][draw(st.sampled_from(sorted(g["paths"])))].append(draw(far))
        elif where == "link":
            g["links_topk"][0][0][0] = draw(far)
        elif where == "chosen":
            g["chosen"] = draw(st.sampled_from(["", "nope", None, 3]))
        else:
            g["outputs"] = {}
    else:
        params, steps = doc["params"], doc["denoise"]
        s = draw(st.sampled_from(steps))
        where = draw(st.sampled_from(["gen_length", "committed", "masked", "block", "edit", "tokens", "eos",
                                      "conf", "block_length", "unrecorded"]))
        if where == "gen_length":
            params["gen_length"] = draw(st.sampled_from([0, -1, 3, 10**6, 10**12, 2.5, "8", None]))
        elif where == "block_length":
            params["block_length"] = draw(st.sampled_from([0, -1, 10**12, 2.5, "8"]))
            params["block_causal"] = draw(st.booleans())
        elif where in ("committed", "masked"):
            s[where] = s[where] + [draw(far)]
        elif where == "block":
            s["block"] = draw(st.sampled_from([[0, 10**12], [5, 2], [-3, 4], [0], [0, 1, 2], [0.5, 4]]))
        elif where == "edit":
            s["edits"] = s["edits"] + [dict(pos=draw(far), before=-1, after=draw(far), reason="")]
        elif where == "tokens":
            s["tokens"] = [draw(far)] * draw(st.sampled_from([1, 8, 1000]))
        elif where == "eos":
            params["eos_id"] = draw(st.sampled_from([-1, None, "12", [12], 12.0]))
        elif where == "unrecorded":         # per-position lists left out (each may be: "not recorded")
            for t in steps:
                for name in draw(st.sampled_from([["tokens"], ["top1", "conf", "margin"], ["conf"], ["info"]])):
                    t[name] = {} if name == "info" else []
        else:
            s["conf"] = [draw(st.sampled_from([math.nan, math.inf, -1.0, 2.0]))] * len(s["conf"])
    return doc


HOSTILE_DOCS = {   # what a strategy of hostile trace documents makes -> the strategy
    "mutated-json": mutated,
    "free-form-records": free_form,
    "draft-tree-with-cycles-or-dangling-parents": bad_tree,
    "positions-outside-the-canvas-or-graph": bad_canvas,
}


@pytest.mark.parametrize("hostile_doc", HOSTILE_DOCS.values(), ids=HOSTILE_DOCS.keys())
@given(data=st.data())
@FUZZ
def test_a_hostile_trace_is_drawn_or_refused_in_one_line(recorded, hostile_doc, data):
    opens_or_refuses(json.dumps(data.draw(hostile_doc(recorded))))


@given(data=st.data())
@CHEAP
def test_truncated_or_corrupted_text_is_refused_in_one_line(recorded, data):
    text = json.dumps(recorded[data.draw(st.sampled_from(sorted(recorded)))]).encode()
    how = data.draw(st.sampled_from(["cut", "flip", "insert", "bytes"]))
    i = data.draw(st.integers(0, len(text) - 1))
    if how == "cut":
        text = text[:i]
    elif how == "flip":
        text = text[:i] + bytes([text[i] ^ data.draw(st.integers(1, 255))]) + text[i + 1:]
    elif how == "insert":
        text = text[:i] + data.draw(st.binary(min_size=1, max_size=8)) + text[i:]
    else:
        text = data.draw(st.binary(max_size=200))
    from speclab.apps.runs import trace_from_upload
    for read in (Trace.from_json, trace_from_upload):         # a notebook's or export's load, the dashboard's
        with time_limit(HANG_S):
            try:
                replay(read(text))
            except TraceError as e:
                one_line(e)


@pytest.mark.parametrize("schema", ["speclab.trace/0", "speclab.trace/3", "speclab.trace/-1", "speclab.trace/1.5",
                                    "speclab.trace/²", "speclab.trace/", "speclab.trace", "other/2", "", 2, None,
                                    ["speclab.trace/2"], {"name": "speclab.trace"}])
def test_a_wrong_schema_is_refused_in_one_line(recorded, schema):
    doc = dict(recorded["chain"], schema=schema)
    with pytest.raises(TraceError) as e:
        Trace.from_json(json.dumps(doc))
    one_line(e.value)


def test_a_file_over_the_size_limit_is_refused_before_parsing():
    with pytest.raises(TraceError, match="MB") as e:
        Trace.from_json(b" " * 1025, limit=1024)
    one_line(e.value)
    assert MAX_TRACE_BYTES >= 2**20


def test_the_trace_format_page_states_the_limits_the_loader_enforces():
    from speclab.trace import MAX_CANVAS, MAX_TOKEN_ID
    page = (Path(__file__).resolve().parents[1] / "docs" / "trace-format.md").read_text(encoding="utf-8")
    assert f"at most {MAX_CANVAS}" in page and MAX_TOKEN_ID == 2**31 - 1 and "2^31 - 1" in page


def test_export_of_a_refused_trace_writes_no_file(recorded, tmp_path):
    from speclab.export import main
    src, out = tmp_path / "run.json", tmp_path / "run.html"
    src.write_text(json.dumps(dict(recorded["spectr"], rounds=[{"nodes": [{"id": 0, "parent": 0}]}])))
    with pytest.raises(TraceError):
        main([str(src), "--html", str(out)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


# -- method strings ---------------------------------------------------------------------------------
SPEC_PIECES = ["draft-model", "ar", "eagle", "", " ", "[", "]", "[[", "]]", ",", ";", "=", "==", "k", "k=6",
               "rule.eps=0.1", "rule.=1", ".=1", "k=[1,2", "k=[[0],[0,0]]", "k=nan", "k=inf", "k=1e999",
               "k=-0", "x=none", "x=\n", "\ud800", "é", "k=[1]]", "-=1", "=1", "k==", "tree=[[0], [0, 0]]"]


@given(st.lists(st.sampled_from(SPEC_PIECES), max_size=10).map("".join) | st.text(max_size=40))
@settings(CHEAP, max_examples=HUNT or 400)
def test_a_method_string_parses_or_is_refused_in_one_line(s):
    from speclab.bench.runner import parse_methods
    try:
        specs = parse_methods(s)
    except ValueError as e:
        one_line(e)
        return
    for spec in specs:
        assert spec.method and spec.method == spec.method.strip(), f"a spec with no method name: {spec}"
        assert all(name and "[" not in name and "]" not in name for name in spec.params), spec
        json.dumps(spec.params, allow_nan=False)     # recorded in a trace: finite numbers only


@given(st.lists(st.sampled_from(SPEC_PIECES), min_size=1, max_size=6).map("".join) | st.text(max_size=30))
@settings(CHEAP, max_examples=HUNT or 400)
def test_a_name_value_parameter_parses_or_is_refused_in_one_line(item):
    """`--param`, `--rule-param` and the dashboard's box: one parser (speclab.params)."""
    from speclab.cli import assignments
    from speclab.params import parse_assignment
    for parse in (lambda: dict([parse_assignment(item)]), lambda: assignments([item], "--param")):
        try:
            params = parse()
        except ValueError as e:
            one_line(e)
            continue
        assert all(name and name == name.strip() for name in params), params
        json.dumps(params, allow_nan=False)


@given(st.text(max_size=40))
@settings(CHEAP, max_examples=HUNT or 200)
def test_the_dashboard_parameter_box_parses_or_is_refused_in_one_line(extra):
    from speclab.apps.runs import method_kwargs
    try:
        kw = method_kwargs("draft-model", {"k": 4}, extra)
    except ValueError as e:
        one_line(e)
        return
    assert all(name and name == name.strip() for name in kw), kw
    json.dumps(kw, allow_nan=False)


# values `--param NAME=VALUE` parses to (text, a JSON list, none, a boolean) that no parameter of
# that name takes, or takes only some of: each method checks its own ranges, not fuzzed here
WRONG_TYPE = ["abc", "", [1], [[0], [0, 0]], [], None, True, False, 1.5]


@pytest.fixture(scope="module")
def models():
    from speclab.models.zoo import load_shared
    return {name: load_shared(name, "cpu") for name in ("code-target", "code-draft", "digits-dllm", "dates-dat")}


@st.composite
def method_with_a_wrong_value(draw):
    from speclab.decoding.registry import METHODS, method_params
    names = sorted(m for m, row in METHODS.items() if row.draft_kind in (None, "draft") and method_params(m))
    method = draw(st.sampled_from(names))
    return method, draw(st.sampled_from(method_params(method))), draw(st.sampled_from(WRONG_TYPE))


@given(case=method_with_a_wrong_value())
@settings(CHEAP, max_examples=HUNT or 80)
def test_a_method_parameter_of_the_wrong_type_runs_or_is_refused_in_one_line(models, case):
    """What `speclab run --param` and the bench's name[...] hand the API: the run works (the value
    fits, e.g. none for an optional threshold) or one ValueError says which parameter is wrong."""
    from speclab.decoding.registry import get_method
    method, name, value = case
    row = get_method(method)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with time_limit(HANG_S):
            if row.engine == "speculative":
                draft = {"draft": models["code-draft"]} if row.draft_kind == "draft" else {}
                speclab.generate(models["code-target"], "def f(", method, max_new_tokens=3, **draft, **{name: value})
            elif row.engine == "diffusion":
                speclab.run(models["digits-dllm"], "SUM 2=", method, **{"gen_length": 4, name: value})
            else:
                speclab.run(models["dates-dat"], "2024-03-05", method, **{name: value})
    except ValueError as e:
        one_line(e)
    finally:
        torch.set_num_threads(threads)


# -- prompt files -----------------------------------------------------------------------------------
PROMPT_LINES = ['{"prompt": "def f("}', '{"chat": "hi"}', '{"prompt": 3}', '{"chat": null}', '{"prompt": ["a"]}',
                '{"other": 1}', "[1, 2]", '"just a string"', "3", "null", "{", "}", "", "   ", "plain text",
                '{"prompt": "a\\ud800"}', "a" * 5000, '{"prompt": "x", "chat": "y"}', "\x00",
                "\ufeff{\"prompt\": \"a\"}"]


@given(st.text(max_size=300))
@settings(CHEAP, max_examples=HUNT or 100)
def test_a_prompt_set_name_loads_or_is_refused_in_one_line(name):
    from speclab.prompts import load_prompts
    try:
        load_prompts(name)
    except ValueError as e:
        one_line(e)


@given(st.lists(st.sampled_from(PROMPT_LINES), max_size=6).map("\n".join).map(str.encode)
       | st.binary(max_size=120))
@settings(CHEAP, max_examples=HUNT or 300)
def test_a_prompt_file_loads_or_is_refused_in_one_line(data):
    from speclab.cli import read_prompt_lines
    from speclab.prompts import load_prompts
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.jsonl"
        path.write_bytes(data)
        for read in (lambda: load_prompts(str(path)), lambda: read_prompt_lines(str(path))[0]):
            try:
                prompts = read()
            except ValueError as e:
                one_line(e)
                continue
            for p in prompts:
                assert isinstance(p, str) or (isinstance(p, dict) and isinstance(p.get("chat"), str)), p
                (p if isinstance(p, str) else p["chat"]).encode("utf-8")   # a tokenizer takes it
