"""OSD (Liu et al., ICML 2024, "Online Speculative Decoding"): the draft model is distilled online on
what the target said while serving, so it tracks the query distribution it is asked about.

    draft     draft-model's chain (drafters/model.py, subclassed: the same cache, length policies and
              host reads), its logits plus a low-rank correction from its own final hidden state:
                  logits = head(norm(h)) + (norm(h) A^T) B^T        A (rank, C), B (N, rank), fp32
              (a LoRA on the draft's LM head; N: its vocabulary, the trimmed head's ids where it has
              one). B starts at zero, so version 0 drafts exactly what draft-model drafts. The shipped
              weights, and the packed copies the lean forward runs, are never touched: the adapter is
              added to the logits the forward returns, so what runs is what was trained.
    buffer    a ring of the last `buffer` positions where the verify rejected a draft token (OSD's
              replay buffer; positions="all" also keeps the accepted ones): the draft's normed hidden
              state there (C,), its shipped logits (N, fp16) and the target's top-`topk` probabilities
              at that row of the verify (renormalised over the draft's vocabulary). The draft's body
              is frozen, so an entry stays valid across updates and training never reruns the draft.
              Memory: buffer x (4C + 2N + 12 topk) bytes, allocated once (OnlineDraft.nbytes).
    update    once `interval` entries arrived since the last one: `steps` full-batch Adam steps of lr
              on A and B, cross-entropy of the adapted draft against the target's top-k distribution
              (the forward KL OSD distils with, less the target's entropy; greedy's argmax is its
              top-1). The draft version goes up by one. Recorded as Decision("osd", {buffer, new,
              loss_before, loss_after, steps, lr, seconds}, output="update", at=round); every round's
              info holds `draft_version` (what drafted it), an updating round's also `update_s`.
    state     OnlineDraft, owned by the caller (`history=`: an OnlineDrafts store, or the SuffixHistory
              a dashboard session or a bench pass hands every method that takes `history`, which keeps
              one beside its texts), per draft and shape. A run works on its own copy from begin() and
              puts it back at end(), so two concurrent requests never share tensors (the later to end
              wins). No history: the request adapts on its own text only.

Only the draft changes: the verify is draft-model's, the exact rule against the q the adapted draft
drew from, so the output is identical to `ar` (greedy) or distributed as the target (sampling). The
time an update takes is the drafter's (the round's draft_s). The paper updates the whole draft on
spare serving compute and clears its buffer after each update; speclab trains the adapter only, in
line, and keeps a bounded ring.
figures.osd draws acceptance over the rounds with the updates marked and the draft version.
"""
from __future__ import annotations

import copy
import time

import torch

from speclab.decoding.drafters.lookup import RequestStore, SuffixHistory
from speclab.decoding.drafters.model import DraftModelDrafter
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree
from speclab.trace import Decision

POLICY = "osd"
POSITIONS = ("rejected", "all")
BETAS, EPS = (0.9, 0.999), 1e-8


def _positive_int(name: str, v, what: str):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"osd: {name} must be an integer >= 1 ({what}), got {v!r}")


