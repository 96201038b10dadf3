"""speclab's CPU kernel (speclab/models/bf16_linear.cpp): the packed linear layer and the fused
Llama layer, on random matrices and on a real transformers Llama built from a config, once for
EVERY path this CPU runs (amx, avx512bf16, avx512, avx2: kernels.supported()), each forced in turn.

What is pinned: each path's product is VDPBF16PS's arithmetic bit for bit (a torch reference of
its order of adds; AMX within a bf16 step of it); every row's result independent of how many rows
share the call (the property that makes a verify equal one-token forwards); the paths without AMX
give the same bits as each other, down to exp and the bf16 rounding at the edges (denormals, inf,
NaN); odd shapes padded; the fused layer close to the torch-op layer it replaces, and its verify of
a chain or a tree bitwise equal to one-token forwards. On an x86 CPU with AVX2 none of this skips:
a CPU that gets no kernel path fails test_an_x86_cpu_with_avx2_runs_a_kernel_path.
"""
import json
import platform

import pytest
import torch
import torch.nn.functional as F

from speclab.models import kernels

PATHS = kernels.supported()              # best first; empty off x86 (ARM keeps torch's ops)
pytestmark = pytest.mark.skipif(not PATHS, reason=f"no kernel path for a {platform.machine()} CPU")
LOOPS = [p for p in PATHS if p != "amx"]    # the paths that sum in VDPBF16PS's order


def _bf16_close(y, ref):
    """y (bf16) within one bf16 rounding of ref (fp32) plus fp32 summation error."""
    tol = ref.abs() * 2 ** -8 + 1e-3 * ref.abs().max()
    return bool(((y.float() - ref).abs() <= tol).all())


@pytest.fixture(autouse=True, scope="module")
def _on_a_kernel_path():
    """The kernel's own tests run on a kernel path even in a run that turned the kernel off for
    everything else (SPECLAB_KERNELS=0: the no-kernel suite), so they run, not skip, on every x86
    CPU with AVX2; the process's choice is restored after the module."""
    if kernels.requested() == "torch" and PATHS:
        with kernels.using(PATHS[0]):
            yield
    else:
        yield


@pytest.fixture(params=PATHS)
def path(request):
    """Each path this CPU runs in turn, the process's own restored after."""
    with kernels.using(request.param):
        yield request.param


def test_an_x86_cpu_with_avx2_runs_a_kernel_path():
    """Fails, not skips, where an x86 CPU with AVX2 and FMA gets no kernel (no compiler, a build
    error): every number speclab reports there would silently come from torch's slower ops. A run
    that turned the kernel off itself (SPECLAB_KERNELS=0, SPECLAB_ISA=torch: the no-kernel suite)
    is told so, once, by the skip below: that is the user's choice, not a missing path."""
    if kernels.requested() == "torch":
        pytest.skip("the kernel is turned off for this run (SPECLAB_KERNELS=0 or SPECLAB_ISA=torch)")
    caps = kernels._caps()
    assert caps.get("avx2") and caps.get("fma3"), "an x86 CPU without AVX2: speclab's kernel needs AVX2 and FMA"
    assert "avx2" in PATHS
    assert kernels.module() is not None, f"no kernel path runs on this CPU: {kernels.info()}"
    assert kernels.path() == kernels.planned()[0]
    assert kernels.module().isa() == kernels.ISAS[kernels.path()][1]


def test_speclab_isa_chooses_and_refuses_in_one_line(monkeypatch):
    monkeypatch.delenv("SPECLAB_KERNELS", raising=False)       # the choice itself is under test
    monkeypatch.setenv("SPECLAB_ISA", "avx2")
    assert kernels.planned() == ("avx2", "forced (SPECLAB_ISA)")
    monkeypatch.setenv("SPECLAB_ISA", "neon")
    with pytest.raises(ValueError, match="use auto .* or one of amx, avx512bf16, avx512, avx2, torch"):
        kernels.planned()
    missing = next((p for p in kernels.ISAS if p not in PATHS), None)
    if missing:                                  # a path this CPU lacks (amx on most)
        monkeypatch.setenv("SPECLAB_ISA", missing)
        with pytest.raises(ValueError, match="this CPU cannot run it"):
            kernels.planned()
    monkeypatch.setenv("SPECLAB_ISA", "torch")
    assert kernels.planned()[0] == "torch"
    monkeypatch.delenv("SPECLAB_ISA")
    assert kernels.planned() == (PATHS[0], "the best this CPU runs") or kernels.requested() != "auto"
    with pytest.raises(ValueError, match="this CPU runs"):
        with kernels.using("neon"):
            pass
    # the measurement scripts' --paths: every path but AMX by default, each one checked
    assert kernels.paths_asked(None) == [p for p in PATHS if p != "amx"]
    assert kernels.paths_asked(" avx2, ") == ["avx2"]
    with pytest.raises(ValueError, match="this CPU cannot run neon"):
        kernels.paths_asked("avx2,neon")


