"""lud: Lexical Unit Decoding (Sun et al., LREC-COLING 2024, "Decoding at the Speed of Thought:
Harnessing Parallel Decoding of Lexical Units for LLMs"; tjunlp-lab/Lexical-Unit-Decoding-LUD-). The
target, fine-tuned (speclab/models/lud.py: a low-rank delta merged into a private copy, and one
placeholder embedding), emits a lexical unit, several contiguous tokens it is sure of, per forward.

    forward   ONE forward of the fine-tuned model over the pending token, last forward's unit, and
              k - 1 placeholder rows after them (causal): the last real row gives the next token,
              placeholder j the token j + 1 past it
    unit      the next token, then placeholders 1, 2, ... while each one's probability of its token
              reaches `threshold`; a placeholder that repeats the token before it ends the unit
              (`no_repeat`, LUD's repetition control), and so does a guess of end of text (only
              a real row ends the text) or the round's own next token being it. The unit's tail is
              emitted as the next round's draft: it enters the next forward as real rows (the
              cache must hold it), which costs no extra forward
    accept    rule `unverified` (the paper's): the tail stands, the model's own rows only read it;
              the walk records what the exact rule would have said beside it (a placeholder's guess
              the model's next-token row disagrees with). rule `exact`: those rows verify the tail
              as a chain (a rejection voids the placeholders' guesses: the next forward has none)

What it keeps. Under `unverified` the text is the fine-tuned model's with unverified placeholder
guesses: lossy against the target twice over, the delta (trained to keep the target's next token,
measured as `drift` when training) and the guesses. Under `exact` every token is the fine-tuned
model's own (greedy: its `ar` text token for token); the target's only as far as the delta keeps it.

Recorded per round: the LexicalUnit record (speclab.records) of its forward's placeholders (top-1
token and probability each, the threshold, how many the unit took, why it ended); the draft nodes of
the tail (source "lud") with the exact verdict beside the rule's. figures.lud draws it.
"""
from __future__ import annotations

import time

import torch

from speclab.decoding.acceptance import greedy_ids, warp
from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import host_read
from speclab.decoding.rules import get_rule
from speclab.decoding.rules import rule_params as resolve_rule_params
from speclab.decoding.speculative import Context, Drafter, Outcome, RunState, accept, own_rounds, record_round
from speclab.decoding.tree import DraftTree
from speclab.records import LexicalUnit

RULES = ("unverified", "exact")


def unit_end(tokens: list[int], conf: list[float], threshold: float, before: int, no_repeat: bool,
             eos_id: int | None) -> tuple[int, str]:
    """How many placeholders the unit takes and why it ends: the first slot under `threshold`, or one
    repeating the token before it (`before`: the round's next token), or one guessing end of text (a
    guess never ends the text: the next real row decides); "k" when every slot joined."""
    if eos_id is not None and before == eos_id:
        return 0, "eos"
    prev = before
    for j, (t, c) in enumerate(zip(tokens, conf)):
        if c < threshold:
            return j, "threshold"
        if no_repeat and t == prev:
            return j, "repeat"
        if eos_id is not None and t == eos_id:      # only a real row ends the text
            return j, "eos"
        prev = t
    return len(tokens), "k"


