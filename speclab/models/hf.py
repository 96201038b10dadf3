"""The transformers adapter: any Hugging Face causal LM, forwarding new tokens against its KV cache,
verifying a draft tree in one forward and keeping only the committed tokens afterwards; and its batch
form (B sequences in one transformers cache). Every architecture runs here, at transformers' speed;
models.backends picks the lean forward instead where it supports the model.

Cache convention used by every engine: the cache holds the committed tokens except the ones still
`pending` (the last emitted token, or the whole prompt before the first forward).

Pinned transformers behaviour (tests/test_causal.py): `DynamicCache.crop` takes a NEGATIVE count of
tokens to drop (5.x refuses a positive length), and a 4-D float mask (0 / -inf) with explicit
`position_ids` gives every tree node the logits it would get if its path ran alone.
"""
from __future__ import annotations

import copy
import functools
import inspect

import torch

from speclab.models.geometry import COMPACT_AT, BatchSlots, is_chain, row_layout, tree_attention, tree_positions


def cache_kw(module, cache) -> dict:
    """The keyword a transformers forward takes its KV cache by: `cache` since 5.24 (which warns on
    `past_key_values`, a name 5.40 drops), `past_key_values` before."""
    return {_cache_name(type(module)): cache}


@functools.lru_cache(maxsize=None)
def _cache_name(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


SKIP_REFUSED = ("skipping layers (swift, unified-layer-skip, ffn-skip, first) runs on speclab's lean forward only, not on "
                "transformers' (backend='hf'): use backend='auto', 'fast' or 'exact' with a model the lean "
                "forward runs")


class CausalLM:
    """A causal LM with its own KV cache. `forwards` counts the model calls actually made."""

    def __init__(self, model, name: str = "", cache=None):
        self.model = model.eval()
        self.name = name
        self.device = next(model.parameters()).device
        self.cache = cache
        self.forwards = 0
        self.captured: dict[int, torch.Tensor] = {}
        self._hooks = []

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return tuple(self._capture)  if self._hooks else ()

    @capture_layers.setter
    def capture_layers(self, layers):
        """Keep the hidden state (1, T, C) after these decoder layers (1-based) of each forward."""
        for h in self._hooks:
            h.remove()
        self._hooks, self._capture = [], tuple(layers)
        for l in self._capture:
            def hook(_m, _i, out, l=l):
                if self._capturing:
                    self.captured[l] = out[0] if isinstance(out, tuple) else out
            self._hooks.append(self.model.model.layers[l - 1].register_forward_hook(hook))

    _capturing = False

    def exit_lm(self, n_layers: int) -> "CausalLM":
        """The first n_layers through the shared head, writing into THIS cache (LayerSkip)."""
        if not hasattr(self, "_views"):
            self._views = {}
        if n_layers not in self._views:
            self._views[n_layers] = early_exit_view(self.model, n_layers)
        return CausalLM(self._views[n_layers], f"exit{n_layers}", cache=self.cache)

    def final_norm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(h))

    @property
    def skip(self):
        return None

    @skip.setter
    def skip(self, skip):
        if skip:
            raise ValueError(SKIP_REFUSED)

    @property
    def mlp_gate(self):
        return None

    @mlp_gate.setter
    def mlp_gate(self, gate):
        if gate is not None:
            raise ValueError(SKIP_REFUSED)

    def skip_lm(self, skip):
        """Refused: transformers' decoder runs every layer it holds, and a view without some of
        them would leave their cache layers behind the others' (skipping sublayers runs on
        speclab's lean forward)."""
        raise ValueError(SKIP_REFUSED)

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    @property
    def config(self):
        return self.model.config

    def reset(self):
        from transformers import DynamicCache
        self.cache = DynamicCache(config=self.model.config)
        # A sliding-window layer drops the keys that leave its window at every update unless it
        # records them until a crop: a rejected draft rolls the cache back into that past.
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()

    def _window(self) -> int | None:
        """The narrowest sliding window among the cache's layers (None: no layer slides)."""
        return min((l.sliding_window for l in self.cache.layers if getattr(l, "sliding_window", None)), default=None)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, parents: list[int] | None = None, n_prefix: int = 0,
                logits_to_keep: int = 0) -> torch.Tensor:
        """Run `ids` (T,) after the cached tokens; returns logits (T, V), or those of the last
        logits_to_keep rows (transformers' convention: 0 keeps all).

        With `parents` (one per token after the first `n_prefix`, -1 = child of the last prefix
        token), the tokens form a tree: each sees the cache, the prefix and its own ancestors, at
        position = length of its path. Without `parents`, the usual causal chain.
        """
        if self.cache is None:
            self.reset()
        past, T = self.length, ids.shape[0]
        kw = {}
        if parents is not None and not is_chain(parents):
            window = self._window()
            if window is not None and past + T > window:
                raise ValueError(f"a draft tree on {self.model.config.model_type} reaches position {past + T}, past its "
                                 f"sliding window of {window}: use a chain method (draft-model, prompt-lookup, "
                                 f"eagle-chain) or fewer tokens")
            depth, mask = tree_attention(parents, n_prefix, past, self.device)
            kw["attention_mask"] = mask
            pos = past + tree_positions(depth, n_prefix).to(self.device)
        else:
            pos = torch.arange(past, past + T, device=self.device)
        self.captured, self._capturing = {}, True
        try:
            out = self.model(input_ids=ids.view(1, T), position_ids=pos.view(1, T), use_cache=True,
                             logits_to_keep=logits_to_keep, **cache_kw(self.model, self.cache), **kw)
        finally:
            self._capturing = False
        self.forwards += 1
        return out.logits[0].float()

    def keep(self, n: int):
        """Keep the first n cached tokens (a prefix)."""
        drop = self.length - n
        if drop < 0:
            raise ValueError(f"cannot keep {n} tokens: the cache holds {self.length}")
        if drop:
            self.cache.crop(-drop)  # 5.x: negative = number of tokens to drop
        for layer in self.cache.layers:   # recorded keys past a window: only the window's stay
            if getattr(layer, "record_past", False) and layer.get_seq_length() >= layer.sliding_window:
                layer.crop(0)

    def keep_positions(self, start: int, idx: list[int]):
        """Keep cache[:start] followed by the tree slots `idx` (relative to start), in order."""
        if idx == list(range(len(idx))):
            return self.keep(start + len(idx))
        sel = torch.tensor(list(range(start)) + [start + i for i in idx], device=self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, sel)
            layer.values = layer.values.index_select(-2, sel)
            if hasattr(layer, "cumulative_length"):     # a sliding-window layer counts its tokens itself
                layer.cumulative_length = len(sel)

    def drop_layers_tail(self, n_layers: int, drop: int):
        """Drop the last `drop` tokens from the first n_layers only (early-exit drafts wrote them)."""
        for layer in self.cache.layers[:n_layers]:
            if drop:
                layer.crop(-drop)


