"""The RunService between the pages and speclab.run: a queue whose place and estimated wait a page
shows, a model's turn, cancelling a queued or a running request (a page's Cancel, the time budget),
refusing a request past the limits or the memory budget, a figure that fails to draw named on the
page, process settings a run cannot change for another, and the real Panel server serving 8
sessions at once on the toy zoo, each pressing Run and getting its own result."""
from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import torch

pn = pytest.importorskip("panel")

from speclab.apps import runs                                           # noqa: E402
from speclab.apps.dashboard import Dashboard                            # noqa: E402
from speclab.apps.serve import free_port                                # noqa: E402
from speclab.apps.service import Cancelled, Limits, RunService, Settings, ordinal  # noqa: E402

WAIT_S = 120        # a busy 2-core machine: the whole test's runs stay well under this


def until(cond, timeout=WAIT_S, what="the condition"):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)


def request(prompt="def parse(line):", method="prompt-lookup", target="code-target", n=4, **kw) -> dict:
    return dict(target=target, prompt=prompt, method=method, draft="code-draft", max_new_tokens=n, **kw)


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]


def test_queue_places_a_models_turn_and_cancelling():
    """Two workers, but one model runs one request at a time: the second request on a busy model
    waits (1st in line) while a request on another model goes past it; cancelling a queued request
    moves the ones behind it up and it never runs."""
    svc = RunService(Settings(threads_per_run=1, workers=2))
    go, ran = threading.Event(), []

    def hold(name):
        def fn():
            ran.append(name)
            assert go.wait(WAIT_S)
            return name
        return fn
    a = svc.submit(hold("a"), ["m"])
    until(lambda: svc.position(a) == 0, what="a to start")
    b, c = svc.submit(hold("b"), ["m"]), svc.submit(hold("c"), ["m"])
    d = svc.submit(hold("d"), ["n"])                      # another model: the idle worker takes it
    until(lambda: svc.position(d) == 0, what="d to start")
    assert (svc.position(b), svc.position(c)) == (1, 2)
    assert svc.cancel(b) and b.future.cancelled() and svc.position(c) == 1
    go.set()
    assert [t.future.result(WAIT_S) for t in (a, c, d)] == ["a", "c", "d"]
    assert not svc.cancel(a)                              # done: nothing to cancel
    assert "b" not in ran and svc.position(c) is None
    svc.close()


def test_a_closed_page_drops_its_queued_request():
    svc = RunService(Settings(threads_per_run=1, workers=1))
    go = threading.Event()
    busy = svc.submit(lambda: go.wait(WAIT_S), ["code-target"])
    until(lambda: svc.position(busy) == 0, what="the first run to start")
    page, other = Dashboard(service=svc), Dashboard(service=svc)
    mine = svc.submit_run(page.request(), owner=page)
    theirs = svc.submit_run(other.request(), owner=other)
    assert svc.position(mine) == 1 and svc.position(theirs) == 2
    assert page.close() == 1 and mine.future.cancelled() and svc.position(theirs) == 1
    go.set()
    assert theirs.future.result(WAIT_S).output_ids
    svc.close()


def test_a_request_past_the_limits_is_refused_in_one_line():
    """k=32 from a URL, inside speclab's bound but past this server's tighter limit, is refused
    before it queues (k=1000 once held the only worker for minutes; the URL refuses that itself)."""
    svc = RunService(Settings(threads_per_run=1, workers=1, limits=Limits(k=16)))
    d = Dashboard(service=svc)
    assert d.apply_args({"method": [b"prompt-lookup"], "k": [b"32"], "max_new_tokens": [b"4"]}) is False
    assert asyncio.run(d.run_async()) is None
    assert "k=32 is over this server&#x27;s limit of 16: ask for 16 or less" == d.alert.object
    assert svc.load()["waiting"] == 0 and svc.load()["running"] == 0
    with pytest.raises(ValueError, match="max_new_tokens=100000 is over"):
        svc.submit_run(request(n=100_000))
    svc.close()


