"""Train the causal-LM pair of the zoo: `code-target` (with LayerSkip-style early-exit losses) and
`code-draft` (trained on the corpus, then distilled on the target's own distributions).

Training is budgeted in wall-clock minutes, the learning rate follows a cosine of the elapsed
fraction of the budget, and a checkpoint is written every few minutes, so a run can be stopped and
resumed (`--resume`) without changing its schedule.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.corpus import iter_texts

TARGET_SHAPE = dict(hidden_size=320, intermediate_size=864, num_hidden_layers=8,
                    num_attention_heads=5, num_key_value_heads=5)
DRAFT_SHAPE = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                   num_attention_heads=2, num_key_value_heads=2)


@dataclass
class TrainConfig:
    minutes: float = 60.0
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    exit_layers: list[int] = field(default_factory=list)  # layers whose output also predicts
    exit_weight: float = 0.3                             # weight of each early-exit loss
    distill_from: str | None = None                      # teacher dir: KL to its distribution
    selfgen_minutes: float = 0.0                         # teacher greedy text to distil on ...
    selfgen_share: float = 0.5                           # ... as this share of each batch
    checkpoint_minutes: float = 4.0
    max_steps: int | None = None                         # for tests: stop after this many steps
    seed: int = 0
    threads: int | None = None
    corpus: str = "stdlib"                               # or "stdlib+tests" (train side only)
    bf16: bool = False  # fp32 by default: bf16 autocast trains these small models slower on a CPU (docs/performance.md)


def llama_config(tokenizer, shape: dict, max_positions: int = 512):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=max_positions, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape)


def token_stream(tokenizer, texts) -> torch.Tensor:
    """All documents, each followed by <|endoftext|>, as one 1-D int64 tensor."""
    ids = []
    for batch in _chunks(list(texts), 64):
        for row in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            ids.extend(row)
            ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _chunks(xs, n):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]


def random_windows(stream: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()])  # (B, T+1)
    return x[:, :-1], x[:, 1:]


class ExitCapture:
    """Forward hooks that keep the hidden state after chosen decoder layers (1-based)."""

    def __init__(self, model, layers: list[int]):
        self.out: dict[int, torch.Tensor] = {}
        self.handles = [model.model.layers[l - 1].register_forward_hook(self._hook(l)) for l in layers]

    def _hook(self, layer):
        def hook(_module, _inputs, output):
            self.out[layer] = output[0] if isinstance(output, tuple) else output
        return hook


def lm_losses(model, x, y, cfg: TrainConfig, capture: ExitCapture | None, teacher=None):
    """Final loss plus LayerSkip early-exit losses through the shared final norm and head."""
    logits = model(input_ids=x).logits  # (B, T, V)
    losses = {"final": F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())}
    if capture is not None:
        # every 4th position is enough signal and keeps the extra head passes cheap
        for layer, h in capture.out.items():
            exit_logits = model.lm_head(model.model.norm(h[:, ::4]))  # (B, T/4, V)
            losses[f"exit{layer}"] = F.cross_entropy(exit_logits.flatten(0, 1).float(),
                                                     y[:, ::4].flatten())
    if teacher is not None:
        with torch.no_grad():
            p_log = F.log_softmax(teacher(input_ids=x).logits.float(), -1)
        q_log = F.log_softmax(logits.float(), -1)
        losses["kl"] = F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True,
                                reduction="batchmean")
    total = losses.get("kl", losses["final"]) if teacher is not None else losses["final"]
    if teacher is not None:
        total = 0.5 * losses["kl"] + 0.5 * losses["final"]
    for k, v in losses.items():
        if k.startswith("exit"):
            total = total + cfg.exit_weight * v
    return total, {k: float(v.detach()) for k, v in losses.items()}


def lr_at(cfg: TrainConfig, step: int, frac: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)


def train_lm(out_dir, tokenizer_dir, shape: dict, cfg: TrainConfig, resume: bool = False,
             texts=None, log=print, init_from=None):
    """Train one causal LM into out_dir/ (safetensors fp16 + config + tokenizer)."""
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, LlamaForCausalLM

    out_dir, ckpt = Path(out_dir), Path(out_dir) / "checkpoint"
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    stream = token_stream(tokenizer, texts if texts is not None else iter_texts("train", corpus=cfg.corpus))
    log(f"corpus: {len(stream):,} tokens")

    state = {"step": 0, "elapsed": 0.0}
    if resume and (ckpt / "model.safetensors").exists():
        model = LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
        state = json.loads((ckpt / "state.json").read_text())
    elif init_from:
        model = LlamaForCausalLM.from_pretrained(str(init_from), dtype=torch.float32)
    else:
        model = LlamaForCausalLM(llama_config(tokenizer, shape, cfg.seq_len))
    log(f"model: {sum(p.numel() for p in model.parameters()):,} parameters")
    teacher = None
    if cfg.distill_from:
        teacher = LlamaForCausalLM.from_pretrained(cfg.distill_from, dtype=torch.float32).eval()
    selfgen = None
    if teacher is not None and cfg.selfgen_minutes > 0:
        from speclab.train.selfgen import greedy_continuations
        selfgen = greedy_continuations(teacher, stream, cfg.selfgen_minutes,
                                       torch.Generator().manual_seed(cfg.seed), cfg.seq_len, log=log)
    capture = ExitCapture(model, cfg.exit_layers) if cfg.exit_layers else None
    if cfg.exit_layers:
        model.config.speclab_exit_layers = list(cfg.exit_layers)   # layer-skip's default candidates
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    if resume and (ckpt / "optimizer.pt").exists():
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    gen = torch.Generator().manual_seed(cfg.seed + state["step"])

    budget = cfg.minutes * 60
    bar = tqdm(total=int(budget), initial=int(state["elapsed"]), unit="s", desc=out_dir.name)
    t0, last_ckpt = time.time() - state["elapsed"], time.time()
    model.train()
    while True:
        elapsed = time.time() - t0
        if elapsed >= budget or (cfg.max_steps is not None and state["step"] >= cfg.max_steps):
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, state["step"], elapsed / budget)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, parts = _step_losses(model, stream, selfgen, cfg, capture, teacher, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["elapsed"] = time.time() - t0
        bar.update(int(state["elapsed"]) - bar.n)
        bar.set_postfix({k: f"{v:.3f}" for k, v in parts.items()})
        if state["step"] % 50 == 0:
            log(json.dumps({"step": state["step"], "elapsed": round(state["elapsed"]), **parts}))
        if time.time() - last_ckpt > cfg.checkpoint_minutes * 60:
            _save_checkpoint(model, opt, state, ckpt)
            last_ckpt = time.time()
    bar.close()
    _save_checkpoint(model, opt, state, ckpt)
    export_half(model, tokenizer, out_dir, extra={"train": asdict(cfg), "steps": state["step"]})
    return model


def _step_losses(model, stream, selfgen, cfg, capture, teacher, gen):
    """One batch of corpus windows; with teacher text, `selfgen_share` of it is the teacher's sequences."""
    n_gen = 0 if selfgen is None else max(1, round(cfg.batch_size * cfg.selfgen_share))
    if n_gen == 0:
        x, y = random_windows(stream, cfg.batch_size, cfg.seq_len, gen)
        return lm_losses(model, x, y, cfg, capture, teacher)
    rows = selfgen[torch.randint(0, len(selfgen), (n_gen,), generator=gen)]  # (n_gen, seq_len)
    l2, p2 = lm_losses(model, rows[:, :-1], rows[:, 1:], cfg, capture, teacher)
    parts = {f"gen_{k}": v for k, v in p2.items()}
    if n_gen == cfg.batch_size:
        return l2, parts
    x, y = random_windows(stream, cfg.batch_size - n_gen, cfg.seq_len, gen)
    l1, p1 = lm_losses(model, x, y, cfg, capture, teacher)
    share = n_gen / cfg.batch_size
    return (1 - share) * l1 + share * l2, {**p1, **parts}


