"""Quality of the causal-LM zoo on the held-out split (issue: zoo done-when numbers).

  held-out loss per token of code-target, its early exits, and code-draft (same windows);
  greedy agreement: with k = 4 drafted tokens per round, the share the target's greedy check
  accepts (alpha), for the draft model and for the target's own exit at each layer.

    python -m speclab.bench.zoo_eval [--windows 64] [--prompts 20]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F


@torch.inference_mode()
def heldout_loss(model, stream: torch.Tensor, windows: int, seq_len: int = 512, exits=()) -> dict:
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(stream) - seq_len - 1, (windows,), generator=g).tolist()
    hidden = {}
    hooks = [model.model.layers[l - 1].register_forward_hook(
        lambda m, i, o, l=l: hidden.__setitem__(l, o[0] if isinstance(o, tuple) else o)) for l in exits]
    tot = {"final": 0.0, **{f"exit{l}": 0.0 for l in exits}}
    try:
        for s in starts:
            x = stream[s:s + seq_len + 1]
            logits = model(input_ids=x[None, :-1]).logits[0]
            tot["final"] += F.cross_entropy(logits, x[1:]).item()
            for l in exits:
                el = model.lm_head(model.model.norm(hidden[l]))[0]
                tot[f"exit{l}"] += F.cross_entropy(el, x[1:]).item()
    finally:
        for h in hooks:
            h.remove()
    return {k: round(v / windows, 4) for k, v in tot.items()}


def main(argv=None):
    import speclab
    from speclab.prompts import load_prompts
    from speclab.train.ar import token_stream
    from speclab.train.corpus import iter_texts
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--target", default="code-target", help="zoo name or directory")
    ap.add_argument("--draft", default="code-draft", help="zoo name or directory")
    a = ap.parse_args(argv)
    target, draft = speclab.load(a.target, device="cpu"), speclab.load(a.draft, device="cpu")
    stream = token_stream(target[1], iter_texts("heldout"))
    exits = target[0].config.speclab_exit_layers
    out = {"heldout_tokens": len(stream),
           "loss_target": heldout_loss(target[0], stream, a.windows, exits=exits),
           "loss_draft": heldout_loss(draft[0], stream, a.windows)["final"]}
    prompts = load_prompts("code-complete", a.prompts)
    runs = {"draft-model": dict(method="draft-model", k=4)}
    runs.update({f"exit{l}": dict(method="layer-skip", exit_layer=l, k=4) for l in exits})
    for name, kw in runs.items():
        drafted = accepted = 0
        for p in prompts:
            r = speclab.generate(target, p, draft=draft, max_new_tokens=a.max_new_tokens, record=None, **kw)
            drafted += r.trace.totals.drafted
            accepted += r.trace.totals.accepted
        out[f"agreement_{name}"] = round(accepted / drafted, 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
