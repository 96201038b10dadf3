"""Train `smollm2-draft`: a 3-layer draft LM for SmolLM2-135M-Instruct, FastDraft-style and offline.

The target writes its own training text, because speculative decoding judges the draft only on the
target's greedy choices:

  1. chat rows (Magpie): the target is fed only the chat template's user-turn prefix and samples a
     question; then it answers that question greedily;
  2. code rows: prefixes of Python source (speclab.train.corpus, training modules only), continued
     greedily by the target.

At every position the target generated we also keep its top-8 next-token log-probs, so training
adds a KL term to the CE on its greedy text without running the target again.

The draft is 3 transformer layers copied from the target (default layers 0, 1, 29: the first ones
read the embedding, the last one writes into the space the tied head reads), the target's final
norm, and the target's frozen embedding, which also serves as the output layer restricted to the
N most frequent tokens of the generated text (speclab.models.adapter.SubsetHead). Only the layers
and the norm are trained and shipped.

    python -m speclab.train.smollm2_draft --out speclab-zoo/speclab_zoo/smollm2-draft --minutes 40
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from speclab.train.checkpoint import resume_state, save_checkpoint, trainable
# the text (speclab/train/smollm2_data.py); every row kind is re-exported for readers of this file
from speclab.train.smollm2_data import (ANSWER, BASE, CODE_GEN, CODE_PREFIX, CORPUS, QUESTION,  # noqa: F401
                                        OPENERS, TEMPLATE, TOPK, TRAINED_KINDS, gen_chat, gen_code, gen_corpus_kd,
                                        load_rows, merge, save_rows, split_rows)
from speclab.train.loop import BudgetLoop, add_options, cosine_lr, set_lr
from speclab.train.vocab import coverage, select_head_ids, subset_index

# ----------------------------------------------------------------------------------------------
# 2. trimmed vocabulary: speclab/train/vocab.py (select_head_ids, coverage, subset_index)

# ----------------------------------------------------------------------------------------------
# 3. the draft

def draft_config(base_cfg, layers: int):
    from transformers import LlamaConfig
    d = base_cfg.to_dict()
    for k in ("architectures", "_name_or_path", "_model_name_or_path", "transformers_version"):
        d.pop(k, None)
    d["num_hidden_layers"] = layers
    d["tie_word_embeddings"] = False
    return LlamaConfig(**d)


def init_draft(base, head_ids: torch.Tensor, layer_ids: list[int]):
    """build_draft over `base`, its layers copied from base layers `layer_ids`, norm from the base."""
    from speclab.models.adapter import build_draft
    model = build_draft(base, draft_config(base.config, len(layer_ids)), head_ids)
    for i, j in enumerate(layer_ids):
        model.model.layers[i].load_state_dict(base.model.layers[j].state_dict())
    model.model.norm.load_state_dict(base.model.norm.state_dict())
    model.lm_head.weight.requires_grad_(False)
    return model


# ----------------------------------------------------------------------------------------------
# 4. loss

def draft_loss(model, x: torch.Tensor, y: torch.Tensor, kd_lp: torch.Tensor | None,
               kd_ids: torch.Tensor | None, sub_idx: torch.Tensor, mask: torch.Tensor,
               kl_weight: float = 0.5) -> tuple[torch.Tensor, dict]:
    """CE on the target's next token over the subset (targets outside it ignored) mixed with the
    KL from the target's top-k distribution (renormalised over the top-k ids inside the subset).

    x, y, mask: (B, T) inputs, next tokens, 1 where y is a token the target wrote.
    kd_lp, kd_ids: (B, T, k) the target's top-k log-probs / ids for y, zeros where mask is 0 or not
    recorded (a row of all -inf after masking contributes nothing).
    """
    h = model.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state  # (B, T, C)
    logits = (h @ model.lm_head.weight.t()).float()                        # (B, T, N)
    logq = torch.log_softmax(logits, -1)
    ys = sub_idx[y]                                                         # (B, T) -1 outside
    ce_mask = mask.bool() & (ys >= 0)
    ce_tok = -logq.gather(-1, ys.clamp(min=0).unsqueeze(-1)).squeeze(-1)   # (B, T)
    ce = (ce_tok * ce_mask).sum() / ce_mask.sum().clamp(min=1)
    stats = {"ce": float(ce.detach()), "ntok": int(ce_mask.sum())}
    if kd_lp is None or kl_weight == 0:
        return ce, stats
    ks = sub_idx[kd_ids.long()]                                             # (B, T, k)
    lp = kd_lp.float().masked_fill(ks < 0, float("-inf"))
    valid = mask.bool() & torch.isfinite(lp).any(-1)                        # (B, T)
    p = torch.softmax(lp.masked_fill(~valid.unsqueeze(-1), 0.0), -1) * (ks >= 0)  # renormalised
    logq_k = logq.gather(-1, ks.clamp(min=0))                               # (B, T, k)
    logp = torch.log(p.clamp(min=1e-12))
    kl_tok = (p * (logp - logq_k)).sum(-1)                                  # (B, T)
    kl = (kl_tok * valid).sum() / valid.sum().clamp(min=1)
    stats["kl"] = float(kl.detach())
    return (1 - kl_weight) * ce + kl_weight * kl, stats


# ----------------------------------------------------------------------------------------------
# batches

def windows(data: dict, rows: list[int], seq_len: int) -> list[tuple[int, int]]:
    """(start, end) token spans covering the rows, at most seq_len + 1 tokens each, each starting
    at its row's beginning or overlapping the previous window so no label loses its context."""
    off = data["offsets"]
    out = []
    for r in rows:
        a, b = int(off[r]), int(off[r + 1])
        s = a
        while True:
            e = min(b, s + seq_len + 1)
            out.append((s, e))
            if e >= b:
                break
            s = e - 1 - seq_len // 4   # a quarter of context carried over
    return out


