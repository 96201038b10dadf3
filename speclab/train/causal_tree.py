"""Train a causal-tree adapter (speclab/decoding/drafters/causal_tree.py): FlexDraft's mask
embedding and low-rank attention deltas in the target's last layers, plus the branch-rank
embeddings, with the mask rows tree-causal; the target frozen. Distillation from the target.

    speclab train causal-tree --target smollm2-135m --self-text 240 --max-new 96 --dtype bf16 --out DIR
    speclab train causal-tree --target code-target --data-dirs "" --self-text 200 --out DIR --minutes 5

The text and its windows are flexdraft's trainer's (train/flexdraft.py: `--data-dirs`, `--self-text`,
windows, anchors); per step:

  1. a window runs through the frozen target once (no gradient): its keys and values at every layer
     and its distribution p at every position;
  2. G anchors a; each gets the whole draft tree of the drafter (drafters.causal_tree.tree_shape:
     k - 1 main rows, and beside main row i < k - 2 a rank-r side row and the row below it) at the
     drafter's positions, seeing the window up to a and their own ancestors (tree-causal);
  3. teachers: main row i and its side rows -> p at a + 1 + i (the target's next-token distribution
     given the text); the row below a rank-r side row -> the target's distribution after the text
     up to a + 1 + i followed by y', p's r-th token other than the text's (one more no-gradient
     row per side branch, computed on the window's keys and values): so a branch learns to follow
     its own token;
  4. loss KL(p || q) + `--hard-weight` x cross-entropy to p's argmax, over every row; gradients reach
     the deltas, the mask embedding and the rank embeddings.

Held out: per main slot j the share whose top-1 is p's (`acc`), the same for the rows below side
tokens (`acc_branch`), and `tau_hat` = 2 + sum_j prod_{i<=j} acc_i (flexdraft's). Saves when tau_hat
is the best so far, with `speclab_train.json` (the command, the held-out log).
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models.causal_tree import CausalTreeAdapter, causal_tree_config, depths_of, tree_shape
from speclab.train.flexdraft import frozen_target, load_text, make_batch, mask_row_options, windows
from speclab.train.loop import BudgetLoop, cosine_lr, run_info, saver, set_lr


def get_args(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train causal-tree",
                                 description="train a causal-tree adapter: tree-causal mask rows drafting a tree "
                                             "inside the target")

    def extra(ap):
        ap.add_argument("--width", type=int, default=2, help="branches per slot (ranks learned)")
        ap.add_argument("--init", type=Path, default=None, help="start from a flexdraft adapter directory")
        ap.add_argument("--max-steps", type=int, default=0, help="stop at this step (0: the --minutes budget only)")
    mask_row_options(ap, 6, "the tree's depth: the target's token + k - 1 mask slots", 16, 40, extra)
    args = ap.parse_args(argv)
    if args.k < 2:
        ap.error("--k must be at least 2 (the target's token and one mask slot)")
    if args.width < 1:
        ap.error("--width must be at least 1")
    return args


def ancestors(parents: list[int]) -> torch.Tensor:
    """(R, R) bool: row j sees row a when a is j or an ancestor of j."""
    R = len(parents)
    A = torch.zeros(R, R, dtype=torch.bool)
    for j in range(R):
        a = j
        while a >= 0:
            A[j, a] = True
            a = parents[a]
    return A


def _rows_layer(layer, i, x, cos, sin, kc, vc, vis, adapter=None):
    """One layer for extra rows x (N, T, C) over the window's keys / values kc, vc (N, Hkv, L, D)
    and their own; the adapter's deltas where given (mask rows)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    at = layer.self_attn
    N, T, _ = x.shape
    Hq, Hkv, D = at.config.num_attention_heads, at.config.num_key_value_heads, at.head_dim
    h = layer.input_layernorm(x)
    qkv = torch.cat([at.q_proj(h), at.k_proj(h), at.v_proj(h)], -1)
    if adapter is not None and i >= adapter.first:
        qkv = qkv + adapter.qkv_delta(i, h)
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)
    q = q.view(N, T, Hq, D).transpose(1, 2)
    k = k.view(N, T, Hkv, D).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    v = v.view(N, T, Hkv, D).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, torch.cat([kc, k], 2), torch.cat([vc, v], 2), attn_mask=vis,
                                       enable_gqa=Hq != Hkv)
    a = a.transpose(1, 2).reshape(N, T, Hq * D)
    o = at.o_proj(a)
    if adapter is not None and i >= adapter.first:
        o = o + adapter.o_delta(i, a)
    x = x + o
    return x + layer.mlp(layer.post_attention_layernorm(x))


