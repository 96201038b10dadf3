"""Train the zoo's masked-diffusion LMs with the LLaDA objective (reference note A.1, C.1).

    x_t = x with each maskable token replaced by <|mask|> with probability p = (1-eps) t + eps,
    t ~ U(0,1) per sequence; loss = sum over masked positions of CE / p, divided by the number of
    maskable positions. No timestep input: the network infers t from the canvas.

digits-dllm: the C.1 recipe (bidirectional, d=128, 4 layers, 4 heads, batch 128 half ADD half SUM,
AdamW 1e-3, 200 warm-up steps then linear decay to 10%, 3000 steps); prompt never masked. The
shipped model adds 35 minutes of `--resume --add-share 0.75` (docs/training.md).
code-dllm: AR-adapted (Dream / DiffuLLaMA style): starts from code-draft's weights, drops the
causal mask and reads position i's prediction at i-1 (`speclab_shift`). Windows of the corpus
(stdlib+tests, see speclab.train.corpus);
half of the batch keeps a random clean prefix (a prompt), the rest is masked anywhere.
`--resume` continues from the weights already in `--out` (fp16 on disk, trained in fp32; fresh
optimizer, warm-up and decay); speclab_train.json nests the earlier runs, `steps` is the total.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models.dllm import bidirectional_logits, mark_dllm

EPS = 1e-3
DIGITS_SHAPE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=4, max_position_embeddings=32, tie_word_embeddings=False)


@dataclass
class DllmConfig:
    minutes: float = 30.0
    max_steps: int | None = None
    batch_size: int = 128
    seq_len: int = 256          # code-dllm windows
    lr: float = 1e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    seed: int = 0
    threads: int | None = None
    resume: bool = False        # start from the weights in out_dir
    add_share: float = 0.5      # digits-dllm: share of each batch that is ADD (the rest SUM)


def masked_diffusion_loss(model, x: torch.Tensor, maskable: torch.Tensor, mask_id: int,
                          gen: torch.Generator) -> torch.Tensor:
    """x: (B, L) clean ids; maskable: (B, L) bool. LLaDA's 1/p-weighted CE over masked positions."""
    B, L = x.shape
    t = torch.rand(B, 1, generator=gen)
    p_mask = (1 - EPS) * t + EPS                                      # (B, 1)
    masked = (torch.rand(B, L, generator=gen) < p_mask) & maskable
    x_t = torch.where(masked, torch.full_like(x, mask_id), x)
    logits = bidirectional_logits(model, x_t)                         # (B, L, V)
    ce = F.cross_entropy(logits.float().transpose(1, 2), x, reduction="none")   # (B, L)
    return (ce * masked / p_mask).sum() / maskable.sum().clamp(min=1)