def make_batch(data: dict, spans: list[tuple[int, int]], pad: int):
    """Right-padded (B, T) inputs / labels / mask and (B, T, k) top-k for the labels."""
    T = max(e - s for s, e in spans) - 1
    B = len(spans)
    x = torch.full((B, T), pad, dtype=torch.long)
    y = torch.full((B, T), pad, dtype=torch.long)
    m = torch.zeros((B, T), dtype=torch.long)
    lp = torch.zeros((B, T, TOPK), dtype=torch.float16)
    ids = torch.zeros((B, T, TOPK), dtype=torch.long)
    trained = torch.tensor([k in TRAINED_KINDS for k in range(256)])
    for i, (s, e) in enumerate(spans):
        n = e - s - 1
        tok = data["tokens"][s:e].long()
        x[i, :n], y[i, :n] = tok[:-1], tok[1:]
        m[i, :n] = trained[data["kinds"][s + 1:e].long()]
        has = data["has_top"][s + 1:e].bool()
        lp[i, :n] = data["top_lp"][s + 1:e].masked_fill(~has.unsqueeze(-1), float("-inf"))
        ids[i, :n] = data["top_ids"][s + 1:e].long()
        corpus = data["kinds"][s + 1:e] == CORPUS
        y[i, :n] = torch.where(corpus, ids[i, :n, 0], y[i, :n])   # the target's argmax, not the text
    return x, y, m, lp, ids


# ----------------------------------------------------------------------------------------------
# 5. evaluation

