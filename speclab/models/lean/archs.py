"""What each architecture asks of the lean forward, as a delta from Llama.

Llama is the base: RMSNorm, RoPE, grouped-query attention without biases, a SwiGLU MLP. Every
other architecture is described by the flags it sets in `Arch` (Qwen2: biases on q, k, v; Qwen3:
an RMSNorm on each head of q and k; Mistral: a sliding attention window; Gemma: scaled embeddings,
RMSNorm by 1 + weight, a GELU-tanh gate), read from its config by a reader registered in READERS. The forward implements the flags in IMPLEMENTED; a model whose
reader asks for any other flag, or whose type has no reader, runs through transformers instead
(models.backends). Adding an architecture = a reader here + its flags in the forward, never a
copy of the forward.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch.nn.functional as F

# RoPE variants whose tables the model's own rotary embedding computes (lean.weights.rope_tables
# reads them from it), so the forward needs nothing per variant
ROPE_TYPES = ("default", "linear", "llama3")

# the MLP gate activations the forward computes (config.hidden_act -> the function transformers'
# ACT2FN applies under that name)
ACTIVATIONS: dict[str, Callable] = {"silu": F.silu,
                                    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


@dataclass(frozen=True)
class Arch:
    """The deltas from Llama one model's config asks for. All defaults = plain Llama."""
    qkv_bias: bool = False              # biases on the q, k, v projections (Qwen2 / Qwen2.5)
    o_bias: bool = False                # a bias on the attention's output projection
    mlp_bias: bool = False              # biases on the MLP's projections
    qk_norm: bool = False               # RMSNorm over each head of q and k before RoPE (Qwen3)
    sliding_window: int | None = None   # attend to at most this many keys back (Mistral)
    embed_scale: bool = False           # token embeddings times sqrt(hidden_size) in the model dtype (Gemma)
    norm_offset: bool = False           # RMSNorm multiplies by 1 + weight, in float32 before the cast (Gemma)
    act: str = "silu"                   # the MLP's gate activation, a name in ACTIVATIONS (Gemma: GELU-tanh)

    def flags(self) -> set[str]:
        """The names of the deltas this config sets (the fields off their Llama default)."""
        return {f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}

    @property
    def native(self) -> bool:
        """Whether speclab's bf16 kernel (models.kernels) can run the matrices one by one: its
        packed product adds no bias. Every other delta is computed by torch ops around it."""
        return not {"qkv_bias", "o_bias", "mlp_bias"} & self.flags()

    @property
    def fuses(self) -> bool:
        """Whether the kernel's layer call can run the layers: it computes plain Llama (Llama's
        RMSNorm, SiLU, no biases, no q/k norms). A window changes nothing while requests fit it."""
        return not self.flags() - {"sliding_window"}


def _act(cfg) -> str:
    return getattr(cfg, "hidden_act", "silu")


def _llama(cfg) -> Arch:
    bias = bool(getattr(cfg, "attention_bias", False))
    return Arch(qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)), act=_act(cfg))


def _window(cfg) -> int | None:
    """Qwen's sliding window where any layer slides (with use_sliding_window, the layers from
    max_window_layers on: layer_types says which); None where every layer attends to all."""
    w = getattr(cfg, "sliding_window", None)
    return w if w and "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) else None


def _qwen2(cfg) -> Arch:
    # q, k and v always carry biases in Qwen2 / Qwen2.5 (no config switch); o and the MLP never do
    return Arch(qkv_bias=True, sliding_window=_window(cfg), act=_act(cfg))


def _qwen3(cfg) -> Arch:
    bias = bool(getattr(cfg, "attention_bias", False))
    return Arch(qkv_bias=bias, o_bias=bias, qk_norm=True, sliding_window=_window(cfg), act=_act(cfg))


def _mistral(cfg) -> Arch:
    # every layer slides over the same window (Mistral 7B v0.1: 4,096); None from v0.2 on
    return Arch(sliding_window=getattr(cfg, "sliding_window", None), act=_act(cfg))


