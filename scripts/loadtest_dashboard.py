"""Load test of the served dashboard on loopback: N concurrent browser sessions, each running a
short decode of its own prompt, with no errors and no cross-talk.

    .venv/bin/python scripts/loadtest_dashboard.py --sessions 20 --tokens 4
    .venv/bin/python scripts/loadtest_dashboard.py --sessions 30 --tokens 16 --target smollm2-135m   # a class

Starts `python -m speclab.apps.serve` on a free 127.0.0.1 port (stopped by its own pid), opens N
pages of Debian's Chromium at once (Playwright, one browser), and in every page at the same moment
presses Run on a prompt unique to that page, the pages taking turns between `prompt-lookup` and
`suffix` (--methods), on --target (the toy code-target by default; smollm2-135m is the real model,
its prompts in its chat template as the page sends them). Each page must then show:
  * no alert,
  * the prompt of its own trace (rebuilt by the server from the trace's token ids) holding its prompt,
  * the output = greedy `ar` on that prompt, computed afterwards in this process (both methods
    are lossless, so any token from another session's run would show up as a difference),
  * for suffix, no draft from `suffix:history` in the first round's detail: each session runs once,
    so its own history is empty and such a draft could only come from another session's text.
Reported: time to first figure (Run pressed -> this run's step figure on the page) as p50 / p95 /
max, the decodes' own wall times (median, max, sum: the part the queue serialises), errors, cross-talk, how many pages were told their place in line (and an estimated wait), and
the server's peak memory (VmHWM of its pid: the most RSS it held). --workers / --threads-per-run
set the server's RunService (default: the machine's, service.Settings).
Prints one JSON line with the numbers; exit code 1 on any error or mismatch.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from speclab.apps.serve import free_port, start_process, stop_process  # noqa: F401 (free_port: soak's import)
from shadow_text import DEEP_TEXT   # scripts/ is on the path: run as a script, or imported by its siblings

CHROMIUM = "/usr/bin/chromium"
# a page waiting behind others is a background tab: without the last three flags Chromium throttles
# its timers (at last to one wake-up a minute), and the page's own checks would read late
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-background-timer-throttling",
        "--disable-backgrounding-occluded-windows", "--disable-renderer-backgrounding"]


def prompts(n: int) -> list[str]:
    names = ["parse", "load", "split", "merge", "read", "write", "close", "open", "send", "fetch"]
    return [f"def {names[i % len(names)]}_{i}(line{i}):" for i in range(n)]


stop_server = stop_process      # the name soak_dashboard.py imports until it takes serve's


def start_server(port: int, log, **env) -> subprocess.Popen:
    """The dashboard's server; its target the code zoo unless the caller chose one (its outputs are
    checked against code-target's greedy ar, on prompts a chat template does not wrap)."""
    env.setdefault("SPECLAB_DASHBOARD_TARGET", os.environ.get("SPECLAB_DASHBOARD_TARGET", "code-target"))
    return start_process(port, log, **env)


# in the page, four times a second until the run is drawn: the queue line's text each time it changes
WATCH_QUEUE = f"""() => {{ window.__queue = []; const read = {DEEP_TEXT};
  window.__watch = setInterval(() => {{ const t = read('speclab-queue');
    if (t && t !== window.__queue[window.__queue.length - 1]) window.__queue.push(t); }}, 250); }}"""


