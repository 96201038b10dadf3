"""The lean forward in static shapes: the runner a GPU replays as CUDA graphs.

A forward whose shapes change every call (T new rows, attention over the `past + T` cached slots)
can be neither captured nor compiled once: on a GPU it runs as a dozen eager kernel launches per
layer plus Python, and the launches, not the weights' read, set the speed. StaticLM runs the same
math (LeanLM's weights, cache and layers) with every shape fixed per bucket (gpt-fast, vLLM and
SGLang do the same):

- inputs live in persistent buffers: token ids, positions, the cache slot each row writes, each
  row's visibility over the WHOLE preallocated cache, and the rows whose logits are kept;
- a forward of T rows is padded to the next width in BUCKETS; padding row r writes slot n + r,
  past the real rows, sees only that slot, and nothing reads it (the next forward overwrites it);
- attention runs over all S slots of the cache with the visibility as its mask, never over a
  slice whose length changes per call; S is sized for the request (prompt + new tokens + the widest
  bucket) and doubles when a sequence outgrows it, never the model's context window;
- captured hidden states (capture_layers: what EAGLE, EAGLE-3 and Medusa read, and layer-skip's
  exit scoring) go to a persistent buffer `hidden` (L, widest bucket, C), written inside the step,
  so a replayed graph fills it too; `captured[l]` is a view of its first T rows, valid until the
  next forward (the drafters read their rows from it at once);
- an early exit (n_layers: the layer-skip draft) runs the first n_layers layers in the bucket too;
- on CUDA each (width, kept rows, layers run, layers captured) bucket is captured once as a
  torch.cuda.CUDAGraph and replayed; the host copies one small staging tensor in and reads the
  logits out, with no sync inside a forward. graphs="compile" captures the same graph over the step
  compiled by torch.compile (fullgraph, inductor's default mode: its fused kernels, not its own
  graphs). The plain step is ~25 small kernels a layer, so on a small model their count, not the
  weights' read, sets the speed (BENCHMARKS.md, GPU). Inductor's own "reduce-overhead" graphs
  refuse this step (the cache is a mutated input), so speclab captures.
  Under graphs a capture set widens to every layer any call of
  this runner captured (a copy per layer inside the graph costs little), so layer-skip's rotating
  exit scores do not capture a graph per combination.

Calls a bucket does not cover run on LeanLM's eager path over the same cache: a prefill or any
forward wider than the widest bucket, input vectors (embeds: an EAGLE head's own forward, which is
a one-layer LeanLM anyway), a trimmed head's own ids (subset) and a forward that skips sublayers
(a SkipSet: SWIFT's draft, Unified Layer Skipping; no graph is captured per skip set) or asks an
MLP gate (FFN-SkipLLM's choice is made inside the forward). On a CPU
the runner runs eagerly with the same buffers, buckets and padding; in bf16 on a CPU with
AVX512-BF16 its layers are the native kernel's calls over those buffers, split at each captured
layer as LeanLM splits them (every row computed as a one-token forward, so padding changes no
real row).
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from speclab.models.geometry import is_chain, tree_depths_and_visibility, tree_positions
from speclab.models.lean.forward import LeanLM, _rope
from speclab.models.lean.greedy_loop import GreedyLoop
from speclab.models.lean.weights import mm

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
GRAPH_MODES = (False, "cuda-graph", "compile", "compile-ops")
# what a runner hands on when it is dropped: its cache, buffers and captured graphs (a graph
# replays on exactly the tensors it was captured with, so they travel together)
KIT = ("kv", "cos", "sin", "max_len", "staging", "inputs", "vis", "hidden", "_graphs", "_pool")


def bucket(n: int) -> int:
    """The narrowest width in BUCKETS that holds n rows."""
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"{n} rows exceed the widest bucket ({BUCKETS[-1]})")


def capacity_for(n: int) -> int:
    """Cache slots for n: a power of two (at least 256), so RoPE tables and graphs are shared by
    requests of similar length and a growing sequence re-captures only log2 times."""
    return max(256, 1 << (max(n, 1) - 1).bit_length())


def graph_mode(graphs, device: torch.device):
    """graphs: None = "cuda-graph" on CUDA and off elsewhere; True = "cuda-graph"; False = off."""
    if graphs is None:
        graphs = device.type == "cuda"
    if graphs is True:
        graphs = "cuda-graph"
    if graphs not in GRAPH_MODES:
        raise ValueError(f"graphs must be True, False, None, 'compile' or 'compile-ops', got {graphs!r}")
    if graphs and device.type != "cuda":
        raise ValueError(f"graphs={graphs!r} needs a CUDA device, the model is on {device}: use graphs=False")
    return graphs


class StaticLM(GreedyLoop, LeanLM):
    """LeanLM's protocol (forward, forward_rows, keep, keep_positions, exit_lm) in static shapes.

    max_len: the slots the request needs (prompt + new tokens + widest draft); None starts small.
    graphs: None (CUDA graphs on CUDA, eager elsewhere), True, False, "compile" (the whole step
    compiled inside the graphs) or "compile-ops" (only the elementwise work compiled: each residual
    add fused with the norm after it, RoPE, SwiGLU; the products and attention stay the eager cuBLAS
    / SDPA calls). Why both: on an H100 the whole compiled step made the 8B shape slower (inductor
    writes the products into its own buffers and cuBLAS then picks split-K products with a separate
    reduce pass: BENCHMARKS.md, GPU), while fusing the ~25 small kernels a layer is what a launch-bound
    model needs.
    """
    host_ids = True     # ids staged through pinned memory: a caller's host ids save a copy and a sync


    def __init__(self, model, name: str = "", max_len: int | None = None, graphs=None):
        device = next(model.parameters()).device
        self.graphs = graph_mode(graphs, device)
        need = capacity_for((max_len or 0) + BUCKETS[-1])
        super().__init__(model, name, need)
        self.request = max_len              # the slots the request asked for (a draft runner sizes by it)
        self._compiled = None
        self._ops = None                    # the elementwise ops of "compile-ops" (compiled on first use)
        self._staged = None                 # CUDA event: the last staging copy has been read
        self.replays = 0                    # forwards served by a captured graph
        self.fallbacks = 0                  # forwards no bucket covered (LeanLM's eager path ran them)
        self._wide: frozenset[int] = frozenset()    # under graphs: every layer a call captured
        self._trimmed = False                       # a trimmed head's kit is never handed on
        # Runners of one model share nothing while alive; a dropped runner's cache, buffers and
        # graphs go to an idle list on the model (as its packed weights do) and the next runner of
        # the same weights and graph mode takes them: captures happen once per model, not per run.
        self._idle = model.__dict__.setdefault("_speclab_static", {}).setdefault(
            (self.graphs, id(self.layers), id(self.head)), [])
        kit = self._claim(need)
        if kit is None:
            with torch.inference_mode(False):
                self.kv.zero_()             # hidden slots enter attention as 0-weighted terms: finite
            self._alloc_buffers()
        self._kit = kit or {}
        self._save_kit()
        weakref.finalize(self, _hand_on, self._idle, self._kit)

    def _claim(self, need: int) -> dict | None:
        """Take the smallest idle kit that holds `need` slots (attention reads every slot of the
        cache, so never a larger one than needed), or None."""
        kit = min((k for k in self._idle if k["max_len"] >= need), key=lambda k: k["max_len"], default=None)
        if kit is not None:
            del self._idle[next(i for i, k in enumerate(self._idle) if k is kit)]   # by identity: == compares tensors
            for a in KIT:
                setattr(self, a, kit[a])
        return kit

    def _save_kit(self):
        self._kit.update({a: getattr(self, a) for a in KIT})

    # --- buffers -----------------------------------------------------------------------------

    def _alloc_buffers(self):
        W, S, dev = BUCKETS[-1], self.max_len, self.device
        with torch.inference_mode(False):   # buffers outlive the forward that grows them
            # rows of the staging tensor: ids, positions, slots written, rows kept (logits read)
            self.staging = torch.zeros(4, W, dtype=torch.long, pin_memory=dev.type == "cuda")
            self.inputs = torch.zeros(4, W, dtype=torch.long, device=dev)
            self.vis = torch.zeros(W, S, dtype=torch.bool, device=dev)   # True = may attend
            # the state after layer l (row l - 1) of each row of the last forward, where captured
            self.hidden = torch.zeros(len(self.layers), W, self.embed.shape[1], dtype=self.dtype, device=dev)
        self._graphs: dict[tuple, tuple] = {}       # (width, kept, layers run, captured) -> replay
        self._compiled = None
        self._pool = None
        if hasattr(self, "_kit"):
            self._save_kit()

    def resize(self, max_len: int):
        """A cache of max_len slots (a power of two), the first self.n kept; graphs re-captured."""
        old = self.n
        with torch.inference_mode(False):   # the cache outlives the forward that grows it
            super().resize(capacity_for(max_len))
            self.kv[:, :, :, old:].zero_()
        self._alloc_buffers()

    def reset(self):
        self.n = 0

    def reserve(self, max_len: int):
        """Size the cache for a request of max_len slots now, before its prefill, rather than by
        doubling as its sequence grows (each growth re-captures the graphs). An empty runner hands
        its too-small kit back to the idle list and takes one that holds the request."""
        self.request = max_len
        need = capacity_for(max_len + BUCKETS[-1])
        if need <= self.max_len:
            return
        if self.n or self._trimmed:             # a sequence in the cache, or a trimmed head's own kit
            self.resize(max_len + BUCKETS[-1])
            return
        self._idle.append(dict(self._kit))
        self._kit.clear()                       # the same dict: the finalizer hands on what it holds
        kit = self._claim(need)
        if kit is None:
            self.resize(max_len + BUCKETS[-1])  # new buffers; the one handed back keeps its own
        self._save_kit()

    def trim_head(self, n: int):
        super().trim_head(n)
        self._kit, self._trimmed = {}, True     # graphs of a trimmed head are this runner's alone
        self._alloc_buffers()

    # --- the protocol ------------------------------------------------------------------------

    def _static(self, T: int, embeds=None, subset=False, skip=None) -> bool:
        """This call fits a bucket (else LeanLM's eager path runs it, over the same cache)."""
        return (T <= BUCKETS[-1] and embeds is None and not subset and not (skip or self.skip)
                and self.mlp_gate is None)

    @torch.inference_mode()
    def forward(self, ids, parents=None, n_prefix: int = 0, logits_to_keep: int = 0, n_layers=None,
                embeds=None, subset: bool = False, skip=None) -> torch.Tensor:
        T = (ids if embeds is None else embeds).shape[0]
        if not self._static(T, embeds, subset, skip):
            self._fit(self.n + T)
            self.fallbacks += 1
            if isinstance(ids, torch.Tensor):
                ids = ids.to(self.device)       # host ids (see host_ids) for the eager path
            return super().forward(ids, parents, n_prefix, logits_to_keep, n_layers, embeds, subset, skip)
        past = self.n
        if parents is not None and not is_chain(parents):
            depth, vis = tree_depths_and_visibility(parents, n_prefix, 0)
            pos = past + tree_positions(depth, n_prefix)
        else:
            pos, vis = past + torch.arange(T), None       # a chain: the step builds its causal mask
        k = logits_to_keep or T
        return self._replay(ids, pos, torch.arange(T - k, T), own=vis, n_layers=n_layers)

    @torch.inference_mode()
    def forward_rows(self, ids, pos, vis, score=None, skip=None) -> torch.Tensor:
        T = ids.shape[0]
        if not self._static(T, skip=skip):
            self._fit(self.n + T)
            self.fallbacks += 1
            return super().forward_rows(ids.to(self.device), pos, vis, score, skip)
        return self._replay(ids, pos.cpu(), torch.arange(T) if score is None else score.cpu(), full=vis)

    def _fit(self, need: int):
        """Grow the cache (and drop the graphs) when `need` slots plus a bucket exceed it."""
        if need + BUCKETS[-1] > self.max_len:
            self.resize(need + BUCKETS[-1])

    def _replay(self, ids, pos, keep, own=None, full=None, n_layers=None) -> torch.Tensor:
        """Stage T rows (ids, positions, kept rows; visibility `own` (T, T) among themselves after
        the whole committed cache, or `full` (T, n + T) over the cache, or neither: a chain, whose
        causal mask the step builds from the slots on the device) and run their bucket through the
        first n_layers layers (None: all), capturing self.capture_layers.

        Per call the host does one pinned staging copy, the replay and the logits' copy; a chain
        (every `ar` step, every chain verify) adds no mask writes: on a GPU the host's launches
        between two replays, not the kernels, were ~10% of an 8B token (BENCHMARKS.md, GPU)."""
        T, past, K = len(ids), self.n, len(keep)
        W, Kb = bucket(T), bucket(K)
        nl = n_layers or len(self.layers)
        want = tuple(sorted({c for c in self.capture_layers if 0 < c <= nl}))   # LeanLM's rule
        self._fit(past + W)
        self._stage(ids, pos, keep, W)
        causal = full is None and own is None
        if not causal:
            v = self.vis
            v[:W].zero_()
            if full is not None:
                v[:T, :past + T] = full.to(self.device, non_blocking=True)
            else:
                v[:T, :past] = True
                v[:T, past:past + T] = own.to(self.device, non_blocking=True)
            pad = torch.arange(T, W, device=self.device)
            v[pad, past + pad] = True                          # a padding row sees only its own slot
        out = self._run_bucket(W, Kb, past, nl, want, causal)
        self.n = past + T
        self.forwards += 1
        self.captured = {c: self.hidden[c - 1, :T][None] for c in want}       # (1, T, C) views
        return out[:K].clone()

    def _stage(self, ids, pos, keep, W: int):
        """The staging copy of one forward's T rows padded to W: ids, positions, the slot each row
        writes (row r writes slot n + r), the kept rows; one pinned copy to the device."""
        T, K, past = len(ids), len(keep), self.n
        s = self.staging
        if self._staged is not None:        # the previous copy out of the pinned staging is done
            self._staged.synchronize()
        s.zero_()
        on_device = isinstance(ids, torch.Tensor) and ids.device.type != "cpu"
        if not on_device:
            s[0, :T] = ids if isinstance(ids, torch.Tensor) else torch.tensor(ids)
        s[1, :T] = pos
        s[1, T:W] = past                                       # padding rows: any valid position
        s[2, :W] = torch.arange(past, past + W)
        s[3, :K] = keep
        self.inputs.copy_(s, non_blocking=True)
        if on_device:                       # ids already on the device: copied there, no round trip
            self.inputs[0, :T].copy_(ids)
        if self.device.type == "cuda":
            self._staged = torch.cuda.Event()
            self._staged.record()

    def _run_bucket(self, W: int, Kb: int, past: int, nl: int, want: tuple, causal: bool = False) -> torch.Tensor:
        if not self.graphs:
            return self._step(W, Kb, past, nl, want, causal)
        if want:                            # one capture set for every call: see the docstring
            self._wide |= set(want)
            want = tuple(sorted(c for c in self._wide if c <= nl))
        key = (W, Kb, nl, want, causal)
        if key not in self._graphs:
            step = self._stepper()
            self._graphs[key] = self._capture(lambda: step(W, Kb, 0, nl, want, causal))
        graph, out = self._graphs[key]
        graph.replay()
        self.replays += 1
        return out

    def _stepper(self):
        """The step the graphs capture: self._step, or its torch.compile'd form (graphs="compile")."""
        if self.graphs != "compile":
            return self._step
        if self._compiled is None:
            import torch._dynamo as _dynamo
            # one compiled step per bucket (ints are specialised): room for every bucket a tree uses
            _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)
            self._compiled = torch.compile(self._step, fullgraph=True, dynamic=False)
        return self._compiled

    def _capture(self, body):
        """Capture body() once as a graph; returns (graph, body's output). The warm-up runs compute
        exactly what the replay that follows computes (same buffers), so their cache writes are the
        replay's own (graphs="compile": the first one compiles)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = body()
        self._pool = graph.pool()
        self._save_kit()
        return graph, out

    # --- the step: every shape fixed by (W, Kb, nl, caps) -------------------------------------

    def _step(self, W: int, Kb: int, past: int, nl: int | None = None, caps: tuple = (),
              causal: bool = False) -> torch.Tensor:
        """Logits (Kb, V) float32 of the kept rows of a W-row forward through the first nl layers
        (None: all), read from the buffers; the state after each layer in caps goes to `hidden`.
        causal: row r sees every slot up to its own (a chain after the cache; a padding row sees
        this call's earlier rows too, all written by it), else the staged visibility `vis`.
        `past` is used by the native kernel only (eager, CPU); the torch ops read slots from the
        buffers, so a captured step is valid for every cache length."""
        ids, pos, slot, keep = self.inputs[0, :W], self.inputs[1, :W], self.inputs[2, :W], self.inputs[3, :Kb]
        if causal:
            vis = torch.arange(self.vis.shape[1], device=slot.device)[None] <= slot[:, None]   # (W, S)
        else:
            vis = self.vis[:W]                                             # (W, S)
        nl = nl or len(self.layers)
        x = self.embed_ids(ids)                                            # (W, C)
        if self.fused:
            # the native calls split at each captured layer, as LeanLM splits them
            x = self._native_layers(x, nl, pos, past, vis[:, :past + W].contiguous(), caps,
                                    lambda layer, h: self.hidden[layer - 1, :W].copy_(h))
        elif self.graphs == "compile-ops":
            x = self._static_layers_ops(x, pos, slot, vis, nl, caps, self.ops())
        else:
            x = self._static_layers(x, pos, slot, vis, nl, caps)
        x = x.index_select(0, keep)
        return self.final_norm_head(x).float()

    def _static_layers(self, x, pos, slot, vis, nl: int | None = None, caps: tuple = ()) -> torch.Tensor:
        """LeanLM._layers over the whole cache: k, v written at `slot`, attention masked by `vis`."""
        W = x.shape[0]
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]                 # (W, 1, D)
        Hq, Hkv, D = self.Hq, self.Hkv, self.D
        for i, w in enumerate(self.layers[:nl]):
            h = self.rms(x, w["ln1"])
            qkv = mm(h, w, "wqkv")                                                # (W, (Hq + 2 Hkv) D)
            qk = _rope(self.qk_heads(qkv, w), cos, sin).transpose(0, 1)
            q, k = qk[:Hq], qk[Hq:]                                               # (Hq, W, D), (Hkv, W, D)
            v = qkv[:, (Hq + Hkv) * D:].view(W, Hkv, D).transpose(0, 1)
            self.kv[i, 0].index_copy_(1, slot, k)                                 # (Hkv, S, D)
            self.kv[i, 1].index_copy_(1, slot, v)
            a = self._attend_all(q, self.kv[i, 0], self.kv[i, 1], vis)            # (Hq, W, D)
            x = x + mm(a.transpose(0, 1).reshape(W, Hq * D), w, "wo")
            h = self.rms(x, w["ln2"])
            g, u = mm(h, w, "w13").chunk(2, -1)
            x = x + mm(self.act(g) * u, w, "w2")
            if i + 1 in caps:
                self.hidden[i, :W].copy_(x)
        return x

    # --- "compile-ops": the same layers, their elementwise work in fused ops ------------------------

    def _add_rms(self, x, o, w):
        """The residual add and the norm after it, one fused kernel when compiled."""
        y = x + o
        return y, self.rms(y, w)

    def _rope_qkv(self, qkv, w, cos, sin):
        """q, k (heads first, RoPE applied) and v (heads first) of a layer's fused projection."""
        W, Hq, Hkv, D = qkv.shape[0], self.Hq, self.Hkv, self.D
        qk = _rope(self.qk_heads(qkv, w), cos, sin).transpose(0, 1)
        return qk[:Hq], qk[Hq:], qkv[:, (Hq + Hkv) * D:].view(W, Hkv, D).transpose(0, 1)

    def _swiglu(self, gu):
        g, u = gu.chunk(2, -1)
        return self.act(g) * u

    def ops(self, compile_: bool | None = None) -> dict:
        """The elementwise ops of the "compile-ops" layers: compiled by torch.compile (fullgraph) in
        that mode, the plain methods otherwise (the same arithmetic, eagerly: how a CPU test checks
        the layers' structure)."""
        if compile_ is None:
            compile_ = self.graphs == "compile-ops"
        if self._ops is None or self._ops["compiled"] != compile_:
            fns = dict(rms=self.rms, add_rms=self._add_rms, rope_qkv=self._rope_qkv, swiglu=self._swiglu)
            if compile_:
                import torch._dynamo as _dynamo
                _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)
                fns = {k: torch.compile(f, fullgraph=True, dynamic=False) for k, f in fns.items()}
            self._ops = dict(fns, compiled=compile_)
        return self._ops

    def _static_layers_ops(self, x, pos, slot, vis, nl, caps, ops) -> torch.Tensor:
        """_static_layers with each residual add fused into the norm that follows it: the layer's
        output add and the next layer's input norm are one op (the last add stays before the final
        norm, which the head applies)."""
        W = x.shape[0]
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        Hq, D = self.Hq, self.D
        layers = self.layers[:nl]
        h = ops["rms"](x, layers[0]["ln1"]) if layers else x
        for i, w in enumerate(layers):
            q, k, v = ops["rope_qkv"](mm(h, w, "wqkv"), w, cos, sin)
            self.kv[i, 0].index_copy_(1, slot, k)
            self.kv[i, 1].index_copy_(1, slot, v)
            a = self._attend_all(q, self.kv[i, 0], self.kv[i, 1], vis)
            x, h = ops["add_rms"](x, mm(a.transpose(0, 1).reshape(W, Hq * D), w, "wo"), w["ln2"])
            o = mm(ops["swiglu"](mm(h, w, "w13")), w, "w2")
            if i + 1 < len(layers) and i + 1 not in caps:
                x, h = ops["add_rms"](x, o, layers[i + 1]["ln1"])
            else:
                x = x + o
                if i + 1 in caps:
                    self.hidden[i, :W].copy_(x)
                if i + 1 < len(layers):
                    h = ops["rms"](x, layers[i + 1]["ln1"])
        return x

    def _attend_all(self, q, K, V, vis):
        """Attention over every slot of the cache, hidden ones masked. On CUDA the fused SDPA kernel
        (a bool mask); elsewhere LeanLM's matmul attention, the CPU path's own arithmetic."""
        if q.device.type == "cuda":
            return F.scaled_dot_product_attention(q[None], K[None], V[None], attn_mask=vis,
                                                  enable_gqa=self.Hq != self.Hkv)[0]
        return self._attend(q, K, V, vis)


def _hand_on(idle: list, kit: dict):
    """A dropped runner's kit joins its model's idle list (a trimmed head's kit is empty: dropped)."""
    if kit:
        idle.append(kit)
