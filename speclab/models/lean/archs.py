"""What each architecture asks of the lean forward, as a delta from Llama.

Llama is the base: RMSNorm, RoPE, grouped-query attention without biases, a SwiGLU MLP. Every
other architecture is described by the flags it sets in `Arch` (Qwen2: biases on q, k, v; Qwen3:
an RMSNorm on each head of q and k; Mistral: a sliding attention window), read from its config by
a reader registered in READERS. The forward implements the flags in IMPLEMENTED; a model whose
reader asks for any other flag, or whose type has no reader, runs through transformers instead
(models.backends). Adding an architecture = a reader here + its flags in the forward, never a
copy of the forward.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

# RoPE variants whose tables the model's own rotary embedding computes (lean.weights.rope_tables
# reads them from it), so the forward needs nothing per variant
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class Arch:
    """The deltas from Llama one model's config asks for. All defaults = plain Llama."""
    qkv_bias: bool = False              # biases on the q, k, v projections (Qwen2 / Qwen2.5)
    o_bias: bool = False                # a bias on the attention's output projection
    mlp_bias: bool = False              # biases on the MLP's projections
    qk_norm: bool = False               # RMSNorm over each head of q and k before RoPE (Qwen3)
    sliding_window: int | None = None   # attend to at most this many keys back (Mistral)

    def flags(self) -> set[str]:
        """The names of the deltas this config sets."""
        return {f.name for f in dataclasses.fields(self) if getattr(self, f.name) not in (False, None)}


def _llama(cfg) -> Arch:
    bias = bool(getattr(cfg, "attention_bias", False))
    return Arch(qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)))


# model_type -> the reader of its deltas
READERS: dict[str, Callable[[object], Arch]] = {"llama": _llama}

# the deltas lean.forward computes; a model asking for any other runs through transformers
IMPLEMENTED: frozenset[str] = frozenset()


def why_not(model) -> str | None:
    """None if the lean forward runs `model`, else what it lacks (one line)."""
    cfg = model.config
    reader = READERS.get(cfg.model_type)
    if reader is None:
        return f"the lean forward has no reader for model_type {cfg.model_type!r} (known: {', '.join(READERS)})"
    missing = reader(cfg).flags() - IMPLEMENTED
    if missing:
        return f"the lean forward does not implement {', '.join(sorted(missing))} ({cfg.model_type})"
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in ROPE_TYPES:
        return f"the lean forward does not implement rope_type {rope!r}"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "the lean forward does not implement pretraining_tp > 1"
    return None


def supports(model) -> bool:
    return why_not(model) is None


def arch_of(model) -> Arch:
    """The deltas `model` asks for; ValueError (saying why) if the lean forward cannot run it."""
    reason = why_not(model)
    if reason is not None:
        raise ValueError(f"{reason}: use backend='hf'")
    return READERS[model.config.model_type](model.config)
