"""How close `ar` runs to the memory-bandwidth limit of batch-1 decoding.

At batch 1 every new token reads every weight once (the KV cache of a short context is small
beside it), so tokens/s cannot exceed  streaming bandwidth / weight bytes per token.  Both are
measured in the same process as the bench: the bandwidth by summing a buffer far larger than the
caches (a pure streaming read, what a matrix-vector product does with its weight), the bytes from
the parameters a forward reads (the embedding contributes one row per token, not the matrix;
a tied LM head is read once, as the head).
"""
from __future__ import annotations

import time

import torch


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decoding step reads: every matrix once, one embedding row."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    total = 0
    seen = set()
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() == emb.data_ptr():
            total += (p.numel() if tied else p.shape[-1]) * p.element_size()   # tied: read as the head
        else:
            total += p.numel() * p.element_size()
    return total


@torch.inference_mode()
def streaming_bandwidth(device="cpu", mib: int = 512, repeats: int = 5) -> float:
    """Bytes per second of a streaming read (best of `repeats` sums over a `mib` MiB bf16 buffer)."""
    x = torch.ones(mib * 2 ** 20 // 2, dtype=torch.bfloat16, device=device)
    x.sum()                                                      # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.sum()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * x.element_size() / best


@torch.inference_mode()
def gemv_bandwidth(device="cpu", dtype=torch.bfloat16, mib: int = 256, repeats: int = 5) -> tuple[float, str]:
    """(bytes per second, kernel name): the rate at which the matrix-vector kernel a decode step runs
    (one row) reads its weight: speclab's bf16 kernel where it runs (speclab.models.kernels), else
    F.linear. What the best decode of this dtype can hope for, usually below a plain streaming read."""
    from speclab.models import kernels
    cols = 4096
    w = torch.ones(mib * 2 ** 20 // (cols * torch.finfo(dtype).bits // 8), cols, dtype=dtype, device=device)
    x = torch.ones(1, cols, dtype=dtype, device=device)
    if kernels.available(w.device, dtype):
        mm, name = kernels.Packed(w), "speclab bf16 kernel"
    else:
        mm, name = (lambda v: torch.nn.functional.linear(v, w)), "F.linear"
    mm(x)
    best = float("inf")
    for _ in range(repeats):
        if w.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        mm(x)
        if w.device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return w.numel() * w.element_size() / best, name


def bandwidth_limit(model) -> dict:
    """Weight bytes per token, the streaming-read and GEMV bandwidths (GB/s), and the tokens/s limit
    each implies."""
    p = next(model.parameters())
    nbytes = weight_bytes_per_token(model)
    bw = streaming_bandwidth(p.device)
    gemv, kernel = gemv_bandwidth(p.device, p.dtype)
    return dict(weight_mb_per_token=round(nbytes / 1e6, 1), bandwidth_gb_s=round(bw / 1e9, 2),
                limit_tokens_per_s=round(bw / nbytes, 1), gemv_gb_s=round(gemv / 1e9, 2), gemv_kernel=kernel,
                gemv_limit_tokens_per_s=round(gemv / nbytes, 1))
