"""Train a FlexDraft adapter (speclab/models/flexdraft.py): the mask embedding and the mask rows'
low-rank attention deltas in the target's last layers, the target frozen.

    speclab train flexdraft --target smollm2-135m --out DIR --minutes 60
    speclab train flexdraft --target code-target --data-dirs "" --self-text 200 --out DIR --minutes 5

The text is the target's own (`--data-dirs`: the sets `speclab train smollm2-draft --gen-only`
writes; `--self-text N`: the target's greedy continuations of N code prompts, cached, as Clover's
trainer does). FlexDraft's release ships no training recipe; speclab's:

  1. a window of text runs through the frozen target once (no gradient): its keys and values at
     every layer and its next-token distribution p at every position;
  2. G anchors a in the window's generated part; each gets a group of m mask rows at positions
     a + 1 .. a + m that see the window's tokens up to a and each other, never a later token
     (models.flexdraft.mask_visibility, what a draft forward sees); m is drawn per step from
     1..k - 1, so one adapter drafts blocks of any size up to k;
  3. mask row j's output, through the target's final norm and head, is trained toward p at position
     a + j (the target's distribution of the token after it given the true text): KL(p || q), the
     distillation loss, plus `--hard-weight` x cross-entropy to p's argmax;
  4. gradients reach the adapter (the deltas of layers >= first, the mask embedding through every
     layer's mask rows) and nothing else. Clean rows never see a mask, so the target's own path is
     untouched: whatever the adapter learns, decoding stays lossless.

Held out (`--held-frac` of the rows): per mask slot j the share whose top-1 is p's (`acc_j`), and
`tau_hat`, the greedy tau a chain of k would reach were the slots independent (2 + sum_j prod_{i<=j}
acc_i: the target's own token, the slots' accepted run, the bonus). Saves when tau_hat is the best so
far, with `speclab_train.json` (the command, the held-out log) beside the adapter.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models.flexdraft import FlexDraftAdapter, flexdraft_config
from speclab.train.loop import BudgetLoop, add_options, cosine_lr, run_info, saver, set_lr


def mask_row_options(ap, k: int, k_help: str, groups: int, minutes: int, extra=None):
    """The options of a trainer of mask rows inside the target (flexdraft, causal-tree): the target,
    its text, the block, the tuned layers and rank, the loop's; `extra(ap)` adds the trainer's own."""
    from speclab.train.head_data import DATA_DIRS
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data-dirs", nargs="*", default=DATA_DIRS, help="text the target wrote ('' for none)")
    ap.add_argument("--self-text", type=int, default=0, help="also N greedy continuations of code prompts")
    ap.add_argument("--max-new", type=int, default=96, help="tokens of each --self-text continuation")
    ap.add_argument("--k", type=int, default=k, help=k_help)
    if extra is not None:
        extra(ap)
    ap.add_argument("--layers", type=int, default=8, help="the last layers whose attention the mask rows tune")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--groups", type=int, default=groups, help="mask groups (anchors) per window")
    ap.add_argument("--hard-weight", type=float, default=0.1)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--eval-every", type=float, default=10.0, help="minutes between held-out evaluations / saves")
    add_options(ap, minutes=minutes, batch=4, seq_len=256, lr=2e-3, warmup=20,
                dev_help="unused (the held-out rows are the evaluation)")
    return ap


def get_args(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train flexdraft",
                                 description="train a FlexDraft adapter: mask rows drafting a block inside the target")
    args = mask_row_options(ap, 8, "the largest block: the target's token + k - 1 mask slots", 24, 60).parse_args(argv)
    if args.k < 2:
        ap.error("--k must be at least 2 (the target's token and one mask slot)")
    return args


# ----------------------------------------------------------------------------------------------
# 1. the forward: clean rows frozen, mask rows through the adapter

def group_visibility(anchors: torch.Tensor, m: int, L: int) -> torch.Tensor:
    """anchors (N, G) -> (N, G m, L + G m) bool: a mask row sees the window's tokens up to its
    group's anchor and the rows of its own group."""
    N, G = anchors.shape
    cols = torch.arange(L)
    clean = cols[None, None, :] <= anchors[:, :, None]                              # (N, G, L)
    clean = clean[:, :, None, :].expand(N, G, m, L).reshape(N, G * m, L)
    grp = torch.arange(G).repeat_interleave(m)
    own = (grp[:, None] == grp[None, :])[None].expand(N, -1, -1)                     # (N, G m, G m)
    return torch.cat([clean, own], -1)


