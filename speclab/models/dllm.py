"""Masked-diffusion LMs: a Llama-architecture network run WITHOUT the causal mask.

A checkpoint is a diffusion LM when its config says `speclab_engine: "diffusion"`; it then also
names its `mask_token_id` and whether it is AR-adapted (`speclab_shift`: the prediction for
position i is read from the output at i-1, as Dream and Fast-dLLM v2 do for models initialised
from a causal LM; LLaDA-style models trained from scratch do not shift). The weights load with
`AutoModelForCausalLM.from_pretrained` like any Llama; only the attention mask differs.
"""
from __future__ import annotations

import torch

from speclab.models.backends import make_rows_lm
from speclab.models.geometry import additive, block_of, block_visible
from speclab.models.hf import cache_kw


def is_dllm(model) -> bool:
    """A speclab masked-diffusion checkpoint, or transformers' DiffusionGemma (a noise canvas)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "speclab_engine", None) == "diffusion" or getattr(cfg, "model_type", None) == "diffusion_gemma"


def mark_dllm(config, mask_token_id: int, shift: bool):
    """Turn a causal-LM config into a diffusion-LM config (what training saves)."""
    config.speclab_engine = "diffusion"
    config.mask_token_id = int(mask_token_id)
    config.speclab_shift = bool(shift)
    return config


def bidirectional_logits(model, x: torch.Tensor) -> torch.Tensor:
    """x: (B, L) token ids -> (B, L, V) logits, every position attending to every position.

    A 4-D additive mask of zeros replaces transformers' causal mask, so the first position's logits
    depend on the last token.
    """
    B, L = x.shape
    mask = torch.zeros(B, 1, L, L, device=x.device, dtype=next(model.parameters()).dtype)
    logits = model(input_ids=x, attention_mask=mask, use_cache=False).logits
    if getattr(model.config, "speclab_shift", False):
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)   # output i-1 predicts token i
    return logits


class Denoiser:
    """One diffusion LM, counted: `logits(x)` is one forward (one NFE) over the whole canvas."""
    block_causal = False

    def __init__(self, model):
        if not is_dllm(model) or getattr(model.config, "model_type", None) == "diffusion_gemma":
            name = getattr(model, "name_or_path", type(model).__name__)
            raise ValueError(f"{name} is not a masked-diffusion LM (its config has no speclab_engine='diffusion'): "
                             "dllm-* methods need a diffusion model such as code-dllm or digits-dllm; "
                             "for a causal LM use ar, draft-model, prompt-lookup, ...")
        self.model = model
        self.mask_id = int(model.config.mask_token_id)
        self.forwards = 0

    def start(self, prompt_len: int, block_length: int):
        """A new decode (the whole-canvas denoiser keeps no state between steps)."""

    @torch.inference_mode()
    def logits_batch(self, xs: torch.Tensor) -> torch.Tensor:
        """xs: (K, L) canvases -> (K, L, V): ONE network call (FreeDave verifies K drafts at once)."""
        self.forwards += 1
        return bidirectional_logits(self.model, xs).float()

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: (L,) canvas ids -> (L, V) float32 logits."""
        self.forwards += 1
        return bidirectional_logits(self.model, x[None])[0].float()


# ----------------------------------------------------------------------------------------------
# Block diffusion (Fast-dLLM v2, BD3-LM): causal across blocks, bidirectional inside the block
# being denoised (masks: models.geometry.block_visible). A config with `speclab_block_causal: true`
# names its trained `speclab_block_length`.

def is_block_causal(model) -> bool:
    return bool(getattr(getattr(model, "config", None), "speclab_block_causal", False))


