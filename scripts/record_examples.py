"""Record the example runs the dashboard opens on (speclab/apps/examples/*.json): one real decode per
method the page offers, made exactly as the page would make it (the form's target, draft, prompt and
knobs for that method: `Form.request()`), recorded "full" so every view (tree, p / q bars, timing) has
what it needs. Speculative methods run on the real pair (smollm2-135m + its draft or head) on the copy
task, 64 new tokens; a method with no head for the real target runs on the toy zoo's code-target, as
the page does once that target is picked; diffusion methods on the form's diffusion model (the toy
code-dllm where the method's own model ships for it only), DAG strategies on the form's DAG model.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/record_examples.py              # every missing example
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/record_examples.py --force eagle prompt-lookup

tests/test_examples.py checks that every offered method has one and that none is stale.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.pop("SPECLAB_DASHBOARD_TARGET", None)      # the page as a class sees it: the real pair

from speclab.apps import guide, runs  # noqa: E402
from speclab.apps.form import REAL_DLLM, REAL_PAIR, TOY_DLLM, TOY_PAIR, Form  # noqa: E402

TOKENS = 64                   # new tokens of a speculative example (diffusion: the form's gen length)
MAX_BYTES = 200_000           # an example over this is recorded again with half the tokens


def page_state(form: Form, method: str, targets=(REAL_PAIR[0], TOY_PAIR[0])) -> tuple[dict, tuple]:
    """The form fitted to `method` (on the toy target when the real one has no head for it): the
    request the page would send, and the example's key (method, target, draft shown)."""
    form.method.value = method
    if runs.verifies(method):
        for target in targets:                              # the real pair unless it has no head for the method
            if target in form.target.options and form.target.value != target:
                form.target.value = target
            if form.draft.visible and not form.draft.disabled:      # a draft LM: the target's own pair
                form.draft.value = REAL_PAIR[1] if target == REAL_PAIR[0] else TOY_PAIR[1]
            if not (form.draft.visible and form.draft.disabled and form.draft.value.startswith("no ")):
                break
    request = form.request()
    key = (method, form.target.value, form.draft.value if form.draft.visible else None)
    return request, key


def record(request: dict, tokens: int):
    runs.run_one(**{**request, "max_new_tokens": 4, "record": None})            # load and warm up
    return runs.run_one(**{**request, "max_new_tokens": tokens, "record": "full"})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("methods", nargs="*", help="only these methods (default: every method the page offers)")
    ap.add_argument("--force", action="store_true", help="record again even where an example exists")
    a = ap.parse_args(argv)
    guide.EXAMPLES.mkdir(exist_ok=True)
    form = Form(runs.zoo_models())
    for method in a.methods or runs.method_names():
        request, key = page_state(form, method)
        path = guide.example_path(*key)
        if path.exists() and not a.force:
            continue
        tokens = TOKENS if runs.verifies(method) else request["max_new_tokens"]
        start = time.perf_counter()
        try:
            trace = record(request, tokens)
            while len(runs.trace_json(trace)) > MAX_BYTES and tokens > 8 and runs.verifies(method):
                tokens //= 2
                trace = record(request, tokens)
        except Exception as e:                # say which; a speculative method gets the toy zoo, then the next
            print(f"FAILED {method} on {key[1]}: {type(e).__name__}: {e}", flush=True)
            if key[1] in (TOY_PAIR[0], TOY_DLLM) or runs.is_dag(method):
                continue
            if runs.verifies(method):
                request, key = page_state(form, method, targets=(TOY_PAIR[0],))
            else:                                 # a diffusion method whose own model the toy zoo ships
                form.target.value = TOY_DLLM
                request, key = form.request(), (method, TOY_DLLM, None)
                form.target.value = REAL_DLLM
            path = guide.example_path(*key)
            try:
                trace = record(request, tokens)
            except Exception as e:
                print(f"FAILED {method} on {key[1]}: {type(e).__name__}: {e}", flush=True)
                continue
        trace.save(path)
        print(f"{path.name}: {len(trace.output_ids)} tokens, {path.stat().st_size // 1000} kB, "
              f"{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
