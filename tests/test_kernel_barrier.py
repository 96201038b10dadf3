"""The native kernel's threads wait for each other at every step of a layer: spinning, or spinning
briefly then sleeping (futex). How they wait must never change a bit of the output, and a sleeping
waiter must always be woken (a lost wake-up would hang the forward)."""
from __future__ import annotations

import pytest
import torch

from speclab.models import kernels

pytestmark = pytest.mark.skipif(not kernels.available("cpu", torch.bfloat16),
                                reason="needs a CPU with AVX512-BF16 and the built kernel")


def _lean():
    try:
        from speclab.models.lean.forward import LeanLM
    except ImportError:                       # the layout before models/ was split into lean/
        from speclab.models.fast_llama import LeanLM
    return LeanLM


@pytest.mark.parametrize("kv", [2, 3], ids=["kv2", "kv3"])
def test_barrier_modes_give_bitwise_the_same_forwards(kv):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64 * kv, intermediate_size=320, num_hidden_layers=3,
                      num_attention_heads=2 * kv, num_key_value_heads=kv, max_position_embeddings=256)
    lm = _lean()(LlamaForCausalLM(cfg).to(torch.bfloat16).eval())
    assert lm.fused
    ids = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    out = {}
    try:
        torch.set_num_threads(2)                # a team of two even on a one-core runner
        # spin_us=0: every waiter goes to sleep, the path a busy machine takes
        for mode, spin_us in (("spin", 50), ("sleep", 0), ("sleep", kernels.SPIN_US)):
            kernels.set_barrier(mode, spin_us)
            rows = []
            for _ in range(5):                      # prefill, then one-row and 6-row verify forwards
                lm.keep(0)
                rows.append(lm.forward(ids))
                rows += [lm.forward(ids[i:i + 1]) for i in range(3)]
                rows.append(lm.forward(ids[3:9]))
            out[(mode, spin_us)] = rows
    finally:
        kernels.set_barrier("sleep", kernels.SPIN_US)
        torch.set_num_threads(threads)
    ref = out[("spin", 50)]
    for key, rows in out.items():
        assert all(torch.equal(a, b) for a, b in zip(rows, ref)), key


def test_set_barrier_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="use 'sleep' or 'spin'"):
        kernels.set_barrier("busy")
