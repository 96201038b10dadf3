"""The target less some of its own sublayers: SWIFT's draft, and Unified Layer Skipping as a decoder.

swift               SWIFT (Xia et al., ICLR 2025, "On-the-Fly Self-Speculative Decoding"): the draft is
                    the target with a set S of the attention and MLP sublayers of layers 1..L-2 left out
                    (models.lean.forward.SkipSet: the residual stream passes them by), through its own
                    norm and head, on the target's own cache: the kept layers' entries for committed
                    tokens are the target's and are reused; the draft's entries past them are dropped
                    before the verify, which writes every layer. A round drafts until the draft's top-1
                    probability falls below `threshold` (the paper's confidence-aware stop) or `max_k`
                    tokens; the full target verifies the chain with the exact rule: lossless.
  the search        S starts as every odd layer (the paper's start) or as the set cached for this task.
                    Once `window` + 1 tokens are generated, every `opt_interval` rounds one candidate is
                    scored by the paper's "matchness": ONE forward of the target less the candidate over
                    the first `window` generated tokens (the prompt's cache reused, the rows in scratch
                    slots past the cache's end), the share of its greedy next-token guesses that equal the
                    text. The first scores S itself; a candidate better than the best so far is kept,
                    otherwise reverted. The search ends past `max_score`, after `max_tolerance`
                    rejections in a row or after `max_opt_iter` candidates. Candidates: `swap` (default)
                    moves one skipped sublayer to a kept one, a local search that suits the few
                    iterations a short request allows; `random` draws a fresh set of
                    m = int(2 (L - 2) skip_ratio) sublayers, the paper's random search. The paper's
                    Bayesian-optimisation step (a Gaussian process proposing every 25th candidate) and
                    its tree of siblings around the drafted chain are not implemented.
  the cache         the best set per (model, task) in a store the caller owns, `history=`: a SkipSets, or
                    the SuffixHistory a dashboard session or a bench pass hands every method that takes
                    `history` (the sets are kept beside its texts). A task whose search ended starts from
                    its set and searches no more (the paper's cache hit); one whose search did not end
                    rescores its set on the new text and goes on from it. No history: the request's own.
unified-layer-skip  Unified Layer Skipping (Liu et al. 2024): no draft and no verify. Every forward of
                    the run, the prompt's too, is the target less an even pattern of whole layers:
                    round(L / speedup) layers run (the first and the last always), spread evenly over the
                    stack, the same for every input. Lossy: its quality is measured against `ar`.

In the trace every round's info holds `skip`, the mask it ran (SkipSet.text: a character a layer,
"." runs, "a" attention skipped, "m" MLP skipped, "x" both), and the decisions: `swift-skip` (the
set a round drafts with, its score and where it came from), `swift-search` (a candidate's score
against the best so far and `max_score`: kept or reverted), `swift-stop` (each draft step's top-1
probability against `threshold`) and `unified-skip` (the pattern a speed-up chose, first round).
figures.skips draws the masks, layers x rounds, over the accepted lengths.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from speclab.decoding.acceptance import greedy_ids, sample, warp
from speclab.decoding.drafters.lookup import RequestStore, SuffixHistory
from speclab.decoding.drafters.model import check_k, host_read
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.models.lean.skips import SkipSet
from speclab.trace import Decision

SEARCHES = ("swap", "random")


def n_layers_of(model) -> int:
    return len(getattr(getattr(model, "model", None), "layers", []))


@dataclass
class Found:
    """What the search found for one (model, task): the best set, its score on the text it was
    scored on (None: never scored), the candidates tried, and whether the search ended."""
    skip: SkipSet
    score: float | None
    iters: int
    done: bool


class SkipSets(RequestStore):
    """SWIFT's skip sets (a Found) by (model, task)."""


def skip_sets(history) -> SkipSets | None:
    """The SkipSets a run's `history` names (RequestStore.named_by); None: none."""
    return SkipSets.named_by(history, "skip_sets", "what earlier requests found")


def sublayers(skip: SkipSet) -> set[tuple[str, int]]:
    return {("attn", i) for i in skip.attn} | {("mlp", i) for i in skip.mlp}


def from_sublayers(flags) -> SkipSet:
    return SkipSet(frozenset(i for k, i in flags if k == "attn"), frozenset(i for k, i in flags if k == "mlp"))


