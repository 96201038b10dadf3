"""Diffusion commit policies that adapt their schedule or learn it, on the `View` / `Choice`
contract of dllm_policies.py (their method rows are in registry.py): Learn2PD's trained filter, AdaBlock-dLLM's
adaptive blocks, ETE's explore-then-exploit and Fast-dLLM v2's sub-block schedule and cache
(FastV2). Each records what it decided, position by position, as trace Decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from speclab.decoding.dllm_policies import Choice, DiffusionPolicy, Threshold, View, ranked
from speclab.decoding.dllm_revise import p4
from speclab.trace import Decision


@dataclass
class Learn2PD(DiffusionPolicy):
    """Learn2PD ("Learning to Parallel Decode"): a filter trained on this dLLM's own one-per-step runs
    (speclab.models.learn2pd) scores each masked slot of the block: the probability that its
    proposal is already the token one-per-step decoding commits there. Every slot scoring
    >= threshold commits; at least one a step (the most confident, as one-per-step would).
    End of text (end_threshold; None: off): the leftmost masked slot proposing end of text whose
    end score passes it commits that end of text, and the slots after it wait for good: once every
    slot before it is written the run stops (the paper cuts the canvas there). filter: a filter
    directory or zoo name (None: the zoo's filter for this dLLM). Every masked slot's scores are
    recorded each step as Decisions (info["score"]: the block's, by slot)."""
    threshold: float = 0.9
    end_threshold: float | None = 0.9
    filter: str | None = None

    def prepare(self, model, tok):
        self.bind(model, tok.eos_token_id)

    def bind(self, model, eos_id: int | None):
        """The run's dLLM (its zoo name finds the zoo's filter) and end-of-text id (dllm_run)."""
        self._dllm, self._eos = getattr(model, "name_or_path", None), eos_id

    def plan(self, gen_length: int, n_blocks: int) -> int:
        from speclab.models.learn2pd import Stability, load_filter, resolve_filter
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1] (a filter probability), got {self.threshold}")
        if self.end_threshold is not None and not 0 < self.end_threshold <= 1:
            raise ValueError(f"end_threshold must be in (0, 1] or None (no end-of-text prediction), "
                             f"got {self.end_threshold}")
        self._net = load_filter(resolve_filter(self.filter, getattr(self, "_dllm", None)))
        self._eos = getattr(self, "_eos", None)
        self._stab = Stability(gen_length)
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def select(self, v: View) -> Choice:
        from speclab.models.learn2pd import features
        (lo, hi), dev = v.block, v.eligible.device
        stable = self._stab.update(v.x0, v.eligible)
        score, end = self._net.scores(features(v.conf, v.logit_margin, v.entropy, stable, v.eligible, v.x0,
                                               (lo, hi), self._eos))
        elig = v.eligible[lo:hi].cpu()
        x0 = v.x0[lo:hi].cpu()
        is_eos = (x0 == self._eos) if self._eos is not None else torch.zeros_like(elig)
        held = (v.tokens[lo:hi].cpu() == self._eos) & ~elig if v.tokens is not None and self._eos is not None \
            else torch.zeros_like(elig)
        cut = int(held.nonzero()[0]) if held.any() else hi - lo      # slots after an end of text wait
        eot = None
        if self.end_threshold is not None:
            ok = (elig & is_eos & (end >= self.end_threshold)).nonzero().flatten().tolist()
            if ok and ok[0] < cut:
                eot = cut = ok[0]
        alive = elig.clone()
        alive[cut + (eot is not None):] = False
        if not alive.any():                                          # eos_stop off: the rest still fills
            alive = elig
        commit = alive & (score >= self.threshold)
        if eot is not None:
            commit[eot] = True
        forced = []
        if not commit.any():
            best = int(ranked(v.conf[lo:hi].cpu(), alive)[0])
            commit[best], forced = True, [lo + best]
        decisions = []
        for i in elig.nonzero().flatten().tolist():
            out = ("end of text" if i == eot else "forced (best masked)" if lo + i in forced else
                   "commit" if commit[i] else "after end of text" if not alive[i] else "wait")
            decisions.append(Decision("learn2pd filter", {"score": p4(score[i]), "p": p4(v.conf[lo + i]),
                                                          "stable": int(stable[lo + i])}, self.threshold, out, at=lo + i))
            if is_eos[i] and self.end_threshold is not None:
                decisions.append(Decision("learn2pd end of text", {"end score": p4(end[i])}, self.end_threshold,
                                          "end here" if i == eot else "not yet", at=lo + i))
        full = torch.zeros_like(v.eligible)
        full[lo:hi] = commit.to(dev)
        return Choice(full, self.threshold, None, decisions=decisions,
                      info={"forced": forced, "score": [round(float(s), 3) if m else None for s, m in zip(score, elig)],
                            "end_of_text": None if eot is None else lo + eot})


# a token is a delimiter when its text holds a newline or, stripped, ends with one of these
DELIMITERS = {"line": "", "sentence": ".!?", "clause": ".!?,;:"}


def delimiter_ids(texts: list[str], kind: str) -> list[int]:
    """The ids whose token text (texts[id]) ends a line, or a sentence or a clause (DELIMITERS[kind])."""
    ends = DELIMITERS[kind]
    return [i for i, t in enumerate(texts) if "\n" in t or (t.strip() != "" and t.strip()[-1] in ends)]


@dataclass
class AdaBlock(DiffusionPolicy):
    """AdaBlock-dLLM (Lu et al., ICLR 2026; lgxi24/AdaBlock-dLLM, `compute_block_length`): block edges
    where a semantic step ends, read from the confidence's volatility band through its run-time
    proxy, the most confident delimiter. At the first forward of each adaptive block, whose start s
    is the first masked slot of the engine's block [lo, hi):
        W = min(int(window * G), hi - s)                    the look-ahead window (G = gen_length)
        D = masked slots in [s, s + W) proposing a delimiter (a token that ends a line; with
            delimiters="sentence" or "clause" also one ending in . ! ? or , ; :)
        L = d* - s + 1   if d*, the most confident of D, has p(x0) >= delimiter_threshold
            min(default_block, hi - s)   otherwise (no delimiter, or none sure enough)
    then the threshold rule (p(x0) >= threshold, at least the best) inside [s, s + L), from this
    same forward, until the adaptive block is filled.
    speclab's engine keeps its own blocks: a block-causal model (smollm2-dllm) was trained on a
    fixed grid of B slots and caches block by block, so an edge can not move across that grid.
    The adaptive blocks therefore live INSIDE the engine's block: a confident delimiter cuts it
    early (the slots after it wait, still seen by the model, for the next adaptive block), and the
    window and the size are clipped at hi. On a whole-canvas dLLM with block_length unset the
    engine's block is the whole canvas, and these are the paper's blocks.
    delimiter_threshold > 1 never cuts: blocks of default_block under the threshold rule.
    Each adaptive block is a Decision (its delimiter's p against delimiter_threshold, the window,
    the candidates, the chosen length as output, the reason as note), each commit another."""
    threshold: float = 0.9
    delimiter_threshold: float = 0.3
    default_block: int = 32
    window: float = 0.25
    delimiters: str = "line"

    def prepare(self, model, tok):
        self.use_tokenizer(tok)

    def use_tokenizer(self, tok):
        """Read the delimiter ids from the tokenizer's vocabulary (speclab.run calls this)."""
        self._check_delimiters()
        self.set_delimiter_ids(delimiter_ids(tok.batch_decode([[i] for i in range(len(tok))]), self.delimiters))

    def set_delimiter_ids(self, ids):
        self._ids = torch.tensor(sorted({int(i) for i in ids}), dtype=torch.long)

    def _check_delimiters(self):
        if self.delimiters not in DELIMITERS:
            raise ValueError(f"delimiters must be one of {', '.join(DELIMITERS)}, got {self.delimiters!r}")

    def plan(self, gen_length: int, n_blocks: int) -> int:
        Threshold(self.threshold).plan(gen_length, n_blocks)
        self._check_delimiters()
        if not self.delimiter_threshold >= 0:
            raise ValueError(f"delimiter_threshold must be >= 0 (above 1: fixed blocks), "
                             f"got {self.delimiter_threshold}")
        b = self.default_block
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"default_block must be an integer >= 1, got {b!r}")
        if not 0 < self.window <= 1:
            raise ValueError(f"window must be in (0, 1] (a share of gen_length), got {self.window}")
        if getattr(self, "_ids", None) is None:
            raise ValueError("dllm-adablock needs its delimiter ids: run it through speclab.run (which reads "
                             "them from the tokenizer), or call policy.use_tokenizer(tok) first")
        self._G = gen_length
        return gen_length

    def start_block(self, n_masked: int):
        self._span = None                       # the adaptive block [s, e), chosen at its first forward

    def new_block(self, v: View) -> tuple[tuple[int, int], Decision]:
        """The adaptive block from the first masked slot of the engine's block, read from this forward."""
        hi = v.block[1]
        s = int(v.eligible.nonzero()[0])
        W = min(max(int(self.window * self._G), 1), hi - s)
        window = torch.zeros_like(v.eligible)
        window[s:s + W] = True
        cand = (window & v.eligible & torch.isin(v.x0, self._ids.to(v.x0.device))).nonzero().flatten().tolist()
        best = max(cand, key=lambda i: float(v.conf[i]), default=None)      # ties: the leftmost
        p = float(v.conf[best]) if best is not None else 0.0
        if best is not None and p >= self.delimiter_threshold:
            L, why = best - s + 1, "cut at the most confident delimiter"
        else:
            L = min(self.default_block, hi - s)
            why = "no delimiter in the window" if best is None else "delimiter below its threshold"
        d = Decision("adablock block", {"delimiter p": p4(p), "delimiter at": best, "window": [s, s + W],
                                        "candidates": [[i, p4(v.conf[i])] for i in cand[:8]]},
                     self.delimiter_threshold, L, at=s, note=why)
        return (s, s + L), d

    def select(self, v: View) -> Choice:
        decisions = []
        if self._span is None or not v.eligible[self._span[0]:self._span[1]].any():
            self._span, d = self.new_block(v)
            decisions.append(d)
        s, e = self._span
        span = torch.zeros_like(v.eligible)
        span[s:e] = True
        base = Threshold(self.threshold).select(replace(v, eligible=v.eligible & span))
        forced = set(base.info["forced"])
        decisions += [Decision("adablock commit", {"p": p4(v.conf[p])}, self.threshold,
                               "forced (best masked)" if p in forced else "commit", at=p)
                      for p in base.commit.nonzero().flatten().tolist()]
        return Choice(base.commit, self.threshold, "probability", decisions=decisions,
                      info={"forced": base.info["forced"], "adaptive_block": [s, e]})


