"""Every decoding method by name: family, losslessness, what it needs, and how to build it."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Method:
    name: str
    family: str          # speculative | diffusion | dag
    engine: str
    lossless: bool
    needs_draft: bool
    summary: str
    build: Callable | None = None   # (target_model, draft_model, **params) -> Drafter
    draft_kind: str = "draft"       # what `draft` must be: a draft LM, an "eagle" head, "medusa" heads


def _none(target, draft, **kw):
    from speclab.decoding.speculative import Drafter
    if kw:
        raise ValueError(f"method 'ar' takes no parameters, got {sorted(kw)}")
    return Drafter()


def gated(drafter, gate, adaptive: bool):
    """gate: "auto" (on for adaptive length policies, greedy decoding), True / "on" (also under
    sampling: a seed then no longer fixes the text), False / "off". See decoding/gate.py."""
    if gate not in ("auto", True, False, "on", "off"):
        raise ValueError(f"gate must be 'auto', 'on' or 'off', got {gate!r}")
    if gate in (True, "on") or gate == "auto" and adaptive:
        from speclab.decoding.gate import CostGate
        return CostGate(drafter, greedy_only=gate == "auto")
    return drafter


def _draft_model(target, draft, k=4, threshold=None, max_k=8, schedule="fixed", gate="auto", backend="auto",
                 vocab=None):
    from speclab.decoding.drafters.model import DraftModelDrafter
    return gated(DraftModelDrafter(draft, k=k, threshold=threshold, max_k=max_k, schedule=schedule, backend=backend,
                                   vocab=vocab),
                 gate, threshold is not None or schedule != "fixed")


def _layer_skip(target, draft, exit_layer="auto", k=4, threshold=None, max_k=8, schedule="fixed", gate="auto"):
    from speclab.decoding.drafters.model import LayerSkipDrafter
    return gated(LayerSkipDrafter(target, exit_layer=exit_layer, k=k, threshold=threshold, max_k=max_k,
                                  schedule=schedule), gate, exit_layer == "auto")


def _prompt_lookup(target, draft, k=5, max_ngram=3, min_ngram=1, prefer="first", grow=0, k_full=None, gate="auto"):
    from speclab.decoding.drafters.lookup import PromptLookupDrafter
    return gated(PromptLookupDrafter(k=k, max_ngram=max_ngram, min_ngram=min_ngram, prefer=prefer, grow=grow,
                                     k_full=k_full),
                 gate, grow > 0)


def _suffix(target, draft, max_k=16, factor=1.0, min_match=2, k=None, history=None, gate="auto"):
    from speclab.decoding.drafters.lookup import SuffixDrafter, SuffixHistory
    return gated(SuffixDrafter(max_k=k or max_k, factor=factor, min_match=min_match, history=history,
                               key=SuffixHistory.key_of(target)), gate, True)


def _oracle(target, draft, reference=None, k=5):
    from speclab.decoding.drafters.oracle import OracleDrafter
    if reference is None:
        raise ValueError("oracle drafts a known answer: pass reference=[token ids] (speclab.generate decodes it "
                         "with ar first when none is given)")
    return OracleDrafter(reference, k=k)


def _recycling(target, draft, k=6, topk=8, width=1, budget=None):
    from speclab.decoding.drafters.recycling import RecyclingDrafter
    return RecyclingDrafter(k=k, topk=topk, width=width, budget=budget)


def _lookahead(target, draft, window=5, ngram=4, guesses=2, k=None):
    from speclab.decoding.drafters.lookahead import LookaheadDrafter
    return LookaheadDrafter(window=k or window, ngram=ngram, guesses=guesses)


def _tree_static(target, draft, paths=None, backend="auto"):
    from speclab.decoding.drafters.trees import StaticTreeDrafter
    return StaticTreeDrafter(draft, paths=paths, backend=backend)


def _tree_dynamic(target, draft, budget=10, width=3, depth=5, threshold=None, backend="auto"):
    from speclab.decoding.drafters.trees import DynamicTreeDrafter
    return DynamicTreeDrafter(draft, budget=budget, width=width, depth=depth, threshold=threshold, backend=backend)


# a tree of 5 nodes, 3 deep: a verify of up to 6 rows costs one pass of the CPU kernel without AMX;
# threshold 0.2 stops growing where the head is unsure, drafting less at no loss of speed (BENCHMARKS.md, eagle)
def _eagle(target, draft, budget=5, width=3, depth=3, vocab=None, threshold=0.2, lookup=0, ngram=2):
    from speclab.decoding.drafters.heads import EagleDrafter
    return EagleDrafter(target, draft, budget=budget, width=width, depth=depth, vocab=vocab, threshold=threshold,
                        lookup=lookup, ngram=ngram)


def _eagle_chain(target, draft, k=4, threshold=None, max_k=8, schedule="fixed", vocab=None):
    from speclab.decoding.drafters.heads import EagleChainDrafter
    return EagleChainDrafter(target, draft, vocab=vocab, k=k, threshold=threshold, max_k=max_k, schedule=schedule)


def _eagle3(target, draft, budget=5, width=3, depth=3, threshold=0.2, verifier=True):
    from speclab.decoding.drafters.eagle3 import Eagle3Drafter
    return Eagle3Drafter(target, draft, budget=budget, width=width, depth=depth, threshold=threshold, verifier=verifier)


def _eagle3_chain(target, draft, k=4, threshold=None, max_k=8, schedule="fixed", verifier=True):
    from speclab.decoding.drafters.eagle3 import Eagle3ChainDrafter
    return Eagle3ChainDrafter(target, draft, verifier=verifier, k=k, threshold=threshold, max_k=max_k,
                              schedule=schedule)


def _medusa(target, draft, paths=None, budget=None):
    from speclab.decoding.drafters.heads import MedusaDrafter
    return MedusaDrafter(target, draft, paths=paths, budget=budget)


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("ar", "autoregressive", "speculative", True, False, "plain autoregressive decoding (the reference)", _none),
    Method("draft-model", "speculative", "speculative", True, True,
           "a separate draft LM proposes k tokens (fixed, threshold or heuristic length)", _draft_model),
    Method("layer-skip", "self-speculative", "speculative", True, False,
           "the target's first L layers draft through its own head (exit fixed or auto)", _layer_skip),
    Method("prompt-lookup", "model-free", "speculative", True, False,
           "copy what followed the last n-gram's previous occurrence", _prompt_lookup),
    Method("suffix", "model-free", "speculative", True, False,
           "suffix automaton over prompt, output and the caller's earlier requests (SuffixDecoding)", _suffix),
    Method("oracle", "model-free", "speculative", True, False,
           "drafts the next k tokens of the known answer (ar's, decoded first): the ceiling a perfect draft of "
           "length k reaches", _oracle),
    Method("recycling", "model-free", "speculative", True, False,
           "Token Recycling: top-k successor matrix refreshed by every verify", _recycling),
    Method("lookahead", "model-free", "speculative", True, False,
           "Jacobi lookahead branch feeding an n-gram pool (Lookahead decoding)", _lookahead),
    Method("tree-static", "speculative-tree", "speculative", True, True,
           "a fixed expansion pattern over the draft's top-k (Medusa / SpecInfer)", _tree_static),
    Method("tree-dynamic", "speculative-tree", "speculative", True, True,
           "grow the tree by cumulative draft probability under a node budget (EAGLE-2 / DySpec)", _tree_dynamic),
    Method("eagle", "feature-head", "speculative", True, True,
           "EAGLE-2: a one-layer head on the target's hidden state grows a dynamic tree (draft: an EAGLE head)", _eagle, "eagle"),
    Method("eagle-chain", "feature-head", "speculative", True, True,
           "EAGLE: the head drafts a chain of k tokens from the target's hidden state (draft: an EAGLE head)", _eagle_chain, "eagle"),
    Method("eagle3", "feature-head", "speculative", True, True,
           "EAGLE-2's tree from an EAGLE-3 drafter in the layout vLLM, SGLang and speculators use (draft: its "
           "directory, speculators or SpecForge)", _eagle3, "eagle3"),
    Method("eagle3-chain", "feature-head", "speculative", True, True,
           "an EAGLE-3 drafter (speculators / SpecForge layout) drafts a chain of k tokens, as vLLM does",
           _eagle3_chain, "eagle3"),
    Method("medusa", "feature-head", "speculative", True, True,
           "Medusa-1: K heads on the last hidden state, a static tree of top-k products (draft: Medusa heads)", _medusa, "medusa"),
]}


DAG_SUMMARY = {
    "greedy": "DA-Transformer: best link then best token, vertex by vertex",
    "lookahead": "DA-Transformer: link and token chosen jointly (beta-weighted)",
    "viterbi": "DA-Transformer: the best path overall, length-normalised (joint Viterbi)",
    "sample": "DA-Transformer: sample links and tokens (temperature, top-k, top-p)",
    "beam": "DA-Transformer: beam search over (vertex, prefix)",
    "vanilla": "no graph: most likely length, then per-position argmax (shows multimodality)",
    "all": "every DAG strategy on the same graph in one trace",
}
for _s, _d in DAG_SUMMARY.items():
    METHODS[f"dag-{_s}"] = Method(f"dag-{_s}", "dag", "dag", _s != "sample", False, _d, None)


DLLM_SUMMARY = {
    "dllm-lowconf": "LLaDA: fixed steps per block, commit the most confident (or random) masked positions",
    "dllm-threshold": "Fast-dLLM: commit every position above a confidence threshold (or the factor rule)",
    "dllm-prophet": "Prophet: low-confidence steps, commit everything once the top-2 logit gap is large",
    "dllm-sched": "SchED: low-confidence steps, exit when the margin passes a progress-aware threshold",
    "dllm-localleap": "LocalLeap: high-confidence anchors relax the threshold around them",
    "dllm-freedave": "FreeDave: K drafts verified in one batched forward; lossless vs one-token-per-step",
    "dllm-entropy-bound": "DiffusionGemma's sampler: commit the lowest-entropy positions while their entropy sum "
                          "stays under a bound (on DiffusionGemma: its whole noise-canvas loop)",
}
for _n, _d in DLLM_SUMMARY.items():
    METHODS[_n] = Method(_n, "diffusion", "diffusion", _n == "dllm-freedave", False, _d, None)
DLLM_RUN_PARAMS = ["gen_length", "block_length", "eos_stop"]


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}")
    return METHODS[name]


def method_params(name: str) -> list[str]:
    m = get_method(name)
    if m.engine == "dag":
        from dataclasses import fields
        from speclab.decoding.dag import DecodeConfig
        return [f.name for f in fields(DecodeConfig)]
    if m.engine == "diffusion":
        from dataclasses import fields
        from speclab.decoding.dllm_policies import POLICIES
        return DLLM_RUN_PARAMS + [f.name for f in fields(POLICIES[name])]
    return [p for p in inspect.signature(m.build).parameters if p not in ("target", "draft", "backend")]


def method_defaults(name: str) -> dict:
    """{parameter: default} of a method, read from where the defaults live (its builder's signature,
    its policy or decode-config dataclass), so a form shows the value that runs; None = unset."""
    from dataclasses import MISSING, fields
    m = get_method(name)
    if m.engine in ("dag", "diffusion"):
        if m.engine == "dag":
            from speclab.decoding.dag import DecodeConfig as cls
        else:
            from speclab.decoding.dllm_policies import POLICIES
            cls = POLICIES[name]
        out = {f.name: None if f.default is MISSING else f.default for f in fields(cls)}
        return ({p: None for p in DLLM_RUN_PARAMS} | out) if m.engine == "diffusion" else out
    sig = inspect.signature(m.build).parameters
    return {p: sig[p].default for p in method_params(name)}


# parameters that pass what the caller owns, not a setting: an object whose state outlives one
# request (history), or data (the oracle's reference: by default ar's output, which a greedy run's
# own output repeats). A run reads them, but they are neither recorded in a trace nor shown as a knob
OWNED_PARAMS = ("history", "reference")


def recorded_params(params: dict) -> dict:
    """The method parameters a trace records: everything but the caller-owned objects."""
    return {k: v for k, v in params.items() if k not in OWNED_PARAMS}


def takes_backend(name: str) -> bool:
    m = get_method(name)
    return m.build is not None and "backend" in inspect.signature(m.build).parameters


def methods() -> list[dict]:
    """One row per method: name, family, lossless, needs_draft, params, summary."""
    return [dict(name=m.name, family=m.family, lossless=m.lossless, needs_draft=m.needs_draft,
                 params=method_params(m.name), summary=m.summary) for m in METHODS.values()]
