"""Adapt SmolLM2-135M into a block-diffusion LM: `smollm2-dllm` (Fast-dLLM v2's recipe, CPU-sized).

    speclab train smollm2-dllm --out speclab-zoo/speclab_zoo/smollm2-dllm --minutes 80

The text is the one the target wrote for `smollm2-draft` (speclab/train/smollm2_data.py): chat
questions and answers, code continuations. Each window goes in twice, side by side (BD3-LM's
layout): a clean copy x and a noisy copy x_t, cut into blocks of `block_length`; in each block of
x_t every generated token is replaced by the mask token with probability t_b ~ U(t_min, 1). The
attention (speclab.models.geometry.block_visible): clean tokens are causal among themselves, a noisy
token sees the clean tokens of earlier blocks and its own noisy block. AR-adapted with the shift:
token i is predicted by output i-1, the noisy copy's when i-1 is in the same block, else the clean
copy's (a block's first token is the AR prediction from the committed text). Loss: CE over masked
tokens plus `ar_weight` x the AR loss of the clean copy (keeps the slot-0 predictions sharp).

What is trained: LoRA (rank r on every attention and MLP projection) and the embedding of the mask
token (`<empty_output>`, unused by chat). The adapter directory holds only those (~10 MB); loading
merges them into a private copy of the base (speclab.models.zoo.load). Never in CI.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models.geometry import additive, block_of, block_visible
from speclab.train.smollm2_data import ANSWER, CODE_GEN, QUESTION, split_rows

MASK_TOKEN = "<empty_output>"
MASKED_KINDS = (QUESTION, ANSWER, CODE_GEN)         # text the target wrote (never the template)
EOS_ID = 2                                          # SmolLM2-Instruct's <|im_end|>


def get_args(argv=None):
    from speclab.train.head_data import DATA_DIRS
    ap = argparse.ArgumentParser(prog="speclab train smollm2-dllm",
                                 description="adapt SmolLM2 into a block-diffusion LM (LoRA + mask embedding)")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", type=Path, default=Path("speclab-zoo/speclab_zoo/smollm2-dllm"))
    ap.add_argument("--data-dirs", nargs="+", default=DATA_DIRS)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=8e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--t-min", type=float, default=0.1, help="lowest per-block mask ratio")
    ap.add_argument("--ar-weight", type=float, default=0.5)
    ap.add_argument("--held-frac", type=float, default=0.05)
    ap.add_argument("--save-every", type=float, default=10.0, help="minutes between evaluations / saves")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in the user cache")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# 1. windows and the two-copy batch

def windows(data: dict, rows: list[int], L: int, rng: random.Random, eos_id: int = EOS_ID):
    """(start, end, gen_start, ends) spans of at most L tokens: a random cut of each row (whole rows
    when short), gen_start = the first generated token (where a decode's first block would start),
    ends = the span is the end of an answer (its last token is end-of-turn)."""
    off, kinds, out = data["offsets"], data["kinds"], []
    for r in rows:
        a, b = int(off[r]), int(off[r + 1])
        s = a if b - a <= L else rng.randrange(a, b - L + 1)
        e = min(b, s + L)
        gen = (kinds[s:e] == ANSWER) | (kinds[s:e] == CODE_GEN)
        g = int(gen.nonzero()[0]) if gen.any() else 0
        out.append((s, e, g, e == b and int(data["tokens"][b - 1]) == eos_id))
    return out


def make_batch(data: dict, spans, block_length: int, mask_id: int, t_min: float, gen: torch.Generator,
               rng: random.Random, eos_id: int = EOS_ID, mask_fn=None):
    """ids (N, 2L) = [clean | noisy], position ids (N, 2L), the additive mask (N, 1, 2L, 2L) and the
    loss terms: (row, predictor column, target token, is_masked_term) for every trained token.
    mask_fn(i, maskable) -> (n,) bool, when given: row i's noisy mask, drawn by the caller (dParallel's
    fixed t and complementary pairs), its blocks starting at the row's first generated token."""
    # an answer's end is padded with a block of end-of-turn tokens (LLaDA's SFT recipe): the slots
    # after the end of a decoded answer become confident end-of-turn, not noise
    ext = [(e - s) + (block_length if ends else 0) for s, e, _, ends in spans]
    L, N = max(ext), len(spans)
    ids = torch.zeros(N, 2 * L, dtype=torch.long)
    pos = torch.arange(L).repeat(2)[None].repeat(N, 1)
    vis = torch.zeros(N, 2 * L, 2 * L, dtype=torch.bool)
    rows, cols, tgt, noisy_term = [], [], [], []
    grp = torch.cat([torch.full((L,), -1), torch.zeros(L, dtype=torch.long)])
    for i, (s, e, g, ends) in enumerate(spans):
        n, pad = ext[i], ext[i] - (e - s)
        x = torch.cat([data["tokens"][s:e].long(), torch.full((pad,), eos_id)])
        k = torch.cat([data["kinds"][s:e], torch.full((pad,), ANSWER, dtype=data["kinds"].dtype)])
        maskable = torch.zeros(n, dtype=torch.bool)
        for kind in MASKED_KINDS:
            maskable |= k == kind
        aligned = mask_fn is not None or rng.random() < 0.5                 # decode-aligned or anywhere
        start = g if aligned else rng.randrange(block_length)
        blk = block_of(torch.arange(L), start, block_length)
        t = t_min + (1 - t_min) * torch.rand(int(blk.max()) - int(blk.min()) + 1, generator=gen)
        p = t[blk[:n] - blk.min()]
        m = mask_fn(i, maskable) if mask_fn is not None else maskable & (torch.rand(n, generator=gen) < p)
        ids[i, :n], ids[i, L:L + n] = x, torch.where(m, torch.full_like(x, mask_id), x)
        v = block_visible(pos[i], blk.repeat(2), grp, pos[i], blk.repeat(2), grp)
        real = torch.cat([torch.arange(L) < n] * 2)
        vis[i] = v & real[None] & real[:, None]
        vis[i].diagonal().fill_(True)                                    # padding rows see themselves
        for j in range(1, n):
            if m[j]:                                                     # masked: noisy output j-1 in its block
                same = bool(blk[j - 1] == blk[j])
                rows.append(i); cols.append(L + j - 1 if same else j - 1); tgt.append(int(x[j])); noisy_term.append(True)
            if maskable[j]:                                              # AR term on the clean copy
                rows.append(i); cols.append(j - 1); tgt.append(int(x[j])); noisy_term.append(False)
    return ids, pos, vis, (torch.tensor(rows), torch.tensor(cols), torch.tensor(tgt), torch.tensor(noisy_term))


