"""Load test of the served dashboard on loopback: N concurrent browser sessions, each running a
short decode of its own prompt, with no errors and no cross-talk.

    .venv/bin/python scripts/loadtest_dashboard.py --sessions 20 --tokens 4

Starts `python -m speclab.apps.serve` on a free 127.0.0.1 port (stopped by its own pid), opens N
pages of Debian's Chromium at once (Playwright, one browser), and in every page at the same moment
presses Run on a prompt unique to that page, the pages taking turns between `prompt-lookup` and
`suffix` (--methods). Each page must then show:
  * no alert,
  * the prompt of its own trace (rebuilt by the server from the trace's token ids) = its prompt,
  * the output = greedy `ar` on that prompt, computed afterwards in this process (both methods
    are lossless, so any token from another session's run would show up as a difference),
  * for suffix, no draft from `suffix:history` in the first round's detail: each session runs once,
    so its own history is empty and such a draft could only come from another session's text.
Prints one JSON line with the numbers; exit code 1 on any error or mismatch.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from shadow_text import DEEP_TEXT   # scripts/ is on the path: run as a script, or imported by its siblings

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


def prompts(n: int) -> list[str]:
    names = ["parse", "load", "split", "merge", "read", "write", "close", "open", "send", "fetch"]
    return [f"def {names[i % len(names)]}_{i}(line{i}):" for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # the page's target: the code zoo unless the caller chose one (its outputs are checked against
    # code-target's greedy ar, on prompts a chat template does not wrap)
    env.setdefault("SPECLAB_DASHBOARD_TARGET", "code-target")
    proc = subprocess.Popen([sys.executable, "-m", "speclab.apps.serve", "serve", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(240):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
            return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("server did not answer")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the server by its own pid: terminate, then kill if it does not exit within 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


async def session(ctx, url: str, prompt: str, method: str, tokens: int, go: asyncio.Event, ready: list,
                  timeout_ms: int) -> dict:
    """One user: open the page (form prefilled by URL), wait for the common start, press Run."""
    q = urllib.parse.urlencode(dict(method=method, prompt=prompt, max_new_tokens=tokens))
    page = await ctx.new_page()
    out = dict(prompt=prompt, method=method, error=None)
    try:
        await page.goto(f"{url}?{q}", timeout=timeout_ms)
        await page.locator(".speclab-run button").wait_for(timeout=timeout_ms)
        ready.append(prompt)
        await go.wait()
        t0 = time.perf_counter()
        await page.locator(".speclab-run button").click()
        await page.wait_for_function(f"() => ({DEEP_TEXT})('speclab-output') !== '' || "
                                     f"({DEEP_TEXT})('speclab-alert') !== ''", timeout=timeout_ms)
        out["latency_s"] = time.perf_counter() - t0
        out["alert"] = await page.evaluate(DEEP_TEXT, "speclab-alert")
        out["prompt_shown"] = await page.evaluate(DEEP_TEXT, "speclab-prompt-echo")
        out["output_shown"] = await page.evaluate(DEEP_TEXT, "speclab-output")
        out["history_draft"] = "suffix:history" in await page.evaluate(DEEP_TEXT, "speclab-detail")
    except Exception as e:      # a timeout or a page crash is an error of this session, not the run
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    finally:
        await page.close()
    return out


async def drive(url: str, n: int, tokens: int, timeout_ms: int,
                methods: tuple[str, ...] = ("prompt-lookup",)) -> tuple[list[dict], float]:
    from playwright.async_api import async_playwright
    with tempfile.TemporaryDirectory() as tmp:
        async with async_playwright() as p:
            ctx = await p.chromium.launch_persistent_context(tmp, executable_path=CHROMIUM, headless=True,
                                                             args=ARGS)
            go, ready = asyncio.Event(), []
            tasks = [asyncio.create_task(session(ctx, url, pr, methods[i % len(methods)], tokens, go, ready,
                                                 timeout_ms))
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


def reference_outputs(ps: list[str], tokens: int) -> dict[str, str]:
    """Greedy ar in this process: what a lossless method must print for each prompt."""
    import speclab
    from speclab.apps import runs
    ref = {}
    for pr in ps:
        t = speclab.generate("code-target", pr, "ar", max_new_tokens=tokens, record=None).trace
        ref[pr] = runs.output_text(t).replace("\n", "⏎").replace("\t", "⇥") or "∅"
    return ref


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4, help="max new tokens per run")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a session may take")
    ap.add_argument("--no-reference", action="store_true", help="skip the greedy-ar output check")
    ap.add_argument("--methods", default="prompt-lookup,suffix", help="lossless methods the pages take turns with")
    a = ap.parse_args(argv)
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    if not os.path.exists(CHROMIUM):
        print(f"{CHROMIUM} is missing: apt-get install -y chromium", file=sys.stderr)
        return 2
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        proc = start_server(port, log)
        try:
            results, wall = asyncio.run(drive(f"http://127.0.0.1:{port}/", a.sessions, a.tokens,
                                              int(a.timeout * 1000), methods))
        finally:
            stop_server(proc)
    ref = {} if a.no_reference else reference_outputs([r["prompt"] for r in results], a.tokens)
    errors = [r for r in results if r["error"] or r.get("alert")]
    crosstalk = [r for r in results if not r["error"] and not r.get("alert") and
                 (r["prompt_shown"] != r["prompt"] or (ref and r["output_shown"] != ref[r["prompt"]])
                  or r.get("history_draft"))]
    lat = [r["latency_s"] for r in results if "latency_s" in r]
    report = dict(sessions=a.sessions, tokens_per_run=a.tokens, methods=list(methods), wall_s=round(wall, 1),
                  completed=len(lat), errors=len(errors), crosstalk=len(crosstalk),
                  outputs_checked_against_greedy_ar=bool(ref),
                  latency_s=dict(min=round(min(lat), 1), median=round(statistics.median(lat), 1),
                                 max=round(max(lat), 1)) if lat else None,
                  server_log=log.name)
    print(json.dumps(report))
    for r in errors + crosstalk:
        print("  problem:", json.dumps(r, ensure_ascii=False), file=sys.stderr)
    return 0 if not errors and not crosstalk and len(lat) == a.sessions else 1


if __name__ == "__main__":
    sys.exit(main())
