"""What any method records beyond the engine's loop (speclab/trace.py, docs/trace-format.md):
policy decisions, several rules' verdicts per node, a diffusion step's edits, timing lanes. They
survive a JSON round trip, replay honours edits, an older schema still loads, and the acceptance-
rule and guarantee registries are what the registry rows and runs read."""
from __future__ import annotations

import json

import pytest

from speclab.trace import (MASK, SCHEMA, Decision, DenoiseStep, DraftNode, Edit, Lane, Round, Span, Trace,
                           TraceError, replay)


def diffusion_trace(steps, gen_length=4) -> Trace:
    return Trace(engine="diffusion", method="dllm-toy", params=dict(gen_length=gen_length, eos_id=None),
                 denoise=steps, output_ids=[])


def test_decisions_verdicts_edits_and_lanes_survive_a_json_round_trip():
    t = Trace(engine="speculative", method="toy",
              rounds=[Round(nodes=[DraftNode(0, -1, 7, 1, verdicts={"exact": "rejected", "typical": "accepted"})],
                            decisions=[Decision("specdec++", {"p_accept": 0.8, "k": 3}, 0.3, "stop", at=3,
                                                note="P(any rejection) passed 0.3")])],
              lanes=[Lane("drafter", [Span(0.0, 0.01, "draft", 0)]), Lane("target", [Span(0.005, 0.02, "verify", 0)])])
    back = Trace.from_json(json.dumps(t.to_dict()))
    assert back.rounds[0].decisions == t.rounds[0].decisions
    assert back.rounds[0].nodes[0].verdicts == {"exact": "rejected", "typical": "accepted"}
    assert back.lanes == t.lanes and back.schema == SCHEMA
    d = diffusion_trace([DenoiseStep((0, 4), [0, 1, 2, 3], edits=[Edit(2, 9, MASK, "confidence fell")],
                                     decisions=[Decision("r2dllm", {"stable": 3}, 2.0, [0, 1])])])
    again = Trace.from_json(json.dumps(d.to_dict()))
    assert again.denoise[0].edits == d.denoise[0].edits and again.denoise[0].decisions == d.denoise[0].decisions


def test_replay_takes_a_token_back_and_commits_it_again():
    """A remask (after = MASK) frees a position for a later commit; a rewrite replaces the token."""
    steps = [DenoiseStep((0, 3), [0, 1, 2], top1=[5, 6, 7], committed=[0, 1, 2]),
             DenoiseStep((0, 3), [], edits=[Edit(1, 6, MASK, "remask"), Edit(2, 7, 8, "token-to-token")]),
             DenoiseStep((0, 3), [1], top1=[4], committed=[1])]
    t = diffusion_trace(steps, gen_length=3)
    assert replay(t) == [5, 4, 8]
    assert {4, 8} <= t.mentioned_ids()


@pytest.mark.parametrize("steps, error", [
    ([DenoiseStep((0, 2), [0, 1], top1=[5, 6], committed=[0, 1]),
      DenoiseStep((0, 2), [0], top1=[9], committed=[0])], "committed while it holds a token"),
    ([DenoiseStep((0, 2), [0, 1], top1=[5, 6], committed=[0, 1]),
      DenoiseStep((0, 2), [], edits=[Edit(0, 7, MASK)])], "edits position 0 from 7, but it holds 5"),
])
def test_replay_refuses_edits_and_commits_the_canvas_contradicts(steps, error):
    with pytest.raises(TraceError, match=error):
        replay(diffusion_trace(steps, gen_length=2))


def test_a_version_1_trace_still_loads_and_a_newer_one_is_refused():
    old = {"schema": "speclab.trace/1", "engine": "speculative", "method": "ar", "prompt_ids": [1],
           "output_ids": [2], "rounds": [{"path_tokens": [], "emitted": 2, "kept": 1,
                                          "nodes": [{"id": 0, "parent": -1, "token": 3, "depth": 1}]}]}
    t = Trace.from_dict(old)
    assert t.rounds[0].decisions == [] and t.rounds[0].nodes[0].verdicts == {} and t.lanes == []
    with pytest.raises(TraceError, match="newer than this speclab"):
        Trace.from_dict(dict(old, schema="speclab.trace/99"))


def test_the_guarantee_of_a_run_is_the_weaker_of_its_methods_and_its_rules():
    from speclab.decoding.acceptance import walk_tree
    from speclab.decoding.registry import get_method, guarantee, methods
    from speclab.decoding.rules import Rule, get_rule, registered_rule, rules
    assert get_rule("exact").guarantee == "identical-to-ar" and [r["name"] for r in rules()][0] == "exact"
    assert guarantee("eagle") == "identical-to-ar" and guarantee("dllm-freedave") == "identical-to-one-per-step"
    assert guarantee("dag-viterbi") == "deterministic" and guarantee("dllm-threshold") == "lossy"
    with registered_rule(Rule(name="toy-lossy", guarantee="lossy", summary="accepts more", make=lambda params, model=None: walk_tree)):
        assert guarantee("eagle", "toy-lossy") == "lossy"
    with pytest.raises(ValueError, match="unknown acceptance rule 'toy-lossy'"):
        guarantee("eagle", "toy-lossy")
    from speclab.decoding.rules import register_rule
    with pytest.raises(ValueError, match="guarantee must be one of"):
        register_rule(Rule(name="bad", guarantee="mostly", summary="", make=lambda params, model=None: walk_tree))
    rows = {m["name"]: m for m in methods()}
    assert rows["eagle"]["lossless"] and not rows["dllm-threshold"]["lossless"]
    assert get_method("dag-beam").strategy == "beam" and get_method("dllm-entropy-bound").noise_canvas


def test_the_engine_verifies_with_the_runs_rule():
    """decode(rule=NAME) walks every verify with that rule's function, and only with it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.decoding.acceptance import Sampler, walk_tree
    from speclab.decoding.rules import Rule, registered_rule
    from speclab.decoding.speculative import Drafter, decode
    from speclab.models.lean.forward import LeanLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    calls = []

    def counting(*a, **kw):
        calls.append(1)
        return walk_tree(*a, **kw)
    with registered_rule(Rule(name="toy-counting", guarantee="identical-to-ar", summary="", make=lambda params, model=None: counting)):
        new, rounds, _ = decode(LeanLM(model), Drafter(), [1, 2, 3], 6, Sampler(), rule="toy-counting")
    assert len(calls) == len(rounds) == 6
    ref, _, _ = decode(LeanLM(model), Drafter(), [1, 2, 3], 6, Sampler())
    assert new == ref and len(calls) == 6
