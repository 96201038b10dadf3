"""The native kernel's threads wait for each other at every step of a layer: spinning, or spinning
briefly then sleeping (futex). How they wait must never change a bit of the output, and a sleeping
waiter must always be woken (a lost wake-up would hang the forward). How many threads share a
forward (kernels.TeamSize: fixed by SPECLAB_THREADS or chosen from the load) must not change a bit
either."""
from __future__ import annotations

import pytest
import torch

from speclab.models import kernels

pytestmark = pytest.mark.skipif(not kernels.available("cpu", torch.bfloat16),
                                reason="needs an x86 CPU with AVX2 and the built kernel")


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


def _tiny(kv: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64 * kv, intermediate_size=320, num_hidden_layers=3,
                      num_attention_heads=2 * kv, num_key_value_heads=kv, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def _decode(lm, ids, rounds: int = 4) -> list:
    """A prefill, then one-row, 6-row verify, tree and row-batch forwards, as decoding runs them."""
    out = []
    for _ in range(rounds):
        lm.keep(0)
        out.append(lm.forward(ids))
        out += [lm.forward(ids[i:i + 1]) for i in range(3)]
        out.append(lm.forward(ids[3:9]))
        out.append(lm.forward(ids[9:13], parents=[-1, 0, 0, 1]))
        n = lm.length
        vis = torch.ones(3, n + 3, dtype=torch.bool).tril(n)
        out.append(lm.forward_rows(ids[13:16], torch.arange(n, n + 3), vis))
    return out


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)                    # a team of two even on a one-core runner
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def kernel_threads(monkeypatch):
    """The thread count torch reports at each of the kernel's layer calls (the count it runs on)."""
    mod, seen = kernels.module(), []
    real = mod.layers

    def layers(*a):
        seen.append(torch.get_num_threads())
        return real(*a)
    monkeypatch.setattr(mod, "layers", layers)
    return seen


@pytest.mark.parametrize("kv", [2, 3], ids=["kv2", "kv3"])
def test_team_sizes_give_bitwise_the_same_forwards(kv, two_threads, kernel_threads):
    lm = _lean()(_tiny(kv))
    assert lm.fused
    ids = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(1))
    out = {}
    # auto with a probe every 3 decode forwards: the team changes size between forwards of one run
    for setting in ("2", "1", kernels.TeamSize("auto", every=3, probes=1)):
        lm.team = setting if isinstance(setting, kernels.TeamSize) else kernels.TeamSize(setting)
        kernel_threads.clear()
        out[str(setting)] = _decode(lm, ids)
        if setting in ("1", "2"):
            assert set(kernel_threads) == {int(setting)}
        else:
            assert set(kernel_threads) == {1, 2}
    ref = out["2"]
    for key, rows in out.items():
        assert len(rows) == len(ref)
        assert all(torch.equal(a, b) for a, b in zip(rows, ref)), key


def test_auto_team_probes_both_sizes_and_restores_torchs_count(two_threads, kernel_threads):
    lm = _lean()(_tiny())
    lm.team = kernels.TeamSize("auto", every=10, probes=2)
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(2))
    lm.keep(0)
    lm.forward(ids[:8])
    for i in range(8, 40):
        lm.forward(ids[i:i + 1])
        assert torch.get_num_threads() == 2
    assert lm.team.probes_run >= 2              # the first decode forward and one after 10 more
    assert lm.team.used.get(1, 0) >= 2 and lm.team.used.get(2, 0) >= 2
    assert set(kernel_threads) == {1, 2}
    assert lm.team.size in (1, 2)


def test_overlapping_forwards_restore_the_callers_thread_count(two_threads):
    """Two decodes in two Python threads overlap their forwards: the one that ends last restores the
    count the process had, not the other's team size."""
    a = kernels.TeamSize("1").forward("one-row", 1)
    b = kernels.TeamSize("2").forward("one-row", 1)
    a.__enter__()
    assert torch.get_num_threads() == 1
    b.__enter__()
    assert torch.get_num_threads() == 2
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert torch.get_num_threads() == 2


