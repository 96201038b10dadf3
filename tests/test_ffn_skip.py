"""FFN-SkipLLM on the code zoo: a token's FFN blocks after the first saturated one are skipped
(attention always runs), each token's choice recorded as an `ffn-skip` decision and as the round's
skip mask; a threshold nothing passes is `ar` bit for bit; the recorded masks, replayed as fixed
skip sets, give the same text; the MLPs that ran are the masks' count; bad parameters are refused
in one line."""
from __future__ import annotations

import re

import pytest
import torch

import speclab
from speclab.decoding.drafters.ffn_skip import Saturation
from speclab.decoding.registry import get_method, guarantee
from speclab.models.lean import forward as lean
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.skips import SkipSet
from speclab.trace import replay

PROMPT, NEW = "def parse(line):", 24


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Bit-for-bit comparisons at one thread: a team size chosen from the load may change between
    forwards (kernels.TeamSize), and with it how torch's products round."""
    monkeypatch.setenv("SPECLAB_THREADS", "1")


def test_a_threshold_nothing_passes_is_ar_bit_for_bit(target):
    ar = speclab.generate(target, PROMPT, "ar", max_new_tokens=NEW)
    r = speclab.generate(target, PROMPT, "ffn-skip", max_new_tokens=NEW, threshold=2.0, warmup=0)
    assert r.ids == ar.ids
    assert all(set(rd.info["skip"]) == {"."} for rd in r.trace.rounds)
    d = [rd.decisions[0] for rd in r.trace.rounds[1:]]
    assert all(x.policy == "ffn-skip" and x.inputs["layer"] is None and x.inputs["tested"] > 0 for x in d)


def test_the_rule_skips_the_blocks_after_the_first_saturated_one_within_budget_and_cold_regions():
    g = Saturation(n_layers=10, threshold=0.9, budget=3, cold_start=2, cold_end=2)
    x = torch.ones(1, 4)
    away = torch.tensor([[1.0, -1.0, 1.0, -1.0]])        # cosine 0 with x
    for i in range(10):
        if g.run(i):
            g.ran(i, x, away if i < 3 else x)            # layers 0-2 change the stream, 3 saturates
    assert (g.at, g.skipped, g.mask()) == (3, [4, 5, 6], "....mmm...")
    assert g.cos == [0.0, 1.0]                          # layers 2 and 3 tested; 0-1 cold, 7+ past the budget
    g = Saturation(n_layers=10, threshold=0.9, budget=8, cold_start=2, cold_end=2)
    for i in range(10):
        if g.run(i):
            g.ran(i, x, x)
    assert g.mask() == "...mmmmm.."                      # saturated at 2; the cold end runs


def test_decisions_masks_and_forwards_are_recorded_and_replay_gives_the_output(target, monkeypatch):
    runs = {}                                           # id of a layer's weights -> MLPs run (w2 products)
    real = lean.mm

    def counting(h, w, name):
        if name == "w2":
            runs[id(w)] = runs.get(id(w), 0) + 1
        return real(h, w, name)
    monkeypatch.setattr(lean, "mm", counting)
    r = speclab.generate(target, PROMPT, "ffn-skip", max_new_tokens=NEW, threshold=0.5, skip_ratio=0.25, warmup=2,
                         cold_start=1, cold_end=1, record="full")
    t = r.trace
    assert t.guarantee == "lossy" and replay(t) == r.ids and t.totals.target_forwards == len(t.rounds) == NEW
    masks = [rd.info["skip"] for rd in t.rounds]
    assert all(set(m) == {"."} for m in masks[:2])      # the prompt's forward and the warm-up
    assert any("m" in m for m in masks) and all(m.count("m") <= 2 and m[0] == m[-1] == "." for m in masks)
    for rd in t.rounds[2:]:
        (d,) = rd.decisions
        assert d.policy == "ffn-skip" and d.threshold == 0.5 and d.output == rd.info["skip"]
        assert d.inputs["skipped"] == d.output.count("m") and len(d.inputs["cos_by_block"]) == d.inputs["tested"]
        if d.inputs["layer"] is not None:
            assert d.inputs["cos"] >= 0.5 and set(d.output[:d.inputs["layer"] + 1]) == {"."}
    # a layer's MLP ran in every forward whose mask does not skip it (the prompt's rows in one product)
    lm = LeanLM(target[0], "check")
    per_layer = [len(t.rounds) - sum(m[i] == "m" for m in masks) for i in range(len(masks[0]))]
    assert sorted(runs.values()) == sorted(per_layer) and min(per_layer) < len(t.rounds)
    # the masks as fixed skip sets, token by token, give the same text
    monkeypatch.setattr(lean, "mm", real)
    ids = t.prompt_ids + r.ids
    lm.reset()
    out = [int(lm.forward(torch.tensor(t.prompt_ids))[-1].argmax())]
    for k in range(1, NEW):
        out.append(int(lm.forward(torch.tensor([ids[len(t.prompt_ids) + k - 1]]), skip=SkipSet.from_text(masks[k]))[-1]
                       .argmax()))
    assert out == r.ids


@pytest.mark.parametrize("kw,words", [
    (dict(skip_ratio=1.5), "skip_ratio must be in [0, 1]"),
    (dict(threshold=-3), "threshold must be a cosine similarity"),
    (dict(warmup=-1), "warmup must be an integer >= 0"),
    (dict(cold_start=4, cold_end=4), "cold_start + cold_end must leave a layer"),
    (dict(cold_end=5000), "cold_end=5000 is past its bound of 1024"),
])
def test_bad_parameters_are_refused_in_one_line(target, kw, words):
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        speclab.generate(target, PROMPT, "ffn-skip", max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_the_row_is_lossy_and_transformers_forward_refuses_it(target):
    assert guarantee("ffn-skip") == "lossy" and "FFN-SkipLLM" in get_method("ffn-skip").summary
    with pytest.raises(ValueError, match="lean forward only"):
        speclab.generate(target, PROMPT, "ffn-skip", max_new_tokens=4, backend="hf")
