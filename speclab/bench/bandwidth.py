"""How close `ar` runs to the memory-bandwidth limit of batch-1 decoding.

At batch 1 every new token reads every weight once (the KV cache of a short context is small
beside it), so tokens/s cannot exceed  streaming bandwidth / weight bytes per token.  Both are
measured in the same process as the bench: the bandwidth sampled beside `ar`'s own runs
(BandwidthProbe), the bytes from the parameters a forward reads (the embedding contributes one row
per token, not the matrix; a tied LM head is read once, as the head).

The streaming read is of a buffer larger than the caches. Where speclab's bf16 kernel runs, the
probe also reads the model's own packed matrices, the bytes a decode step reads: on a CPU whose
L3 holds the weights (a 300 MiB L3, SmolLM2's 269 MB) they come faster than from memory, and `ar`
ran at 1.10-1.25 of the big buffer's "limit"; against its own weights' read, at 0.99-1.01.

On CUDA the rate is a device-to-device copy's (bytes read plus bytes written, over the time between
two CUDA events around it), the figure a GPU's memory is rated by and the one a decode step that
streams its weights from HBM can approach.
"""
from __future__ import annotations

import statistics
import time

import torch

from speclab.models.lean.weights import packed_matrices


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


class BandwidthProbe:
    """The memory system's rates, sampled again and again while a bench runs: one streaming read of
    a `mib_stream` MiB bf16 buffer far larger than the caches (what a matrix-vector product does with
    its weight) and one matrix-vector product over a `mib_gemv` MiB weight in the kernel a decode step
    runs (speclab's bf16 kernel where it runs, else F.linear; usually a little below the plain read).

    Why sampled: on a shared machine (a VM) these rates drift by up to 2x over minutes. The bench
    samples right after each of `ar`'s prompts, so the median is the bandwidth `ar` itself saw, not a
    snapshot's."""

    def __init__(self, device="cpu", dtype=torch.bfloat16, mib_stream: int = 512, mib_gemv: int = 256,
                 model=None):
        from speclab.models import kernels
        self.device = torch.device(device)
        self.x = torch.ones(mib_stream * 2 ** 20 // 2, dtype=torch.bfloat16, device=self.device)
        cols = 4096
        w = torch.ones(mib_gemv * 2 ** 20 // (cols * torch.finfo(dtype).bits // 8), cols, dtype=dtype,
                       device=self.device)
        self.v = torch.ones(1, cols, dtype=dtype, device=self.device)
        self.w_bytes = w.numel() * w.element_size()
        if kernels.available(w.device, dtype):
            self.mm, self.kernel = kernels.Packed(w), "speclab bf16 kernel"
        else:
            self.mm, self.kernel = (lambda v: torch.nn.functional.linear(v, w)), "F.linear"
        # the plain read: speclab's native one where it runs (nothing but loads), else torch's fp32
        # sum over the same bytes. Not a bf16 sum: on some CPUs that one is bound by its own
        # arithmetic, at about half the rate of a plain read. On CUDA a copy into a second buffer,
        # counted as read + write
        native = kernels.module() if self.device.type == "cpu" else None
        flat = self.x.view(torch.float32)
        self.stream_bytes = self.x.numel() * self.x.element_size()
        if self.device.type == "cuda":
            y = torch.empty_like(self.x)
            self.read, self.stream_bytes = (lambda: y.copy_(self.x)), 2 * self.stream_bytes
            self.stream_kind = "device-to-device copy"
        else:
            self.read = (lambda: native.stream_read(self.x)) if native else flat.sum
            self.stream_kind = "streaming read"
        # and the model's own packed weights read the same way: the bytes a decode step reads, from
        # wherever they live (a CPU whose L3 holds the weights reads them faster than its memory's
        # streaming rate, so ar can pass the big buffer's "limit": docs/performance.md)
        self.model, self.native = model, native
        self.own: list[float] = []
        self.own_pairs: list[tuple[float, float]] = []
        self.stream: list[float] = []           # bytes per second, one per sample
        self.gemv: list[float] = []
        self.pairs: list[tuple[float, float]] = []   # (ar tokens/s, stream bytes/s sampled right after)
        with torch.inference_mode():            # fault the pages in, warm the kernel
            self.read()
            self.mm(self.v)

    def _timed(self, fn) -> float:
        """Seconds fn's work takes; on CUDA between two events on the device's stream, after the
        work queued before it has drained (the decode just timed must not count)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    @torch.inference_mode()
    def sample(self, n: int = 1, ar_tokens_per_s: float | None = None):
        """n samples of each rate; ar_tokens_per_s: the rate of the ar run just before, paired with
        this stream sample (paired_share)."""
        for _ in range(n):
            self.stream.append(self.stream_bytes / self._timed(self.read))
            self.gemv.append(self.w_bytes / self._timed(lambda: self.mm(self.v)))
            own = packed_matrices(self.model) if self.model is not None and self.native else []
            if own:
                nbytes = sum(t.numel() * t.element_size() for t in own)
                self.own.append(nbytes / self._timed(lambda: [self.native.stream_read(t) for t in own]))
        if ar_tokens_per_s is not None:
            self.pairs.append((ar_tokens_per_s, self.stream[-1]))
            if self.own:
                self.own_pairs.append((ar_tokens_per_s, self.own[-1]))

    def summary(self) -> dict:
        """Median, min and max of the samples, GB/s (JSON-ready)."""
        gb = lambda xs: dict(median=round(statistics.median(xs) / 1e9, 2), min=round(min(xs) / 1e9, 2),
                             max=round(max(xs) / 1e9, 2), samples=len(xs))
        out = dict(stream=gb(self.stream), stream_kind=self.stream_kind, gemv=gb(self.gemv), gemv_kernel=self.kernel,
                   pairs=[(r, round(bw / 1e9, 2)) for r, bw in self.pairs])
        if self.own:
            out |= dict(own=gb(self.own), own_pairs=[(r, round(bw / 1e9, 2)) for r, bw in self.own_pairs])
        return out


def paired_share(pairs: list[tuple[float, float]], nbytes: int) -> dict:
    """ar's share of the limit prompt by prompt: pairs of (a prompt's tokens/s, the stream in GB/s
    sampled right after it). On a VM whose memory speed drifts within a run, this pairs each rate
    with the bandwidth it actually ran at, where the headline share divides two aggregates."""
    shares = sorted(r * nbytes / (bw * 1e9) for r, bw in pairs)
    return dict(median=round(statistics.median(shares), 3), min=round(shares[0], 3), max=round(shares[-1], 3),
                prompts=len(shares))


def bandwidth_limit(model, measured: dict | None = None) -> dict:
    """Weight bytes per token, the median streaming-read and GEMV bandwidths of `measured` (a
    BandwidthProbe's summary; if None, a new probe sampled 5 times), and the tokens/s limit each
    implies."""
    p = next(model.parameters())
    nbytes = weight_bytes_per_token(model)
    if measured is None:
        probe = BandwidthProbe(p.device, p.dtype)
        probe.sample(5)
        measured = probe.summary()
    bw, gemv = measured["stream"]["median"] * 1e9, measured["gemv"]["median"] * 1e9
    out = dict(weight_mb_per_token=round(nbytes / 1e6, 1), bandwidth_gb_s=round(bw / 1e9, 2),
               limit_tokens_per_s=round(bw / nbytes, 1), gemv_gb_s=round(gemv / 1e9, 2),
               gemv_kernel=measured["gemv_kernel"], gemv_limit_tokens_per_s=round(gemv / nbytes, 1),
               bandwidth_range_gb_s=[measured["stream"]["min"], measured["stream"]["max"]],
               bandwidth_kind=measured.get("stream_kind", "streaming read"),
               samples=measured["stream"]["samples"])
    if "own" in measured:                   # the model's own packed weights, read where they live
        own = measured["own"]["median"] * 1e9
        out |= dict(own_read_gb_s=round(own / 1e9, 2), own_limit_tokens_per_s=round(own / nbytes, 1),
                    own_range_gb_s=[measured["own"]["min"], measured["own"]["max"]])
    return out
