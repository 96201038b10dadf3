"""The README's "What smollm2-dllm writes": held-out chat questions, greedy, verbatim.

    .venv/bin/python scripts/dllm_answers.py [--questions 3] [--gen-length 64]

For each of the first N questions of speclab/prompts/chat.jsonl (none is in the adapter's
training text): the base model's `ar` answer, then smollm2-dllm one slot per step and with
threshold 0.9, each with its forwards. Prints Markdown.
"""
import argparse
import json

import speclab
from speclab.prompts import load_prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--target", default="smollm2-dllm")
    a = ap.parse_args()
    base, dllm = speclab.load("smollm2-135m"), speclab.load(a.target)
    kw = dict(chat=True, record=None)
    for q in [p["chat"] for p in load_prompts("chat", a.questions)]:
        ar = speclab.run(base, q, "ar", max_new_tokens=a.gen_length, **kw)
        one = speclab.run(dllm, q, "dllm-lowconf", gen_length=a.gen_length, block_length=32, **kw)
        thr = speclab.run(dllm, q, "dllm-threshold", threshold=0.9, gen_length=a.gen_length, block_length=32, **kw)
        print(f"**{q}**\n")
        print(f"- `smollm2-135m`, `ar`: {json.dumps(ar.text)}")
        print(f"- `{a.target}`, one per step ({one.trace.totals.target_forwards} forwards): {json.dumps(one.text)}")
        same = "same text" if thr.ids == one.ids else json.dumps(thr.text)
        print(f"- `{a.target}`, threshold 0.9 ({thr.trace.totals.target_forwards} forwards): {same}\n")


if __name__ == "__main__":
    main()