def test_a_setting_changed_inside_one_run_is_not_seen_by_another():
    """Run A (a real decode) sets torch's thread count and the default dtype and keeps them; run B,
    on the other worker at the same time, decodes at the service's thread count; the runs after
    them, on both workers, find the service's settings again, and the service names A's change."""
    svc = RunService(Settings(threads_per_run=2, workers=2))
    started, b_done = threading.Event(), threading.Event()

    def run_a():
        trace = runs.run_one(**request("def a(x):"))
        torch.set_num_threads(1)                          # as a careless method would, and no restore
        started.set()
        assert b_done.wait(WAIT_S)
        torch.set_default_dtype(torch.float64)
        return trace

    def seen(prompt, target="code-target", barrier=None):
        def fn():
            threads = []
            trace = runs.run_one(progress=lambda n: threads.append(torch.get_num_threads()),
                                 **request(prompt, target=target))
            if barrier is not None:
                barrier.wait(WAIT_S)                      # both workers at once: one of them ran A
            return threads + [torch.get_num_threads()], torch.get_default_dtype(), trace
        return fn
    a = svc.submit(run_a, ["code-target"])
    assert started.wait(WAIT_S)
    b = svc.submit(seen("def b(y):", target="code-draft"), ["code-draft"])
    threads_b, _, _ = b.future.result(WAIT_S)
    b_done.set()
    a.future.result(WAIT_S)
    assert set(threads_b) == {2}
    both = threading.Barrier(2)
    after = [svc.submit(seen(p, barrier=both), [m]) for p, m in (("def c(z):", "c"), ("def d(w):", "d"))]
    for t in after:
        threads, dtype, _ = t.future.result(WAIT_S)
        assert set(threads) == {2} and dtype == torch.float32
    assert svc.changed == [f"request {a.id}: default dtype"]
    assert torch.get_default_dtype() == torch.float32
    svc.close()


def get(url: str) -> int:
    """GET url (a new session of the app), retried while the threaded server starts listening."""
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=WAIT_S) as r:
                return r.status
        except urllib.error.URLError:
            if time.monotonic() - t0 > 30:
                raise
            time.sleep(0.2)


def test_eight_served_pages_each_get_their_own_run_and_see_their_place():
    """The real Panel server on 127.0.0.1 with 8 sessions (each opened by an HTTP GET with its own
    prompt, seed and temperature in the URL). All press Run at once; each gets the trace of its own
    request (the same output as that request run alone), and a waiting page showed its place."""
    from speclab.apps.serve import serve
    svc = RunService(Settings(threads_per_run=1, workers=2))
    pages, notes = [], []

    def on_session(dash):
        pages.append((pn.state.curdoc, dash))
        notes.append(seen := [])
        dash.queue_note.param.watch(lambda e: seen.append(e.new), "object")
    port = free_port()
    server = serve(port=port, threaded=True, service=svc, on_session=on_session,
                   unused_session_lifetime_milliseconds=600_000)
    try:
        asked = []
        for i in range(8):
            # six pages on the target, two on another model (their turn does not wait for it)
            args = dict(prompt=f"def f{i}(x{i}):", method="draft-model" if i % 2 else "prompt-lookup",
                        target="code-draft" if i >= 6 else "code-target", max_new_tokens="6",
                        seed=str(i), temperature="0.8" if i % 3 == 0 else "0")
            asked.append(args)
            assert get(f"http://127.0.0.1:{port}/?{urllib.parse.urlencode(args)}") == 200
        assert len(pages) == 8
        for doc, dash in pages:                           # every page presses Run, on its own session
            doc.add_next_tick_callback(dash._on_run)
        until(lambda: all((d.trace is not None or d.alert.visible) and not d.run_button.disabled for _, d in pages),
              what="8 runs")
        outputs = []
        for (_, dash), args in zip(pages, asked):
            t = dash.trace
            assert not dash.alert.visible, dash.alert.object
            assert runs.prompt_text(t) == args["prompt"] and t.method == args["method"]
            assert t.sampling.seed == int(args["seed"]) and t.sampling.temperature == float(args["temperature"])
            # the same request alone on the same service (same threads): the same tokens
            alone = svc.submit_run(dict(request(args["prompt"], args["method"], args["target"], 6),
                                        seed=int(args["seed"]), temperature=float(args["temperature"])))
            assert t.output_ids == alone.future.result(WAIT_S).output_ids, args
            outputs.append(tuple(t.output_ids))
        assert len(set(outputs)) > 1
        places = [n for seen in notes for n in seen if " in line" in n]
        assert any(n.startswith("2nd in line") for n in places), places
    finally:
        server.stop()
        svc.close()


def held_decode(svc, n=200, **kw):
    """A real decode on the service whose first step waits for `go`: (ticket, started, go, steps)."""
    started, go, steps = threading.Event(), threading.Event(), []

    def progress(k):
        steps.append(k)
        started.set()
        assert go.wait(WAIT_S)
    ticket = svc.submit_run(request(method="ar", n=n, **kw), progress=progress)
    return ticket, started, go, steps