def test_a_path_that_does_not_build_falls_back_to_the_next():
    """Under auto, a build that fails (an old compiler without -mavx512bf16, say) warns and takes the
    next path this CPU runs; the last one failing leaves torch's ops."""
    import subprocess
    import sys
    code = ("import warnings; warnings.simplefilter('ignore'); from speclab.models import kernels\n"
            "real = kernels._build\n"
            "def broken(b):\n"
            "    if b != 'avx2': raise RuntimeError('no such compiler flag')\n"
            "    return real(b)\n"
            "kernels._build = broken\n"
            "print(kernels.path(), '|', kernels.info()['why'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in __import__("os").environ.items() if k not in ("SPECLAB_ISA", "SPECLAB_KERNELS")})
    assert out.returncode == 0, out.stderr[-2000:]
    path, why = out.stdout.strip().split(" | ")
    assert path == "avx2"
    assert ("did not build" in why and "avx2 runs instead" in why) or PATHS[0] == "avx2"


def _vdpbf16ps(x, W):
    """y = x @ W^T as VDPBF16PS sums it: per output, over k-pairs in order, add w[k+1] x[k+1] then
    w[k] x[k], each an fp32 add of an exact product; rounded to bf16 once (data with no denormals)."""
    if W.shape[1] % 2:                     # odd K: padded with a zero column, as Packed pads it
        x, W = F.pad(x, (0, 1)), F.pad(W, (0, 1))
    xf, Wf = x.float(), W.float()
    acc = torch.zeros(x.shape[0], W.shape[0])
    for k in range(0, W.shape[1], 2):
        acc = acc + xf[:, k + 1:k + 2] * Wf[:, k + 1][None]
        acc = acc + xf[:, k:k + 1] * Wf[:, k][None]
    return acc.to(torch.bfloat16)


@pytest.mark.parametrize("N,K", [(64, 32), (960, 576), (576, 1536), (100, 33), (128, 40)])
def test_packed_linear_is_vdpbf16ps_and_row_count_invariant(N, K, path):
    """17 rows: the AMX loop's passes are 16 rows, the AVX-512 loops' 6, AVX2's 3. Every path but
    AMX is VDPBF16PS bit for bit; AMX sums in the tiles' order, a few outputs a bf16 step apart (and
    K = 33 and 40 are not multiples of 32: those take the loop on an AMX setting too)."""
    g = torch.Generator().manual_seed(N + K)
    W = torch.randn(N, K, generator=g).to(torch.bfloat16)
    x = torch.randn(17, K, generator=g).to(torch.bfloat16)
    lin = kernels.Packed(W)
    y = lin(x)
    assert y.shape == (17, N) and y.dtype == torch.bfloat16
    assert _bf16_close(y, x.float() @ W.float().t())
    ref = _vdpbf16ps(x, W)
    if path == "amx" and K % 32 == 0:
        a, b = y.float(), ref.float()
        assert ((a - b).abs() <= a.abs() * 2 ** -7 + 1e-2).all() and (a != b).float().mean() < 0.01
    else:
        assert torch.equal(y, ref), f"{path}: {(y != ref).sum().item()} outputs differ from VDPBF16PS's sums"
    for t in range(17):                                    # one row alone == that row in the batch
        assert torch.equal(lin(x[t:t + 1]), y[t:t + 1])
    assert torch.equal(lin(x[2:9]), y[2:9]) and torch.equal(lin(x[1:17]), y[1:17])


# edges: zeros, denormals, infinities, NaN, exp's clamps, past a float's exponent, ties of the rounding
EDGES = [0., -0., 1e-40, -1e-40, float("inf"), -float("inf"), float("nan"), 88.7, 89., -103., -104., -200., 300.,
         1e-30, 3.4e38, -87., 1.00390625, 1.01171875, -1.00390625, 1.1754942e-38, -1.1754942e-38, 0.5, -0.5, 2.5]


def _edges():
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.tensor(EDGES), torch.randn(4096 - len(EDGES), generator=g) * 30])
    return x.contiguous()


def _rne_daz(x):
    """VCVTNEPS2BF16 in torch: round to nearest even; zero or denormal -> signed zero; NaN quiet."""
    u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = torch.where((u & 0x7F800000) == 0, (u >> 16) & 0x8000, r)
    r = torch.where((u & 0x7FFFFFFF) > 0x7F800000, ((u >> 16) | 0x40) & 0xFFFF, r)
    return r