@dataclass
class ETE(DiffusionPolicy):
    """ETE, explore-then-exploit (Fu et al. 2025, "From Bits to Rounds", arXiv 2511.21103), read from
    its abstract: the paper's full text was not found, so the explore rule, the budget and the
    defaults below are speclab's. A round committing the set S carries I = sum over S of -log p(x0)
    nats; a text of NLL nats needs at least NLL / B rounds when no round carries more than B, and a
    token above a threshold tau carries at most -log tau, so committing only near-certain tokens
    takes many rounds. Each round here:
        exploit: commit every masked slot with p(x0) >= threshold; with cross_block (the abstract's
                 cross-block decoding) every such slot the model saw, later blocks included, else
                 the active block's only; I = their information
        explore: while I < budget and fewer than max_explore are explored, also commit the next
                 uncertain slot of the active block (explore_by="confidence": the most confident
                 below the threshold; "leftmost": the leftmost), adding its -log p(x0) to I
    Explored tokens re-condition the model; the cascade an explored token set off is the number of
    slots below the threshold in its round that pass it in the next (each crossing counted for the
    nearest explored slot, ties to the left). budget=0 or max_explore=0 with cross_block=False is
    the threshold policy (its forced best commit when nothing passes). Cross-block commits need a
    model that saw the later blocks: a whole-canvas dLLM (digits-dllm, code-dllm); a block-causal
    one (smollm2-dllm) saw only its block, where every commit then stays.
    Recorded per round (EteRound): info["information"] (nats committed), ["explore_information"]
    (the explored slots' share), ["information_total"] (nats so far: rounds >= it / budget),
    ["explored"] and ["explored_entropy"] (their entropy, nats), ["outside_block"] (commits outside
    the active block), ["cascade"] ([slot, size] for each slot the round before explored),
    ["crossed"]; and the Decisions "ete exploit", "ete explore", "ete round" (its information against
    the budget) and "ete cascade"."""
    threshold: float = 0.9
    budget: float = 1.0
    max_explore: int = 2
    explore_by: str = "confidence"
    cross_block: bool = True

    def plan(self, gen_length: int, n_blocks: int) -> int:
        Threshold(self.threshold).plan(gen_length, n_blocks)
        if not self.budget >= 0:
            raise ValueError(f"budget must be >= 0 (nats a round; 0: never explore), got {self.budget}")
        m = self.max_explore
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"max_explore must be an integer >= 0 (0: never explore), got {m!r}")
        if self.explore_by not in ("confidence", "leftmost"):
            raise ValueError(f"explore_by must be confidence or leftmost, got {self.explore_by!r}")
        if not isinstance(self.cross_block, bool):
            raise ValueError(f"cross_block must be true or false, got {self.cross_block!r}")
        self._last, self._total = None, 0.0     # (slots explored, slots left below the threshold); nats so far
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def cascades(self, v: View, scope: torch.Tensor) -> tuple[list, list[Decision], int]:
        """The slots that crossed the threshold since the last round, each counted for the nearest
        slot that round explored: ([slot, size] per explored slot, their Decisions, crossings)."""
        if self._last is None:
            return [], [], 0
        explored, below = self._last
        crossed = [p for p in below if scope[p] and v.conf[p] >= self.threshold]
        by = {e: [] for e in explored}
        for p in crossed if explored else ():
            by[min(explored, key=lambda e: (abs(e - p), e))].append(p)
        ds = [Decision("ete cascade", {"crossed": ps[:16]}, None, len(ps), at=e,
                       note="slots below the threshold in its round, above it now") for e, ps in by.items()]
        return [[e, len(ps)] for e, ps in by.items()], ds, len(crossed)

    def select(self, v: View) -> Choice:
        lo, hi = v.block
        scope = v.masked if self.cross_block else v.eligible        # where the threshold may commit
        cascade, decisions, crossed = self.cascades(v, scope)
        nats = -v.conf.double().clamp_min(1e-30).log()            # (G,) information of each proposal
        ent = v.entropy
        exploit = scope & (v.conf >= self.threshold)
        info = float(nats[exploit].sum())
        decisions += [Decision("ete exploit", {"p": p4(v.conf[p])}, self.threshold, "commit", at=p,
                               note="" if lo <= p < hi else "outside the active block")
                      for p in exploit.nonzero().flatten().tolist()]
        uncertain = v.eligible & ~exploit
        order = ranked(v.conf, uncertain) if self.explore_by == "confidence" else uncertain.nonzero().flatten()
        explored, explore_info = [], 0.0
        for p in order.tolist():
            if len(explored) >= self.max_explore or info >= self.budget:
                break
            decisions.append(Decision("ete explore", {"round information": p4(info), "p": p4(v.conf[p]),
                                                      "-log p": p4(nats[p]),
                                                      "entropy": None if ent is None else p4(ent[p])},
                                      self.budget, "explore", at=p))
            explored.append(p)
            info += float(nats[p])
            explore_info += float(nats[p])
        commit = exploit.clone()
        commit[explored] = True
        if not commit.any() and v.eligible.any():                   # no exploring: the threshold rule's best
            best = int(ranked(v.conf, v.eligible)[0])
            commit[best] = True
            info += float(nats[best])
            decisions.append(Decision("ete exploit", {"p": p4(v.conf[best])}, self.threshold,
                                      "forced (best masked)", at=best))
        self._total += info
        outside = int(commit.sum()) - int(commit[lo:hi].sum())
        decisions.append(Decision("ete round", {"information": p4(info), "committed": int(commit.sum()),
                                                "explored": len(explored), "crossed": crossed,
                                                "outside block": outside, "information so far": p4(self._total)},
                                  self.budget, len(explored)))
        self._last = (explored, (scope & ~commit & (v.conf < self.threshold)).nonzero().flatten().tolist())
        return Choice(commit, self.threshold, "probability", decisions=decisions, cross_block=self.cross_block,
                      info={"information": p4(info), "explore_information": p4(explore_info),
                            "information_total": p4(self._total), "explored": explored,
                            "explored_entropy": [None if ent is None else p4(ent[p]) for p in explored],
                            "outside_block": outside, "cascade": cascade, "crossed": crossed})


