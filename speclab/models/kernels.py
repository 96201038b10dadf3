"""speclab's one native kernel (bf16_linear.cpp): bf16 products and whole Llama layers, on every x86
CPU with AVX2, one build per instruction set.

Batch-1 decoding is bound by how fast weights stream from memory. oneDNN's bf16 F.linear reads a
one-row product's weight well below a plain streaming read's rate and pays a per-call cost on small
matrices (and without AVX512-BF16 it converts whole blocks to fp32: a 6-row verify costs about three
one-row forwards); this kernel streams a packed weight at the streaming-read rate and costs little
more for 5 rows than for 1 (docs/performance.md has the measured rates).

The path (`path()`), best first, chosen once per process from the CPU's flags:

    amx          AMX tiles (Sapphire Rapids on): a verify of up to 16 rows costs about one row
    avx512bf16   VDPBF16PS, the pair of bf16 products in one instruction
    avx512       AVX-512F without BF16 (Skylake to Ice Lake): two FMAs a pair
    avx2         AVX2 + FMA (most laptops and desktops, AMD Zen): the same on 8-lane halves
    torch        anything else (ARM, no compiler): torch's F.linear and ops

avx512bf16, avx512 and avx2 compute the same sums in the same order, so they give the same bits; AMX
sums in its own order (a few outputs one bf16 step apart). SPECLAB_ISA forces a path ("auto", the
default, or one of the names above; a path this CPU cannot run is refused in one line);
SPECLAB_KERNELS=0 is SPECLAB_ISA=torch, SPECLAB_AMX=0 keeps AMX off under auto. Each path is built on
first use with torch's C++ extension loader (g++ and ninja, once, cached in torch's extensions
directory as speclab_kernel_<path>); if the build fails the process falls back to torch with a
warning. `info()` (and `speclab doctor`) says which path runs and why. `using(path)` switches the
process to another path for a with-block (tests and measurements).

How the kernel's threads wait for each other (between the steps of a layer): each spins for a
bounded time, then sleeps in the kernel until the last thread wakes it, so that when the machine is
busy (a browser on the same cores, another process) a descheduled thread gets a free core at once
instead of a time slice later. SPECLAB_BARRIER=spin keeps the spin-then-yield loop (for measuring
the two: scripts/busy_bench.py), SPECLAB_SPIN_US the spin before sleeping (default 50 us);
`set_barrier` changes both in a running process. The outputs are the same bits either way.

How many threads share a forward (`TeamSize`): beside a one-core hog on a 2-core machine a team
of two waits for its descheduled member at every barrier, so one thread beats two there, while on
a quiet machine two beat one (BENCHMARKS.md, Busy machine). So each lean model (one
LeanLM, its own TeamSize) chooses from the load: now and then it runs a few forwards at its team
size and at the sizes next to it, interleaved, and keeps the fastest by median. SPECLAB_THREADS
fixes the size (a number) or leaves the choice to the load ("auto", the default); the size is
torch's thread count (torch.set_num_threads) during the model's forwards, torch's own count
restored after each. Every row is computed by the same arithmetic whichever thread computes it,
so the outputs are the same bits at any team size (tests/test_kernel_barrier.py).
"""
from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

BLOCK = 64                    # output rows per packed block (bf16_linear.cpp's B)
_SOURCE = Path(__file__).with_name("bf16_linear.cpp")
_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]   # no contraction: every path rounds where the source says
# path -> (the CPU flags it needs, torch.cpu.get_capabilities' names; the build it runs; its compiler flags)
ISAS = {
    "amx": (("avx512_f", "avx512_bw", "avx512_bf16", "amx_bf16", "amx_tile"), "avx512bf16", None),
    "avx512bf16": (("avx512_f", "avx512_bw", "avx512_bf16"), "avx512bf16", ["-mavx512f", "-mavx512bw", "-mavx512bf16"]),
    "avx512": (("avx512_f", "avx512_bw"), "avx512", ["-mavx512f", "-mavx512bw"]),
    "avx2": (("avx2", "fma3"), "avx2", ["-mavx2", "-mfma"]),
}
PATHS = tuple(ISAS) + ("torch",)
_lock = threading.RLock()
_modules: dict[str, object] = {}   # build -> its extension, or False once its build failed
_module = None                # the process's path's extension, False where none runs
_amx = False                  # its products run on AMX tiles
_path: str | None = None      # the path running ("torch" where no kernel does)
_why = ""                     # why that path
BARRIERS = {"sleep": 0, "spin": 1}  # bf16_linear.cpp's BARRIER_SLEEP / BARRIER_SPIN
SPIN_US = 50                  # a step's threads normally meet within microseconds; past this, sleep