@torch.inference_mode()
def agreement(model, target, data: dict, rows: list[int], sub_idx: torch.Tensor, pad: int,
              seq_len: int = 512, batch: int = 8) -> dict:
    """Teacher-forced top-1 agreement of the draft with the target's greedy token on the trained
    positions, per split, plus held-out loss. The target's greedy token is the recorded top-1 where a
    top-k was recorded, else the text itself where the target wrote it greedily (answers, code
    continuations; rows from the lean generation path record no top-k)."""
    greedy_kinds = torch.tensor([ANSWER, CODE_GEN], dtype=torch.uint8)
    res = {}
    for name, code in (("chat", 0), ("code", 1)):
        rs = [r for r in rows if int(data["is_code"][r]) == code]
        spans = windows(data, rs, seq_len)
        hit = tot = 0
        ce = kl = 0.0
        for i in range(0, len(spans), batch):
            x, y, m, lp, ids = make_batch(data, spans[i:i + batch], pad)
            greedy = torch.zeros_like(m, dtype=torch.bool)               # no top-k, greedy text
            for j, (s, e) in enumerate(spans[i:i + batch]):
                greedy[j, :e - s - 1] = ~data["has_top"][s + 1:e].bool() & torch.isin(data["kinds"][s + 1:e], greedy_kinds)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, st = draft_loss(model, x, y, lp, ids, sub_idx, m)
                h = model.model(input_ids=x).last_hidden_state
                pred = model.lm_head.head_ids[(h @ model.lm_head.weight.t()).argmax(-1)]
            keep = m.bool() & (((ids[..., 0] == y) & (lp[..., 0] > float("-inf"))) | greedy)  # y: the target's argmax
            hit += int(((pred == y) & keep).sum())
            tot += int(keep.sum())
            ce += st["ce"] * st["ntok"]
            kl += st.get("kl", 0.0) * st["ntok"]
        n = sum(1 for _ in spans)
        res[name] = {"agree": hit / max(tot, 1), "positions": tot, "windows": n}
    return res


def alpha_eval(draft_dir: str, tok, data: dict, held: list[int], n_chat: int = 10, n_code: int = 5,
               k: int = 4, max_new: int = 96, log=print) -> dict:
    """Acceptance rate at k greedy through speclab.generate on held-out prompts."""
    import speclab
    prompts = []
    for r in [r for r in held if int(data["is_code"][r]) == 0][:n_chat]:
        s, e = int(data["offsets"][r]), int(data["offsets"][r + 1])
        kinds = data["kinds"][s:e]
        n = int((kinds != ANSWER).sum())   # prompt = everything before the answer
        prompts.append(("chat", data["tokens"][s:s + n].tolist()))
    for r in [r for r in held if int(data["is_code"][r]) == 1][:n_code]:
        s, e = int(data["offsets"][r]), int(data["offsets"][r + 1])
        n = int((data["kinds"][s:e] == CODE_PREFIX).sum())
        prompts.append(("code", data["tokens"][s:s + n].tolist()))
    out = {"chat": [], "code": []}
    for kind, ids in prompts:
        r = speclab.generate(BASE, ids, method="draft-model", draft=draft_dir, k=k,
                             max_new_tokens=max_new, record=None)
        t = r.trace.totals
        out[kind].append((t.alpha, t.tau, t.drafted, t.accepted))
        log(f"  {kind}: alpha {t.alpha:.3f} tau {t.tau:.2f}")
    summary = {}
    for kind, v in out.items():
        if v:
            drafted, accepted = sum(x[2] for x in v), sum(x[3] for x in v)
            summary[kind] = {"alpha_mean": sum(x[0] for x in v) / len(v), "tau_mean": sum(x[1] for x in v) / len(v),
                             "alpha_pooled": accepted / max(drafted, 1), "n": len(v)}
    return summary


# ----------------------------------------------------------------------------------------------
# main

