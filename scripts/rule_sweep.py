"""What each lossy acceptance rule buys and what it costs: tau against quality, one curve per rule
(the points, table and figure live in speclab/bench/rule_curve.py).

A sampled bench (`speclab bench --temperature T`) with one row per rule setting gives every row's tau
(tokens per target forward), the analytic total-variation distance of each round's first token from
the target's law (`tv_per_step`; None for a rule without an induced law, such as judge) and the
target's NLL per generated token. This script reads that bench's JSON and draws, per prompt set,
tau against TV and tau against NLL, each rule's settings joined in the order of its parameter; the
exact rule (lossless) is the point at TV 0, and `ar`'s NLL is the dashed line.

    speclab bench --target smollm2-135m --draft smollm2-draft --prompts chat,code-edit --limit 8 \\
        --max-new-tokens 64 --dtype bf16 --temperature 0.7 --seed 0 --json sweep.json --methods \\
        "ar,draft-model[k=4],draft-model[k=4;rule=typical;rule.eps=0.01],..."
    python scripts/rule_sweep.py sweep.json --plot docs/screenshots/rule-sweep.png

It prints the table (markdown) of every row: rule, setting, tau, TV per step, NLL, distinct-2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speclab.bench.rule_curve import figure, table  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="sampled bench JSON (speclab bench --json), one or more")
    ap.add_argument("--plot", help=".png (Chromium) or .html (offline)")
    a = ap.parse_args(argv)
    rows = [r for f in a.json for r in json.loads(Path(f).read_text())["rows"]]
    print(table(rows))
    if a.plot:
        from speclab.bench.plotfile import save_plot
        save_plot(figure(rows), a.plot)


if __name__ == "__main__":
    main()