def _save_checkpoint(model, opt, state, ckpt: Path):
    ckpt.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(ckpt))
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    (ckpt / "state.json").write_text(json.dumps(state))


def export_half(model, tokenizer, out_dir: Path, extra: dict):
    """The shipped form: fp16 safetensors (upcast on load), config, tokenizer, training record."""
    import copy
    half = copy.deepcopy(model).half()
    half.config.dtype = "float16"
    half.save_pretrained(str(out_dir), safe_serialization=True)
    save_tokenizer(tokenizer, Path(out_dir))
    (Path(out_dir) / "speclab_train.json").write_text(json.dumps(extra, indent=1, default=str))


def save_tokenizer(tokenizer, out_dir: Path):
    """The tokenizer goes with the model, unless the shared `tokenizer/` folder beside it holds this
    very tokenizer: the zoo's code models ship it once and load it from there (zoo.tokenizer_dir)."""
    shared = Path(out_dir).parent / "tokenizer" / "tokenizer.json"
    own = getattr(tokenizer, "backend_tokenizer", None)
    if own is not None and shared.exists() and json.loads(shared.read_text()) == json.loads(own.to_str()):
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (Path(out_dir) / name).unlink(missing_ok=True)
        return
    tokenizer.save_pretrained(str(out_dir))