def early_exit_view(model, n_layers: int):
    """A causal LM that runs only the first n_layers of `model`, then its final norm and head.

    Shares every weight with `model` (no copy). Works for decoder-only models laid out as
    `model.model.layers / .norm / .embed_tokens` with an `lm_head` (Llama, Mistral, Qwen2, ...).
    """
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, a) for a in ("layers", "norm", "embed_tokens")) or not hasattr(model, "lm_head"):
        raise ValueError(
            f"layer-skip needs a Llama-style decoder (model.model.layers, .norm, lm_head); "
            f"{type(model).__name__} is not supported: use method 'draft-model' or a model-free drafter")
    total = len(inner.layers)
    if not 1 <= n_layers < total:
        raise ValueError(f"exit layer must be in 1..{total - 1} for this {total}-layer model, got {n_layers}")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:n_layers]
    with torch.device("meta"):
        view = type(model)(cfg)
    view.model.embed_tokens = inner.embed_tokens
    view.model.layers = torch.nn.ModuleList(list(inner.layers[:n_layers]))
    view.model.norm = inner.norm
    view.model.rotary_emb = inner.rotary_emb
    view.lm_head = model.lm_head
    return view.eval()


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


class BatchCausalLM(BatchSlots):
    """B sequences in one KV cache of a Hugging Face causal LM: one forward verifies every row.

    Every forward appends the same T slots to every row (T = the longest row's input; shorter rows
    are padded). Row b's committed tokens are the cache slots `slots[b]`, in order; every other slot
    (padding, rejected draft nodes) stays in the cache but is hidden by the 4-D mask, so rows never
    need equal lengths, and a row's positions are its own committed length. `compact()` gathers
    each row's slots to the front once the hidden ones pile up; `retain(rows)` lets rows leave.
    """

    def __init__(self, model, rows: int, name: str = "target"):
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
        super().__init__(model, rows, name)
        self.cache = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in self.cache.layers):
            raise ValueError(f"batch decoding needs full attention in every layer; {type(model).__name__} has "
                             "sliding-window or other cache layers: decode its prompts one at a time")

    @property
    def width(self) -> int:
        """Slots per row in the cache, kept or hidden."""
        return self.cache.get_seq_length()

    def crowded(self) -> bool:
        """Hidden slots (padding, rejected drafts) outgrow the longest row's committed ones."""
        return self.width > COMPACT_AT * max(map(len, self.slots)) + 64

    @torch.inference_mode()
    def forward(self, rows: list[tuple[list[int], list[int] | None, int]],
                logits_to_keep: list[int] | None = None) -> torch.Tensor:
        """rows[b] = (ids, parents, n_prefix) as in CausalLM.forward, one per cache row, each after
        that row's committed tokens. Returns logits (B, T', V): row b's first k_b are the logits after
        its last k_b inputs, k_b = logits_to_keep[b] (0, or no list: all len(ids) of them)."""
        B, S = len(rows), self.width
        lens = [len(ids) for ids, _, _ in rows]
        T = max(lens)
        ks = [k or n for k, n in zip(logits_to_keep or [0] * B, lens)]
        # the positions any row scores (the head on those only): row b's are n_b - k_b .. n_b - 1
        at = None if ks == lens else sorted({i for k, n in zip(ks, lens) for i in range(n - k, n)})
        inp = torch.zeros(B, T, dtype=torch.long)
        pos = torch.zeros(B, T, dtype=torch.long)
        vis = torch.zeros(B, T, S + T, dtype=torch.bool)       # True = may attend
        for b, (ids, parents, n_prefix) in enumerate(rows):
            n, past = len(ids), len(self.slots[b])
            inp[b, :n] = torch.tensor(ids, dtype=torch.long)
            vis[b, :n, self.slots[b]] = True                    # the row's committed keys only
            offset, see = row_layout(parents, n_prefix, n)
            pos[b, :n] = past + offset
            vis[b, :n, S:S + n] = see
            pad = torch.arange(n, T)
            pos[b, n:] = past
            vis[b, pad, S + pad] = True     # a padding row sees only itself: no empty softmax, no NaN
        mask = torch.zeros(B, 1, T, S + T, dtype=self.dtype).masked_fill(~vis[:, None], torch.finfo(self.dtype).min)
        out = self.model(input_ids=inp.to(self.device), position_ids=pos.to(self.device),
                         attention_mask=mask.to(self.device), use_cache=True, **cache_kw(self.model, self.cache),
                         logits_to_keep=0 if at is None else torch.tensor(at, device=self.device))
        self.first = [S] * B
        self.forwards += 1
        if at is None:                                          # every row keeps all its inputs: no copy
            return out.logits.float()
        col = {i: c for c, i in enumerate(at)}                  # position -> column of out.logits
        idx = torch.tensor([[col[n - k + j] if j < k else 0 for j in range(max(ks))]
                            for k, n in zip(ks, lens)], device=self.device)   # (B, T')
        return out.logits.gather(1, idx[..., None].expand(-1, -1, out.logits.shape[-1])).float()

    def compact(self):
        """Gather each row's committed slots to the front; the rest of the cache is dropped."""
        L = max(len(s) for s in self.slots)
        idx = torch.zeros(len(self.slots), L, dtype=torch.long)
        for b, s in enumerate(self.slots):
            idx[b, :len(s)] = torch.tensor(s, dtype=torch.long)         # padding: slot 0, hidden
        for layer in self.cache.layers:
            g = idx.to(layer.keys.device)[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, g), layer.values.gather(2, g)
        self.slots = [list(range(len(s))) for s in self.slots]

    def retain(self, rows: list[int]):
        """Keep only these rows (finished sequences leave the batch)."""
        sel = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys.index_select(0, sel), layer.values.index_select(0, sel)
        super().retain(rows)
