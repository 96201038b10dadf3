"""What a trace's fields must agree on beyond their types: token ids, probabilities, a draft round's
tree, a diffusion canvas, a DAG's graph. `speclab.trace.check_trace` runs them on every load; each
raises TraceError naming the first field that does not agree (the arguments are speclab.trace's
dataclasses: Round, Trace, DagRun)."""
from __future__ import annotations

from speclab.trace_schema import (DECISIONS, EMITTED_KINDS, MASK, MAX_CANVAS, MAX_DRAFT, MAX_TOKEN_ID,
                                  THRESHOLD_SCALES, _bad, _int, _kind)


def at_least(v, lo, where: str) -> None:
    if v < lo:
        raise _bad(where, f"is {v}, less than {lo}")


def prob(v: float | None, where: str) -> None:
    if v is not None and not 0 <= v <= 1:
        raise _bad(where, f"is {v}, not a probability in [0, 1]")


def token_id(v: int, where: str, masked: bool = False) -> None:
    if not (0 <= v <= MAX_TOKEN_ID or masked and v == MASK):
        raise _bad(where, f"is {v}, not a token id (0 to {MAX_TOKEN_ID}" + (", or -1: masked)" if masked else ")"))


def ids(vs: list[int], where: str, masked: bool = False) -> None:
    for i, v in enumerate(vs):
        token_id(v, f"{where}[{i}]", masked)


def topk_rows(rows: list | None, where: str, n: int | None = None) -> None:
    """[[token, p], ...] (n given: [[vertex, p], ...] with vertices 0..n-1)."""
    for i, row in enumerate(rows or []):
        if len(row) != 2:
            raise _bad(f"{where}[{i}]", f"is {_kind(row)}, not a [token, probability] pair")
        x, p = row
        if float(x) != int(x):
            raise _bad(f"{where}[{i}][0]", f"is {x}, not an integer")
        if n is None:
            token_id(int(x), f"{where}[{i}][0]")
        elif not 0 <= x < n:
            raise _bad(f"{where}[{i}][0]", f"is {x}, not a vertex of the graph (0 to {n - 1})")
        prob(p, f"{where}[{i}][1]")


def check_round(r, where: str) -> None:
    ids(r.path_tokens, f"{where}.path_tokens")
    if r.emitted != MASK:
        token_id(r.emitted, f"{where}.emitted")
    if r.emitted_kind not in EMITTED_KINDS:
        raise _bad(f"{where}.emitted_kind", f"is {r.emitted_kind!r}, not one of {', '.join(EMITTED_KINDS)}")
    if not 0 <= r.kept <= len(r.path_tokens) + 1:
        raise _bad(f"{where}.kept", f"is {r.kept}, not 0 to {len(r.path_tokens) + 1} (its path tokens and the "
                                    "emitted token)")
    if not 0 <= r.drafted <= MAX_DRAFT:
        raise _bad(f"{where}.drafted", f"is {r.drafted}, not 0 to {MAX_DRAFT}")
    topk_rows(r.residual_topk, f"{where}.residual_topk")
    by_id = {}
    for j, n in enumerate(r.nodes):
        at = f"{where}.nodes[{j}]"
        if n.id < 0 or n.id in by_id:
            raise _bad(f"{at}.id", f"is {n.id}, " + ("negative" if n.id < 0 else "the id of an earlier node"))
        by_id[n.id] = n
        token_id(n.token, f"{at}.token")
        for name in ("p", "q", "u"):
            prob(getattr(n, name), f"{at}.{name}")
        for rule, d in {"decision": n.decision, **{f"verdicts[{k!r}]": v for k, v in n.verdicts.items()}}.items():
            if d not in DECISIONS:
                raise _bad(f"{at}.{rule}", f"is {d!r}, not one of {', '.join(DECISIONS)}")
        if n.try_order is not None:
            at_least(n.try_order, 0, f"{at}.try_order")
        topk_rows(n.p_topk, f"{at}.p_topk")
        topk_rows(n.q_topk, f"{at}.q_topk")
    depth = {-1: 0}                     # node id -> its depth along the parent links; -1: the root
    for j, n in enumerate(r.nodes):
        chain, seen = [], set()
        v = n.id
        while v not in depth:           # up to a node whose depth is known: each link walked once
            if v in seen:
                raise _bad(f"{where}.nodes", f"have a cycle of parents through node {v}: a draft tree has none")
            chain.append(v)
            seen.add(v)
            parent = by_id[v].parent
            if parent != -1 and parent not in by_id:
                raise _bad(f"{where}.nodes[{r.nodes.index(by_id[v])}].parent",
                           f"is {parent}, not -1 (the committed token) or the id of a node of the round")
            v = parent
        for u in reversed(chain):
            depth[u] = depth[by_id[u].parent] + 1
        if n.depth != depth[n.id]:
            raise _bad(f"{where}.nodes[{j}].depth", f"is {n.depth}, but its parents put it at depth {depth[n.id]}")
    for j, a in enumerate(r.accepted):
        if r.nodes and a not in by_id or a < 0:
            raise _bad(f"{where}.accepted[{j}]", f"is {a}, not the id of a node of the round")


