"""A server's limits on one run: each request parameter's largest value, and a run's budgets (its
memory, estimated before it queues from the target's config and the request's lengths; its time).
The RunService (apps/service.py) checks every request with them before it queues."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from speclab.params import check_bounds


@dataclass(frozen=True)
class Limits:
    """The largest request a server runs: a field per run parameter (None: no limit), and a run's
    budgets: memory_mb, the KV cache (and a canvas's logits) a run may fill, estimated before it
    queues (run_memory); run_seconds, how long a run may take before it is stopped (a comparison:
    that much per decode it runs)."""
    max_new_tokens: int = 256
    gen_length: int = 256
    k: int = 16
    budget: int = 64
    prompt_chars: int = 8000
    memory_mb: float | None = 512
    # a 256-token run of the real 135M model on a busy 2-core CPU, its first load included, stays well under
    run_seconds: float | None = 120

    def check(self, request: dict) -> None:
        """ValueError, in one line, for the first parameter past its limit, or a run whose memory
        would pass its budget."""
        prompt = request.get("prompt")
        if isinstance(prompt, str) and len(prompt) > self.prompt_chars:
            raise ValueError(f"the prompt is {len(prompt)} characters, over this server's limit of "
                             f"{self.prompt_chars}: shorten it")
        for name in ("max_new_tokens", "gen_length", "k", "budget"):
            value, limit = request.get(name), getattr(self, name)
            if value is None or limit is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value > limit:
                raise ValueError(f"{name}={value:g} is over this server's limit of {limit}: ask for {limit} or less")
        check_bounds(request.get("method") or "", {k: v for k, v in request.items() if k != "seed"})   # the rest
        need = run_memory(request) if self.memory_mb is not None else None
        if need is not None and need[0] > self.memory_mb * 2**20:
            raise ValueError(f"this run would fill about {need[0] / 2**20:,.0f} MB ({need[1]}), over this server's "
                             f"memory budget of {self.memory_mb:g} MB a run: shorten the prompt or ask for fewer tokens")

    def over_time(self, runs: int = 1) -> str:
        """What a page says of a request stopped by the time budget (`runs` decodes of run_seconds each)."""
        s = self.run_seconds
        if runs == 1:
            return (f"stopped: the run passed this server's time budget of {s:g} s a run; fewer tokens, a "
                    "shorter prompt or a method with fewer forwards stays within it")
        return (f"stopped: the comparison passed this server's time budget of {s * runs:g} s ({s:g} s for each of "
                f"its {runs} runs); fewer methods, fewer timed runs or fewer tokens stay within it")


def model_config(name) -> dict | None:
    """The config of a zoo name, a packaged real LM already converted, or a local directory, read
    from its config.json without loading weights; None where it cannot be read so (a hub id)."""
    from speclab.models.zoo import REAL, zoo_path
    if not isinstance(name, (str, os.PathLike)):
        return None
    s, where = str(name), [(zoo_path(name) or Path(str(name)).expanduser()) / "config.json"]
    if s in REAL:
        from speclab.models.gguf import cache_root
        where.insert(0, cache_root() / s / "config.json")
    for cfg in where:
        try:
            if cfg.is_file():
                raw = json.loads(cfg.read_text(encoding="utf-8"))
                return raw if isinstance(raw, dict) else None
        except (OSError, ValueError):
            return None
    return None


def run_memory(request: dict) -> tuple[int, str] | None:
    """(bytes, what) a run_one request fills beyond the shared weights, estimated from its target's
    config and its lengths: the KV cache over prompt + new tokens + the widest verify (2 x layers x
    KV heads x head size a position; a prompt counted a token a character, its upper bound), plus a
    diffusion canvas's logits (slots x vocabulary in fp32). None where the config is not readable."""
    cfg = model_config(request.get("target"))
    if cfg is None or cfg.get("model_type") == "da-transformer":
        return None
    try:
        layers, heads, d = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads, head = int(cfg.get("num_key_value_heads") or heads), int(cfg.get("head_dim") or d // heads)
    from speclab.apps import runs
    canvas = runs.on_canvas(request["method"]) if request.get("method") else False
    new = int(request.get("gen_length") or 0) if canvas else int(request.get("max_new_tokens") or 0)
    prompt = request.get("prompt")
    width = max(int(request.get("k") or 0), int(request.get("budget") or 0)) + 1
    positions = (len(prompt) if isinstance(prompt, str) else 0) + new + width
    from speclab.models.zoo import REAL
    size = 2 if str(request.get("target")) in REAL and _bf16() else 4
    kv = 2 * layers * kv_heads * head * positions * size
    logits = new * int(cfg.get("vocab_size") or 0) * 4 if canvas else 0
    what = f"a KV cache of {layers} layers x {positions} positions" + (
        f" and {new} canvas slots' logits" if logits else "")
    return kv + logits, what


def _bf16() -> bool:
    """The real LMs decode in bf16 here (dtype "auto"): the KV cache holds 2 bytes a number."""
    from speclab.models.zoo import fast_bf16, pick_device
    return fast_bf16(pick_device())
