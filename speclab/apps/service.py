"""RunService: what stands between the pages and `speclab.run`. A request in, a trace out.

    service = RunService()                        # workers and threads sized to the machine
    ticket = service.submit_run(request)          # request: runs.run_one's keywords (the form's)
    service.position(ticket)                      # 2 = second in line, 0 = running, None = done
    service.cancel(ticket)                        # a queued request whose page went away
    trace = ticket.future.result()

One service per server (`speclab serve` makes one; a Dashboard made without one shares
`default_service()`), and it owns what runs share, so no run changes it for another:
- **the workers**: `workers` threads (default `max(1, cores // threads_per_run)`), each pinned to
  `threads_per_run` torch threads. torch's thread count is per thread once a thread has used it
  (OpenMP), so a run that sets it (PEARL's one thread a lane, a kernel's team size) changes its own
  worker only, and the worker is set back before its next run. Process-wide flags (torch's default
  dtype, deterministic algorithms, matmul precision) cannot be kept apart between threads: they
  are read before each run and put back after it, and a run that changed one is named in
  `changed` (a method that does that is a bug to fix in the method).
- **the models**: the process's model cache (`zoo.load_shared`) is shared by every run, and a model
  runs one request at a time: some methods hook the shared model while they run (layer-skip's
  forward hooks, a feature head's `capture_layers`), so two runs on one model at once could see each
  other. A worker takes the first queued request whose models are free, so requests on other
  models go past a busy one rather than wait behind it.
- **the queue**: first in, first out; `position()` is a waiting request's place in it, which the page
  shows ("2nd in line"), and `cancel()` drops a request that has not started (its page closed).
- **the limits** (`Limits`): a request past one is refused in one line before it queues, so no
  request holds a worker for minutes (a `k=1000` from a URL held the only worker for 8 minutes);
  every other number is held to its bound in speclab.params.BOUNDS, as the API holds it.
"""
from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from speclab.params import check_bounds


@dataclass(frozen=True)
class Limits:
    """The largest request a server runs: a field per run parameter (None: no limit)."""
    max_new_tokens: int = 256
    gen_length: int = 256
    k: int = 16
    budget: int = 64
    prompt_chars: int = 8000

    def check(self, request: dict) -> None:
        """ValueError, in one line, for the first parameter past its limit."""
        prompt = request.get("prompt")
        if isinstance(prompt, str) and len(prompt) > self.prompt_chars:
            raise ValueError(f"the prompt is {len(prompt)} characters, over this server's limit of "
                             f"{self.prompt_chars}: shorten it")
        for name in ("max_new_tokens", "gen_length", "k", "budget"):
            value, limit = request.get(name), getattr(self, name)
            if value is None or limit is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value > limit:
                raise ValueError(f"{name}={value:g} is over this server's limit of {limit}: ask for {limit} or less")
        check_bounds(request.get("method") or "", {k: v for k, v in request.items() if k != "seed"})   # the rest


