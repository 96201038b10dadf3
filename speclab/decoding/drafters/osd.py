"""OSD (Liu et al., ICML 2024, "Online Speculative Decoding"): the draft model is distilled online on
what the target said while serving, so it tracks the query distribution it is asked about.

    draft     draft-model's chain (drafters/model.py, subclassed: the same cache, length policies and
              host reads). What is trained (`train`):
              "all"   the whole draft, as the paper does: every weight of a copy of the draft that the
                      caller's state owns (fp32 master weights with their Adam moments, and a copy in
                      the draft's dtype that drafts). The shared draft model is never written: the run
                      drafts with its own copy, re-made after each update (its cache rebuilt from the
                      committed text on the next draft, since the weights that filled it changed).
              "head"  a low-rank correction on the draft's LM head from its own final hidden state:
                          logits = head(norm(h)) + (norm(h) A^T) B^T     A (rank, C), B (N, rank), fp32
                      B starts at zero, so version 0 drafts exactly what draft-model drafts; the shipped
                      weights and their packed copies are untouched (the delta is added to the logits).
              N: the draft's vocabulary, its trimmed head's ids where it has one.
    buffer    a ring of the last `buffer` positions where the verify rejected a draft token (OSD's
              replay buffer; positions="all" also keeps the accepted ones), each with the target's
              log-distribution at the verify row that judged it (over the draft's N ids,
              renormalised, fp32). "head" also keeps the draft's normed hidden state there and its
              shipped logits (the body is frozen, so training never reruns the draft); "all" keeps
              the request's committed tokens up to that position and reruns the draft's copy on them.
              Memory: buffer x (4C + 6N + 8) bytes ("head"), buffer x (4N + 16) plus the texts ("all").
    update    once `interval` entries arrived since the last one: `steps` full-batch Adam steps of lr
              (steps, lr and buffer default by what is trained: DEFAULTS) on what is trained, minimising the divergence `loss` between the target's p and the
              draft's q at the buffered positions, averaged over them:
                  kl    KL(p || q)  forward KL (the paper's default; greedy's argmax is p's mode)
                  rkl   KL(q || p)  reverse KL
                  jsd   beta KL(p || m) + (1 - beta) KL(q || m),  m = beta p + (1 - beta) q
              The draft version goes up by one. Recorded as Decision("osd", {train, loss, beta, buffer,
              new, loss_before, loss_after, steps, lr, version, seconds}, output="update", at=round);
              every round's info holds `draft_version` (what drafted it), an updating round's also
              `update_s`.
    state     OnlineDraft ("head") or WholeDraft ("all"), owned by the caller (`history=`: an
              OnlineDrafts store, or the SuffixHistory a dashboard session or a bench pass hands every
              method that takes `history`, which keeps one beside its texts), per draft, what is
              trained and shape. A run works on its own copy from begin() and puts it back at end(),
              so two concurrent requests never share tensors (the later to end wins). No history:
              the request adapts on its own text only.

Only the draft changes: the verify is draft-model's, the exact rule against the q the trained draft
drew from, so the output is identical to `ar` (greedy) or distributed as the target (sampling). The
time an update takes is the drafter's (the round's draft_s). The paper updates on spare serving
compute and clears its buffer after each update (here: buffer = interval); speclab updates in line.
figures.osd draws acceptance over the rounds with the updates marked and the draft version.
"""
from __future__ import annotations

import copy
import math
import time

import torch

from speclab.decoding.drafters.lookup import RequestStore, SuffixHistory
from speclab.decoding.drafters.model import DraftModelDrafter
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree
from speclab.models.backends import make_lm
from speclab.trace import Decision

POLICY = "osd"
POSITIONS = ("rejected", "all")
TRAIN = ("head", "all")
LOSSES = ("kl", "rkl", "jsd")
BETAS, EPS = (0.9, 0.999), 1e-8
# what None means for steps, lr and buffer, by what is trained: the whole draft takes small steps on
# a buffer cleared by each update (the paper's form); the adapter larger ones over a longer ring
DEFAULTS = {"head": dict(steps=8, lr=1e-2, buffer=128), "all": dict(steps=2, lr=1e-4, buffer=16)}
FLOOR = -30.0           # the target's log-probabilities are kept at or above this (rkl reads log p)