class SwiftDrafter(Drafter):
    name = "swift"

    def __init__(self, target_model, skip_ratio: float = 0.45, threshold: float = 0.8, max_k: int = 25,
                 window: int = 50, max_score: float = 0.93, opt_interval: int = 1, max_opt_iter: int = 1000,
                 max_tolerance: int = 300, search: str = "swap", task: str = "default", history=None):
        super().__init__()
        n = n_layers_of(target_model)
        if n < 3:
            raise ValueError(f"swift skips sublayers of layers 1..L-2 of a Llama-style decoder (model.model.layers); "
                             f"this model has {n} layers")
        check_k(max_k, "max_k")
        for name, v in (("window", window), ("opt_interval", opt_interval), ("max_opt_iter", max_opt_iter),
                        ("max_tolerance", max_tolerance)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name, v in (("skip_ratio", skip_ratio), ("threshold", threshold), ("max_score", max_score)):
            if not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"{name} must be in (0, 1), got {v!r}")
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
        self.n_layers, self.threshold, self.max_k, self.window = n, threshold, max_k, window
        self.max_score, self.opt_interval, self.max_opt_iter = max_score, opt_interval, max_opt_iter
        self.max_tolerance, self.search = max_tolerance, search
        self.flags = [(k, i) for k in ("attn", "mlp") for i in range(1, n - 1)]     # the 2 (L - 2) sublayers
        self.m = max(1, int(len(self.flags) * skip_ratio))
        self.key = (SuffixHistory.key_of(target_model), n, task)
        self.store = skip_sets(history)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        found = self.store.get(self.key) if self.store is not None else None
        if found is None:       # the paper's start: every odd layer of 1..L-2, whole
            found, self.source = Found(SkipSet.layers(range(1, self.n_layers - 1, 2)), None, 0, False), "initial"
        else:
            self.source = "cache"
        self.skip, self.iters, self.done = found.skip, found.iters, found.done
        self.score = found.score            # the current set's score (on another request's text: cached)
        self.best = None                    # the current set's score on THIS request's text
        self.tol, self.since, self.search_forwards = 0, 0, 0

    def end(self):
        if self.store is not None and (self.best is not None or self.source == "cache"):
            self.store.put(self.key, Found(self.skip, self.score, self.iters, self.done))

    # -- a round: maybe one search step, then the draft ----------------------------------------------
    def propose(self, ctx: Context) -> DraftTree:
        decisions = []
        self.since += 1
        if self.due(ctx):
            decisions.append(self.search_step(ctx))
        text = self.skip.text(self.n_layers)
        decisions.append(Decision("swift-skip", {"skipped": len(self.skip), "of": len(self.flags),
                                                 "score": self.score, "source": self.source}, output=text))
        tokens, q_tok, dists, stops = self.draft(ctx)
        tree = DraftTree.chain(tokens, q_tok, "swift", dists, k=len(tokens), skip=text)
        if self.record is not None:
            tree.decisions += decisions + stops
        return tree

    def draft(self, ctx: Context):
        """Up to max_k tokens from the target less self.skip, stopping after the first whose top-1
        probability is below threshold. One host read per step (the stop needs it)."""
        base = self.target.length
        lm = self.target.skip_lm(self.skip)
        inp = torch.tensor(ctx.ids[len(ctx.ids) - ctx.pending:], device=ctx.device)
        tokens, q_tok, dists, stops = [], [], [], []
        for d in range(self.max_k):
            logits = lm.forward(inp, logits_to_keep=1)[-1]                    # (V,)
            if self.sampler.greedy:
                tok = greedy_ids(logits)
                tok_h, top = host_read(tok.reshape(()), logits.softmax(-1)[tok].reshape(()))
                q = top
            else:
                dist = warp(logits, self.sampler)
                tok = sample(dist, self.gen)
                dists.append(dist)
                tok_h, top, q = host_read(tok.reshape(()), dist.max().reshape(()), dist[tok].reshape(()))
            tokens.append(tok_h)
            q_tok.append(q)
            stop = top < self.threshold
            if self.record is not None:
                out = "stop" if stop else ("max_k" if d + 1 == self.max_k else "go")
                stops.append(Decision("swift-stop", {"top1": round(top, 4)}, self.threshold, out, at=d))
            if stop:
                break
            inp = tok.view(1)
        self.target.keep(base)          # the draft's entries: the verify writes every layer of those slots
        self.forwards += lm.forwards
        return tokens, q_tok, (torch.stack(dists) if dists else None), stops

    # -- the search ---------------------------------------------------------------------------------
    def due(self, ctx: Context) -> bool:
        """A search step this round: still searching, `opt_interval` rounds since the last, the
        first window + 1 tokens generated, and room for window scratch slots in the cache."""
        room = getattr(self.target, "max_len", None)
        return (not self.done and self.since >= self.opt_interval and ctx.pending == 1
                and len(ctx.ids) - ctx.n_prompt >= self.window + 1
                and (room is None or self.target.length + self.window <= room))

    def search_step(self, ctx: Context) -> Decision:
        first = self.best is None
        cand, how = (self.skip, "current") if first else (self.candidate(), self.search)
        score = self.matchness(cand, ctx)
        before = self.best
        if first or score > before:
            self.skip, self.best, self.score, self.tol = cand, score, score, 0
            self.source = self.source if first else "search"
            out = "scored" if first else "kept"
        else:
            self.tol += 1
            out = "reverted"
        if not first:
            self.iters += 1
        why = ("score above max_score" if self.best > self.max_score else
               "max_tolerance rejections in a row" if self.tol > self.max_tolerance else
               "max_opt_iter candidates" if self.iters >= self.max_opt_iter else "")
        self.done, self.since = bool(why), 0
        return Decision("swift-search", {"score": round(score, 4), "best": None if before is None else round(before, 4),
                                         "iter": self.iters, "proposal": how, "skip": cand.text(self.n_layers)},
                        self.max_score, out, note=f"search ends: {why}" if why else "")

    def candidate(self) -> SkipSet:
        """`swap`: the current set with one skipped sublayer moved to a kept one; `random` (or a set
        that has nothing to swap): a fresh random set of m sublayers."""
        on = [f for f in self.flags if f in sublayers(self.skip)]
        off = [f for f in self.flags if f not in on]
        g = self.gen
        if self.search == "random" or not on or not off:
            pick = torch.randperm(len(self.flags), generator=g, device=g.device)[: self.m].tolist()
            return from_sublayers(self.flags[i] for i in pick)
        a, b = (int(torch.randint(len(x), (), generator=g, device=g.device)) for x in (on, off))
        return from_sublayers([f for f in on if f != on[a]] + [off[b]])

    @torch.inference_mode()
    def matchness(self, skip: SkipSet, ctx: Context) -> float:
        """The share of the first `window` generated tokens that the target less `skip` guesses
        greedily from the text before them: one forward of those rows in the slots past the cache's
        end, each seeing the prompt's cached entries and the rows before it; the slots dropped after."""
        W, P, past = self.window, ctx.n_prompt, self.target.length
        text = torch.tensor(ctx.ids[P:P + W + 1], device=ctx.device)
        vis = torch.zeros(W, past + W, dtype=torch.bool)
        vis[:, :P] = True
        vis[:, past:] = torch.ones(W, W, dtype=torch.bool).tril()
        logits = self.target.skip_lm(skip).forward_rows(text[:W], torch.arange(P, P + W), vis)   # (W, V)
        self.target.keep(past)
        self.forwards += 1
        self.search_forwards += 1
        return (greedy_ids(logits) == text[1:]).float().mean().item()