def get_args(argv):
    ap = argparse.ArgumentParser(prog="speclab.train.smollm2_draft", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="speclab-zoo/speclab_zoo/smollm2-draft")
    ap.add_argument("--data-dir", default="~/.cache/speclab/smollm2-draft-data")
    ap.add_argument("--gen-minutes", type=float, default=18.0, help="generation budget (2/3 chat, 1/3 code)")
    ap.add_argument("--chat-share", type=float, default=2 / 3)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--max-question", type=int, default=96)
    ap.add_argument("--max-answer", type=int, default=256)
    ap.add_argument("--max-code", type=int, default=192)
    ap.add_argument("--temperature", type=float, default=0.95)
    ap.add_argument("--openers", action="store_true",
                    help="start each chat question with an instruction opener (smollm2_data.OPENERS): "
                         "questions closer to what people type than plain Magpie's")
    ap.add_argument("--self-instruct", action="store_true",
                    help="chat questions written by the target as the next item of a list of hand-written seed "
                         "questions (smollm2_data.SEED_QUESTIONS), not sampled from the bare template (Magpie)")
    ap.add_argument("--corpus-minutes", type=float, default=6.0,
                    help="budget for the target's top-k on stdlib windows (one forward each)")
    ap.add_argument("--corpus-seq", type=int, default=256)
    ap.add_argument("--gen-only", action="store_true", help="stop after the data is cached")
    ap.add_argument("--extra-data", nargs="*", default=[], metavar="DIR",
                    help="data dirs of further --gen-only runs (use another --seed) to train on as well")
    add_options(ap, minutes=40.0, batch=8, seq_len=384, lr=3e-4, warmup=30,
                dev_help="a prompt set people wrote: each save also measures teacher-forced agreement on the "
                         "target's answers to it, and the draft is kept when (that + held-out code) / 2 improves "
                         "('' to select by the held-out split alone, which overstates agreement on such questions)")
    ap.add_argument("--head-size", type=int, default=8192)
    ap.add_argument("--head-topk-weight", type=float, default=0.1)
    ap.add_argument("--layers", default="0,1,29", help="target layers the draft starts from")
    ap.add_argument("--kl-weight", type=float, default=0.5)
    ap.add_argument("--save-every", type=float, default=6.0, help="minutes between checkpoints + draft saves")
    ap.add_argument("--ckpt", default=None, help="checkpoint dir (default: <data-dir>/ckpt-<layers>)")
    ap.add_argument("--eval-alpha", action="store_true", help="measure alpha at k=4 after training")
    return ap.parse_args(argv)


