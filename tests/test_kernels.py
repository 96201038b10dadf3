"""speclab's bf16 CPU kernel (speclab/models/bf16_linear.cpp): the packed linear layer and the fused
Llama layer, on random matrices and on a real transformers Llama built from a config.

What is pinned: results within bf16 rounding of an fp32 reference; every row's result independent
of how many rows share the call (the property that makes a verify equal one-token forwards); odd
shapes padded; the fused layer close to the torch-op layer it replaces, and its verify of a chain
or a tree bitwise equal to one-token forwards.
"""
import pytest
import torch
import torch.nn.functional as F

from speclab.models import kernels

pytestmark = pytest.mark.skipif(not kernels.available("cpu", torch.bfloat16),
                                reason="needs a CPU with AVX512-BF16 and a C++ toolchain")


def _bf16_close(y, ref):
    """y (bf16) within one bf16 rounding of ref (fp32) plus fp32 summation error."""
    tol = ref.abs() * 2 ** -8 + 1e-3 * ref.abs().max()
    return bool(((y.float() - ref).abs() <= tol).all())


HAS_AMX = bool(kernels._caps().get("amx_bf16"))


@pytest.fixture(params=["avx512", "amx"])
def loop(request):
    """Each of the kernel's two loops in turn (AMX only where the CPU has it); the process's own
    choice restored after."""
    if request.param == "amx" and not HAS_AMX:
        pytest.skip("this CPU has no AMX")
    mod = kernels.module()
    assert mod.use_amx(request.param == "amx") == (request.param == "amx")
    yield request.param
    mod.use_amx(kernels._amx)


@pytest.mark.parametrize("N,K", [(64, 32), (960, 576), (576, 1536), (100, 33), (128, 40)])
def test_packed_linear_is_accurate_and_row_count_invariant(N, K, loop):
    """17 rows: the AMX loop's passes are 16 rows, the AVX-512 loop's 6 (K = 33 and 40 are not
    multiples of 32: those take the AVX-512 loop on either setting)."""
    g = torch.Generator().manual_seed(N + K)
    W = torch.randn(N, K, generator=g).to(torch.bfloat16)
    x = torch.randn(17, K, generator=g).to(torch.bfloat16)
    lin = kernels.Packed(W)
    y = lin(x)
    assert y.shape == (17, N) and y.dtype == torch.bfloat16
    assert _bf16_close(y, x.float() @ W.float().t())
    for t in range(17):                                    # one row alone == that row in the batch
        assert torch.equal(lin(x[t:t + 1]), y[t:t + 1])
    assert torch.equal(lin(x[2:9]), y[2:9]) and torch.equal(lin(x[1:17]), y[1:17])


@pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX")
def test_the_two_loops_agree_to_rounding():
    """The tiles sum in their own order: the same products, a few outputs one bf16 step apart."""
    g = torch.Generator().manual_seed(3)
    W = torch.randn(3072, 576, generator=g).to(torch.bfloat16)
    x = torch.randn(6, 576, generator=g).to(torch.bfloat16)
    lin, mod = kernels.Packed(W), kernels.module()
    try:
        mod.use_amx(False)
        a = lin(x).float()
        mod.use_amx(True)
        b = lin(x).float()
    finally:
        mod.use_amx(kernels._amx)
    step = a.abs() * 2 ** -7 + 1e-2
    assert ((a - b).abs() <= step).all() and (a != b).float().mean() < 0.01


def test_packed_linear_matches_f_linear_to_rounding():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(3072, 576, generator=g).to(torch.bfloat16)
    x = torch.randn(5, 576, generator=g).to(torch.bfloat16)
    ours, theirs = kernels.Packed(W)(x).float(), F.linear(x, W).float()
    step = theirs.abs() * 2 ** -7 + 1e-2                   # one bf16 step either way
    assert ((ours - theirs).abs() <= step).float().mean() > 0.999