def _caps() -> dict:
    return torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}


def cpu_has_bf16() -> bool:
    """The CPU has the AVX512-BF16 instructions (torch's own report)."""
    return bool(_caps().get("avx512_bf16"))


def supported() -> list[str]:
    """The kernel paths this CPU can run, best first (x86 only: ARM has none yet)."""
    caps = _caps()
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return []
    return [p for p, (need, _, _) in ISAS.items() if all(caps.get(f) for f in need)]


def paths_asked(text: str | None) -> list[str]:
    """A comma list of kernel paths (measurement scripts' --paths), each checked against this CPU;
    None: every path it runs but AMX (whose bits differ). ValueError naming the ones it cannot run."""
    ok = supported()
    paths = [p.strip() for p in text.split(",") if p.strip()] if text else [p for p in ok if p != "amx"]
    bad = [p for p in paths if p not in ok]
    if bad or not paths:
        raise ValueError(f"this CPU cannot run {', '.join(bad) or 'a kernel path'} (it runs {', '.join(ok) or 'none'})")
    return paths


def requested() -> str:
    """SPECLAB_ISA (or SPECLAB_KERNELS=0: "torch"), checked: "auto" or a path name."""
    if os.environ.get("SPECLAB_KERNELS", "1") == "0":
        return "torch"
    want = os.environ.get("SPECLAB_ISA", "auto").strip().lower() or "auto"
    if want not in PATHS + ("auto",):
        raise ValueError(f"SPECLAB_ISA={want!r}: use auto (the default) or one of {', '.join(PATHS)}")
    return want


def planned() -> tuple[str, str]:
    """(path, why): the path this process will run, from the CPU's flags and the environment alone
    (no build: a failed build still falls back to torch, with a warning)."""
    want, ok = requested(), supported()
    if want == "torch":
        return "torch", "turned off (SPECLAB_ISA=torch or SPECLAB_KERNELS=0)"
    if want != "auto":
        if want not in ok:
            raise ValueError(f"SPECLAB_ISA={want}: this CPU cannot run it (it runs: {', '.join(ok) or 'none'}); "
                             "use auto or one of those")
        return want, "forced (SPECLAB_ISA)"
    if not ok:
        return "torch", f"no kernel path for this CPU ({platform.machine()}: torch's ops run instead)"
    if ok[0] == "amx" and os.environ.get("SPECLAB_AMX", "1") == "0":
        ok = ok[1:]
        return ok[0], "the best this CPU runs (AMX off: SPECLAB_AMX=0)"
    return ok[0], "the best this CPU runs"


def _build(build: str):
    from torch.utils.cpp_extension import _get_build_directory, load
    # torch finds ninja on PATH: add this interpreter's bin directory, where `pip install ninja` puts it
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    name = f"speclab_kernel_{build}"
    if not list(Path(_get_build_directory(name, False)).glob("*.so")):
        print(f"speclab: building the CPU kernel for {build} (once, ~20 s)", file=sys.stderr, flush=True)
    flags = next(f for _, b, f in ISAS.values() if b == build and f)
    return load(name, [str(_SOURCE)], verbose=False, extra_cflags=_FLAGS + flags)


def build(path: str):
    """The extension of `path`'s build (built once per process), or None if it did not build."""
    b = ISAS[path][1]
    if b not in _modules:
        with _lock:
            if b not in _modules:
                try:
                    _modules[b] = _build(b)
                    _configure_barrier(_modules[b])
                except ValueError:
                    raise
                except Exception as e:     # no compiler, no ninja, an old toolchain: fall back
                    warnings.warn(f"speclab's CPU kernel ({b}) did not build ({str(e).splitlines()[0][:200]}); "
                                  "using torch's ops (slower). Install g++ and ninja to get it.")
                    _modules[b] = False
    return _modules[b] or None


