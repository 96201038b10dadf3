"""Soak test of the served dashboard: many runs through one server, its resident memory watched.

    .venv/bin/python scripts/soak_dashboard.py --runs 1000

Starts `python -m speclab.apps.serve` on a free 127.0.0.1 port (stopped by its own pid) and drives
it from one headless Chromium (Playwright, Debian's /usr/bin/chromium): a page opens with a run in
its URL, then types a new prompt and presses Run again, --per-page runs in all, and closes, so
sessions come and go as in a classroom. The runs take turns between --methods, each on a prompt of
its own, and each must show its own prompt and an output, with no alert. The page opens on
--target (the code zoo by default: quick runs, and a prompt that is not wrapped in a chat template,
so the page's prompt echo can be compared with it). After every run the
server's resident memory (VmRSS from /proc) is read; the first --warmup runs load the models and
fill the caches, and the growth after them must stay under --max-growth-mb.

Prints a JSON line of progress every --every runs and one at the end; exit code 1 on any error
or on too much growth.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadtest_dashboard import ARGS, CHROMIUM, no_chromium, page_options, start_server  # noqa: E402
from speclab.apps.serve import free_port, stop_process  # noqa: E402
from shadow_text import DEEP_TEXT  # noqa: E402


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def prompt_of(i: int) -> str:
    names = ["parse", "load", "split", "merge", "read", "write", "close", "open", "send", "fetch"]
    return f"def {names[i % len(names)]}_{i}(line):"


def one_run(page, prompt: str, timeout_ms: int, first: bool, url: str, method: str, tokens: int) -> str | None:
    """One run on `page` (the page's first by URL, later ones typed); None when it showed its own
    prompt and an output, else what went wrong."""
    if first:
        q = urllib.parse.urlencode(dict(method=method, prompt=prompt, max_new_tokens=tokens, run=1))
        page.goto(f"{url}?{q}", timeout=timeout_ms)
    else:
        box = page.locator(".speclab-prompt textarea").first
        box.fill(prompt)
        box.press("Tab")                       # the text area sends its value when it loses the focus
        page.wait_for_timeout(200)
        page.locator(".speclab-run button").click()
    page.wait_for_function(f"p => ({DEEP_TEXT})('speclab-prompt-echo') === p || ({DEEP_TEXT})('speclab-alert') !== ''",
                           arg=prompt, timeout=timeout_ms)
    alert = page.evaluate(DEEP_TEXT, "speclab-alert")
    if alert:
        return f"alert: {alert[:200]}"
    if not page.evaluate(DEEP_TEXT, "speclab-output"):
        return "no output shown"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--per-page", type=int, default=10, help="runs per page (session) before it closes")
    ap.add_argument("--warmup", type=int, default=50, help="runs before the memory baseline is taken")
    page_options(ap, methods="prompt-lookup,suffix,draft-model,ar", methods_help=None, timeout=300,
                 timeout_help="seconds one run may take")
    ap.add_argument("--max-growth-mb", type=float, default=50.0)
    ap.add_argument("--every", type=int, default=50, help="print progress every this many runs")
    ap.add_argument("--target", default="code-target",
                    help="the model the page opens on (the code zoo: runs are quick, prompts are not chat)")
    a = ap.parse_args(argv)
    if no_chromium():
        return 2
    if a.warmup >= a.runs:
        ap.error("--warmup must be smaller than --runs")
    from playwright.sync_api import sync_playwright
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    os.environ["SPECLAB_DASHBOARD_TARGET"] = a.target        # the server reads it (start_server copies os.environ)
    port, url = free_port(), ""
    errors, rss, lat = [], [], []
    t_start = time.perf_counter()
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        proc = start_server(port, log)
        url = f"http://127.0.0.1:{port}/"
        try:
            with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
                ctx = p.chromium.launch_persistent_context(tmp, executable_path=CHROMIUM, headless=True, args=ARGS)
                page = None
                for i in range(a.runs):
                    first = page is None or i % a.per_page == 0
                    if first:
                        if page is not None:
                            page.close()
                        page = ctx.new_page()
                    t0 = time.perf_counter()
                    try:
                        err = one_run(page, prompt_of(i), int(a.timeout * 1000), first, url,
                                      methods[(i // a.per_page) % len(methods)], a.tokens)
                    except Exception as e:          # a timeout or a crash of this run
                        err = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                    lat.append(time.perf_counter() - t0)
                    if err:                             # a fresh page (session) for the next run
                        errors.append(dict(run=i, error=err))
                        page.close()
                        page = None
                    rss.append(rss_mb(proc.pid))
                    if (i + 1) % a.every == 0 or i + 1 == a.runs:
                        report = summary(a, i + 1, rss, lat, errors, time.perf_counter() - t_start, log.name)
                        print(json.dumps(report), flush=True)
                ctx.close()
        finally:
            stop_process(proc)
    for e in errors[:20]:
        print("  problem:", json.dumps(e), file=sys.stderr)
    report = summary(a, a.runs, rss, lat, errors, time.perf_counter() - t_start, log.name)
    return 0 if not errors and report["growth_after_warmup_mb"] < a.max_growth_mb else 1


def summary(a, done: int, rss: list[float], lat: list[float], errors: list, wall: float, log: str) -> dict:
    base = rss[a.warmup - 1] if len(rss) >= a.warmup else None
    return dict(runs=done, of=a.runs, errors=len(errors), per_page=a.per_page, tokens_per_run=a.tokens,
                rss_mb=dict(start=round(rss[0], 1), after_warmup=round(base, 1) if base else None,
                            now=round(rss[-1], 1), max=round(max(rss), 1)),
                growth_after_warmup_mb=round(rss[-1] - base, 1) if base else None,
                run_s=dict(median=round(statistics.median(lat), 2), max=round(max(lat), 2)),
                wall_s=round(wall, 1), server_log=log)


if __name__ == "__main__":
    sys.exit(main())
