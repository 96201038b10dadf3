"""FoReaL-Decoding on the code zoo: the leader (target) writes each led sentence's first n tokens,
the draft the rest, kept unverified; the gate's draws decide who leads, each recorded; a leader
that leads everything is `ar`; the same handoff verified by `exact` is `ar` too; bad parameters are
refused in one line."""
from __future__ import annotations

import pytest
import torch

import speclab
from speclab.decoding.acceptance import Given
from speclab.decoding.drafters.foreal import Sentences
from speclab.decoding.registry import get_method, guarantee
from speclab.decoding.rules import get_rule
from speclab.figures.foreal import handoff_counts, handoff_figure
from speclab.trace import ACCEPTED, Trace, replay

PROMPTS = ["def parse(line):\n    \"\"\"Split a line.", "import os\n\n\nclass Cache:\n    def get(self, key):"]
NEW = 48


def test_a_sentence_starts_after_a_newline_or_a_spaced_token_after_a_full_stop():
    s = Sentences(["a.", " b", "\n", "c", "?", "x!  ", " y", "\n\n"])
    assert s.starts(0, 1) and not s.starts(0, 3)            # "a." then " b": yes; "a." then "c": no
    assert s.starts(2, 3) and s.starts(7, 1)                 # after a newline, whatever follows
    assert s.starts(4, 6) and s.starts(5, 6)                 # "?" and "x!  " end a sentence
    assert not s.starts(1, 6) and not s.starts(3, 1)         # " b", "c" end none


def test_the_row_is_lossy_under_its_own_rule_and_the_rule_keeps_every_candidate():
    assert get_method("foreal").rule == "unverified" and guarantee("foreal") == "lossy"
    rule = get_rule("unverified")
    x, top = torch.tensor([3, 5, 7]), torch.tensor([3, 1, 7])
    ok, _, rec = rule.test(None, None, x, None, {}, Given(top=top))
    assert ok.tolist() == [True, True, True] and [d["top"] for d in rec["inputs"]] == [3, 1, 7]
    P, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.2, 0.8])
    assert torch.equal(rule.induced(P, q, {})[0], q) and torch.equal(rule.induced(P, None, {})[0], P)


@pytest.fixture(scope="module")
def runs(target, draft):
    return [speclab.generate(target, p, "foreal", draft=draft, max_new_tokens=NEW, n=2, p=0.7) for p in PROMPTS]


def test_every_draft_token_is_kept_and_exacts_verdict_recorded_beside(runs, tmp_path):
    rounds = [rd for r in runs for rd in r.trace.rounds]
    drafted = [rd for rd in rounds if rd.drafted]
    assert drafted and any(not rd.drafted for rd in rounds)             # both models wrote
    assert all(len(rd.accepted) == rd.drafted and rd.info["owner"] == "draft" for rd in drafted)
    nodes = [n for rd in drafted for n in rd.nodes]
    assert all(n.verdicts["unverified"] == ACCEPTED and "exact" in n.verdicts for n in nodes)
    # the leader's own greedy token at each draft token: exact accepts exactly where they agree
    for rd in drafted:
        tops = [d.inputs["top"] for d in rd.decisions if d.policy == "unverified"]
        assert [t == n.token for t, n in zip(tops, rd.nodes)] == [n.verdicts["exact"] == ACCEPTED for n in rd.nodes]
    t = runs[0].trace
    back = Trace.load(t.save(tmp_path / "foreal.json"))
    assert replay(back) == t.output_ids
    assert t.totals.target_forwards == len(t.rounds)


def test_each_sentence_start_has_one_gate_whose_output_is_u_against_p(runs):
    for r in runs:
        gates = [d for rd in r.trace.rounds for d in rd.decisions if d.policy == "foreal-gate"]
        starts = sum(len(rd.info.get("starts", [])) for rd in r.trace.rounds)
        assert len(gates) == starts >= 2
        assert [d.at for d in gates] == list(range(len(gates)))
        assert all((d.output == "leader") == (d.inputs["u"] < d.threshold == 0.7) for d in gates)
        # a sentence led from the round's own last token: the next round is the leader's (n = 2)
        rounds = r.trace.rounds
        for i, rd in enumerate(rounds[:-1]):
            led = [d for d in rd.decisions if d.policy == "foreal-gate" and d.output == "leader"]
            if led and rd.info["starts"][-1] == rd.kept - 1:
                assert rounds[i + 1].drafted == 0


def test_the_figure_counts_every_kept_token_once(runs):
    t = runs[1].trace
    lead, agree, apart = handoff_counts(t)
    assert sum(lead) + sum(agree) + sum(apart) == len(t.output_ids)
    assert sum(lead) == sum(1 for rd in t.rounds if rd.kept > len(rd.accepted))
    fig = handoff_figure(t, 1)
    assert "sentences led" in fig.layout.title.text and len(fig.data) == 5


def test_a_leader_that_leads_every_sentence_throughout_is_ar(target, draft):
    for prompt in PROMPTS:
        ar = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None)
        r = speclab.generate(target, prompt, "foreal", draft=draft, max_new_tokens=NEW, n=NEW, p=1.0)
        assert r.ids == ar.ids and r.trace.totals.drafted == 0


def test_the_handoff_verified_by_exact_is_ar(target, draft):
    for prompt in PROMPTS:
        ar = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None)
        r = speclab.generate(target, prompt, "foreal", draft=draft, max_new_tokens=NEW, n=1, p=0.3, rule="exact")
        assert r.ids == ar.ids and r.trace.totals.drafted > r.trace.totals.accepted


@pytest.mark.parametrize("kw,words", [(dict(n=0), "n must be an integer >= 1"), (dict(p=1.5), r"p must be in \[0, 1\]"),
                                      (dict(max_k=0), "max_k must be an integer >= 1")])
def test_bad_parameters_are_one_line_errors(target, draft, kw, words):
    with pytest.raises(ValueError, match=words) as e:
        speclab.generate(target, "x = 1", "foreal", draft=draft, max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_the_rule_serves_only_the_methods_without_a_verify(target):
    with pytest.raises(ValueError, match="verifies the drafts of foreal, lud only"):
        speclab.generate(target, "x = 1", "prompt-lookup", max_new_tokens=4, rule="unverified")
