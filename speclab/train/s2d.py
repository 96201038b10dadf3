"""Train S2D's sorted draft (Kavehzadeh et al. 2024): one draft LM whose first l layers, for each l of
its sorted depths, are a draft of their own through the shared final norm and head. `code-s2d`, and
the second toy target it serves beside code-target, `code-target-s`.

    speclab train s2d --init-from code-draft --distill-from code-draft --kl-weight 0.8 \\
        --out speclab/zoo/code-s2d --minutes 12 --batch 4 --threads 1 --eval-targets code-target
    speclab train s2d --second-target --out speclab/zoo/code-target-s --minutes 10 --threads 1 \\
        --seq-len 512 --batch 4 --lr 1e-3 --warmup 20

SoFT (sorted fine-tuning): every step runs the draft once over corpus windows, keeps the hidden
state after each sorted depth l (1-based layers), and sums the sub-drafts' losses, each through the
shared norm and head:

    loss = mean over l of  (1 - w) CE(head(norm(h_l)), next token) + w KL(p_teacher || q_l)

(w = --kl-weight with a teacher, else 0; the shallower depths on every other position, as the target's
early-exit losses are, to keep the extra head passes cheap). The teacher: `self` (the default) is
the draft's own deepest sub-draft, detached, for the shallower depths (the deepest then trains on CE
alone); a model costs its forward every step. code-s2d's is code-draft itself, frozen: every depth
learns the distribution code-draft was distilled to (code-target's), and the deepest stays near it. The held-out numbers at each
--eval-every: per depth, the cross-entropy on held-out stdlib code and, per --eval-targets target,
the top-1 agreement of the sub-draft with that target's greedy token (the greedy acceptance rate a
chain drafted at that depth would see: which depth serves which target). The best mean agreement
is saved: fp16 safetensors, config.json naming the depths (`speclab_sorted_depths`) and
speclab_train.json (the command, steps, the curve, the held-out table).

--second-target makes the second toy target, code-target-s, of another size than code-target:
--grow-from (code-draft) grown to --layers (6) layers, each new layer a copy of the last with its
output projections zero (the grown model starts computing exactly what code-draft does), then
trained on the corpus by speclab.train.ar.train_lm with the teacher's KL (code-target unless
--distill-from names another): a smaller sibling of code-target, for one sorted draft to serve both.
(From scratch, 10 minutes of one busy core train a 2.6M-parameter model to a loss near 6, whose
greedy text repeats one token: no target worth serving.)
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.loop import add_threads_and_seed, command_line, cosine_lr, set_lr

def sub_draft_logits(model, x: torch.Tensor, depths: list[int], stride: int = 2) -> dict[int, torch.Tensor]:
    """{depth l: logits (B, T', V)} of each sub-draft over ids x (B, T): the deepest on every position,
    the shallower on every `stride`-th (T' = ceil(T / stride))."""
    from speclab.train.ar import ExitCapture
    L = model.config.num_hidden_layers
    cap = ExitCapture(model, [l for l in depths if l < L])
    try:
        out = {L: model(input_ids=x).logits} if L in depths else {}
        if L not in depths:
            model(input_ids=x)
        for l, h in cap.out.items():
            out[l] = model.lm_head(model.model.norm(h[:, ::stride]))
    finally:
        for h in cap.handles:
            h.remove()
    return out


def soft_loss(model, x, y, depths, teacher=None, kl_weight=0.5) -> tuple[torch.Tensor, dict]:
    """SoFT's loss over a batch (x, y: (B, T)): the mean over sorted depths of each sub-draft's loss."""
    L = model.config.num_hidden_layers
    logits = sub_draft_logits(model, x, depths)
    p_log = None
    if teacher == "self":           # the deepest sub-draft teaches the shallower ones (its own loss: CE)
        p_log = F.log_softmax(logits[L].detach().float(), -1)                       # (B, T, V)
    elif teacher is not None:
        with torch.no_grad():
            p_log = F.log_softmax(teacher(input_ids=x).logits.float(), -1)          # (B, T, V)
    total, parts = 0.0, {}
    for l, z in logits.items():
        s = 1 if l == L else 2
        yy = y[:, ::s]
        ce = F.cross_entropy(z.flatten(0, 1).float(), yy.flatten())
        loss = ce
        if p_log is not None and not (teacher == "self" and l == L):
            kl = F.kl_div(F.log_softmax(z.float(), -1).flatten(0, 1), p_log[:, ::s].flatten(0, 1),
                          log_target=True, reduction="batchmean")
            loss = (1 - kl_weight) * ce + kl_weight * kl
        total = total + loss / len(logits)
        parts[f"ce{l}"] = float(ce.detach())
    return total, parts


@torch.no_grad()
def evaluate(model, held: torch.Tensor, depths: list[int], targets: dict) -> dict:
    """Held-out windows held (N, T+1): per depth its cross-entropy, and per target (name -> model) the
    share of positions where the sub-draft's argmax is the target's."""
    model.eval()
    x, y = held[:, :-1], held[:, 1:]
    logits = sub_draft_logits(model, x, depths, stride=1)
    out = {"ce": {str(l): round(float(F.cross_entropy(z.flatten(0, 1), y.flatten())), 4) for l, z in logits.items()}}
    for name, t in targets.items():
        greedy = t(input_ids=x).logits.argmax(-1)                                     # (N, T)
        out[name] = {str(l): round(float((z.argmax(-1) == greedy).float().mean()), 4) for l, z in logits.items()}
    model.train()
    return out


def save_sorted(model, tokenizer, out: Path, depths: list[int]) -> None:
    """fp16 safetensors + config (its sorted depths), each file renamed into place."""
    import copy

    from speclab.train.ar import save_tokenizer
    out.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    half = copy.deepcopy(model).half()
    half.config.dtype = "float16"
    half.config.speclab_sorted_depths = list(depths)
    half.save_pretrained(str(tmp), safe_serialization=True)
    for f in tmp.iterdir():
        f.replace(out / f.name)
    tmp.rmdir()
    save_tokenizer(tokenizer, out)
    print(f"saved {out}", flush=True)


def windows(stream: torch.Tensor, n: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows (n, T+1) of a token stream."""
    starts = torch.randint(0, len(stream) - T - 1, (n,), generator=gen).tolist()
    return torch.stack([stream[s:s + T + 1] for s in starts])


def grown(base_dir: str, n_layers: int, out: Path):
    """`base_dir`'s Llama with layers appended up to n_layers, written to `out`: each new layer starts
    as a copy of the base's last with its output projections (o_proj, down_proj) zero, so it adds
    nothing to the residual stream and the grown model computes exactly what the base does."""
    from transformers import LlamaForCausalLM
    base = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = base.config
    cfg.num_hidden_layers = n_layers
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(base.state_dict(), strict=False)
    last = base.model.layers[-1].state_dict()
    with torch.no_grad():
        for layer in model.model.layers[len(base.model.layers):]:
            layer.load_state_dict(last)
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(str(out))
    return model


def train_second_target(args, argv) -> int:
    """code-target-s: `--grow-from` (code-draft) grown to --layers layers, then trained on the corpus
    with the teacher's KL (--distill-from; its default here is code-target): a smaller sibling of code-target
    (speclab.train.ar.train_lm's loop: 0.5 KL + 0.5 CE)."""
    import json
    import tempfile

    from speclab.models import zoo
    from speclab.train.ar import TrainConfig, train_lm
    from speclab.train.checkpoint import write_json
    name = "code-target" if args.distill_from == "self" else args.distill_from
    teacher = None if name == "none" else zoo.resolve(name)
    cfg = TrainConfig(minutes=args.minutes, seq_len=args.seq_len, batch_size=args.batch, lr=args.lr,
                      warmup_steps=args.warmup, threads=args.threads, max_steps=args.max_steps or None,
                      seed=args.seed, checkpoint_minutes=1e9, distill_from=teacher)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        grown(zoo.resolve(args.grow_from), args.layers, Path(tmp))
        train_lm(out, zoo.tokenizer_dir(zoo.resolve("code-target")), {}, cfg, init_from=tmp)
    shutil.rmtree(out / "checkpoint", ignore_errors=True)    # the run's resume state stays out of the zoo
    rec = json.loads((out / "speclab_train.json").read_text())
    rec["train"]["distill_from"] = None if teacher is None else name       # the zoo name, not this machine's path
    write_json(out / "speclab_train.json", {"command": shlex.join(["speclab", "train", "s2d", *argv]),
                                            "grown_from": args.grow_from, **rec})
    return 0


def get_args(argv):
    ap = argparse.ArgumentParser(prog="speclab train s2d", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--second-target", action="store_true", help="train the small second toy target instead")
    ap.add_argument("--init-from", default="code-draft", help="the draft the sorted draft starts from")
    ap.add_argument("--grow-from", default="code-draft", help="--second-target: the model it is grown from")
    ap.add_argument("--layers", type=int, default=6, help="--second-target: its layer count")
    ap.add_argument("--distill-from", default="self", help="teacher for the KL term: 'self' (the draft's own "
                    "deepest sub-draft, for the shallower ones), a model, or 'none' (CE only)")
    ap.add_argument("--kl-weight", type=float, default=0.5)
    ap.add_argument("--depths", default="all", help="sorted depths, e.g. 1,2,3,4 (default: every depth)")
    ap.add_argument("--eval-targets", default="code-target", help="targets whose agreement is measured per depth")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--eval-every", type=float, default=2.0, help="minutes between held-out evaluations")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--held-windows", type=int, default=16)
    ap.add_argument("--limit-texts", type=int, default=0, help="read only this many corpus files (tests)")
    ap.add_argument("--corpus-root", default=None, help="a folder of .py files in place of the standard library "
                    "(split by module as the stdlib is: speclab/train/corpus.py)")
    add_threads_and_seed(ap, threads=1)
    return ap.parse_args(argv)


def parse_depths(spec: str, L: int) -> list[int]:
    if spec == "all":
        return list(range(1, L + 1))
    try:
        depths = sorted({int(d) for d in spec.split(",")})
    except ValueError:
        depths = []
    if not depths or not all(1 <= d <= L for d in depths):
        raise SystemExit(f"--depths must be 'all' or layer counts in 1..{L} like 1,2,{L}, got {spec!r}")
    return depths


def main(argv=None):
    from itertools import islice

    from speclab.models import zoo
    from speclab.train.ar import token_stream
    from speclab.train.corpus import iter_texts

    argv, args = command_line(get_args, argv)
    if args.second_target:
        return train_second_target(args, argv)
    model, tok = zoo.load(args.init_from, device="cpu", dtype="fp32")
    model.train()
    depths = parse_depths(args.depths, model.config.num_hidden_layers)
    teacher = (None if args.distill_from == "none" else "self" if args.distill_from == "self"
               else zoo.load(args.distill_from, device="cpu", dtype="fp32")[0])
    targets = {n: zoo.load(n, device="cpu", dtype="fp32")[0] for n in args.eval_targets.split(",") if n}
    lim = args.limit_texts or None
    stream = token_stream(tok, islice(iter_texts("train", args.corpus_root), lim))
    held_stream = token_stream(tok, islice(iter_texts("heldout", args.corpus_root), lim))
    gen = torch.Generator().manual_seed(args.seed)
    held = windows(held_stream, args.held_windows, args.seq_len, torch.Generator().manual_seed(args.seed + 1))
    print(f"s2d: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, depths {depths}, "
          f"{len(stream):,} train tokens, {held.numel():,} held out", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state = {"step": 0, "log": [], "best": -float("inf")}

    def save_if_best(minutes: float):
        """Evaluate; the weights when the mean agreement over targets and depths is the best so far
        (no targets: the lowest mean cross-entropy); speclab_train.json (the whole curve) always."""
        from speclab.train.checkpoint import write_json
        ev = evaluate(model, held, depths, targets)
        state["log"].append({"step": state["step"], "min": round(minutes, 1), **ev})
        print(f"held-out step {state['step']}: {ev}", flush=True)
        score = (sum(sum(v.values()) / len(v) for k, v in ev.items() if k != "ce") / len(targets) if targets
                 else -sum(ev["ce"].values()) / len(ev["ce"]))
        if score >= state["best"] or state["step"] == 0:
            state["best"], state["best_step"], state["best_ev"] = score, state["step"], ev
            save_sorted(model, tok, Path(args.out), depths)
        write_json(Path(args.out) / "speclab_train.json", {
            "command": shlex.join(["speclab", "train", "s2d", *argv]), "options": vars(args), "depths": depths,
            "steps": state["step"], "saved_step": state["best_step"], "held_out": state["best_ev"],
            "curve": state["log"]})

    save_if_best(0.0)                                              # step 0: the draft it starts from
    t0, last = time.time(), time.time()
    budget = args.minutes * 60
    while time.time() - t0 < budget and not (args.max_steps and state["step"] >= args.max_steps):
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, (time.time() - t0) / budget))
        b = windows(stream, args.batch, args.seq_len, gen)
        loss, parts = soft_loss(model, b[:, :-1], b[:, 1:], depths, teacher, args.kl_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        if state["step"] % 10 == 0:
            print(f"step {state['step']} {time.time() - t0:.0f}s loss {float(loss):.3f} {parts}", flush=True)
        if time.time() - last > args.eval_every * 60:
            save_if_best((time.time() - t0) / 60)
            last = time.time()
    save_if_best((time.time() - t0) / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