async def session(ctx, url: str, prompt: str, method: str, tokens: int, go: asyncio.Event, ready: list,
                  timeout_ms: int, target: str | None = None, door: asyncio.Semaphore | None = None) -> dict:
    """One user: open the page (form prefilled by URL; `door`: how many pages load at once), wait
    for the common start, press Run; the run counts as drawn once the page's prompt line holds its
    own prompt and the step figure shows."""
    q = urllib.parse.urlencode(dict(method=method, prompt=prompt, max_new_tokens=tokens,
                                    **({"target": target} if target else {})))
    page = await ctx.new_page()
    out = dict(prompt=prompt, method=method, error=None)
    try:
        async with door or contextlib.nullcontext():
            await page.goto(f"{url}?{q}", timeout=timeout_ms)
            await page.locator(".speclab-run button").wait_for(timeout=timeout_ms)
        ready.append(prompt)
        await go.wait()
        t0 = time.perf_counter()
        await page.evaluate(WATCH_QUEUE)
        await page.locator(".speclab-run button").click(timeout=timeout_ms)
        out["click_s"] = time.perf_counter() - t0       # Playwright's click done: the press left the browser
        # the page opens on a recorded example: this run is drawn when the prompt line holds this prompt
        await page.wait_for_function(f"p => (({DEEP_TEXT})('speclab-prompt-echo').includes(p) && "
                                     f"({DEEP_TEXT})('speclab-step') !== '') || ({DEEP_TEXT})('speclab-alert') !== ''",
                                     arg=prompt, timeout=timeout_ms, polling=500)
        out["latency_s"] = time.perf_counter() - t0
        out["queue"] = await page.evaluate("() => { clearInterval(window.__watch); return window.__queue; }")
        out["alert"] = await page.evaluate(DEEP_TEXT, "speclab-alert")
        wall = re.search(r"wall (\d+\.\d+) s", await page.evaluate(DEEP_TEXT, "speclab-status"))
        out["decode_s"] = float(wall[1]) if wall else None
        out["batched"] = "decoded in a batch" in await page.evaluate(DEEP_TEXT, "speclab-status")
        out["prompt_shown"] = await page.evaluate(DEEP_TEXT, "speclab-prompt-echo")
        out["output_shown"] = await page.evaluate(DEEP_TEXT, "speclab-output")
        out["history_draft"] = "suffix:history" in await page.evaluate(DEEP_TEXT, "speclab-detail")
    except Exception as e:      # a timeout or a page crash is an error of this session, not the run
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    finally:
        await page.close()
    return out


async def drive(url: str, n: int, tokens: int, timeout_ms: int, methods: tuple[str, ...] = ("prompt-lookup",),
                target: str | None = None, opening: int = 0) -> tuple[list[dict], float]:
    """n pages (`opening` of them loading at once; 0: all), all pressing Run at one moment."""
    from playwright.async_api import async_playwright
    with tempfile.TemporaryDirectory() as tmp:
        async with async_playwright() as p:
            ctx = await p.chromium.launch_persistent_context(tmp, executable_path=CHROMIUM, headless=True,
                                                             args=ARGS)
            go, ready = asyncio.Event(), []
            door = asyncio.Semaphore(opening) if opening else None
            tasks = [asyncio.create_task(session(ctx, url, pr, methods[i % len(methods)], tokens, go, ready,
                                                 timeout_ms, target, door))
                     for i, pr in enumerate(prompts(n))]
            # every page loaded (or failed) before the common start, so the runs really overlap
            while len(ready) + sum(t.done() for t in tasks) < n:
                await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            go.set()
            results = await asyncio.gather(*tasks)
            wall = time.perf_counter() - t0
            await ctx.close()
    return results, wall


def reference_outputs(ps: list[str], tokens: int, target: str = "code-target") -> dict[str, str]:
    """Greedy ar in this process: what a lossless method must print for each prompt (in the chat
    template where the page puts a chat model's prompt in it)."""
    import speclab
    from speclab.apps import runs
    from speclab.apps.form import CHAT_MODELS
    ref = {}
    for pr in ps:
        t = speclab.generate(target, pr, "ar", max_new_tokens=tokens, record=None, chat=target in CHAT_MODELS).trace
        ref[pr] = runs.output_text(t).replace("\n", "⏎").replace("\t", "⇥") or "∅"
    return ref


def page_options(ap, *, methods: str, methods_help: str | None, timeout: float, timeout_help: str) -> None:
    """What the pages run (--tokens, --methods) and how long one may take (--timeout): the options of
    every script that drives the served dashboard."""
    ap.add_argument("--tokens", type=int, default=4, help="max new tokens per run")
    ap.add_argument("--methods", default=methods, help=methods_help)
    ap.add_argument("--timeout", type=float, default=timeout, help=timeout_help)


def no_chromium() -> bool:
    """True, and how to install it said on stderr, where Debian's Chromium is missing."""
    if os.path.exists(CHROMIUM):
        return False
    print(f"{CHROMIUM} is missing: apt-get install -y chromium", file=sys.stderr)
    return True


