"""What the trainers of the SmolLM2 drafts and heads share: their common options, the learning-rate
schedule, and the loop's bookkeeping.

    add_options(ap, minutes=40, batch=8, seq_len=384, lr=3e-4, warmup=30, dev_help=...)
    loop = BudgetLoop(state, len(windows), args.batch, args.seed, args.minutes, args.save_every, save, "train")
    for idx in loop:                                   # window indices of one step
        set_lr(opt, cosine_lr(args.lr, state["step"], args.warmup, loop.frac))
        ...one optimizer step...
        loop.bar.set_postfix(loss=...)
    save()                                             # the last save is the caller's

A run trains for a wall-time budget, not a step count (a CPU's speed varies from machine to
machine), so the schedule is a function of the share of the budget spent. `state` is what the
checkpoint stores (step, epoch, position in the epoch, elapsed seconds): a resumed run goes on where
it stopped, in the same order of windows.
"""
from __future__ import annotations

import math
import random
import time


def add_options(ap, *, minutes: float, batch: int, seq_len: int, lr: float, warmup: int, dev_help: str):
    """The options every draft / head trainer takes, with its own defaults."""
    ap.add_argument("--minutes", type=float, default=minutes, help="training budget (wall time)")
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--seq-len", type=int, default=seq_len)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--held-frac", type=float, default=0.05)
    ap.add_argument("--dev-prompts", default="chat-dev", help=dev_help)
    ap.add_argument("--resume", action="store_true")
    add_threads_and_seed(ap, threads=2)


def add_threads_and_seed(ap, *, threads: int = 1) -> None:
    """--threads (torch's CPU threads) and --seed, the last options of every trainer."""
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--seed", type=int, default=0)


def cosine_lr(lr: float, step: int, warmup: int, frac: float, floor: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then a cosine from lr down to floor x lr as the share
    `frac` of the budget is spent."""
    warm = min(1.0, (step + 1) / max(warmup, 1))
    return lr * warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def set_lr(opt, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def command_line(get_args, argv) -> tuple[list[str], object]:
    """A trainer's (argv, args): argv (sys.argv[1:] when None) parsed by `get_args`, with torch's
    thread count and seed set from --threads and --seed."""
    import sys

    import torch
    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    return argv, args


def optimizer_step(opt, loss, params: list, clip: float = 1.0) -> None:
    """Backward, gradient norm clipped to `clip`, one step."""
    import torch
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()


def run_info(name: str, argv, args, state: dict, ev: dict, **more) -> dict:
    """A trained part's speclab_train.json: the exact command (`speclab train NAME ...`), every
    option, the steps run, the held-out numbers it was kept for, the curve, and `more`."""
    import shlex
    return {"command": shlex.join(["speclab", "train", name, *argv]), "options": {k: str(v) for k, v in vars(args).items()},
            "steps": state["step"], "held_out": ev, "log": state["log"], **more}


def held_out(state: dict, ev: dict, key: str | None = None) -> bool:
    """Log the held-out numbers `ev` at this step in state["log"] and print them. True when the score
    (ev[key], or with no key the mean of ev: the agreement per slot) is at least the best so far
    (kept as state["best"]): the caller then saves."""
    score = ev[key] if key else sum(ev.values()) / len(ev)
    state["log"].append({"step": state["step"], "min": round(state["elapsed"] / 60, 1), **ev})
    print(f"\nheld-out {'agreement ' if key is None else ''}step {state['step']}: {ev}", flush=True)
    if score < state.get("best", -1.0):
        return False
    state["best"] = score
    return True


def saver(evaluate, write, module, opt, ckpt, state: dict, key: str | None = None, out=None):
    """The save step of a trainer's BudgetLoop: evaluate() on the held-out data, write(ev) the part
    when its score is the best so far (held_out; `out`: where, said once written), then the
    checkpoint a resumed run starts from."""
    from speclab.train.checkpoint import save_checkpoint

    def save():
        ev = evaluate()
        if held_out(state, ev, key):
            write(ev)
            if out is not None:
                print(f"saved {out}", flush=True)
        save_checkpoint(ckpt, module, opt, state)
    return save


class BudgetLoop:
    """Steps until `minutes` of wall time are spent: epochs over `n` training windows, each in an
    order shuffled with seed + epoch, `batch` windows a step; a progress bar in seconds of the
    budget; `save()` every `every_minutes`; `max_steps` (0: none) ends it at that step. Iterating
    yields each step's window indices; the step counts once the caller's body has run."""

    def __init__(self, state: dict, n: int, batch: int, seed: int, minutes: float, every_minutes: float,
                 save, desc: str = "train", max_steps: int = 0):
        if n < 1:
            raise ValueError("no training windows: the data has no rows left after the held-out split "
                             "(use more data or a smaller --held-frac)")
        for key, v in (("step", 0), ("epoch", 0), ("pos", 0), ("elapsed", 0.0)):
            state.setdefault(key, v)
        self.state, self.n, self.batch, self.seed = state, n, batch, seed
        self.budget, self.every, self.save, self.desc = minutes * 60, every_minutes * 60, save, desc
        self.max_steps, self.bar = max_steps or 0, None

    @property
    def frac(self) -> float:
        """The share of the budget spent."""
        return self.state["elapsed"] / self.budget if self.budget else 1.0

    def order(self) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed + self.state["epoch"]).shuffle(order)
        return order

    def __iter__(self):
        from tqdm.auto import tqdm
        s = self.state
        order = self.order()
        t0, elapsed0, last = time.time(), s["elapsed"], time.time()
        self.bar = tqdm(total=int(self.budget), initial=int(min(elapsed0, self.budget)), unit="s", desc=self.desc,
                        mininterval=10)
        try:
            while s["elapsed"] < self.budget and not (self.max_steps and s["step"] >= self.max_steps):
                if s["pos"] >= self.n:
                    s["epoch"], s["pos"] = s["epoch"] + 1, 0
                    order = self.order()
                idx = order[s["pos"]:s["pos"] + self.batch]
                s["pos"] += self.batch
                yield idx
                s["step"] += 1
                s["elapsed"] = elapsed0 + time.time() - t0
                self.bar.update(int(min(s["elapsed"], self.budget)) - self.bar.n)
                if time.time() - last > self.every:
                    self.save()
                    last = time.time()
        finally:
            self.bar.close()


def held_out_agreement(model, stats, n_slots: int) -> dict:
    """slot_agreement(stats, n_slots) with `model` in eval mode while `stats` (a generator over the
    held-out batches) runs, then back in train mode."""
    model.eval()
    try:
        return slot_agreement(stats, n_slots)
    finally:
        model.train()


def slot_agreement(stats, n_slots: int) -> dict:
    """Held-out top-1 agreement per slot (head, depth) over batches: `stats` yields each batch's
    {f"acc{s}": share, f"n{s}": positions} for s = 1..n_slots; the result weighs each batch by its
    positions: {f"acc{s}": share}."""
    hit: dict[str, float] = {}
    for st in stats:
        for s in range(1, n_slots + 1):
            hit[f"acc{s}"] = hit.get(f"acc{s}", 0.0) + st[f"acc{s}"] * st[f"n{s}"]
            hit[f"n{s}"] = hit.get(f"n{s}", 0) + st[f"n{s}"]
    return {f"acc{s}": round(hit.get(f"acc{s}", 0.0) / max(hit.get(f"n{s}", 0), 1), 4) for s in range(1, n_slots + 1)}

