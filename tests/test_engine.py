"""The draft/verify engine on the real zoo models: lossless, faithful, and the same at every
recording level."""
import pytest
import torch

import speclab
from speclab.trace import Trace, replay

NEW = 96
CONFIGS = [  # (method, params): every method and length policy, chains and trees
    ("draft-model", dict(k=4)),
    ("draft-model", dict(threshold=0.4, max_k=8)),
    ("draft-model", dict(schedule="heuristic")),
    ("layer-skip", dict(exit_layer=4)),
    ("layer-skip", dict(exit_layer="auto")),
    ("prompt-lookup", dict()),
    ("suffix", dict()),
    ("recycling", dict()),
    ("recycling", dict(width=2, k=4)),
    ("lookahead", dict()),
    ("tree-static", dict()),
    ("tree-dynamic", dict(budget=8, width=3)),
    ("prompt-lookup", dict(prefer="recent", k=12, max_ngram=5, grow=4)),
    ("rapid", dict(k=3, chunk=16, retrieve=32, query=16)),     # the draft reads a retrieved slice
]
# each config by its name (method, then its parameters: "draft-model-k=4", "lookahead"): a test
# below picks configs by name, so reordering or extending the list cannot change what it tests
CONFIG = {"-".join([m, *(f"{k}={v}" for k, v in p.items())]): (m, p) for m, p in CONFIGS}
assert len(CONFIG) == len(CONFIGS), "two configs share a name"


def pick(*names: str) -> list:
    return [pytest.param(*CONFIG[n], id=n) for n in names]


# draft-model's adaptive lengths: left out of the fast backend's forward count
ADAPTIVE_DRAFT_MODEL = ("draft-model-threshold=0.4-max_k=8", "draft-model-schedule=heuristic")


@pytest.fixture(scope="module")
def greedy_ar(target, heldout_prompts):
    return [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in heldout_prompts]


@pytest.mark.parametrize("method,params", pick(*CONFIG))
def test_greedy_methods_reproduce_ar(method, params, target, draft, heldout_prompts, greedy_ar):
    for prompt, ref in zip(heldout_prompts, greedy_ar):
        r = speclab.generate(target, prompt, method, draft=draft, max_new_tokens=NEW, **params)
        assert r.ids == ref, f"{method} {params} diverged from greedy ar on prompt {prompt[:40]!r}"
        assert r.trace.totals.new_tokens == len(ref)


class CallCounter:
    def __init__(self, module):
        self.n = 0
        self.h = module.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def remove(self):
        self.h.remove()


def _check_trace(r, tmp_path, target_calls, draft_calls):
    t = Trace.load(r.trace.save(tmp_path / "t.json"))
    assert replay(t) == r.ids == t.output_ids
    assert t.totals.target_forwards == target_calls == len(t.rounds)
    assert t.totals.draft_forwards == draft_calls
    assert t.totals.accepted == sum(len(rd.accepted) for rd in t.rounds)
    assert t.totals.new_tokens == sum(rd.kept for rd in t.rounds) == len(r.ids)
    assert t.totals.tau == pytest.approx(len(r.ids) / len(t.rounds))


@pytest.mark.parametrize("method,params", pick(*(n for n in CONFIG if n not in ADAPTIVE_DRAFT_MODEL)))
def test_trace_is_faithful_fast_backend(method, params, target, draft, heldout_prompts, tmp_path, monkeypatch):
    """Replay of the saved trace equals the output; recorded forwards equal the forwards that ran
    (counted by wrapping the lean forward itself: full-depth calls on the target, everything else
    on the draft model or early exits)."""
    from speclab.models.lean.forward import LeanLM
    calls = {"target": 0, "draft": 0}
    real = LeanLM.forward

    def counted(self, ids, parents=None, n_prefix=0, logits_to_keep=0, n_layers=None):
        full_target = self.name == "target" and n_layers is None
        calls["target" if full_target else "draft"] += 1
        return real(self, ids, parents, n_prefix, logits_to_keep, n_layers)

    monkeypatch.setattr(LeanLM, "forward", counted)
    r = speclab.generate(target, heldout_prompts[1], method, draft=draft, max_new_tokens=48, record="full", **params)
    assert r.trace.params["backend"] == "LeanLM"
    _check_trace(r, tmp_path, calls["target"], calls["draft"])


@pytest.mark.parametrize("method,params", pick("draft-model-k=4", "layer-skip-exit_layer=auto", "lookahead",
                                               "tree-dynamic-budget=8-width=3"))
def test_trace_is_faithful_transformers_backend(method, params, target, draft, heldout_prompts, tmp_path):
    """The same on the transformers path, counting real module calls with forward hooks."""
    tgt_calls = CallCounter(target[0])
    embed_calls = CallCounter(target[0].model.embed_tokens)  # target + early-exit views
    dft_calls = CallCounter(draft[0])
    try:
        r = speclab.generate(target, heldout_prompts[1], method, draft=draft, max_new_tokens=48, record="full",
                             backend="hf", **params)
    finally:
        for c in (tgt_calls, embed_calls, dft_calls):
            c.remove()
    draft_calls = dft_calls.n if method.startswith(("draft-model", "tree")) else embed_calls.n - tgt_calls.n
    _check_trace(r, tmp_path, tgt_calls.n, draft_calls)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("method,params", pick("draft-model-k=4", "layer-skip-exit_layer=auto", "prompt-lookup",
                                               "lookahead"))