def main(argv=None):
    args = get_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from speclab.models import zoo
    from speclab.models.adapter import save_draft

    data_dir = Path(args.data_dir).expanduser()
    data_path = data_dir / "rows.safetensors"
    base, tok = zoo.load_shared(BASE)                       # bf16 here: generation runs in it
    specials = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    # 1. data
    if not data_path.exists():
        t0 = time.time()
        chat = gen_chat(base, tok, args.gen_minutes * args.chat_share, args.gen_batch, args.max_question,
                        args.max_answer, args.temperature, seed=args.seed,
                        openers=OPENERS if args.openers else (), self_instruct=args.self_instruct)
        code = gen_code(base, tok, args.gen_minutes * (1 - args.chat_share), args.gen_batch, args.max_code,
                        args.seed)
        rows = chat + code
        meta = {"chat_rows": len(chat), "code_rows": len(code), "gen_seconds": round(time.time() - t0),
                "tokens": sum(len(r.tokens) for r in rows),
                "generated": sum(sum(k in TRAINED_KINDS for k in r.kinds) for r in rows),
                "dtype": str(base.dtype), "args": vars(args)}
        save_rows(rows, data_path, meta)
        print(f"data: {json.dumps({k: v for k, v in meta.items() if k != 'args'})} -> {data_path}")
    else:
        print(f"data: reusing {data_path}")
    corpus_path = data_dir / "corpus.safetensors"
    if args.corpus_minutes > 0 and not corpus_path.exists():
        t0 = time.time()
        rows = gen_corpus_kd(base, tok, args.corpus_minutes, 8, args.corpus_seq, args.seed)
        save_rows(rows, corpus_path, {"rows": len(rows), "positions": len(rows) * (args.corpus_seq - 1),
                                      "seconds": round(time.time() - t0), "args": vars(args)})
    if args.gen_only:
        return
    data = load_rows(data_path)
    for extra in args.extra_data:                # more self-generated rows, written by later --gen-only runs
        data = merge(data, load_rows(Path(extra).expanduser() / "rows.safetensors"))
    if args.corpus_minutes > 0 and corpus_path.exists():
        data = merge(data, load_rows(corpus_path))
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    dev = []
    if args.dev_prompts:                          # the target's greedy answers to questions people wrote
        from speclab.train.dev_eval import answers, draft_agreement
        print(f"dev set: the target answers {args.dev_prompts} ...", flush=True)
        dev = answers(base, tok, args.dev_prompts)

    # 2. trimmed vocabulary, from the training rows' tokens only
    def toks(rows, gen_only):
        ts = []
        for r in rows:
            s, e = int(data["offsets"][r]), int(data["offsets"][r + 1])
            t = data["tokens"][s:e]
            ts.append(t[torch.isin(data["kinds"][s:e], torch.tensor(TRAINED_KINDS, dtype=torch.uint8))] if gen_only else t)
        return torch.cat(ts)
    V = base.config.vocab_size
    # rank by the training rows' tokens + the target's argmax at every recorded position + 0.1 x its
    # other top-8 ids (what it nearly wrote: 8x more evidence of its vocabulary than its text alone)
    pos = torch.cat([torch.arange(int(data["offsets"][r]), int(data["offsets"][r + 1])) for r in train_rows])
    top = data["top_ids"][pos][data["has_top"][pos].bool()].long()       # (n, k)
    counts = (torch.bincount(data["tokens"][pos].long(), minlength=V).float()
              + torch.bincount(top[:, 0], minlength=V) + args.head_topk_weight * torch.bincount(top.flatten(), minlength=V))
    head_ids = select_head_ids(None, args.head_size, specials, V, counts=counts, fill=True)
    sub_idx = subset_index(head_ids, V)
    held_gen = toks(held_rows, True)
    cov = coverage(held_gen, head_ids)
    cov_split = {name: coverage(toks([r for r in held_rows if int(data["is_code"][r]) == c], True), head_ids)
                 for name, c in (("chat", 0), ("code", 1))}
    print(f"head: {len(head_ids)} ids, held-out coverage of target-written tokens {cov:.4f} {cov_split}")

    # 3. the draft: fp32 master weights under bf16 autocast, on an fp32 copy of the base
    base32 = zoo.load(BASE, dtype="fp32")[0]
    layer_ids = [int(i) for i in args.layers.split(",")]
    model = init_draft(base32, head_ids, layer_ids).float().train()
    params = trainable(model)
    print(f"draft: layers {layer_ids}, {sum(p.numel() for p in params.values()) / 1e6:.2f}M trained params")
    opt = torch.optim.AdamW(list(params.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = Path(args.ckpt or data_dir / f"ckpt-{args.layers.replace(',', '-')}")
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "pos": 0, "log": []}
    if args.resume:
        state = resume_state(ckpt, Path(args.out), model, opt, state)
        # the layers do not depend on the head, so a new head keeps them, but its held-out scores
        # change with it; new rows (--extra-data) mean a new held-out split too
        if state.get("head_size") != len(head_ids) or args.extra_data:
            for key in ("best", "best_dev"):
                state.pop(key, None)
        if args.extra_data:                           # and a fresh cosine schedule over --minutes
            state["elapsed"] = 0.0
    state["head_size"] = len(head_ids)

    spans = windows(data, train_rows, args.seq_len)
    print(f"train: {len(train_rows)} rows, {len(spans)} windows; held out {len(held_rows)} rows")

    key = "best_dev" if dev else "best"            # what the kept draft is the best by

    def score(ev):                                 # chat (the dev set if any) and code, equally
        return ((ev["dev"] if dev else ev["chat"]["agree"]) + ev["code"]["agree"]) / 2

    def save(tag):
        """Checkpoint always; ship the draft only when held-out agreement did not drop (the data
        is small: a 3-layer draft can start memorising it)."""
        save_checkpoint(ckpt, model, opt, state)
        model.eval()
        ev = agreement(model, base32, data, held_rows, sub_idx, eos, args.seq_len)
        model.train()
        if dev:
            ev["dev"] = draft_agreement(model, dev)
        best = state.get(key, -1.0)
        if score(ev) >= best or tag == "final" and not Path(args.out, "config.json").exists():
            state[key] = score(ev)
            save_checkpoint(ckpt, model, opt, state)
            save_draft(model, args.out, BASE)    # the base tokenizer serves: nothing to ship
            shipped = f"draft -> {args.out}"
        else:
            shipped = f"draft kept (best {best:.4f})"
        state["log"].append({"step": state["step"], "heldout_chat": round(ev["chat"]["agree"], 4),
                             "heldout_code": round(ev["code"]["agree"], 4),
                             **({"dev_chat": round(ev["dev"], 4)} if dev else {})})
        print(f"[{tag}] step {state['step']}: held-out agreement chat {ev['chat']['agree']:.4f} "
              f"code {ev['code']['agree']:.4f}" + (f", {args.dev_prompts} {ev['dev']:.4f}" if dev else "")
              + f"; checkpoint {ckpt}; {shipped}", flush=True)

    if state["step"] == 0:
        ev0 = agreement(model.eval(), base32, data, held_rows, sub_idx, eos, args.seq_len)
        model.train()
        if dev:
            ev0["dev"] = draft_agreement(model, dev)
        if args.resume:                           # the weights in --out are the score to beat
            state[key] = score(ev0)
        state["initial_agreement"] = ev0
        print(f"held-out agreement before training: {json.dumps(ev0)}", flush=True)
    ema = None
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.save_every,
                      lambda: save("periodic"), "train")
    for idx in loop:
        x, y, m, lp, ids = make_batch(data, [spans[i] for i in idx], eos)
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, st = draft_loss(model, x, y, lp, ids, sub_idx, m, args.kl_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        step = state["step"] + 1                  # this step, once the loop counts it
        loop.bar.set_postfix(step=step, ep=state["epoch"], loss=f"{ema:.3f}", ce=f"{st['ce']:.3f}",
                             kl=f"{st.get('kl', 0):.3f}")
        if step % 50 == 0:
            state["log"].append({"step": step, "min": round(state["elapsed"] / 60, 2), "loss_ema": round(ema, 4),
                                 "ce": round(st["ce"], 4), "kl": round(st.get("kl", 0), 4)})
            print(f"step {step} ({state['elapsed'] / 60:.1f} min, epoch {state['epoch']}): "
                  f"loss {ema:.4f} ce {st['ce']:.4f} kl {st.get('kl', 0):.4f} lr {opt.param_groups[0]['lr']:.2e}",
                  flush=True)
    save("final")

    # 5. evaluation
    from speclab.models.heads import load_draft
    shipped = load_draft(args.out, base32, torch.float32)          # the best draft, as users get it
    ev = agreement(shipped, base32, data, held_rows, sub_idx, eos, args.seq_len)
    print(f"held-out teacher-forced top-1 agreement of {args.out}: {json.dumps(ev)}")
    summary = {"head_size": len(head_ids), "coverage_heldout": cov, "coverage_split": cov_split, "agreement": ev,
               "initial_agreement": state.get("initial_agreement"), "steps": state["step"],
               "train_minutes": round(state["elapsed"] / 60, 1), "log_tail": state["log"][-3:]}
    if args.eval_alpha:
        summary["alpha_k4"] = alpha_eval(args.out, tok, data, held_rows)
        print(f"alpha at k=4: {json.dumps(summary['alpha_k4'])}")
    (ckpt / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