def test_a_running_decode_cancelled_midway_frees_the_worker():
    """The only worker runs a 200-token decode; cancelled after its first step, it stops at its next
    one (Cancelled, a few steps in), and the next request runs to its end on the same worker."""
    svc = RunService(Settings(threads_per_run=1, workers=1))
    ticket, started, go, steps = held_decode(svc)
    nxt = svc.submit_run(request("def after(x):"))
    assert started.wait(WAIT_S) and svc.position(ticket) == 0 and svc.position(nxt) == 1
    assert svc.cancel(ticket)
    go.set()
    with pytest.raises(Cancelled, match="^cancelled$") as e:
        ticket.future.result(WAIT_S)
    assert e.value.budget is None and len(steps) < 200
    assert nxt.future.result(WAIT_S).output_ids                 # the worker went on to the next request
    assert svc.load() == {"running": 0, "waiting": 0, "workers": 1} and not svc.cancel(ticket)
    svc.close()


def test_queued_runs_of_one_method_run_as_one_batch_each_with_its_own_output():
    """Five pages queue prompt-lookup on one model with their own prompts and seeds while it is busy:
    the worker takes the first four (Settings.batch) as one batched decode, the fifth alone; a run
    of another method is never in their batch. Each output is the one its run alone gives, token
    for token; each page's bar moves; the status line says the run was batched."""
    from speclab.apps.status import status_html
    svc = RunService(Settings(threads_per_run=1, workers=1, batch=4))
    go = threading.Event()
    busy = svc.submit(lambda: go.wait(WAIT_S), ["code-target"])
    until(lambda: svc.position(busy) == 0, what="the first run to start")
    prompts = ["def parse(line):", "def load(path):", "class Stack:", "def merge(a, b):", "import os"]
    moved = [[] for _ in prompts]
    tickets = [svc.submit_run(request(p, n=8, seed=i), progress=moved[i].append) for i, p in enumerate(prompts)]
    other = svc.submit_run(request("def f(x):", method="ar", n=8))
    go.set()
    traces = [t.future.result(WAIT_S) for t in tickets]
    assert [t.params.get("batch_size") for t in traces] == [4, 4, 4, 4, None]
    assert [t.params.get("lane") for t in traces[:4]] == [0, 1, 2, 3]
    assert other.future.result(WAIT_S).params.get("batch_size") is None
    for i, (p, t) in enumerate(zip(prompts, traces)):
        assert t.output_ids == runs.run_one(**request(p, n=8, seed=i)).output_ids, p
        assert 0 < sum(moved[i]) <= 8
    assert "decoded in a batch of 4 runs" in status_html(traces[0]) and "batch" not in status_html(traces[4])
    svc.close()


def test_the_server_warms_the_pages_models_first_and_no_wait_is_estimated_from_it():
    """`speclab serve` loads the pair the page opens on as its first request (a class's first Run
    then waits for no model load); that load's time is not a run's, so a page's wait is not
    estimated from it."""
    from speclab.apps.serve import warm_up
    from speclab.models import zoo
    svc = RunService(Settings(threads_per_run=1, workers=1))
    warm = warm_up(svc, ("code-target", "code-draft"))
    assert warm.future.result(WAIT_S) is None and warm.kind == ("warm-up", "code-target", "code-draft")
    loaded = zoo._load_shared.cache_info().currsize
    zoo.load_shared("code-target"), zoo.load_shared("code-draft")
    assert zoo._load_shared.cache_info().currsize == loaded                    # both were loaded already
    go = threading.Event()
    busy = svc.submit(lambda: go.wait(WAIT_S), ["code-target"])
    until(lambda: svc.position(busy) == 0, what="the held run to start")
    queued = svc.submit_run(request())
    assert svc.position(queued) == 1 and svc.wait_s(queued) is None       # nothing timed yet: no estimate
    go.set()
    assert queued.future.result(WAIT_S).output_ids
    svc.close()


def test_a_run_past_its_time_budget_is_stopped_and_says_which_budget():
    """run_seconds=1 and a decode whose every step takes 0.3 s: it is stopped at a step past the
    budget, with the line a page shows (which budget, and how to stay within it)."""
    svc = RunService(Settings(threads_per_run=1, workers=1, limits=Limits(run_seconds=1)))
    ticket = svc.submit_run(request(method="ar", n=64), progress=lambda k: time.sleep(0.3))
    with pytest.raises(Cancelled) as e:
        ticket.future.result(WAIT_S)
    assert e.value.budget == "time"
    assert str(e.value) == ("stopped: the run passed this server's time budget of 1 s a run; fewer tokens, a "
                            "shorter prompt or a method with fewer forwards stays within it")
    assert svc.submit_run(request()).future.result(WAIT_S).output_ids      # the worker is free
    svc.close()