def test_outputs_do_not_depend_on_record_level(method, params, temperature, target, draft, heldout_prompts):
    outs = [speclab.generate(target, heldout_prompts[2], method, draft=draft, max_new_tokens=40,
                             temperature=temperature, seed=3, record=level, **params).ids
            for level in (None, "light", "full")]
    assert outs[0] == outs[1] == outs[2]


def test_ar_trace_counts(target, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[0], "ar", max_new_tokens=16)
    assert r.stats["tau"] == 1.0 and r.stats["target_forwards"] == 16 and r.stats["alpha"] is None


# The first sampled tokens' law of draft-model (chain) and tree-dynamic (tree): test_sampling_power.py.


def test_a_drafter_must_leave_the_target_cache_as_it_found_it(target):
    """The Drafter contract, enforced every round: propose() may not grow the target's cache."""
    from speclab.decoding.speculative import Drafter

    class Sloppy(Drafter):
        name = "sloppy"

        def propose(self, ctx):
            self.target.forward(torch.tensor(ctx.ids[-ctx.pending:], device=ctx.device))   # runs the target
            return super().propose(ctx)

    with pytest.raises(AssertionError, match="changed the target cache"):
        speclab.generate(target, "def f(x):", Sloppy(), max_new_tokens=4)


def test_a_run_stopped_mid_way_still_ends_its_drafter(target):
    """A progress callback that raises (the dashboard's cancel, a time budget) stops the decode; the
    drafter still ends (hooks off the shared model) and the next run on the target is unaffected."""
    from speclab.decoding.drafters.lookup import PromptLookupDrafter

    class Stop(Exception):
        pass

    class Watched(PromptLookupDrafter):
        ended = 0

        def end(self):
            Watched.ended += 1
            super().end()

    def stop_at(n):
        if n >= 3:
            raise Stop

    seen = []
    with pytest.raises(Stop):
        speclab.generate(target, "def f(x):\n    return x", Watched(), max_new_tokens=16,
                         progress=lambda k: (seen.append(k), stop_at(sum(seen))))
    assert Watched.ended == 1
    ar = speclab.generate(target, "def f(x):", "ar", max_new_tokens=6).ids
    assert speclab.generate(target, "def f(x):", Watched(), max_new_tokens=6).ids == ar and Watched.ended == 2


def test_a_drafter_instance_names_the_parameter_it_does_not_take(target):
    """A Drafter instance comes built with its parameters: a method keyword beside it is one line
    naming it (not an unknown-method error about the instance's name)."""
    from speclab.decoding.drafters.lookup import PromptLookupDrafter

    class Mine(PromptLookupDrafter):
        name = "mine"

    with pytest.raises(ValueError, match=r"method 'mine' does not take \['k'\]; it takes \[\]"):
        speclab.generate(target, "def f(x):", Mine(), k=3, max_new_tokens=2)


@pytest.mark.parametrize("all_rows", [False, True])
def test_the_verify_scores_the_rows_its_drafter_reads(target, all_rows):
    """The verify's LM head runs on the last pending token and the draft nodes only, unless the
    drafter reads every row (recycling learns the prompt's successors): the prompt's rows are most of
    a prefill's head work. Whatever rows it keeps, they are the full forward's, row for row."""
    from speclab.decoding.drafters.lookup import PromptLookupDrafter
    from speclab.decoding.speculative import Outcome

    seen = []

    class Watch(PromptLookupDrafter):
        def observe(self, out: Outcome):
            seen.append((len(out.inputs), out.n_pending, out.logits_from, out.logits.clone()))
            super().observe(out)

    d = Watch()
    d.all_rows = all_rows
    prompt = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return add(a, b) + c\n\ndef add"
    r = speclab.generate(target, prompt, d, max_new_tokens=24)
    assert r.ids == speclab.generate(target, prompt, "prompt-lookup", max_new_tokens=24).ids
    n_in, n_pending, first, logits = seen[0]
    assert n_pending > 8 and first == (0 if all_rows else n_pending - 1) and len(logits) == n_in - first
    ref = target[0](input_ids=torch.tensor([r.trace.prompt_ids])).logits[0, -1].float()
    assert (logits[n_pending - 1 - first] - ref).abs().max() < 1e-3   # the last prompt token's row


def test_a_bare_model_is_a_one_line_error_that_says_to_pass_the_pair(target):
    """speclab.load returns (model, tokenizer); passing the model alone says so (it used to crash
    reading a file named after the model's repr)."""
    with pytest.raises(TypeError, match=r"\(model, tokenizer\)"):
        speclab.generate(target[0], "def f(x):", "ar", max_new_tokens=2)
    assert speclab.generate(target, "def f(x):", "ar", max_new_tokens=2).ids
