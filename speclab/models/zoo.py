"""Load models by zoo name, local directory or hub id, through the same transformers calls a
user's own checkpoint goes through (`AutoModelForCausalLM.from_pretrained(path)`).

The zoo lives in speclab/zoo/<name>/ as fp16 safetensors + config + tokenizer, upcast on load.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"
ZOO = {
    "code-target": "Llama causal LM, ~12.5M params, early-exit trained (LayerSkip losses at layers 2, 4, 6)",
    "code-draft": "Llama causal LM, ~1.8M params, trained on the corpus then distilled on code-target",
    "code-dllm": "masked-diffusion LM (bidirectional Llama, ~1.8M params), adapted from code-draft",
    "digits-dllm": "masked-diffusion LM, ~1.05M params, the two-task digits problem (ADD / SUM)",
    "numwords-dat": "DA-Transformer: numbers to English words",
    "dates-dat": "DA-Transformer: ISO dates to word orders",
}


class ModelLoadError(ValueError):
    pass


def zoo_names() -> list[str]:
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").exists()) if ZOO_DIR.exists() else []


def pick_device(device: str | torch.device | None = None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve(name_or_path: str | os.PathLike) -> str:
    """Zoo name -> its directory; an existing directory -> itself; 'org/name' -> hub id."""
    s = str(name_or_path)
    if (ZOO_DIR / s / "config.json").exists():
        return str(ZOO_DIR / s)
    p = Path(s).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelLoadError(f"{p} has no config.json: point to a directory made by save_pretrained")
        return str(p)
    if s.count("/") == 1 and not s.startswith((".", "/", "~")):
        return s  # a hub id: transformers decides whether it can be fetched
    raise ModelLoadError(f"unknown model {s!r}: use a zoo name ({', '.join(zoo_names()) or 'none installed'}), "
                         "a directory made by save_pretrained, or a hub id like org/name")


def is_dag(where: str) -> bool:
    cfg = Path(where) / "config.json"
    return cfg.exists() and '"da-transformer"' in cfg.read_text()


def load(name_or_path, device=None, dtype=None, trust_remote_code: bool = False):
    """(model, tokenizer) for a zoo name, a local directory or a hub id; eval mode, on `device`.

    DA-Transformers (config model_type "da-transformer") are speclab's own architecture: they
    load with speclab.models.dag.load_dag and come back as (model, its vocabulary).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    where = resolve(name_or_path)
    dev = pick_device(device)
    if is_dag(where):
        from speclab.models.dag import load_dag
        model = load_dag(where, device=dev)
        return model, model.vocab
    dtype = dtype or torch.float32  # the zoo is stored in fp16 and upcast: fp16 matmuls are slow on CPU
    try:
        tok = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=trust_remote_code)
    except OSError as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(f"could not load {name_or_path!r}: {str(e).splitlines()[0]}"
                             + (" (HF_HUB_OFFLINE=1: hub ids need a network; use a local directory)" if offline else "")) from e
    model.to(dev).eval()
    model.name_or_path = str(name_or_path)
    return model, tok


@functools.lru_cache(maxsize=8)
def load_shared(name_or_path: str, device: str | None = None):
    """load(), once per process: views and the dashboard share one copy of each model."""
    return load(name_or_path, device=device)