class OnlineDraft:
    """One draft's online state: the adapter (A, B) with its Adam moments, the replay buffer, the
    version (updates so far). Tensors are made outside inference mode: autograd trains them."""

    def __init__(self, C: int, N: int, rank: int, capacity: int, topk: int, device):
        with torch.inference_mode(False):
            g = torch.Generator().manual_seed(0)
            self.A = (torch.randn(rank, C, generator=g) / C ** 0.5).to(device)      # (r, C)
            self.B = torch.zeros(N, rank, device=device)                             # (N, r): delta 0
            self.moments = [torch.zeros_like(p) for p in (self.A, self.B, self.A, self.B)]   # m_A, m_B, v_A, v_B
            self.h = torch.zeros(capacity, C, device=device)                 # the draft's normed hidden state
            self.base = torch.zeros(capacity, N, device=device, dtype=torch.float16)   # its shipped logits
            self.ids = torch.zeros(capacity, topk, device=device, dtype=torch.long)    # target top-k (draft vocab)
            self.w = torch.zeros(capacity, topk, device=device)                        # their renormalised p
        self.size = self.next = self.new = self.t = self.version = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.A, self.B, *self.moments, self.h, self.base,
                                                            self.ids, self.w))

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        """(..., N) the adapter's logit correction for normed hidden states h (..., C)."""
        return (h.float() @ self.A.T) @ self.B.T

    @torch.no_grad()
    def add(self, h, base, ids, w):
        """Buffer rows (M, ...) in the ring (the oldest overwritten once full)."""
        for r in range(h.shape[0]):
            i = self.next
            self.h[i], self.base[i], self.ids[i], self.w[i] = h[r], base[r], ids[r], w[r]
            self.next = (i + 1) % self.h.shape[0]
            self.size = min(self.size + 1, self.h.shape[0])
        self.new += h.shape[0]

    def loss(self, A=None, B=None) -> torch.Tensor:
        """Mean cross-entropy of the adapted draft against the buffered target distributions."""
        A, B, M = self.A if A is None else A, self.B if B is None else B, self.size
        logits = self.base[:M].float() + (self.h[:M] @ A.T) @ B.T                   # (M, N)
        return -(self.w[:M] * logits.log_softmax(-1).gather(1, self.ids[:M])).sum(-1).mean()

    def update(self, steps: int, lr: float) -> tuple[float, float]:
        """`steps` Adam steps on A and B over the whole buffer: (loss before, loss after)."""
        b1, b2 = BETAS
        with torch.inference_mode(False), torch.enable_grad():
            A, B = self.A.clone().requires_grad_(), self.B.clone().requires_grad_()
            for s in range(steps):
                loss = self.loss(A, B)
                if s == 0:
                    before = loss.item()
                grads = torch.autograd.grad(loss, (A, B))
                self.t += 1
                with torch.no_grad():
                    for j, (p, g) in enumerate(zip((A, B), grads)):
                        m, v = self.moments[j], self.moments[j + 2]
                        m.mul_(b1).add_(g, alpha=1 - b1)
                        v.mul_(b2).addcmul_(g, g, value=1 - b2)
                        p -= lr * (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + EPS)
            with torch.no_grad():
                self.A, self.B = A.detach(), B.detach()
                after = self.loss().item()
        self.version += 1
        self.new = 0
        return before, after

    def copy(self) -> "OnlineDraft":
        return copy.deepcopy(self)


class OnlineDrafts(RequestStore):
    """OSD's online drafts by (draft, shape); `get` returns a copy, which the run trains."""
    copies = True


def online_drafts(history) -> OnlineDrafts | None:
    """The OnlineDrafts a run's `history` names (RequestStore.named_by); None: none."""
    return OnlineDrafts.named_by(history, "online_drafts", "the online draft earlier requests trained", "osd")


