"""Train an EAGLE-3 draft in the standard layout (speclab.models.eagle3) and write it as a speculators
directory that speclab, vLLM and SGLang load as is.

    speclab train eagle3 --target smollm2-135m --out speclab-zoo/speclab_zoo/smollm2-eagle3 --minutes 60 \\
        --init-from speclab-zoo/speclab_zoo/smollm2-eagle

The data pipeline is the heads' (train/head_data.py): the text the target wrote for smollm2-draft,
and its hidden states after the aux layers and after its last layer (the last gives the target's
distribution p_{t+1} over the draft vocabulary), cached once next to the data.

Loss (EAGLE-3's training-time test over U steps): entry t reads g_t = fc([x_t^(l1); x_t^(l2);
x_t^(l3)]) and the token t+1 and predicts p_{t+1} (soft cross-entropy over the draft vocabulary);
steps 2..U feed the draft's own pre-norm output at t-1 back in place of g, with the attention a
draft step sees at run time (train/heads.ttt_mask). No feature regression: EAGLE-3 dropped it.

--init-from DIR (speclab's EAGLE head, e.g. smollm2-eagle): where the shapes allow, the draft starts
from what that head learned. Its MLP, o_proj and post-attention norm are copied; fc starts as the
head's layer fusion fc3 (which read RMS-normalised states) with each block divided by that layer's
typical RMS (fc reads raw states); hidden_norm is the target's final norm, so hidden_norm(g) is the
head's feature norm(fc3(...)) and, at later steps, norm of its own output, as the head fed back;
q / k / v over [embedding; feature] are the head's q / k / v composed with its input fusion eagle_fc
(its input norm taken at the typical scale). Its draft vocabulary is the head's trimmed one.

Progress bar, checkpoints (resumable with --resume), a held-out split, the directory written only
when held-out agreement (mean over the U steps) did not drop. Never in CI.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from speclab.train.head_data import DATA_DIRS, batch, first_rows, load_data, set_features, windows
from speclab.train.loop import held_out, optimizer_step
from speclab.train.heads import soft_ce, ttt_mask


def ttt_forward(draft, aux: list[torch.Tensor], tok: torch.Tensor, U: int, embed: torch.Tensor) -> torch.Tensor:
    """Normed draft outputs (U, B, T-1, C) for entries t = 0..T-2: step 1 reads g = fc(aux states)
    (each (B, T, Ct)), step s the draft's own pre-norm output of step s-1 at t-1. Steps 1..U-1 run
    without gradient only to produce what is fed back; the last pass recomputes every step with
    gradient (so fc learns from the step-1 entries, which are what the cache holds at run time)."""
    B, T, _ = aux[0].shape
    Tn = T - 1
    e = embed[tok[:, 1:]].to(draft.fc.weight.dtype)                    # entry t pairs g_t with token t+1
    pos = torch.arange(Tn).repeat(U)[None].expand(B, -1)
    out = None
    for s in range(1, U + 1):
        with torch.set_grad_enabled(torch.is_grad_enabled() and s == U):
            gs = [draft.fuse(torch.cat([a[:, :Tn] for a in aux], -1))]
            if out is not None:                                        # own outputs at t-1, fed at t
                prev = out[1].view(B, s - 1, Tn, -1).detach()
                gs += [torch.cat([prev[:, r, :1], prev[:, r, :-1]], 1) for r in range(s - 1)]
            normed, pre, _, _ = draft.block(e.repeat(1, s, 1), torch.cat(gs, 1), pos[:, :s * Tn], ttt_mask(Tn, s))
        out = (normed, pre)
    return out[0].view(B, U, Tn, -1).transpose(0, 1)


def ttt_loss(draft, tok, aux, lp, m, U: int, embed: torch.Tensor):
    """Mean over steps of the soft CE to the target's p_{t+1} over the draft vocabulary (lp: its
    log-probs (B, T, N)), over valid entries (t >= s-1, real tokens); per-step top-1 agreement."""
    o = ttt_forward(draft, aux, tok, U, embed)
    logits = draft.lm_head(o)                                           # (U, B, Tn, N)
    total, stats = 0.0, {}
    for s in range(U):
        valid = (m[:, 1:] & m[:, :-1]).clone()
        valid[:, :s] = False
        ce = soft_ce(logits[s], lp[:, 1:])
        total = total + (ce * valid).sum() / valid.sum().clamp(min=1)
        hit = (logits[s].argmax(-1) == lp[:, 1:].argmax(-1)) & valid
        stats[f"acc{s + 1}"] = float(hit.sum()) / max(int(valid.sum()), 1)
        stats[f"n{s + 1}"] = int(valid.sum())
    return total / U, stats


def parse_layers(spec: str, n_layers: int) -> list[int]:
    try:
        layers = [int(v) for v in spec.split(",")]
    except ValueError:
        raise SystemExit(f"--layers takes three comma-separated layer ids like 2,{n_layers // 2},{n_layers - 3}, "
                         f"got {spec!r}")
    if len(layers) != 3 or layers != sorted(set(layers)) or layers[0] < 1 or layers[-1] > n_layers - 1:
        raise SystemExit(f"--layers must be three increasing ids in 1..{n_layers - 1} (vLLM captures the state "
                         f"after layer id - 1 of its {n_layers}, never the last), got {spec!r}")
    return layers


@torch.no_grad()
def warm_start(draft, head_dir: Path, base, X: list[torch.Tensor], data: dict, head_layers_ok: bool):
    """Start `draft` from speclab's EAGLE head in head_dir where the shapes allow (module docstring)."""
    from safetensors.torch import load_file
    old = {k: v.float() for k, v in load_file(str(head_dir / "model.safetensors")).items() if k != "head_ids"}
    lay = draft.layers[0]
    for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "self_attn.o_proj"):
        mod = lay.get_submodule(name)
        mod.weight.copy_(old[f"model.layers.0.{name}.weight"])
    lay.post_attention_layernorm.weight.copy_(old["model.layers.0.post_attention_layernorm.weight"])
    tn = base.model.norm.weight.float()
    lay.hidden_norm.weight.copy_(tn)
    draft.norm.weight.copy_(tn)
    C = draft.config.hidden_size
    sample = torch.randperm(len(X[0]))[:4096]
    if "eagle_fc3.weight" in old and head_layers_ok:
        rms = [x[sample].float().pow(2).mean(-1).sqrt().mean() for x in X]
        draft.fc.weight.copy_(torch.cat([old["eagle_fc3.weight"][:, j * C:(j + 1) * C] / rms[j] for j in range(3)], 1))
    E = base.get_input_embeddings().weight.float()
    rms_e = E[data["tokens"][sample].long()].pow(2).mean(-1).sqrt().mean()
    lay.input_layernorm.weight.fill_(float(rms_e))                     # input_layernorm(e) ~ e
    # the head's input x = eagle_fc([f; e]) + b, normed by its input_layernorm: fold both into q / k / v
    Wf, We = old["eagle_fc.weight"][:, :C], old["eagle_fc.weight"][:, C:]
    f = torch.nn.functional.rms_norm(X[-1][sample].float(), (C,), tn, base.config.rms_norm_eps)
    x = f @ Wf.t() + E[data["tokens"][sample].long()] @ We.t() + old["eagle_fc.bias"]
    rms_x = x.pow(2).mean(-1).sqrt().mean()
    ln = old["model.layers.0.input_layernorm.weight"]
    for p in ("q_proj", "k_proj", "v_proj"):
        W = old[f"model.layers.0.self_attn.{p}.weight"] * ln / rms_x
        lay.self_attn.get_submodule(p).weight.copy_(torch.cat([W @ We, W @ Wf], 1))