def _positive_int(name: str, v, what: str):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"osd: {name} must be an integer >= 1 ({what}), got {v!r}")


def divergence(logq: torch.Tensor, logp: torch.Tensor, kind: str, beta: float = 0.5) -> torch.Tensor:
    """(M,) the divergence `kind` between the target's p and the draft's q, rows of log-probabilities (M, N)."""
    p, q = logp.exp(), logq.exp()
    if kind == "kl":
        return (p * (logp - logq)).sum(-1)
    if kind == "rkl":
        return (q * (logq - logp)).sum(-1)
    logm = torch.logaddexp(logp + math.log(beta), logq + math.log(1 - beta))
    return beta * (p * (logp - logm)).sum(-1) + (1 - beta) * (q * (logq - logm)).sum(-1)


def adam(params, grads, moments, t: int, lr: float):
    """One Adam step (step number t, from 1) in place on params, moments [(m, v)] per param."""
    b1, b2 = BETAS
    with torch.no_grad():
        for p, g, (m, v) in zip(params, grads, moments):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / (1 - b2 ** t)).sqrt_().add_(EPS)
            p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


class _Ring:
    """The replay buffer's bookkeeping: `size` entries kept, `next` the slot to write, `new` since the
    last update, `t` Adam steps taken, `version` updates so far."""

    def slots(self, m: int) -> list[int]:
        cap = self.logp.shape[0]
        out = [(self.next + r) % cap for r in range(m)]
        self.next = (self.next + m) % cap
        self.size = min(self.size + m, cap)
        self.new += m
        return out

    def copy(self):
        with torch.inference_mode(False):
            return copy.deepcopy(self)


class OnlineDraft(_Ring):
    """train="head": the adapter (A, B) with its Adam moments, the replay buffer, the version.
    Tensors are made outside inference mode: autograd trains them."""

    def __init__(self, C: int, N: int, rank: int, capacity: int, device):
        with torch.inference_mode(False):
            g = torch.Generator().manual_seed(0)
            self.A = (torch.randn(rank, C, generator=g) / C ** 0.5).to(device)      # (r, C)
            self.B = torch.zeros(N, rank, device=device)                             # (N, r): delta 0
            self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in (self.A, self.B)]
            self.h = torch.zeros(capacity, C, device=device)                 # the draft's normed hidden state
            self.base = torch.zeros(capacity, N, device=device, dtype=torch.float16)   # its shipped logits
            self.logp = torch.zeros(capacity, N, device=device)              # the target's log p (draft vocab)
        self.size = self.next = self.new = self.t = self.version = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.A, self.B, *(x for mv in self.moments for x in mv),
                                                            self.h, self.base, self.logp))

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        """(..., N) the adapter's logit correction for normed hidden states h (..., C)."""
        return (h.float() @ self.A.T) @ self.B.T

    @torch.no_grad()
    def add(self, h, base, logp, **_):
        for r, i in enumerate(self.slots(h.shape[0])):
            self.h[i], self.base[i], self.logp[i] = h[r], base[r], logp[r]

    def loss(self, kind: str = "kl", beta: float = 0.5, A=None, B=None) -> torch.Tensor:
        """Mean divergence of the adapted draft from the buffered target distributions."""
        A, B, M = self.A if A is None else A, self.B if B is None else B, self.size
        logits = self.base[:M].float() + (self.h[:M] @ A.T) @ B.T                   # (M, N)
        return divergence(logits.log_softmax(-1), self.logp[:M], kind, beta).mean()

    def update(self, steps: int, lr: float, kind: str, beta: float) -> tuple[float, float]:
        """`steps` Adam steps on A and B over the whole buffer: (loss before, loss after)."""
        with torch.inference_mode(False), torch.enable_grad():
            A, B = self.A.clone().requires_grad_(), self.B.clone().requires_grad_()
            for s in range(steps):
                loss = self.loss(kind, beta, A, B)
                if s == 0:
                    before = loss.item()
                grads = torch.autograd.grad(loss, (A, B))
                self.t += 1
                adam((A, B), grads, self.moments, self.t, lr)
            with torch.no_grad():
                self.A, self.B = A.detach(), B.detach()
                after = self.loss(kind, beta).item()
        self.version += 1
        self.new = 0
        return before, after