def trained_logits(model, mask_vec, batch, mask_id: int) -> torch.Tensor:
    """(M, V) fp32 logits of the batch's loss terms, in their order."""
    ids, pos, vis, (r, c, _, _) = batch
    emb = model.model.embed_tokens(ids)
    emb = torch.where((ids == mask_id)[..., None], mask_vec.to(emb.dtype), emb)
    mask = additive(vis[:, None], emb.dtype)
    h = model.model(inputs_embeds=emb, attention_mask=mask, position_ids=pos).last_hidden_state
    return model.lm_head(h[r, c]).float()                               # (M, V) only where trained


def loss_fn(model, mask_vec, batch, mask_id: int, ar_weight: float) -> tuple[torch.Tensor, dict]:
    y, noisy = batch[3][2], batch[3][3]
    logits = trained_logits(model, mask_vec, batch, mask_id)
    ce = F.cross_entropy(logits, y, reduction="none")
    m_loss = ce[noisy].mean() if noisy.any() else ce.sum() * 0
    a_loss = ce[~noisy].mean() if (~noisy).any() else ce.sum() * 0
    with torch.no_grad():
        acc = (logits[noisy].argmax(-1) == y[noisy]).float().mean().item() if noisy.any() else 0.0
    return m_loss + ar_weight * a_loss, {"masked_ce": m_loss.item(), "ar_ce": a_loss.item(), "masked_acc": acc}


# ----------------------------------------------------------------------------------------------
# 2. the adapter directory

def save_adapter(model, mask_vec, out: Path, base_name: str, args, mask_id: int, log: dict):
    """config.json (the base's config marked as a block-diffusion LM + the adapter block) and
    model.safetensors (LoRA A/B, mask embedding), written to a temporary directory and renamed."""
    from speclab.models.adapter import write_adapter
    from speclab.models.dllm import mark_dllm
    from speclab.models.lora import lora_state
    cfg = mark_dllm(type(model.config).from_dict(model.config.to_dict()), mask_id, shift=True)
    cfg.speclab_block_causal, cfg.speclab_block_length = True, args.block_length
    write_adapter(out, cfg.to_dict(), {"base": base_name, "kind": "dllm-lora", "lora_scale": args.alpha / args.rank,
                                       "rank": args.rank},
                  {**lora_state(model), "mask_embedding": mask_vec}, {"args": {k: str(v) for k, v in vars(args).items()},
                                                                      "log": log}, torch.bfloat16, head_ids=False)