class LudDrafter(Drafter):
    name = "lud"

    def __init__(self, target_model, draft, threshold: float | None = None, k: int | None = None,
                 no_repeat: bool = True, backend: str = "auto"):
        super().__init__()
        from speclab.models.lud import LudAdapter
        if not isinstance(draft, LudAdapter):
            raise ValueError(f"method 'lud' needs a LUD fine-tune as its draft (e.g. code-lud), got {_name(draft)}: "
                             f"train one with `speclab train lud --target ...`")
        draft.check_target(target_model, _name(target_model))
        k = draft.k if k is None else k
        threshold = draft.threshold if threshold is None else threshold
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= draft.k:
            raise ValueError(f"lud: k must be an integer in 1..{draft.k} (the next token plus up to {draft.k - 1} "
                             f"placeholders, what this fine-tune was trained for; 1 is plain decoding), got {k!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"lud: threshold must be a probability in (0, 1] (a placeholder joins the unit when "
                             f"its token's probability reaches it), got {threshold!r}")
        self.adapter, self.target_model, self.backend = draft, target_model, backend
        self.k, self.threshold, self.no_repeat = k, float(threshold), bool(no_repeat)

    def begin(self, ctx, target, sampler, gen, record="light"):
        from speclab.models.backends import make_lm
        super().begin(ctx, target, sampler, gen, record)
        self.lm = make_lm(self.adapter.merged(self.target_model), "lud", self.backend)
        if not hasattr(self.lm, "embed_ids"):
            raise ValueError("lud's placeholders enter the forward as input vectors, which only speclab's lean "
                             "forward takes: use backend='lean' (or 'auto'), not 'hf'")
        self.lm.reset()
        self.pad = self.adapter.pad_embedding.detach().to(self.lm.device, self.lm.dtype)
        self.tail = None                         # (tokens, q of each, q rows or None): the next round's draft

    def propose(self, ctx: Context) -> DraftTree:
        if not self.tail:
            return DraftTree(info={"shape": "chain", "k": 0})
        tokens, q_tok, q = self.tail
        return DraftTree.chain(tokens, q_tok, "lud", q, k=len(tokens))

    # -- a round: one forward ------------------------------------------------------------------
    def round(self, s: RunState, ctx: Context, eos_id: int | None):
        t0 = time.perf_counter()
        lm, base = self.lm, self.lm.length
        tree = self.propose(ctx)
        t1 = time.perf_counter()
        pending = ctx.ids[len(ctx.ids) - ctx.pending:]
        inputs = pending + tree.tokens
        m = self.k - 1
        x = lm.embed_ids(torch.tensor(inputs, device=lm.device))
        if m:
            x = torch.cat([x, self.pad.expand(m, -1)])
        logits = lm.forward(None, embeds=x, logits_to_keep=1 + len(tree) + m)      # (1 + N + m, V)
        rows, slots = logits[:1 + len(tree)], logits[1 + len(tree):]
        top = greedy_ids(rows).tolist() if s.sampler.greedy else None               # one host transfer
        (path, emitted, dist, tries), p_at = accept(s, tree, rows, top)
        lm.keep_positions(base + len(pending), path)
        out = Outcome(tree, path, emitted, len(ctx.ids) - ctx.pending + len(pending), rows, inputs, len(pending),
                      len(pending) - 1)
        t2 = time.perf_counter()
        unit = self.next_tail(slots, emitted, len(path) == len(tree), eos_id)
        t3 = time.perf_counter()
        rnd = record_round(s, out, tries, dist, p_at)
        rnd.info.update(unit)
        rnd.draft_s, rnd.verify_s = (t1 - t0) + (t3 - t2), t2 - t1
        return rnd, out.accepted_tokens + [emitted]

    def next_tail(self, slots: torch.Tensor, emitted: int, whole: bool, eos_id: int | None) -> dict:
        """The placeholders' guesses past `emitted` -> the next round's draft (self.tail) and the
        round's LexicalUnit record. whole: the round kept all of its draft (else the guesses, made
        after a token the verify rejected, are void)."""
        if not len(slots):
            self.tail = None
            return {} if self.record is None else \
                LexicalUnit(lud_slots=[], lud_threshold=self.threshold, lud_span=0, lud_end="k").info()
        if self.sampler.greedy:
            q = slots.float().softmax(-1)
            conf, tok = q.max(-1)
            tokens, conf = host_read(tok, conf)
            q_rows = None
        else:
            q_rows = warp(slots, self.sampler)
            tok = torch.multinomial(q_rows, 1, generator=self.gen)[:, 0]
            tokens, conf = host_read(tok, q_rows.gather(1, tok[:, None])[:, 0])
        n, end = unit_end(tokens, conf, self.threshold, emitted, self.no_repeat, eos_id) if whole else (0, "rejected")
        self.tail = (tokens[:n], conf[:n], None if q_rows is None else q_rows[:n]) if n else None
        if self.record is None:
            return {}
        return LexicalUnit(lud_slots=[[int(t), round(float(c), 4)] for t, c in zip(tokens, conf)],
                           lud_threshold=self.threshold, lud_span=n, lud_end=end).info()

    # -- the loop ----------------------------------------------------------------------------------
    def decode_loop(self, target, prompt_ids: list[int], max_new_tokens: int, sampler, seed: int = 0,
                    record: str | None = "light", eos_id: int | None = None, progress=None, rule: str = "unverified"):
        """Rounds of one forward each until max_new_tokens or EOS, on the fine-tuned copy (the run's
        target forward stays unused). Returns (new ids, rounds, totals)."""
        if rule not in RULES:
            raise ValueError(f"lud accepts its unit's tail by rule 'unverified' (the paper's) or 'exact' (verified "
                             f"by the next forward), got rule={rule!r}")
        gen = torch.Generator(device=target.device).manual_seed(seed)
        ctx = Context(list(prompt_ids), len(prompt_ids), len(prompt_ids), target.device)
        self.begin(ctx, target, sampler, gen, record)
        walk = get_rule(rule).make(resolve_rule_params(rule, None), None)
        s = RunState(self.lm, self, sampler, gen, record, self.lm.config.vocab_size, walk, rule)
        return own_rounds(s, ctx, lambda rounds: self.round(s, ctx, eos_id), self.lm, max_new_tokens, eos_id, progress,
                          self.end)