def _copy_model(model, share=()):
    """A deep copy of `model` (outside inference mode) but for the tensors in `share`, which it shares,
    and without the lean forward's packed copies and tables cached on it (it builds its own)."""
    memo = {id(model.__dict__[k]): {} for k in ("_speclab_packed", "_speclab_rope") if k in model.__dict__}
    memo |= {id(t): t for t in share}
    with torch.inference_mode(False):
        return copy.deepcopy(model, memo=memo)


def shared_with_target(model) -> list[str]:
    """The names of `model`'s weights that are its target's (a speclab draft over a base: its
    embedding table), kept as they are by training the whole draft."""
    return list((getattr(model.config, "speclab_adapter", None) or {}).get("shared", []))


class WholeDraft(_Ring):
    """train="all": the whole draft, as fp32 master weights with their Adam moments (`master`) and a
    copy in the draft's dtype that drafts (`model`); the replay buffer (a text and a row per entry);
    the version."""

    def __init__(self, draft, N: int, capacity: int):
        frozen = shared_with_target(draft)
        own = dict(draft.named_parameters())
        self.model = _copy_model(draft, share=[own[k] for k in frozen])   # the target's table: shared, read only
        self.master = _copy_model(draft).to(torch.float32).train(False)
        with torch.inference_mode(False):
            named = dict(self.master.named_parameters())
            self.frozen = [named[k].requires_grad_(False) for k in frozen]
            self.params = [p.requires_grad_(True) for k, p in named.items() if k not in frozen]
            mine = dict(self.model.named_parameters())
            self.drafting = [mine[k] for k in named if k not in frozen]          # the params' drafting copies
            self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]
            dev = self.params[0].device
            self.logp = torch.zeros(capacity, N, device=dev)                 # the target's log p (draft vocab)
            self.seq = torch.zeros(capacity, dtype=torch.long)               # which text, which row of it
            self.row = torch.zeros(capacity, dtype=torch.long)
        self.texts: dict[int, list[int]] = {}                                # text id -> committed tokens
        self.N, self.texts_made = N, 0
        self.size = self.next = self.new = self.t = self.version = 0

    @property
    def nbytes(self) -> int:
        """What a copy of this state holds (the frozen tables are shared by every copy)."""
        ts = [*self.params, *(x for mv in self.moments for x in mv), *self.drafting, self.logp, self.seq, self.row]
        return sum(t.numel() * t.element_size() for t in ts) + 8 * sum(map(len, self.texts.values()))

    def copy(self):
        """A copy that trains on its own: every tensor copied but the frozen ones (never written) and
        the drafting model's packed weights (rebuilt where the copy drafts)."""
        d = self.model.__dict__
        memo = {id(d[k]): {} for k in ("_speclab_packed", "_speclab_rope") if k in d}
        memo |= {id(t): t for t in self.frozen}
        memo |= {id(t): t for k, t in self.model.named_parameters() if k in shared_with_target(self.model)}
        with torch.inference_mode(False):
            return copy.deepcopy(self, memo=memo)

    @torch.no_grad()
    def add(self, logp, seq: int, rows: list[int], text: list[int], **_):
        for r, i in enumerate(self.slots(logp.shape[0])):
            self.logp[i], self.seq[i], self.row[i] = logp[r], seq, rows[r]
        self.texts[seq] = text
        kept = set(self.seq[:self.size].tolist())
        for s in [s for s in self.texts if s not in kept]:          # texts no entry reads any more
            del self.texts[s]

    def _groups(self):
        M = self.size
        seq, row = self.seq[:M], self.row[:M]
        for s in sorted(set(seq.tolist())):
            idx = (seq == s).nonzero().flatten()
            yield idx, row[idx], self.texts[s]

    def _text_loss(self, idx, rows, text, kind, beta):
        """The summed divergence at one text's buffered rows: the master reruns the text up to the last."""
        ids = torch.tensor([text[: int(rows.max()) + 1]], device=self.logp.device)
        h = self.master.model(input_ids=ids, use_cache=False).last_hidden_state[0, rows.to(ids.device)]   # (m, C)
        logits = h @ self.master.lm_head.weight[: self.N].T                     # (m, N): the draft's own ids
        return divergence(logits.float().log_softmax(-1), self.logp[idx], kind, beta).sum()

    def loss(self, kind: str = "kl", beta: float = 0.5) -> float:
        with torch.inference_mode(False), torch.no_grad():
            return sum(self._text_loss(*g, kind, beta).item() for g in self._groups()) / self.size

    def update(self, steps: int, lr: float, kind: str, beta: float) -> tuple[float, float]:
        """`steps` Adam steps on every weight over the whole buffer, one backward per buffered text
        (gradients summed): (loss before, loss after). The drafting copy then takes the new weights."""
        with torch.inference_mode(False), torch.enable_grad():
            for s in range(steps):
                for p in self.params:
                    p.grad = None
                total = 0.0
                for g in self._groups():
                    part = self._text_loss(*g, kind, beta) / self.size
                    part.backward()
                    total += part.item()
                if s == 0:
                    before = total
                self.t += 1
                adam(self.params, [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params],
                     self.moments, self.t, lr)
            for p in self.params:
                p.grad = None
            with torch.no_grad():
                for d, m in zip(self.drafting, self.params):
                    d.copy_(m)                                  # cast to the draft's dtype, in place
        after = self.loss(kind, beta)
        self.version += 1
        self.new = 0
        return before, after