def memory_mb(pid: int, field: str = "VmHWM") -> float | None:
    """A process's memory from /proc (VmHWM: the most RSS it has held; VmRSS: now), in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def nearest_rank(xs: list[float], q: float) -> float:
    """The q-quantile of xs by nearest rank (p95 of 30: the 29th smallest)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=20)
    page_options(ap, methods="prompt-lookup,suffix", methods_help="lossless methods the pages take turns with",
                 timeout=600, timeout_help="seconds a session may take")
    ap.add_argument("--target", default="code-target", help="the pages' target (smollm2-135m: the real model)")
    ap.add_argument("--workers", type=int, help="the server's RunService workers (default: the machine's)")
    ap.add_argument("--threads-per-run", type=int, help="torch threads a run uses (default: the machine's)")
    ap.add_argument("--opening", type=int, default=4,
                    help="pages loading at once before the common Run (0: all at once; the server builds a "
                         "session's page in turn, and Bokeh drops a page whose session waited over 5 minutes)")
    ap.add_argument("--no-reference", action="store_true", help="skip the greedy-ar output check")
    ap.add_argument("--pages", help="write each page's record (its queue lines, times, output) to this JSON file")
    a = ap.parse_args(argv)
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    if no_chromium():
        return 2
    port = free_port()
    env = {k: str(v) for k, v in (("SPECLAB_RUN_WORKERS", a.workers), ("SPECLAB_RUN_THREADS", a.threads_per_run)) if v}
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        proc = start_server(port, log, SPECLAB_DASHBOARD_TARGET=a.target, **env)
        idle_mb = memory_mb(proc.pid, "VmRSS")
        try:
            results, wall = asyncio.run(drive(f"http://127.0.0.1:{port}/", a.sessions, a.tokens,
                                              int(a.timeout * 1000), methods, a.target, a.opening))
            peak_mb = memory_mb(proc.pid)
        finally:
            stop_process(proc)
    ref = {} if a.no_reference else reference_outputs([r["prompt"] for r in results], a.tokens, a.target)
    errors = [r for r in results if r["error"] or r.get("alert")]
    crosstalk = [r for r in results if not r["error"] and not r.get("alert") and
                 (r["prompt"] not in r["prompt_shown"] or (ref and r["output_shown"] != ref[r["prompt"]])
                  or r.get("history_draft"))]
    lat = [r["latency_s"] for r in results if "latency_s" in r]
    told = [r for r in results if any(" in line" in q for q in r.get("queue", []))]
    dec = [r["decode_s"] for r in results if r.get("decode_s") is not None]
    report = dict(sessions=a.sessions, tokens_per_run=a.tokens, methods=list(methods), target=a.target,
                  workers=a.workers, threads_per_run=a.threads_per_run, opening=a.opening, wall_s=round(wall, 1),
                  completed=len(lat), errors=len(errors), crosstalk=len(crosstalk),
                  outputs_checked_against_greedy_ar=bool(ref),
                  first_figure_s=dict(p50=round(statistics.median(lat), 1), p95=round(nearest_rank(lat, 0.95), 1),
                                      min=round(min(lat), 1), max=round(max(lat), 1)) if lat else None,
                  decode_s=dict(median=round(statistics.median(dec), 2), max=round(max(dec), 2),
                                sum=round(sum(dec), 1)) if dec else None,
                  told_place=len(told), told_wait=sum(any(" to wait" in q for q in r["queue"]) for r in told),
                  most_in_line=max((int(m[1]) for r in told for q in r["queue"]
                                    if (m := re.match(r"(\d+)(?:st|nd|rd|th) in line", q))), default=0),
                  started_at_once=sum(any("nobody was ahead" in q for q in r["queue"]) for r in told),
                  # the rest were told by their running line ("you waited 16 s in line, 9th at first")
                  told_while_waiting=sum(any(re.match(r"\d+(?:st|nd|rd|th) in line", q) for q in r["queue"])
                                         for r in told),
                  batched=sum(bool(r.get("batched")) for r in results),
                  server_rss_mb=dict(idle=idle_mb, peak=peak_mb), server_log=log.name)
    print(json.dumps(report))
    if a.pages:
        with open(a.pages, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False, indent=1)
    for r in errors + crosstalk:
        print("  problem:", json.dumps(r, ensure_ascii=False), file=sys.stderr)
    return 0 if not errors and not crosstalk and len(lat) == a.sessions else 1


if __name__ == "__main__":
    sys.exit(main())
