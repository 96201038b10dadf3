"""Small trained parts kept as a directory: `NAME.json` ({KEY: its config}) beside `NAME.safetensors`
(its weights in fp32), each written beside its name and renamed into place, so a reader never sees
half a part. No config.json, so the zoo does not list a part as a model; a part names the model it
was trained for in its config, and `paired_part` finds the zoo's part for a model by that name.
SpecDec++'s acceptance head, Judge decoding's probe and Learn2PD's filter are kept this way."""
from __future__ import annotations

import json
from pathlib import Path

import torch


def save_part(module: torch.nn.Module, out: str | Path, config: str, weights: str, key: str, cfg: dict) -> Path:
    """Write `module`'s weights and {key: cfg} into directory `out` (made if missing)."""
    from safetensors.torch import save_file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (weights + ".tmp")
    save_file({k: v.detach().float().contiguous() for k, v in module.state_dict().items()}, str(tmp))
    tmp.replace(out / weights)
    tmp = out / (config + ".tmp")
    tmp.write_text(json.dumps({key: cfg}, indent=2))
    tmp.replace(out / config)
    return out


def read_part(where: str | Path, config: str, key: str, missing: str) -> dict:
    """The config of the part in `where`; ValueError(missing) where there is none."""
    p = Path(where) / config
    if not p.is_file():
        raise ValueError(missing)
    return json.loads(p.read_text())[key]


def paired_part(config: str, key: str, field: str, name: str | None) -> Path | None:
    """The zoo's part whose config's `field` names the model `name` (a zoo name or a path), or None."""
    from speclab.models.zoo import zoo_dirs
    if not name:
        return None
    name = Path(str(name)).name
    for p in (p for d in zoo_dirs() for p in sorted(d.glob(f"*/{config}"))):
        if Path(str(json.loads(p.read_text())[key].get(field, ""))).name == name:
            return p.parent
    return None


def part_dir(given) -> Path | None:
    """`given` as a zoo name or a directory: that directory, or None where it is neither."""
    from speclab.models.zoo import zoo_dirs
    named = [d / str(given) for d in zoo_dirs() if "/" not in str(given) and (d / str(given)).is_dir()]
    where = named[0] if named else Path(str(given)).expanduser()
    return where if where.is_dir() else None


def resolve_part(given, paired, user: str, param: str, what: str, train: str, omit: str) -> Path:
    """A part's directory: `given` (a zoo name or a directory) or, with `given` None, `paired()`, the
    zoo's part for the model. Else one ValueError line, for `user` (who reads the part: "specdec++")
    whose parameter `param` names it: the zoo has no `what` ("acceptance head for the draft 'x'"):
    train one with `speclab train <train> --out DIR`; or `given` is no directory: pass the one
    `speclab train` wrote, or `omit` ("None for the zoo's head")."""
    if given is None:
        found = paired()
        if found is None:
            raise ValueError(f"{user}: the zoo has no {what}: train one with `speclab train {train} --out DIR` and pass "
                             f"{param}=DIR")
        return found
    where = part_dir(given)
    if where is None:
        raise ValueError(f"{user}: {param}={given!r} is neither a zoo name nor a directory; pass the directory "
                         f"`speclab train {train.split()[0]}` wrote, or {omit}")
    return where