def machine_cores() -> int:
    """Cores this process may use (its affinity where the OS says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class Settings:
    """How the service runs its requests. threads_per_run: torch threads a run uses (default: every
    core below 4 cores, so one reader's runs are as fast as the machine allows and its timings are
    the machine's; from 4 cores, the cores shared by two runs, at most 4); workers: runs at once
    (default cores // threads_per_run). A class on a small machine trades speed for turns:
    `speclab serve --threads-per-run 1` runs one request a core."""
    threads_per_run: int | None = None
    workers: int | None = None
    limits: Limits = field(default_factory=Limits)

    def resolved(self) -> "Settings":
        cores = machine_cores()
        threads = self.threads_per_run or (cores if cores < 4 else min(4, cores // 2))
        workers = self.workers or max(1, cores // threads)
        if threads < 1 or workers < 1:
            raise ValueError(f"threads_per_run and workers must be at least 1, got {threads} and {workers}")
        return Settings(threads, workers, self.limits)


# the process-wide flags a run must leave as it found them: name -> (read, write)
PROCESS_FLAGS = {
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
}


@dataclass(eq=False)
class Ticket:
    """One request in the service: its future (the trace, or the run's exception), the models it
    runs on, and who asked (a session: `cancel_owner` drops its queued requests)."""
    id: int
    fn: object
    models: tuple[str, ...]
    owner: object = None
    future: Future = field(default_factory=Future)


class RunService:
    def __init__(self, settings: Settings | None = None):
        self.settings = (settings or Settings()).resolved()
        self.limits = self.settings.limits
        self.changed: list[str] = []             # "method: default dtype" for each flag a run changed
        self._cv = threading.Condition()
        self._waiting: list[Ticket] = []         # queued, oldest first
        self._busy: set[str] = set()             # models a running request holds
        self._running = 0
        self._ids = itertools.count(1)
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"speclab-run-{i}", daemon=True)
                         for i in range(self.settings.workers)]
        for t in self._threads:
            t.start()

    def __repr__(self) -> str:
        s = self.settings
        return (f"RunService(workers={s.workers}, threads_per_run={s.threads_per_run}, "
                f"running={self._running}, waiting={len(self._waiting)})")

    # -- requests in ------------------------------------------------------------------------------
    def submit_run(self, request: dict, progress=None, owner=None) -> Ticket:
        """One decode: `request` is runs.run_one's keywords. Refused now (ValueError) past a limit."""
        from speclab.apps import runs
        self.limits.check(request)
        return self.submit(lambda: runs.run_one(progress=progress, **request), runs.models_of(request), owner)

    def submit(self, fn, models=(), owner=None) -> Ticket:
        """Any no-argument function that runs decodes (a comparison's runs), on `models`' turn."""
        ticket = Ticket(next(self._ids), fn, tuple(dict.fromkeys(m for m in models if m)), owner)
        with self._cv:
            if self._stopped:
                raise RuntimeError("the run service is closed")
            self._waiting.append(ticket)
            self._cv.notify_all()
        return ticket

    # -- the queue, seen from a page --------------------------------------------------------------
    def position(self, ticket: Ticket) -> int | None:
        """1 for the first in line, 2 for the second, ...; 0 once running; None when done."""
        with self._cv:
            if ticket in self._waiting:
                return self._waiting.index(ticket) + 1
        return None if ticket.future.done() else 0

    def cancel(self, ticket: Ticket) -> bool:
        """Drop a request that has not started; False once it runs (a run is not stopped midway)."""
        with self._cv:
            if ticket not in self._waiting:
                return False
            self._waiting.remove(ticket)
            self._cv.notify_all()
        ticket.future.cancel()
        return True

    def cancel_owner(self, owner) -> int:
        """Drop every queued request of `owner` (a closed page's session): how many."""
        with self._cv:
            mine = [t for t in self._waiting if t.owner is owner]
        return sum(self.cancel(t) for t in mine)

    def load(self) -> dict:
        """{"running": n, "waiting": n, "workers": n}: the server's load now."""
        with self._cv:
            return {"running": self._running, "waiting": len(self._waiting), "workers": self.settings.workers}

    def close(self) -> None:
        """Cancel what waits and let the workers end after their current run."""
        with self._cv:
            self._stopped = True
            waiting, self._waiting = self._waiting, []
            self._cv.notify_all()
        for t in waiting:
            t.future.cancel()

    # -- the workers ------------------------------------------------------------------------------
    def _next(self) -> Ticket | None:
        """The oldest request whose models are free (None when closed); marks its models busy."""
        with self._cv:
            while True:
                if self._stopped:
                    return None
                for t in self._waiting:
                    if not self._busy.intersection(t.models):
                        self._waiting.remove(t)
                        self._busy.update(t.models)
                        self._running += 1
                        return t
                self._cv.wait()

    def _work(self) -> None:
        torch.set_num_threads(self.settings.threads_per_run)
        while (ticket := self._next()) is not None:
            try:
                if ticket.future.set_running_or_notify_cancel():
                    self._run(ticket)
            finally:
                with self._cv:
                    self._busy.difference_update(ticket.models)
                    self._running -= 1
                    self._cv.notify_all()

    def _run(self, ticket: Ticket) -> None:
        flags = {name: read() for name, (read, _) in PROCESS_FLAGS.items()}
        torch.set_num_threads(self.settings.threads_per_run)
        try:
            result = ticket.fn()
        except Exception as e:              # the page shows it; the worker goes on
            ticket.future.set_exception(e)
        else:
            ticket.future.set_result(result)
        finally:
            # this worker's thread count (and torch's default for new threads) back to the service's
            torch.set_num_threads(self.settings.threads_per_run)
            for name, (read, write) in PROCESS_FLAGS.items():
                if read() != flags[name]:
                    write(flags[name])
                    self.changed.append(f"request {ticket.id}: {name}")


_default: RunService | None = None
_default_lock = threading.Lock()


def default_service() -> RunService:
    """The process's service for pages made without one (`panel serve`, notebooks, tests)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RunService(settings_from_env())
        return _default


def settings_from_env() -> Settings:
    """SPECLAB_RUN_THREADS and SPECLAB_RUN_WORKERS, where set (`speclab serve` flags set them too)."""
    def num(name):
        v = os.environ.get(name, "").strip()
        if not v:
            return None
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"{name}={v!r}: give a whole number of at least 1")
        return int(v)
    return Settings(threads_per_run=num("SPECLAB_RUN_THREADS"), workers=num("SPECLAB_RUN_WORKERS"))


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 23 -> "23rd"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
