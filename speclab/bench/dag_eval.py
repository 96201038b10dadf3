"""Held-out accuracy of every DAG decoder, the variants they pick, and the vanilla failure rate.

For each task: the first N inputs of the fixed held-out split (never trained on), one model forward
each, every decoder on the same graph. An output is correct when it is one of the valid variants.
Sampling is run `--samples` times per input (a fresh seed per draw) to show how often each variant
comes out, next to the model's own exact probability of each variant (the DAG loss's path sum).

  python -m speclab.bench.dag_eval --n 500 --samples 5 > dag-eval.md
"""
from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import torch

from speclab.decoding.dag import DECODERS, STRATEGIES, DecodeConfig, decode_config, encode, forward_graph, output_of
from speclab.models.dag import BOS, EOS, PAD, load_dag
from speclab.train.dag import TASKS, dag_logprob, gather_match, heldout

ZOO = Path(__file__).resolve().parents[1] / "zoo"


def variant_label(task: str, words: list[str], n_variants: int) -> str:
    """Which kind of valid variant an output is: 'and's used / optional 'and' slots (numwords, where
    n_variants = 2 ** slots), or the word order (dates)."""
    if task == "numwords":
        return f"and {words.count('and')}/{n_variants.bit_length() - 1}"
    if words[0] == "the":
        return "the Dth of month Y"
    return "Y month D" if len(words[0]) == 4 else "D month Y" if words[0].isdigit() else "month D Y"


def variant_probs(model, E, A, valid: list[list[str]]) -> list[float]:
    """The model's exact probability of each valid variant: the DAG loss's sum over all paths."""
    ys = [[BOS] + model.vocab.encode(v) + [EOS] for v in valid]
    T = max(map(len, ys))
    y = torch.tensor([v + [PAD] * (T - len(v)) for v in ys])
    k, Lg = len(ys), E.size(0)
    with torch.no_grad():
        logp = dag_logprob(gather_match(E.expand(k, -1, -1), y), A.expand(k, -1, -1),
                           torch.tensor([len(v) for v in ys]), torch.full((k,), Lg))
    return logp.exp().tolist()


def evaluate(task_name: str, model_dir: Path, n: int, samples: int, cfg: DecodeConfig | None = None) -> str:
    """The held-out table of one model; cfg None: the model's own decoder settings (decode_config)."""
    model = load_dag(model_dir)
    cfg = cfg or decode_config(model)
    task = TASKS[task_name]
    xs = heldout(task_name)[:n]
    correct = collections.Counter()
    kinds = {s: collections.Counter() for s in STRATEGIES}
    secs = collections.Counter()
    failures, choice_inputs = [], 0
    t_fwd = 0.0
    model_p = collections.Counter()                # the model's own P(y | x), summed per label
    for i, x in enumerate(xs):
        t0 = time.perf_counter()
        E, A = forward_graph(model, encode(model, x))
        t_fwd += time.perf_counter() - t0
        valid = task.variants(x)
        multi = len(valid) > 1
        choice_inputs += multi
        if multi:
            for v, p in zip(valid, variant_probs(model, E, A, valid)):
                model_p[variant_label(task_name, v, len(valid))] += p
            model_p["invalid"] += max(0.0, 1 - sum(variant_probs(model, E, A, valid)))
        for name in STRATEGIES:
            for s in range(samples if name == "sample" else 1):
                g = torch.Generator().manual_seed(i * samples + s)   # fresh draws per input
                t0 = time.perf_counter()
                _, toks = DECODERS[name](E, A, cfg, g)
                secs[name] += time.perf_counter() - t0
                words = model.vocab.decode(output_of(name, toks))
                ok = words in valid
                correct[name] += ok / (samples if name == "sample" else 1)
                if multi:
                    kinds[name][variant_label(task_name, words, len(valid)) if ok else "invalid"] += 1
                if name == "vanilla" and not ok and len(failures) < 4:
                    failures.append((x, " ".join(words)))
    labels = sorted({k for c in [model_p, *kinds.values()] for k in c}, key=lambda k: (k == "invalid", k))
    out = [f"### {task_name} ({model_dir.name}, {model.num_params():,} params)", "",
           f"{n} held-out inputs, {choice_inputs} of them with more than one valid output; "
           f"model forward {1000 * t_fwd / n:.1f} ms per input; decoder settings {cfg}.", "",
           "| decoder | held-out accuracy | decode ms | " + " | ".join(labels) + " |",
           "|---|---|---|" + "---|" * len(labels)]
    for name in STRATEGIES:
        tot = sum(kinds[name].values()) or 1
        reps = samples if name == "sample" else 1
        cells = [f"{100 * kinds[name][k] / tot:.1f}%" for k in labels]
        out.append(f"| {name}{f' (x{samples} seeds)' if name == 'sample' else ''} | "
                   f"{correct[name] / n:.3f} | {1000 * secs[name] / (n * reps):.2f} | " + " | ".join(cells) + " |")
    tot = sum(model_p.values()) or 1
    out.append("| *model P(y \\| x)* | | | " + " | ".join(f"{100 * model_p[k] / tot:.1f}%" for k in labels) + " |")
    out += ["", f"Variant columns: share of outputs on the multi-variant inputs; the last row is the "
            "model's own probability of each kind (exact, summed over all paths), which sampling "
            "should match. Vanilla failure rate "
            f"{1 - correct['vanilla'] / n:.3f}; examples: "
            + "; ".join(f"`{x}` -> `{w}`" for x, w in failures), ""]
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=sorted(TASKS))
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    for t in a.tasks:
        print(evaluate(t, ZOO / f"{t}-dat", a.n, a.samples), flush=True)


if __name__ == "__main__":
    main()
