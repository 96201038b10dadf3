"""Train Hidden Transfer's transfer layers (speclab/models/hidden_transfer.py), the target frozen.

    speclab train hidden-transfer --target smollm2-135m --data-dirs "" --self-text 100 --out DIR --minutes 40
    speclab train hidden-transfer --target code-target --data-dirs "" --self-text 200 --out DIR --minutes 8

The text is the target's own (`--data-dirs`: the sets `speclab train smollm2-draft --gen-only`
writes; `--self-text N`: the target's greedy continuations of N code prompts, and its answers to the
seed questions where it has a chat template, cached, as Clover's trainer writes them). The paper
gives no training recipe; speclab's:

  1. a window of text runs through the frozen target once (no gradient): its keys and values at
     every layer, its state h_l after the first `--layer` layers, and its next-token distribution p
     at every position;
  2. G anchors t per window; each gets K pseudo rows s_{t+j} = W_j h_l[t] + b_j at positions
     t+1..t+K that run through layers l+1..L, seeing the window's tokens up to t and the pseudo rows
     of their own anchor before them (what the draft step sees at decode time: the committed cache
     and the rows before it);
  3. row j's output, through the target's final norm and head, is trained toward p at position t+j
     (the target's distribution of token t+j+1 given the true text): KL(p || q) plus `--hard-weight`
     x cross-entropy to p's argmax. Gradients reach W and b only.

Held out (`--held-frac` of the rows): per offset j the share whose top-1 is p's (`acc_j`) and
`tau_hat`, the greedy tau a chain of the K top-1 guesses would reach were the offsets independent
(1 + sum_j prod_{i<=j} acc_i). Saves when tau_hat is the best so far, with `speclab_train.json`
(the command, the held-out log) beside the transfer layers.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models.hidden_transfer import HiddenTransfer, transfer_config
from speclab.train.flexdraft import frozen_target, load_text, make_batch, windows
from speclab.train.loop import BudgetLoop, add_options, cosine_lr, optimizer_step, run_info, saver, set_lr


def get_args(argv=None):
    from speclab.train.head_data import DATA_DIRS
    ap = argparse.ArgumentParser(prog="speclab train hidden-transfer",
                                 description="train Hidden Transfer's transfer layers on the target's own states")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data-dirs", nargs="*", default=None,
                    help=f"text the target wrote ('' for none; default {' '.join(DATA_DIRS)} without --self-text)")
    ap.add_argument("--self-text", type=int, default=0, help="also N greedy continuations of code prompts")
    ap.add_argument("--max-new", type=int, default=96, help="tokens of each --self-text continuation")
    ap.add_argument("--layer", type=int, default=None,
                    help="the transfer layer l: pseudo states run through layers l+1..L (default L - max(2, L // 5))")
    ap.add_argument("--k", type=int, default=4, help="future positions (pseudo states) per anchor")
    ap.add_argument("--groups", type=int, default=16, help="anchors per window")
    ap.add_argument("--hard-weight", type=float, default=0.1)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the --minutes budget)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--eval-every", type=float, default=10.0, help="minutes between held-out evaluations / saves")
    add_options(ap, minutes=40, batch=4, seq_len=256, lr=1e-3, warmup=20,
                dev_help="unused (the held-out rows are the evaluation)")
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error("--k must be at least 1")
    if args.data_dirs is None:
        args.data_dirs = [] if args.self_text else DATA_DIRS
    return args


# ----------------------------------------------------------------------------------------------
# 1. the forward: the text frozen, the pseudo rows from layer l on

def pseudo_visibility(anchors: torch.Tensor, K: int, L: int) -> torch.Tensor:
    """anchors (N, G) -> (N, G K, L + G K) bool: pseudo row j of anchor t sees the window's tokens
    up to t and its own anchor's rows 1..j."""
    N, G = anchors.shape
    clean = torch.arange(L)[None, None, :] <= anchors[:, :, None]                  # (N, G, L)
    clean = clean[:, :, None, :].expand(N, G, K, L).reshape(N, G * K, L)
    grp, j = torch.arange(G).repeat_interleave(K), torch.arange(K).repeat(G)
    own = (grp[:, None] == grp[None, :]) & (j[None, :] <= j[:, None])               # (G K, G K)
    return torch.cat([clean, own[None].expand(N, -1, -1)], -1)


