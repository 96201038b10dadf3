"""What the dashboard says to a first-time visitor: what to look at, a glossary, preset prompts that
show each method at its best, and the recorded example run the page opens on.

The example runs are traces saved by `python scripts/record_examples.py` (real decodes, recorded
"full"), one per method the page offers, made as the page makes them (the form's target, draft,
prompt and knobs), so every method opens on a real run at once, before any model is loaded.
tests/test_examples.py keeps them complete and fresh.
"""
from __future__ import annotations

import functools
from pathlib import Path

from speclab.trace import Trace, TraceError

EXAMPLES = Path(__file__).resolve().parent / "examples"

# one paragraph of what to look at, per engine of the chosen method
INTRO = {
    "speculative": """**What you are looking at.** A *draft* proposes a few tokens cheaply; the *target* model checks
them all in **one** forward and keeps the longest prefix it agrees with, plus one token of its own. Step
through the rounds with the player (or the &larr; &rarr; keys): green tokens came from the draft and were
accepted, the target wrote the rest. The tree below the text shows each round's proposals, which ones the
target accepted, and why (hover a node for p, q and the rule). **Compare** races `ar` (one forward per
token) against other methods on the same prompt.""",
    "diffusion": """**What you are looking at.** A diffusion LM writes into a canvas of masked slots. Each step is
one forward that proposes a token for every masked slot with a confidence; the *policy* commits the
ones it trusts (above the dashed threshold line) and leaves the rest masked for the next step. Fewer
steps than tokens is the speed-up; committing too eagerly costs quality. Step through with the player
(or the &larr; &rarr; keys); **Summary** shows the order the canvas was written in.""",
    "superposed": """**What you are looking at.** Superposed Decoding writes k drafts for the reader from ONE forward a
token: the model reads a weighted mix of the drafts' last token embeddings, each draft's top candidates are scored by
the model and by an n-gram table, and the best k continuations are kept. It is not speculative: nothing is verified,
and the drafts are the model's guesses, not its own greedy text. Step through with the player to see the k drafts side
by side, their scores and the mix's weights.""",
    "dag": """**What you are looking at.** A Directed Acyclic Transformer predicts a whole graph of tokens in one
forward; decoding is choosing a path through it. Each step of the player is one strategy (greedy,
lookahead, Viterbi, sampling, beam): its path is drawn on the graph, and different paths can give
different, equally valid outputs.""",
}

def intro(method: str) -> str:
    """What to look at for `method`: its engine's paragraph; an engine registered without one (a run-time
    engine of a user's) gets a line that still says where to look."""
    from speclab.apps import runs
    return INTRO.get(runs.engine(method), f"**What you are looking at.** A run of `{method}` "
                     f"({runs.engine(method)} engine): step through it with the player (or the &larr; &rarr; keys).")


GLOSSARY = """| term | meaning |
|---|---|
| **tau** | new tokens per target forward (`ar` = 1; higher is faster, if drafting is cheap) |
| **alpha** | per-token acceptance rate, as in the papers and the cost model: accepted / judged draft tokens (a token after the first rejection of a round is never judged) |
| **drafts kept** | accepted / drafted: every drafted token counted, judged or not (below alpha when drafts run long) |
| **c, round cost** | what one draft + verify round costs, in plain `ar` steps (measured); a round must yield more than c tokens to win |
| **bonus** | the target's own next token after a fully accepted draft: a round always gains >= 1 token |
| **correction** | the token the target writes in place of the first rejected draft token |
| **p / q** | the target's / the draft's probability of a token; a draft token is accepted with min(1, p/q) |
| **residual** | max(0, p - q), normalised: where the correction is drawn from when sampling |
| **lossless** | the output is the one `ar` would write (greedy: token for token; sampling: in distribution) |
| **step (diffusion)** | one forward of a diffusion LM; a policy commits the masked positions it is confident of |"""

# the two tasks every speculative method offers first: one where drafting wins, one where it loses
COPY_TASK = ("edit code: the answer copies the prompt (speculation wins)",
             "Add a docstring to this function and print the whole function again:\n\n"
             "def area(width, height):\n    if width < 0 or height < 0:\n"
             "        raise ValueError('negative size')\n    return width * height", True)
CHAT_TASK = ("chat question: a new answer (speculation loses on a CPU)",
             "Explain in two sentences why the sky is blue.", True)
