"""The detail panel: everything recorded about the current step, as an HTML table (the Jupyter
player and the dashboard both show it; plain HTML, no UI toolkit)."""
from __future__ import annotations

import html

from speclab import records
from speclab.figures._util import num, per_position, tok, topk_text
from speclab.figures.dag import output_text
from speclab.figures.diffusion import label, step_note
from speclab.figures.steps import step_title
from speclab.figures.tree import round_nodes
from speclab.figures.verdicts import disagrees, rescued_in, verdict_text
from speclab.trace import MASK
from speclab.trace import Trace

COLS = ("node", "parent", "token", "q", "p", "u", "decision", "try", "rule", "source")


def records_text(info: dict, level: str) -> str:
    """A step's info as its typed records, one group a record: "draft shape: k=4; skip mask: skip=..m." """
    groups: dict[str, list[str]] = {}
    for k, v in info.items():
        cls = records.owner(level, k)
        groups.setdefault(cls.name if cls is not None else "other", []).append(f"{k}={v}")
    return html.escape("; ".join(f"{name}: {', '.join(kv)}" for name, kv in groups.items()))


def round_html(trace: Trace, step: int) -> str:
    r = trace.rounds[step]
    if not trace.steps_row().verify:           # an engine that keeps plain steps in rounds: no draft, no verify
        head = (f"<b>{step_title(trace, step)}</b>: {r.kept} token(s) committed: <code>"
                + html.escape("".join(trace.text_of(t) for t in r.tokens)) + "</code>")
        return head + (f"<br>records: {records_text(r.info, 'round')}" if r.info else "")
    head = (f"<b>{step_title(trace, step)}</b>: drafted {r.drafted}, accepted "
            + (f"{len(r.accepted)}, then the target's {r.emitted_kind} <code>{tok(trace, r.emitted)}</code>; "
               if r.emitted >= 0 else f"{len(r.accepted)}, no target token; ") +
            f"{r.kept} token(s) kept. draft {r.draft_s * 1e3:.1f} ms, verify {r.verify_s * 1e3:.1f} ms")
    if r.info:
        head += "<br>records: " + records_text(r.info, "round")
    if r.residual_topk:
        head += f"<br>emitted token drawn from: {topk_text(trace, r.residual_topk)}"
    if rescued_in(r):
        head += f"<br>{rescued_in(r)} token(s) rescued: accepted by the ruling rule where another rule was not"
    nodes = round_nodes(r)
    if not nodes:
        return head
    cell = "<td style='padding:0 .6em'>{}</td>"
    rows = ["<tr>" + "".join(f"<th style='padding:0 .6em'>{c}</th>" for c in COLS) + "</tr>"]
    for n in nodes:
        vals = (n.id, n.parent, f"<code>{tok(trace, n.token)}</code>", num(n.q), num(n.p), num(n.u),
                n.decision.replace("_", " "), "" if n.try_order is None else n.try_order + 1,
                html.escape(n.rule + (f" ({verdict_text(n)})" if disagrees(n) else "")), html.escape(n.source))
        bold = " style='font-weight:bold'" if n.id in r.accepted else ""
        rows.append(f"<tr{bold}>" + "".join(cell.format(v) for v in vals) + "</tr>")
    return head + "<table style='font-size:90%;margin-top:.4em'>" + "".join(rows) + "</table>"


def strategy_html(trace: Trace, step: int) -> str:
    run = trace.dag
    name = list(run.paths)[step]
    chosen = " (the trace's chosen output)" if name == run.chosen else ""
    verdict = {True: " <span style='color:#2ca02c'>valid</span>",
               False: " <span style='color:#d62728'>not a valid answer</span>"}.get(run.valid.get(name), "")
    return (f"<b>{html.escape(name)}</b>{chosen}: <code>{html.escape(output_text(trace, name))}</code>{verdict}<br>"
            f"vertex path: {run.paths[name]} ({len(run.paths[name])} of {run.num_vertices} vertices)")


