"""The cost gate (speclab/decoding/gate.py): a drafter that costs more than it saves is switched
off (ar rounds, recorded with their inputs) and probed now and then; one that pays keeps drafting;
outputs stay identical to ar either way."""
import time

import pytest

import speclab
from speclab.decoding.gate import CostGate
from speclab.decoding.speculative import Drafter
from speclab.decoding.tree import DraftTree


class Slow(Drafter):
    """Drafts a wrong token after a long pause: speculation can only lose."""
    name = "slow"

    def propose(self, ctx):
        time.sleep(0.05)                 # ~10x a round of the code zoo target
        return DraftTree.chain([(ctx.ids[-1] + 1) % 100], [1.0], "slow")


def test_a_losing_drafter_is_switched_off_and_probed(target, heldout_prompts):
    prompt = heldout_prompts[1]
    ref = speclab.generate(target, prompt, "ar", max_new_tokens=80, record=None).ids
    r = speclab.generate(target, prompt, CostGate(Slow()), max_new_tokens=80)
    assert r.ids == ref
    modes = [rnd.info.get("gate") for rnd in r.trace.rounds[1:]]
    # two plain rounds measure ar, then a drafting round that loses ends the warm-up; probes stay
    # rare (the exact schedule under a fixed clock: test_a_warmup_drafting_round_that_loses_badly...)
    assert modes[:3] == ["ar", "ar", "spec"] and modes.count("ar") > 0.7 * len(modes)
    off = r.trace.rounds[1 + 3].info
    assert off["gate"] == "ar" and off["spec_tok_s"] < off["ar_tok_s"]   # the decision and its inputs are recorded


class Oracle(Drafter):
    """Drafts the next 8 tokens of a known ar output: every draft is accepted."""
    name = "oracle"

    def __init__(self, full):
        super().__init__()
        self.full = full

    def propose(self, ctx):
        return DraftTree.chain(self.full[len(ctx.ids):len(ctx.ids) + 8], None, "oracle")


def test_a_paying_drafter_keeps_drafting(target, heldout_prompts):
    prompt = heldout_prompts[1]
    a = speclab.generate(target, prompt, "ar", max_new_tokens=96, record=None)
    ref = a.ids
    r = speclab.generate(target, prompt, CostGate(Oracle(a.trace.prompt_ids + ref)), max_new_tokens=96)
    assert r.ids == ref
    modes = [rnd.info.get("gate") for rnd in r.trace.rounds[1:]]
    assert modes[:2] == ["ar", "ar"] and modes.count("spec") >= len(modes) - 3   # the ar measurement and a probe


def test_gate_parameter():
    import pytest
    from speclab.decoding.registry import gated
    with pytest.raises(ValueError, match="gate must be"):
        gated(Drafter(), "maybe", True)
    assert isinstance(gated(Drafter(), "auto", True), CostGate)
    assert not isinstance(gated(Drafter(), "auto", False), CostGate)
    assert not isinstance(gated(Drafter(), "off", True), CostGate)


def test_choose_compares_median_costs_per_token():
    from speclab.decoding.gate import choose, rates
    # drafting: 12 ms a round for 1.2 tokens = 10 ms a token; plain rounds 9 ms a token
    spec, ar = [(0.012, 1)] * 4 + [(0.012, 2)] * 1, [0.009] * 4
    assert choose(spec, ar) == "ar"
    assert choose(spec, [0.011] * 4) == "spec"
    assert choose([(0.010, 1)], [0.010]) == "spec"            # a tie drafts
    assert choose([], ar) is None and choose(spec, []) is None
    s, a = rates(spec, ar)
    assert s == pytest.approx(1.2 / 0.012) and a == pytest.approx(1 / 0.009)


def test_one_descheduled_round_does_not_flip_the_decision():
    from speclab.decoding.gate import choose
    spec, ar = [(0.012, 1)] * 6, [0.009] * 6
    # a plain round that waited a time slice (0.5 s) would make plain decoding look slow to a
    # running mean; the median keeps the measured order
    assert choose(spec, ar + [0.5]) == "ar"
    assert choose(spec + [(0.5, 1)], [0.013] * 6) == "spec"   # and a slow drafting round likewise


