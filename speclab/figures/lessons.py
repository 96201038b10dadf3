"""Lessons: each family's mechanism in a few steps over the run on the page, one sentence a step
with the run's own numbers, each step naming the player position that shows it.

    speculative_lesson(trace)   plain decoding -> a draft -> the verify -> accept / reject (on a round
                                with an accepted prefix AND a rejection where the run has one) -> the
                                bonus token, then what the run's data holds: a lossy rule's rescued
                                tokens, several candidates with one kept (SpecTr, RSD), drafting
                                beside verifying (PEARL's lanes), a stopping rule (SpecDec++), and
                                last the speed-up and its cost model
    diffusion_lesson(trace)     the masked canvas -> one forward scores every slot -> several slots
                                committed at once (or why not) -> a forced commit -> a re-mask or an
                                edit -> the block moving on -> tokens per forward
    dag_lesson(trace)           one forward makes the graph -> its links -> each strategy's path ->
                                the answer chosen

Each engine's View (figures.views) declares its lesson beside its figures, so the dashboard, the
Jupyter player and the export (the offline handout) walk the same steps. Nothing is canned: a step
a run cannot show says so ("no guess was rejected in this run"), and every step's `shows` names
what its player position holds ("rejected": the round has a rejected node), which the tests check
against the trace. Sentences are plain text: views escape them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from speclab import metrics
from speclab.figures.costmodel import trace_model
from speclab.trace import ACCEPTED, MASK, REJECTED, Trace

NEWLINE = "\u23ce"         # a newline in a quoted token, as a reader sees it (not a Python escape)


@dataclass(frozen=True)
class LessonStep:
    title: str
    text: str           # one sentence (or two) with the run's numbers
    round: int          # the player's step (0-based) this lesson step shows
    shows: str = ""     # what that step holds: "draft", "rejected", "bonus", "rescued", "siblings", "overlap",
                        # "stop", "committed", "forced", "edited", "block", "path", ... ("": the whole run)

    def as_dict(self) -> dict:
        return asdict(self)


def words(trace: Trace, ids) -> str:
    s = "".join(trace.text_of(i) for i in ids).replace("\r", "").replace("\n", NEWLINE)
    return f"'{s}'" if len(s) <= 60 else f"'{s[:57]}...'"


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


# -- speculative ----------------------------------------------------------------------------------
def speculative_lesson(trace: Trace) -> list[LessonStep] | None:
    """The draft / verify lesson, with a step for each family feature the run recorded; None for a
    run that never drafted."""
    rounds = trace.rounds
    drafted = [k for k, r in enumerate(rounds) if r.drafted and r.nodes]
    if not drafted:
        return None
    t = trace.totals
    draft, target = trace.models.get("draft"), trace.models.get("target")
    tname = target.name if target is not None else "the target"
    dname = draft.name if draft is not None else f"the {trace.method} drafter"
    first = drafted[0]
    r = rounds[first]
    steps = [LessonStep(
        "Plain decoding",
        f"Plain decoding (ar) runs the target, {tname}, once for every token: these {t.new_tokens} new tokens "
        f"would cost {t.new_tokens} target forwards, one after another, each reading all its weights.", 0)]
    guessed = [n.token for n in sorted(r.nodes, key=lambda n: (n.depth, n.id))][:8]
    steps.append(LessonStep(
        "A draft", f"Round {first + 1}: {dname} guessed {plural(r.drafted, 'token')} ahead, {words(trace, guessed)}: "
                   "cheap guesses, not yet checked.", first, "draft"))
    steps.append(LessonStep(
        "The verify", f"The target checks all {plural(r.drafted, 'guess', 'guesses')} in ONE forward over "
                      f"{r.drafted + 1} positions: after each prefix it scores its own next token, so one forward "
                      "can confirm several tokens at once.", first, "draft"))
    steps.append(_reject_step(trace, drafted))
    steps.append(_bonus_step(trace, drafted))
    for extra in (_rescued_step, _siblings_step, _overlap_step, _stop_step):
        step = extra(trace, drafted)
        if step is not None:
            steps.append(step)
    steps.append(_speedup_step(trace))
    return [LessonStep(f"{i + 1}. {s.title}", s.text, s.round, s.shows) for i, s in enumerate(steps)]


def _reject_step(trace: Trace, drafted: list[int]) -> LessonStep:
    rounds = trace.rounds
    # a round that shows both: some guesses accepted, then one rejected (else any rejection)
    both = [(k, n) for k in drafted for n in rounds[k].nodes if n.decision == REJECTED and rounds[k].accepted]
    rej = both[:1] or [(k, n) for k in drafted for n in rounds[k].nodes if n.decision == REJECTED][:1]
    if not rej:
        return LessonStep("Accept or reject", "In this run the target rejected no guess: every draft it judged was "
                          "its own choice too.", drafted[0], "draft")
    k, n = rej[0]
    word = words(trace, [n.token])
    if trace.sampling.temperature == 0:
        why = (f"the target's own top token there was {words(trace, [rounds[k].emitted])}, not {word}, so {word} is "
               "rejected")
    elif n.p is not None and n.q:
        why = (f"{word} had p = {n.p:.2f} under the target and q = {n.q:.2f} under the draft: accepted with "
               f"probability min(1, p/q) = {min(1.0, n.p / n.q):.2f}, and here it was rejected")
    else:
        why = f"{word} was rejected by the {n.rule or 'exact'} rule"
    ok = len(rounds[k].accepted)
    return LessonStep("Accept or reject",
                      f"Round {k + 1}: {plural(ok, 'guess', 'guesses')} accepted, then {why}; everything drafted "
                      "after it is thrown away and the target writes its own token instead (the correction).",
                      k, "rejected")


def _bonus_step(trace: Trace, drafted: list[int]) -> LessonStep:
    rounds = trace.rounds
    bonus = next((k for k in drafted if rounds[k].emitted_kind == "bonus" and rounds[k].accepted), None)
    if bonus is None:
        return LessonStep("The bonus token", "No round had every guess accepted here, so no bonus token: each round "
                          "kept its accepted prefix plus one correction.", drafted[0], "draft")
    b = rounds[bonus]
    return LessonStep("The bonus token",
                      f"Round {bonus + 1}: all {plural(len(b.accepted), 'guess', 'guesses')} on its path accepted, so "
                      f"the verify's last position gives the target's next token for free, "
                      f"{words(trace, [b.emitted])}: {plural(len(b.tokens), 'token')} for one target forward.",
                      bonus, "bonus")


def _rescued_step(trace: Trace, drafted: list[int]) -> LessonStep | None:
    """A lossy rule judged beside exact: the tokens it accepted where exact would not."""
    hits = [(k, n) for k in drafted for n in trace.rounds[k].nodes
            if n.verdicts and n.decision == ACCEPTED and REJECTED in n.verdicts.values()]
    if not hits:
        return None
    k, n = hits[0]
    strict = next(rule for rule, v in n.verdicts.items() if v == REJECTED)
    total = len(hits)
    return LessonStep("A lossy rule rescues tokens",
                      f"Round {k + 1}: the {n.rule or 'ruling'} rule accepted {words(trace, [n.token])}, which the "
                      f"{strict} rule rejected; {plural(total, 'token')} rescued over the run. Each one lengthens "
                      "a round, and each one moves the output away from the target's own distribution: its "
                      "quality is the price (the bench's quality columns).", k, "rescued")


def _siblings_step(trace: Trace, drafted: list[int]) -> LessonStep | None:
    """Several candidates for one position, tried in order, one kept (SpecTr's chains, RSD's tree)."""
    for k in drafted:
        r = trace.rounds[k]
        by_parent: dict[int, list] = {}
        for n in r.nodes:
            by_parent.setdefault(n.parent, []).append(n)
        tried = next((kids for kids in by_parent.values() if sum(n.try_order is not None for n in kids) >= 2), None)
        if tried is None:
            continue
        tried = sorted((n for n in tried if n.try_order is not None), key=lambda n: n.try_order)
        kept = next((n for n in tried if n.decision == ACCEPTED), None)
        said = ", ".join(f"{words(trace, [n.token])} {n.decision.replace('_', ' ')}" for n in tried[:4])
        return LessonStep("Several candidates, one kept",
                          f"Round {k + 1}: {plural(len(by_parent.get(tried[0].parent, [])), 'candidate')} for the same "
                          f"position; the target tried them in turn ({said}) and "
                          + (f"kept {words(trace, [kept.token])}" if kept else "kept none, writing its own token")
                          + ": more candidates, more chances that one is right, still exactly the target's "
                            "distribution.", k, "siblings")
    return None


def _overlap_step(trace: Trace, drafted: list[int]) -> LessonStep | None:
    """Drafting beside verifying (PEARL): a draft span that overlaps a verify span in time."""
    if len(trace.lanes) < 2:
        return None
    spans = [(lane.name, s) for lane in trace.lanes for s in lane.spans]
    for name, a in spans:
        for other, b in spans:
            if other != name and a.what.startswith("draft") and b.what != a.what and \
                    min(a.end_s, b.end_s) - max(a.start_s, b.start_s) > 0:
                hidden = (min(a.end_s, b.end_s) - max(a.start_s, b.start_s)) * 1e3
                return LessonStep("Drafting beside verifying",
                                  f"Round {b.step + 1}: while the target ran its {b.what} on the {other} lane, the draft "
                                  f"kept drafting on the {name} lane, {hidden:.1f} ms of its work hidden under the "
                                  "verify: the timing lanes (Summary) show every overlap.",
                                  min(b.step, len(trace.rounds) - 1), "overlap")
    return None


def _stop_step(trace: Trace, drafted: list[int]) -> LessonStep | None:
    """A stopping rule ended a draft (SpecDec++: p(some reject) against its threshold)."""
    for k in drafted:
        for d in trace.rounds[k].decisions:
            if d.output == "stop" and d.threshold is not None:
                read = ", ".join(f"{key} = {v:.2f}" for key, v in d.inputs.items() if isinstance(v, float))
                return LessonStep("When to stop drafting",
                                  f"Round {k + 1}: the {d.policy} rule read {read} at draft depth {d.at} against its "
                                  f"threshold {d.threshold:.2f} and stopped the draft there: a longer draft risks "
                                  "work the verify throws away, a shorter one leaves tokens on the table.",
                                  k, "stop")
    return None


def _speedup_step(trace: Trace) -> LessonStep:
    t = trace.totals
    m = trace_model(trace)
    head = f"Over the run: {t.new_tokens} tokens in {t.target_forwards} target forwards, tau = {t.tau:.2f} tokens per forward"
    if m is not None and m.get("c") is not None:
        tail = "; " + metrics.plain_reason(m) + "."
    elif m is not None and m.get("token_alpha") is not None:
        tail = (f"; the draft guessed right {metrics.times_in(m['token_alpha'])}. Whether that is faster depends on "
                "what a round costs in plain steps: Compare measures it against ar.")
    else:
        tail = "."
    return LessonStep("The speed-up and its cost model", head + tail, len(trace.rounds) - 1)


# -- diffusion ------------------------------------------------------------------------------------
def diffusion_lesson(trace: Trace) -> list[LessonStep] | None:
    steps_ = trace.denoise
    if not steps_:
        return None
    G = int(trace.params.get("gen_length", len(steps_[0].tokens) or 0))
    B = trace.params.get("block_length") or G
    s0 = steps_[0]
    out = [LessonStep("The masked canvas",
                      f"The answer starts as {plural(G, 'masked slot')}, decoded block by block ({B} slots a "
                      f"block); the model sees the prompt and the whole block at once, not one token at a time.",
                      0, "masked")]
    above = sum(c >= s0.threshold for c in s0.conf) if s0.threshold is not None and s0.threshold_scale == "probability" \
        else None
    out.append(LessonStep("One forward scores every slot",
                          f"Step 1: one forward proposes a token for each of the {len(s0.masked)} masked slots, each "
                          f"with its confidence (the bars)"
                          + (f"; {above} of them {'reaches' if above == 1 else 'reach'} the threshold {s0.threshold:.2f}"
                             if above is not None else "")
                          + ".", 0, "scored"))
    most = max(range(len(steps_)), key=lambda k: len(steps_[k].committed))
    n = len(steps_[most].committed)
    if n >= 2:
        out.append(LessonStep("Several slots at once",
                              f"Step {most + 1} committed {n} slots in ONE forward, "
                              f"{words(trace, [steps_[most].tokens[p] for p in steps_[most].committed[:6]] if steps_[most].tokens else [])}: "
                              "the model was sure of all of them, so they need no forward of their own. That is "
                              "where diffusion decoding saves forwards.", most, "committed"))
    else:
        out.append(LessonStep("One slot at a time",
                              f"No step of this run committed more than {plural(n, 'slot')}: the model was never sure "
                              "of several slots at once, so it paid one forward a token, like plain decoding. A model "
                              "trained for parallel decoding (the toy zoo's) commits many.", most, "committed"))
    forced = next((k for k, s in enumerate(steps_) if s.info.get("forced")), None)
    if forced is not None:
        p = steps_[forced].info["forced"][0]
        out.append(LessonStep("A forced commit",
                              f"Step {forced + 1}: no slot passed the threshold, so the policy committed its most "
                              f"confident one (slot {p}) anyway, to keep decoding moving.", forced, "forced"))
    edit = next(((k, e) for k, s in enumerate(steps_) for e in s.edits), None)
    if edit is not None:
        k, e = edit
        before = "a mask" if e.before == MASK else words(trace, [e.before])
        after = "a mask again" if e.after == MASK else words(trace, [e.after])
        out.append(LessonStep("Taking a token back",
                              f"Step {k + 1}: slot {e.pos} went from {before} to {after}"
                              + (f" ({e.reason})" if e.reason else "")
                              + ": a committed token is not final for a revising policy.", k, "edited"))
    moved = next((k for k in range(1, len(steps_)) if steps_[k].block != steps_[k - 1].block), None)
    if moved is not None:
        (a, b), (c, d) = steps_[moved - 1].block, steps_[moved].block
        out.append(LessonStep("The block moves on",
                              f"Step {moved + 1}: block [{a}, {b}) is filled, so decoding moves on to [{c}, {d}), "
                              "which now sees the block before it as settled text.", moved, "block"))
    t = trace.totals
    out.append(LessonStep("Tokens per forward",
                          f"Over the run: {t.new_tokens} tokens in {t.target_forwards} forwards, "
                          f"{t.new_tokens / max(t.target_forwards, 1):.2f} tokens per forward (plain decoding: 1.00).",
                          len(steps_) - 1))
    return [LessonStep(f"{i + 1}. {s.title}", s.text, s.round, s.shows) for i, s in enumerate(out)]


# -- DAG ------------------------------------------------------------------------------------------
def dag_lesson(trace: Trace) -> list[LessonStep] | None:
    g = trace.dag
    if g is None or not g.paths:
        return None
    names = list(g.paths)
    out = [LessonStep("One forward, a whole graph",
                      f"The model ran ONE forward and wrote a graph of {plural(g.num_vertices, 'vertex', 'vertices')}: "
                      "each vertex proposes tokens, and links say which vertex may follow which.", 0, "graph")]
    strong = sum(1 for row in g.links_topk if row and row[0][1] >= 0.5)
    out.append(LessonStep("Links between vertices",
                          f"{plural(strong, 'vertex', 'vertices')} of {g.num_vertices} have one link of probability "
                          "0.5 or more: where links are sure, every strategy walks the same way.", 0, "graph"))
    for i, name in enumerate(names[:4]):
        path, toks = g.paths[name], g.outputs.get(name, [])
        out.append(LessonStep(f"The {name} strategy",
                              f"{name} walks {plural(len(path), 'vertex', 'vertices')} of the graph and reads "
                              f"{words(trace, toks)}: a different walk of the same graph, no new forward.", i, "path"))
    out.append(LessonStep("The answer",
                          f"The run answers with the {g.chosen} path, {words(trace, g.outputs.get(g.chosen, []))}: "
                          f"{plural(len(g.outputs.get(g.chosen, [])), 'token')} from one forward.",
                          names.index(g.chosen) if g.chosen in names else 0, "path"))
    return [LessonStep(f"{i + 1}. {s.title}", s.text, s.round, s.shows) for i, s in enumerate(out)]
