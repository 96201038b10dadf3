"""Record the example runs the dashboard opens on (speclab/apps/examples/*.json): real decodes of the
default pair on the task the page opens on (the copy-heavy edit), recorded "full" so every view (tree, p / q bars, timing) has what it needs.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/record_examples.py
"""
from __future__ import annotations

import speclab
from speclab.apps import guide
from speclab.apps.form import COPY_PROMPT, REAL_PAIR

RUNS = [("draft-model", *REAL_PAIR, dict(k=4))]


def main() -> None:
    guide.EXAMPLES.mkdir(exist_ok=True)
    for method, target, draft, kw in RUNS:
        speclab.run(target, COPY_PROMPT, method, draft=draft, chat=True, max_new_tokens=4, record=None, **kw)  # warm-up
        r = speclab.run(target, COPY_PROMPT, method, draft=draft, chat=True, max_new_tokens=64, record="full", **kw)
        path = guide.example_path(method, target, draft)
        r.trace.save(path)
        print(f"{path}: {len(r.ids)} tokens, tau {r.trace.totals.tau:.2f}: {r.text!r}")


if __name__ == "__main__":
    main()
