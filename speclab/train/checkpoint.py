"""Training checkpoints shared by speclab's trainers (the draft, the EAGLE / Medusa heads,
smollm2-dllm): the trainable parameters and the optimizer state as safetensors plus a json state,
no pickle, each file written beside its final name and then renamed into place."""
from __future__ import annotations

import json
from pathlib import Path

import torch


def trainable(model) -> dict[str, torch.nn.Parameter]:
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(ckpt: Path, model, opt, state: dict):
    from safetensors.torch import save_file
    ckpt.mkdir(parents=True, exist_ok=True)
    params = trainable(model)
    save_file({k: p.detach().contiguous() for k, p in params.items()}, str(ckpt / "model.tmp"))
    name = {id(p): k for k, p in params.items()}
    o = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                o[f"{name[id(p)]}::{k}"] = v.detach().reshape(-1) if v.ndim == 0 else v.detach().contiguous()
    save_file(o, str(ckpt / "optim.tmp"))
    (ckpt / "model.tmp").replace(ckpt / "model.safetensors")
    (ckpt / "optim.tmp").replace(ckpt / "optim.safetensors")
    (ckpt / "state.tmp").write_text(json.dumps(state, indent=2))
    (ckpt / "state.tmp").replace(ckpt / "state.json")


def start(model, params: list, out: Path, lr: float, resume: bool) -> tuple:
    """A head / adapter trainer's start: AdamW over `params`, the checkpoint folder (the user cache's
    ckpt/<out's name>: optimizer state stays out of the package) and the loop's state, resumed from
    either with `resume`. Returns (opt, ckpt, state)."""
    from speclab.models.gguf import cache_root
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = cache_root() / "ckpt" / Path(out).name
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "pos": 0, "log": []}
    if resume:
        state = resume_state(ckpt, out, model, opt, state)
    return opt, ckpt, state


def write_json(path: Path, obj) -> None:
    """`obj` as indented json, written beside `path` and then renamed into place."""
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)


def load_checkpoint(ckpt: Path, model, opt) -> dict:
    from safetensors.torch import load_file
    params = trainable(model)
    for k, v in load_file(str(ckpt / "model.safetensors")).items():
        params[k].data.copy_(v)
    for key, v in load_file(str(ckpt / "optim.safetensors")).items():
        k, field = key.split("::")
        opt.state[params[k]][field] = v.reshape(()) if field == "step" else v
    return json.loads((ckpt / "state.json").read_text())


def resume_state(ckpt: Path, out: Path, model, opt, state: dict, rename: dict | None = None) -> dict:
    """--resume: the checkpoint in the user cache if there is one; else (a fresh machine, a new
    clone) the weights already shipped in `out`, with fresh optimizer state, so that resuming never
    starts over from scratch and then overwrites what it was asked to continue. `rename` maps a
    trainable parameter's name to its key in out/model.safetensors where the two differ."""
    from safetensors.torch import load_file
    if (ckpt / "state.json").exists():
        got = load_checkpoint(ckpt, model, opt)
        print(f"resumed {ckpt} at step {got['step']} ({got['elapsed'] / 60:.1f} min trained)")
        return got
    f = Path(out) / "model.safetensors"
    if not f.exists():
        raise SystemExit(f"nothing to resume: no checkpoint in {ckpt} and no weights in {out}; drop --resume "
                         "to train from the start")
    shipped, params = load_file(str(f)), trainable(model)
    rename = rename or {}
    missing = [k for k in params if rename.get(k, k) not in shipped]
    if missing:
        raise SystemExit(f"{f} does not hold {missing[0]} (and {len(missing) - 1} more): it was trained with other "
                         "settings; drop --resume to train from the start")
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(shipped[rename.get(k, k)].to(p.dtype))
    print(f"no checkpoint in {ckpt}: resuming from the weights in {out} (fresh optimizer state)")
    return state


def load_matching(model, state: dict) -> list[str]:
    """Copy into `model` every tensor of `state` whose name and shape it has (a head started from
    another kind's weights: Clover from Medusa, Falcon from EAGLE). Returns the names copied."""
    params = dict(model.named_parameters())
    got = [k for k in state if k in params and params[k].shape == state[k].shape]
    with torch.no_grad():
        for k in got:
            params[k].copy_(state[k].to(params[k].dtype))
    return got


def start_from(model, init: dict | None, name: str) -> None:
    """Copy into `model` what fits of `init` (load_matching: the weights of the head `name`), and say
    how much; nothing when `init` is None."""
    if init is not None:
        got = load_matching(model, init)
        print(f"started from {name}: {len(got)} of its {len(init)} tensors")
