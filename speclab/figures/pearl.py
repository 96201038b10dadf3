"""PEARL's two lanes over time with the mode of every iteration (decoding/drafters/pearl.py).

    pearl_figure(trace, step)   the timing lanes (figures.lanes: a bar per draft forward on the draft
                                lane, per target forward on the target lane, pre- or post-verify)
                                over a "mode" row: one bar per round from its first forward's start
                                to its last forward's end, PRE or POST, a cross where its tests
                                ended in a rejection (hover: the positions tested, the verdicts, the
                                drafts thrown away); `step`'s spans outlined
    has_pearl_lanes(trace)      the trace holds lanes and the rounds their mode

The mode comes from each round's info (kept at every recording level), the hover's detail from its
`pearl` decision where decisions were recorded. Traces: the lanes figure's, then PRE, POST and the
rejections on the mode row, so the trace count is the same at every step.
"""
from __future__ import annotations

from speclab.figures.lanes import has_lanes, lanes_figure
from speclab.trace import Trace

MODE_ROW = "mode"
MODE_COLOR = {"PRE": "#fdd0a2", "POST": "#c7e9c0"}
REJECTED_COLOR = "#d62728"


def has_pearl_lanes(trace: Trace) -> bool:
    return has_lanes(trace) and any("mode" in r.info for r in trace.rounds)


def round_windows(trace: Trace) -> dict[int, tuple[float, float]]:
    """step -> (first start, last end) of its spans on every lane."""
    out: dict[int, tuple[float, float]] = {}
    for lane in trace.lanes:
        for s in lane.spans:
            a, b = out.get(s.step, (s.start_s, s.end_s))
            out[s.step] = (min(a, s.start_s), max(b, s.end_s))
    return out


def _hover(trace: Trace, k: int) -> str:
    r = trace.rounds[k]
    d = next((d for d in r.decisions if d.policy == "pearl"), None)
    head = f"round {k + 1}: {r.info.get('mode')}, {len(r.accepted)} of {r.drafted} tested accepted"
    if d is None:
        return head
    i = d.inputs
    return (head + f"<br>tested output positions {i['tested']}: {', '.join(i['verdicts'])}"
            + f"<br>drafts thrown away {i['rollback']}, cache entries dropped: target {i['target_kv_dropped']}, "
              f"draft {i['draft_kv_dropped']}<br>next mode {d.output}" + (f" ({d.note})" if d.note else ""))


def pearl_figure(trace: Trace, step: int | None = None):
    """The lanes over the mode row; None for a trace without PEARL's lanes."""
    if not has_pearl_lanes(trace):
        return None
    fig = lanes_figure(trace, step)
    win = round_windows(trace)
    steps = [k for k in range(len(trace.rounds)) if k in win]
    for mode in ("PRE", "POST"):
        mine = [k for k in steps if trace.rounds[k].info.get("mode") == mode]
        fig.add_bar(orientation="h", y=[MODE_ROW] * len(mine) or [None], base=[win[k][0] for k in mine] or [None],
                    x=[win[k][1] - win[k][0] for k in mine] or [None], name=f"{mode}-verify round",
                    marker=dict(color=MODE_COLOR[mode], line=dict(color="white", width=1)),
                    hovertext=[_hover(trace, k) for k in mine], hovertemplate="%{hovertext}<extra></extra>")
    bad = [k for k in steps if trace.rounds[k].emitted_kind == "correction"]
    fig.add_scatter(y=[MODE_ROW] * len(bad) or [None], x=[win[k][1] for k in bad] or [None], mode="markers",
                    name="rejection (rolled back)", marker=dict(symbol="x", size=9, color=REJECTED_COLOR),
                    hovertext=[_hover(trace, k) for k in bad], hovertemplate="%{hovertext}<extra></extra>")
    names = [lane.name for lane in trace.lanes]
    switches = sum(1 for a, b in zip(steps, steps[1:]) if trace.rounds[a].info["mode"] != trace.rounds[b].info["mode"])
    fig.update_layout(height=fig.layout.height + 48,
                      title=f"{fig.layout.title.text}; {switches} mode switches, {len(bad)} rejections",
                      yaxis=dict(categoryorder="array", categoryarray=[MODE_ROW] + names[::-1]))
    return fig
