"""dParallel: certainty-forcing distillation of a masked-diffusion LM (reference note A.11; Chen et
al. 2025, czg1225/dParallel), for the entropy-threshold decoding it is made for (`dllm-dparallel`).

    speclab train dparallel --dllm digits-dllm --out speclab/zoo/digits-dparallel --minutes 8 --threads 1
    speclab train dparallel --dllm smollm2-dllm --out DIR --minutes 40 --threads 1

  1. trajectories  the dLLM's own greedy one-token-per-step decodes (`dllm-lowconf`) of training-side
                   prompts (digits: the training split; a chat model: learn2pd's training prompts, never
                   the bench's chat or code-edit sets), during the first --data-minutes; cached in the
                   user cache (--data-cache) so a second run starts training at once; `--data
                   self-text` takes an adapter's AR base's cached greedy text instead (no decoding)
  2. corruption    fixed t = 0.5 inside one semi-AR block m: each answer slot of block m is masked with
                   probability t, and the row goes in twice, with that mask and with its complement, so
                   every slot of the block is trained once; blocks before m are clean, blocks after it
                   all masked (and not trained). On a block-causal dLLM (smollm2-dllm) every block of a
                   row is block m at once: its noisy copy of a block sees only the clean copy of the
                   blocks before it (smollm2_dllm.make_batch's layout), so the blocks are independent
  3. loss          CE over the masked slots + 2.0 x the mean entropy of softmax(logits / 0.5) over the
                   masked slots whose argmax already is the trajectory's token (certainty is forced only
                   where the model is right); a chat adapter adds --ar-weight x its clean-copy AR loss,
                   as its own trainer does (the first slot of a block is an AR prediction); a toy dLLM,
                   all of whose weights train, adds --keep-weight x its own LLaDA loss on the same
                   trajectories (at t = 0.5 alone it forgets how to start from an all-masked block)
  4. what trains   a toy dLLM: every weight (fp32; saved fp16 beside its tokenizer); a LoRA adapter
                   (smollm2-dllm): its LoRA and mask embedding, started from the adapter's own weights
                   and saved as the same kind of adapter over the same base
  5. held out      a share of the trajectories (--held-frac): masked CE and accuracy, mean entropy, and
                   the share of masked slots that are certain (entropy <= --certain nats, the decoding
                   threshold) and right, or certain and wrong; every --eval-every minutes, keeping the
                   weights with the best certain_right - certain_wrong

Never in CI; tests/test_dparallel.py runs it for two steps on a few digits prompts.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.loop import (BudgetLoop, add_threads_and_seed, command_line, cosine_lr, held_out, optimizer_step,
                                set_lr)


def get_args(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train dparallel",
                                 description="certainty-forcing distillation of a diffusion LM (dParallel)")
    ap.add_argument("--dllm", default="digits-dllm", help="the diffusion LM to distil (a toy zoo dLLM or a "
                                                          "LoRA adapter such as smollm2-dllm)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=8.0, help="the whole budget, trajectories included")
    ap.add_argument("--data-minutes", type=float, help="at most this much of it decoding trajectories "
                                                        "(default: a third)")
    ap.add_argument("--prompts", type=int, default=4000, help="at most this many training prompts")
    ap.add_argument("--data", choices=("own", "self-text"), default="own",
                    help="own: the dLLM's one-per-step decodes; self-text: an adapter's AR base's cached greedy "
                         "text (clover's --self-text set)")
    ap.add_argument("--self-text", type=int, default=240, help="--data self-text: its code rows (chat: 120)")
    ap.add_argument("--max-new", type=int, default=96, help="--data self-text: its tokens per answer")
    ap.add_argument("--max-prompt", type=int, default=64, help="--data self-text: a prompt's last tokens kept (the "
                                                                "answers are cut to --gen-length)")
    ap.add_argument("--data-cache", default="auto", help="trajectories file ('auto': the user cache, 'none': "
                                                         "not cached)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop at this step (0: the budget decides)")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evaluations")
    ap.add_argument("--gen-length", type=int, help="answer slots (digits: 8, else 64)")
    ap.add_argument("--block-length", type=int, help="semi-AR block (digits: 8, else 32)")
    ap.add_argument("--batch", type=int, help="trajectories a step, each twice (digits: 64, else 4)")
    ap.add_argument("--lr", type=float, help="digits: 3e-4; an adapter: 1e-4")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--t", type=float, default=0.5, help="the fixed mask ratio inside block m")
    ap.add_argument("--entropy-weight", type=float, default=2.0)
    ap.add_argument("--entropy-temperature", type=float, default=0.5)
    ap.add_argument("--certain", type=float, default=0.5, help="nats: a slot at or under it is certain")
    ap.add_argument("--ar-weight", type=float, default=0.5, help="an adapter's clean-copy AR loss weight")
    ap.add_argument("--keep-weight", type=float, default=1.0, help="a toy dLLM: its own objective (LLaDA's, "
                                                                   "t ~ U(0, 1)) on the same trajectories")
    ap.add_argument("--held-frac", type=float, default=0.1)
    add_threads_and_seed(ap, threads=1)
    args = ap.parse_args(argv)
    if not 0 < args.t < 1:
        ap.error(f"--t must be in (0, 1), got {args.t}")
    return args


# ----------------------------------------------------------------------------------------------
# 1. trajectories

def training_prompts(dllm: str, tok, n: int, seed: int) -> list[list[int]]:
    """Token ids of training-side prompts: digits' training split for a digits model, else learn2pd's
    (chat questions in the chat template, code-edit-shaped prompts and prefixes, training side)."""
    if "digits" in dllm:
        from speclab.train import digits
        rng = random.Random(seed)
        return [tok((digits.add_example if i % 2 else digits.sum_example)(rng)[0])["input_ids"] for i in range(n)]
    from speclab.train.learn2pd import training_prompts as lp
    return lp(tok, n // 3, n // 3, n - 2 * (n // 3), seed)


@torch.inference_mode()
def trajectories(model, tok, prompts, G: int, B: int, seconds: float, log=print) -> list[tuple[list, list]]:
    """(prompt ids, answer ids) per prompt: the model's greedy one-per-step decode (up to its end of
    text on a chat model) until `seconds` pass."""
    from tqdm.auto import tqdm
    from speclab.decoding.diffusion import denoise
    from speclab.decoding.dllm_policies import LowConfidence
    from speclab.models.dllm import make_denoiser
    den, eos = make_denoiser(model), (tok.eos_token_id if getattr(model.config, "speclab_block_causal", False) else None)
    out, t0 = [], time.time()
    for ids in tqdm(prompts, desc="trajectories", unit="prompt", mininterval=10):
        if time.time() - t0 > seconds:
            log(f"trajectories: the budget is spent after {len(out)} of {len(prompts)} prompts", flush=True)
            break
        ans, _, _ = denoise(den, ids, LowConfidence(), G, B, record=None, eos_id=eos, eos_stop=eos is not None)
        out.append((list(ids), list(ans)))
    return out


def cached(path: Path | None, make) -> list[tuple[list, list]]:
    """The trajectories in `path` (safetensors: flat ids, offsets, prompt lengths), else make() saved there."""
    from safetensors.torch import load_file, save_file
    if path is not None and path.exists():
        d = load_file(str(path))
        ids, off, plen = d["ids"].tolist(), d["offsets"].tolist(), d["prompt_len"].tolist()
        print(f"trajectories: {len(plen)} from {path}")
        return [(ids[a:a + p], ids[a + p:b]) for a, b, p in zip(off, off[1:], plen)]
    rows = make()
    if path is not None and rows:
        path.parent.mkdir(parents=True, exist_ok=True)
        off = [0]
        for p, a in rows:
            off.append(off[-1] + len(p) + len(a))
        save_file({"ids": torch.tensor([t for p, a in rows for t in p + a]), "offsets": torch.tensor(off),
                   "prompt_len": torch.tensor([len(p) for p, _ in rows])}, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").replace(path)
    return rows


def base_text(part, args) -> list[tuple[list, list]]:
    """(prompt, answer) rows of an adapter's AR base's own greedy text, shuffled: clover's self-text set
    (answers to the seed questions and continuations of training-split code prefixes, bf16), the text
    the adapter was trained to write, at no decoding cost. It must be cached already."""
    import json
    from speclab.train.clover import CACHE
    from speclab.train.specdecpp import cached_text
    if not isinstance(part, Adapter):
        raise SystemExit("--data self-text is for a LoRA adapter (its AR base wrote the text); a toy dLLM: --data own")
    name = Path(part.info["base"]).name
    cache = Path(CACHE).expanduser() / f"{name}-text.safetensors"
    key = {"target": part.info["base"], "dtype": "torch.bfloat16", "chat": 120, "code": args.self_text,
           "max_new": args.max_new, "seed": args.seed}
    meta = cache.with_suffix(".json")
    if not meta.exists() or json.loads(meta.read_text()) != key:
        raise SystemExit(f"no self-text set for {key} in {cache}: write it first with `speclab train clover "
                         f"--self-text {args.self_text} --max-new {args.max_new}`, or use --data own")

    def missing():
        raise AssertionError("unreachable: the key matched")
    rows = [(r[:n][-args.max_prompt:], r[n:][:args.gen_length]) for r, n in cached_text(cache, key, missing)]
    random.Random(args.seed).shuffle(rows)
    return rows


# ----------------------------------------------------------------------------------------------
# 2-3. corruption and the loss

def certainty_forcing(logits: torch.Tensor, y: torch.Tensor, weight: float = 2.0, temperature: float = 0.5,
                      certain: float = 0.5) -> tuple[torch.Tensor, dict]:
    """logits (M, V) at masked slots, y (M,) the trajectory's tokens -> CE + weight x the mean entropy
    of softmax(logits / temperature) over the slots whose argmax == y; and the held-out numbers."""
    ce = F.cross_entropy(logits, y)
    right = logits.argmax(-1) == y
    logp = (logits[right] / temperature).log_softmax(-1)
    forced = -(logp.exp() * logp).sum(-1).mean() if right.any() else ce * 0
    with torch.no_grad():
        lp = logits.log_softmax(-1)
        h = -(lp.exp() * lp).sum(-1)
        sure = h <= certain
    return ce + weight * forced, {"masked_ce": ce.item(), "masked_acc": right.float().mean().item(),
                                  "entropy": h.mean().item(), "certain_right": (sure & right).float().mean().item(),
                                  "certain_wrong": (sure & ~right).float().mean().item()}


def toy_batch(rows, G: int, B: int, mask_id: int, t: float, gen: torch.Generator):
    """Each (prompt, answer) twice: block m ~ U over the answer's blocks masked at rate t (then its
    complement), earlier blocks clean, later ones all masked. Yields (x_t, x, trained) per group of
    equal length rows (a bidirectional canvas has no padding)."""
    groups: dict[int, list] = {}
    for p, a in rows:
        groups.setdefault(len(p) + G, []).append((p, a))
    for L, grp in groups.items():
        x = torch.tensor([p + a for p, a in grp])
        P = torch.tensor([len(p) for p, _ in grp])[:, None]
        slot = torch.arange(L)[None] - P                                   # (n, L) answer slot index
        m = torch.randint(0, G // B, (len(grp), 1), generator=gen)
        block = (slot >= m * B) & (slot < (m + 1) * B)
        drawn = block & (torch.rand(x.shape, generator=gen) < t)
        later = slot >= (m + 1) * B
        for trained in (drawn, block & ~drawn):
            yield torch.where(trained | later, torch.full_like(x, mask_id), x), x, trained


def pair_masks(n: int, t: float, gen: torch.Generator):
    """make_batch's mask_fn for 2n rows (n trajectories, then the same again): row i < n masks each
    maskable slot with probability t, row n + i the complement of row i."""
    drawn: dict[int, torch.Tensor] = {}

    def mask_fn(i, maskable):
        if i < n:
            drawn[i] = maskable & (torch.rand(len(maskable), generator=gen) < t)
            return drawn[i]
        return maskable & ~drawn[i - n]
    return mask_fn


def as_data(rows, eos_id: int) -> tuple[dict, list]:
    """Trajectories as smollm2_dllm's data and spans: the prompt TEMPLATE (never masked), the answer
    ANSWER; a span ends its answer (make_batch pads a block of end of text) when it ends with eos_id."""
    from speclab.train.smollm2_data import ANSWER, TEMPLATE
    toks, kinds, spans, s = [], [], [], 0
    for p, a in rows:
        toks += p + a
        kinds += [TEMPLATE] * len(p) + [ANSWER] * len(a)
        spans.append((s, s + len(p) + len(a), len(p), bool(a) and a[-1] == eos_id))
        s += len(p) + len(a)
    return {"tokens": torch.tensor(toks), "kinds": torch.tensor(kinds, dtype=torch.uint8)}, spans


# ----------------------------------------------------------------------------------------------
# 4. the two kinds of dLLM

class Toy:
    """A toy zoo dLLM, every weight trained."""

    def __init__(self, args):
        from transformers import AutoTokenizer, LlamaForCausalLM
        from speclab.models import zoo
        where = zoo.resolve(args.dllm)
        self.model = LlamaForCausalLM.from_pretrained(where, dtype=torch.float32)
        self.tok = AutoTokenizer.from_pretrained(zoo.tokenizer_dir(where))
        self.decoder, self.mask_id = self.model, self.model.config.mask_token_id
        self.params = list(self.model.parameters())

    def loss(self, rows, args, gen):
        from speclab.models.dllm import bidirectional_logits
        logits, ys = [], []
        for x_t, x, trained in toy_batch(rows, args.gen_length, args.block_length, self.mask_id, args.t, gen):
            logits.append(bidirectional_logits(self.model, x_t)[trained].float())
            ys.append(x[trained])
        loss, m = certainty_forcing(torch.cat(logits), torch.cat(ys), args.entropy_weight, args.entropy_temperature,
                                    args.certain)
        if args.keep_weight and self.model.training:
            loss = loss + args.keep_weight * self.keep(rows, args, gen)
        return loss, m

    def keep(self, rows, args, gen):
        """dllm.masked_diffusion_loss on the trajectories' answers: every mask ratio stays in reach (a full
        fine-tune at t = 0.5 alone forgets the all-masked start of a block)."""
        from speclab.train.dllm import masked_diffusion_loss
        tot = 0.0
        for L in {len(p) + len(a) for p, a in rows}:
            grp = [(p, a) for p, a in rows if len(p) + len(a) == L]
            x = torch.tensor([p + a for p, a in grp])
            maskable = torch.arange(L)[None] >= torch.tensor([len(p) for p, _ in grp])[:, None]
            tot = tot + masked_diffusion_loss(self.model, x, maskable, self.mask_id, gen) * len(grp) / len(rows)
        return tot

    def save(self, out: Path, extra: dict):
        from speclab.train.dllm import _export
        _export(self.model, self.tok, out, extra)


class Adapter:
    """A LoRA dLLM adapter (smollm2-dllm): the base frozen in bf16, its LoRA and mask embedding trained."""

    def __init__(self, args):
        from safetensors.torch import load_file
        from speclab.models import zoo
        from speclab.models.adapter import adapter_info
        from speclab.models.lora import add_lora
        from speclab.train.checkpoint import load_matching
        from speclab.train.smollm2_dllm import MASK_TOKEN
        where = Path(zoo.resolve(args.dllm))
        self.info = adapter_info(where)
        self.decoder, self.tok = zoo.load(args.dllm, dtype="bf16")        # decodes the trajectories
        self.model, _ = zoo.load(self.info["base"], dtype="bf16")
        self.mask_id = self.tok.convert_tokens_to_ids(MASK_TOKEN)
        for p in self.model.parameters():
            p.requires_grad_(False)
        add_lora(self.model, self.info["rank"], self.info["lora_scale"] * self.info["rank"])
        for n, p in self.model.named_parameters():
            if "lora_" in n:
                p.data = p.data.float()
        shipped = load_file(str(where / "model.safetensors"))
        got = load_matching(self.model, shipped)
        self.model.mask_vec = torch.nn.Parameter(shipped["mask_embedding"].float().clone())
        print(f"started from {args.dllm}: {len(got)} LoRA tensors and its mask embedding")
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def loss(self, rows, args, gen):
        from speclab.train.smollm2_dllm import make_batch, trained_logits
        data, spans = as_data(rows, self.tok.eos_token_id)
        b = make_batch(data, spans + spans, args.block_length, self.mask_id, 0.0, gen, random.Random(0),
                       self.tok.eos_token_id, mask_fn=pair_masks(len(spans), args.t, gen))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = trained_logits(self.model, self.model.mask_vec, b, self.mask_id)
        y, noisy = b[3][2], b[3][3]
        loss, m = certainty_forcing(logits[noisy], y[noisy], args.entropy_weight, args.entropy_temperature,
                                    args.certain)
        if (~noisy).any() and args.ar_weight:
            loss = loss + args.ar_weight * F.cross_entropy(logits[~noisy], y[~noisy])
        return loss, m

    def save(self, out: Path, extra: dict):
        from speclab.train.checkpoint import write_json
        from speclab.train.smollm2_dllm import save_adapter
        shape = argparse.Namespace(rank=self.info["rank"], alpha=self.info["lora_scale"] * self.info["rank"],
                                   block_length=extra["args"]["block_length"])
        save_adapter(self.model, self.model.mask_vec, out, self.info["base"], shape, self.mask_id, extra["log"])
        write_json(out / "speclab_train.json", extra)


# ----------------------------------------------------------------------------------------------
# 5. the run

@torch.no_grad()
def evaluate(part, held, args) -> dict:
    gen, tot, n = torch.Generator().manual_seed(1), {}, 0
    part.model.eval()
    for i in range(0, len(held), args.batch):
        _, m = part.loss(held[i:i + args.batch], args, gen)
        for k, v in m.items():
            tot[k] = tot.get(k, 0.0) + v
        n += 1
    part.model.train()
    ev = {k: round(v / max(n, 1), 4) for k, v in tot.items()}
    return {**ev, "score": round(ev.get("certain_right", 0) - ev.get("certain_wrong", 0), 4)}


def main(argv=None):
    from speclab.models.gguf import cache_root
    argv, args = command_line(get_args, argv)
    from speclab.models import zoo
    from speclab.models.adapter import adapter_info
    toy = adapter_info(zoo.resolve(args.dllm)) is None                  # a whole model, not a LoRA adapter
    args.gen_length = args.gen_length or (8 if "digits" in args.dllm else 64)
    args.block_length = args.block_length or (8 if "digits" in args.dllm else 32)
    args.batch = args.batch or (64 if toy else 4)
    args.lr = args.lr or (3e-4 if toy else 1e-4)
    if args.gen_length % args.block_length:
        raise SystemExit(f"--block-length {args.block_length} must divide --gen-length {args.gen_length}")
    t0 = time.time()
    part = Toy(args) if toy else Adapter(args)
    prompts = training_prompts(args.dllm, part.tok, args.prompts, args.seed)
    cache = None if args.data_cache == "none" else (
        cache_root() / "dparallel" / f"{args.dllm}-g{args.gen_length}-b{args.block_length}-n{args.prompts}-s{args.seed}"
        ".safetensors" if args.data_cache == "auto" else Path(args.data_cache))
    budget = args.data_minutes if args.data_minutes is not None else args.minutes / 3
    if args.data == "self-text":
        rows = base_text(part, args)
    else:
        rows = cached(cache, lambda: trajectories(part.decoder, part.tok, prompts, args.gen_length, args.block_length,
                                                  budget * 60))
    if not toy:
        part.decoder = None                                              # the merged copy is no longer needed
    n_held = max(1, int(len(rows) * args.held_frac))
    held, train = rows[:n_held], rows[n_held:]
    state = {"step": 0, "elapsed": 0.0, "log": []}
    opt = torch.optim.AdamW(part.params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    data_s = time.time() - t0
    print(f"dparallel: {len(train)} trajectories to train on, {len(held)} held out, "
          f"{sum(p.numel() for p in part.params) / 1e6:.2f}M trained params, data took {data_s / 60:.1f} min")
    best = {}

    def save():
        ev = evaluate(part, held, args)
        if held_out(state, ev, "score") or not best:
            best.update(step=state["step"], **ev)
            part.save(args.out, {"command": "speclab train " + " ".join(["dparallel", *argv]), "dllm": args.dllm,
                                 "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                 "trajectories": len(rows), "held_out_trajectories": len(held),
                                 "data_minutes": round(data_s / 60, 1), "steps": state["step"], "best": dict(best),
                                 "log": state["log"]})
    save()                                                               # step 0: the dLLM as it was
    loop = BudgetLoop(state, len(train), args.batch, args.seed, max(args.minutes - data_s / 60, 0.01),
                      args.eval_every, save, "train dparallel", args.max_steps)
    avg = None
    for idx in loop:
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        loss, m = part.loss([train[i] for i in idx], args, gen)
        optimizer_step(opt, loss, part.params)
        avg = m if avg is None else {k: 0.95 * avg[k] + 0.05 * v for k, v in m.items()}
        loop.bar.set_postfix({k: f"{v:.3f}" for k, v in avg.items()}, refresh=False)
    save()
    print(f"saved {args.out}: best held-out at step {best['step']} of {state['step']}: {best}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
