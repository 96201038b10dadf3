"""RunService: what stands between the pages and `speclab.run`. A request in, a trace out.

    service = RunService()                        # workers and threads sized to the machine
    ticket = service.submit_run(request)          # request: runs.run_one's keywords (the form's)
    service.position(ticket)                      # 2 = second in line, 0 = running, None = done
    service.wait_s(ticket)                        # its estimated wait, from the run times measured here
    service.cancel(ticket)                        # dropped from the queue, or stopped at its next step
    trace = ticket.future.result()                # the trace, or Cancelled (a page's Cancel, a budget)

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
- **the queue**: first in, first out; `position()` is a waiting request's place in it and `wait_s()`
  its estimated wait (the service times every run it finishes, by method and models), which the page
  shows ("2nd in line, about 20 s").
- **cancelling**: `cancel()` drops a request that has not started, and stops one that runs at its
  next step: every decode the service runs gets a progress callback (`checkpoint`), which every
  engine calls once a round or step, and which raises `Cancelled` once its request was cancelled or
  passed its time budget. The engine unwinds (a drafter's own loop shuts its threads in `finally`),
  the worker takes the next request, and the page says so in one line. No engine knows of it.
- **the limits** (`Limits`): a request past one is refused in one line before it queues, so no
  request holds a worker for minutes (a `k=1000` from a URL held the only worker for 8 minutes);
  every other number is held to its bound in speclab.params.BOUNDS, as the API holds it. Two
  budgets a run: its memory, estimated before it queues from the model's config and the request's
  lengths (the KV cache it fills, a canvas's logits), refused past `memory_mb`; its time, a run
  stopped (Cancelled) once it has run `run_seconds`.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from speclab.apps.limits import Limits


class Cancelled(Exception):
    """A request stopped before its end: its page's Cancel (budget None), or a budget it passed
    (budget "time"); str() is the one line a page shows."""

    def __init__(self, message: str, budget: str | None = None):
        super().__init__(message)
        self.budget = budget


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
    `speclab serve --threads-per-run 1` runs one request a core. batch: how many queued requests
    that differ only in prompt and seed (one method, model and knobs: a class pressing Run on the
    same example) a worker takes as one batched decode; 1 runs each alone."""
    threads_per_run: int | None = None
    workers: int | None = None
    limits: Limits = field(default_factory=Limits)
    batch: int = 8

    def resolved(self) -> "Settings":
        cores = machine_cores()
        threads = self.threads_per_run or (cores if cores < 4 else min(4, cores // 2))
        workers = self.workers or max(1, cores // threads)
        if threads < 1 or workers < 1 or self.batch < 1:
            raise ValueError(f"threads_per_run, workers and batch must be at least 1, got {threads}, {workers} "
                             f"and {self.batch}")
        return Settings(threads, workers, self.limits, self.batch)


# the process-wide flags a run must leave as it found them: name -> (read, write)
PROCESS_FLAGS = {
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
}


@dataclass(eq=False)
class Ticket:
    """One request in the service: its future (the trace, or the run's exception), the models it
    runs on, who asked (a session: `cancel_owner` drops its requests), what kind of run it is (its
    wait is estimated from that kind's recent times) and its time budget (seconds, None: none)."""
    id: int
    fn: object
    models: tuple[str, ...]
    owner: object = None
    kind: tuple = ()
    seconds: float | None = None
    over_time: str = ""                           # the line a page shows when the budget stops it
    future: Future = field(default_factory=Future)
    started: float | None = None                  # time.monotonic() when a worker took it
    stop: threading.Event = field(default_factory=threading.Event)
    batch: tuple | None = None                    # runs.batch_key: requests with one key may run as one batch
    request: dict | None = None                   # a batchable request's run_one keywords
    progress: object = None                       # and its page's progress(n)
    timed: bool = True                            # its time is one a page's wait is estimated from

    def check(self) -> None:
        """Cancelled, once the request was cancelled or has run past its time budget."""
        if self.stop.is_set():
            raise Cancelled("cancelled")
        if self.seconds is not None and self.started is not None and time.monotonic() - self.started > self.seconds:
            raise Cancelled(self.over_time, budget="time")


_local = threading.local()          # the ticket a worker thread runs


def checkpoint(*_) -> None:
    """Raise Cancelled where the request this thread runs for the service was cancelled or has
    passed its time budget; nothing elsewhere. Every decode the service runs takes it as (or inside)
    its progress callback, so it stops at its next round or step."""
    ticket = getattr(_local, "ticket", None)
    if ticket is not None:
        ticket.check()


def checked(progress=None):
    """A progress callback that checks the request first (checkpoint), then reports to `progress`."""
    if progress is None:
        return checkpoint

    def report(*args):
        checkpoint()
        progress(*args)
    return report


class RunService:
    def __init__(self, settings: Settings | None = None):
        self.settings = (settings or Settings()).resolved()
        self.limits = self.settings.limits
        self.changed: list[str] = []             # "method: default dtype" for each flag a run changed
        self._cv = threading.Condition()
        self._waiting: list[Ticket] = []         # queued, oldest first
        self._busy: set[str] = set()             # models a running request holds
        self._active: list[Ticket] = []          # running, oldest first
        self._times: dict[tuple, deque] = {}     # kind -> the seconds of its recent finished runs
        self._ids = itertools.count(1)
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"speclab-run-{i}", daemon=True)
                         for i in range(self.settings.workers)]
        for t in self._threads:
            t.start()

    def __repr__(self) -> str:
        s = self.settings
        return (f"RunService(workers={s.workers}, threads_per_run={s.threads_per_run}, "
                f"running={len(self._active)}, waiting={len(self._waiting)})")

    # -- requests in ------------------------------------------------------------------------------
    def submit_run(self, request: dict, progress=None, owner=None) -> Ticket:
        """One decode: `request` is runs.run_one's keywords. Refused now (ValueError) past a limit.
        progress(n) hears of each round's or step's n new tokens; the decode stops there once
        cancelled (checkpoint). Requests that differ only in prompt and seed, of a method that runs
        in a batch, may run as one batch (`Settings.batch`): each gets its own run's output."""
        from speclab.apps import runs
        self.limits.check(request)
        models = runs.models_of(request)
        ticket = self.submit(lambda: runs.run_one(progress=checked(progress), **request), models, owner,
                             kind=(request.get("method"), *models), hold=True)
        if self.settings.batch > 1:
            ticket.batch, ticket.request, ticket.progress = runs.batch_key(request), dict(request), progress
        return self._queue(ticket)

    def submit(self, fn, models=(), owner=None, kind: tuple = (), runs: int = 1, hold: bool = False,
               timed: bool = True) -> Ticket:
        """Any no-argument function that runs decodes (a comparison's `runs` of them), on `models`'
        turn; its time budget is `runs` x Limits.run_seconds. It stops at its next step once
        cancelled where its decodes take `checkpoint` as their progress (submit_run's do). timed:
        its time is one the pages' waits are estimated from (a warm-up's model load is not)."""
        models = tuple(dict.fromkeys(m for m in models if m))
        s = self.limits.run_seconds
        ticket = Ticket(next(self._ids), fn, models, owner, kind=tuple(kind) or ("job", *models),
                        seconds=None if s is None else s * runs, over_time=self.limits.over_time(runs), timed=timed)
        return ticket if hold else self._queue(ticket)

    def _queue(self, ticket: Ticket) -> Ticket:
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

    def wait_s(self, ticket: Ticket) -> float | None:
        """Seconds until a queued request is estimated to start (0 once running, None where no run
        has finished yet to time): the runs before it on its models one after another, and all the
        work before it shared by the workers, whichever is longer. A run is expected to take the
        median of its kind's recent runs (its method and models), else of any run's."""
        with self._cv:
            if ticket not in self._waiting:
                return None if ticket.future.done() else 0.0
            every = sorted(x for times in self._times.values() for x in times)
            if not every:
                return None
            now = time.monotonic()
            mine = set(ticket.models)

            def expected(t):
                times = sorted(self._times.get(t.kind) or every)
                return times[len(times) // 2]
            left = [(t, max(expected(t) - (now - t.started), 0.0)) for t in self._active]
            ahead = [(t, expected(t)) for t in self._waiting[:self._waiting.index(ticket)]]
            serial = sum(s for t, s in left + ahead if mine.intersection(t.models))
            spread = sum(s for _, s in left + ahead) / self.settings.workers
            return max(serial, spread)

    def cancel(self, ticket: Ticket) -> bool:
        """Drop a request that has not started, or stop a running one at its next step (its future
        then raises Cancelled, and the worker goes on to the next request). False once done."""
        with self._cv:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                self._cv.notify_all()
                queued = True
            elif ticket in self._active:
                ticket.stop.set()
                return True
            else:
                return False
        if queued:
            ticket.stop.set()
            ticket.future.cancel()
        return True

    def cancel_owner(self, owner) -> int:
        """Drop or stop every request of `owner` (a closed page's session): how many."""
        with self._cv:
            mine = [t for t in self._waiting + self._active if t.owner is owner]
        return sum(self.cancel(t) for t in mine)

    def load(self) -> dict:
        """{"running": n, "waiting": n, "workers": n}: the server's load now."""
        with self._cv:
            return {"running": len(self._active), "waiting": len(self._waiting), "workers": self.settings.workers}

    def close(self) -> None:
        """Cancel what waits and let the workers end after their current run."""
        with self._cv:
            self._stopped = True
            waiting, self._waiting = self._waiting, []
            self._cv.notify_all()
        for t in waiting:
            t.future.cancel()

    # -- the workers ------------------------------------------------------------------------------
    def _next(self) -> list[Ticket] | None:
        """The oldest request whose models are free, with the requests queued behind it that can
        run in one batch with it (None when closed); marks their models busy."""
        with self._cv:
            while True:
                if self._stopped:
                    return None
                for t in self._waiting:
                    if not self._busy.intersection(t.models):
                        group = [t] + [u for u in self._waiting if u is not t and t.batch is not None
                                       and u.batch == t.batch][:self.settings.batch - 1]
                        for u in group:
                            self._waiting.remove(u)
                            u.started = time.monotonic()
                            self._active.append(u)
                        self._busy.update(t.models)
                        return group
                self._cv.wait()

    def _work(self) -> None:
        torch.set_num_threads(self.settings.threads_per_run)
        while (group := self._next()) is not None:
            try:
                live = [t for t in group if t.future.set_running_or_notify_cancel()]
                if len(live) == 1:
                    self._run(live[0])
                elif live:
                    self._run(Batch(live, self.limits.run_seconds))
            finally:
                with self._cv:
                    self._busy.difference_update(group[0].models)
                    for t in group:
                        self._active.remove(t)
                    self._cv.notify_all()

    def _run(self, ticket: "Ticket | Batch") -> None:
        flags = {name: read() for name, (read, _) in PROCESS_FLAGS.items()}
        torch.set_num_threads(self.settings.threads_per_run)
        _local.ticket = ticket
        try:
            ticket.check()                  # cancelled between the queue and the worker
            result = ticket.fn()
        except Exception as e:              # the page shows it (Cancelled: one line); the worker goes on
            ticket.future.set_exception(e)
        else:
            with self._cv:                  # a finished run's time: what the next waits are estimated by
                if ticket.timed:
                    self._times.setdefault(ticket.kind, deque(maxlen=RECENT)).append(time.monotonic() - ticket.started)
            ticket.future.set_result(result)
        finally:
            _local.ticket = None
            # this worker's thread count (and torch's default for new threads) back to the service's
            torch.set_num_threads(self.settings.threads_per_run)
            for name, (read, write) in PROCESS_FLAGS.items():
                if read() != flags[name]:
                    write(flags[name])
                    self.changed.append(f"request {ticket.id}: {name}")


class Batch:
    """Requests run as one batched decode (runs.run_batch), seen by the worker as one ticket: it
    stops once every member was cancelled or the batch passed its time budget (run_seconds: the
    lanes run together, so a batch takes about a run's time, not the sum); a member cancelled on
    the way gets Cancelled, the others their own traces. Each page's bar moves by its share of the
    batch's new tokens."""

    def __init__(self, members: list[Ticket], seconds: float | None):
        from speclab.apps import runs
        self.members, self.kind, self.started = members, members[0].kind, members[0].started
        self.seconds, self.over_time, self.timed = seconds, members[0].over_time, True
        share, self.done = 1 / len(members), [0.0]

        def progress(n):
            checkpoint()
            before, self.done[0] = self.done[0], self.done[0] + n * share
            for t in members:
                if t.progress is not None and int(self.done[0]) > int(before):
                    t.progress(int(self.done[0]) - int(before))
        self.fn = lambda: runs.run_batch([t.request for t in members], progress)
        self.future = self

    def check(self) -> None:
        if all(t.stop.is_set() for t in self.members):
            raise Cancelled("cancelled")
        if self.seconds is not None and time.monotonic() - self.started > self.seconds:
            raise Cancelled(self.over_time, budget="time")

    def set_exception(self, e: BaseException) -> None:
        for t in self.members:
            t.future.set_exception(e)

    def set_result(self, traces: list) -> None:
        for t, trace in zip(self.members, traces):
            if t.stop.is_set():
                t.future.set_exception(Cancelled("cancelled"))
            else:
                t.future.set_result(trace)


RECENT = 20        # finished runs of a kind its wait estimate reads (the machine's load drifts)
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
    """SPECLAB_RUN_THREADS, SPECLAB_RUN_WORKERS and SPECLAB_RUN_BATCH, where set (`speclab serve` flags set them too)."""
    def num(name):
        v = os.environ.get(name, "").strip()
        if not v:
            return None
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"{name}={v!r}: give a whole number of at least 1")
        return int(v)
    return Settings(threads_per_run=num("SPECLAB_RUN_THREADS"), workers=num("SPECLAB_RUN_WORKERS"),
                    batch=num("SPECLAB_RUN_BATCH") or Settings.batch)


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 23 -> "23rd"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# -- what the pages of one server share on its event loop, and how a wait is said -------------------
_TURNS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = weakref.WeakKeyDictionary()


def draw_turn() -> asyncio.Lock:
    """The server loop's drawing turn: one finished run's figures are drawn at a time, the loop's other
    work in between. A batch of eight runs ends at once, and drawing a run takes its page 1-2 s of the
    one loop every page shares: drawn back to back they held the pages that had just pressed Run for
    10 s or more before the server could tell them their place in line."""
    loop = asyncio.get_running_loop()
    turn = _TURNS.get(loop)
    if turn is None:
        turn = _TURNS[loop] = asyncio.Lock()
    return turn


def waited(line: tuple[int, float] | None) -> str:
    """What a page says of a request that now runs, from its first place in line and when it took
    it (time.monotonic; None: it never waited): how long it waited, or that nobody was ahead."""
    if line is None:
        return "nobody was ahead of you in line"
    place, since = line
    s = time.monotonic() - since
    return f"you waited {f'{round(s)} s' if s < 90 else f'{s / 60:.1f} min'} in line, {ordinal(place)} at first"


def about(seconds: float | None) -> str:
    """An estimated wait in words, to 10 s or to the minute ("about 40 s", "about 3 min"): coarse,
    so a page's line changes as the queue moves, not at every tick (thirty pages ticking a
    countdown each would keep the server sending)."""
    if seconds is None:
        return "its wait estimated once a run here has finished"
    if seconds < 90:
        return f"about {max(1, round(seconds / 10)) * 10} s to wait"
    return f"about {round(seconds / 60)} min to wait"