def check_canvas(t) -> None:
    """A diffusion trace: its canvas size, then every step's positions, tokens and confidences."""
    if "gen_length" not in t.params:
        raise _bad("params", "has no 'gen_length' (the canvas size a diffusion trace records)")
    G = _int(t.params["gen_length"], "params.gen_length")
    if not 1 <= G <= MAX_CANVAS:
        raise _bad("params.gen_length", f"is {G}, not a canvas size (1 to {MAX_CANVAS})")
    for name in ("eos_id", "mask_id"):
        v = t.params.get(name)
        if v is not None:
            token_id(_int(v, f"params.{name}"), f"params.{name}")
    B = t.params.get("block_length")
    if B is not None and _int(B, "params.block_length") < 0:
        raise _bad("params.block_length", f"is {B}, less than 0")
    if not isinstance(t.params.get("block_causal", False), bool):
        raise _bad("params.block_causal", f"is {_kind(t.params['block_causal'])}, not true or false")

    def pos(p: int, where: str) -> None:
        if not 0 <= p < G:
            raise _bad(where, f"is {p}, not a position of the canvas (0 to {G - 1})")

    for i, s in enumerate(t.denoise):
        where = f"denoise[{i}]"
        lo, hi = s.block
        if not 0 <= lo <= hi <= G:
            raise _bad(f"{where}.block", f"is [{lo}, {hi}), not a block of the canvas [0, {G})")
        for name in ("masked", "committed", "remasked"):
            for j, p in enumerate(getattr(s, name)):
                pos(p, f"{where}.{name}[{j}]")
        for name in ("top1", "conf", "margin"):         # each one per masked position, or not recorded
            if len(getattr(s, name)) not in (0, len(s.masked)):
                raise _bad(f"{where}.{name}", f"has {len(getattr(s, name))} entries for {len(s.masked)} masked "
                                              "positions")
        ids(s.top1, f"{where}.top1")
        for name in ("conf", "margin"):
            for j, c in enumerate(getattr(s, name)):
                prob(c, f"{where}.{name}[{j}]")
        if len(s.tokens) not in (0, G):                 # the whole canvas, or not recorded
            raise _bad(f"{where}.tokens", f"has {len(s.tokens)} tokens for a canvas of {G}")
        ids(s.tokens, f"{where}.tokens")
        if s.committed_tokens and len(s.committed_tokens) != len(s.committed):
            raise _bad(f"{where}.committed_tokens", f"has {len(s.committed_tokens)} tokens for "
                                                    f"{len(s.committed)} committed positions")
        ids(s.committed_tokens, f"{where}.committed_tokens")
        masked = set(s.masked)
        for j, p in enumerate(s.committed):
            if p not in masked:
                raise _bad(f"{where}.committed[{j}]", f"is {p}, a position that was not masked before the step")
        if s.committed and not s.committed_tokens and not s.top1:
            raise _bad(where, "commits positions but records no token for them (top1 or committed_tokens)")
        for j, e in enumerate(s.edits):
            pos(e.pos, f"{where}.edits[{j}].pos")
            token_id(e.before, f"{where}.edits[{j}].before", masked=True)
            token_id(e.after, f"{where}.edits[{j}].after", masked=True)
        if s.threshold_scale is not None and s.threshold_scale not in THRESHOLD_SCALES:
            raise _bad(f"{where}.threshold_scale", f"is {s.threshold_scale!r}, not one of "
                                                   f"{', '.join(THRESHOLD_SCALES)}")


def check_dag(g) -> None:
    n = g.num_vertices
    if not 0 <= n <= MAX_CANVAS:
        raise _bad("dag.num_vertices", f"is {n}, not 0 to {MAX_CANVAS}")
    for name in ("emissions_topk", "links_topk"):
        if len(getattr(g, name)) > n:
            raise _bad(f"dag.{name}", f"has {len(getattr(g, name))} rows for {n} vertices")
    if g.pass_prob and len(g.pass_prob) != n:
        raise _bad("dag.pass_prob", f"has {len(g.pass_prob)} entries for {n} vertices")
    for v, p in enumerate(g.pass_prob):
        prob(p, f"dag.pass_prob[{v}]")
    for v, row in enumerate(g.emissions_topk):
        topk_rows(row, f"dag.emissions_topk[{v}]")
    for v, row in enumerate(g.links_topk):
        topk_rows(row, f"dag.links_topk[{v}]", n)
    for name, path in g.paths.items():
        for j, v in enumerate(path):
            if not 0 <= v < n:
                raise _bad(f"dag.paths[{name!r}][{j}]", f"is {v}, not a vertex of the graph (0 to {n - 1})")
    for name, out in g.outputs.items():
        ids(out, f"dag.outputs[{name!r}]")
    if g.chosen not in g.outputs:
        raise _bad("dag.chosen", f"is {g.chosen!r}, not a strategy in dag.outputs")
