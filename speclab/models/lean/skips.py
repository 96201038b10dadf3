"""What a lean forward leaves out, and the drafts that run part of one: skip sets (SWIFT's draft,
Unified Layer Skipping, FFN-SkipLLM's per-token MLP gate) and the views of a LeanLM that run its
first layers or all but a skip set, sharing its cache (LayerSkip's and SWIFT's drafts)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SkipSet:
    """The sublayers a forward leaves out, by 0-based layer: a skipped attention or MLP adds nothing
    to the residual stream, and a skipped attention writes no KV. Nothing misses those entries: a
    layer's slots are read by that layer's attention only; a draft's attention (SWIFT's set changes
    from round to round) reads the committed slots, which the verify wrote in every layer, and its
    own round's; a layer skipped for the whole run (Unified Layer Skipping) is never read. On the
    native kernel (bf16, any kernel path) whole-layer skips run as spans of the kernel's layers; a set
    that skips one sublayer of a layer and runs the other runs the layers as torch ops."""
    attn: frozenset = frozenset()
    mlp: frozenset = frozenset()

    @classmethod
    def layers(cls, idx) -> "SkipSet":
        """Whole layers skipped (attention and MLP)."""
        return cls(frozenset(idx), frozenset(idx))

    @classmethod
    def from_text(cls, text: str) -> "SkipSet":
        return cls(frozenset(i for i, c in enumerate(text) if c in "ax"),
                   frozenset(i for i, c in enumerate(text) if c in "mx"))

    def __bool__(self) -> bool:
        return bool(self.attn or self.mlp)

    @property
    def whole(self) -> frozenset:
        """The layers skipped whole."""
        return self.attn & self.mlp

    @property
    def partial(self) -> bool:
        """Some layer skips one sublayer and runs the other."""
        return self.attn != self.mlp

    def __len__(self) -> int:
        """Sublayers skipped."""
        return len(self.attn) + len(self.mlp)

    def text(self, n_layers: int) -> str:
        """One character a layer: "." runs, "a" attention skipped, "m" MLP skipped, "x" both
        (".x.x" skips layers 1 and 3 whole)."""
        return "".join("x" if i in self.whole else "a" if i in self.attn else "m" if i in self.mlp else "."
                       for i in range(n_layers))

    def check(self, n_layers: int) -> "SkipSet":
        bad = sorted(i for i in self.attn | self.mlp if not (isinstance(i, int) and 0 <= i < n_layers))
        if bad:
            raise ValueError(f"a skip set names layers {bad}, outside this model's 0..{n_layers - 1}")
        return self


class MlpGate(Protocol):
    """A per-token choice of MLPs, made inside a one-row forward as it runs (FFN-SkipLLM): before
    layer i's MLP the forward asks run(i); after an MLP that ran it reports ran(i, x_in, x_out),
    the residual stream (1, C) into and out of that MLP. asks(i): whether it may still test or
    skip layer i's MLP (False: the layer runs whole, as a native span on the kernel). Multi-row
    forwards run every MLP."""

    def asks(self, layer: int) -> bool: ...

    def run(self, layer: int) -> bool: ...

    def ran(self, layer: int, x_in: torch.Tensor, x_out: torch.Tensor) -> None: ...


class ExitLM:
    """The first n_layers of a LeanLM, sharing its cache (the LayerSkip draft)."""

    def __init__(self, base, n_layers: int):           # base: the LeanLM whose cache it shares
        self.base, self.n_layers, self.forwards = base, n_layers, 0
        self.device = base.device

    @property
    def length(self):
        return self.base.n

    def forward(self, ids, parents=None, n_prefix=0, logits_to_keep=0):
        self.forwards += 1
        saved = self.base.forwards
        out = self.base.forward(ids, parents, n_prefix, logits_to_keep, n_layers=self.n_layers)
        self.base.forwards = saved      # a draft forward, not a target forward
        return out


class SkipLM(ExitLM):
    """A LeanLM less a skip set, sharing its cache (the SWIFT draft): forward, and forward_rows for
    scoring a candidate set on committed text in slots past the cache's end."""

    def __init__(self, base, skip: SkipSet):
        super().__init__(base, None)
        self.skip = skip

    def forward(self, ids, parents=None, n_prefix=0, logits_to_keep=0):
        return self._draft(self.base.forward, ids, parents, n_prefix, logits_to_keep, skip=self.skip)

    def forward_rows(self, ids, pos, vis, score=None):
        return self._draft(self.base.forward_rows, ids, pos, vis, score, skip=self.skip)

    def _draft(self, fn, *args, **kw):
        self.forwards += 1
        saved = self.base.forwards
        out = fn(*args, **kw)
        self.base.forwards = saved
        return out
