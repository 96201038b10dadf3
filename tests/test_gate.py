"""The cost gate (speclab/decoding/gate.py): a drafter that costs more than it saves is switched
off (ar rounds, recorded with their inputs) and probed now and then; one that pays keeps drafting;
outputs stay identical to ar either way."""
import time

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
    modes = [rnd.info.get("gate") for rnd in r.trace.rounds]
    assert modes.count("ar") > 0.7 * len(modes)             # mostly plain rounds
    assert "spec" in modes[5:]                               # ...with probes after the warm-up
    # the first ar round only measures what a plain round costs; the later ones are decisions
    off = [rnd.info for rnd in r.trace.rounds if rnd.info.get("gate") == "ar"][3]
    assert off["spec_tok_s"] < off["ar_tok_s"]               # the decision and its inputs are recorded


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
    assert modes.count("spec") >= len(modes) - 2             # at most the one ar measurement and a probe


def test_gate_parameter():
    import pytest
    from speclab.decoding.registry import gated
    with pytest.raises(ValueError, match="gate must be"):
        gated(Drafter(), "maybe", True)
    assert isinstance(gated(Drafter(), "auto", True), CostGate)
    assert not isinstance(gated(Drafter(), "auto", False), CostGate)
    assert not isinstance(gated(Drafter(), "off", True), CostGate)