def even_pattern(n_layers: int, speedup: float) -> SkipSet:
    """Unified Layer Skipping's pattern: round(L / speedup) layers run (at least the first and the
    last), spread evenly over the stack; the rest are skipped whole."""
    keep = max(2, min(n_layers, round(n_layers / speedup)))
    run = {round(i * (n_layers - 1) / (keep - 1)) for i in range(keep)}
    return SkipSet.layers(set(range(n_layers)) - run)


class UnifiedSkipDrafter(Drafter):
    """Drafts nothing: it sets the target's skip set for the whole run (every forward, the prompt's
    too, decodes with it; the engine's round is then one token of the skipped target) and records
    the pattern."""
    name = "unified-layer-skip"

    def __init__(self, target_model, speedup: float = 1.5):
        super().__init__()
        n = n_layers_of(target_model)
        if n < 3:
            raise ValueError(f"unified-layer-skip skips layers between the first and the last of a Llama-style "
                             f"decoder (model.model.layers); this model has {n} layers")
        if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or speedup < 1:
            raise ValueError(f"speedup must be a number >= 1 (the layers' share of a forward, L / layers run), "
                             f"got {speedup!r}")
        self.n_layers, self.speedup = n, float(speedup)
        self.pattern = even_pattern(n, self.speedup)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        target.skip = self.pattern      # transformers' forward refuses (models.hf.SKIP_REFUSED)
        self.first = True

    def end(self):
        self.target.skip = None

    def propose(self, ctx: Context) -> DraftTree:
        text = self.pattern.text(self.n_layers)
        tree = DraftTree(info={"skip": text})
        if self.first and self.record is not None:
            run = self.n_layers - len(self.pattern.whole)
            tree.decisions.append(Decision("unified-skip", {"speedup": self.speedup, "layers": self.n_layers,
                                                            "run": run}, output=text))
        self.first = False
        return tree
