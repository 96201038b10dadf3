"""A lean inference path over a Hugging Face Llama's own weights (gpt-fast style).

Why: on a CPU, small models spend most of a forward in per-module Python overhead, not in
arithmetic. This runs the same math as `LlamaForCausalLM.forward` with a handful of fused tensor
ops per layer, and a PREALLOCATED KV cache that is simply overwritten: keeping a prefix after a
rejected draft is `self.n = n`, with nothing copied (gpt-fast's trick, no rollback needed).

Same interface as `models.hf.CausalLM` (forward / keep / keep_positions / exit_lm / capture), plus
`forward_rows` (rows at any positions with any visibility: a batch of sequences in one slot space,
a block-diffusion canvas) and skip sets (`SkipSet`: a forward that leaves out chosen attention and
MLP sublayers, the residual stream passing them by: SWIFT's draft, `skip_lm`; Unified Layer
Skipping, `self.skip` on every forward; FFN-SkipLLM, `self.mlp_gate`: a one-token forward that
asks layer by layer whether to run each MLP). Logits equal the transformers forward to rounding
(tests/test_causal.py, tests/test_real_model.py). Runs the architectures lean.archs supports
(plain Llama and the deltas it implements); models.backends sends anything else to the
transformers path.

In bf16 on an x86 CPU with AVX2 or better each layer is one call into speclab's native kernel
(speclab.models.kernels picks its path from the CPU's flags): every row is then computed exactly as a
one-token forward computes it, which makes the `exact` flag unnecessary there. Elsewhere the layers
are torch ops.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from speclab.models import kernels
from speclab.models.adapter import scatter_subset
from speclab.models.geometry import is_chain, tree_depths_and_visibility, tree_positions
from speclab.models.lean.archs import ACTIVATIONS, VERIFY_ROOM, arch_of
from speclab.models.lean.skips import ExitLM, MlpGate, SkipLM, SkipSet
from speclab.models.lean.weights import fuse, mm, norm_weight, pack_model, rope_tables


class LeanLM:
    """One sequence on the lean forward: its preallocated cache `kv`, `n` slots of it committed."""

    def __init__(self, model, name: str = "", max_len: int | None = None, exact: bool = False):
        cfg = model.config
        self.arch = arch_of(model)                  # ValueError (saying why) for a model it cannot run
        self.model, self.name, self.config = model.eval(), name, cfg
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        inner = model.model
        self.Hq, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq
        self.eps = cfg.rms_norm_eps
        # fp32: each weight is kept as (in, out) contiguous and applied as `x @ w`, because fp32
        # F.linear on the usual (out, in) layout takes a slow path on a CPU from 4 rows on (a
        # verify); it is the fastest for 2-3 rows, so on a CPU the (out, in) copy is kept too and
        # chosen for 2-3 rows (docs/performance.md). bf16 / fp16: F.linear on (out, in) for every
        # row count, the fastest layout there and row for row the same result whatever the number
        # of rows, so no second copy. bf16 on a CPU with AVX512-BF16: speclab's own kernel over a
        # packed copy (speclab.models.kernels), faster than F.linear at every row count it takes.
        # The kernel's product adds no bias: a model with biases (Qwen2) runs its layers as torch
        # ops in bf16 too, F.linear adding each bias inside the product as transformers' nn.Linear
        # does (lean.archs.Arch.native). Its layer call computes plain Llama layers: any other delta
        # (q / k norms, Gemma's norm and GELU) runs the kernel's products one by one, the delta as
        # torch ops around them (lean.archs.Arch.fuses)
        if kernels.available(self.device, self.dtype) and self.arch.native:
            self.layout = "packed"
        else:
            self.layout = "out_in" if self.dtype != torch.float32 else ("dual" if self.device.type == "cpu" else "in_out")
        self.layers, self.head = pack_model(model, self.layout)
        # all the layers in one native call where every matrix packs without padding
        self.fused = self.layout == "packed" and self.arch.fuses and self.D in (32, 64, 128) and not any(
            w[n].padded for w in self.layers for n in ("wqkv_k", "wo_k", "w13_k", "w2_k"))
        # a trimmed-vocabulary head (speclab.models.adapter.SubsetHead) scores only head_ids
        self.head_ids = getattr(model.lm_head, "head_ids", None)
        self.vocab_size = cfg.vocab_size
        self.embed, self.norm = inner.embed_tokens.weight, norm_weight(inner.norm.weight, self.arch.norm_offset)
        # Gemma's embedding scale, the model's own buffer cast to the model dtype as its embedding
        # module casts it (sqrt(3072) = 55.43 becomes 55.5 in bf16)
        self.embed_scale = None if not self.arch.embed_scale else getattr(
            inner.embed_tokens, "embed_scale", torch.tensor(cfg.hidden_size ** 0.5)).to(self.device, self.dtype)
        self.act = ACTIVATIONS[self.arch.act]             # the MLP's gate activation
        # + room for draft-tree nodes verified past the last committed position
        self.max_len = max_len or cfg.max_position_embeddings + VERIFY_ROOM
        self.cos, self.sin = (t.to(self.dtype) for t in rope_tables(model, self.max_len, self.D))
        L = len(self.layers)
        # (layers, 2, Hkv, S, D): written in place, never reallocated; slots are read only after a write
        self.kv = torch.empty(L, 2, self.Hkv, self.max_len, self.D, device=self.device, dtype=self.dtype)
        self.n = 0
        self.forwards = 0
        # exact: every query row is computed exactly as a one-token forward computes it (its own
        # products and attention: _exact_rows), so a verify gives each position the logits `ar`
        # gives it, bit for bit, whatever the BLAS does with several rows
        self.exact = exact
        self.capture_layers: tuple[int, ...] = ()
        self.skip: SkipSet | None = None         # sublayers every forward leaves out (Unified Layer Skipping)
        # a one-token forward asks it, layer by layer, whether to run the MLP (FFN-SkipLLM): see MlpGate
        self.mlp_gate: MlpGate | None = None
        self._spans: dict[tuple[int, int], tuple] = {}      # (first, stop) layer -> the fused call's weights
        self.captured: dict[int, torch.Tensor] = {}
        # the thread count, chosen from the load (SPECLAB_THREADS; kernels.TeamSize): on the kernel, and
        # for torch's ops on a CPU too, where two threads beside a busy core run 2x to 30x slower than
        # one (OpenMP's threads spin at every op's barrier: docs/performance.md, Busy machine). Not for
        # the exact backend, whose rows must not depend on the thread count
        self.team = kernels.TeamSize() if self.fused or (self.device.type == "cpu" and not exact) else None

    @property
    def length(self) -> int:
        return self.n

    def reset(self):
        self.n = 0

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """LlamaRMSNorm of rows x (..., C) with weight w (C,), in this model's dtype; GemmaRMSNorm
        where the arch sets norm_offset (w then holds 1 + weight in fp32, lean.weights.norm_weight)."""
        if self.fused:
            return kernels.module().rms_norm(x.contiguous(), w, self.eps)
        if x.dtype == torch.float32:                # one fused op (same math as LlamaRMSNorm in fp32)
            return F.rms_norm(x, w.shape, w, self.eps)
        x32 = x.float()
        n = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.arch.norm_offset:                   # Gemma: the product in fp32, then the cast
            return (n * w).to(x.dtype)
        return w * n.to(x.dtype)                    # Llama: the cast, then the product

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (T, C) of ids (T,), scaled where the arch sets embed_scale (Gemma)."""
        x = F.embedding(ids, self.embed)
        return x if self.embed_scale is None else x * self.embed_scale

    def qk_heads(self, qkv: torch.Tensor, w: dict) -> torch.Tensor:
        """The q and k heads (T, Hq + Hkv, D) of a layer's fused projection qkv (T, (Hq + 2 Hkv) D),
        each RMS-normed over its D where the layer has q / k norms (Qwen3, as its q_norm / k_norm
        compute it), ready for RoPE."""
        Hq, Hkv, D = self.Hq, self.Hkv, self.D
        qk = qkv[:, : (Hq + Hkv) * D].view(qkv.shape[0], Hq + Hkv, D)
        if "q_norm" not in w:
            return qk
        norm = torch.cat([w["q_norm"].expand(Hq, D), w["k_norm"].expand(Hkv, D)])    # (Hq + Hkv, D)
        x32 = qk.float()
        return norm * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(qk.dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor | None, parents: list[int] | None = None, n_prefix: int = 0,
                logits_to_keep: int = 0, n_layers: int | None = None,
                embeds: torch.Tensor | None = None, subset: bool = False, skip: SkipSet | None = None) -> torch.Tensor:
        """Logits (T, V) for ids (T,) after the first `self.n` cached tokens, or of the last
        logits_to_keep rows only (see CausalLM.forward).
        n_layers < all: an early exit through the shared final norm and head. embeds (T, C): the
        input vectors instead of ids' embeddings (an EAGLE head's fused feature + token input).
        subset: a trimmed-vocabulary head's logits (T, N) over its own `head_ids`, not spread to V.
        skip: the sublayers to leave out (None: `self.skip`, usually none)."""
        T, past = (ids if embeds is None else embeds).shape[0], self.n
        if past + T > self.max_len:
            raise ValueError(f"sequence of {past + T} tokens exceeds the context window of {self.max_len}")
        self._check_window(past + T)
        mask, vis = None, None
        if parents is not None and not is_chain(parents):
            depth, vis = tree_depths_and_visibility(parents, n_prefix, past)
            pos = past + tree_positions(depth, n_prefix).to(self.device)
            mask = vis.to(self.device)                                        # (T, past+T) bool
        else:
            pos = slice(past, past + T)                       # a chain: causal (the mask built where needed)
        skip = self.skip if skip is None else skip
        kind = (T, n_layers, subset, logits_to_keep if isinstance(logits_to_keep, int) else -len(logits_to_keep),
                skip or None)
        with kernels.on_team(self.team, kind, T):
            return self._run(ids, embeds, pos, past, n_prefix, mask, vis, logits_to_keep, n_layers, subset, skip)

    @torch.inference_mode()
    def forward_rows(self, ids: torch.Tensor, pos: torch.Tensor, vis: torch.Tensor,
                     score: torch.Tensor | None = None, skip: SkipSet | None = None) -> torch.Tensor:
        """Logits (T, V) for rows ids (T,) at positions pos (T,), row r attending to the slots
        vis[r] (T, n + T) bool of the cache's first n slots and these rows (which take slots
        n..n+T-1). Several sequences share one slot space this way (speclab.models.lean.batch).
        score: the rows (LongTensor) whose logits are wanted, (len(score), V) in that order.
        skip: as in forward."""
        T, past = ids.shape[0], self.n
        if past + T > self.max_len:
            raise ValueError(f"{past + T} cache slots exceed the cache of {self.max_len}")
        if self.arch.sliding_window is not None and T:
            self._check_window(int(pos.max()) + 1)
        vis = vis.to(self.device)
        skip = self.skip if skip is None else skip
        with kernels.on_team(self.team, ("rows", T, None if score is None else len(score), skip or None), T):
            return self._run(ids, None, pos.to(self.device), past, 0, vis, vis, 0 if score is None else score, None,
                             skip=skip)

    def _check_window(self, reach: int):
        """A sliding window (Mistral) changes nothing while every position is inside it; past it
        this forward, which attends to every earlier position, would differ."""
        w = self.arch.sliding_window
        if w is not None and reach > w:
            raise ValueError(f"position {reach} is past {self.config.model_type}'s sliding window of {w}, which the "
                             f"lean forward does not apply: use backend='hf' for requests longer than the window")

    def _run(self, ids, embeds, pos, past: int, n_prefix: int, mask, vis, logits_to_keep, n_layers,
             subset: bool = False, skip: SkipSet | None = None) -> torch.Tensor:
        """logits_to_keep: an int (the last rows; 0 = all) or a LongTensor of the rows to score."""
        T = (ids if embeds is None else embeds).shape[0]
        x = self.embed_ids(ids) if embeds is None else embeds.to(self.dtype)  # (T, C)
        use = self.layers[: n_layers or len(self.layers)]
        self.captured = {}
        if skip:
            skip.check(len(self.layers))
        gate = self.mlp_gate if T == 1 else None        # a prompt's rows and a verify's run every MLP
        if self.fused and not (skip and skip.partial) and gate is None:     # the kernel runs whole layers only
            x = self._fused_layers(x, use, pos, past, vis, skip.whole if skip else frozenset())
        elif self.fused and not skip and gate is not None and not self.capture_layers:
            x = self._gated_layers(x, use, pos, past, vis, gate)
        else:
            x = self._layers(x, use, pos, past, n_prefix, mask, vis, skip, gate)
        if isinstance(logits_to_keep, torch.Tensor):    # the head only where logits are read: a
            x = x[logits_to_keep.to(x.device)]          # prompt's rows are not (1,200 of them cost
        elif logits_to_keep:                            # a quarter of the prefill)
            x = x[-logits_to_keep:]
        self.n = past + T
        self.forwards += 1
        return self.final_norm_head(x, subset).float()

    def _fused_layers(self, x, use, pos, past: int, vis, skip: frozenset = frozenset()) -> torch.Tensor:
        """The layers as native calls (speclab.models.kernels): bf16 on a CPU with AVX512-BF16.
        Every row is computed as a one-token forward would compute it (see bf16_linear.cpp), so
        this path is exact without the exact backend's row-by-row cost. skip: whole layers left out."""
        pos = torch.arange(past, past + x.shape[0]) if isinstance(pos, slice) else pos.cpu()
        vis = torch.empty(0, dtype=torch.bool) if vis is None else vis.contiguous()

        def put(layer: int, h: torch.Tensor):
            self.captured[layer] = h[None]
        return self._native_layers(x, len(use), pos, past, vis, self.capture_layers, put, skip)

    def _gated_layers(self, x, use, pos, past: int, vis, gate: "MlpGate") -> torch.Tensor:
        """One row through the layers on the kernel: the layers the gate leaves alone now
        (gate.asks(i) False) as spans of native calls, each layer it asks about as torch ops (the
        kernel has no call for a layer's attention alone). A span's layers change nothing the gate
        reads, so asking before running the span before it is asking after."""
        pos_n = torch.arange(past, past + x.shape[0]) if isinstance(pos, slice) else pos.cpu()
        vis_n = torch.empty(0, dtype=torch.bool) if vis is None else vis.contiguous()
        start, n = 0, len(use)
        for i in range(n + 1):
            if i < n and not gate.asks(i):
                continue
            if start < i:           # layers start..i-1 as one span; those before start ran already: passed by
                x = self._native_layers(x, i, pos_n, past, vis_n, (), None, frozenset(range(start)))
            if i < n:
                x = self._layers(x, use, pos, past, 0, None, vis, None, gate, only=i)
            start = i + 1
        return x

    def _native_layers(self, x, n: int, pos, past: int, vis, caps, put, skip: frozenset = frozenset()) -> torch.Tensor:
        """The first n layers as native calls, one a run of layers up to each layer in caps, whose
        state after it goes to put(layer, state). A layer in `skip` is a span of its own, not run:
        the kernel writes the cache of the layers it runs only (its l0 is the span's first)."""
        start = 0
        cuts = {b for s in skip for b in (s, s + 1) if 0 < b <= n}
        for stop in sorted({c for c in caps if 0 < c < n} | {n} | cuts):
            if start in skip:                               # [start, start + 1): passed by
                if stop in caps:
                    put(stop, x)
                start = stop
                continue
            if (start, stop) not in self._spans:            # the weights' lists, built once per span
                ws = self.layers[start:stop]
                self._spans[start, stop] = ([w["ln1"] for w in ws], [w["wqkv_k"].data for w in ws],
                                            [w["wo_k"].data for w in ws], [w["ln2"] for w in ws],
                                            [w["w13_k"].data for w in ws], [w["w2_k"].data for w in ws])
            x = kernels.module().layers(x.contiguous(), *self._spans[start, stop], self.kv, start, self.cos,
                                        self.sin, pos, past, vis, self.Hq, self.Hkv, self.eps)
            if stop in caps:
                put(stop, x)
            start = stop
        return x

    def _layers(self, x, use, pos, past: int, n_prefix: int, mask, vis, skip: SkipSet | None = None,
                gate: "MlpGate | None" = None, only: int | None = None) -> torch.Tensor:
        """The layers as torch ops (any device and dtype), less the sublayers in `skip`, and less
        the MLPs `gate` declines (one row: its choice for layer i may read the MLPs before i);
        only: that layer alone (_gated_layers)."""
        T = x.shape[0]
        if mask is None and T > 1:                             # a chain of T rows after `past`
            mask = torch.ones(T, past + T, dtype=torch.bool, device=self.device).tril(past)
        rows = self._exact_rows(T, past, n_prefix, vis) if self.exact and T > 1 else None
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]              # (T, 1, D)
        Hq, Hkv, D = self.Hq, self.Hkv, self.D
        if rows is None:
            lin = mm
        else:           # each row group's own product: a batched product's rows can round differently
            def lin(h, w, name):
                return torch.cat([mm(h[r0:r0 + n], w, name) for r0, n, _ in rows])
        skip_attn, skip_mlp = (skip.attn, skip.mlp) if skip else ((), ())
        for i, w in enumerate(use):
            if only is not None and i != only:
                continue
            if i not in skip_attn:
                h = self.rms(x, w["ln1"])
                qkv = lin(h, w, "wqkv")                                     # (T, (Hq + 2 Hkv) D)
                qk = _rope(self.qk_heads(qkv, w), cos, sin).transpose(0, 1)
                q, k = qk[:Hq], qk[Hq:]                                       # (Hq, T, D), (Hkv, T, D)
                v = qkv[:, (Hq + Hkv) * D:]
                self.kv[i, 0, :, past:past + T] = k
                self.kv[i, 1, :, past:past + T] = v.view(T, Hkv, D).transpose(0, 1)
                K, V = self.kv[i, 0, :, : past + T], self.kv[i, 1, :, : past + T]  # (Hkv, S, D)
                if rows is None:
                    a = self._attend(q, K, V, mask)                           # (Hq, T, D)
                else:
                    a = self._attend_rows(q, i, rows)
                x = x + lin(a.transpose(0, 1).reshape(T, Hq * D), w, "wo")
            if i not in skip_mlp and (gate is None or gate.run(i)):
                h = self.rms(x, w["ln2"])
                g, u = lin(h, w, "w13").chunk(2, -1)
                x_in, x = x, x + lin(self.act(g) * u, w, "w2")
                if gate is not None:
                    gate.ran(i, x_in, x)
            if i + 1 in self.capture_layers:
                self.captured[i + 1] = x[None]
        return x

    def _exact_rows(self, T: int, past: int, n_prefix: int, vis) -> list:
        """How each query row of an exact forward attends, as `ar` would compute that row.

        `ar` runs the prompt as one causal forward, then one token per forward. So: the prompt rows
        of a first forward (past = 0) as one causal block over exactly those rows, like ar's prefill;
        every other row alone, over its visible keys (a chain row: the cache up to itself, a slice
        as in ar; a tree node: its ancestors, gathered into the order ar would have them in).
        Returns [(first_row, n_rows, keys)], keys an int S or a LongTensor of cache slots."""
        out, start = [], 0
        if past == 0 and vis is None and n_prefix == 0:     # a plain prefill: ar's own first forward
            n_prefix = T
        if past == 0 and n_prefix > 1:
            out.append((0, n_prefix, n_prefix))
            start = n_prefix
        for r in range(start, T):
            if vis is None:
                out.append((r, 1, past + r + 1))
            else:
                idx = vis[r].nonzero()[:, 0]
                contiguous = idx[-1].item() == len(idx) - 1
                out.append((r, 1, len(idx) if contiguous else idx.to(self.device)))
        return out

    def _attend_rows(self, q, layer: int, rows) -> torch.Tensor:
        """Attention (Hq, T, D) of q (Hq, T, D) computed row group by row group (see _exact_rows)."""
        outs = []
        for r0, n, keys in rows:
            if isinstance(keys, int):
                K, V = self.kv[layer, 0, :, :keys], self.kv[layer, 1, :, :keys]
            else:
                K, V = self.kv[layer, 0][:, keys], self.kv[layer, 1][:, keys]
            m = None
            if n > 1:
                m = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            outs.append(self._attend(q[:, r0:r0 + n], K, V, m))
        return torch.cat(outs, 1)

    def _attend(self, q, K, V, mask):
        """Attention (Hq, T, D) of q (Hq, T, D) over K, V (Hkv, S, D); mask (T, S) bool or None.

        Up to MATMUL_ROWS query rows: two fp32 matmuls and a softmax, several times faster than
        scaled_dot_product_attention for a few rows (its flash kernel is built for many:
        docs/performance.md) and just as accurate (fp32 scores and sums). More rows (a long
        prompt's prefill): SDPA."""
        Hq, T, D = q.shape
        if T > MATMUL_ROWS:
            return F.scaled_dot_product_attention(q[None], K[None], V[None], attn_mask=mask,
                                                  enable_gqa=Hq != self.Hkv)[0]
        g = Hq // self.Hkv                            # query heads per key/value head, adjacent
        s = q.float().reshape(self.Hkv, g * T, D) @ K.float().transpose(1, 2) * D ** -0.5   # (Hkv, gT, S)
        if mask is not None:
            s = s.view(self.Hkv, g, T, -1).masked_fill(~mask, float("-inf")).view(self.Hkv, g * T, -1)
        return (s.softmax(-1) @ V.float()).view(Hq, T, D).to(q.dtype)

    def resize(self, max_len: int):
        """A cache of max_len slots, the first self.n kept (a batch's shared slot space grows)."""
        kv = torch.empty(*self.kv.shape[:3], max_len, self.D, device=self.device, dtype=self.dtype)
        kv[:, :, :, : self.n] = self.kv[:, :, :, : self.n]
        self.kv, self.max_len = kv, max_len
        self.cos, self.sin = (t.to(self.dtype) for t in rope_tables(self.model, max_len, self.D))

    def keep(self, n: int):
        if n > self.n:
            raise ValueError(f"cannot keep {n} tokens: the cache holds {self.n}")
        self.n = n                      # later writes overwrite the rest: nothing to copy

    def keep_positions(self, start: int, idx: list[int]):
        if idx != list(range(len(idx))):
            src = torch.tensor([start + i for i in idx], device=self.device)
            self.kv[:, :, :, start:start + len(idx)] = self.kv[:, :, :, src]
        self.n = start + len(idx)

    def drop_layers_tail(self, n_layers: int, drop: int):
        self.n -= drop                  # early-exit drafts wrote slots the verify overwrites

    def exit_lm(self, n_layers: int):
        return ExitLM(self, n_layers)

    def skip_lm(self, skip: SkipSet):
        """Every layer less the sublayers in `skip`, sharing this cache (SWIFT's draft)."""
        return SkipLM(self, skip.check(len(self.layers)))

    def trim_head(self, n: int):
        """Score only the first n of a trimmed head's ids (ranked most frequent first): a smaller
        draft vocabulary, the head's matmul cheaper in proportion, its rarer tokens never drafted."""
        ids = self.head_ids
        if ids is None or not isinstance(n, int) or not 64 <= n <= len(ids):
            have = "a full-vocabulary head" if ids is None else f"a head of {len(ids)} ids"
            raise ValueError(f"vocab must be an integer in 64..{0 if ids is None else len(ids)} "
                             f"(the draft has {have}), got {n!r}")
        self.head_ids = ids[:n]
        self.head = fuse(self.layout, head=(self.model.lm_head.weight[:n],))

    def final_norm_head(self, h: torch.Tensor, subset: bool = False) -> torch.Tensor:
        h = self.rms(h, self.norm)
        if self.exact and self.layout != "packed" and h.shape[0] > 1:   # row by row, as _layers
            logits = torch.cat([mm(h[r:r + 1], self.head, "head") for r in range(h.shape[0])])
        else:
            logits = mm(h, self.head, "head")                           # (T, V) or (T, N)
        if self.head_ids is None or subset:
            return logits
        return scatter_subset(logits, self.head_ids, self.vocab_size)


MATMUL_ROWS = 64              # attention rows computed with plain matmuls (see LeanLM._attend)


def _rope(x, cos, sin_signed):
    """x (T, H, D) rotated by its positions' cos / signed sin (T, 1, D)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed
