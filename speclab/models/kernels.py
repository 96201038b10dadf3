"""speclab's one native kernel: a bf16 linear layer for CPUs with AVX512-BF16 (bf16_linear.cpp).

Batch-1 decoding is bound by how fast weights stream from memory. Measured on the 2-core CPU
(torch 2.13, one thread): oneDNN's bf16 F.linear reads SmolLM2's LM head at 10-16 GB/s and its small
layer matrices at ~20-30 GB/s, while this kernel streams the head at ~36 GB/s (a plain streaming
read's rate) and the small matrices 3-4x faster, and costs little more for 5 rows than for 1.

It is built on first use with torch's C++ extension loader (g++ and ninja, ~30 s once, cached in
torch's extensions directory) and used only on CPUs that report avx512_bf16. Anywhere else, or if
the build fails, `available()` is False and the lean forward keeps F.linear. SPECLAB_KERNELS=0 turns
it off.

On CPUs with AMX (Intel Sapphire Rapids and later) the product runs on AMX tiles instead: the
AVX-512 loop is bound by its dot-product instructions from 2 rows on (one thread, a 3072 x 576
matrix in cache: 6 rows 1.9x one row, 16 rows 5x), the tiles are not (1.0x, 1.5x). A whole SmolLM2
forward of 16 tokens then costs ~1.3-1.8x one token instead of ~3x. Attention's scores and weighted
sum of V run on the tiles too (a 12-token verify after 1,500 tokens: 16.0 -> 10.7 ms). SPECLAB_AMX=0
keeps the loops.

How the kernel's threads wait for each other (between the steps of a layer): each spins for a
bounded time, then sleeps in the kernel until the last thread wakes it, so that when the machine is
busy (a browser on the same cores, another process) a descheduled thread gets a free core at once
instead of a time slice later. SPECLAB_BARRIER=spin keeps the spin-then-yield loop (for measuring
the two: scripts/busy_bench.py), SPECLAB_SPIN_US the spin before sleeping (default 50 us);
`set_barrier` changes both in a running process. The outputs are the same bits either way.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

BLOCK = 64                    # output rows per packed block (bf16_linear.cpp's B)
NAME = "speclab_bf16_linear"
_SOURCE = Path(__file__).with_name("bf16_linear.cpp")
_lock = threading.Lock()
_module = None                # the built extension, False once a build failed
_amx = False                  # its products run on AMX tiles (chosen once, when it is built)
BARRIERS = {"sleep": 0, "spin": 1}  # bf16_linear.cpp's BARRIER_SLEEP / BARRIER_SPIN
SPIN_US = 50                  # a step's threads normally meet within microseconds; past this, sleep


def _caps() -> dict:
    return torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}


def cpu_has_bf16() -> bool:
    """The CPU has the AVX512-BF16 instructions the kernel is written in (torch's own report)."""
    return bool(_caps().get("avx512_bf16"))


def _build():
    from torch.utils.cpp_extension import load
    # torch finds ninja on PATH: add this interpreter's bin directory, where `pip install ninja` puts it
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    from torch.utils.cpp_extension import _get_build_directory
    if not list(Path(_get_build_directory(NAME, False)).glob("*.so")):
        print("speclab: building the bf16 CPU kernel (once, ~30 s)", file=sys.stderr, flush=True)
    return load(NAME, [str(_SOURCE)], verbose=False,
                extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-fopenmp"])


def module():
    """The built extension, or None where it cannot run here."""
    global _module, _amx
    if _module is None:
        with _lock:
            if _module is None:
                if os.environ.get("SPECLAB_KERNELS", "1") == "0" or not cpu_has_bf16():
                    _module = False
                else:
                    try:
                        _module = _build()
                        # AMX tiles where the CPU has them (Sapphire Rapids on): a verify of up to 16
                        # rows then costs about one row. Chosen once per process: every product of a
                        # run must take the same loop, or a verify would not match one-token forwards.
                        amx = bool(_caps().get("amx_bf16")) and os.environ.get("SPECLAB_AMX", "1") != "0"
                        _amx = _module.use_amx(amx)
                        _configure_barrier(_module)
                    except Exception as e:     # no compiler, no ninja, an old toolchain: fall back
                        warnings.warn(f"speclab's bf16 CPU kernel did not build ({str(e).splitlines()[0][:200]}); "
                                      "using F.linear (slower). Install g++ and ninja to get it.")
                        _module = False
    return _module or None


def _configure_barrier(mod) -> None:
    mode = os.environ.get("SPECLAB_BARRIER", "sleep")
    if mode not in BARRIERS:
        raise ValueError(f"SPECLAB_BARRIER={mode!r}: use 'sleep' (spin, then sleep: the default) or 'spin'")
    mod.set_barrier(BARRIERS[mode], int(os.environ.get("SPECLAB_SPIN_US", SPIN_US)))


def set_barrier(mode: str = "sleep", spin_us: int = SPIN_US) -> None:
    """How the kernel's threads wait at a step's barrier, for the whole process: "sleep" (spin up to
    spin_us, then sleep until woken) or "spin" (spin, then yield in a loop). Outputs do not change."""
    if mode not in BARRIERS:
        raise ValueError(f"barrier mode {mode!r}: use 'sleep' or 'spin'")
    if module() is not None:
        module().set_barrier(BARRIERS[mode], int(spin_us))


def uses_amx() -> bool:
    """The kernel's products run on AMX tiles in this process."""
    return module() is not None and _amx


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return torch.device(device).type == "cpu" and dtype == torch.bfloat16 and module() is not None


class Packed:
    """A weight (N, K) in the kernel's layout; N padded up to a multiple of 64, K to even; with an
    optional bias (N,) added to the bf16 output (as nn.Linear adds it)."""

    def __init__(self, W: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features = W.shape[0]
        self.bias = None if bias is None else bias.detach()
        pad_n, pad_k = -W.shape[0] % BLOCK, W.shape[1] % 2
        self.padded = bool(pad_n or pad_k)
        if self.padded:
            W = F.pad(W, (0, pad_k, 0, pad_n))
        self.in_features = W.shape[1]
        self.data = module().pack(W)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, K) bf16 -> (T, N)."""
        if x.shape[1] != self.in_features:
            x = F.pad(x, (0, self.in_features - x.shape[1]))
        y = module().linear(x.contiguous(), self.data)
        y = y if y.shape[1] == self.out_features else y[:, : self.out_features]
        return y if self.bias is None else y + self.bias
