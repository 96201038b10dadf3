"""How often a drafter's propose reads a tensor back to the host (.tolist(), .item(), int(t), ...).

On a GPU each such read waits for every kernel queued before it, so a tree drafter that read per
node would stall the device once per node. The rule the tree drafters keep: one read per depth of
the tree (medusa: one per round, its tree is static). Counted on a CPU with a TorchFunctionMode,
which sees every tensor method call, so the count is the one a GPU run would make."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import speclab
from speclab.decoding.registry import build_drafter
from conftest import toy_heads

@pytest.fixture(scope="module")
def heads(target):
    return toy_heads(target)


READS = {"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu"}


class CountReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += getattr(func, "__name__", "") in READS
        return func(*args, **(kwargs or {}))


def counted(drafter) -> list[tuple[int, int]]:
    """Wrap drafter.propose: per call, (reads, levels of the tree it returned)."""
    calls, propose = [], drafter.propose

    def wrapped(ctx):
        with CountReads() as c:
            tree = propose(ctx)
        calls.append((c.n, tree.info.get("levels", 1) if len(tree) else 0))
        return tree
    drafter.propose = wrapped
    return calls




@pytest.mark.parametrize("method,params", [("eagle", dict(budget=10, width=3, depth=4, threshold=None)),
                                           ("eagle", {}), ("tree-dynamic", dict(budget=8, width=3)),
                                           ("medusa", {})])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_drafters_read_the_host_once_per_depth(method, params, temperature, target, draft, heads,
                                                    heldout_prompts):
    d = {"eagle": heads["eagle"], "medusa": heads["medusa"], "tree-dynamic": draft[0]}[method]
    drafter = build_drafter(method, target[0], d, params)
    calls = counted(drafter)
    r = speclab.generate(target, heldout_prompts[0], drafter, max_new_tokens=16, temperature=temperature,
                         record="full")
    assert len(r.ids) == 16 and len(calls) > 3
    for reads, levels in calls:
        assert reads == levels, calls                      # one read per depth; 0 before a first feature


def test_eagle3_tree_reads_the_host_once_per_depth(target):
    from test_eagle3 import make_draft, tiny

    from speclab.decoding.drafters.eagle3 import Eagle3Drafter
    model, tok = tiny.__wrapped__(target)
    drafter = Eagle3Drafter(model, make_draft(model), budget=8, width=3, depth=4, threshold=None)
    calls = counted(drafter)
    speclab.generate((model, tok), list(range(40, 52)), drafter, max_new_tokens=16)
    assert len(calls) > 3 and all(reads == levels for reads, levels in calls), calls
