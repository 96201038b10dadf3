"""Loading models and preparing prompts: what every engine needs before it decodes.

    as_model(m)         a zoo name / directory / hub id, or a loaded (model, tokenizer) pair -> the pair
    check_vocab(t, d)   a draft must share the target's vocabulary
    encode_prompt(...)  text or ids -> ids, checked against the context window
    token_table(...)    id -> text for every id a trace mentions (a trace renders without its tokenizer)
    model_info(...)     what a trace says about a model

Below the API and the engines alike (`speclab.api` re-exports these), so that no engine imports
the API to load its model.
"""
from __future__ import annotations

import os
import warnings

from speclab.models.hf import param_count
from speclab.models.zoo import load_shared
from speclab.trace import ModelInfo


def as_model(m, device=None, dtype="auto"):
    """A zoo name / directory / hub id, or an already loaded (model, tokenizer) pair."""
    if m is None:
        return None
    if isinstance(m, (tuple, list)):
        return m[0], m[1]
    if not isinstance(m, (str, os.PathLike)):
        raise TypeError(f"a model is given as a name, a directory or a (model, tokenizer) pair, not a bare "
                        f"{type(m).__name__}: pass (model, tokenizer) as speclab.load returns it")
    return load_shared(str(m), device, dtype)


def check_vocab(target, draft):
    vt, vd = target[0].config.vocab_size, draft[0].config.vocab_size
    if vt != vd or draft[1] is not None and len(target[1]) != len(draft[1]):    # None: an EAGLE-3 drafter's
        raise ValueError(f"draft and target have different vocabularies (target {vt} tokens, draft {vd}): "
                         "a draft model must share the target's tokenizer")


class PromptBoundaryWarning(UserWarning):
    """A prompt that ends where the tokenizer would not end a token (trailing whitespace)."""


def encode_prompt(tokenizer, prompt, max_new_tokens: int, max_positions: int | None) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("empty prompt: give some text to continue")
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if prompt != prompt.rstrip():
            warnings.warn(PromptBoundaryWarning(
                f"the prompt ends in whitespace ({prompt[len(prompt.rstrip()):]!r}): byte-level BPE merges a "
                "newline or space with the text after it, so the model sees a last token it rarely saw "
                "there; drop the trailing whitespace for a natural continuation"), stacklevel=3)
    else:
        ids = [int(i) for i in prompt]
        if not ids:
            raise ValueError("empty prompt: give some token ids to continue")
    if max_positions and len(ids) + max_new_tokens > max_positions:
        raise ValueError(f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the model's "
                         f"context window of {max_positions}: shorten the prompt or lower max_new_tokens")
    return ids


def token_table(tokenizer, ids) -> dict[int, str]:
    uniq = sorted(set(int(i) for i in ids))
    return {i: tokenizer.decode([i]) for i in uniq}


def model_info(model, name: str) -> ModelInfo:
    p = next(model.parameters())
    return ModelInfo(name=str(name), params=param_count(model), dtype=str(p.dtype).replace("torch.", ""),
                     device=str(p.device))


# -- which kind of model, without loading it -------------------------------------------------------
KINDS = ("causal", "diffusion", "dag")


def model_kind(m) -> str | None:
    """"causal", "diffusion" (masked-diffusion LM) or "dag" (DA-Transformer) for a loaded
    (model, tokenizer) pair, a zoo name or a local directory, read from its config without loading
    the weights; None when that cannot be known before loading (a hub id, an unknown name)."""
    import json
    from pathlib import Path

    from speclab.models.zoo import REAL, zoo_path
    if m is None:
        return None
    if not isinstance(m, (str, os.PathLike)):     # (model, tokenizer), or a loaded model
        from speclab.models.dag import DATransformer
        from speclab.models.dllm import is_dllm
        model = m[0] if isinstance(m, (tuple, list)) else m
        return "dag" if isinstance(model, DATransformer) else "diffusion" if is_dllm(model) else "causal"
    s = str(m)
    if s in REAL:
        return "causal"
    cfg = (zoo_path(s) or Path(s).expanduser()) / "config.json"
    if not cfg.is_file():
        return None
    try:
        raw = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None             # loading says what is wrong with it
    if not isinstance(raw, dict):
        return None
    if raw.get("model_type") == "da-transformer":
        return "dag"
    diffusion = raw.get("speclab_engine") == "diffusion" or raw.get("model_type") == "diffusion_gemma"
    return "diffusion" if diffusion else "causal"


def chat_prompt(tokenizer, question: str) -> list[int]:
    """The token ids of `question` as one user turn in the tokenizer's chat template, ready for the
    assistant's answer (add_generation_prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: drop chat=True / --chat and give "
                         "the raw prompt text")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("empty chat question: give the user's message as text")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
