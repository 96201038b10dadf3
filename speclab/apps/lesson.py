"""The guided lesson: draft / verify explained in six steps over the run on the page, one sentence
each, with the run's own numbers; each step moves the player to the round that shows it.

    plain decoding -> a draft -> the verify -> accept / reject (p and q) -> the bonus token ->
    the speed-up and its cost model

`lesson(trace)` builds the steps from a speculative trace (None for another engine, or a run that
never drafted); the dashboard's "lesson" toggle shows them above the player, and in lesson mode the
arrow keys (and a presenter's clicker: Page Down / Page Up) move through the lesson instead of the
rounds. Nothing here is canned: a run with no rejection says so in step 4, one with no fully
accepted draft in step 5.
"""
from __future__ import annotations

from dataclasses import dataclass

from speclab import metrics
from speclab.figures.costmodel import trace_model
from speclab.trace import ACCEPTED, REJECTED, Trace


@dataclass
class LessonStep:
    title: str
    text: str           # one sentence (or two) with the run's numbers
    round: int          # the player's step this lesson step shows


def _words(trace: Trace, ids) -> str:
    s = "".join(trace.text_of(i) for i in ids).replace("\n", "\\n")
    return f"'{s}'" if len(s) <= 60 else f"'{s[:57]}...'"


def lesson(trace: Trace | None) -> list[LessonStep] | None:
    if trace is None or not trace.steps_row().verify or not trace.rounds:
        return None
    rounds = trace.rounds
    drafted = [k for k, r in enumerate(rounds) if r.drafted and r.nodes]
    if not drafted:
        return None
    t = trace.totals
    draft = trace.models.get("draft")
    target = trace.models.get("target")
    tname = target.name if target is not None else "the target"
    dname = draft.name if draft is not None else f"the {trace.method} drafter"
    greedy = trace.sampling.temperature == 0
    first = drafted[0]
    r = rounds[first]
    steps = [LessonStep(
        "1. Plain decoding",
        f"Plain decoding (ar) runs the target, {tname}, once for every token: these {t.new_tokens} new tokens "
        f"would cost {t.new_tokens} target forwards, one after another, each reading all its weights.", 0)]
    guessed = [n.token for n in sorted(r.nodes, key=lambda n: (n.depth, n.id))][:8]
    steps.append(LessonStep(
        "2. A draft",
        f"Round {first + 1}: {dname} guessed {r.drafted} token{'s' if r.drafted > 1 else ''} ahead, "
        f"{_words(trace, guessed)}: cheap guesses, not yet checked.", first))
    steps.append(LessonStep(
        "3. The verify",
        f"The target checks all {r.drafted} guesses in ONE forward over {r.drafted + 1} positions: after each "
        "prefix it scores its own next token, so one forward can confirm several tokens at once.", first))
    rej = next(((k, n) for k in drafted for n in rounds[k].nodes if n.decision == REJECTED), None)
    if rej is None:
        steps.append(LessonStep("4. Accept or reject", "In this run the target rejected no guess: every draft it "
                                "judged was its own choice too.", first))
    else:
        k, n = rej
        word = _words(trace, [n.token])
        if greedy:
            why = (f"the target's own top token there was {_words(trace, [rounds[k].emitted])}, not {word}, so "
                   f"{word} is rejected")
        elif n.p is not None and n.q:
            why = (f"{word} had p = {n.p:.2f} under the target and q = {n.q:.2f} under the draft: accepted with "
                   f"probability min(1, p/q) = {min(1.0, n.p / n.q):.2f}, and here it was rejected")
        else:
            why = f"{word} was rejected by the {n.rule or 'exact'} rule"
        ok = sum(1 for x in rounds[k].nodes if x.decision == ACCEPTED)
        steps.append(LessonStep(
            "4. Accept or reject",
            f"Round {k + 1}: {ok} guess{'es' if ok != 1 else ''} accepted, then {why}; everything drafted after it "
            f"is thrown away and the target writes its own token instead (the correction).", k))
    bonus = next((k for k in drafted if rounds[k].emitted_kind == "bonus"), None)
    if bonus is None:
        steps.append(LessonStep("5. The bonus token", "No round had every guess accepted here, so no bonus token: "
                                "each round kept its accepted prefix plus one correction.", first))
    else:
        b = rounds[bonus]
        steps.append(LessonStep(
            "5. The bonus token",
            f"Round {bonus + 1}: all {len(b.accepted)} guesses accepted, so the verify's last position gives the "
            f"target's next token for free, {_words(trace, [b.emitted])}: {len(b.tokens)} tokens for one target "
            "forward.", bonus))
    m = trace_model(trace)
    head = (f"Over the run: {t.new_tokens} tokens in {t.target_forwards} target forwards, tau = {t.tau:.2f} "
            "tokens per forward")
    if m is not None and m.get("c") is not None:
        tail = "; " + metrics.plain_reason(m) + "."
    elif m is not None and m.get("token_alpha") is not None:
        tail = (f"; the draft guessed right {metrics.times_in(m['token_alpha'])}. Whether that is faster depends "
                "on what a round costs in plain steps: Compare measures it against ar.")
    else:
        tail = "."
    steps.append(LessonStep("6. The speed-up and its cost model", head + tail, len(rounds) - 1))
    return steps