def test_a_run_past_the_memory_budget_is_refused_before_it_queues():
    """The KV cache a request would fill, estimated from the target's config and the request's
    lengths: past memory_mb the page says so in one line, and nothing queues."""
    from speclab.apps.limits import run_memory
    small, long_ = run_memory(request(n=16)), run_memory(request("x" * 4000, n=256))
    assert small[0] < long_[0] and "8 layers" in long_[1]       # code-target: 8 layers
    svc = RunService(Settings(threads_per_run=1, workers=1, limits=Limits(memory_mb=1)))
    with pytest.raises(ValueError, match=r"^this run would fill about \d+ MB \(a KV cache of 8 layers x 4257 "
                                         r"positions\), over this server's memory budget of 1 MB a run: shorten "
                                         r"the prompt or ask for fewer tokens$"):
        svc.submit_run(request("x" * 4000, n=256))
    d = Dashboard(service=svc)
    d.form.prompt.value = "x" * 4000
    d.form.max_new_tokens.value = 256
    assert asyncio.run(d.run_async()) is None
    assert "memory budget of 1 MB a run" in d.alert.object and svc.load()["waiting"] == 0
    assert svc.submit_run(request(n=4)).future.result(WAIT_S).output_ids   # a short one fits
    svc.close()


def test_cancel_on_the_page_drops_its_queued_request_and_says_so_in_one_line():
    """A page whose run waits behind another presses Cancel: its request leaves the queue, the page
    says "cancelled" in one line with nothing drawn, and its next Run gets a trace."""
    svc = RunService(Settings(threads_per_run=1, workers=1))
    go = threading.Event()
    busy = svc.submit(lambda: go.wait(WAIT_S), ["code-target"])
    until(lambda: svc.position(busy) == 0, what="the first run to start")
    d = Dashboard(service=svc)

    async def press_run_then_cancel():
        task = asyncio.create_task(d.run_async())
        while d.ticket is None or svc.position(d.ticket) != 1:
            await asyncio.sleep(0.02)
        assert not d.cancel_button.disabled and d.cancel()
        return await task
    assert asyncio.run(press_run_then_cancel()) is None
    assert d.alert.object.startswith("cancelled: the run stopped at your request") and d.alert.alert_type == "warning"
    assert d.trace is None and not d.run_button.disabled and d.cancel_button.disabled
    go.set()
    assert asyncio.run(d.run_async()) is not None and not d.alert.visible
    svc.close()


def test_a_waiting_page_shows_its_place_and_an_estimated_wait_that_moves():
    """No run finished yet: no estimate. Then, once runs of a kind were timed, a request further back
    waits longer than one nearer the front, and its estimate falls as the queue before it moves;
    the page's line says its place and the wait."""
    svc = RunService(Settings(threads_per_run=1, workers=1))
    go = threading.Event()
    held = lambda: go.wait(WAIT_S)
    first = svc.submit(held, ["m"], kind=("k",))
    until(lambda: svc.position(first) == 0, what="the first run to start")
    a = svc.submit(held, ["m"], kind=("k",))
    assert svc.wait_s(first) == 0 and svc.wait_s(a) is None       # nothing timed yet
    go.set()
    a.future.result(WAIT_S)
    go.clear()
    run = svc.submit(held, ["m"], kind=("k",))
    until(lambda: svc.position(run) == 0, what="the run to start")
    b, c = svc.submit(held, ["m"], kind=("k",)), svc.submit(held, ["m"], kind=("k",))
    wb, wc = svc.wait_s(b), svc.wait_s(c)
    assert wb is not None and wc > wb >= 0
    assert svc.cancel(b) and svc.position(c) == 1 and svc.wait_s(c) < wc
    d = Dashboard(service=svc)
    d._tick(0, svc.position(c), svc.wait_s(c))
    assert d.queue_note.object.startswith("1st in line, about ") and " to wait: 1 run(s) going on 1 worker(s)" in \
        d.queue_note.object
    go.set()
    svc.close()


def test_a_figure_that_fails_to_draw_is_named_on_the_page_and_logged(caplog):
    """A figure of prompt-lookup's view that raises: the run's page says which figure failed, in one
    line, draws nothing half, and the server's log has the traceback."""
    from speclab.figures.views import FigureSpec, added_figure

    def broken(trace, step):
        raise RuntimeError("the test figure cannot draw")
    d = Dashboard(service=RunService(Settings(threads_per_run=1, workers=1)))
    d.form.method.value, d.form.max_new_tokens.value = "prompt-lookup", 4
    with added_figure("prompt-lookup", FigureSpec("broken test figure", broken)), caplog.at_level("ERROR"):
        assert d.run_now() is not None
    assert d.alert.object == ("the figure &#x27;broken test figure&#x27; failed to draw this prompt-lookup run "
                              "(RuntimeError: the test figure cannot draw); the server&#x27;s log has the traceback")
    assert d.trace is None and d.viewer.step_fig.object is None
    assert "broken test figure" in caplog.text and "RuntimeError" in caplog.text
    assert d.run_now() is not None and not d.alert.visible and d.trace is not None     # without it: drawn
    d.service.close()
