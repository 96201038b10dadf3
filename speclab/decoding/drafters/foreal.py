"""FoReaL-Decoding: the target leads each sentence's first tokens, the draft finishes it (lossy).

FoReaL-Decoding (Li et al. 2025, "What makes Reasoning Models Different? Follow the Reasoning Leader
for Efficient Decoding"): where a strong and a weak model disagree is mostly the first tokens of a
sentence (the paper's Local Misalignment Diminish), so the strong model, the *leader* (here the
target), writes those and the draft model writes the rest of the sentence, unverified. A stochastic
gate interpolates between the two models (speclab's reading of it, from the paper's abstract):

    gate     at each sentence start, u ~ U(0, 1) from the run's generator: the leader leads the
             sentence where u < p, else the draft writes all of it (p = 1: every sentence led;
             p = 0: the draft alone, but for the one token each round the leader writes)
    lead     a led sentence's first n tokens are the leader's: rounds that draft nothing, one
             target forward a token
    hand     then the draft writes on until the next sentence start that the gate hands to the
             leader (a sentence the gate gives the draft is drafted through), at most max_k tokens
             a round, or its end-of-text token
    read     the target runs once over the draft's tokens (the verify forward, under the rule
             `unverified`, rules/unverified.py: every token kept), so its cache holds them; the
             round's bonus from p is the leader's first token of the next sentence

A sentence starts at a token after one holding a newline, or at a token that begins with a space
after one ending in ".", "!" or "?" (read from the target's tokenizer, `Sentences`). A drafted token
that starts a led sentence is dropped from the chain: the leader writes that position.

Under rule="exact" the same drafts are verified instead: sentence-level speculative decoding, which
keeps `ar`'s text. The gate's draws come from the run's generator whatever the recording level.

In the trace each round's info holds a Handoff record (who wrote it, the sentence it began in, where
sentences started among its tokens); decisions: `foreal` per round (the sentence, the leader's tokens
in it so far, n; output "leader" or "draft") and `foreal-gate` per sentence (u against p; output the
sentence's owner). The rule records, per draft token, the leader's own greedy token and exact's
verdict: where they differ, the draft and the leader part ways (the paper's misalignment).

Defaults: n = 4 and p = 0.8 (the paper sweeps both); max_k = 32, a verify that stays one bucket of the
static runner.
"""
from __future__ import annotations

import functools

import torch

from speclab.decoding.drafters.model import DraftModelDrafter
from speclab.decoding.drafters.specdecpp import _eos_ids
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree
from speclab.records import Handoff
from speclab.trace import Decision

LEADER, DRAFT = "leader", "draft"


class Sentences:
    """Which token ids start a sentence after which: from the tokenizer's text of every id."""

    def __init__(self, texts: list[str]):
        self.newline = frozenset(i for i, t in enumerate(texts) if "\n" in t)
        self.stop = frozenset(i for i, t in enumerate(texts) if t.rstrip(" ").endswith((".", "!", "?")))
        self.space = frozenset(i for i, t in enumerate(texts) if t.startswith(" "))

    def starts(self, prev: int, tok: int) -> bool:
        """Does `tok`, after `prev`, begin a sentence?"""
        return prev in self.newline or (prev in self.stop and tok in self.space)


@functools.lru_cache(maxsize=4)
def _sentences_of(where: str) -> Sentences:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(where)
    return Sentences(tok.batch_decode([[i] for i in range(len(tok))]))


def sentences_of_target(target, draft) -> Sentences:
    """The target's sentence starts, from the tokenizer of the model's own name or directory."""
    from speclab.models.zoo import resolve, tokenizer_dir
    name = getattr(target, "name_or_path", "") or ""
    try:
        return _sentences_of(tokenizer_dir(resolve(name)))
    except (OSError, ValueError) as e:
        raise ValueError(f"foreal reads where sentences start from the target's tokenizer, and none loads from "
                         f"{name!r} ({str(e).splitlines()[0][:80]}): load the target by zoo name or "
                         "directory") from e