def test_rounding_and_exp_are_the_same_bits_on_every_path():
    """The bf16 rounding is VCVTNEPS2BF16's on every path (AVX2 and AVX-512F do it in integers), and
    exp (softmax, SiLU) gives the same bits on every path, within a few ulp of torch's."""
    x = _edges()
    ref_exp = None
    for p in LOOPS:
        with kernels.using(p) as mod:
            got = mod.to_bf16(x).view(torch.int16).to(torch.int64) & 0xFFFF
            assert torch.equal(got, _rne_daz(x)), p
            e = mod.exp_f32(x)
            ref_exp = e if ref_exp is None else ref_exp
            assert torch.equal(e.view(torch.int32), ref_exp.view(torch.int32)), p
    fin = x.nan_to_num(0.0).clamp(-80, 80)
    with kernels.using(LOOPS[-1]) as mod:
        e, t = mod.exp_f32(fin).double(), torch.exp(fin.double())
    assert ((e - t).abs() / t <= 4e-7).all()
    assert ref_exp[4] == float("inf") and ref_exp[5] == 0 and ref_exp[10] == 0 < ref_exp[9]


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


@pytest.fixture(scope="module")
def reference_logits(llama):
    """ar's logits, token by token, on the plainest path (avx2): every path but AMX must match them."""
    from speclab.models.lean.forward import LeanLM
    with kernels.using(LOOPS[-1]):
        return _one_token_logits(LeanLM(llama))


IDS = torch.randint(0, 512, (20,), generator=torch.Generator().manual_seed(2))
CONT = [5, 77, 300, 12, 9, 41, 8, 250, 3, 19, 400, 66, 7, 180, 2, 90, 501, 33]   # 18: three groups of AMX rows


def _one_token_logits(lm):
    return [lm.forward(IDS)[-1]] + [lm.forward(torch.tensor([t]))[-1] for t in CONT]   # ar, token by token


def test_fused_verify_is_bitwise_one_token_forwards_for_chains_and_trees(llama, path, reference_logits):
    """On each path: a verify of a chain or a tree gives every row the bits of a one-token forward;
    and every path but AMX gives the plainest path's bits (a trace replays on any x86 CPU)."""
    from speclab.models.lean.forward import LeanLM
    lm = LeanLM(llama)
    ids, cont = IDS, CONT
    one = _one_token_logits(lm)
    if path != "amx":
        assert all(torch.equal(a, b) for a, b in zip(one, reference_logits)), path
    lm.keep(len(ids))
    chain = lm.forward(torch.tensor(cont))
    assert all(torch.equal(chain[r], one[r + 1]) for r in range(len(cont)))
    lm.keep(len(ids))
    # a tree: 0 -> 1 -> 3 is the chain cont[:3]; node 2 is a sibling of node 1
    tree = lm.forward(torch.tensor([cont[0], cont[1], 400, cont[2]]), parents=[-1, 0, 0, 1])
    assert torch.equal(tree[0], one[1]) and torch.equal(tree[1], one[2]) and torch.equal(tree[3], one[3])
    assert not torch.equal(tree[2], one[2])


@pytest.mark.parametrize("threads", [2, 4])
def test_a_prompts_rows_split_in_half_blocks_keep_one_token_bits(llama, path, reference_logits, threads):
    """More than 6 rows share a product's columns out in halves of 64-output blocks, so a block can
    be split between two threads (3 blocks on 2 threads, 2 on 4): every row of chains of 7 to 13
    (passes of 1 to 6 rows a half) still gets a one-token forward's bits, as does a tree's (its
    attention items shared out between the threads). Under `make test` a worker has one thread,
    so this test sets its own."""
    from speclab.models.lean.forward import LeanLM
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lm = LeanLM(llama)
        one = _one_token_logits(lm)                 # one row a forward: whole blocks
        if path != "amx":
            assert all(torch.equal(a, b) for a, b in zip(one, reference_logits)), path
        for T in (7, 8, 13):
            lm.keep(len(IDS))
            chain = lm.forward(torch.tensor(CONT[:T]))
            assert all(torch.equal(chain[r], one[r + 1]) for r in range(T)), (path, threads, T)
        lm.keep(len(IDS))                           # a tree's rows: attention's items split too
        tree = lm.forward(torch.tensor([CONT[0], CONT[1], 400, CONT[2]]), parents=[-1, 0, 0, 1])
        assert torch.equal(tree[0], one[1]) and torch.equal(tree[1], one[2]) and torch.equal(tree[3], one[3])
    finally:
        torch.set_num_threads(n)


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


def test_doctor_says_the_path_and_what_it_means_for_drafts(monkeypatch, capsys):
    """`speclab doctor` under a forced path: the path and why, and on AVX2 the advice to size drafts."""
    from speclab.cli import main
    monkeypatch.setenv("SPECLAB_ISA", "avx2")
    monkeypatch.setattr(kernels, "_module", None)            # nothing chosen yet in this process
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "kernel path: avx2 (forced (SPECLAB_ISA))" in out and "prompt-lookup[k=auto]" in out
    monkeypatch.setenv("SPECLAB_ISA", "torch")
    assert main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["path"] == "torch" and "F.linear" in d["advice"]