def test_a_fixed_thread_count_is_honoured(monkeypatch, two_threads, kernel_threads):
    monkeypatch.setenv("SPECLAB_THREADS", "1")
    lm = _lean()(_tiny())
    assert lm.team.fixed == 1
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(3))
    lm.keep(0)
    lm.forward(ids[:20])
    for i in range(20, 40):
        lm.forward(ids[i:i + 1])
    assert set(kernel_threads) == {1} and lm.team.probes_run == 0
    assert torch.get_num_threads() == 2


def test_the_probe_keeps_the_size_with_the_faster_median():
    """The decision on given times (no clock): a kind that takes 16 ms at two threads and 8 at one
    moves the team to one thread; back at 9 ms against 7.8 it returns to two."""
    team = kernels.TeamSize("auto", every=20, probes=3)
    times = {2: 0.016, 1: 0.008}
    sizes = []
    for _ in range(6):                          # the first probe: turns between 2 and 1
        n = team._pick(2, 1, "one-row")
        sizes.append(n)
        team._record(n, "one-row", times[n])
    assert sorted(sizes) == [1, 1, 1, 2, 2, 2] and team.probes_run == 1 and team.size == 1
    times = {2: 0.0078, 1: 0.009}
    for _ in range(20 + 6):                     # quiet again: the next periodic probe goes back to two
        n = team._pick(2, 1, "one-row")
        team._record(n, "one-row", times[n])
    assert team.probes_run == 2 and team.size == 2
    # within the margin the current size stays
    times = {2: 0.0080, 1: 0.0079}
    for _ in range(20 + 6):
        n = team._pick(2, 1, "one-row")
        team._record(n, "one-row", times[n])
    assert team.probes_run == 3 and team.size == 2


def test_a_probe_times_each_kind_of_forward_at_every_size():
    """A draft loop alternates kinds (one row, then a verify): taking turns forward by forward
    would time each kind at one size only."""
    team = kernels.TeamSize("auto", every=100, probes=2)
    seen = {}
    while team.probes_run == 0:
        for key, ms in (("one-row", 8), ("verify-6", 9)):
            n = team._pick(2, 1, key)
            seen.setdefault(key, set()).add(n)
            team._record(n, key, ms * (2 if n == 2 else 1) / 1e3)
    assert seen == {"one-row": {1, 2}, "verify-6": {1, 2}} and team.size == 1


def test_a_run_of_slow_forwards_starts_a_probe_early():
    team = kernels.TeamSize("auto", every=1000, probes=2)
    for _ in range(4):
        n = team._pick(2, 1, "one-row")
        team._record(n, "one-row", {2: 0.008, 1: 0.010}[n])
    assert team.probes_run == 1 and team.size == 2
    for _ in range(8):                          # a hog arrives: two threads take twice as long
        assert team._pick(2, 1, "one-row") == 2
        team._record(2, "one-row", 0.017)
    team._pick(2, 1, "one-row")
    assert team._trial == [2, 1]                # a probe, long before 1,000 forwards
    while team._trial:                          # one thread wins it
        n = team._pick(2, 1, "one-row")
        team._record(n, "one-row", {2: 0.017, 1: 0.009}[n])
    assert team.size == 1 and team.probes_run == 2
    for _ in range(16):                         # slower still at one thread: a busier machine, no probe
        assert team._pick(2, 1, "one-row") == 1
        team._record(1, "one-row", 0.030)
    assert not team._trial


def test_threads_setting_refuses_what_is_not_a_count():
    assert kernels.threads_setting("auto") is None and kernels.threads_setting("3") == 3
    with pytest.raises(ValueError, match="use 'auto'"):
        kernels.threads_setting("0")
    with pytest.raises(ValueError, match="use 'auto'"):
        kernels.threads_setting("many")


def test_set_barrier_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="use 'sleep' or 'spin'"):
        kernels.set_barrier("busy")
