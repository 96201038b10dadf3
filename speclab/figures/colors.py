"""The colours every speclab view shares, in one place, so a token, a node and a legend agree."""

# where an output token came from (token strip, summary strip)
ORIGIN = {
    "prompt": "#d9d9d9",
    "accepted": "#8fd19e",      # a draft token the target accepted
    "correction": "#f4a259",    # the target's token after a rejection
    "bonus": "#7fb3ff",         # the target's extra token after a fully accepted path
    "target": "#c9b6e4",        # a plain target step: nothing was drafted
}
ORIGIN_LABEL = {"prompt": "prompt", "accepted": "accepted draft", "correction": "correction",
                "bonus": "bonus", "target": "target (no draft)"}

# what the acceptance rule decided for a draft node (draft tree)
DECISION = {"accepted": "#2ca02c", "rejected": "#d62728", "not_reached": "#bbbbbb"}
DECISION_LABEL = {"accepted": "accepted", "rejected": "rejected", "not_reached": "not reached"}

CONTEXT = "#555555"             # the committed token a draft hangs from
EDGE = "#c8c8c8"
PATH = "#2ca02c"                # the accepted path's edges
CURRENT = "#222222"             # outline of the current step in strips
DRAFT_TIME, VERIFY_TIME = "#9ecae1", "#3182bd"

# one colour per DAG decoding strategy, stable across figures
STRATEGY = {"greedy": "#1f77b4", "lookahead": "#ff7f0e", "viterbi": "#2ca02c", "sample": "#d62728",
            "beam": "#9467bd", "vanilla": "#8c564b"}
_EXTRA = ["#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def strategy_color(name: str, i: int = 0) -> str:
    return STRATEGY.get(name, _EXTRA[i % len(_EXTRA)])

# a diffusion canvas position after a denoising step (canvas view, decoding-order map)
CANVAS = {"earlier": "#8fd19e", "now": "#f4a259", "masked": "#e3e3e3"}
CANVAS_LABEL = {"earlier": "committed earlier", "now": "committed this step", "masked": "still masked"}
# DiffusionGemma's canvas starts as random tokens, not masks: slots re-noised this step, slots that
# keep their sample (accepted by the entropy bound; not final until the block commits its argmax)
NOISE = {"noise": "#e4d4f4", "sampled": "#bfe6c8"}
NOISE_LABEL = {"noise": "random token (re-noised)", "sampled": "accepted sample (provisional)"}
# a committed token a revising policy (LLaDA 2.1's token editing) changed this step; the canvas's
# edit marks carry the legend entry and the cell's hover says which
EDIT = {"rewritten": "#c39bd3", "remasked": "#f7c6c7"}
PROPOSAL = {"now": "#f4a259", "block": "#7fb3ff", "outside": "#cfdff5"}   # confidence bars
PROPOSAL_LABEL = {"block": "confidence (active block)", "outside": "confidence (later blocks)"}
BLOCK_FILL, BLOCK_LINE = "rgba(31,119,180,0.10)", "rgba(31,119,180,0.55)"
THRESHOLD = "#d62728"
REFERENCE = "#bdbdbd"           # the baseline run in comparisons (ar, one token per step)
# a layer in a skip mask (figures.skips): the characters of SkipSet.text
SKIP = {".": "#eeeeee", "a": "#f4a259", "m": "#7fb3ff", "x": "#555555"}