FASTV2_CACHES = ("sub-block", "block", "none")


@dataclass
class FastV2(DiffusionPolicy):
    """Fast-dLLM v2 (Wu et al. 2025, NVlabs/Fast-dLLM `v2/`) on a block-diffusion LM: the engine's
    block is cut into sub-blocks of `sub_block` slots (the last one clipped at the block's end),
    filled left to right. Each step works on the leftmost sub-block holding a mask: its masked
    slots with p(x0) > threshold commit, at least the most confident. A block's first slot is the
    AR next token (a shifted model predicts it from the last committed token alone): it commits at
    the block's first forward, whatever its p, as Fast-dLLM v2 takes it from the last logit.
    cache, what each step's ONE forward runs (models.dllm.BlockDenoiser):
        "sub-block"  the DualCache: when the block has no block cache yet or the sub-block's first
                     slot is masked, the whole block on top of the prefix cache, its keys / values
                     kept as the block cache ("refreshed"); otherwise only the sub-block's slots,
                     reading the stale keys / values of the rest of the block ("reused")
        "block"      the whole block on top of the prefix cache (Fast-dLLM v2 without its block cache)
        "none"       no cache: the prompt, the committed blocks and the block, every step
    A finished block's keys / values are written by the next block's first forward (which Fast-dLLM
    v2 spends a forward of its own on). Recorded per forward: a "fastv2 forward" Decision (the
    sub-block, the block cache refreshed / reused / not used and why; output: the token rows the
    forward ran) and a "fastv2 commit" Decision per masked slot of the sub-block (p against the
    threshold: commit, wait, forced or AR first token); info["forward"], ["sub_block"], ["rows"]
    (speclab.bench.dllm_eval counts rows / block_length forward rows for the step)."""
    sub_block: int = 8
    threshold: float = 0.9
    cache: str = "sub-block"

    def plan(self, gen_length: int, n_blocks: int) -> int:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        b = self.sub_block
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"sub_block must be an integer >= 1 (slots), got {b!r}")
        if self.cache not in FASTV2_CACHES:
            raise ValueError(f"cache must be one of {', '.join(FASTV2_CACHES)}, got {self.cache!r}")
        self._fwd = None
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def block_forward(self, den, x: torch.Tensor, lo: int) -> torch.Tensor:
        """The step's forward (the engine calls it in place of den.block_logits): (B, V) rows."""
        P, B, MASK = den.P, den.B, den.mask_id
        blk = x[P + lo:P + lo + B]
        m = int((blk == MASK).nonzero()[0])                          # earlier sub-blocks are full
        a = m // self.sub_block * self.sub_block
        b = min(self.sub_block, B - a)
        first_masked = int(blk[a]) == MASK
        if self.cache == "none":
            rows, what, why, n = den.uncached_logits(x, lo), "no cache", "cache='none'", P + lo + B
        elif self.cache == "block":
            rows, what, why, n = den.block_logits(x, lo), "not used", "cache='block'", B
        elif not den.holds_block(lo) or first_masked:
            why = "no block cache yet" if not den.holds_block(lo) else "the sub-block's first slot is masked"
            rows, what, n = den.refresh_block(x, lo), "refreshed", B
        else:
            rows, what, why, n = den.sub_block_logits(x, lo, a, b), "reused", "the sub-block's first slot is written", b
        self._fwd = dict(forward=what, why=why, sub_block=[lo + a, lo + a + b], rows=n)
        return rows

    def select(self, v: View) -> Choice:
        fwd, self._fwd = self._fwd, None
        if fwd is None:
            raise ValueError("dllm-fastv2 needs a block-diffusion LM (a config with speclab_block_causal, such as "
                             "smollm2-dllm): its sub-blocks live in the blocks a block-causal model caches")
        (lo, _), (s0, s1) = v.block, fwd["sub_block"]
        cand = torch.zeros_like(v.eligible)
        cand[s0:s1] = True
        cand &= v.eligible
        commit = cand & (v.conf > self.threshold)
        ar = lo if bool(v.eligible[lo]) else None                    # the block's first forward
        if ar is not None:
            commit[ar] = True
        forced = []
        if not commit.any():
            forced = [int(ranked(v.conf, cand)[0])]
            commit[forced] = True
        decisions = [Decision("fastv2 forward", {"block cache": fwd["forward"], "sub-block": [s0, s1],
                                                 "cache": self.cache}, None, fwd["rows"], at=s0, note=fwd["why"])]
        for p in cand.nonzero().flatten().tolist():
            out = ("AR first token" if p == ar else "forced (best masked)" if p in forced else
                   "commit" if commit[p] else "wait")
            decisions.append(Decision("fastv2 commit", {"p": p4(v.conf[p])}, self.threshold, out, at=p))
        return Choice(commit, self.threshold, "probability", decisions=decisions,
                      info={**fwd, "forced": forced, "ar_first": ar})
