"""The README's table of real completions: held-out code-complete prompts, greedy, verbatim.

    .venv/bin/python scripts/readme_completions.py [--prompts 0,2,4] [--new 40]

Each row is decoded with draft-model (code-target + code-draft) and checked against plain greedy
`ar` token for token; the script refuses to print a row that differs.
"""
import argparse

import speclab
from speclab.prompts import load_prompts


def cell(s: str) -> str:
    return "`" + s.encode("unicode_escape").decode().replace("`", "'").replace("|", "\\|") + "`"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", default="0,2,4,6")
    ap.add_argument("--new", type=int, default=40)
    a = ap.parse_args()
    target, draft = speclab.load("code-target"), speclab.load("code-draft")
    prompts = load_prompts("code-complete")
    print("| end of a held-out `code-complete` prompt | code-target + code-draft, "
          f"{a.new} new tokens (identical to `ar`) |\n|---|---|")
    for i in map(int, a.prompts.split(",")):
        p = prompts[i]
        r = speclab.generate(target, p, "draft-model", draft=draft, max_new_tokens=a.new, record=None)
        ref = speclab.generate(target, p, "ar", max_new_tokens=a.new, record=None)
        if r.ids != ref.ids:
            raise SystemExit(f"prompt {i}: draft-model differs from ar: a lossless bug, not a README row")
        print(f"| {cell(p.splitlines()[-1])} | {cell(r.text)} |")


if __name__ == "__main__":
    main()