def transfer_forward(model, transfer: HiddenTransfer, ids: torch.Tensor, anchors: torch.Tensor):
    """ids (N, L) the text, anchors (N, G) -> (student (N, G, K, C) the pseudo rows' last states,
    teacher (N, G, K, C) the text's at positions t+1..t+K), both before the final norm."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    inner, cfg = model.model, model.config
    N, L = ids.shape
    G, K, l = anchors.shape[1], transfer.k, transfer.layer
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    pos_m = (anchors[:, :, None] + 1 + torch.arange(K)).reshape(N, G * K)            # (N, G K)
    with torch.no_grad():
        xc = inner.embed_tokens(ids)
        cos_c, sin_c = inner.rotary_emb(xc, torch.arange(L)[None].expand(N, L))
    cos_m, sin_m = inner.rotary_emb(xc, pos_m)
    vis = pseudo_visibility(anchors, K, L)[:, None]                                  # (N, 1, G K, L + G K)

    def heads(t, H):
        return t.view(t.shape[0], t.shape[1], H, D).transpose(1, 2)

    xm = None
    for i, layer in enumerate(inner.layers):
        at = layer.self_attn
        if i == l:                                 # h_l at the anchors -> K pseudo states each
            h_l = xc.gather(1, anchors[..., None].expand(-1, -1, xc.shape[-1]))          # (N, G, C)
            xm = transfer(h_l).reshape(N, G * K, -1)
        with torch.no_grad():
            h = layer.input_layernorm(xc)
            q, k = apply_rotary_pos_emb(heads(at.q_proj(h), Hq), heads(at.k_proj(h), Hkv), cos_c, sin_c)
            v = heads(at.v_proj(h), Hkv)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
            xc = xc + at.o_proj(a.transpose(1, 2).reshape(N, L, Hq * D))
            xc = xc + layer.mlp(layer.post_attention_layernorm(xc))
        if xm is None:
            continue
        h = layer.input_layernorm(xm)
        qm, km = apply_rotary_pos_emb(heads(at.q_proj(h), Hq), heads(at.k_proj(h), Hkv), cos_m, sin_m)
        a = F.scaled_dot_product_attention(qm, torch.cat([k, km], 2), torch.cat([v, heads(at.v_proj(h), Hkv)], 2),
                                           attn_mask=vis, enable_gqa=Hq != Hkv)
        xm = xm + at.o_proj(a.transpose(1, 2).reshape(N, G * K, Hq * D))
        xm = xm + layer.mlp(layer.post_attention_layernorm(xm))
    teacher = xc.gather(1, pos_m[..., None].expand(-1, -1, xc.shape[-1]))
    return xm.view(N, G, K, -1), teacher.view(N, G, K, -1)


def transfer_loss(model, transfer, ids, anchors, hard_weight: float = 0.1):
    """The distillation loss of one batch and per offset the top-1 agreement with the target."""
    student, teacher = transfer_forward(model, transfer, ids, anchors)
    head, norm = model.lm_head, model.model.norm
    lq = F.log_softmax(head(norm(student)).float(), -1)                              # (N, G, K, V)
    with torch.no_grad():
        lp = F.log_softmax(head(norm(teacher)).float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean()
    hard = F.nll_loss(lq.flatten(0, 2), lp.argmax(-1).flatten())
    with torch.no_grad():
        acc = (lq.argmax(-1) == lp.argmax(-1)).float().mean((0, 1))                  # (K,)
    return kl + hard_weight * hard, {"kl": float(kl.detach()), **{f"acc{j + 1}": float(a) for j, a in enumerate(acc)}}


@torch.no_grad()
def evaluate(model, transfer, data, held, args) -> dict:
    """Held-out per-offset agreement and tau_hat (module docstring)."""
    rng, K = random.Random(1), transfer.k
    accs, kls = [], []
    for i in range(0, len(held), args.batch):
        ids, anchors = make_batch(data, held[i:i + args.batch], args.groups, K, rng)
        _, st = transfer_loss(model, transfer, ids, anchors)
        accs.append([st[f"acc{j + 1}"] for j in range(K)])
        kls.append(st["kl"])
    acc = torch.tensor(accs).mean(0)
    return {"kl": round(sum(kls) / len(kls), 4), "acc": [round(float(a), 4) for a in acc],
            "tau_hat": round(1 + float(acc.cumprod(0).sum()), 3)}


def save_transfer(transfer: HiddenTransfer, out: Path, base_name: str, info: dict):
    """The adapter directory (fp16 weights, an empty head_ids), written atomically."""
    from speclab.models.adapter import write_adapter
    write_adapter(out, transfer.config.to_dict(), {"base": base_name, "kind": "hidden-transfer"},
                  transfer.state_dict(), info)


def main(argv=None):
    from speclab.train.checkpoint import start
    from speclab.train.smollm2_data import split_rows

    argv = list(argv if argv is not None else [])
    args = get_args(argv)
    model, tok = frozen_target(args)
    n_layers = model.config.num_hidden_layers
    layer = n_layers - max(2, n_layers // 5) if args.layer is None else args.layer
    transfer = HiddenTransfer(model, transfer_config(model.config, layer, args.k))
    data = load_text(args, model, tok)
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    spans, held = windows(data, train_rows, args.seq_len, args.k), windows(data, held_rows, args.seq_len, args.k)
    held = held[:64] or spans[:8]
    params = list(transfer.parameters())
    print(f"hidden-transfer: {sum(p.numel() for p in params) / 1e6:.2f}M trained params, layer {layer} of "
          f"{n_layers}, k {args.k}; {len(spans)} train windows, {len(held)} held out", flush=True)
    opt, ckpt, state = start(transfer, params, args.out, args.lr, args.resume)
    rng = random.Random(args.seed + state["step"])

    save = saver(lambda: evaluate(model, transfer, data, held, args),
                 lambda ev: save_transfer(transfer, args.out, args.target,
                                          run_info("hidden-transfer", argv, args, state, ev, layer=layer)),
                 transfer, opt, ckpt, state, "tau_hat", args.out)

    if not state["log"]:
        save()                                  # step 0: the identity transfer
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save,
                      "train hidden-transfer", args.max_steps)
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        ids, anchors = make_batch(data, [spans[j] for j in idx], args.groups, args.k, rng)
        loss, st = transfer_loss(model, transfer, ids, anchors, args.hard_weight)
        optimizer_step(opt, loss, params)
        loop.bar.set_postfix(kl=f"{st['kl']:.3f}", acc1=f"{st['acc1']:.2f}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
