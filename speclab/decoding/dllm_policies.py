"""Commit policies of the diffusion engine (reference note A.2, A.4, A.6, A.7, A.8).

A policy sees one step's `View` (per generation position: the proposed token x0, its probability,
the top-1/top-2 probability and logit margins, which positions are eligible) and returns a
`Choice`: the positions to commit, the threshold or score it used, and `finish=True` when it
decides to commit every remaining mask at once (Prophet / SchED early exit). Knobs are dataclass
fields so sliders can bind to them.

Most policies only unmask. A policy that revises (JointThreshold) may also name committed positions
of the active block to rewrite with this step's proposal or to take back (re-mask), and ask for
another forward over a block that holds no mask (`more`); the engine records each as a trace Edit.
What a policy decided, position by position, goes in `decisions` (trace.Decision). This file holds
the contract (`DiffusionPolicy`) and the one-pass commit rules; dllm_revise.py the policies that
revise, dllm_adapt.py those that adapt their blocks, explore or learn. Each is named by its method's
row in decoding/registry.py (`Method(config=...)`), which imports all three.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from speclab.trace import Decision


@dataclass
class View:
    step: int                      # global step (0-based)
    total_steps: int               # planned steps for fixed-step policies (gen_length otherwise)
    block: tuple[int, int]         # [lo, hi) of the active block, generation coordinates
    step_in_block: int
    eligible: torch.Tensor         # (G,) bool: masked and inside the block
    masked: torch.Tensor           # (G,) bool: masked anywhere
    x0: torch.Tensor               # (G,) proposed token
    conf: torch.Tensor             # (G,) p(x0)
    logit_margin: torch.Tensor     # (G,) l1 - l2 (Prophet / SchED units)
    rand: torch.Tensor             # (G,) U(0,1) from the run's generator (random remasking)
    prev_x0: torch.Tensor | None   # (G,) the previous step's proposal
    entropy: torch.Tensor | None = None   # (G,) entropy of each position's distribution (nats)
    tokens: torch.Tensor | None = None    # (G,) the canvas before the step (the mask id where masked)
    editable: torch.Tensor | None = None  # (G,) bool: committed positions of the active block, which
                                          # a policy may rewrite or re-mask (the model recomputes them)


@dataclass
class Choice:
    commit: torch.Tensor                    # (G,) bool
    threshold: float | None = None
    scale: str | None = None                # what threshold measures: one of trace.THRESHOLD_SCALES
    finish: bool = False
    info: dict = field(default_factory=dict)
    rewrite: torch.Tensor | None = None     # (G,) bool: editable positions to overwrite with x0 (token to token)
    remask: torch.Tensor | None = None      # (G,) bool: editable positions to take back (mask again)
    reasons: dict[int, str] = field(default_factory=dict)   # position -> why it was edited (Edit.reason)
    more: bool = False                      # one more forward over this block even if it holds no mask
    decisions: list[Decision] = field(default_factory=list)
    cross_block: bool = False               # commits may land on any masked slot the model saw (a whole-
                                            # canvas dLLM: later blocks too; a block-causal one: its block)


class DiffusionPolicy(Protocol):
    """What the diffusion engine (decoding/diffusion.py) calls on a policy, in this order:

      prepare(model, tok)          once, before the run: read what the run's model or tokenizer offers
                                   (a delimiter's token ids, a filter trained for this dLLM); default none
      plan(gen_length, n_blocks)   check the knobs, return the planned number of steps
      start_block(n_masked)        at each block's start
      select(view) -> Choice       once per forward: what to commit (and rewrite, re-mask)
      block_forward                optional: den.forward over a part of the active block on a block-
                                   diffusion LM (Fast-dLLM v2's sub-block on a stale cache); None: the block

    Policies subclass it (so the optional parts have their defaults) and keep their knobs as
    dataclass fields. A policy with its own loop (FreeDave) names that loop in its method row
    (`Method.loop`) and need not select."""
    block_forward: Callable | None = None

    def prepare(self, model, tok) -> None:
        pass

    def plan(self, gen_length: int, n_blocks: int) -> int: ...

    def start_block(self, n_masked: int) -> None:
        pass

    def select(self, v: View) -> Choice: ...


def num_transfer(n: int, steps: int) -> list[int]:
    """LLaDA's schedule: n tokens over `steps` steps, the remainder going to the early steps."""
    base, r = divmod(n, steps)
    return [base + 1] * r + [base] * (steps - r)


def ranked(score: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Eligible positions, best score first; ties go to the leftmost position (saturated
    probabilities do tie, and FreeDave must pick exactly what one-per-step decoding picks)."""
    s = torch.where(eligible, score, torch.full_like(score, -math.inf))
    return s.sort(descending=True, stable=True).indices[: int(eligible.sum())]


def top_k_commit(score: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    k = max(1, min(int(k), int(eligible.sum())))
    out = torch.zeros_like(eligible)
    out[ranked(score, eligible)[:k]] = True
    return out


@dataclass
class LowConfidence(DiffusionPolicy):
    """LLaDA: a fixed number of steps per block, each committing the k_sched[i] most confident
    (remasking="low_confidence") or random (remasking="random") masked positions of the block.
    steps=None means one token per step (steps = gen_length)."""
    steps: int | None = None
    remasking: str = "low_confidence"

    def plan(self, gen_length: int, n_blocks: int) -> int:
        steps = self.steps or gen_length
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking must be 'low_confidence' or 'random', got {self.remasking!r}")
        if type(steps) is not int or steps < n_blocks or steps % n_blocks:
            raise ValueError(f"steps={steps} must be a positive multiple of the number of blocks ({n_blocks}): "
                             "each block gets steps / blocks steps")
        self._per_block = steps // n_blocks
        return steps

    def start_block(self, n_masked: int):
        self._sched = num_transfer(n_masked, self._per_block)

    def select(self, v: View) -> Choice:
        i = min(v.step_in_block, len(self._sched) - 1)
        k = self._sched[i] if v.step_in_block < len(self._sched) else int(v.eligible.sum())
        score = v.conf if self.remasking == "low_confidence" else v.rand
        return Choice(top_k_commit(score, v.eligible, k), None, info={"k": k})


@dataclass
class Threshold(DiffusionPolicy):
    """Fast-dLLM: commit every eligible position with p(x0) >= threshold, always at least the best.
    factor=f instead: the n-th best token (1-based) needs (n + 1)(1 - c_n) < f."""
    threshold: float = 0.9
    factor: float | None = None

    def plan(self, gen_length: int, n_blocks: int) -> int:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.factor is not None and self.factor <= 0:
            raise ValueError(f"factor must be > 0, got {self.factor}")
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def select(self, v: View) -> Choice:
        order = ranked(v.conf, v.eligible)            # stable: equal confidences go leftmost first
        c = v.conf[order]
        if self.factor is None:
            keep = c >= self.threshold
        else:                                         # rank j (0-based) needs c_j >= 1 - f / (j + 2)
            keep = c >= 1 - self.factor / (torch.arange(len(c), dtype=c.dtype) + 2)
            keep = torch.cumprod(keep.to(torch.int8), 0).bool()   # commit the longest passing prefix
        keep[0] = True                                # at least one token per step
        commit = torch.zeros_like(v.eligible)
        commit[order[keep]] = True
        return Choice(commit, self.threshold if self.factor is None else self.factor,
                      scale="probability" if self.factor is None else "factor",
                      info={"forced": [int(order[0])] if c[0] < self.threshold and self.factor is None else []})


class _EarlyExitOnLowConfidence(DiffusionPolicy):
    """Prophet and SchED: LLaDA low-confidence steps, unless a statistic passes the step's
    threshold, when every remaining mask is committed at once."""

    def plan(self, gen_length, n_blocks):
        self._base = LowConfidence(self.steps)
        return self._base.plan(gen_length, n_blocks)

    def start_block(self, n_masked):
        self._base.start_block(n_masked)

    def _decide(self, v: View, tau: float, name: str, value: float, exit_now: bool) -> Choice:
        if exit_now:
            return Choice(v.masked.clone(), tau, scale="logit-gap", finish=True, info={name: value})
        ch = self._base.select(v)
        ch.threshold, ch.scale, ch.info[name] = tau, "logit-gap", value
        return ch


@dataclass
class Prophet(_EarlyExitOnLowConfidence):
    """LLaDA low-confidence decoding that commits EVERYTHING once the mean top-1/top-2 logit gap
    over the first `answer_length` generation positions reaches early / mid / late thresholds
    (by progress = step / total steps: < 1/3, < 2/3, else)."""
    steps: int | None = None
    early: float = 7.5
    mid: float = 5.0
    late: float = 2.5
    answer_length: int = 5

    def plan(self, gen_length: int, n_blocks: int) -> int:
        if type(self.answer_length) is not int or self.answer_length < 1:
            raise ValueError(f"answer_length must be an integer >= 1 (the positions whose gap is read), "
                             f"got {self.answer_length!r}")
        return super().plan(gen_length, n_blocks)

    def select(self, v: View) -> Choice:
        progress = (v.step + 1) / v.total_steps
        tau = self.early if progress < 1 / 3 else self.mid if progress < 2 / 3 else self.late
        gap = float(v.logit_margin[: self.answer_length].mean())
        return self._decide(v, tau, "gap", gap, gap >= tau)


@dataclass
class Sched(_EarlyExitOnLowConfidence):
    """SchED: exit (commit every mask) when the mean logit margin over all masked positions reaches
    a threshold that decays with step / (total - 1) from tau_high to tau_low (cosine, linear or
    exp with rate k), and the proposals over the masked positions did not change since the last
    step. Otherwise a low-confidence step."""
    steps: int | None = None
    tau_high: float = 7.5
    tau_low: float = 2.5
    schedule: str = "cosine"
    k: float = 4.0

    def plan(self, gen_length, n_blocks):
        if self.schedule not in ("cosine", "linear", "exp"):
            raise ValueError(f"schedule must be cosine, linear or exp, got {self.schedule!r}")
        return super().plan(gen_length, n_blocks)

    def tau(self, step: int, total: int) -> float:
        u = step / max(total - 1, 1)
        if self.schedule == "cosine":
            return self.tau_low + (self.tau_high - self.tau_low) * 0.5 * (1 + math.cos(math.pi * u))
        if self.schedule == "linear":
            return self.tau_high + (self.tau_low - self.tau_high) * u
        return self.tau_low + (self.tau_high - self.tau_low) * math.exp(-self.k * u)

    def select(self, v: View) -> Choice:
        tau = self.tau(v.step, v.total_steps)
        g = float(v.logit_margin[v.masked].mean())
        stable = v.prev_x0 is not None and bool((v.x0[v.masked] == v.prev_x0[v.masked]).all())
        return self._decide(v, tau, "g", g, g >= tau and stable)


@dataclass
class LocalLeap(DiffusionPolicy):
    """Anchors (eligible positions with p >= threshold) relax the threshold to `relaxed` for
    positions within `radius` of any anchor; at least one token per step."""
    threshold: float = 0.9
    relaxed: float = 0.75
    radius: int = 4

    def plan(self, gen_length, n_blocks):
        if not 0 < self.relaxed <= self.threshold <= 1:
            raise ValueError(f"need 0 < relaxed <= threshold <= 1, got relaxed={self.relaxed}, "
                             f"threshold={self.threshold}")
        return gen_length

    def start_block(self, n_masked):
        pass

    def select(self, v: View) -> Choice:
        conf = torch.where(v.eligible, v.conf, torch.full_like(v.conf, -1.0))
        anchors = (conf >= self.threshold).nonzero().flatten()
        near = torch.zeros_like(v.eligible)
        for a in anchors.tolist():
            near[max(0, a - self.radius): a + self.radius + 1] = True
        thr = torch.where(near, torch.full_like(conf, self.relaxed), torch.full_like(conf, self.threshold))
        commit = v.eligible & (conf >= thr)
        commit[conf.argmax()] = True
        return Choice(commit, self.threshold, scale="probability", info={"anchors": anchors.tolist()})


@dataclass
class FreeDave(DiffusionPolicy):
    """Draft-and-verify, lossless against one-token-per-step greedy decoding: `draft_steps`
    drafts (canvases) checked in one batched forward (the loop lives in speclab.decoding.freedave).
    The drafts form a tree of guesses at the next commits: each node branches to the `branch_slots`
    next slots in confidence order with their `branch_tokens` most likely tokens, and the
    `draft_steps` likeliest paths are kept. branch_slots = branch_tokens = 1 is the paper's chain
    (draft k = the k+1 most confident slots filled with their top-1 tokens)."""
    draft_steps: int = 4
    branch_slots: int = 2
    branch_tokens: int = 2

    def plan(self, gen_length: int, n_blocks: int) -> int:
        for name in ("draft_steps", "branch_slots", "branch_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        return gen_length


@dataclass
class EntropyBound(DiffusionPolicy):
    """DiffusionGemma's acceptance rule as a commit policy: sort the eligible positions by entropy,
    lowest first, and commit each whose predecessors' entropies sum to <= `entropy_bound` (nats);
    the lowest-entropy position always. Here unmask-only: a mask-based model keeps what it commits
    (DiffusionGemma itself re-noises everything it did not accept, see speclab.decoding.dgemma)."""
    entropy_bound: float = 0.1

    def plan(self, gen_length: int, n_blocks: int) -> int:
        if not self.entropy_bound >= 0:
            raise ValueError(f"entropy_bound must be >= 0 (nats), got {self.entropy_bound}")
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def select(self, v: View) -> Choice:
        order = ranked(-v.entropy, v.eligible)        # lowest entropy first, ties leftmost
        e = v.entropy[order]
        keep = torch.cumsum(e, 0) - e <= self.entropy_bound
        keep[0] = True
        commit = torch.zeros_like(v.eligible)
        commit[order[keep]] = True
        return Choice(commit, None, info={"entropy_bound": self.entropy_bound,
                                          "entropy_sum": round(float(e[keep].sum()), 4)})