def test_gate_decisions_follow_the_measured_costs_deterministically(target, heldout_prompts):
    """A clock that charges 3 s to a drafting round and 1 s to a plain one: after the plain rounds
    that measure ar, the oracle's rounds (up to 9 tokens for 3 s) keep drafting; the output is ar's."""
    prompt = heldout_prompts[1]
    ref = speclab.generate(target, prompt, "ar", max_new_tokens=60, record=None).ids
    t = [0.0]
    gate = CostGate(Oracle.__new__(Oracle), warm=3, ar_samples=2,
                    clock=lambda: t.__setitem__(0, t[0] + (3.0 if gate.last_mode == "spec" else 1.0)) or t[0])
    Oracle.__init__(gate.inner, speclab.generate(target, prompt, "ar", max_new_tokens=60, record=None).trace.prompt_ids + ref)
    r = speclab.generate(target, prompt, gate, max_new_tokens=60)
    assert r.ids == ref
    modes = [rnd.info["gate"] for rnd in r.trace.rounds[1:]]
    # the oracle's rounds commit up to 9 tokens for 3 s (0.33 s a token) against 1 s a plain token:
    # drafting pays, so the gate keeps drafting after measuring ar twice
    assert modes[:5] == ["ar", "ar", "spec", "spec", "spec"] and modes[5:].count("spec") >= len(modes[5:]) - 2


def test_plain_rounds_of_layer_skip_run_without_its_captures(target, heldout_prompts):
    """layer-skip's exit scoring captures hidden states that only drafting rounds use: the gate
    switches the captures off in plain rounds (a plain round then costs what ar's does) and back on
    before the next draft; the output stays ar's."""
    from speclab.decoding.drafters.model import LayerSkipDrafter
    prompt = heldout_prompts[2]
    ref = speclab.generate(target, prompt, "ar", max_new_tokens=40, record=None).ids
    seen = []

    class Watch(LayerSkipDrafter):
        def propose(self, ctx):
            seen.append(("spec", tuple(self.target.capture_layers)))
            return super().propose(ctx)

        def observe(self, out):
            if not len(out.tree):
                seen.append(("ar", tuple(self.target.capture_layers)))
            super().observe(out)
    t = [0.0]
    gate = CostGate(Watch(target[0], exit_layer="auto"), probe=4,
                    clock=lambda: t.__setitem__(0, t[0] + (3.0 if gate.last_mode == "spec" else 1.0)) or t[0])
    r = speclab.generate(target, prompt, gate, max_new_tokens=40)
    assert r.ids == ref
    assert {c for m, c in seen if m == "ar"} == {()}               # plain rounds: nothing captured
    assert all(c for m, c in seen if m == "spec")                  # drafting rounds: the exits captured
    assert [m for m, _ in seen][:4] == ["ar", "ar", "ar", "spec"]   # the prefill and two measuring rounds plain


def test_probe_wait_bounds_what_probing_a_losing_drafter_costs():
    from speclab.decoding.gate import probe_wait
    # a drafting round of 6 plain rounds' time for 1 token loses 5 rounds: at 5% that is 100 rounds
    assert probe_wait([(0.6, 1)] * 3, [0.1] * 3) == 100
    assert probe_wait([(0.12, 1)] * 3, [0.1] * 3) == 4           # a near miss is probed on the usual schedule
    assert probe_wait([(0.15, 2)] * 3, [0.1] * 3) == 0           # a drafter that pays loses nothing
    assert probe_wait([], [0.1]) == 0


def test_a_warmup_drafting_round_that_loses_badly_ends_the_warmup(target, heldout_prompts):
    """Six plain rounds' time for a drafting round: after the two plain rounds that measure ar,
    one drafting round, then plain rounds to the end of a 64-token run."""
    prompt = heldout_prompts[1]
    t = [0.0]
    gate = CostGate(Slow(), clock=lambda: t.__setitem__(0, t[0] + (6.0 if gate.last_mode == "spec" else 1.0)) or t[0])
    r = speclab.generate(target, prompt, gate, max_new_tokens=64)
    modes = [rnd.info["gate"] for rnd in r.trace.rounds]
    assert modes[0] == "ar"                                      # the prefill round drafts nothing
    assert modes.count("spec") == 1 and modes[1:4] == ["ar", "ar", "spec"]
