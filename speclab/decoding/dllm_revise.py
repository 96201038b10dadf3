"""Diffusion commit policies that look back at what they wrote, on the `View` / `Choice` contract
of dllm_policies.py (their method rows are in registry.py): LLaDA 2.1's token editing (JointThreshold), which
rewrites or re-masks committed tokens, and R²-dLLM (R2), which finalises predictions that have stopped
changing. Each records what it decided, position by position, as trace Decisions.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from speclab.decoding.dllm_policies import Choice, DiffusionPolicy, Threshold, View, ranked
from speclab.trace import Decision


def p4(x) -> float:
    return round(float(x), 4)


@dataclass
class JointThreshold(DiffusionPolicy):
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
class R2(DiffusionPolicy):
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
