"""SpecDec++ (Huang et al., COLM 2025, "SpecDec++: Boosting Speculative Decoding via Adaptive
Candidate Lengths"): draft-model's chain, whose length K a trained head chooses each round.

    head     a_i = P(y_i accepted), from the draft's last hidden state at y_i
             (models.acceptance_head: ResBlocks with shared weights, then Linear(C, 2))
    rule     after drafting y_K:  cum = prod_{i<K} a_i;  stop when 1 - cum > h  (P(some draft
             token is rejected) passes the threshold), always at K = max_k, never before min_k,
             and at the draft's end-of-text token. The paper proves a threshold rule of this form
             optimal for its MDP of draft and verify costs.
    verify   the chain y_1..y_K with the run's acceptance rule: only K changes, so greedy output is
             `ar`'s token for token and sampled output keeps the target's distribution (K depends on
             the draft's own tokens and states, never on the target's).

The paper's head reads y_i's state when the draft runs on y_i, which is the forward that drafts
y_{i+1}: the estimate for the newest token y_K is not there yet when the rule decides, so the rule
weighs y_1..y_{K-1} (a_1 enters at K = 2) and K = 1 never stops on the threshold. A head trained
with `--reads context` (speclab's variant, named in its head.json) reads instead the state that
drafted y_i, so y_K's estimate is there when y_K is drafted and the product runs to K. Every draft
step records Decision("specdec++", {"p_any_reject": 1 - cum, "p_accept": a, "of": the depth a is
for}, threshold=h, output "stop" / "go", at=K), p_any_reject first (the value compared with h, which
the decisions summary plots), and the reason in its note (threshold, max_k, eos; min_k where the
threshold alone would have stopped). The round's info holds the reason its draft stopped.

Defaults: h = 0.3 and min_k = 2 (the paper's README); max_k = 8 (the paper's 20 is for a 7B draft
against a 70B target: here a verify of 9 rows is already costly on a CPU). `head=None` takes the
zoo's head for the draft (`code-specdecpp` for `code-draft`); any other draft needs one trained by
`speclab train specdecpp` (docs/training.md).
"""
from __future__ import annotations

from pathlib import Path


from speclab.decoding.drafters.model import DraftModelDrafter
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.models.acceptance_head import head_info, load_head, paired_head
from speclab.models.parts import resolve_part
from speclab.trace import Decision

STOP, GO = "stop", "go"


def _eos_ids(model) -> set[int]:
    for cfg in (getattr(model, "generation_config", None), model.config):
        eos = getattr(cfg, "eos_token_id", None)
        if eos is not None:
            return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}
    return set()


def resolve_head(head: str | None, draft) -> Path:
    """The head's directory: `head` (a zoo name or a directory), or the zoo's head for this draft."""
    name = getattr(draft, "name_or_path", None)
    return resolve_part(head, lambda: paired_head(name), "specdec++", "head", f"acceptance head for the draft {name!r}",
                        f"specdecpp --draft {name}", "None for the zoo's head")


class SpecDecPPDrafter(DraftModelDrafter):
    name = "specdec++"

    def __init__(self, draft, head: str | None = None, threshold: float = 0.3, min_k: int = 2, max_k: int = 8,
                 backend: str = "auto"):
        for n, v in (("min_k", min_k), ("max_k", max_k)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"specdec++: {n} must be an integer >= 1 (draft tokens per round), got {v!r}")
        if min_k > max_k:
            raise ValueError(f"specdec++: min_k ({min_k}) must be <= max_k ({max_k}); lower min_k or raise max_k")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
            raise ValueError(f"specdec++: threshold must be in (0, 1) (stop once P(some draft token is rejected) "
                             f"passes it; the paper's 0.3), got {threshold!r}")
        super().__init__(draft, backend, k=max_k, max_k=max_k)
        where = resolve_head(head, draft)
        self.head = load_head(where, self.lm.device)
        C, L = draft.config.hidden_size, draft.config.num_hidden_layers
        if self.head.hidden_size != C:
            raise ValueError(f"specdec++: the head in {where} reads states of width {self.head.hidden_size}, the draft "
                             f"{getattr(draft, 'name_or_path', '')!r} writes {C}: it was trained for another draft")
        self.h, self.min_k, self.last_layer, self.eos = float(threshold), min_k, L, _eos_ids(draft)
        self.reads = head_info(where).get("reads", "token")
        self.lm.capture_layers = (L,)           # the draft's last layer, pre-norm (the head norms it)

    def reads_each_step(self) -> bool:
        return True

    def propose(self, ctx: Context) -> DraftTree:
        self.cum, self.why, self.steps = 1.0, "", []
        tree = super().propose(ctx)
        tree.info["stop"] = self.why
        tree.decisions.extend(self.steps)
        return tree

    def stop_after(self, i: int, token: int, q_tok: float) -> bool:
        K = i + 1
        # the state of this step's input: y_{K-1}'s (at K = 1 the last committed token's), the state
        # that drafted y_K: a "token" head scores y_{K-1} with it, a "context" head y_K
        of = K - 1 if self.reads == "token" else K
        a = 1.0 if of == 0 else float(self.head.p_accept(self.lm.captured[self.last_layer][0, -1]))
        self.cum *= a
        risk = 1.0 - self.cum
        note = ""
        if token in self.eos:
            stop, note = True, "eos"
        elif K >= self.max_k:
            stop, note = True, "max_k"
        elif K < self.min_k:
            stop, note = False, "min_k" if risk > self.h else ""
        else:
            stop, note = risk > self.h, "threshold" if risk > self.h else ""
        if stop:
            self.why = note
        if self.record is not None:
            self.steps.append(Decision(self.name, {"p_any_reject": round(risk, 6), "p_accept": round(a, 6), "of": of},
                                       threshold=self.h, output=STOP if stop else GO, at=K, note=note))
        return stop
