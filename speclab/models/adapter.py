"""Small models that ship only what they add to a base model: a draft LM that shares its target's
frozen embedding matrix and scores a trimmed vocabulary.

A directory holds `config.json` (a LlamaConfig plus a `speclab_adapter` block naming the base and
what is taken from it), `model.safetensors` (every tensor the base does not provide, plus
`head_ids`, the kept token ids, most frequent first) and the tokenizer files. The output layer is
a `SubsetHead`: the base's embedding rows for `head_ids` (the tied LM head of SmolLM2) scoring
only those tokens; every other token gets -inf, so the draft can never propose it (a target token
outside the subset is a coverage miss) and its probabilities are a real distribution over the kept
tokens, which speculative sampling needs.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

ADAPTER_KEY = "speclab_adapter"
KEEP_FILES: tuple[str, ...] = ()        # files of a model directory a re-save carries over


class SubsetHead(nn.Module):
    """logits (..., V) = h @ W[ids].T at the kept ids, -inf elsewhere. W is shared, not owned."""

    def __init__(self, embed: torch.Tensor, head_ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.register_buffer("head_ids", head_ids.long(), persistent=False)
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(embed[head_ids].detach().clone(), requires_grad=False)  # (N, C)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        sub = h @ self.weight.t()                                            # (..., N)
        return scatter_subset(sub, self.head_ids, self.vocab_size)


def scatter_subset(sub: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    """(..., N) scores at `ids` -> (..., V) with -inf at every other token."""
    out = sub.new_full((*sub.shape[:-1], V), float("-inf"))
    out[..., ids] = sub
    return out


def adapter_info(where: str | Path) -> dict | None:
    cfg = Path(where) / "config.json"
    if not cfg.exists():
        return None
    return json.loads(cfg.read_text()).get(ADAPTER_KEY)


def build_draft(base, config, head_ids: torch.Tensor):
    """A LlamaForCausalLM of `config` whose embedding is the base's (shared, frozen) and whose head
    is a SubsetHead over `head_ids`; its transformer layers are left for the caller to fill."""
    from transformers import LlamaForCausalLM
    cfg = config
    cfg.tie_word_embeddings = False
    model = LlamaForCausalLM(cfg).to(base.dtype)
    embed = base.get_input_embeddings().weight
    if embed.shape != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"the base's embedding is {tuple(embed.shape)}, the draft expects "
                         f"({cfg.vocab_size}, {cfg.hidden_size}): this draft was trained for another base model")
    model.model.embed_tokens.weight = embed                 # shared with the base: not copied, not saved
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head = SubsetHead(embed, head_ids, cfg.vocab_size)
    return model.to(embed.device)       # built on the CPU; its layers join the base on its device


def own_state(model) -> dict[str, torch.Tensor]:
    """The tensors an adapter directory stores: everything but the shared embedding and head rows."""
    sd = {k: v for k, v in model.state_dict().items()
          if not k.startswith(("model.embed_tokens.", "lm_head."))}
    sd["head_ids"] = model.lm_head.head_ids.to(torch.int64)
    return sd


@contextlib.contextmanager
def atomic_dir(out: str | Path):
    """Yields a temporary directory beside `out`; on success it replaces `out` (hand-written notes in
    KEEP_FILES carried over), so a killed save never leaves a half-written adapter."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        for keep in KEEP_FILES:                 # hand-written notes survive a re-save
            if (out / keep).exists():
                shutil.copy2(out / keep, tmp / keep)
        old = out.with_name(out.name + ".old")
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")


def check_trained_for(cfg, target_model, name: str, what: str, train: str):
    """One ValueError line where `target_model` is not the shape the part (`what`, its config `cfg`)
    was trained for, saying how to train one (`train`: the command)."""
    got = target_model.config
    for key in SHAPE_KEYS:
        if getattr(got, key, None) != getattr(cfg, key, None):
            raise ValueError(f"{what} trained for a target with {key} = {getattr(cfg, key)}, {name} has "
                             f"{getattr(got, key, None)}: train one for it ({train})")


def write_adapter(out: str | Path, config: dict, adapter: dict, tensors: dict, info: dict | None = None,
                  dtype: torch.dtype = torch.float16, head_ids: bool = True):
    """An adapter directory, written atomically: config.json (`config` with `adapter`, the
    speclab_adapter block: its base, kind, ...), model.safetensors (`tensors`, floating ones in
    `dtype`; with `head_ids`, an empty head_ids where none is given: the target's own head) and,
    given `info`, speclab_train.json."""
    from safetensors.torch import save_file
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous() for k, v in tensors.items()}
    if head_ids:
        state.setdefault("head_ids", torch.zeros(0, dtype=torch.int64))
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps({**config, ADAPTER_KEY: adapter}, indent=2))
        save_file(state, str(tmp / "model.safetensors"))
        if info is not None:
            (tmp / "speclab_train.json").write_text(json.dumps(info, indent=2, default=str))


def save_draft(model, out: str | Path, base_name: str, tokenizer=None, kind: str = "draft"):
    """Write an adapter directory atomically. Without a tokenizer the directory loads with its
    base's (speclab.models.zoo.load). kind: "draft" (a draft LM), "eagle" or "medusa"
    (speclab.models.heads)."""
    from safetensors.torch import save_file
    with atomic_dir(out) as tmp:
        cfg = model.config.to_dict()
        cfg[ADAPTER_KEY] = {"base": base_name, "kind": kind, "shared": ["model.embed_tokens.weight"], "head": "subset"}
        cfg["tie_word_embeddings"] = False
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {k: v.detach().to(torch.bfloat16 if v.is_floating_point() else v.dtype).contiguous()
                 for k, v in own_state(model).items()}
        save_file(state, str(tmp / "model.safetensors"))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))


def apply_dllm_lora(where: str | Path, model):
    """Turn a private copy of the base into the block-diffusion LM in `where` (kind "dllm-lora",
    written by `speclab train smollm2-dllm`): merge the LoRA deltas, set the mask token's embedding
    (tied to the LM head: that row's logit changes too, and the engine never proposes the mask)
    and take the adapter's config flags (speclab_engine, mask_token_id, shift, block length)."""
    from safetensors.torch import load_file
    from speclab.models.lora import merge_lora
    raw = json.loads((Path(where) / "config.json").read_text())
    info = raw.pop(ADAPTER_KEY)
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if raw.get(key) != getattr(model.config, key, None):
            raise ValueError(f"{where} was trained on a base with {key}={raw.get(key)}, this base has "
                             f"{getattr(model.config, key, None)}: load it with its own base ({info.get('base')})")
    state = load_file(str(Path(where) / "model.safetensors"))
    mask_vec = state.pop("mask_embedding")
    merge_lora(model, state, float(info["lora_scale"]))
    with torch.no_grad():
        model.get_input_embeddings().weight[int(raw["mask_token_id"])] = mask_vec.to(model.dtype)
    for key in ("speclab_engine", "mask_token_id", "speclab_shift", "speclab_block_causal", "speclab_block_length"):
        setattr(model.config, key, raw[key])
    return model


def llama_config_like(base_cfg):
    """A Llama config of the base's dimensions, whatever the base's family (its model_type, its
    architectures and its quantization are not carried over): what every head or adapter starts from."""
    from transformers import LlamaConfig
    return LlamaConfig(**{k: v for k, v in base_cfg.to_dict().items()
                          if k not in ("architectures", "quantization_config", "_name_or_path", "transformers_version",
                                       "model_type")})
