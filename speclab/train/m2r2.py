"""Train M2R2's accelerator adapters (speclab/models/m2r2.py): a fast residual stream through the
target's first E layers, aligned with its slow stream R times as deep, the target frozen.

    speclab train m2r2 --target code-target --data-dirs "" --self-text 400 --out DIR --minutes 10 --threads 1
    speclab train m2r2 --target smollm2-135m --out DIR --layers 10 --minutes 40

The text is the target's own (`--data-dirs`: the sets `speclab train smollm2-draft --gen-only`
writes; `--self-text N`: the target's greedy continuations of N code prompts, cached, as Clover's
trainer writes them). M2R2 (arXiv 2502.02040) trains the accelerated stream to line up with the slow
one early; speclab's recipe on a frozen target:

  1. a window runs through the frozen target once (no gradient): its state x_l after every layer
     and each layer's keys and values;
  2. the fast stream runs the first E layers over the same window with the accelerator adapters,
     each row attending to the slow stream's keys and values of the rows before it and to its own
     (what a draft row sees at decode time: the committed text in the target's cache, and itself);
  3. after fast layer j the state is pulled toward the slow state after l_j = round(R j) layers
     (R = L / E unless --rate): 1 - cos(f_j, x_{l_j}) (`--state-weight`) and, at `--positions`
     sampled rows a window, KL(p_{l_j} || q_j) through the shared final norm and head (the last
     fast layer's target is the final layer's distribution itself; the earlier ones weigh
     `--mid-weight`), plus `--hard-weight` x cross-entropy to the final layer's argmax at layer E.

Held out (`--held-frac` of the rows): per layer the share of rows whose exit top-1 equals the final
layer's, for the plain exits after 1..L layers (`plain`) and the fast stream after 1..E (`fast`),
and the cosine of each state with the final one (`cos_plain`, `cos_fast`). Saves when the fast
stream's agreement at layer E is the best so far, with the measured alignment in the config (the
drafter records it in the trace) and `speclab_train.json` (the command, the curve) beside it.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models.m2r2 import Accelerator, m2r2_config, slow_layer
from speclab.train.flexdraft import frozen_target, load_text, windows
from speclab.train.loop import BudgetLoop, add_options, cosine_lr, optimizer_step, run_info, saver, set_lr


def get_args(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train m2r2",
                                 description="train M2R2's accelerated residual stream on a frozen target")
    ap.add_argument("--target", default="code-target")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data-dirs", nargs="*", default=None, help="text the target wrote ('' for none)")
    ap.add_argument("--self-text", type=int, default=0, help="also N greedy continuations of code prompts")
    ap.add_argument("--max-new", type=int, default=96, help="tokens of each --self-text continuation")
    ap.add_argument("--layers", type=int, default=None, help="the fast stream's depth E (default L / 2)")
    ap.add_argument("--rate", type=float, default=None, help="slow layers per fast layer R (default L / E)")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--positions", type=int, default=64, help="rows a window scored through the head")
    ap.add_argument("--state-weight", type=float, default=1.0)
    ap.add_argument("--mid-weight", type=float, default=0.5)
    ap.add_argument("--hard-weight", type=float, default=0.1)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the --minutes budget)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--eval-every", type=float, default=2.0, help="minutes between held-out evaluations / saves")
    add_options(ap, minutes=10, batch=4, seq_len=192, lr=2e-3, warmup=20,
                dev_help="unused (the held-out rows are the evaluation)")
    args = ap.parse_args(argv)
    if args.data_dirs is None:
        from speclab.train.head_data import DATA_DIRS
        args.data_dirs = [] if args.self_text else DATA_DIRS
    return args


# ----------------------------------------------------------------------------------------------
# 1. the two streams

def streams(model, acc: Accelerator, ids: torch.Tensor) -> tuple[list, list]:
    """ids (N, T) -> (slow [x_0 .. x_L], each (N, T, C), no gradient; fast [f_1 .. f_E]), all before
    the final norm. Fast row t attends to the slow keys and values of rows < t and to its own."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    inner, cfg = model.model, model.config
    N, T = ids.shape
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    g = Hq // Hkv

    def heads(t, H):
        return t.view(N, T, H, D).transpose(1, 2)                                    # (N, H, T, D)

    with torch.no_grad():
        x = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(x, torch.arange(T)[None].expand(N, T))
    slow, kv = [x], []
    for i, layer in enumerate(inner.layers):
        at = layer.self_attn
        with torch.no_grad():
            h = layer.input_layernorm(x)
            q, k = apply_rotary_pos_emb(heads(at.q_proj(h), Hq), heads(at.k_proj(h), Hkv), cos, sin)
            v = heads(at.v_proj(h), Hkv)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
            x = x + at.o_proj(a.transpose(1, 2).reshape(N, T, Hq * D))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        slow.append(x)
        if i < acc.layers:
            kv.append((k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)))
    before = torch.ones(T, T, dtype=torch.bool).tril(-1)                              # row t sees rows < t
    f, fast = slow[0], []
    for i in range(acc.layers):
        layer = inner.layers[i]
        at = layer.self_attn
        h = layer.input_layernorm(f)
        q = at.q_proj(h) + acc.delta("q", i, h)
        q, k = apply_rotary_pos_emb(heads(q, Hq), heads(at.k_proj(h), Hkv), cos, sin)
        k, v = k.repeat_interleave(g, 1), heads(at.v_proj(h), Hkv).repeat_interleave(g, 1)
        K, V = kv[i]
        s = (q @ K.transpose(-1, -2)).masked_fill(~before, float("-inf")) * D ** -0.5    # (N, H, T, T)
        own = (q * k).sum(-1, keepdim=True) * D ** -0.5                                  # (N, H, T, 1)
        p = torch.cat([s, own], -1).softmax(-1)
        a = p[..., :T] @ V + p[..., T:] * v
        a = a.transpose(1, 2).reshape(N, T, Hq * D)
        f = f + at.o_proj(a) + acc.delta("o", i, a)
        h2 = layer.post_attention_layernorm(f)
        f = f + layer.mlp(h2) + acc.delta("f", i, h2)
        fast.append(f)
    return slow, fast