class OnlineDrafts(RequestStore):
    """OSD's online drafts by (draft, what is trained, shape); `get` returns a copy, which the run trains."""
    copies = True


def online_drafts(history) -> OnlineDrafts | None:
    """The OnlineDrafts a run's `history` names (RequestStore.named_by); None: none."""
    return OnlineDrafts.named_by(history, "online_drafts", "the online draft earlier requests trained", "osd")


class OsdDrafter(DraftModelDrafter):
    name = "osd"

    def __init__(self, draft, backend: str = "auto", train: str = "all", loss: str = "kl", beta: float = 0.5,
                 rank: int = 8, interval: int = 16, buffer: int | None = None, steps: int | None = None,
                 lr: float | None = None, positions: str = "rejected", history=None, **kw):
        super().__init__(draft, backend, **kw)
        if train not in TRAIN:
            raise ValueError(f"osd: train must be one of {', '.join(TRAIN)} (the head's adapter or the whole "
                             f"draft), got {train!r}")
        given = dict(steps=steps, lr=lr, buffer=buffer)
        steps, lr, buffer = (DEFAULTS[train][k] if v is None else v for k, v in given.items())
        if loss not in LOSSES:
            raise ValueError(f"osd: loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < 1:
            raise ValueError(f"osd: beta must be a number in (0, 1) (jsd's weight on the target), got {beta!r}")
        _positive_int("rank", rank, "the adapter's rank")
        _positive_int("interval", interval, "new buffered positions between updates")
        _positive_int("buffer", buffer, "positions the replay buffer keeps")
        _positive_int("steps", steps, "Adam steps per update")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
            raise ValueError(f"osd: lr must be a number in (0, 1) (Adam's step size), got {lr!r}")
        if positions not in POSITIONS:
            raise ValueError(f"osd: positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        if interval > buffer:
            raise ValueError(f"osd: interval ({interval}) must be <= buffer ({buffer}): an update trains on the "
                             f"buffer, which must hold the positions that triggered it")
        self.train, self.kind, self.beta = train, loss, float(beta)
        self.rank, self.interval, self.capacity, self.steps, self.lr = rank, interval, buffer, steps, float(lr)
        self.positions, self.backend, self.vocab_n = positions, backend, kw.get("vocab")
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
        shape = (C, N, self.rank, self.capacity) if self.train == "head" else (N, self.capacity)
        self.key = (*SuffixHistory.key_of(d), self.train, *shape)
        state = self.store.get(self.key) if self.store is not None else None
        if state is None:
            state = (OnlineDraft(C, N, self.rank, self.capacity, self.lm.device) if self.train == "head"
                     else WholeDraft(d, N, self.capacity))
        self.state, self.round, self.updates = state, 0, 0
        if self.train == "head":
            self.lm.capture_layers = (self.n_layers,)      # the last layer's output: the head's input
        else:
            self.text_id, state.texts_made = state.texts_made, state.texts_made + 1
            self.draft_with(state.model)

    def draft_with(self, model):
        """Draft with `model` (train="all": the run's copy) from here on, its cache empty: the next
        round runs the whole committed text through it."""
        made = self.lm.forwards
        self.lm = make_lm(model, "draft", self.backend)
        if self.vocab_n is not None:
            self.lm.trim_head(self.vocab_n)
        request = getattr(self.target, "request", None)
        if request and hasattr(self.lm, "reserve"):
            self.lm.reserve(request)
        self.lm.forwards = made

    def end(self):
        self.lm.capture_layers = ()
        if self.store is not None:
            self.store.put(self.key, self.state)

    # -- a round: draft-model's chain, through the adapted head or the trained copy -------------------
    def lm_step(self, lm, subset: bool = False):
        """draft-model's step; train="head": its logits plus the adapter's delta (none before the first
        update), each step's normed hidden state and shipped logits kept for the buffer."""
        shipped = super().lm_step(lm, subset)
        if self.train != "head":
            return shipped
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
        self.seen, self.committed = [], ctx.ids
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
        """Keep draft positions `rows` (chain depths whose every predecessor was accepted): the target's
        log-distribution at the verify row that judged each, over the draft's ids; with it the draft's
        state there ("head") or the committed text up to it ("all")."""
        logp = out.logits_at([out.n_pending - 1 + j for j in rows]).float().log_softmax(-1)     # (M, V)
        if self.vocab is not None:
            logp = logp[:, self.vocab]
            logp = logp - logp.logsumexp(-1, keepdim=True)
        logp = logp.clamp_min(FLOOR)
        if self.train == "head":
            h = torch.stack([self.seen[j][0] for j in rows])
            base = torch.stack([self.seen[j][1] for j in rows]).half()
            self.state.add(h=h, base=base, logp=logp)
        else:       # depth j was drafted after the committed text and the first j accepted tokens
            L = len(self.committed)
            text = list(self.committed) + out.accepted_tokens[: max(rows)]
            self.state.add(logp=logp, seq=self.text_id, rows=[L - 1 + j for j in rows], text=text)

    def update(self, out: Outcome):
        t0 = time.perf_counter()
        s = self.state
        size, new = s.size, s.new
        before, after = s.update(self.steps, self.lr, self.kind, self.beta)
        if self.train == "all":
            self.draft_with(s.model)
        secs = time.perf_counter() - t0
        self.updates += 1
        out.tree.info["update_s"] = round(secs, 6)
        if self.record is not None:
            inputs = {"train": self.train, "loss": self.kind}
            if self.kind == "jsd":
                inputs["beta"] = self.beta
            out.tree.decisions.append(Decision(POLICY, inputs | {
                "buffer": size, "new": new, "loss_before": round(before, 4), "loss_after": round(after, 4),
                "steps": self.steps, "lr": self.lr, "version": s.version, "seconds": round(secs, 4)},
                output="update", at=self.round))
