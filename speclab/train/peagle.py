"""Train P-EAGLE's parallel head (speclab/models/peagle.py) on the target's own text: `code-peagle`,
and SmolLM2 heads measured against `eagle-chain` on `smollm2-eagle`.

    speclab train peagle --target code-target --self-text 400 --out speclab/zoo/code-peagle --minutes 8
    speclab train peagle --target smollm2-135m --init-from smollm2-eagle --self-text 300 --out DIR --minutes 40

The text and features are Clover's and Falcon's (speclab/train/clover.py: `--data-dirs` sets and / or
`--self-text N`, the target's own greedy continuations, cached; plus the target's states after each
of the head's `--layers`, EAGLE-3's fusion). Each step is one teacher-forced pass: every position's
real entry reads the target's feature f_t and token t+1, and its K-1 mask slots run beside it
(FalconHead.train_forward, the mask each drafting forward sees). That is exactly what a round sees:
P-EAGLE drafts from the committed entries alone, all of them the target's own, so unlike Falcon's
later forwards no slot ever reads a feature the head predicted (no glancing pass is needed).

Loss, per slot d = 1..K (the token t+1+d): Falcon's and EAGLE's (speclab/train/falcon.py
`falcon_loss`): soft cross-entropy to the target's distribution + `--hard-weight` x cross-entropy to
its greedy token + `--reg-weight` x smooth L1 between the normed output and the target's feature,
the mean over slots. P-EAGLE trains KL alone and subsamples the deeper slots' positions (COD
sampling: depth d keeps about max(0.7^d, 0.2) of them) to bound memory on long sequences; at
speclab's window lengths every slot keeps every position.

`--init-from` an EAGLE head (or a Falcon or P-EAGLE head) copies its fusion, its layer(s) and its
trimmed vocabulary, so slot 1 starts as that head exactly and the mask state starts untrained.
Saves when the held-out agreement (mean over slots) is the best so far, with `speclab_train.json`
beside the head.
"""
from __future__ import annotations

from pathlib import Path

import torch

from speclab.train.clover import describe, head_parser, save_head, text_and_states, train_and_held_windows
from speclab.train.falcon import batch_of, evaluate, falcon_loss, init_state
from speclab.train.loop import (BudgetLoop, add_options, command_line, cosine_lr, held_out, optimizer_step,
                                set_lr)


def get_args(argv):
    ap = head_parser("peagle", __doc__)
    add_options(ap, minutes=40.0, batch=8, seq_len=128, lr=1e-3, warmup=20, dev_help="unused: the head is kept "
                "by held-out agreement on the training text's own split")
    ap.add_argument("--k", type=int, default=4, help="K: tokens the one forward drafts (1 real + K-1 mask slots)")
    ap.add_argument("--n-layers", type=int, default=1, help="the head's transformer layers")
    ap.add_argument("--ffn", type=int, default=None, help="their MLP width (default: the target's)")
    ap.add_argument("--layers", default=None, help="target layers whose states feed the head, e.g. 8,16,30 "
                    "(EAGLE-3's fusion; default: the last only; --init-from an EAGLE head takes its own)")
    ap.add_argument("--head-size", type=int, default=12288, help="trimmed vocabulary: most frequent ids")
    ap.add_argument("--mask-token-id", type=int, default=None, help="the token whose embedding the mask "
                    "embedding starts from (default: the tokenizer's pad token, else its eos)")
    ap.add_argument("--reg-weight", type=float, default=0.5, help="smooth L1 weight on the predicted features")
    ap.add_argument("--hard-weight", type=float, default=0.1, help="CE weight on the target's greedy token")
    ap.add_argument("--init-from", default=None, help="start from the EAGLE, Falcon or P-EAGLE head in this "
                    "directory or zoo name (its fusion, layers and trimmed vocabulary)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evals + saves")
    args = ap.parse_args(argv)
    if args.k < 2 or args.n_layers < 1 or args.minutes <= 0:
        ap.error("--k must be >= 2, --n-layers >= 1 and --minutes > 0")
    return args


def build(base, head_ids, args, layers, mask_token_id: int):
    from speclab.models.peagle import PEagleHead, peagle_config
    cfg = peagle_config(base.config, args.n_layers, args.k, args.ffn, layers, mask_token_id)
    head = PEagleHead(base, cfg, head_ids)
    with torch.no_grad():               # each layer starts as the identity: slot 1 as the fused feature's guess
        for layer in head.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    for p in head.lm_head.parameters():
        p.requires_grad_(False)
    return head.float().train()


def mask_token(tok, given: int | None) -> int:
    if given is not None:
        return given
    for t in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None)):
        if t is not None:
            return int(t)
    return 0


def main(argv=None):
    from speclab.models import zoo
    from speclab.train.checkpoint import save_checkpoint, start, start_from, trainable
    from speclab.train.heads import parse_layers
    from speclab.train.smollm2_data import split_rows
    from speclab.train.vocab import text_head_ids

    argv, args = command_line(get_args, argv)
    out = Path(args.out or "speclab-zoo/speclab_zoo/smollm2-peagle")
    init, init_cfg = init_state(args.init_from)
    if init is not None:
        init.pop("mask", None)                                        # a Falcon head's per-slot entries
    base, tok = zoo.load(args.target)
    L = base.config.num_hidden_layers
    layers = (init_cfg or {}).get("eagle_layers") or parse_layers(args.layers, L)
    data, X = text_and_states(base, tok, args, layers or [L])
    base = zoo.load(args.target, dtype="fp32")[0]                     # fp32 master weights
    for p in base.parameters():
        p.requires_grad_(False)
    train_rows, held_rows = split_rows(data, args.held_frac, args.seed)
    head_ids = init.pop("head_ids") if init else text_head_ids(tok, data, train_rows, args.head_size,
                                                               base.config.vocab_size)
    head = build(base, head_ids, args, layers, mask_token(tok, args.mask_token_id))
    start_from(head, init, args.init_from)
    W_sub = head.lm_head.weight.detach().float()
    params = list(trainable(head).values())
    describe("peagle", params, f"K={head.k}, {len(head.layers)} layers", head_ids, train_rows, held_rows, data)
    opt, ckpt, state = start(head, params, out, args.lr, args.resume)
    spans, held = train_and_held_windows(data, train_rows, held_rows, args.seq_len)

    def save():
        ev = evaluate(head, data, X, held, W_sub, args)
        if held_out(state, ev):
            save_head(head, out, "peagle", argv, args, state, data, ev)
        save_checkpoint(ckpt, head, opt, state)

    if not state["log"]:
        save()                                                    # step 0: the head it starts from
    autocast = zoo.native_bf16(torch.device("cpu"))
    loop = BudgetLoop(state, len(spans), args.batch, args.seed, args.minutes, args.eval_every, save, "train peagle")
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        tok_b, fin, f, lp, m = batch_of(data, X, [spans[j] for j in idx], head, W_sub)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, _, st = falcon_loss(head, fin, f, tok_b, lp, m, args.reg_weight, args.hard_weight)
        optimizer_step(opt, loss, params)
        loop.bar.set_postfix(loss=f"{float(loss.detach()):.3f}",
                             **{key: f"{v:.2f}" for key, v in st.items() if key.startswith("acc")})
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
