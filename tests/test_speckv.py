"""SpecKV on the code zoo: a small model over the draft's confidence and entropy picks each round's
draft length, the one with the most expected tokens per cost; the choice and its inputs are recorded;
greedy output is `ar`'s; the model round-trips through safetensors; the trainer's rows label every
length; bad parameters are refused in one line."""
from __future__ import annotations

import pytest
import torch

import speclab
from speclab.decoding.drafters.speckv import LengthModel, load_model, save_model, tokens_per_cost
from speclab.figures.speckv import choices, length_figure
from speclab.trace import Trace, replay
from speclab.train.speckv import Collector, fit, realised

PROMPTS = ["def parse(line):\n    \"\"\"Split a line.", "import os\n\n\nclass Cache:\n    def get(self, key):"]
NEW = 40


def test_tokens_per_cost_counts_the_bonus_and_prices_each_drafted_token():
    got = tokens_per_cost([0.9, 0.5, 0.1], cost=0.1)
    assert got == pytest.approx([1.9 / 1.1, 2.4 / 1.2, 2.5 / 1.3])
    assert realised([(0.5, 1.0, 2), (0.9, 0.2, 0)], [3, 1], cost=0.5) == pytest.approx((3 + 1) / (2.5 + 1.5))


def constant(P: float, G: int = 6) -> LengthModel:
    """A model whose every P_j is P, whatever it reads."""
    m = LengthModel(G)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.net[2].bias.fill_(torch.logit(torch.tensor(P)).item())
    return m


def test_the_model_is_non_increasing_in_j_and_round_trips_through_safetensors(tmp_path):
    torch.manual_seed(0)
    m = LengthModel(8)
    with torch.no_grad():
        m.net[2].bias.copy_(torch.linspace(-2, 2, 8))         # raw sigmoids rising in j
    x = torch.rand(5, 2)
    P = m(x)
    assert (P[:, 1:] <= P[:, :-1]).all()
    back, info = load_model(save_model(m, tmp_path / "m", {"cost": 0.2, "draft": "code-draft"}))
    assert torch.equal(back(x), P) and info["cost"] == 0.2 and info["G"] == 8


@pytest.mark.parametrize("P,cost,want", [(0.999, 0.0, 6), (0.001, 0.3, 1), (0.8, 0.1, 6), (0.5, 0.5, 1)])
def test_the_length_is_the_argmax_of_expected_tokens_per_cost(target, draft, tmp_path, P, cost, want):
    where = save_model(constant(P), tmp_path / "m", {"cost": cost, "draft": "x"})
    r = speclab.generate(target, PROMPTS[0], "speckv", draft=draft, max_new_tokens=12, model=str(where))
    for rd in r.trace.rounds:
        d = [x for x in rd.decisions if x.policy == "speckv"][0]
        assert d.output == rd.info["chosen_k"] == want
        assert rd.drafted == want or rd.drafted < want and rd is r.trace.rounds[-1]


@pytest.fixture(scope="module")
def fitted(target, draft, tmp_path_factory):
    """A model fit on the toy zoo's own rounds (the trainer's collector and fit, CPU seconds)."""
    collector = Collector(draft[0], 6)
    for p in ["class Node:\n    def __init__(self", "for i in range(", "def read(path):\n    with open("]:
        speclab.generate(target, p, collector, max_new_tokens=48, record=None)
    assert collector.rows and all(0 <= a <= 6 for _, _, a in collector.rows)
    model = fit(collector.rows, 6, steps=300, lr=0.02, seed=0)
    return save_model(model, tmp_path_factory.mktemp("speckv") / "m", {"cost": 0.15, "draft": "code-draft"})


def test_greedy_is_ar_and_every_round_records_its_choice(target, draft, fitted, tmp_path):
    for prompt in PROMPTS:
        ar = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None)
        r = speclab.generate(target, prompt, "speckv", draft=draft, max_new_tokens=NEW, model=str(fitted))
        assert r.ids == ar.ids
        for rd in r.trace.rounds:
            d = [x for x in rd.decisions if x.policy == "speckv"][0]
            scores = d.inputs["tokens_per_cost"]
            assert d.output == 1 + scores.index(max(scores)) and d.inputs["level"] == "float32"
            assert d.inputs["confidence"] == rd.info["confidence"] and 0 < rd.info["confidence"] <= 1
    back = Trace.load(r.trace.save(tmp_path / "speckv.json"))
    assert replay(back) == r.ids
    rows = choices(back)
    assert len(rows) == len(back.rounds) and "lengths chosen" in length_figure(back, 0).layout.title.text


@pytest.mark.parametrize("kw,words", [(dict(max_k=9), r"max_k must be an integer in 1\.\.6"),
                                      (dict(cost=-1.0), "cost must be a number >= 0"),
                                      (dict(model="/no/such/dir"), "neither a zoo name nor a directory")])
def test_bad_parameters_are_one_line_errors(target, draft, fitted, kw, words):
    kw = {"model": str(fitted), **kw}
    with pytest.raises(ValueError, match=words) as e:
        speclab.generate(target, "x = 1", "speckv", draft=draft, max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)