def _select(path: str):
    """Make `path` the process's path; returns its module (None: torch)."""
    global _module, _amx, _path
    mod = build(path) if path != "torch" else None
    # AMX: chosen once per process: every product of a run must take the same loop, or a verify
    # would not match one-token forwards
    _amx = bool(mod.use_amx(path == "amx")) if mod is not None and ISAS[path][1] == "avx512bf16" else False
    if path == "amx" and not _amx:            # the OS did not grant the tiles: the loops
        path = "avx512bf16"
    _module, _path = (mod or False), (path if mod is not None else "torch")
    return mod


def module():
    """The built extension of this process's path, or None where none runs here."""
    global _why
    if _module is None:
        with _lock:
            if _module is None:
                path, why = planned()
                # under auto a path that does not build (an old compiler without -mavx512bf16) falls
                # back to the next one this CPU runs, and past the last to torch's ops
                tries = supported()[supported().index(path):] if path != "torch" and requested() == "auto" else [path]
                for p in tries:
                    if _select(p) is not None or p == "torch":     # torch: the choice made, once
                        break
                    why = f"{p} did not build (a warning said why)"
                else:
                    _select("torch")
                    why += ": torch's ops run instead" if path != "torch" else ""
                if _path not in (path, "torch") and path != "amx":
                    why += f": {_path} runs instead"
                elif path == "amx" and _path != "amx":
                    why = "AMX not granted by the OS: the AVX512-BF16 loops" if _path == "avx512bf16" else why
                _why = why
    return _module or None


def path() -> str:
    """The path this process runs: amx, avx512bf16, avx512, avx2 or torch."""
    module()
    return _path or "torch"


@contextmanager
def using(name: str):
    """Run the with-block on kernel path `name` (one the CPU supports), then restore the process's
    path. For tests and measurements: the path is the process's, not a thread's. Models loaded on a
    kernel path run on any other (one packed layout); "torch" is a process's choice (SPECLAB_ISA),
    made before its models load."""
    global _why
    if name not in supported():
        raise ValueError(f"kernel path {name!r}: this CPU runs {', '.join(supported()) or 'none'}")
    module()
    before, why = _path, _why
    try:
        if _select(name) is None:
            raise RuntimeError(f"the {name} kernel did not build")
        _why = "forced (kernels.using)"
        yield _module or None
    finally:
        _select(before)
        _why = why


def advice(path: str) -> str | None:
    """What a decoding method should know of a path's verify costs (speclab doctor says it), or None."""
    if path == "avx2":
        return ("a verify's extra rows are arithmetic here (an AVX2 FMA does 8 multiply-adds, VDPBF16PS 32): a 6-row "
                "verify costs 1.5-1.75 one-row forwards, so short drafts win; prompt-lookup[k=auto] and "
                "eagle[budget=auto] size each draft to this machine's measured costs (docs/performance.md)")
    if path == "torch":
        return ("no kernel path: bf16 runs torch's F.linear, a verify of several rows costing several one-row "
                "forwards (docs/performance.md)")
    return None


def info() -> dict:
    """What runs here and why: the path, the CPU's flags that decide it, the paths it supports, the
    compiler, and which builds are cached (for `speclab doctor`, the bench header, the dashboard)."""
    from torch.utils.cpp_extension import _get_build_directory
    caps = _caps()
    try:
        planned_path, why = planned()
    except ValueError as e:
        planned_path, why = "torch", str(e)
    cached = {}
    for b in sorted({b for _, b, _ in ISAS.values()}):
        try:
            cached[b] = bool(list(Path(_get_build_directory(f"speclab_kernel_{b}", False)).glob("*.so")))
        except Exception:
            cached[b] = False
    running = _path if _module is not None else None
    return {
        "path": running or planned_path, "why": _why if running else why, "built": running is not None,
        "cpu": caps.get("cpu_name") or platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "flags": {f: bool(caps.get(f)) for f in ("avx2", "fma3", "avx512_f", "avx512_bw", "avx512_bf16", "amx_bf16")},
        "supported": supported(), "cached": cached,
        "compiler": shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++"),
        "ninja": shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent)),
        "env": {k: os.environ[k] for k in ("SPECLAB_ISA", "SPECLAB_KERNELS", "SPECLAB_AMX") if k in os.environ},
        "advice": advice(running or planned_path),
    }


