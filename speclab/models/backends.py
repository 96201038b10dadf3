"""The one place that knows every way to run a causal LM's forward, and picks one.

Backends (the `backend` parameter of speclab.run, the bench and the drafters):

  "auto"            where lean.archs supports the model: on CUDA "static", elsewhere "fast";
                    any other model: "hf"
  "fast"            the lean forward (models.lean.forward.LeanLM), eager, shapes as they come; on a
                    CPU with AVX512-BF16 in bf16 its layers are one native call each (models.kernels)
  "exact"           the lean forward computing every row as a one-token forward computes it
  "static"          the lean forward in static shapes (models.lean.static.StaticLM), each bucket
                    captured as a CUDA graph on CUDA, eager elsewhere
  "static-eager"    the same runner with graphs off (graphs=False)
  "static-compile"  the same runner, its step compiled by torch.compile (fullgraph) inside the graphs
  "static-compile-ops"  the same runner with only its elementwise work compiled (adds fused into the
                    norms, RoPE, SwiGLU), the products and attention left to cuBLAS / SDPA
  "hf"              transformers' own forward (models.hf.CausalLM): every architecture

On a CPU "auto" stays the eager lean forward: there every launch is a function call, and the
native kernel already reads the weights at the memory's rate; static shapes buy nothing there.

Every backend has the same protocol: forward(ids, parents, n_prefix, logits_to_keep) -> logits,
keep / keep_positions, length, exit_lm, capture_layers; the batch forms (make_batch_lm) share
models.geometry.BatchSlots.
"""
from __future__ import annotations

from speclab.models.hf import BatchCausalLM, CausalLM
from speclab.models.lean.archs import supports, why_not
from speclab.models.lean.batch import LeanBatchLM
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.static import StaticLM

BACKENDS = ("auto", "fast", "exact", "static", "static-eager", "static-compile", "static-compile-ops", "hf")
# the static runner's graphs option per backend name (None: CUDA graphs on CUDA, eager elsewhere)
GRAPHS = {"static": None, "static-eager": False, "static-compile": "compile", "static-compile-ops": "compile-ops"}


def _check(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def resolve(model, backend: str = "auto", positions: int | None = None) -> str:
    """The concrete backend `backend` means for this model on its device. positions: how far the
    request reaches, where known (a sliding-window model runs lean only inside its window)."""
    _check(backend)
    if backend == "auto":
        if not supports(model, positions):
            return "hf"
        return "static" if next(model.parameters()).device.type == "cuda" else "fast"
    if backend != "hf" and not supports(model, positions):
        raise ValueError(f"backend {backend!r}: {why_not(model, positions)}; use backend='hf'")
    return backend


def make_lm(model, name: str = "", backend: str = "auto", max_len: int | None = None):
    """The forward for one sequence of `model` on `backend` (see the module's docstring).
    max_len: the cache slots the request needs (prompt + new tokens + widest draft), where known;
    it says how far the request reaches (a sliding-window model runs lean only inside its window)
    and the static runner sizes its cache (and so its attention) by it, once. The eager lean
    forward keeps a context-window cache: a verify wider than the request's room at its end would
    overflow one sized by the request."""
    backend = resolve(model, backend, max_len)
    if backend == "hf":
        return CausalLM(model, name)
    if backend in GRAPHS:
        return StaticLM(model, name, max_len, graphs=GRAPHS[backend])
    return LeanLM(model, name, exact=backend == "exact")


def make_batch_lm(model, rows: int, backend: str = "auto"):
    """B sequences in one cache: the lean shared-slot cache (LeanBatchLM) where the lean forward
    runs the model, else rows of a transformers cache (BatchCausalLM)."""
    if backend != "hf" and not supports(model):
        backend = "hf"
    backend = resolve(model, backend)
    if backend == "hf":
        return BatchCausalLM(model, rows)
    if backend in GRAPHS:
        return LeanBatchLM(model, rows, lm=StaticLM(model, "target", 512 * rows, graphs=GRAPHS[backend]))
    return LeanBatchLM(model, rows, exact=backend == "exact")


def make_rows_lm(model, name: str = "", backend: str = "auto") -> LeanLM | None:
    """A forward that takes rows at any positions with any visibility (LeanLM.forward_rows: a
    block-diffusion canvas over its cache), or None where only transformers runs the model."""
    _check(backend)
    return LeanLM(model, name) if backend != "hf" and supports(model) else None
