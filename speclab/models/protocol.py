"""What the speculative engine and its drafters may ask of a target's forward: one named protocol.

Three classes implement it (models/backends.py picks one): LeanLM (speclab's forward), StaticLM
(the same in static shapes, CUDA graphs on a GPU) and CausalLM (transformers' own forward, any
architecture). tests/test_protocol.py checks that each has every member below with a compatible
signature, so a drafter written against `TargetLM` runs on all three.

    forward(ids, parents, n_prefix, logits_to_keep) -> logits (kept rows, V) float32: the rows
        appended after the cache; `parents` makes them a tree (tree attention, positions by depth)
    keep(n) / keep_positions(start, idx)  roll the cache back to n entries / keep the accepted path
    length, reset()                       entries in the cache / an empty cache
    capture_layers, captured              ask for hidden states after these layers (1-based); the
                                          last forward's, {layer: (1, T, C)} (EAGLE, Medusa, exits)
    exit_lm(n_layers)                     a forward through the first n layers and the final norm +
                                          head, sharing this cache (layer-skip's draft)
    final_norm_head(h)                    the final norm and LM head over hidden states (C,) -> (V,)
    drop_layers_tail(n_layers, drop)      drop the last `drop` entries of the first n layers only
                                          (an early-exit draft's speculative entries)
    skip_lm(skip), skip                   a forward less a SkipSet of sublayers, sharing this cache
                                          (SWIFT's draft) / the SkipSet every forward leaves out
                                          (Unified Layer Skipping); CausalLM refuses both
    mlp_gate                              None, or an MlpGate (models.lean.forward) a one-token
                                          forward asks, layer by layer, whether to run each MLP
                                          (FFN-SkipLLM); CausalLM refuses one
    forwards, device, name                forwards run so far (the trace's counts), its device, its role
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class TargetLM(Protocol):
    name: str
    device: torch.device
    forwards: int
    captured: dict[int, torch.Tensor]
    skip: object                        # a SkipSet or None
    mlp_gate: object                    # an MlpGate or None

    @property
    def length(self) -> int: ...

    @property
    def capture_layers(self) -> tuple[int, ...]: ...

    def reset(self) -> None: ...

    def forward(self, ids: torch.Tensor, parents: list[int] | None = None, n_prefix: int = 0,
                logits_to_keep: int = 0) -> torch.Tensor: ...

    def keep(self, n: int) -> None: ...

    def keep_positions(self, start: int, idx: list[int]) -> None: ...

    def exit_lm(self, n_layers: int) -> "TargetLM": ...

    def final_norm_head(self, h: torch.Tensor) -> torch.Tensor: ...

    def drop_layers_tail(self, n_layers: int, drop: int) -> None: ...

    def skip_lm(self, skip) -> "TargetLM": ...
