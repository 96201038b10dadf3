"""The RunService between the pages and speclab.run: a queue whose place a page shows, a model's
turn, cancelling a queued request, refusing a request past the limits, process settings a run
cannot change for another, and the real Panel server serving 8 sessions at once on the toy zoo,
each pressing Run and getting its own result."""
from __future__ import annotations

import asyncio
import socket
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
from speclab.apps.service import Limits, RunService, Settings, ordinal  # noqa: E402

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
    assert not svc.cancel(a)                              # running: not stopped midway
    go.set()
    assert [t.future.result(WAIT_S) for t in (a, c, d)] == ["a", "c", "d"]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
