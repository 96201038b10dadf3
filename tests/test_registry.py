"""A drafting method is one Drafter class plus one registry row: a method defined here, in the test,
reaches `speclab methods`, `speclab run`, `speclab bench`, a batch and the dashboard's form with no
other file edited, its parameters and defaults read from its constructor. Toy zoo, a few tokens."""
from __future__ import annotations

import json

import pytest

import speclab
from speclab.cli import main
from speclab.decoding import registry
from speclab.decoding.registry import Method, get_method, method_defaults, registered
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):"


class EchoDrafter(Drafter):
    """Drafts again the `k` tokens that followed the last earlier occurrence of the last token
    (point masses): right where the text repeats itself, harmless elsewhere."""
    name = "toy-echo"

    def __init__(self, k: int = 3, skip: int = 0):
        super().__init__()
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        self.k, self.skip = k, skip

    def propose(self, ctx: Context) -> DraftTree:
        ids = ctx.ids
        for i in range(len(ids) - 2, -1, -1):
            if ids[i] == ids[-1]:
                return DraftTree.chain(ids[i + 1 + self.skip:i + 1 + self.skip + self.k], None, "toy-echo")
        return DraftTree()


TOY = Method(name="toy-echo", family="model-free", engine="speculative", guarantee="identical-to-ar",
             summary="a test's toy: repeat what followed the last token", drafter=EchoDrafter, batchable=True)


@pytest.fixture
def toy():
    with registered(TOY) as m:
        yield m
    assert "toy-echo" not in registry.METHODS


def test_parameters_and_defaults_come_from_the_drafters_constructor(toy):
    assert method_defaults("toy-echo") == {"k": 3, "skip": 0}
    # through **kw into the base class: the draft-model row restates none of ChainDrafter's knobs
    d = method_defaults("draft-model")
    assert d["k"] == 4 and d["max_k"] == 8 and d["schedule"] == "fixed" and d["gate"] == "auto"
    assert "draft_model" not in d and "backend" not in d          # filled by the run, not knobs
    assert method_defaults("suffix")["k"] is None                 # an alias of max_k


def test_a_registered_method_is_listed_by_speclab_methods(toy, capsys):
    assert main(["methods"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("toy-echo"))
    assert "model-free" in line and "repeat what followed" in line
    assert main(["methods", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "toy-echo")
    assert row["params"] == ["k", "skip"] and row["batchable"] and not row["needs_draft"]


def test_a_registered_method_runs_from_the_cli_losslessly(toy, capsys):
    assert main(["run", "--target", "code-target", "--method", "toy-echo", "--k", "2", "--prompt", PROMPT,
                 "--max-new-tokens", "10", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "toy-echo" and out["identical"] and out["new_tokens"] == 10


def test_a_registered_method_runs_in_the_bench(toy, capsys, tmp_path):
    f = tmp_path / "b.json"
    assert main(["bench", "--target", "code-target", "--methods", "ar,toy-echo[k=2]", "--prompts", "code-edit",
                 "--limit", "1", "--max-new-tokens", "8", "--json", str(f)]) == 0
    rows = {r["method"]: r for r in json.loads(f.read_text())["rows"]}
    assert rows["toy-echo[k=2]"]["identical_rate"] == 1.0 and rows["toy-echo[k=2]"]["new_tokens"] == 8


def test_a_registered_method_runs_in_a_batch(toy, target):
    prompts = [PROMPT, "class A:\n    def f(self):\n        return 1\n\nclass B:"]
    alone = [speclab.generate(target, p, "ar", max_new_tokens=8, record=None).ids for p in prompts]
    rs = speclab.generate(target, prompts, "toy-echo", max_new_tokens=8, k=2)
    assert [r.ids for r in rs] == alone and rs[0].trace.params["batch_size"] == 2
    assert rs[0].trace.method == "toy-echo" and rs[0].trace.params["k"] == 2


def test_a_method_not_marked_batchable_is_refused_in_a_batch(target):
    with registered(Method(name="toy-alone", family="model-free", engine="speculative", guarantee="identical-to-ar",
                           summary="", drafter=EchoDrafter)):
        with pytest.raises(ValueError, match="'toy-alone' does not run in a batch yet"):
            speclab.generate(target, ["a", "b"], "toy-alone", max_new_tokens=2)


def test_a_registered_method_is_on_the_dashboards_form_at_its_defaults(toy):
    pytest.importorskip("panel")
    from speclab.apps.dashboard import Dashboard
    d = Dashboard()
    assert "toy-echo" in d.form.method.options
    d.form.method.value = "draft-model"
    d.form.k.value = 7
    d.form.method.value = "toy-echo"
    assert d.form.k.visible and d.form.k.value == 3                   # its constructor's default
    assert not d.form.draft.visible and not d.form.budget.visible
    assert "skip=0" in d.form.extra.placeholder                       # the parameter without a knob
    d.form.prompt.value, d.form.max_new_tokens.value = PROMPT, 4
    trace = d.run_now()
    assert trace is not None and trace.method == "toy-echo" and len(trace.output_ids) == 4


def test_a_bad_row_is_refused_with_one_line():
    with pytest.raises(ValueError, match="EchoDrafter takes no \\['draft_model'\\]"):
        registry.register(Method(name="toy-bad", family="model-free", engine="speculative",
                                 guarantee="identical-to-ar", summary="", drafter=EchoDrafter,
                                 inputs={"draft_model": registry.the_draft}))
    with pytest.raises(ValueError, match="guarantee must be one of"):
        registry.register(Method(name="toy-vague", family="model-free", engine="speculative", guarantee="mostly",
                                 summary="", drafter=EchoDrafter))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(get_method("ar"))
    assert "toy-bad" not in registry.METHODS