def m2r2_loss(model, acc: Accelerator, ids: torch.Tensor, rows: torch.Tensor, args) -> tuple:
    """The batch's loss (module docstring, step 3) and its numbers. rows (N, P): the rows scored
    through the head."""
    slow, fast = streams(model, acc, ids)
    L, E = len(slow) - 1, acc.layers
    norm, head = model.model.norm, model.lm_head

    def at_rows(x):
        return x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))

    with torch.no_grad():
        final = F.log_softmax(head(norm(at_rows(slow[L]))).float(), -1)
    loss, st = 0.0, {}
    for j in range(1, E + 1):
        tgt = slow_layer(j, acc.rate, L)
        cos = F.cosine_similarity(fast[j - 1], slow[tgt], dim=-1).mean()
        lq = F.log_softmax(head(norm(at_rows(fast[j - 1]))).float(), -1)
        with torch.no_grad():
            lp = final if tgt == L else F.log_softmax(head(norm(at_rows(slow[tgt]))).float(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1).mean()
        loss = loss + (1.0 if j == E else args.mid_weight) * kl + args.state_weight * (1 - cos)
        if j == E:
            loss = loss + args.hard_weight * F.nll_loss(lq.flatten(0, 1), final.argmax(-1).flatten())
            st = {"kl": float(kl.detach()), "cos": float(cos.detach()),
                  "acc": float((lq.argmax(-1) == final.argmax(-1)).float().mean())}
    return loss, st


# ----------------------------------------------------------------------------------------------
# 2. batches and the held-out alignment

def make_batch(data: dict, spans, positions: int, rng: random.Random):
    """ids (N, T) padded with the last token, rows (N, P) sampled inside each window's own tokens."""
    T = max(e - s for s, e, _ in spans)
    ids = torch.zeros(len(spans), T, dtype=torch.long)
    rows = torch.zeros(len(spans), positions, dtype=torch.long)
    for i, (s, e, _) in enumerate(spans):
        x = data["tokens"][s:e].long()
        ids[i, : e - s], ids[i, e - s:] = x, x[-1]
        rows[i] = torch.tensor([rng.randrange(e - s) for _ in range(positions)])
    return ids, rows


@torch.no_grad()
def alignment(model, acc: Accelerator, data, held, args) -> dict:
    """Per layer, the held-out top-1 agreement with the final layer (plain exits 1..L, the fast stream
    1..E) and the mean cosine of the state with the final state."""
    norm, head = model.model.norm, model.lm_head
    hit_p = hit_f = cos_p = cos_f = None
    n = 0
    for i in range(0, len(held), args.batch):
        spans = held[i:i + args.batch]
        ids, _ = make_batch(data, spans, 1, random.Random(1))
        slow, fast = streams(model, acc, ids)
        keep = torch.zeros(ids.shape, dtype=torch.bool)
        for r, (s, e, _) in enumerate(spans):
            keep[r, : e - s] = True
        final = slow[-1][keep]
        want = head(norm(final)).argmax(-1)

        def score(states):
            return (torch.tensor([float((head(norm(x[keep])).argmax(-1) == want).sum()) for x in states]),
                    torch.tensor([float(F.cosine_similarity(x[keep], final, dim=-1).sum()) for x in states]))
        hp, cp = score(slow[1:])
        hf, cf = score(fast)
        hit_p, cos_p = (hp, cp) if hit_p is None else (hit_p + hp, cos_p + cp)
        hit_f, cos_f = (hf, cf) if hit_f is None else (hit_f + hf, cos_f + cf)
        n += int(keep.sum())

    def r(t):
        return [round(float(v) / n, 4) for v in t]
    return {"plain": r(hit_p), "fast": r(hit_f), "cos_plain": r(cos_p), "cos_fast": r(cos_f)}


def save_accelerator(acc: Accelerator, out: Path, base_name: str, ev: dict, info: dict):
    """The adapter directory (fp16 weights, an empty head_ids, the alignment in the config), atomic."""
    from speclab.models.adapter import write_adapter
    cfg = acc.config.to_dict()
    cfg["m2r2"] = dict(cfg["m2r2"], align_plain=ev["plain"], align_fast=ev["fast"])
    write_adapter(out, cfg, {"base": base_name, "kind": "m2r2"}, acc.state_dict(), info)


def main(argv=None):
    from speclab.train.checkpoint import start
    from speclab.train.smollm2_data import split_rows

    argv = list(argv if argv is not None else [])
    args = get_args(argv)
    model, tok = frozen_target(args)
    n_layers = model.config.num_hidden_layers
    E = args.layers or max(1, n_layers // 2)
    acc = Accelerator(model, m2r2_config(model.config, E, args.rank, args.alpha, args.rate))
    data = load_text(args, model, tok)
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    spans, held = windows(data, train_rows, args.seq_len, 1), windows(data, held_rows, args.seq_len, 1)
    held = held[:32] or spans[:8]
    params = list(acc.parameters())
    print(f"m2r2: {sum(p.numel() for p in params) / 1e6:.3f}M trained params, fast stream {E} of {n_layers} "
          f"layers at rate {acc.rate:g}, rank {args.rank}; {len(spans)} train windows, {len(held)} held out",
          flush=True)
    opt, ckpt, state = start(acc, params, args.out, args.lr, args.resume)
    rng = random.Random(args.seed + state["step"])

    def held_alignment():
        ev = alignment(model, acc, data, held, args)
        return ev | {"fast_final": ev["fast"][-1]}
    save = saver(held_alignment,
                 lambda ev: save_accelerator(acc, args.out, args.target, ev,
                                             run_info("m2r2", argv, args, state, ev, layers=E, rate=acc.rate)),
                 acc, opt, ckpt, state, "fast_final", args.out)

    if not state["log"]:
        save()                                  # step 0: the untrained accelerator (the plain exit after E)
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save,
                      "train m2r2", args.max_steps)
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        ids, rows = make_batch(data, [spans[j] for j in idx], args.positions, rng)
        loss, st = m2r2_loss(model, acc, ids, rows, args)
        optimizer_step(opt, loss, params)
        if state["step"] % 10 == 0:             # the training curve, beside the held-out evaluations
            state["log"].append({"step": state["step"], "loss": round(float(loss.detach()), 4),
                                 "kl": round(st["kl"], 4), "acc": round(st["acc"], 4)})
        loop.bar.set_postfix(kl=f"{st['kl']:.3f}", cos=f"{st['cos']:.3f}", acc=f"{st['acc']:.2f}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