def get_args(argv):
    ap = argparse.ArgumentParser(prog="speclab train eagle3", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", default="speclab-zoo/speclab_zoo/smollm2-eagle3")
    ap.add_argument("--data-dirs", nargs="*", default=DATA_DIRS)
    ap.add_argument("--minutes", type=float, default=30.0, help="training budget (wall time)")
    ap.add_argument("--layers", default=None,
                    help="aux layer ids (vLLM's numbering: the state after that many layers), e.g. 2,15,27; "
                         "default: vLLM's (2, n/2, n-3), or 8,16,n-1 with --init-from (near the head's fusion)")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary: most frequent ids "
                    "(with --init-from: the head's)")
    ap.add_argument("--init-from", default=None, help="speclab EAGLE head directory to warm-start from")
    ap.add_argument("--unroll", type=int, default=3, help="training-time test steps")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--held-frac", type=float, default=0.05)
    ap.add_argument("--held-windows", type=int, default=200, help="held-out windows per evaluation")
    ap.add_argument("--eval-every", type=float, default=6.0, help="minutes between held-out evals + saves")
    ap.add_argument("--k", type=int, default=3, help="speculative_tokens written in the config (vLLM's default k)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--limit-rows", type=int, default=0, help="use only the first N rows (a smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


@torch.no_grad()
def evaluate(draft, data, X, spans, norm, W_sub, args, embed) -> dict:
    draft.eval()
    agg: dict[str, float] = {}
    for i in range(0, len(spans), args.batch):
        tok, xs, _, lp, m = batch(data, X, spans[i:i + args.batch], norm, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, st = ttt_loss(draft, tok, xs[:3], lp, m, args.unroll, embed)
        for k in [k for k in st if k.startswith("acc")]:
            agg[k] = agg.get(k, 0.0) + st[k] * st["n" + k[3:]]
            agg["n" + k[3:]] = agg.get("n" + k[3:], 0) + st["n" + k[3:]]
    draft.train()
    return {k: round(v / max(agg["n" + k[3:]], 1), 4) for k, v in agg.items() if k.startswith("acc")}


def main(argv=None):
    import torch.nn.functional as F
    from tqdm.auto import tqdm
    from speclab.models import eagle3 as E
    from speclab.models.eagle3_export import export
    from speclab.models import zoo
    from speclab.models.gguf import PACKAGED, cache_root
    from speclab.train.checkpoint import resume_state, save_checkpoint, trainable
    from speclab.train.smollm2_data import split_rows
    from speclab.train.smollm2_draft import select_head_ids

    args = get_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    data = first_rows(load_data(args.data_dirs), args.limit_rows)
    base, tok = zoo.load(args.target, dtype="bf16")
    L = base.config.num_hidden_layers
    aux = parse_layers(args.layers or (f"8,16,{L - 1}" if args.init_from else f"2,{L // 2},{L - 3}"), L)
    feats = set_features(base, args.data_dirs, sorted(set(aux) | {L}), args.limit_rows)
    X = [feats[l] for l in aux] + [feats[L]]                # the aux states, then the last (the target's p)
    del base
    base = zoo.load(args.target, dtype="fp32")[0]           # fp32 master weights, bf16 autocast
    base.requires_grad_(False)
    V = base.config.vocab_size
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    if args.init_from:
        from safetensors.torch import load_file
        ids = load_file(str(Path(args.init_from) / "model.safetensors"))["head_ids"]
    else:
        specials = [i for i in tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
                    if i is not None and i != tok.unk_token_id]
        pos = torch.cat([torch.arange(int(data["offsets"][r]), int(data["offsets"][r + 1])) for r in train_rows])
        counts = torch.bincount(data["tokens"][pos].long(), minlength=V).float()
        ids = select_head_ids(None, args.draft_vocab, specials, V, counts=counts, fill=True)
    hub = PACKAGED[args.target].hub_id if args.target in PACKAGED else args.target
    draft = E.new_draft(base.config, len(ids), aux, verifier={"name_or_path": hub,
                                                                "architectures": list(base.config.architectures or ["LlamaForCausalLM"])})
    draft.set_vocab(ids)
    embed = base.get_input_embeddings().weight.detach()
    head_w = base.lm_head.weight.detach()
    with torch.no_grad():
        draft.lm_head.weight.copy_(head_w[draft.draft_ids])
        draft.norm.weight.copy_(base.model.norm.weight)
    if args.init_from:
        warm_start(draft, Path(args.init_from), base, X, data, head_layers_ok=True)
        print(f"started from {args.init_from} where the shapes allow")
    draft.lm_head.requires_grad_(False)                      # the target's own rows: scores stay comparable
    draft.float().train()
    W_sub = head_w[draft.draft_ids].float()                  # the target's distribution over the draft vocabulary
    nw, eps = base.model.norm.weight.detach().float(), base.config.rms_norm_eps
    norm = lambda x: F.rms_norm(x.float(), x.shape[-1:], nw, eps)
    params = trainable(draft)
    print(f"eagle3: aux layers {aux}, {sum(p.numel() for p in params.values()) / 1e6:.2f}M trained params, draft "
          f"vocabulary {len(ids)}, {len(train_rows)} train rows, {len(held_rows)} held out, {len(data['tokens'])} positions")
    opt = torch.optim.AdamW(list(params.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = cache_root() / "ckpt" / out.name
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "log": []}
    if args.resume:
        state = resume_state(ckpt, out, draft, opt, state)
    spans = windows(data, train_rows, args.seq_len)
    held = windows(data, held_rows, args.seq_len)[:args.held_windows]
    U = args.unroll
    import shlex
    import sys
    recipe = "speclab train eagle3 " + shlex.join(sys.argv[1:] if argv is None else argv)   # as it was run

    def save(final=False):
        ev = evaluate(draft, data, X, held, norm, W_sub, args, embed)
        if held_out(state, ev):
            export(draft, out, k=args.k, extra_files={"speclab_train.json": json.dumps(
                {"command": recipe, "step": state["step"], "held_out": ev, "log": state["log"]}, indent=2)})
            print(f"saved {out}", flush=True)
        save_checkpoint(ckpt, draft, opt, state)

    if state["step"] == 0:
        save()                                              # the starting point is the one to beat
    rng = random.Random(args.seed + state["epoch"])
    order = list(range(len(spans)))
    rng.shuffle(order)
    budget, t_start, elapsed0, last_eval = args.minutes * 60, time.time(), state["elapsed"], time.time()
    bar = tqdm(total=int(budget), desc="train eagle3", unit="s", mininterval=10)
    k = 0
    while state["elapsed"] < budget:
        if k >= len(order):
            state["epoch"] += 1
            rng.shuffle(order)
            k = 0
        pick = [spans[j] for j in order[k:k + args.batch]]
        k += args.batch
        frac = state["elapsed"] / budget
        lr = args.lr * min(1.0, (state["step"] + 1) / args.warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        tok_b, xs, _, lp, m = batch(data, X, pick, norm, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, st = ttt_loss(draft, tok_b, xs[:3], lp, m, U, embed)
        optimizer_step(opt, loss, list(params.values()))
        state["step"] += 1
        state["elapsed"] = elapsed0 + time.time() - t_start
        bar.n = int(min(state["elapsed"], budget))
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k_: f"{v:.2f}" for k_, v in st.items() if k_.startswith("acc")})
        if time.time() - last_eval > args.eval_every * 60:
            save()
            last_eval = time.time()
    bar.close()
    save(final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