def tree_train_forward(model, adapter: CausalTreeAdapter, ids: torch.Tensor, anchors: torch.Tensor, k: int,
                       width: int):
    """ids (N, L), anchors (N, G) -> (student (N, G, R, C) the tree rows' final states, teacher (N, G, R, C)
    theirs, before the final norm). Rows in tree_shape(k, width)'s order."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    inner, cfg = model.model, model.config
    parents, ranks, beside = tree_shape(k, width)
    R, depth = len(parents), torch.tensor(depths_of(parents))
    N, L = ids.shape
    G = anchors.shape[1]
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    kvs = []
    with torch.no_grad():                                   # 1. the window, causal, once
        xc = inner.embed_tokens(ids)
        cos_c, sin_c = inner.rotary_emb(xc, torch.arange(L)[None].expand(N, L))
        for layer in inner.layers:
            at = layer.self_attn
            h = layer.input_layernorm(xc)
            q = at.q_proj(h).view(N, L, Hq, D).transpose(1, 2)
            kk = at.k_proj(h).view(N, L, Hkv, D).transpose(1, 2)
            q, kk = apply_rotary_pos_emb(q, kk, cos_c, sin_c)
            v = at.v_proj(h).view(N, L, Hkv, D).transpose(1, 2)
            kvs.append((kk, v))
            a = F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=Hq != Hkv)
            xc = xc + at.o_proj(a.transpose(1, 2).reshape(N, L, Hq * D))
            xc = xc + layer.mlp(layer.post_attention_layernorm(xc))
    pos = anchors[:, :, None] + depth                                       # (N, G, R) each row's position
    teach_at = anchors[:, :, None] + 1 + torch.tensor([b if b >= 0 else i for i, b in enumerate(beside)])
    C = xc.shape[-1]
    teacher = xc.gather(1, teach_at.reshape(N, G * R, 1).expand(-1, -1, C)).view(N, G, R, C)
    cols = torch.arange(L)
    clean = (cols[None, None, :] <= anchors[:, :, None])[:, :, None, :].expand(N, G, R, L).reshape(N, G * R, L)
    grp = torch.arange(G).repeat_interleave(R)
    own = (grp[:, None] == grp[None, :]) & ancestors(parents).repeat(G, G)
    vis = torch.cat([clean, own[None].expand(N, -1, -1)], -1)[:, None]
    below = [j for j in range(R) if ranks[j] == 0 and parents[j] >= 0 and ranks[parents[j]] > 0]
    if below:                                               # 3. the rows below side tokens: their teachers
        with torch.no_grad():
            b = torch.tensor(below)
            at_pos = anchors[:, :, None] + 1 + torch.tensor([beside[j] for j in below])    # (N, G, S) p's row
            lp = model.lm_head(inner.norm(xc.gather(1, at_pos.reshape(N, -1, 1).expand(-1, -1, C))))
            top = lp.topk(width + 1, -1).indices.view(N, G, len(below), width + 1)
            text = ids.gather(1, (at_pos + 1).reshape(N, -1)).view(N, G, len(below), 1)
            r = torch.tensor([ranks[parents[j]] for j in below])
            keep = top != text                              # the text's token is the main branch's
            order = keep.long().cumsum(-1)                  # the r-th other token
            pick = (keep & (order == r[None, None, :, None])).float().argmax(-1)
            alt = top.gather(-1, pick[..., None])[..., 0]                               # (N, G, S)
            S = len(below)
            xa = inner.embed_tokens(alt.reshape(N, G * S))
            cos_a, sin_a = inner.rotary_emb(xa, (at_pos + 1).reshape(N, G * S))
            vis_a = torch.cat([cols[None, None, :] <= at_pos.reshape(N, G * S, 1),
                               torch.eye(G * S, dtype=torch.bool)[None].expand(N, -1, -1)], -1)[:, None]
            for i, layer in enumerate(inner.layers):
                xa = _rows_layer(layer, i, xa, cos_a, sin_a, *kvs[i], vis_a)
            teacher[:, :, b] = xa.view(N, G, S, C)
    dt = xc.dtype
    xm = (adapter.mask_embedding.to(dt) + adapter.rank_embedding.to(dt)[torch.tensor(ranks)]).repeat(G, 1)
    xm = xm[None].expand(N, -1, -1)
    cos_m, sin_m = inner.rotary_emb(xm, pos.reshape(N, G * R))
    for i, layer in enumerate(inner.layers):                # 2. the tree rows, with gradients
        xm = _rows_layer(layer, i, xm, cos_m, sin_m, *kvs[i], vis, adapter)
    return xm.view(N, G, R, C), teacher


def tree_loss(model, adapter, ids, anchors, k: int, width: int, hard_weight: float = 0.1):
    student, teacher = tree_train_forward(model, adapter, ids, anchors, k, width)
    head, norm = model.lm_head, model.model.norm
    lq = F.log_softmax(head(norm(student)).float(), -1)                              # (N, G, R, V)
    with torch.no_grad():
        lp = F.log_softmax(head(norm(teacher)).float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean()
    hard = F.nll_loss(lq.flatten(0, 2), lp.argmax(-1).flatten())
    with torch.no_grad():
        hit = (lq.argmax(-1) == lp.argmax(-1)).float().mean((0, 1))                  # (R,)
    parents, ranks, _ = tree_shape(k, width)
    st = {"kl": float(kl.detach()), **{f"acc{j + 2}": float(hit[j]) for j in range(k - 1)}}
    below = [j for j in range(len(parents)) if ranks[j] == 0 and parents[j] >= 0 and ranks[parents[j]] > 0]
    if below:
        st["acc_branch"] = float(hit[below].mean())
    return kl + hard_weight * hard, st


@torch.no_grad()
def evaluate(model, adapter, data, held, args) -> dict:
    rng, accs, kls, br = random.Random(1), [], [], []
    for i in range(0, len(held), args.batch):
        ids, anchors = make_batch(data, held[i:i + args.batch], args.groups, args.k - 1, rng)
        _, st = tree_loss(model, adapter, ids, anchors, args.k, args.width)
        accs.append([st[f"acc{j + 2}"] for j in range(args.k - 1)])
        kls.append(st["kl"])
        br.append(st.get("acc_branch", 0.0))
    acc = torch.tensor(accs).mean(0)
    return {"kl": round(sum(kls) / len(kls), 4), "acc": [round(float(a), 4) for a in acc],
            "acc_branch": round(sum(br) / len(br), 4), "tau_hat": round(2 + float(acc.cumprod(0).sum()), 3)}


def save_adapter(adapter: CausalTreeAdapter, out: Path, base_name: str, info: dict):
    from speclab.models.adapter import write_adapter
    write_adapter(out, adapter.config.to_dict(), {"base": base_name, "kind": "causal-tree"}, adapter.state_dict(), info)


def main(argv=None):
    from speclab.train.checkpoint import start
    from speclab.train.smollm2_data import split_rows

    argv = list(argv if argv is not None else [])
    args = get_args(argv)
    model, tok = frozen_target(args)
    n_layers = model.config.num_hidden_layers
    first = max(0, n_layers - args.layers)
    adapter = CausalTreeAdapter(model, causal_tree_config(model.config, first, args.rank, args.alpha, args.k,
                                                          args.width))
    with torch.no_grad():                       # the mask starts as the mean token embedding
        adapter.mask_embedding.copy_(model.model.embed_tokens.weight.float().mean(0))
    if args.init is not None:                   # or as a trained flexdraft adapter (same layers and rank)
        from safetensors.torch import load_file
        state = {k: v.float() for k, v in load_file(str(args.init / "model.safetensors")).items() if k != "head_ids"}
        adapter.load_state_dict(state, strict=False)
    data = load_text(args, model, tok)
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    spans, held = windows(data, train_rows, args.seq_len, args.k), windows(data, held_rows, args.seq_len, args.k)
    held = held[:64] or spans[:8]
    params = [p for p in adapter.parameters() if p.requires_grad]
    print(f"causal-tree: {sum(p.numel() for p in params) / 1e6:.2f}M trained params, layers {first}..{n_layers - 1}, "
          f"rank {args.rank}, k {args.k}, width {args.width}; {len(spans)} train windows, {len(held)} held out",
          flush=True)
    opt, ckpt, state = start(adapter, params, args.out, args.lr, args.resume)
    rng = random.Random(args.seed + state["step"])

    save = saver(lambda: evaluate(model, adapter, data, held, args),
                 lambda ev: save_adapter(adapter, args.out, args.target, run_info("causal-tree", argv, args, state, ev)),
                 adapter, opt, ckpt, state, "tau_hat", args.out)

    if not state["log"]:
        save()
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save,
                      "train causal-tree", args.max_steps)
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        ids, anchors = make_batch(data, [spans[j] for j in idx], args.groups, args.k - 1, rng)
        loss, st = tree_loss(model, adapter, ids, anchors, args.k, args.width, args.hard_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loop.bar.set_postfix(kl=f"{st['kl']:.3f}", acc2=f"{st['acc2']:.2f}", br=f"{st.get('acc_branch', 0):.2f}")
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
