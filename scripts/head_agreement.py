"""How often an EAGLE head's first draft step agrees with the target, teacher-forced, on the answers
the target writes to a prompt set (speclab/train/dev_eval.py says how and why).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_agreement.py --prompts chat-dev,chat,code-edit \
        [--head speclab-zoo/speclab_zoo/smollm2-eagle] [--limit 20] [--tokens 128]

Counted over the first --tokens answer tokens of each prompt: the head's top-1 and top-3 against the
target's own greedy token there, and the target's mean top-1 probability (how sure it is itself).
"""
from __future__ import annotations

import argparse

import torch

from speclab.models import zoo
from speclab.models.heads import load_draft
from speclab.models.heads import eagle_layers
from speclab.train.dev_eval import answers, mean_agreement


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", default=str(zoo.zoo_path("smollm2-eagle") or "smollm2-eagle"))
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="chat-dev,chat,code-edit", help="prompt sets or JSONL files, comma-separated")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128, help="answer tokens written by ar per prompt")
    args = ap.parse_args()
    torch.set_num_threads(2)
    base, tok = zoo.load(args.target, dtype="bf16")                       # writes the answers, reads the states
    head = load_draft(args.head, zoo.load(args.target, dtype="fp32")[0], torch.float32)     # as trained
    layers = list(eagle_layers(head.config, base.config.num_hidden_layers))
    print(f"head {args.head}: step-1 agreement with {args.target}'s greedy token on its own answers")
    print("| prompts | answer positions | top-1 | top-3 | target's top-1 probability |\n|---|---|---|---|---|")
    for name in args.prompts.split(","):
        rows = answers(base, tok, name, layers, args.limit, args.tokens)
        a = mean_agreement(head, rows)
        sure = torch.cat([r.sure[1:] for r in rows]).mean()              # at the tokens the head guessed
        n = sum(len(r.tokens) - r.first - 1 for r in rows)
        print(f"| {name} | {n} | {a[0]:.3f} | {a[1]:.3f} | {sure:.3f} |")


if __name__ == "__main__":
    main()
