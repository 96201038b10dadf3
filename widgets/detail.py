"""The detail panel: everything recorded about the current step, as an HTML table."""
from __future__ import annotations

import html

from speclab.figures._util import num, tok, topk_text
from speclab.figures.dag import output_text
from speclab.figures.tree import round_nodes
from speclab.trace import Trace

COLS = ("node", "parent", "token", "q", "p", "u", "decision", "try", "rule", "source")


def round_html(trace: Trace, step: int) -> str:
    r = trace.rounds[step]
    head = (f"<b>round {step + 1} of {len(trace.rounds)}</b>: drafted {r.drafted}, accepted "
            f"{len(r.accepted)}, then the target's {r.emitted_kind} <code>{tok(trace, r.emitted)}</code>; "
            f"{r.kept} token(s) kept. draft {r.draft_s * 1e3:.1f} ms, verify {r.verify_s * 1e3:.1f} ms")
    if r.info:
        head += "<br>policy: " + html.escape(", ".join(f"{k}={v}" for k, v in r.info.items()))
    if r.residual_topk:
        head += f"<br>emitted token drawn from: {topk_text(trace, r.residual_topk)}"
    nodes = round_nodes(r)
    if not nodes:
        return head
    cell = "<td style='padding:0 .6em'>{}</td>"
    rows = ["<tr>" + "".join(f"<th style='padding:0 .6em'>{c}</th>" for c in COLS) + "</tr>"]
    for n in nodes:
        vals = (n.id, n.parent, f"<code>{tok(trace, n.token)}</code>", num(n.q), num(n.p), num(n.u),
                n.decision.replace("_", " "), "" if n.try_order is None else n.try_order + 1,
                html.escape(n.rule), html.escape(n.source))
        bold = " style='font-weight:bold'" if n.id in r.accepted else ""
        rows.append(f"<tr{bold}>" + "".join(cell.format(v) for v in vals) + "</tr>")
    return head + "<table style='font-size:90%;margin-top:.4em'>" + "".join(rows) + "</table>"


def strategy_html(trace: Trace, step: int) -> str:
    run = trace.dag
    name = list(run.paths)[step]
    chosen = " (the trace's chosen output)" if name == run.chosen else ""
    return (f"<b>{html.escape(name)}</b>{chosen}: <code>{html.escape(output_text(trace, name))}</code><br>"
            f"vertex path: {run.paths[name]} ({len(run.paths[name])} of {run.num_vertices} vertices)")


def detail_html(trace: Trace, step: int) -> str:
    if trace.engine == "dag":
        return strategy_html(trace, step)
    return round_html(trace, step)