class BlockDenoiser(Denoiser):
    """A block-diffusion LM with block-level KV caching: committed text (the prompt, finished
    blocks) is run once, causally, and cached; each step runs only the active block's canvas on
    top of the cache, and its keys / values are dropped again afterwards.

    AR-adapted (shifted): the canvas output at slot s predicts slot s+1; slot 0 is predicted by
    the last committed token, whose output depends only on the cache, so it is computed once per
    block (in the step that caches the previous block) and kept. `logits` keeps the contract of
    Denoiser.logits, (P+G, V) rows for the whole canvas: rows of earlier blocks repeat their last
    prediction, rows of later blocks are zero (never read: the engine works on the active block).

    Fast-dLLM v2's sub-block cache (dllm-fastv2) adds two forwards: `refresh_block` is block_logits
    that keeps the active block's keys / values in the cache (the "block cache"), and
    `sub_block_logits` runs only a sub-block's slots on top of the prefix and that stale block
    cache. Any other forward drops the block cache first; `uncached_logits` runs with no cache.
    """
    block_causal = True

    def __init__(self, model, backend: str = "auto"):
        super().__init__(model)
        # plain Llama bases run on speclab's lean forward (its cache, arbitrary visibility per row;
        # in bf16 on an AVX512-BF16 CPU the fused kernel, whose rows do not depend on each other)
        self.lean = make_rows_lm(model, "dllm", backend)
        self.start(0, int(getattr(model.config, "speclab_block_length", 32)))

    def start(self, prompt_len: int, block_length: int):
        """A new decode: empty cache, generation starting at `prompt_len`, blocks of `block_length`."""
        from transformers import DynamicCache
        self.P, self.B = prompt_len, block_length
        self.n, self.first, self.rows = 0, None, None
        self.stale = None            # (lo, (B, V) rows) while the cache also holds block lo's K/V
        if self.lean is not None:
            self.lean.reset()
        else:
            self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits_batch(x[None])[0]

    @torch.inference_mode()
    def block_logits(self, x: torch.Tensor, block: int | None = None) -> torch.Tensor:
        """x: (P+G,) -> (B, V) float32, the rows of the active block only: what the step loop reads,
        without filling (P+G, V) rows it never looks at (at a large vocabulary that fill and a
        proposal for every row would cost each step more than the rows it reads).
        block: the active block's first generation slot (default: the block of the first mask); a
        policy that edits looks again at a block it has filled."""
        return self._forward(x[None], block)[0]

    @torch.inference_mode()
    def block_rows(self, xs: torch.Tensor) -> torch.Tensor:
        """xs: (K, P+G) canvases that differ only inside the active block -> (K, B, V) float32, the
        rows of its slots only, ONE network call (FreeDave's batched verify reads nothing else)."""
        return self._forward(xs)

    @torch.inference_mode()
    def logits_batch(self, xs: torch.Tensor) -> torch.Tensor:
        """xs: (K, P+G) canvases that differ only inside the active block (the first block of
        xs[0] that still holds a mask) -> (K, P+G, V) float32, ONE network call."""
        K, T = xs.shape
        rows = self._forward(xs)                                          # (K, B, V)
        lo, B = self.n, self.B                                           # _forward moved the cache to lo
        if self.rows is None:
            self.rows = torch.zeros(T, rows.shape[-1], device=xs.device)
        out = self.rows[None].repeat(K, 1, 1)                            # (K, T, V)
        out[:, lo:lo + B] = rows
        out[:, lo + B:] = 0
        self.rows = out[0]
        return out

    def _forward(self, xs: torch.Tensor, block: int | None = None, keep_block: bool = False) -> torch.Tensor:
        """ONE network call for K canvases -> (K, B, V) float32 logits of the active block's slots
        (slot 0 from the last committed token, kept from the call that cached it). block: the
        active block's first generation slot, by default the block of the first mask. keep_block
        (K = 1): the canvas's keys / values stay in the cache after the committed tokens."""
        self.forwards += 1
        K, T = xs.shape
        P, B, dev = self.P, self.B, xs.device
        self._drop_block_cache()
        if block is None:
            masked = (xs[0, P:] == self.mask_id).nonzero()
            if not len(masked):
                raise ValueError("nothing to denoise: the canvas holds no mask")
            block = int(masked[0]) // B * B
        lo = P + block
        if lo < self.n:
            raise ValueError(f"the active block starts at {lo} but {self.n} tokens are cached: "
                             "committed tokens can not be re-masked")
        pending = xs[0, self.n:lo]                                        # committed, not yet cached
        if bool((pending == self.mask_id).any()) or bool((xs[:, :lo] != xs[0, :lo]).any()):
            raise ValueError("canvases must agree and be fully committed before the active block")
        if self.first is None and not len(pending):
            raise ValueError("block diffusion needs at least one prompt token")
        n_p = len(pending)
        ids = torch.cat([pending, xs[:, lo:lo + B].reshape(-1)])
        q_pos = torch.cat([torch.arange(self.n, lo, device=dev), torch.arange(lo, lo + B, device=dev).repeat(K)])
        q_grp = torch.cat([torch.full((n_p,), -1, device=dev), torch.arange(K, device=dev).repeat_interleave(B)])
        k_pos = torch.cat([torch.arange(self.n, device=dev), q_pos])
        k_grp = torch.cat([torch.full((self.n,), -1, device=dev), q_grp])
        vis = block_visible(q_pos, block_of(q_pos, P, B), q_grp, k_pos, block_of(k_pos, P, B), k_grp)
        if self.lean is not None:                                         # (n_p + K B, V) in one call
            logits = self.lean.forward_rows(ids, q_pos, vis)
            self.lean.keep(lo + B if keep_block else lo)                  # committed tokens (+ the block cache)
            first, canv = logits[n_p - 1] if n_p else None, logits[n_p:].view(K, B, -1)[:, :-1]
        else:
            mask = additive(vis, next(self.model.parameters()).dtype).to(dev)[None, None]
            h = self.model.model(input_ids=ids[None], attention_mask=mask, position_ids=q_pos[None], use_cache=True,
                                 **cache_kw(self.model.model, self.cache)).last_hidden_state[0]   # (n_p + K B, C)
            if not keep_block:
                self.cache.crop(-(K * B))                                 # keep only committed tokens
            head = self.model.lm_head
            first = head(h[n_p - 1]).float() if n_p else None
            canv = head(h[n_p:].view(K, B, -1)[:, :-1]).float()          # (K, B-1, V): slots 1..B-1
        self.n = lo
        if first is not None:
            self.first = first                                            # (V,): predicts slot 0
        return torch.cat([self.first.expand(K, 1, -1), canv], dim=1)     # (K, B, V)

    # -- Fast-dLLM v2's sub-block cache ("DualCache", reference note section 14) -----------------

    def _drop_block_cache(self):
        """Forget the block cache: the cache holds the committed tokens only again."""
        if self.stale is not None:
            if self.lean is not None:
                self.lean.keep(self.n)
            else:
                self.cache.crop(-self.B)                                # transformers crops by a count
            self.stale = None

    def holds_block(self, block: int) -> bool:
        """The cache holds the keys / values of the block starting at generation slot `block`."""
        return self.stale is not None and self.stale[0] == self.P + block

    @torch.inference_mode()
    def refresh_block(self, x: torch.Tensor, block: int) -> torch.Tensor:
        """block_logits(x, block), keeping the canvas's keys / values in the cache: the block cache
        that sub_block_logits reads until any other forward (or the next refresh) replaces it."""
        rows = self._forward(x[None], block, keep_block=True)[0]          # (B, V)
        self.stale = (self.n, rows.clone())
        return rows

    @torch.inference_mode()
    def sub_block_logits(self, x: torch.Tensor, block: int, a: int, b: int) -> torch.Tensor:
        """ONE network call over the sub-block's slots [a, a + b) of the block at generation slot
        `block` only, on top of the prefix cache and the block cache of the last refresh_block: the
        sub-block's own keys / values are recomputed from x, the rest of the block's are stale
        (what its slots held at the refresh). Nothing is written to the cache.
        -> (B, V) float32: rows a+1 .. a+b-1 fresh (the output at slot s predicts s+1); every other
        row as last computed. Slot a must be committed (its row needs slot a-1's output), which is
        why Fast-dLLM v2 refreshes instead when a sub-block starts on a mask."""
        P, B = self.P, self.B
        lo = P + block
        if not self.holds_block(block):
            raise ValueError(f"no block cache for the block at slot {block}: run refresh_block on it first")
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a and 1 <= b and a + b <= B):
            raise ValueError(f"the sub-block [{a}, {a} + {b}) must lie inside the block of {B} slots")
        if a and int(x[lo + a]) == self.mask_id:
            raise ValueError(f"the sub-block's first slot ({block + a}) is masked: its row needs the slot before; "
                             "refresh the block instead")
        self.forwards += 1
        dev, n_kv = x.device, lo + B                                    # the cache: prefix, then the block
        ids, q_pos = x[lo + a:lo + a + b], torch.arange(lo + a, lo + a + b, device=dev)
        vis = torch.ones(b, n_kv + b, dtype=torch.bool, device=dev)     # prefix, whole block, both ways
        vis[:, lo + a:lo + a + b] = False    # the sub-block's own K/V replace its stale ones
        if self.lean is not None:
            logits = self.lean.forward_rows(ids, q_pos, vis)
            self.lean.keep(n_kv)                                        # drop the sub-block's rows again
        else:
            mask = additive(vis, next(self.model.parameters()).dtype).to(dev)[None, None]
            h = self.model.model(input_ids=ids[None], attention_mask=mask, position_ids=q_pos[None], use_cache=True,
                                 **cache_kw(self.model.model, self.cache)).last_hidden_state[0]   # (b, C)
            self.cache.crop(-b)
            logits = self.model.lm_head(h)
        rows = self.stale[1]
        rows[a + 1:a + b] = logits[:-1].float()                         # output s predicts slot s+1
        return rows.clone()

    @torch.inference_mode()
    def uncached_logits(self, x: torch.Tensor, block: int | None = None) -> torch.Tensor:
        """block_logits with no cache at all: this forward runs the prompt, every committed block and
        the canvas again (what a decoder without a KV cache pays each step)."""
        self.start(self.P, self.B)
        return self._forward(x[None], block)[0]


def make_denoiser(model) -> Denoiser:
    """The denoiser a diffusion checkpoint needs: whole-canvas or block-causal with a KV cache."""
    return BlockDenoiser(model) if is_block_causal(model) else Denoiser(model)