def _lr(cfg: DllmConfig, step: int, frac: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (1 - 0.9 * min(frac, 1.0))                       # linear decay to 10%


def _loop(model, cfg: DllmConfig, batch_fn, out_dir: Path, tokenizer, log=print):
    """Shared loop: time or step budget, progress bar, fp16 export at the end."""
    from tqdm.auto import tqdm
    prev = json.loads((out_dir / "speclab_train.json").read_text()) if cfg.resume else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    mask_id = model.config.mask_token_id
    budget, t0, step, avg = cfg.minutes * 60, time.time(), 0, None
    total = cfg.max_steps or int(budget)
    bar = tqdm(total=total, desc=out_dir.name, unit="step" if cfg.max_steps else "s")
    model.train()
    while True:
        elapsed = time.time() - t0
        if (cfg.max_steps and step >= cfg.max_steps) or (not cfg.max_steps and elapsed >= budget):
            break
        frac = step / cfg.max_steps if cfg.max_steps else elapsed / budget
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, frac)
        loss = sum(masked_diffusion_loss(model, x, m, mask_id, gen) for x, m in batch_fn(gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()  # 1/t weighting is spiky
        bar.update(1 if cfg.max_steps else int(time.time() - t0) - bar.n)
        bar.set_postfix(loss=f"{avg:.3f}")
        if step % 100 == 0:
            log(json.dumps({"step": step, "elapsed": round(time.time() - t0), "loss_avg": round(avg, 4)}))
    bar.close()
    extra = {"train": asdict(cfg), "steps": step, "loss_avg": avg, "wall_s": round(time.time() - t0)}
    if prev:                                                          # steps: the total over every run
        extra = {**extra, "steps": prev["steps"] + step, "run_steps": step, "previous": prev}
    _export(model, tokenizer, out_dir, extra)
    return model


def _export(model, tokenizer, out_dir: Path, extra: dict):
    import copy
    from speclab.train.ar import save_tokenizer
    half = copy.deepcopy(model).half().eval()
    half.config.dtype = "float16"
    half.save_pretrained(str(out_dir), safe_serialization=True)
    save_tokenizer(tokenizer, out_dir)
    (out_dir / "speclab_train.json").write_text(json.dumps(extra, indent=1, default=str))


def train_digits(out_dir, cfg: DllmConfig, log=print):
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.train import digits
    out_dir = Path(out_dir)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tok = digits.build_tokenizer()
    config = LlamaConfig(vocab_size=len(digits.VOCAB), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **DIGITS_SHAPE)
    if cfg.resume:
        model = LlamaForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
    else:
        model = LlamaForCausalLM(mark_dllm(config, tok.mask_token_id, shift=False))
    rng = random.Random(cfg.seed)
    n_add = round(cfg.batch_size * cfg.add_share)

    def batch(_gen):
        for make, n in ((digits.add_example, n_add), (digits.sum_example, cfg.batch_size - n_add)):
            rows = [make(rng) for _ in range(n)]
            x = torch.tensor([tok(p)["input_ids"] + digits.answer_ids(a) for p, a in rows])
            maskable = torch.zeros_like(x, dtype=torch.bool)
            maskable[:, -digits.ANSWER_LEN:] = True                  # the prompt is never masked
            yield x, maskable
    log(f"digits-dllm: {sum(p.numel() for p in model.parameters()):,} parameters")
    return _loop(model, cfg, batch, out_dir, tok, log)


def train_code(out_dir, tokenizer_dir, init_from, cfg: DllmConfig, log=print, texts=None):
    from transformers import AutoTokenizer, LlamaForCausalLM
    from speclab.train.ar import token_stream
    from speclab.train.corpus import iter_texts
    out_dir = Path(out_dir)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = LlamaForCausalLM.from_pretrained(str(init_from), dtype=torch.float32)
    mark_dllm(model.config, tok.mask_token_id, shift=True)
    stream = token_stream(tok, texts if texts is not None else iter_texts("train", corpus="stdlib+tests"))
    log(f"code-dllm: {sum(p.numel() for p in model.parameters()):,} parameters, corpus {len(stream):,} tokens")
    L, B = cfg.seq_len, cfg.batch_size

    def batch(gen):
        starts = torch.randint(0, len(stream) - L, (B,), generator=gen).tolist()
        x = torch.stack([stream[s:s + L] for s in starts])
        prefix = torch.randint(1, L * 3 // 4, (B, 1), generator=gen)  # clean prompt for half the rows
        prefix[B // 2:] = 1                                           # position 0 has no i-1: never masked
        maskable = torch.arange(L)[None] >= prefix
        yield x, maskable
    return _loop(model, cfg, batch, out_dir, tok, log)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="speclab train digits-dllm|code-dllm")
    ap.add_argument("recipe", choices=["digits-dllm", "code-dllm"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="continue from the weights in --out")
    ap.add_argument("--add-share", type=float, default=0.5, help="digits-dllm: share of ADD rows per batch")
    ap.add_argument("--tokenizer", type=Path, help="code-dllm: tokenizer dir (default: OUT/../tokenizer)")
    ap.add_argument("--init-from", type=Path, help="code-dllm: causal LM to adapt (default: OUT/../code-draft)")
    a = ap.parse_args(argv)
    if a.recipe == "digits-dllm":
        cfg = DllmConfig(minutes=a.minutes, max_steps=a.max_steps, threads=a.threads, batch_size=a.batch_size or 128,
                         lr=a.lr or 1e-3, seed=a.seed, resume=a.resume, add_share=a.add_share)
        train_digits(a.out, cfg)
    else:
        cfg = DllmConfig(minutes=a.minutes, max_steps=a.max_steps, threads=a.threads, batch_size=a.batch_size or 16,
                         lr=a.lr or 5e-4, warmup_steps=100, seed=a.seed, resume=a.resume)
        train_code(a.out, a.tokenizer or a.out.parent / "tokenizer", a.init_from or (a.out if a.resume else a.out.parent / "code-draft"), cfg)