DENOISE_COLS = ("position", "proposal", "p", "margin", "entropy", "")


def draft_tree_html(trace: Trace, tree: list, accepted: int) -> str:
    """FreeDave's drafts as guesses at the next commits: node k = its parent's canvas + (position,
    token); the accepted path in bold. A tree not of that form (each node [parent, position, token],
    its parent an earlier node or -1) is shown as recorded: walking it could loop."""
    def ok(k, node):
        return (isinstance(node, list) and len(node) == 3 and all(type(x) is int for x in node)
                and node[0] < k)
    if not (all(ok(k, node) for k, node in enumerate(tree)) and type(accepted) is int and accepted < len(tree)):
        return f"draft tree (not in FreeDave's form): {html.escape(str(tree)[:200])}"
    path, k = set(), accepted
    while k >= 0:
        path.add(k)
        k = tree[k][0]
    items = []
    for k, (parent, pos, t) in enumerate(tree):
        text = (f"{k}{'' if parent < 0 else f' (after {parent})'}: position {pos} "
                f"<code>{html.escape(tok(trace, t))}</code>")
        items.append(f"<b>{text} &#10003;</b>" if k in path else text)
    return f"draft tree ({len(tree)} canvases, one forward): " + "; ".join(items)


def denoise_html(trace: Trace, step: int) -> str:
    """One denoising step: what the policy did, then every masked position of the active block
    (and any committed outside it, as an early exit does) with the model's proposal."""
    s = trace.denoise[step]
    lo, hi = s.block
    canvas = "".join(label(trace, t) if t != trace.params.get("mask_id") else "_" for t in s.tokens)
    note = step_note(trace, s)
    head = (f"<b>{step_title(trace, step)}</b>: block [{lo}, {hi}), {len(s.masked)} masked before, "
            f"committed {len(s.committed)} at {s.committed}" + (f"; {html.escape(note)}" if note else "")
            + f"<br>canvas after: <code>{html.escape(canvas)}</code>")
    rest = {k: v for k, v in s.info.items() if k not in ("forced", "finish", "gap", "g", "entropy", "tree")}
    if rest:
        head += "<br>records: " + records_text(rest, "step")
    if s.edits:
        shown = lambda t: "mask" if t == MASK else f"<code>{tok(trace, t)}</code>"
        head += "<br>edits: " + "; ".join(f"position {e.pos} {shown(e.before)} &rarr; {shown(e.after)}"
                                          + (f" ({html.escape(e.reason)})" if e.reason else "") for e in s.edits)
    if isinstance(s.info.get("tree"), list) and s.info["tree"]:
        head += "<br>" + draft_tree_html(trace, s.info["tree"], s.info.get("accepted_node", 0))
    entropy, now = per_position(s.info, "entropy", len(s.masked)), set(s.committed)
    cell = "<td style='padding:0 .6em'>{}</td>"
    rows = ["<tr>" + "".join(f"<th style='padding:0 .6em'>{c}</th>" for c in DENOISE_COLS) + "</tr>"]
    for i, (p, t, c, m) in enumerate(zip(s.masked, s.top1, s.conf, s.margin)):
        if not (lo <= p < hi or p in now):
            continue
        vals = (p, f"<code>{tok(trace, t)}</code>", num(c), num(m), num(entropy[i]) if entropy else "—",
                "committed" if p in now else "")
        bold = " style='font-weight:bold'" if p in now else ""
        rows.append(f"<tr{bold}>" + "".join(cell.format(v) for v in vals) + "</tr>")
    return head + "<table style='font-size:90%;margin-top:.4em'>" + "".join(rows) + "</table>"


def detail_html(trace: Trace, step: int) -> str:
    # by the trace field the engine keeps its steps in (trace.Steps): one table per step type
    return {"dag": strategy_html, "denoise": denoise_html}.get(trace.steps_row().field, round_html)(trace, step)
