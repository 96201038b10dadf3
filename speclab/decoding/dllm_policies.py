"""Commit policies of the diffusion engine (reference note A.2, A.4, A.6, A.7, A.8).

A policy sees one step's `View` (per generation position: the proposed token x0, its probability,
the top-1/top-2 probability and logit margins, which positions are eligible) and returns a
`Choice`: the positions to commit, the threshold or score it used, and `finish=True` when it
decides to commit every remaining mask at once (Prophet / SchED early exit). Knobs are dataclass
fields so sliders can bind to them.

Most policies only unmask. A policy that revises (JointThreshold) may also name committed positions
of the active block to rewrite with this step's proposal or to take back (re-mask), and ask for
another forward over a block that holds no mask (`more`); the engine records each as a trace Edit.
What a policy decided, position by position, goes in `decisions` (trace.Decision).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

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
class LowConfidence:
    """LLaDA: a fixed number of steps per block, each committing the k_sched[i] most confident
    (remasking="low_confidence") or random (remasking="random") masked positions of the block.
    steps=None means one token per step (steps = gen_length)."""
    steps: int | None = None
    remasking: str = "low_confidence"

    def plan(self, gen_length: int, n_blocks: int) -> int:
        steps = self.steps or gen_length
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking must be 'low_confidence' or 'random', got {self.remasking!r}")
        if steps < n_blocks or steps % n_blocks:
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
class Threshold:
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


class _EarlyExitOnLowConfidence:
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
class LocalLeap:
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
class FreeDave:
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
class EntropyBound:
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


def p4(x) -> float:
    return round(float(x), 4)


@dataclass
class JointThreshold:
    """LLaDA 2.1's token editing, as SGLang's JointThreshold runs it. Each step, with x0 = argmax:
    mask to token (M2T): the masked positions of the block with p(x0) >= threshold (the threshold
    policy: at least the best); token to token (T2T): every committed position of the block whose
    x0 differs from what it holds, with p(x0) > edit_threshold, is rewritten, during filling too.
    Once the block holds no mask, up to max_post_edit_steps more forwards only edit; the block ends
    at the first that changes nothing (at most B + max_post_edit_steps + 1 forwards a block).
    edit_threshold=None: no edits and no post-edit forwards, the threshold policy step for step."""
    threshold: float = 0.7
    edit_threshold: float | None = 0.5
    max_post_edit_steps: int = 16

    def plan(self, gen_length: int, n_blocks: int) -> int:
        Threshold(self.threshold).plan(gen_length, n_blocks)
        if self.edit_threshold is not None and not 0 <= self.edit_threshold < 1:
            raise ValueError(f"edit_threshold must be in [0, 1) or None (no edits), got {self.edit_threshold}")
        m = self.max_post_edit_steps
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"max_post_edit_steps must be an integer >= 0, got {m!r}")
        return gen_length

    def start_block(self, n_masked: int):
        self._post = 0                              # forwards over this block after its last mask

    def select(self, v: View) -> Choice:
        none = torch.zeros_like(v.eligible)
        info, decisions = {}, []
        if v.eligible.any():                        # M2T
            base = Threshold(self.threshold).select(v)
            commit, forced = base.commit, set(base.info["forced"])
            decisions += [Decision("mask-to-token", {"p": p4(v.conf[p])}, self.threshold,
                                   "forced (best masked)" if p in forced else "commit", at=p)
                          for p in commit.nonzero().flatten().tolist()]
            info["forced"] = base.info["forced"]
        else:                                       # a post-edit step: the block is filled
            self._post += 1
            commit = none
            info["post_edit_step"] = self._post
            if self._post > self.max_post_edit_steps:
                info["block_done"] = "post-edit limit"
                return Choice(commit, self.threshold, "probability", info=info)
        rewrite = none
        if self.edit_threshold is not None:         # T2T, over what the block already holds
            rewrite = v.editable & (v.x0 != v.tokens) & (v.conf > self.edit_threshold)
            for p in rewrite.nonzero().flatten().tolist():
                decisions.append(Decision("token-to-token", {"p": p4(v.conf[p]), "held": int(v.tokens[p]),
                                                             "proposed": int(v.x0[p])},
                                          self.edit_threshold, "rewrite", at=p))
        if not v.eligible.any() and not rewrite.any():
            info["block_done"] = "no edit"
        return Choice(commit, self.threshold, "probability", info=info, rewrite=rewrite,
                      reasons={p: f"token to token, p={float(v.conf[p]):.3f} > {self.edit_threshold}"
                               for p in rewrite.nonzero().flatten().tolist()},
                      more=self.edit_threshold is not None and "block_done" not in info, decisions=decisions)


@dataclass
class R2:
    """R²-dLLM's redundancy rules on top of the threshold policy (base: p(x0) >= threshold, at least
    the best), applied in this order to the active block, each reading the canvas the previous left:
    (1) window: every `window` consecutive block slots holding at most `window_unmasked` committed
        tokens whose masked slots' mean p(x0) >= spatial_threshold commit all those slots;
    (2) token cluster: a run of >= 2 adjacent masked slots proposing the same token, its best
        p(x0) > spatial_threshold, commits ONE slot (its most confident, "confidence"; its middle,
        "mid"; a random one, "random"; None: rule off);
    (3) temporal: a slot masked before and after the step counts how many consecutive steps its
        x0 has stayed the same (its streak; a change restarts it at 1); at temporal_steps steps,
        with p(x0) ("last"), its mean over the streak ("ave") or its max ("max") >= temporal_threshold,
        it commits, the prediction having stopped changing.
    The streaks are recorded per step (info["streak"], one per slot of the block), every commit as a
    Decision naming its rule."""
    threshold: float = 0.9
    window: int = 3
    spatial_threshold: float = 0.8
    window_unmasked: int = 1
    token_cluster: str | None = "confidence"
    temporal_steps: int = 3
    temporal_threshold: float = 0.8
    temporal_eval: str = "last"

    def plan(self, gen_length: int, n_blocks: int) -> int:
        Threshold(self.threshold).plan(gen_length, n_blocks)
        for name in ("window", "window_unmasked", "temporal_steps"):
            x = getattr(self, name)
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0: rule off), got {x!r}")
        if self.token_cluster not in (None, "confidence", "mid", "random"):
            raise ValueError(f"token_cluster must be confidence, mid, random or None, got {self.token_cluster!r}")
        if self.temporal_eval not in ("last", "ave", "max"):
            raise ValueError(f"temporal_eval must be last, ave or max, got {self.temporal_eval!r}")
        G = gen_length                               # per slot: streak length, its token, p sum, p max
        self._count, self._last = torch.zeros(G, dtype=torch.long), torch.full((G,), -1, dtype=torch.long)
        self._sum, self._max = torch.zeros(G, dtype=torch.float64), torch.zeros(G, dtype=torch.float64)
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def select(self, v: View) -> Choice:
        (lo, hi), dev = v.block, v.eligible.device
        base = Threshold(self.threshold).select(v)
        commit, forced = base.commit.clone(), set(base.info["forced"])
        decisions = [Decision("r2 base", {"p": p4(v.conf[p])}, self.threshold,
                              "forced (best masked)" if p in forced else "commit", at=p)
                     for p in commit.nonzero().flatten().tolist()]
        # (1) windows, all read from the canvas after the base commit
        w = self.window
        if w and hi - lo >= w:
            m = (v.eligible & ~commit)[lo:hi].double()                  # (B,) still masked
            n = m.unfold(0, w, 1).sum(-1)                                # (B - w + 1,) masked per window
            mean = (v.conf[lo:hi].double() * m).unfold(0, w, 1).sum(-1) / n.clamp_min(1)
            ok = (n > 0) & (w - n <= self.window_unmasked) & (mean >= self.spatial_threshold)
            win, masked = [], (v.eligible & ~commit).tolist()
            for a, mu in zip(ok.nonzero().flatten().tolist(), mean[ok].tolist()):
                for p in range(lo + a, lo + a + w):
                    if masked[p] and p not in win:
                        win.append(p)
                        decisions.append(Decision("r2 window", {"window mean p": p4(mu),
                                                                "window": [lo + a, lo + a + w]},
                                                  self.spatial_threshold, "commit", at=p))
            commit[win] = True
        # (2) token clusters: runs of adjacent still-masked slots proposing the same token
        if self.token_cluster is not None:
            masked, x0, conf = (v.eligible & ~commit).tolist(), v.x0.tolist(), v.conf.tolist()
            a = lo
            while a < hi:
                b = a + 1
                while masked[a] and b < hi and masked[b] and x0[b] == x0[a]:
                    b += 1
                if masked[a] and b - a >= 2 and max(conf[a:b]) > self.spatial_threshold:
                    score = {"confidence": conf[a:b], "random": v.rand[a:b].tolist()}.get(self.token_cluster)
                    p = a + (score.index(max(score)) if score is not None else (b - a) // 2)   # ties: leftmost
                    commit[p] = True
                    decisions.append(Decision("r2 token cluster", {"run max p": p4(max(conf[a:b])), "run": [a, b]},
                                              self.spatial_threshold, "commit", at=p))
                a = b
        # (3) temporal: streaks of the slots masked before and after the step
        cand = v.eligible.cpu()
        still, gone = cand & ~commit.cpu(), cand & commit.cpu()
        x0, conf = v.x0.cpu(), v.conf.cpu().double()
        for t in (self._count, self._sum, self._max):
            t[gone] = 0
        self._last[gone] = -1
        same, new = still & (self._last == x0), still & (self._last != x0)
        self._count[same] += 1
        self._sum[same] += conf[same]
        self._max[same] = torch.maximum(self._max[same], conf[same])
        self._count[new], self._sum[new], self._max[new], self._last[new] = 1, conf[new], conf[new], x0[new]
        streak = self._count[lo:hi].tolist()
        if self.temporal_steps:
            agg = {"last": conf, "ave": self._sum / self._count.clamp_min(1), "max": self._max}[self.temporal_eval]
            ok = still & (self._count >= self.temporal_steps) & (agg >= self.temporal_threshold)
            for p in ok.nonzero().flatten().tolist():
                decisions.append(Decision("r2 temporal", {f"{self.temporal_eval} p": p4(agg[p]),
                                                          "streak": int(self._count[p])},
                                          self.temporal_threshold, "commit", at=p))
            commit |= ok.to(dev)
            for t in (self._count, self._sum, self._max):
                t[ok] = 0
            self._last[ok] = -1
        rules = dict(Counter(d.policy.removeprefix("r2 ") for d in decisions))
        return Choice(commit, self.threshold, "probability", decisions=decisions,
                      info={"forced": base.info["forced"], "streak": streak, "by_rule": rules})


@dataclass
class Learn2PD:
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
class AdaBlock:
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
class ETE:
    """speclab's reading of ETE, explore-then-exploit (Fu et al. 2025, "From Bits to Rounds",
    arXiv 2511.21103), known from its abstract only. A round committing the set S carries
    I = sum over S of -log p(x0) nats; a text of NLL nats needs at least NLL / B rounds when no
    round carries more than B, and a token above a threshold tau carries at most -log tau, so
    committing only near-certain tokens takes many rounds. Each round here:
        exploit: commit every eligible slot with p(x0) >= threshold; I = their information
        explore: while I < budget and fewer than max_explore are explored, also commit the next
                 uncertain slot (explore_by="confidence": the most confident below the threshold;
                 "leftmost": the leftmost), adding its -log p(x0) to I
    Explored tokens re-condition the model; the cascade an explored token set off is the number of
    slots below the threshold in its round that pass it in the next (each crossing counted for the
    nearest explored slot, ties to the left). How explored tokens are chosen, the budget and the
    defaults are speclab's choices: the abstract gives none. budget=0 or max_explore=0 is the
    threshold policy (its forced best commit when nothing passes). Commits stay inside the engine's
    block: on a whole-canvas dLLM with block_length unset that is the canvas (ETE decodes across
    blocks); a block-causal model has not seen later blocks. Recorded per round: info["information"]
    (nats committed), info["explored"], info["cascade"] ([slot, size] for each slot the round before
    explored), info["crossed"], and the Decisions "ete exploit", "ete explore", "ete round" (its
    information against the budget) and "ete cascade"."""
    threshold: float = 0.9
    budget: float = 1.0
    max_explore: int = 2
    explore_by: str = "confidence"

    def plan(self, gen_length: int, n_blocks: int) -> int:
        Threshold(self.threshold).plan(gen_length, n_blocks)
        if not self.budget >= 0:
            raise ValueError(f"budget must be >= 0 (nats a round; 0: never explore), got {self.budget}")
        m = self.max_explore
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"max_explore must be an integer >= 0 (0: never explore), got {m!r}")
        if self.explore_by not in ("confidence", "leftmost"):
            raise ValueError(f"explore_by must be confidence or leftmost, got {self.explore_by!r}")
        self._last = None                       # (slots explored, slots left below the threshold)
        return gen_length

    def start_block(self, n_masked: int):
        pass

    def cascades(self, v: View) -> tuple[list, list[Decision], int]:
        """The slots that crossed the threshold since the last round, each counted for the nearest
        slot that round explored: ([slot, size] per explored slot, their Decisions, crossings)."""
        if self._last is None:
            return [], [], 0
        explored, below = self._last
        crossed = [p for p in below if v.eligible[p] and v.conf[p] >= self.threshold]
        by = {e: [] for e in explored}
        for p in crossed if explored else ():
            by[min(explored, key=lambda e: (abs(e - p), e))].append(p)
        ds = [Decision("ete cascade", {"crossed": ps[:16]}, None, len(ps), at=e,
                       note="slots below the threshold in its round, above it now") for e, ps in by.items()]
        return [[e, len(ps)] for e, ps in by.items()], ds, len(crossed)

    def select(self, v: View) -> Choice:
        cascade, decisions, crossed = self.cascades(v)
        nats = -v.conf.double().clamp_min(1e-30).log()            # (G,) information of each proposal
        exploit = v.eligible & (v.conf >= self.threshold)
        info = float(nats[exploit].sum())
        decisions += [Decision("ete exploit", {"p": p4(v.conf[p])}, self.threshold, "commit", at=p)
                      for p in exploit.nonzero().flatten().tolist()]
        uncertain = v.eligible & ~exploit
        order = ranked(v.conf, uncertain) if self.explore_by == "confidence" else uncertain.nonzero().flatten()
        explored = []
        for p in order.tolist():
            if len(explored) >= self.max_explore or info >= self.budget:
                break
            decisions.append(Decision("ete explore", {"round information": p4(info), "p": p4(v.conf[p]),
                                                      "-log p": p4(nats[p])}, self.budget, "explore", at=p))
            explored.append(p)
            info += float(nats[p])
        commit = exploit.clone()
        commit[explored] = True
        if not commit.any() and v.eligible.any():                   # no exploring: the threshold rule's best
            best = int(ranked(v.conf, v.eligible)[0])
            commit[best] = True
            info += float(nats[best])
            decisions.append(Decision("ete exploit", {"p": p4(v.conf[best])}, self.threshold,
                                      "forced (best masked)", at=best))
        decisions.append(Decision("ete round", {"information": p4(info), "committed": int(commit.sum()),
                                                "explored": len(explored), "crossed": crossed},
                                  self.budget, len(explored)))
        self._last = (explored, (uncertain & ~commit).nonzero().flatten().tolist())
        return Choice(commit, self.threshold, "probability", decisions=decisions,
                      info={"information": p4(info), "explored": explored, "cascade": cascade, "crossed": crossed})


FASTV2_CACHES = ("sub-block", "block", "none")


@dataclass
class FastV2:
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


POLICIES = {"dllm-lowconf": LowConfidence, "dllm-threshold": Threshold, "dllm-prophet": Prophet,
            "dllm-sched": Sched, "dllm-localleap": LocalLeap, "dllm-freedave": FreeDave,
            "dllm-entropy-bound": EntropyBound, "dllm-llada21-edit": JointThreshold, "dllm-r2": R2,
            "dllm-learn2pd": Learn2PD,
            "dllm-adablock": AdaBlock, "dllm-ete": ETE, "dllm-fastv2": FastV2}
