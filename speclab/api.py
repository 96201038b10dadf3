"""The Python API: `speclab.run(...)` and `speclab.generate(...)` -> Result: look the method's engine
row up (decoding/engines.py), check what the engine takes, the method's parameters (the row's `check`)
and the pairing, and call its door."""
from __future__ import annotations

import functools

from speclab.decoding.engines import SPECULATIVE, check_pairing, get_engine
from speclab.decoding.registry import get_method
from speclab.decoding.result import Result  # noqa: F401 (speclab.Result)
from speclab.decoding.spec_run import generate as decode_speculative
from speclab.decoding.spec_run import is_batch
from speclab.decoding.speculative import Drafter
from speclab.models.loading import (PromptBoundaryWarning, as_model, chat_prompt, check_vocab,  # noqa: F401
                                    encode_prompt, model_info)


@functools.wraps(decode_speculative)
def generate(target, prompt, method: str = "ar", draft=None, **kw) -> Result | list[Result]:
    return run(target, prompt, method, draft=draft, **kw)


def run(target, prompt, method: str = "ar", **kw) -> Result | list[Result]:
    """Any engine by method name (or a Drafter instance, which runs on the speculative engine): the
    method's Engine row (decoding/engines.py) says what the run takes and which door decodes it.
    The one dispatcher: the CLI, the dashboard and the bench call it. The method's parameters (the
    keywords the row's door does not name itself, through the row's `check`) and the target / draft
    pairing are checked first, for every engine, before any weights load. The same keywords mean the
    same thing everywhere (record, seed, device, dtype, chat, temperature); max_new_tokens is the
    canvas length of a diffusion run unless gen_length is given, and a DAG's output length is its
    graph's."""
    if isinstance(method, Drafter):                 # a user's own drafter plugs into the speculative slot
        return SPECULATIVE.run(target, prompt, method, **kw)
    m = get_method(method)
    row = get_engine(m.engine)
    if not row.verify:
        if kw.pop("rule", None) not in (None, "exact") or kw.pop("rule_params", None):
            raise ValueError(f"{m.name} has no verify to take an acceptance rule: rule= is for methods whose "
                             "drafts a target verifies (speculative)")
    row.check_method(m, kw)                         # unknown or mistyped method parameters: one line
    draft = kw.get("draft")
    check_pairing(row, m.name, target, draft if m.needs_draft or not row.draft else None, m.draft_kind)
    if is_batch(prompt) and not row.batch:
        raise ValueError(f"a list of prompts decodes as a batch on the speculative engine only; {m.name} "
                         f"({m.engine}) takes one prompt at a time")
    return row.run(target, prompt, m.name, **kw)
