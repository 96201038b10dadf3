"""EAGLE-3 drafters in the layout vLLM, SGLang and vLLM's `speculators` load and write.

The draft (Li et al. 2025, as vLLM's `llama_eagle3.py` runs it) reads three of the target's hidden
states at position t (the residual stream after layers l1 < l2 < l3, `eagle_aux_hidden_state_layer_ids`;
vLLM numbers them as speclab's capture_layers do: id l = the state after l layers) and the token t+1:

    g_t   = fc([x_t^(l1); x_t^(l2); x_t^(l3)])                (3 Ct -> C, no bias, no norm before it)
    a     = [input_layernorm(e(tok_{t+1})); hidden_norm(g_t)]  (2C: the attention's input)
    r     = hidden_norm(g_t) if norm_before_residual else g_t   (the residual stream)
    h     = r + o_proj(attn(a));  h = h + mlp(post_attention_layernorm(h))
    out   = h (pre-norm, fed back as g for the next draft step),  logits = lm_head(norm(h))

lm_head scores a draft vocabulary of N ids; draft id i is target id i + d2t[i], and t2d marks those
target ids (a bool mask over the target's V). Drafting goes on autoregressively: step j+1 reads the
pre-norm output of step j in place of g, at the next position, with the draft's own KV cache.

Checkpoints:
  speculators   config.json with speculators_model_type "eagle3", transformer_layer_config (a Llama
                config of the draft layer, vocab_size = the target's), draft_vocab_size,
                target_hidden_size, norm_before_residual, eagle_aux_hidden_state_layer_ids,
                speculators_config {algorithm, proposal_methods, default_proposal_method, verifier};
                weights `layers.0.*`, `fc.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`,
                `embed_tokens.weight` optional (vLLM then shares the target's).
  SpecForge / EAGLE repository
                a Llama config with architectures ["LlamaForCausalLMEagle3"], draft_vocab_size;
                the same weights with `midlayer.*` in place of `layers.0.*`.

`export(draft, dir)` writes the speculators directory vLLM serves as is (`vllm serve VERIFIER
--speculative-config '{"model": DIR, ...}'`, or `vllm serve DIR`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

SPECULATORS_VERSION = "0.3.0"
SPECFORGE_ARCH = "LlamaForCausalLMEagle3"
# the weights every EAGLE-3 reader needs, as vLLM's llama_eagle3.py names them (layer 0 only)
LAYER_WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight")
REQUIRED = tuple(f"layers.0.{w}" for w in LAYER_WEIGHTS) + ("fc.weight", "norm.weight", "lm_head.weight")
OPTIONAL = ("embed_tokens.weight", "d2t", "t2d", "layers.0.self_attn.q_proj.bias", "layers.0.self_attn.k_proj.bias",
            "layers.0.self_attn.v_proj.bias", "layers.0.self_attn.o_proj.bias")


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """The layers vLLM (SupportsEagle3), speculators and the EAGLE repository read when a checkpoint
    names none: low, middle, high (each id the state after that many layers)."""
    return (2, n_layers // 2, n_layers - 3)


def lin(mod: nn.Linear, x: torch.Tensor, fast: dict | None, name: str) -> torch.Tensor:
    """mod(x), or its packed copy fast[name] (speclab's bf16 kernel, rows (T, K)) where there is one."""
    f = fast.get(name) if fast else None
    if f is None:
        return mod(x)
    return f(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


class RMSNorm(nn.Module):
    """Llama's RMSNorm (statistics in fp32, weight applied in the input's dtype)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        hd = getattr(cfg, "head_dim", None) or C // nh
        bias = bool(getattr(cfg, "attention_bias", False))
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(2 * C, nh * hd, bias=bias)       # 2C: [embedding; feature]
        self.k_proj = nn.Linear(2 * C, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(2 * C, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, C, bias=bias)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, I = cfg.hidden_size, cfg.intermediate_size
        bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_proj = nn.Linear(C, I, bias=bias)
        self.up_proj = nn.Linear(C, I, bias=bias)
        self.down_proj = nn.Linear(I, C, bias=bias)

    def forward(self, x, fast=None):
        g, u = lin(self.gate_proj, x, fast, "gate"), lin(self.up_proj, x, fast, "up")
        return lin(self.down_proj, F.silu(g) * u, fast, "down")


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)


class Eagle3Draft(nn.Module):
    """An EAGLE-3 draft: one decoder layer, `fc`, `norm`, `lm_head`, `d2t` / `t2d`; its parameter
    names are the checkpoint's (state_dict() is what export writes). `config` is the draft layer's
    LlamaConfig (vocab_size = the target's) with draft_vocab_size, target_hidden_size,
    norm_before_residual, eagle_aux_hidden_state_layer_ids (None: the default for the target) and
    the verifier it names. The token embedding is the checkpoint's where it ships one, else the
    target's (`share_embeddings`)."""

    def __init__(self, cfg, own_embeddings: bool = False):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        C, V, N = cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size
        Ct = cfg.target_hidden_size or C
        self.config = cfg
        self.fc = nn.Linear(3 * Ct, C, bias=False)
        self.layers = nn.ModuleList([Layer(cfg)])
        self.norm = RMSNorm(C, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(C, N, bias=False)
        self.embed_tokens = nn.Embedding(V, C) if own_embeddings else None
        self.register_buffer("d2t", torch.zeros(N, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
        # kept out of the module tree: rope tables stay fp32 whatever dtype the weights take
        self.__dict__["rotary"] = LlamaRotaryEmbedding(cfg)
        self.format, self.source, self.name_or_path = "speclab", "", "eagle3"

    # -- vocabulary -----------------------------------------------------------------------------
    @property
    def draft_ids(self) -> torch.Tensor:
        """(N,) the target id of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def set_vocab(self, target_ids: torch.Tensor):
        """The draft vocabulary as target ids, sorted ascending (then t2d.nonzero() lists them in draft
        order, as speculators and SpecForge write them)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if len(ids) != len(self.d2t) or len(ids.unique()) != len(ids):
            raise ValueError(f"the draft vocabulary needs {len(self.d2t)} distinct target ids, got {len(ids)}")
        with torch.no_grad():
            self.d2t.copy_(ids - torch.arange(len(ids)))
            self.t2d.zero_()
            self.t2d[ids] = True

    def embed(self, tokens: torch.Tensor, shared: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings: the checkpoint's own, else `shared` (the target's, (V, C))."""
        w = self.embed_tokens.weight if self.embed_tokens is not None else shared
        if w is None:
            raise ValueError("this EAGLE-3 draft ships no token embedding: pass the target's (embed=...)")
        return w[tokens].to(self.fc.weight.dtype)

    # -- forward over a KV cache the caller owns ------------------------------------------------
    def forward(self, tokens: torch.Tensor, g: torch.Tensor, cache: "Cache", parents: list[int] | None = None,
                embed: torch.Tensor | None = None, keep_new: bool = True,
                fast: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run T entries after `cache`: tokens (T,) target ids, g (T, C) (a fused feature or a
        previous step's pre-norm output). Without parents the entries are a causal sequence at
        positions length..length+T-1; with parents (index of each entry's parent among these T, -1 =
        the last cached entry) a tree: each entry sees the cache and its ancestors, at
        length + depth - 1. embed: the target's token embedding (V, C) when the draft ships none.
        fast: packed copies of the linear layers (packed()).
        Returns (normed (T, C) for the head, pre-norm (T, C) to feed back); keep_new=False leaves the
        cache as it was."""
        T, S = len(tokens), cache.length
        dev = g.device
        if parents is None:
            pos = torch.arange(S, S + T, device=dev)
            vis = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        else:
            depth, vis = [], torch.zeros(T, T, dtype=torch.bool)
            for i, p in enumerate(parents):
                depth.append(1 if p < 0 else depth[p] + 1)
                vis[i, i] = True
                if p >= 0:
                    vis[i] |= vis[p]
            pos, vis = torch.tensor(depth, device=dev) + S - 1, vis.to(dev)
        mask = torch.cat([torch.ones(T, S, dtype=torch.bool, device=dev), vis], 1)
        normed, pre, k, v = self.block(self.embed(tokens, embed)[None], g[None], pos[None], mask,
                                       None if cache.k is None else (cache.k, cache.v), fast)
        if keep_new:
            cache.k, cache.v = k, v
        return normed[0], pre[0]

    def block(self, e: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, past=None,
              fast: dict | None = None):
        """The layer on a batch: token embeddings e (B, T, C), features g (B, T, C), positions (B, T),
        mask (T, S + T) bool (True = visible) over past keys then these; past: (K, V) each
        (B, nkv, S, hd). Returns normed (B, T, C), pre-norm (B, T, C) and the keys / values with
        these entries appended. Drafting (forward) and training (train/eagle3.py) both run it."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        lay, at = self.layers[0], self.layers[0].self_attn
        B, T, _ = e.shape
        e = lay.input_layernorm(e)
        gn = lay.hidden_norm(g.to(e.dtype))
        resid = gn if self.config.norm_before_residual else g.to(e.dtype)
        a = torch.cat([e, gn], -1)                                             # (B, T, 2C)
        q = lin(at.q_proj, a, fast, "q").view(B, T, at.nh, at.hd).transpose(1, 2)      # (B, nh, T, hd)
        k = lin(at.k_proj, a, fast, "k").view(B, T, at.nkv, at.hd).transpose(1, 2)
        v = lin(at.v_proj, a, fast, "v").view(B, T, at.nkv, at.hd).transpose(1, 2)
        if self.rotary.inv_freq.device != e.device:
            self.rotary.to(e.device)
        cos, sin = self.rotary(v, pos)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        rep = at.nh // at.nkv
        o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                           attn_mask=mask[None, None])
        h = resid + lin(at.o_proj, o.transpose(1, 2).reshape(B, T, at.nh * at.hd), fast, "o")
        h = h + lay.mlp(lay.post_attention_layernorm(h), fast)
        return self.norm(h), h, k, v

    def fuse(self, aux: torch.Tensor, fast: dict | None = None) -> torch.Tensor:
        """(T, 3 Ct) the target's states at the aux layers, concatenated in layer order -> g (T, C)."""
        return lin(self.fc, aux.to(self.fc.weight.dtype), fast, "fc")

    def logits(self, normed: torch.Tensor, fast: dict | None = None) -> torch.Tensor:
        """(T, C) -> (T, N) over the draft vocabulary (draft id i = target id draft_ids[i])."""
        return lin(self.lm_head, normed, fast, "lm_head")

    def packed(self) -> dict | None:
        """The linear layers in speclab's bf16 CPU kernel where it runs (F.linear reads bf16 weights
        several times slower there), for a drafter to pass as `fast`; None elsewhere."""
        from speclab.models import kernels
        w = self.fc.weight
        if not kernels.available(w.device, w.dtype):
            return None
        at, mlp = self.layers[0].self_attn, self.layers[0].mlp
        mods = {"fc": self.fc, "q": at.q_proj, "k": at.k_proj, "v": at.v_proj, "o": at.o_proj,
                "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj, "lm_head": self.lm_head}
        return {n: kernels.Packed(m.weight.detach(), None if m.bias is None else m.bias.detach())
                for n, m in mods.items()}

    def aux_layers(self, n_layers: int) -> tuple[int, ...]:
        ids = self.config.eagle_aux_hidden_state_layer_ids
        return tuple(ids) if ids else default_aux_layers(n_layers)


class Cache:
    """The draft's KV cache for one sequence (its caller owns it: one per request)."""

    def __init__(self):
        self.k = self.v = None          # (1, nkv, S, hd) of the kept entries

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def keep(self, n: int):
        """Drop the entries past the first n (speculative ones)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


# -- configs ---------------------------------------------------------------------------------------

def draft_config(layer: dict, draft_vocab_size: int, target_hidden_size: int | None, norm_before_residual: bool,
                 aux_layers=None, verifier: dict | None = None):
    from transformers import LlamaConfig
    drop = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "model_type",
            "draft_vocab_size", "target_hidden_size", "norm_before_residual", "eagle_config",
            "eagle_aux_hidden_state_layer_ids", "auto_map")
    cfg = LlamaConfig(**{k: v for k, v in layer.items() if k not in drop})
    cfg.num_hidden_layers = 1
    cfg.draft_vocab_size = int(draft_vocab_size or cfg.vocab_size)
    cfg.target_hidden_size = int(target_hidden_size or cfg.hidden_size)
    cfg.norm_before_residual = bool(norm_before_residual)
    cfg.eagle_aux_hidden_state_layer_ids = [int(i) for i in aux_layers] if aux_layers else None
    cfg.verifier = verifier or {}
    return cfg


def new_draft(target_config, draft_vocab_size: int | None = None, aux_layers=None, norm_before_residual: bool = False,
              verifier: dict | None = None, intermediate_size: int | None = None) -> Eagle3Draft:
    """A random-init EAGLE-3 draft for a Llama-shaped target (its layer's shape, its vocabulary)."""
    layer = {k: v for k, v in target_config.to_dict().items() if k not in ("quantization_config",)}
    if intermediate_size:
        layer["intermediate_size"] = intermediate_size
    cfg = draft_config(layer, draft_vocab_size or target_config.vocab_size, target_config.hidden_size,
                       norm_before_residual, aux_layers, verifier)
    d = Eagle3Draft(cfg)
    d.set_vocab(torch.arange(cfg.draft_vocab_size))
    return d


def read_config(where: Path) -> tuple[str, object]:
    """(format, config) of an EAGLE-3 checkpoint directory: "speculators" or "specforge"."""
    p = Path(where) / "config.json"
    if not p.is_file():
        raise ValueError(f"{where} has no config.json: an EAGLE-3 drafter is a directory written by speculators, "
                         "SpecForge or `speclab export-drafter`")
    c = json.loads(p.read_text())
    if c.get("speculators_model_type") is not None:
        if c["speculators_model_type"] != "eagle3":
            raise ValueError(f"{where} is a speculators {c['speculators_model_type']!r} drafter, not eagle3: "
                             "speclab runs eagle3 ones (method eagle3)")
        layer = c.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"{where}/config.json has no transformer_layer_config: re-export it with speculators "
                             "or `speclab export-drafter`")
        ver = (c.get("speculators_config") or {}).get("verifier") or {}
        # vLLM reads a missing norm_before_residual as true (speculators writes it always)
        return "speculators", draft_config(layer, c.get("draft_vocab_size"), c.get("target_hidden_size"),
                                           c.get("norm_before_residual", True),
                                           c.get("eagle_aux_hidden_state_layer_ids"), ver)
    if SPECFORGE_ARCH in (c.get("architectures") or []) or "draft_vocab_size" in c:
        eagle = c.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids") or c.get("eagle_aux_hidden_state_layer_ids")
        return "specforge", draft_config(c, c.get("draft_vocab_size"), c.get("target_hidden_size"),
                                         c.get("norm_before_residual", False), aux, None)
    raise ValueError(f"{where}/config.json is neither a speculators eagle3 config (speculators_model_type) nor a "
                     f"SpecForge / EAGLE one ({SPECFORGE_ARCH}): not an EAGLE-3 drafter")


def is_eagle3_dir(where) -> bool:
    try:
        read_config(Path(where))
        return True
    except (ValueError, OSError):
        return False


def read_weights(where: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, named as vLLM's loader names them (layers.0.*)."""
    from safetensors.torch import load_file
    files = sorted(Path(where).glob("*.safetensors"))
    if not files:
        bins = sorted(Path(where).glob("*.bin")) + sorted(Path(where).glob("*.pt"))
        raise ValueError(f"{where} has no .safetensors weights" + (f" (only {bins[0].name}, a pickle speclab does "
                         "not open): convert it with `speculators convert` or save it as safetensors" if bins else ""))
    out = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            k = k.removeprefix("model.")
            out[k.replace("midlayer.", "layers.0.")] = v
    return out


def load(where, device=None, dtype=torch.float32) -> Eagle3Draft:
    """An EAGLE-3 drafter from a speculators or SpecForge / EAGLE-repository directory, in `dtype`."""
    where = Path(where)
    fmt, cfg = read_config(where)
    sd = read_weights(where)
    missing = [k for k in REQUIRED if k not in sd]
    extra = [k for k in sd if k not in REQUIRED + OPTIONAL]
    if missing or extra:
        raise ValueError(f"{where} is not an EAGLE-3 checkpoint of one layer: "
                         + (f"missing {missing}" if missing else "") + (" ; " if missing and extra else "")
                         + (f"unexpected {extra[:5]}" if extra else "") + ": export it again with speculators or SpecForge")
    N, C = sd["lm_head.weight"].shape
    if N != cfg.draft_vocab_size or sd["fc.weight"].shape[1] != 3 * cfg.target_hidden_size or C != cfg.hidden_size:
        raise ValueError(f"{where}: weights (lm_head {tuple(sd['lm_head.weight'].shape)}, fc {tuple(sd['fc.weight'].shape)}) "
                         f"do not match its config (draft_vocab_size {cfg.draft_vocab_size}, hidden {cfg.hidden_size}, "
                         f"target_hidden_size {cfg.target_hidden_size}): the directory is inconsistent, export it again")
    cfg.attention_bias = "layers.0.self_attn.q_proj.bias" in sd
    draft = Eagle3Draft(cfg, own_embeddings="embed_tokens.weight" in sd)
    V = cfg.vocab_size
    d2t, t2d = sd.pop("d2t", None), sd.pop("t2d", None)
    if d2t is not None:
        ids = torch.arange(len(d2t)) + d2t.long()
    elif t2d is not None:
        ids = t2d.bool().nonzero()[:, 0]
    else:
        ids = torch.arange(N)
    if len(ids) != N or int(ids.max()) >= V or int(ids.min()) < 0:
        raise ValueError(f"{where}: d2t / t2d map {len(ids)} draft ids into a vocabulary of {V}, but lm_head scores "
                         f"{N}: the mapping belongs to another checkpoint")
    if t2d is not None and d2t is not None and (len(t2d) != V or not bool(t2d.bool()[ids].all())):
        raise ValueError(f"{where}: t2d does not mark the target ids d2t maps to: the mapping belongs to another checkpoint")
    missing, unexpected = draft.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k not in ("d2t", "t2d")]
    if missing or unexpected:
        raise ValueError(f"{where}: weights do not fit the draft layer (missing {missing}, unexpected {unexpected})")
    with torch.no_grad():                       # the order as given (speculators: ascending target ids)
        draft.d2t.copy_(ids - torch.arange(N))
        draft.t2d.zero_()
        draft.t2d[ids] = True
    draft.format, draft.source, draft.name_or_path = fmt, str(where), str(where)
    return draft.to(device=device or "cpu", dtype=dtype).eval()


# -- checks against the target ---------------------------------------------------------------------

def _norm_name(name) -> str:
    s = str(name or "").rstrip("/").split("/")[-1].lower()
    return s.removesuffix("-instruct").removesuffix("-it")


def target_names(target) -> set[str]:
    """The names a target goes by: the one it was loaded with, and the hub id of a packaged zoo model."""
    from speclab.models.gguf import PACKAGED
    name = str(getattr(target, "name_or_path", "") or "")
    names = {name, getattr(getattr(target, "config", None), "_name_or_path", "")}
    if name in PACKAGED:
        names.add(PACKAGED[name].hub_id)
    return {_norm_name(n) for n in names if n}


def check_target(draft: Eagle3Draft, target, verifier: bool = True) -> tuple[int, ...]:
    """The aux layers the draft reads on this target; one-line errors when the draft was made for
    another (hidden size, vocabulary, layers, the verifier it names)."""
    tc, dc = target.config, draft.config
    src = draft.source or "the EAGLE-3 drafter"
    if dc.target_hidden_size != tc.hidden_size:
        raise ValueError(f"{src} reads target hidden states of size {dc.target_hidden_size}, but the target has "
                         f"hidden_size {tc.hidden_size}: use the drafter trained for this target")
    if dc.vocab_size != tc.vocab_size:
        raise ValueError(f"{src} maps into a vocabulary of {dc.vocab_size} tokens, but the target has {tc.vocab_size}: "
                         "use the drafter trained for this target's tokenizer")
    if draft.embed_tokens is None and dc.hidden_size != tc.hidden_size:
        raise ValueError(f"{src} ships no token embedding and its hidden size {dc.hidden_size} differs from the "
                         f"target's {tc.hidden_size}: it needs a checkpoint with embed_tokens.weight")
    n = len(target.model.layers)
    layers = draft.aux_layers(n)
    if len(set(layers)) != 3 or any(not 1 <= l <= n for l in layers):     # vLLM captures each layer once
        raise ValueError(f"{src} reads target layers {list(layers)} but the target has {n} (ids 1..{n}: the state after "
                         f"that many layers): use the drafter trained for this target")
    want = (dc.verifier or {}).get("name_or_path")
    if verifier and want and _norm_name(want) not in target_names(target):
        raise ValueError(f"{src} was trained for the verifier {want!r}, but the target is "
                         f"{getattr(target, 'name_or_path', '?')!r}: load that model as the target, or pass "
                         "verifier=False to run the drafter on this one anyway")
    arch = (dc.verifier or {}).get("architectures") or []
    have = getattr(tc, "architectures", None) or []
    if verifier and arch and have and not set(arch) & set(have):
        raise ValueError(f"{src} was trained for a {arch[0]} verifier, but the target is a {have[0]}: load a "
                         f"{arch[0]} target, or pass verifier=False to run it anyway")
    return layers