def test_packed_linear_adds_its_bias_on_padded_shapes():
    """nn.Linear's bias (the EAGLE fusion's, Medusa's first layers'): added to the unpadded output."""
    g = torch.Generator().manual_seed(1)
    W, b = torch.randn(100, 33, generator=g).to(torch.bfloat16), torch.randn(100, generator=g).to(torch.bfloat16)
    x = torch.randn(3, 33, generator=g).to(torch.bfloat16)
    y = kernels.Packed(W, b)(x)
    assert y.shape == (3, 100) and torch.equal(y, kernels.Packed(W)(x) + b)
    assert _bf16_close(y, x.float() @ W.float().t() + b.float())


@pytest.fixture(scope="module", params=[(128, 4, 2), (192, 6, 3)], ids=["kv2", "kv3"])
def llama(request):
    """kv3: an odd number of key/value heads, as SmolLM2's 3, so that attention's items do not
    divide between two threads and one item's scores are computed by the other thread."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    C, H, Hkv = request.param
    cfg = LlamaConfig(vocab_size=512, hidden_size=C, intermediate_size=320, num_hidden_layers=3,
                      num_attention_heads=H, num_key_value_heads=Hkv, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def test_fused_layers_agree_with_the_torch_op_layers(llama):
    from speclab.models.lean.forward import LeanLM
    fused, ops = LeanLM(llama), LeanLM(llama)
    ops.fused = False
    assert fused.fused and fused.layout == "packed"
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1))
    a, b = fused.forward(ids), ops.forward(ids)
    with torch.inference_mode():
        ref = llama(ids[None]).logits[0].float()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9
    assert (a - b).abs().mean() < 0.05 and (a - ref).abs().mean() < 0.05


def test_fused_verify_is_bitwise_one_token_forwards_for_chains_and_trees(llama, loop):
    from speclab.models.lean.forward import LeanLM
    lm = LeanLM(llama)
    ids = torch.randint(0, 512, (20,), generator=torch.Generator().manual_seed(2))
    cont = [5, 77, 300, 12, 9, 41, 8, 250, 3, 19, 400, 66, 7, 180, 2, 90, 501, 33]   # 18: three groups of AMX rows
    one = [lm.forward(ids)[-1]] + [lm.forward(torch.tensor([t]))[-1] for t in cont]   # ar, token by token
    lm.keep(len(ids))
    chain = lm.forward(torch.tensor(cont))
    assert all(torch.equal(chain[r], one[r + 1]) for r in range(len(cont)))
    lm.keep(len(ids))
    # a tree: 0 -> 1 -> 3 is the chain cont[:3]; node 2 is a sibling of node 1
    tree = lm.forward(torch.tensor([cont[0], cont[1], 400, cont[2]]), parents=[-1, 0, 0, 1])
    assert torch.equal(tree[0], one[1]) and torch.equal(tree[1], one[2]) and torch.equal(tree[3], one[3])
    assert not torch.equal(tree[2], one[2])


def test_speclab_kernels_0_falls_back_to_f_linear():
    import os
    import subprocess
    import sys
    code = ("import torch; from transformers import LlamaConfig, LlamaForCausalLM; "
            "from speclab.models import kernels; from speclab.models.lean.forward import LeanLM; "
            "m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, "
            "num_hidden_layers=1, num_attention_heads=2)).to(torch.bfloat16); f = LeanLM(m); "
            "assert not kernels.available('cpu', torch.bfloat16) and f.layout == 'out_in' and not f.fused; "
            "print(f.forward(torch.tensor([1, 2, 3])).shape)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SPECLAB_KERNELS="0"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "torch.Size([3, 64])" in out.stdout and "building" not in out.stderr


def test_stream_read_reads_every_byte():
    """The bench's bandwidth probe: the OR of all the buffer's 64-bit words, so nothing is skipped."""
    buf = torch.zeros(1 << 20, dtype=torch.int64)
    assert kernels.module().stream_read(buf) == 0
    buf[-1] = 12345
    assert kernels.module().stream_read(buf) == 12345
    buf[7] = 1 << 40
    assert kernels.module().stream_read(buf) == 12345 + (1 << 40)