def self_check() -> str:
    """A product on this process's path against torch's fp32 product, and each row alone against the
    rows together: "ok (...)" or what failed. For `speclab doctor --build`."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(320, 576, generator=g).to(torch.bfloat16)
    x = torch.randn(7, 576, generator=g).to(torch.bfloat16)
    lin = Packed(W)
    y = lin(x).float()
    ref = x.float() @ W.float().t()
    err = float(((y - ref).abs() / (ref.abs() + 1e-2)).max())
    rows = all(torch.equal(lin(x[t:t + 1]).float(), y[t:t + 1]) for t in range(len(x)))
    if err > 2 ** -7 or not rows:
        return f"FAILED: relative error {err:.2g} (bf16 allows {2 ** -7:.2g}); rows alone equal rows together: {rows}"
    return f"ok (a 7-row product within bf16 rounding of torch's fp32 one, max relative error {err:.1g}; each row alone bit for bit the same)"


def describe() -> str:
    """One line: the path and why (the bench header, `speclab run --check`, the dashboard)."""
    d = info()
    return f"kernel {d['path']} ({d['why']}; CPU {d['cpu']})"


_barrier: tuple[str, int] | None = None   # set_barrier's last setting (None: the environment's)


def _configure_barrier(mod) -> None:
    mode, spin = _barrier or (os.environ.get("SPECLAB_BARRIER", "sleep"), int(os.environ.get("SPECLAB_SPIN_US", SPIN_US)))
    if mode not in BARRIERS:
        raise ValueError(f"SPECLAB_BARRIER={mode!r}: use 'sleep' (spin, then sleep: the default) or 'spin'")
    mod.set_barrier(BARRIERS[mode], spin)


def set_barrier(mode: str = "sleep", spin_us: int = SPIN_US) -> None:
    """How the kernel's threads wait at a step's barrier, for the whole process: "sleep" (spin up to
    spin_us, then sleep until woken) or "spin" (spin, then yield in a loop). Outputs do not change."""
    global _barrier
    if mode not in BARRIERS:
        raise ValueError(f"barrier mode {mode!r}: use 'sleep' or 'spin'")
    _barrier = (mode, int(spin_us))
    for mod in list(_modules.values()):      # every build in this process, and any built later
        if mod:
            mod.set_barrier(BARRIERS[mode], int(spin_us))


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


# -- the team size ---------------------------------------------------------------------------------
# torch's thread count is a thread's own once the thread has run torch's parallel code (OpenMP keeps
# it per thread; set_num_threads also sets the default that new threads start from). So each Python
# thread keeps its own: its first forward in remembers the caller's count and its last one out
# restores it, and a decode in another thread (another dashboard session's) never reads this one's
# team size as the count to restore.
_outer = threading.local()


def threads_setting(value: str | int | None = None) -> int | None:
    """SPECLAB_THREADS (or value) -> None for "auto" (choose from the load), or a fixed thread count."""
    v = os.environ.get("SPECLAB_THREADS", "auto") if value is None else value
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"SPECLAB_THREADS={v!r}: use 'auto' (the team size chosen from the load, the default) "
                         "or a number of threads such as 1")
    return n


class TeamSize:
    """The thread count of one model's kernel forwards: fixed, or chosen from the load ("auto").

    Auto: the first decode-sized forward (at most `max_rows` rows) starts a probe, and so does every
    `every`-th one after, or, above one thread, a run of slow ones (`slow` of the last 16 at over
    `slow_factor` x the median the last probe measured for their kind: a load has come). A probe
    runs the next forwards at the current size and at its neighbours (one thread fewer, one more,
    within 1..torch's thread count), taking turns within each kind of forward (`key`: rows, layers,
    logits kept), until one kind has `probes` forwards at every size, and keeps the size with the
    fastest median; a neighbour must beat the current size by `margin` to replace it. The probe's
    forwards are the model's own (no extra forward runs) and are compared only with forwards of the
    same kind: a draft loop whose forwards alternate between kinds still compares like with like.
    Prefills (more rows) run at the current size and are not timed.
    """

    def __init__(self, setting: str | int | None = None, every: int = 200, probes: int = 4, max_rows: int = 16,
                 margin: float = 0.05, slow_factor: float = 1.5, slow: int = 4):
        self.fixed = threads_setting(setting)
        self.every, self.probes, self.max_rows = every, probes, max_rows
        self.margin, self.slow_factor, self.slow = margin, slow_factor, slow
        self.size: int | None = None           # the chosen size (None: torch's count, until a probe)
        self.probes_run = 0                    # probes finished
        self.used: dict[int, int] = {}         # forwards run per size
        self.last: int | None = None           # the size of the last forward
        self._since = every                    # decode forwards since the last probe (so one starts first)
        self._trial: list[int] = []            # the sizes a running probe takes turns between
        self._turn = 0
        self._samples: dict[int, dict] = {}    # size -> key -> seconds, during a probe
        self._ref: dict = {}                   # key -> the chosen size's median in the last probe
        self._recent: list[bool] = []          # the last 16 timed forwards: slower than their reference?

    def __repr__(self) -> str:
        return f"TeamSize({'auto' if self.fixed is None else self.fixed}, size={self.size}, probes={self.probes_run})"

    @contextmanager
    def forward(self, key, rows: int):
        """Run one forward (the with-block) at this model's team size; `key`: forwards with equal
        keys cost the same (rows, layers, logits kept); rows: the forward's row count."""
        if not getattr(_outer, "active", 0):
            _outer.active, _outer.threads = 0, torch.get_num_threads()
        _outer.active += 1
        top = _outer.threads
        n = self._pick(top, rows, key)
        torch.set_num_threads(n)                # this thread's count: the kernel reads it once per call
        t0 = time.perf_counter()
        try:
            yield n
            dt = time.perf_counter() - t0
        finally:
            _outer.active -= 1
            if not _outer.active:
                torch.set_num_threads(top)
        self.last, self.used[n] = n, self.used.get(n, 0) + 1
        if self.fixed is None and rows <= self.max_rows:
            self._record(n, key, dt)

    def _pick(self, top: int, rows: int, key=None) -> int:
        if self.fixed is not None:
            return self.fixed
        size = min(self.size or top, top)
        if rows > self.max_rows or top < 2:
            return size
        # slow forwards at one thread mean a busier machine, where more threads would not help
        if not self._trial and (self._since >= self.every or (size > 1 and self._slow_run())):
            self._trial = [s for s in (size, size - 1, size + 1) if 1 <= s <= top]
            self._turn, self._samples = 0, {s: {} for s in self._trial}
        if self._trial:                        # the size with the fewest forwards of this kind so far
            self._turn += 1
            return min(self._trial, key=lambda s: len(self._samples[s].get(key, ())))
        return size

    def _slow_run(self) -> bool:
        return len(self._recent) >= 8 and sum(self._recent) >= self.slow

    def _record(self, n: int, key, dt: float) -> None:
        if not self._trial:
            self._since += 1
            ref = self._ref.get(key)
            if ref is not None:
                self._recent = (self._recent + [dt > self.slow_factor * ref])[-16:]
            return
        self._samples[n].setdefault(key, []).append(dt)
        if min(len(self._samples[s].get(key, ())) for s in self._trial) >= self.probes \
                or self._turn >= 4 * self.probes * len(self._trial):
            self._decide()

    def _decide(self) -> None:
        """The probe's verdict: per size, the median over kinds seen at every size of (its time /
        the kind's median over all sizes); the current size unless another is faster by the margin."""
        current = self._trial[0]
        keys = [k for k in self._samples[current] if all(k in self._samples[s] for s in self._trial)]
        if not keys:                              # no kind ran at every size: keep the size
            self._end(current)
            return
        ref = {k: statistics.median([t for s in self._trial for t in self._samples[s][k]]) for k in keys}
        score = {s: statistics.median([t / ref[k] for k in keys for t in self._samples[s][k]]) for s in self._trial}
        best = min(self._trial, key=score.get)
        self._end(best if score[best] < (1 - self.margin) * score[current] else current)

    def _end(self, size: int) -> None:
        self._ref = {k: statistics.median(v) for k, v in self._samples.get(size, {}).items()}
        self.size, self._trial, self._samples = size, [], {}
        self._since, self._recent = 0, []
        self.probes_run += 1


def on_team(team: TeamSize | None, key, rows: int):
    """The with-block of one forward at `team`'s size; None (a forward off the kernel, whose bits
    may depend on the thread count): torch's own count, untouched."""
    return nullcontext() if team is None else team.forward(key, rows)