# method -> [(label, prompt, chat)]: prompts on which the method shows what it does best
PRESETS = {
    "draft-model": [("list", "List five fruits and one fact about each.", True)],
    "prompt-lookup": [("edit code (the answer repeats the prompt)",
                       "Rename the variable x to count in this code and print it again:\n\n"
                       "def total(items):\n    x = 0\n    for item in items:\n        x += item\n    return x", True)],
    "suffix": [("repeat with a change", "Write the sentence 'the quick brown fox jumps over the lazy dog' three "
                                         "times, numbered.", True)],
    "medusa": [("chat question", "Give three tips for learning to program.", True)],
    # a list the model is sure of: several slots pass the threshold per step (an open question: about one)
    "dllm-threshold": [("a list", "List the days of the week.", True),
                       ("chat question", "Explain in two sentences why the sky is blue.", True)],
    "dllm-fastv2": [("a list", "List the days of the week.", True),
                    ("chat question", "Explain in two sentences why the sky is blue.", True)],
    "dllm-freedave": [("a list", "List the days of the week.", True),
                      ("chat question", "Explain in two sentences why the sky is blue.", True)],
    "dag-viterbi": [("a date", "2024-03-05", False)],
}


def presets(method: str) -> list[tuple[str, str, bool]]:
    """The method's presets: a speculative method's start with the task where it wins and the one
    where it loses, so a class sees both."""
    from speclab.apps.runs import verifies
    try:
        speculative = verifies(method)
    except ValueError:
        speculative = False
    return ([COPY_TASK, CHAT_TASK] if speculative else []) + PRESETS.get(method, [])


def example_path(method: str, target: str, draft: str | None) -> Path:
    return EXAMPLES / f"{method}--{target}--{draft or 'none'}.json"


def example_targets(method: str) -> list[str]:
    """The targets an example of `method` was recorded on."""
    return sorted({p.name.split("--")[1] for p in EXAMPLES.glob(f"{method}--*.json")})


def example(method: str, target: str, draft: str | None) -> Trace | None:
    """The recorded example run for this method and pair, if one ships (None otherwise)."""
    path = example_path(method, target, draft)
    if not path.exists():
        return None
    try:
        return Trace.load(path)
    except TraceError:
        return None


# what each diffusion model of the page is, said beside the target picker: the real adapter and the
# toy models a class can set beside it
DIFFUSION_MODELS = {
    "smollm2-dllm": "the real SmolLM2-135M, adapted to block diffusion: it fills blocks of 32 slots left to "
                    "right, each block seeing only the blocks before it",
    "code-dllm": "a toy masked-diffusion model of the zoo trained on Python here: it sees the whole canvas, so "
                 "a sure slot anywhere can be committed in the same step as the others",
    "digits-dllm": "a toy masked-diffusion model of the zoo trained on digit sums: it sees the whole canvas, so "
                   "a sure slot anywhere can be committed in the same step as the others",
    "digits-dgemma": "a toy DiffusionGemma-style model: it denoises a canvas of random tokens (not masks), "
                     "every slot at every step",
}


@functools.lru_cache(maxsize=16)          # the examples ship with the package: read once a process
def slots_per_forward(target: str) -> dict[str, float]:
    """method -> canvas slots committed per forward in `target`'s recorded examples (the parallelism a
    class sees on the page), most parallel first."""
    out = {}
    for path in sorted(EXAMPLES.glob(f"*--{target}--none.json")):
        try:
            t = Trace.load(path)
        except (TraceError, OSError, ValueError):
            continue
        slots = t.params.get("gen_length")
        if t.steps_row().canvas and isinstance(slots, int) and t.totals.target_forwards:
            out[t.method] = slots / t.totals.target_forwards
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def model_note(target: str) -> str:
    """One line beside the target picker on a diffusion method: what the model is, and how many slots
    a forward commits in its recorded examples (the real adapter: about one for most policies)."""
    what = DIFFUSION_MODELS.get(target)
    if what is None:
        return ""
    seen = slots_per_forward(target)
    if not seen:
        return f"**{target}**: {what}."
    shown = ", ".join(f"{m} {v:.1f}" for m, v in list(seen.items())[:3])
    low = "" if len(seen) < 4 else f"; {min(seen.values()):.1f} for the least parallel of its {len(seen)} policies"
    return f"**{target}**: {what}. Slots committed per forward in its recorded examples: {shown}{low}."
