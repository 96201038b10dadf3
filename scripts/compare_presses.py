"""Compare pressed several times on the same settings, with a one-core CPU hog beside some presses:
does every speed-up stay within 10% of its median, or is it marked unreliable?

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/compare_presses.py [--presses 5] [--hog 2,3]
        [--repeats 5] [--tokens 43] [--methods prompt-lookup,draft-model] [--task chat|copy] [--json out.json]

Drives the dashboard's own Compare (speclab/apps/dashboard.py: compare_now, the code the button runs) on
smollm2-135m with its draft, the chat preset prompt (--task copy: the copy-heavy edit), k = 4, greedy. The hog
(`python -c "while True: pass"`) is started before the listed presses and killed by its PID after
each. Prints per press and method: the speed-up's median and range over the interleaved repeats,
the verdict, and the seconds the press took; then each method's median over the presses and
whether every reliable press lies within 10% of it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presses", type=int, default=5)
    ap.add_argument("--hog", default="2,3", help="1-based presses with a one-core hog beside them")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per method (default: the dashboard's)")
    ap.add_argument("--tokens", type=int, default=43)
    ap.add_argument("--methods", default="prompt-lookup,draft-model")
    ap.add_argument("--task", choices=("chat", "copy"), default="chat",
                    help="the chat question (speculation loses on a CPU) or the copy-heavy edit the page opens on")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    from speclab.apps.dashboard import Dashboard
    from speclab.apps.guide import CHAT_TASK, COPY_TASK
    d = Dashboard()
    f = d.form
    f.target.value = "smollm2-135m"
    f.method.value = "draft-model"
    f.draft.value = "smollm2-draft"
    label, prompt, chat = COPY_TASK if a.task == "copy" else CHAT_TASK
    f.prompt.value, f.chat.value = prompt, chat
    f.max_new_tokens.value, f.k.value, f.temperature.value = a.tokens, 4, 0.0
    d.compare_methods.value = [m for m in a.methods.split(",") if m]
    if a.repeats:
        d.compare_repeats.value = a.repeats
    hogged = {int(x) for x in a.hog.split(",") if x}
    d.compare_now()                                     # loads the models; not counted
    presses = []
    for i in range(1, a.presses + 1):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if i in hogged else None
        try:
            t0 = time.perf_counter()
            rows = d.compare_now()
            took = time.perf_counter() - t0
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        got = {r["method"]: {"speedup": float(r["speed-up vs ar"][:-1]), "spread": r["spread"], "timing": r["timing"],
                             "why": r.get("why", "-")} for r in rows if r["method"] != "ar"}
        presses.append({"press": i, "hog": i in hogged, "seconds": round(took, 2), "methods": got})
        print(f"press {i}{' (hog)' if i in hogged else ''}: {took:.1f} s")
        for m, g in got.items():
            print(f"  {m:<16} {g['speedup']:.2f}x ({g['spread']}) {g['timing']}" + (f"; {g['why']}" if g["why"] != "-" else ""))
    summary = {}
    for m in d.compare_methods.value:
        ups = [p["methods"][m]["speedup"] for p in presses if m in p["methods"]]
        med = statistics.median(ups)
        ok = all(abs(p["methods"][m]["speedup"] - med) <= 0.1 * med or p["methods"][m]["timing"] != "reliable"
                 for p in presses if m in p["methods"])
        summary[m] = {"median": med, "every press within 10% or marked unreliable": ok}
        print(f"{m}: median over presses {med:.2f}x; every press within 10% of it or marked unreliable: {ok}")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump({"presses": presses, "summary": summary}, fh, indent=1)


if __name__ == "__main__":
    main()
