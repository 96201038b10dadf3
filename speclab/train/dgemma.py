"""Train `digits-dgemma`: a tiny transformers DiffusionGemma on the digits task (ADD / SUM), so the
noise-canvas sampler has a model whose outputs can be checked (speclab.train.digits).

    speclab train digits-dgemma --out speclab/zoo/digits-dgemma --minutes 10

DiffusionGemma's objective at this scale: the encoder reads the prompt; the decoder reads the
answer's 8 slots with each replaced by a UNIFORM-RANDOM token with probability t ~ U(0, 1) (its
canvas starts as noise, not masks) and predicts every clean slot (CE). Half of the batches first
run once without gradient and feed their tempered logits back as self-conditioning, as the
sampler does at every step after the first. Never in CI; the command and its result are in
docs/training.md.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train import digits


def dgemma_config(vocab: int, canvas_length: int = digits.ANSWER_LEN, hidden: int = 96, layers: int = 4):
    """A small text-only DiffusionGemma (the vision tower is required by the config: kept minimal)."""
    from transformers import DiffusionGemmaConfig
    eos, pad = digits.VOCAB.index(digits.EOS), digits.VOCAB.index(digits.PAD)
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, global_head_dim=hidden // 4,
                num_experts=2, top_k_experts=1, moe_intermediate_size=hidden,
                layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"], sliding_window=32,
                max_position_embeddings=64, pad_token_id=pad, eos_token_id=eos, bos_token_id=eos)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, position_embedding_size=64,
                  patch_size=4, pooling_kernel_size=1)
    mask = digits.VOCAB.index(digits.MASK)           # never used by a text-only run
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length,
                                boi_token_id=mask, eoi_token_id=mask, image_token_id=mask)


def batch(tok, make, n: int, rng: random.Random):
    rows = [make(rng) for _ in range(n)]
    prompts = torch.tensor([tok(p)["input_ids"] for p, _ in rows])
    answers = torch.tensor([digits.answer_ids(a) for _, a in rows])
    return prompts, answers


def loss_fn(model, prompts, answers, V: int, gen: torch.Generator, self_condition: bool):
    B, L = answers.shape
    t = torch.rand(B, 1, generator=gen)
    noisy = torch.where(torch.rand(B, L, generator=gen) < t, torch.randint(0, V, (B, L), generator=gen), answers)
    sc = None
    if self_condition:
        with torch.no_grad():
            temp = 0.4 + 0.4 * torch.rand(1, generator=gen).item()
            sc = model(input_ids=prompts, decoder_input_ids=noisy).logits / temp
    logits = model(input_ids=prompts, decoder_input_ids=noisy, self_conditioning_logits=sc).logits
    return F.cross_entropy(logits.float().reshape(-1, V), answers.reshape(-1))


def main(argv=None):
    from tqdm.auto import tqdm
    from transformers import DiffusionGemmaForBlockDiffusion
    ap = argparse.ArgumentParser(prog="speclab train digits-dgemma")
    ap.add_argument("--out", type=Path, default=Path("speclab/zoo/digits-dgemma"))
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="start from the weights in --out (a fresh optimizer)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = digits.build_tokenizer()
    V = len(tok)
    if a.resume and (a.out / "config.json").exists():
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(a.out), dtype=torch.float32)
    else:
        model = DiffusionGemmaForBlockDiffusion(dgemma_config(V))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    rng, gen = random.Random(a.seed), torch.Generator().manual_seed(a.seed)
    budget, t0, step, avg = a.minutes * 60, time.time(), 0, None
    bar = tqdm(total=int(budget), desc="train digits-dgemma", unit="s", mininterval=5)
    model.train()
    while time.time() - t0 < budget:
        frac = (time.time() - t0) / budget
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / 100) * (1 - 0.9 * frac)
        loss = 0
        for make in (lambda r: digits.add_example(r), digits.sum_example):
            p, ans = batch(tok, make, a.batch // 2, rng)
            loss = loss + loss_fn(model, p, ans, V, gen, self_condition=step % 2 == 1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        avg = loss.item() if avg is None else 0.98 * avg + 0.02 * loss.item()
        bar.update(int(time.time() - t0) - bar.n)
        bar.set_postfix(loss=f"{avg:.3f}", step=step)
    bar.close()
    model.eval()
    tmp = a.out.with_name(a.out.name + ".tmp")
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    (tmp / "speclab_train.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                                         "steps": step, "loss_avg": avg,
                                                         "wall_s": round(time.time() - t0)}, indent=1))
    import shutil
    if a.out.exists():
        shutil.rmtree(a.out)
    tmp.replace(a.out)
    print(f"saved {a.out}: {step} steps, loss {avg:.3f}")


if __name__ == "__main__":
    main()