class OsdDrafter(DraftModelDrafter):
    name = "osd"

    def __init__(self, draft, backend: str = "auto", rank: int = 8, interval: int = 16, buffer: int = 128,
                 steps: int = 8, lr: float = 1e-2, topk: int = 8, positions: str = "rejected", history=None, **kw):
        super().__init__(draft, backend, **kw)
        _positive_int("rank", rank, "the adapter's rank")
        _positive_int("interval", interval, "new buffered positions between updates")
        _positive_int("buffer", buffer, "positions the replay buffer keeps")
        _positive_int("steps", steps, "Adam steps per update")
        _positive_int("topk", topk, "target probabilities kept per position")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
            raise ValueError(f"osd: lr must be a number in (0, 1) (Adam's step size), got {lr!r}")
        if positions not in POSITIONS:
            raise ValueError(f"osd: positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        if interval > buffer:
            raise ValueError(f"osd: interval ({interval}) must be <= buffer ({buffer}): an update trains on the "
                             f"buffer, which must hold the positions that triggered it")
        self.rank, self.interval, self.capacity, self.steps, self.lr = rank, interval, buffer, steps, float(lr)
        self.topk, self.positions = topk, positions
        self.draft_model = draft
        self.n_layers = len(draft.model.layers)
        self.store = online_drafts(history)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        d = self.draft_model
        ids = getattr(self.lm, "head_ids", None)                 # a trimmed head's ids (lean: after `vocab`)
        if ids is None:
            ids = getattr(d.lm_head, "head_ids", None)
        V, C = d.config.vocab_size, d.config.hidden_size
        self.vocab = None if ids is None else ids.to(self.lm.device)
        N = V if ids is None else len(ids)
        self.pos_of = torch.full((V,), -1, dtype=torch.long, device=self.lm.device)   # token -> draft position
        self.pos_of[slice(None) if ids is None else self.vocab] = torch.arange(N, device=self.lm.device)
        self.key = (*SuffixHistory.key_of(d), C, N, self.rank, self.capacity, self.topk)
        state = self.store.get(self.key) if self.store is not None else None
        self.state = state or OnlineDraft(C, N, self.rank, self.capacity, self.topk, self.lm.device)
        self.lm.capture_layers = (self.n_layers,)      # the last layer's output: the head's input
        self.round, self.updates = 0, 0

    def end(self):
        self.lm.capture_layers = ()
        if self.store is not None:
            self.store.put(self.key, self.state)

    # -- a round: draft-model's chain through the adapted head ---------------------------------------
    def lm_step(self, lm, subset: bool = False):
        """draft-model's step, its logits plus the adapter's delta (none before the first update);
        each step's normed hidden state and shipped logits kept for the buffer."""
        shipped = super().lm_step(lm, subset)
        norm, L = self.draft_model.model.norm, self.n_layers

        @torch.inference_mode()
        def step(inp):
            logits = shipped(inp)                                   # (V,), or (N,) over a trimmed head
            h = norm(lm.captured[L][0, -1]).float()                 # (C,)
            own = logits if subset or self.vocab is None else logits[self.vocab]     # (N,)
            self.seen.append((h, own))
            if self.state.version == 0:
                return logits
            d = self.state.delta(h)
            if subset or self.vocab is None:
                return logits + d
            return logits.index_add(0, self.vocab, d)               # -inf outside the head stays -inf
        return step

    def propose(self, ctx: Context) -> DraftTree:
        self.seen = []
        tree = super().propose(ctx)
        tree.info["draft_version"] = self.state.version
        return tree

    # -- after the verify: buffer what the target said, update when due --------------------------------
    def observe(self, out: Outcome):
        super().observe(out)
        n, a = len(out.tree), len(out.path)
        # the depths the target judged: the accepted ones and the first rejected (a < n)
        rows = list(range(min(a + 1, n))) if self.positions == "all" else ([a] if a < n else [])
        if rows:
            self.buffer(out, rows)
        if self.state.new >= self.interval and self.state.size:
            self.update(out)
        self.round += 1

    @torch.inference_mode()
    def buffer(self, out: Outcome, rows: list[int]):
        """Keep draft positions `rows` (chain depths whose every predecessor was accepted): the draft's
        state there and the target's top-k at the verify row that judged it."""
        p = out.logits_at([out.n_pending - 1 + j for j in rows]).float().softmax(-1)       # (M, V)
        top, tok = p.topk(self.topk, -1)
        pos = self.pos_of[tok]
        w = top * (pos >= 0)
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        h = torch.stack([self.seen[j][0] for j in rows])
        base = torch.stack([self.seen[j][1] for j in rows]).half()
        self.state.add(h, base, pos.clamp_min(0), w)

    def update(self, out: Outcome):
        t0 = time.perf_counter()
        s = self.state
        size, new = s.size, s.new
        before, after = s.update(self.steps, self.lr)
        secs = time.perf_counter() - t0
        self.updates += 1
        out.tree.info["update_s"] = round(secs, 6)
        if self.record is not None:
            out.tree.decisions.append(Decision(POLICY, {
                "buffer": size, "new": new, "loss_before": round(before, 4), "loss_after": round(after, 4),
                "steps": self.steps, "lr": self.lr, "version": s.version, "seconds": round(secs, 4)},
                output="update", at=self.round))