def flex_train_forward(model, adapter: FlexDraftAdapter, ids: torch.Tensor, anchors: torch.Tensor, m: int):
    """ids (N, L) the text, anchors (N, G) -> (student (N, G, m, C) final states of the mask rows,
    teacher (N, G, m, C) the clean rows' at positions a + 1 .. a + m, both before the final norm).
    The clean pass runs without gradient; the mask rows attend to its keys and values."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    inner = model.model
    cfg = model.config
    N, L = ids.shape
    G = anchors.shape[1]
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    pos_m = (anchors[:, :, None] + 1 + torch.arange(m)).reshape(N, G * m)            # (N, G m)
    with torch.no_grad():
        xc = inner.embed_tokens(ids)
        cos_c, sin_c = inner.rotary_emb(xc, torch.arange(L)[None].expand(N, L))
    dt = xc.dtype
    xm = adapter.mask_embedding.to(dt).expand(N, G * m, -1)
    cos_m, sin_m = inner.rotary_emb(xm, pos_m)
    vis = group_visibility(anchors, m, L)[:, None]                                    # (N, 1, G m, L + G m)

    def heads(t, H):
        return t.view(t.shape[0], t.shape[1], H, D).transpose(1, 2)

    for i, layer in enumerate(inner.layers):
        at = layer.self_attn
        with torch.no_grad():
            h = layer.input_layernorm(xc)
            q, k = apply_rotary_pos_emb(heads(at.q_proj(h), Hq), heads(at.k_proj(h), Hkv), cos_c, sin_c)
            v = heads(at.v_proj(h), Hkv)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
            xc = xc + at.o_proj(a.transpose(1, 2).reshape(N, L, Hq * D))
            xc = xc + layer.mlp(layer.post_attention_layernorm(xc))
        h = layer.input_layernorm(xm)
        qkv = torch.cat([at.q_proj(h), at.k_proj(h), at.v_proj(h)], -1)
        if i >= adapter.first:
            qkv = qkv + adapter.qkv_delta(i, h)
        qm, km, vm = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)
        qm, km = apply_rotary_pos_emb(heads(qm, Hq), heads(km, Hkv), cos_m, sin_m)
        a = F.scaled_dot_product_attention(qm, torch.cat([k, km], 2), torch.cat([v, heads(vm, Hkv)], 2),
                                           attn_mask=vis, enable_gqa=Hq != Hkv)
        a = a.transpose(1, 2).reshape(N, G * m, Hq * D)
        o = at.o_proj(a)
        if i >= adapter.first:
            o = o + adapter.o_delta(i, a)
        xm = xm + o
        xm = xm + layer.mlp(layer.post_attention_layernorm(xm))
    teacher = xc.gather(1, pos_m[..., None].expand(-1, -1, xc.shape[-1]))
    return xm.view(N, G, m, -1), teacher.view(N, G, m, -1)


def flex_loss(model, adapter, ids, anchors, m: int, hard_weight: float = 0.1):
    """The distillation loss of one batch and per slot the top-1 agreement with the target."""
    student, teacher = flex_train_forward(model, adapter, ids, anchors, m)
    head = model.lm_head
    norm = model.model.norm
    lq = F.log_softmax(head(norm(student)).float(), -1)                              # (N, G, m, V)
    with torch.no_grad():
        lp = F.log_softmax(head(norm(teacher)).float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean()
    hard = F.nll_loss(lq.flatten(0, 2), lp.argmax(-1).flatten())
    with torch.no_grad():
        acc = (lq.argmax(-1) == lp.argmax(-1)).float().mean((0, 1))                  # (m,)
    return kl + hard_weight * hard, {"kl": float(kl.detach()), **{f"acc{j + 1}": float(a) for j, a in enumerate(acc)}}


# ----------------------------------------------------------------------------------------------
# 2. windows and anchors

def windows(data: dict, rows: list[int], L: int, k: int) -> list[tuple[int, int, int]]:
    """(start, end, first generated offset) spans: each row cut into windows of at most L tokens
    that hold at least k generated tokens."""
    from speclab.train.smollm2_dllm import MASKED_KINDS
    off, out = data["offsets"], []
    kinds = data.get("kinds")                   # --self-text rows have none: every token counts
    gen_kind = torch.ones(len(data["tokens"]), dtype=torch.bool)
    if kinds is not None:
        gen_kind = torch.zeros_like(kinds, dtype=torch.bool)
    for kind in MASKED_KINDS if kinds is not None else ():
        gen_kind |= kinds == kind
    for r in rows:
        a, b = int(off[r]), int(off[r + 1])
        for s in range(a, b, L):
            e = min(b, s + L)
            g = gen_kind[s:e].nonzero()
            if len(g) and e - s - int(g[0]) >= k + 1:
                out.append((s, e, int(g[0])))
    return out


def make_batch(data: dict, spans, groups: int, m: int, rng: random.Random):
    """ids (N, L) padded with the last token, anchors (N, G): positions a with a + 1 at or after the
    first generated token and a + m + 1 inside the window (repeats allowed in a short window)."""
    L = max(e - s for s, e, _ in spans)
    ids = torch.zeros(len(spans), L, dtype=torch.long)
    anchors = torch.zeros(len(spans), groups, dtype=torch.long)
    for i, (s, e, g) in enumerate(spans):
        x = data["tokens"][s:e].long()
        ids[i, : e - s], ids[i, e - s:] = x, x[-1]
        lo, hi = max(g - 1, 0), e - s - m - 1
        anchors[i] = torch.tensor([rng.randint(lo, hi) for _ in range(groups)])
    return ids, anchors


@torch.no_grad()
def evaluate(model, adapter, data, held, args) -> dict:
    """Held-out per-slot agreement at the largest block (k - 1 mask slots) and tau_hat."""
    rng, m = random.Random(1), args.k - 1
    accs, kls = [], []
    for i in range(0, len(held), args.batch):
        ids, anchors = make_batch(data, held[i:i + args.batch], args.groups, m, rng)
        _, st = flex_loss(model, adapter, ids, anchors, m)
        accs.append([st[f"acc{j + 1}"] for j in range(m)])
        kls.append(st["kl"])
    acc = torch.tensor(accs).mean(0)
    tau_hat = 2 + float(acc.cumprod(0).sum())
    return {"kl": round(sum(kls) / len(kls), 4), "acc": [round(float(a), 4) for a in acc], "tau_hat": round(tau_hat, 3)}


def save_adapter(adapter: FlexDraftAdapter, out: Path, base_name: str, info: dict):
    from speclab.models.adapter import write_adapter
    write_adapter(out, adapter.config.to_dict(), {"base": base_name, "kind": "flexdraft"}, adapter.state_dict(), info,
                  torch.bfloat16)


def join_text(a: dict, b: dict) -> dict:
    """The rows of a (--data-dirs: with token kinds) then b (--self-text: none; every token of its
    rows counts as the target's), in the fields this trainer reads."""
    from speclab.train.smollm2_data import ANSWER
    kinds_b = torch.full((len(b["tokens"]),), ANSWER, dtype=a["kinds"].dtype)
    return {"tokens": torch.cat([a["tokens"], b["tokens"].to(a["tokens"].dtype)]),
            "offsets": torch.cat([a["offsets"], a["offsets"][-1] + b["offsets"][1:]]),
            "is_code": torch.cat([a["is_code"], b["is_code"].to(a["is_code"].dtype)]),
            "kinds": torch.cat([a["kinds"], kinds_b])}


def load_text(args, model, tok) -> dict:
    from speclab.train.head_data import load_data
    dirs = [d for d in (args.data_dirs or []) if d]
    data = load_data(dirs) if dirs else None
    if args.self_text:
        from speclab.train.clover import self_text
        own = self_text(model, tok, args.target, args.self_text, args.max_new, args.seed)
        data = own if data is None else join_text(data, own)
    if data is None:
        raise SystemExit("no text: give --data-dirs (written by `speclab train smollm2-draft --gen-only`) "
                         "or --self-text N")
    return data


def frozen_target(args):
    """An adapter trainer's start: its threads and seed set, the target loaded in --dtype, in eval
    mode and frozen. -> (model, tokenizer)."""
    from speclab.models import zoo
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tok = zoo.load(args.target, dtype=args.dtype)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def main(argv=None):
    from speclab.train.checkpoint import start
    from speclab.train.smollm2_data import split_rows

    argv = list(argv if argv is not None else [])
    args = get_args(argv)
    model, tok = frozen_target(args)
    n_layers = model.config.num_hidden_layers
    first = max(0, n_layers - args.layers)
    cfg = flexdraft_config(model.config, first, args.rank, args.alpha, args.k)
    adapter = FlexDraftAdapter(model, cfg)
    with torch.no_grad():                       # the mask starts as the mean token embedding
        adapter.mask_embedding.copy_(model.model.embed_tokens.weight.float().mean(0))
    data = load_text(args, model, tok)
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    spans, held = windows(data, train_rows, args.seq_len, args.k), windows(data, held_rows, args.seq_len, args.k)
    held = held[:64] or spans[:8]
    params = [p for p in adapter.parameters() if p.requires_grad]
    print(f"flexdraft: {sum(p.numel() for p in params) / 1e6:.2f}M trained params, layers {first}..{n_layers - 1}, "
          f"rank {args.rank}, k {args.k}; {len(spans)} train windows, {len(held)} held out", flush=True)
    opt, ckpt, state = start(adapter, params, args.out, args.lr, args.resume)
    rng = random.Random(args.seed + state["step"])

    save = saver(lambda: evaluate(model, adapter, data, held, args),
                 lambda ev: save_adapter(adapter, args.out, args.target, run_info("flexdraft", argv, args, state, ev)),
                 adapter, opt, ckpt, state, "tau_hat", args.out)

    if not state["log"]:
        save()                                  # step 0: the untrained adapter (the target's own attention)
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save,
                      "train flexdraft")
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        m = rng.randint(1, args.k - 1)
        ids, anchors = make_batch(data, [spans[j] for j in idx], args.groups, m, rng)
        loss, st = flex_loss(model, adapter, ids, anchors, m, args.hard_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loop.bar.set_postfix(m=m, kl=f"{st['kl']:.3f}", acc1=f"{st['acc1']:.2f}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
