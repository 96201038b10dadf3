"""Writing an EAGLE-3 drafter as the speculators directory vLLM serves as is (config.json +
model.safetensors, written atomically), and `speclab export-drafter` over a speculators or
SpecForge checkpoint. The layout itself is speclab/models/eagle3.py."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from speclab.models.eagle3 import Eagle3Draft, SPECULATORS_VERSION, load


def speculators_config(draft: Eagle3Draft, k: int = 3) -> dict:
    """config.json of the speculators layout (vLLM's SpeculatorsConfig reads it)."""
    cfg = draft.config
    layer = {k_: v for k_, v in cfg.to_dict().items()
             if k_ not in ("draft_vocab_size", "target_hidden_size", "norm_before_residual",
                           "eagle_aux_hidden_state_layer_ids", "verifier", "architectures", "_name_or_path",
                           "transformers_version", "dtype", "torch_dtype", "speclab")}
    layer["architectures"] = ["LlamaForCausalLM"]
    layer["model_type"] = "llama"
    layer["num_hidden_layers"] = 1
    ver = dict(cfg.verifier or {})
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(k),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": ver.get("name_or_path"), "architectures": ver.get("architectures") or []},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": int(cfg.draft_vocab_size),
        "target_hidden_size": int(cfg.target_hidden_size),
        "norm_before_residual": bool(cfg.norm_before_residual),
        "eagle_aux_hidden_state_layer_ids": list(cfg.eagle_aux_hidden_state_layer_ids or []) or None,
        "embed_requires_grad": False,
        "torch_dtype": str(draft.fc.weight.dtype).removeprefix("torch."),
    }


def export(draft: Eagle3Draft, out, dtype: torch.dtype | None = torch.bfloat16, k: int = 3,
           extra_files: dict[str, str] | None = None) -> Path:
    """Write `draft` as a speculators directory (config.json + model.safetensors), atomically: the
    files go to a temporary directory beside `out` that then replaces it."""
    from safetensors.torch import save_file
    out = Path(out)
    if draft.config.eagle_aux_hidden_state_layer_ids is None:
        raise ValueError("the drafter names no aux layers (eagle_aux_hidden_state_layer_ids): check it against its "
                         "target first (speclab.models.eagle3.check_target) or set them")
    if not draft.config.verifier.get("name_or_path"):
        raise ValueError("the drafter names no verifier (config.verifier['name_or_path']): vLLM serves a "
                         "speculators directory against the verifier it names; set it to the target's hub id or path")
    sd = {k_: v.detach().cpu().contiguous() for k_, v in draft.state_dict().items() }
    for k_, v in sd.items():
        if v.is_floating_point() and dtype is not None:
            sd[k_] = v.to(dtype)
    sd["d2t"], sd["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    cfg = speculators_config(draft, k)
    if dtype is not None:
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        cfg["transformer_layer_config"]["torch_dtype"] = cfg["torch_dtype"]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        tmp.chmod(0o755)                        # mkdtemp's 0700: a drafter is read by other users and engines
        for f in tmp.iterdir():
            f.chmod(0o644)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_drafter(where, out, verifier: str | None = None, k: int = 3, layers=None, src: str | None = None) -> Path:
    """`speclab export-drafter`: a speculators / SpecForge directory -> the speculators directory vLLM
    serves (the CLI turns a zoo name into its directory; src is the name the user gave, for messages).
    verifier / layers fill (or override) what the checkpoint does not name."""
    where = Path(where).expanduser()
    src = src or str(where)
    cfg = where / "config.json"
    if cfg.is_file() and "speclab_adapter" in json.loads(cfg.read_text()):
        raise ValueError(f"{src} is a speclab head (its own layout, which no engine loads), not an EAGLE-3 drafter: "
                         f"train one in the standard layout with `speclab train eagle3 --init-from {src}`")
    draft = load(where, dtype=torch.float32)
    if verifier:
        draft.config.verifier = dict(draft.config.verifier or {}, name_or_path=verifier)
    if layers:
        draft.config.eagle_aux_hidden_state_layer_ids = [int(v) for v in str(layers).split(",")]
    from safetensors import safe_open
    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    with safe_open(str(sorted(where.glob("*.safetensors"))[0]), "pt") as f:       # the source's own precision
        kinds = {f.get_slice(k).get_dtype() for k in f.keys()}
    dtype = next((names[k] for k in ("F32", "BF16", "F16") if k in kinds), torch.bfloat16)
    return export(draft, out, dtype=dtype, k=k)