class ForealDrafter(DraftModelDrafter):
    name = "foreal"

    def __init__(self, draft, sentences: Sentences, n: int = 4, p: float = 0.8, max_k: int = 32,
                 backend: str = "auto"):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"foreal: n must be an integer >= 1 (the leader's tokens at a sentence's start), got {n!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"foreal: p must be in [0, 1] (the chance the leader leads a sentence), got {p!r}")
        if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
            raise ValueError(f"foreal: max_k must be an integer >= 1 (draft tokens a round at most), got {max_k!r}")
        super().__init__(draft, backend, k=max_k, max_k=max_k)
        self.sentences, self.n, self.p, self.eos = sentences, n, float(p), _eos_ids(draft)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.sentence, self.lead, self.led, self.carry, self.n_prompt = -1, False, 0, None, ctx.n_prompt
        self.gates: list[Decision] = []

    def starts(self, prev: int | None, tok: int) -> bool:
        """Does `tok` begin a sentence after `prev` (None: it is the output's first token)?"""
        return prev is None or self.sentences.starts(prev, tok)

    def reads_each_step(self) -> bool:
        return True

    def gate(self) -> tuple[bool, float]:
        u = torch.rand((), generator=self.gen, device=self.gen.device).item()
        return u < self.p, u

    def start_sentence(self, gate: tuple[bool, float]) -> None:
        self.sentence += 1
        (self.lead, u), self.led = gate, 0
        if self.record is not None:
            self.gates.append(Decision("foreal-gate", {"u": round(u, 6)}, threshold=self.p,
                                       output=LEADER if self.lead else DRAFT, at=self.sentence))

    def propose(self, ctx: Context) -> DraftTree:
        self.drawn, self.dropped, self.carry_at = {}, 0, None
        self.prev = ctx.ids[-1] if len(ctx.ids) > self.n_prompt else None
        if self.lead and self.led < self.n:             # the leader writes this token: nothing drafted
            tree = DraftTree()
        else:
            pending = ctx.ids[self.lm.length:]          # the draft cache holds a prefix of ctx.ids
            tokens, q_tok, dists = self.run_chain(self.lm_step(self.lm), torch.tensor(pending, device=ctx.device))
            keep = len(tokens) - self.dropped
            tree = DraftTree.chain(tokens[:keep], q_tok[:keep], "draft", None if dists is None else dists[:keep], k=keep)
        owner = DRAFT if len(tree) else LEADER
        tree.info.update(Handoff(owner=owner, sentence=max(self.sentence, 0)).info())
        if self.record is not None:
            tree.decisions.append(Decision(self.name, {"sentence": self.sentence, "led": self.led, "n": self.n},
                                           output=owner))
        return tree

    def stop_after(self, i: int, token: int, q_tok: float) -> bool:
        """After draft token i: a sentence start takes its gate (one carried from a dropped start, or
        a new draw; observe books it); one the leader leads ends the chain without this token; so do
        the end-of-text token and max_k."""
        if self.starts(self.prev, token):
            if self.carry is not None and self.carry_at is None:
                self.drawn[i], self.carry_at = self.carry, i
            else:
                self.drawn[i] = self.gate()
            if self.drawn[i][0]:
                self.dropped = 1
                return True
        self.prev = token
        return token in self.eos or i + 1 >= self.max_k

    def observe(self, out: Outcome) -> None:
        """Walk the committed tokens, the draft's accepted ones then the leader's emitted one: each
        sentence start takes the gate drawn for it in the chain (the leader's token: the carried
        gate, the dropped start's, or a new draw), and the leader's token counts toward n."""
        super().observe(out)
        acc = out.accepted_tokens
        if self.carry_at is not None and self.carry_at < len(acc):
            self.carry = None                           # the carried gate went to a start the draft wrote
        dropped = self.drawn.get(len(acc)) if len(acc) == len(out.tree) else None
        prev = None if out.prefix_len == self.n_prompt else out.inputs[out.n_pending - 1]
        starts = []
        for j, tok in enumerate(acc + [out.emitted]):
            leader = j == len(acc)
            if self.starts(prev, tok):
                gate = self.drawn[j] if not leader else (self.carry or dropped or self.gate())
                if leader:
                    self.carry = None
                self.start_sentence(gate)
                starts.append(j)
            elif leader and dropped is not None:
                self.carry = dropped                    # the dropped start's gate waits for its sentence
            if leader and self.lead:
                self.led += 1                           # the leader's token of a sentence it leads
            prev = tok
        if starts:
            out.tree.info["starts"] = starts
        out.tree.decisions.extend(self.gates)
        self.gates = []