def _gemma(cfg) -> Arch:
    # Gemma 1 / CodeGemma: Llama's layout with scaled embeddings, RMSNorm by 1 + weight, GELU-tanh
    # (a config's legacy "gelu" is read as "gelu_pytorch_tanh" by GemmaConfig itself)
    bias = bool(getattr(cfg, "attention_bias", False))
    return Arch(qkv_bias=bias, o_bias=bias, embed_scale=True, norm_offset=True, act=_act(cfg))


# how far past its committed tokens a request's verify may reach (its draft's depth): the room the
# lean forward's cache keeps, the static runner's widest bucket
VERIFY_ROOM = 64


# model_type -> the reader of its deltas
READERS: dict[str, Callable[[object], Arch]] = {"llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
                                                "mistral": _mistral, "gemma": _gemma}

# model types kept on transformers for what their layers do beyond these deltas (one line each)
_GEMMA2 = ("soft-caps attention scores and final logits, norms each sublayer's output as well as its input, "
           "and alternates sliding-window and global layers")
ELSEWHERE: dict[str, str] = {"gemma2": _GEMMA2, "gemma3": _GEMMA2 + ", with q / k norms",
                             "gemma3_text": _GEMMA2 + ", with q / k norms"}

# the deltas lean.forward computes; a model asking for any other runs through transformers. The
# sliding window is computed by not needing it: a request that reaches no further than the window
# sees every earlier position either way, and one that would reach further runs on transformers
# (why_not with the request's positions; the forward refuses a step past the window)
IMPLEMENTED: frozenset[str] = frozenset({"qkv_bias", "o_bias", "mlp_bias", "qk_norm", "sliding_window",
                                        "embed_scale", "norm_offset", "act"})


def why_not(model, positions: int | None = None) -> str | None:
    """None if the lean forward runs `model` for a request reaching `positions` (default: the
    model's max_position_embeddings), else what it lacks (one line)."""
    reason = _lacks(model)
    if reason is not None:
        return reason
    cfg = model.config
    window = READERS[cfg.model_type](cfg).sliding_window
    reach = positions or getattr(cfg, "max_position_embeddings", None)
    if window is not None and (reach is None or reach > window):
        return (f"the request may reach {reach} positions, past {cfg.model_type}'s sliding window of {window} "
                f"(the lean forward attends to every earlier position)")
    return None


def _lacks(model) -> str | None:
    """What the lean forward lacks to run `model` at all (a sliding window aside)."""
    cfg = model.config
    if cfg.model_type in ELSEWHERE:
        return f"{cfg.model_type} {ELSEWHERE[cfg.model_type]}, which the lean forward does not implement"
    reader = READERS.get(cfg.model_type)
    if reader is None:
        return f"the lean forward has no reader for model_type {cfg.model_type!r} (known: {', '.join(READERS)})"
    arch = reader(cfg)
    missing = arch.flags() - IMPLEMENTED
    if missing:
        return f"the lean forward does not implement {', '.join(sorted(missing))} ({cfg.model_type})"
    if arch.act not in ACTIVATIONS:
        return f"the lean forward does not implement the activation {arch.act!r} (known: {', '.join(ACTIVATIONS)})"
    if getattr(cfg, "use_bidirectional_attention", False):
        return f"the lean forward attends causally only ({cfg.model_type} sets use_bidirectional_attention)"
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in ROPE_TYPES:
        return f"the lean forward does not implement rope_type {rope!r}"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "the lean forward does not implement pretraining_tp > 1"
    return None


def supports(model, positions: int | None = None) -> bool:
    return why_not(model, positions) is None


def arch_of(model) -> Arch:
    """The deltas `model` asks for; ValueError (saying why) if the lean forward cannot run it. A
    sliding window is checked by each forward (LeanLM._check_window), against where it reaches."""
    reason = _lacks(model)
    if reason is not None:
        raise ValueError(f"{reason}: use backend='hf'")
    return READERS[model.config.model_type](model.config)