# ----------------------------------------------------------------------------------------------
# 3. the loop

@torch.no_grad()
def evaluate(model, mask_vec, data, held, args, mask_id) -> dict:
    gen, rng = torch.Generator().manual_seed(1), random.Random(1)
    tot, n = {}, 0
    for i in range(0, len(held), args.batch):
        b = make_batch(data, held[i:i + args.batch], args.block_length, mask_id, args.t_min, gen, rng)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, m = loss_fn(model, mask_vec, b, mask_id, args.ar_weight)
        for k, v in m.items():
            tot[k] = tot.get(k, 0) + v
        n += 1
    return {k: round(v / max(n, 1), 4) for k, v in tot.items()}


def main(argv=None):
    from tqdm.auto import tqdm
    from speclab.models import zoo
    from speclab.models.gguf import cache_root
    from speclab.models.lora import add_lora
    from speclab.train.head_data import load_data
    from speclab.train.checkpoint import resume_state, save_checkpoint

    args = get_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = load_data(args.data_dirs)
    model, tok = zoo.load(args.target, dtype="bf16")                  # frozen base in bf16
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    for p in model.parameters():
        p.requires_grad_(False)
    add_lora(model, args.rank, args.alpha)
    for n_, p in model.named_parameters():
        if "lora_" in n_:
            p.data = p.data.float()                                      # fp32 master weights
    model.mask_vec = torch.nn.Parameter(model.model.embed_tokens.weight[mask_id].detach().float().clone())
    params = [p for p in model.parameters() if p.requires_grad]          # LoRA A, B and mask_vec
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = cache_root() / "ckpt" / args.out.name
    state = {"step": 0, "elapsed": 0.0, "log": []}
    if args.resume:
        state = resume_state(ckpt, args.out, model, opt, state, rename={"mask_vec": "mask_embedding"})
    rows = [i for i in range(len(data["is_code"])) if int(data["is_code"][i]) in (0, 1)]
    sub = {"is_code": data["is_code"][rows]}
    train_idx, held_idx = split_rows(sub, args.held_frac, args.seed)
    train_rows, held_rows = [rows[i] for i in train_idx], [rows[i] for i in held_idx]
    rng = random.Random(args.seed + state["step"])
    gen = torch.Generator().manual_seed(args.seed + state["step"])
    held = windows(data, held_rows, args.seq_len, random.Random(0))
    print(f"smollm2-dllm: {sum(p.numel() for p in params) / 1e6:.2f}M trained params, "
          f"{len(train_rows)} train rows, {len(held_rows)} held out, block {args.block_length}")
    budget, t0, e0 = args.minutes * 60, time.time(), state["elapsed"]
    bar = tqdm(total=int(budget), desc="train smollm2-dllm", unit="s", mininterval=10)
    last, avg, spans = time.time(), None, []

    def save():
        ev = evaluate(model, model.mask_vec, data, held, args, mask_id)
        state["log"].append({"step": state["step"], "min": round(state["elapsed"] / 60, 1), **ev})
        print(f"\nheld-out step {state['step']}: {ev}", flush=True)
        save_checkpoint(ckpt, model, opt, state)
        save_adapter(model, model.mask_vec, args.out, args.target, args, mask_id, state["log"])

    while time.time() - t0 < budget:
        if not spans:
            spans = windows(data, train_rows, args.seq_len, rng)
            rng.shuffle(spans)
        b = make_batch(data, [spans.pop() for _ in range(min(args.batch, len(spans)))],
                       args.block_length, mask_id, args.t_min, gen, rng)
        step = state["step"]
        frac = (time.time() - t0) / budget                             # cosine to 10% over this run
        lr = args.lr * min((step + 1) / args.warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, m = loss_fn(model, model.mask_vec, b, mask_id, args.ar_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        state["step"] += 1
        state["elapsed"] = e0 + time.time() - t0
        avg = m if avg is None else {k: 0.95 * avg[k] + 0.05 * v for k, v in m.items()}
        bar.update(int(time.time() - t0) - bar.n)
        bar.set_postfix({k: f"{v:.3f}" for k, v in avg.items()})
        if state["step"] % 10 == 0:
            print(json.dumps({"step": state["step"], "min": round(state["elapsed"] / 60, 1),
                              **{k: round(v, 4) for k, v in avg.items()}}), flush=True)
        if time.time() - last > args.save_every * 60:
            save()
            last = time.time()
    bar.close()
    save()
    print(f"saved {args.out} after {state['step']} steps ({state['elapsed'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
