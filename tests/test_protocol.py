"""The target protocol (speclab/models/protocol.py) is what drafters may ask of a target: every
forward the backends factory can hand them implements every member, with a compatible signature."""
from __future__ import annotations

import inspect

import pytest
import torch
from conftest import tiny_llama

from speclab.models.hf import CausalLM
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.static import StaticLM
from speclab.models.protocol import TargetLM

MEMBERS = [n for n in dir(TargetLM) if not n.startswith("_")] + list(TargetLM.__annotations__)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def accepts(impl, proto) -> list[str]:
    """What `impl` lacks to be called as `proto` is called: a parameter of the protocol's missing
    (by name, in order), or a parameter of its own without a default."""
    want = list(inspect.signature(proto).parameters.values())[1:]
    have = list(inspect.signature(impl).parameters.values())[1:]
    names = [p.name for p in have]
    problems = [f"no parameter {p.name!r}" for p in want if p.name not in names]
    if not problems and [p.name for p in have[:len(want)]] != [p.name for p in want]:
        problems.append(f"parameters in another order: {names}")
    problems += [f"{p.name!r} has no default" for p in have[len(want):]
                 if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    return problems


@pytest.mark.parametrize("make", [LeanLM, StaticLM, CausalLM], ids=["LeanLM", "StaticLM", "CausalLM"])
def test_every_target_forward_implements_the_protocol(model, make):
    lm = make(model, "target")
    assert isinstance(lm, TargetLM)
    for name in MEMBERS:
        assert hasattr(lm, name), f"{make.__name__} has no {name}"
        proto = getattr(TargetLM, name, None)
        if inspect.isfunction(proto):
            assert not accepts(getattr(type(lm), name), proto), (make.__name__, name, accepts(getattr(type(lm), name), proto))
    # the members do what the protocol says, the same on every forward
    ids = torch.tensor([5, 6, 7, 8])
    lm.reset()
    logits = lm.forward(ids)
    assert logits.shape == (4, 96) and lm.length == 4 and lm.forwards >= 1
    lm.capture_layers = (1, 3)
    lm.forward(torch.tensor([9, 10]), parents=[-1, 0], n_prefix=0, logits_to_keep=2)
    assert sorted(lm.captured) == [1, 3] and lm.captured[3].shape == (1, 2, 32)
    lm.capture_layers = ()
    lm.keep_positions(4, [0])
    assert lm.length == 5
    lm.keep(4)
    assert lm.length == 4
    assert lm.final_norm_head(lm.captured[3][0, -1]).shape[-1] == 96


def test_the_protocol_is_what_drafters_are_annotated_with():
    """The engine and the drafters' base name the protocol, not one implementation."""
    from speclab.decoding import speculative
    hints = inspect.get_annotations(speculative.RunState, eval_str=True)
    assert hints["target"] is TargetLM
    assert inspect.signature(speculative.decode).parameters["target"].annotation in (TargetLM, "TargetLM")
