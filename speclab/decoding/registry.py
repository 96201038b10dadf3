"""Every decoding method by name, one row each: what it is, what it needs, and how the engines and
front ends treat it.

A speculative method is its drafter class plus one `Method` row, written with keywords. Its
parameters and their defaults are the drafter constructor's own (read with `inspect`, through `**kw`
into the base classes), so they are written once, where they run. The row declares the rest: what
it guarantees (`guarantee`, one of GUARANTEES; `guarantee()` combines it with the run's acceptance
rule), what the constructor receives from the run (`inputs`: the target as `target_model`, the draft
as `draft`), the draft it needs and the zoo's draft for each target (`draft`), whether it runs in a
batch (`batchable`), whether it drafts trees (`tree`: its budget is a verify's row count), whether
the cost gate wraps it (`adaptive`: a predicate on its parameters), and any work before the run
(`setup`: the oracle decodes the answer it drafts). Every caller (the API, the CLI, the bench, a
batch, the dashboard's form) reads these rows and nothing else, so a new drafter is one file plus
one row, and `register()` adds one at run time (a user's own, a test's). Diffusion and DAG methods
take their parameters from a config dataclass (`config`: a DAG's DecodeConfig, a diffusion row's
policy class) the same way, and declare their facts: a DAG row its decoding `strategy`, a diffusion
row its step loop (`loop`: the engine's `denoise`, or FreeDave's draft and verify) and whether it
runs on a noise canvas (`noise_canvas`: DiffusionGemma's sampler). `engine` names the method's
Engine row (decoding/engines.py), which says how it runs and how its traces read. The row's type,
`register()` and the lookups every caller uses live in decoding/method.py; this module holds the
rows and re-exports those names.
"""
from __future__ import annotations

from speclab.decoding.dag import DecodeConfig
from speclab.decoding.diffusion import denoise
from speclab.decoding.dllm_adapt import ETE, AdaBlock, FastV2, Learn2PD
from speclab.decoding.dllm_policies import EntropyBound, FreeDave, LocalLeap, LowConfidence, Prophet, Sched, Threshold
from speclab.decoding.dllm_revise import R2, JointThreshold
from speclab.decoding.dparallel import EntropyThreshold
from speclab.decoding.freedave import freedave
from speclab.decoding.guarantees import GUARANTEES, LOSSLESS, check, weakest  # noqa: F401 (re-exported)
from speclab.decoding.drafters.aded import AdedDrafter
from speclab.decoding.drafters.eagle3 import Eagle3ChainDrafter, Eagle3Drafter
from speclab.decoding.drafters.graft import GraftDrafter
from speclab.decoding.drafters.ffn_skip import FfnSkipDrafter
from speclab.decoding.drafters.first import FirstDrafter
from speclab.decoding.drafters.foreal import ForealDrafter, sentences_of_target
from speclab.decoding.drafters.heads import EagleChainDrafter, EagleDrafter, MedusaDrafter
from speclab.decoding.drafters.lookahead import LookaheadDrafter
from speclab.decoding.drafters.lookup import PromptLookupDrafter, SuffixDrafter, SuffixHistory
from speclab.decoding.drafters.model import DraftModelDrafter, LayerSkipDrafter
from speclab.decoding.drafters.oracle import OracleDrafter
from speclab.decoding.drafters.synthetic import SyntheticDrafter, decode_answer
from speclab.decoding.drafters.pearl import PearlDrafter
from speclab.decoding.drafters.recycling import RecyclingDrafter
from speclab.decoding.drafters.rsd import RSDDrafter
from speclab.decoding.drafters.rsd_s import RSDSDrafter
from speclab.decoding.drafters.specdecpp import SpecDecPPDrafter
from speclab.decoding.drafters.speckv import SpecKVDrafter
from speclab.decoding.drafters.swift import SwiftDrafter, UnifiedSkipDrafter
from speclab.decoding.drafters.spectr import SpecTrDrafter
from speclab.decoding.drafters.trees import DynamicTreeDrafter, StaticTreeDrafter
from speclab.decoding.method import (DRAFT, METHODS, OWNED_PARAMS, TARGET_AND_DRAFT, Draft, Method,  # noqa: F401
                                     batch_methods, build_drafter, constructor_params, gated, get_method,
                                     guarantee, method_defaults, method_params, methods, paired_draft, param_types,
                                     recorded_params, register, registered, the_draft, the_target, unregister)
from speclab.decoding.speculative import Drafter

DRAFT_LM = Draft("draft", "a draft model", {"smollm2-135m": "smollm2-draft", "code-target": "code-draft"})
EAGLE_HEAD = Draft("eagle", "an EAGLE head", {"smollm2-135m": "smollm2-eagle"})
MEDUSA_HEADS = Draft("medusa", "Medusa heads", {"smollm2-135m": "smollm2-medusa"})
EAGLE3_DRAFTER = Draft("eagle3", "an EAGLE-3 drafter (a speculators or SpecForge directory)", {})


def vocabulary_of_target(target, draft):
    return SuffixHistory.key_of(target)


def decode_reference(params: dict, ar) -> dict:
    """The oracle's setup: the answer it drafts is ar's (same sampler, seed and backend), decoded
    before the run and outside its timing, once its own settings are known to be good."""
    if params.get("reference") is not None:
        return params
    OracleDrafter([], **{k: v for k, v in params.items() if k != "reference"})
    return dict(params, reference=ar())


AR = "identical-to-ar"
for _m in [
    Method(name="ar", family="autoregressive", engine="speculative", guarantee=AR,
           summary="plain autoregressive decoding (the reference)", drafter=Drafter, batchable=True),
    Method(name="draft-model", family="speculative", engine="speculative", guarantee=AR,
           summary="a separate draft LM proposes k tokens, fixed, threshold or heuristic length "
                   "(Leviathan et al. 2023; Chen et al. 2023)",
           drafter=DraftModelDrafter, inputs=DRAFT, draft=DRAFT_LM, batchable=True,
           adaptive=lambda p: p["threshold"] is not None or p["schedule"] != "fixed"),
    Method(name="specdec++", family="speculative", engine="speculative", guarantee=AR,
           summary="draft-model's chain, stopped once a trained head on the draft's hidden state puts P(some draft "
                   "token is rejected) above a threshold (SpecDec++, Huang et al. COLM 2025)",
           drafter=SpecDecPPDrafter, inputs=DRAFT, draft=DRAFT_LM),
    Method(name="speckv", family="speculative", engine="speculative", guarantee=AR,
           summary="draft-model's chain, its length chosen each round by a small MLP over the draft's confidence "
                   "and entropy, for the most expected tokens per cost (SpecKV, Shukla 2026)",
           drafter=SpecKVDrafter, inputs=DRAFT, draft=DRAFT_LM),
    Method(name="layer-skip", family="self-speculative", engine="speculative", guarantee=AR,
           summary="the target's first L layers draft through its own head, exit fixed or auto (LayerSkip; "
                   "Draft & Verify)",
           drafter=LayerSkipDrafter, inputs={"target_model": the_target}, adaptive=lambda p: p["exit_layer"] == "auto"),
    Method(name="swift", family="self-speculative", engine="speculative", guarantee=AR,
           summary="the target less a set of its own attention and MLP sublayers drafts until its confidence drops; "
                   "the set is searched on the target's own text as it decodes and cached per task (SWIFT, Xia et "
                   "al. ICLR 2025)",
           drafter=SwiftDrafter, inputs={"target_model": the_target}, adaptive=lambda p: True),
    Method(name="unified-layer-skip", family="layer-skipping", engine="speculative", guarantee="lossy",
           summary="no draft and no verify: every token from the target with an even pattern of whole layers "
                   "skipped, as many as a target speed-up asks (Unified Layer Skipping, Liu et al. 2024)",
           drafter=UnifiedSkipDrafter, inputs={"target_model": the_target}),
    Method(name="ffn-skip", family="layer-skipping", engine="speculative", guarantee="lossy",
           summary="no draft and no verify: every token from the target, each skipping the FFN blocks after the "
                   "first whose input and output cosine similarity passes a threshold, attention always run "
                   "(FFN-SkipLLM, Jaiswal et al. EMNLP 2024)",
           drafter=FfnSkipDrafter, inputs={"target_model": the_target}),
    Method(name="first", family="layer-skipping", engine="speculative", guarantee="lossy",
           summary="no draft and no verify: trained per-layer routers read the prompt's states at prefill and "
                   "choose, once per request, the whole layers every decoded token skips (FiRST, Jain et al. 2024)",
           drafter=FirstDrafter, inputs={"target_model": the_target}),
    Method(name="prompt-lookup", family="model-free", engine="speculative", guarantee=AR,
           summary="copy what followed the last n-gram's previous occurrence (prompt lookup decoding)",
           drafter=PromptLookupDrafter, inputs={"target_model": the_target}, batchable=True,
           adaptive=lambda p: p["grow"] > 0),
    Method(name="suffix", family="model-free", engine="speculative", guarantee=AR,
           summary="suffix automaton over prompt, output and the caller's earlier requests (SuffixDecoding)",
           drafter=SuffixDrafter, inputs={"key": vocabulary_of_target}, batchable=True, adaptive=lambda p: True,
           aliases={"k": "max_k"}),
    Method(name="oracle", family="model-free", engine="speculative", guarantee=AR,
           summary="drafts the next k tokens of the known answer (ar's, decoded first): the ceiling a perfect "
                   "draft of length k reaches", drafter=OracleDrafter, setup=decode_reference),
    Method(name="synthetic", family="model-free", engine="speculative", guarantee=AR, sampling=False,
           summary="synthetic acceptance (vLLM's rejection_sample_method=synthetic): the real round at a chosen "
                   "per-depth acceptance profile, drafted from the known answer; greedy only",
           drafter=SyntheticDrafter, setup=decode_answer),
    Method(name="recycling", family="model-free", engine="speculative", guarantee=AR,
           summary="Token Recycling: top-k successor matrix refreshed by every verify", drafter=RecyclingDrafter,
           batchable=True),
    Method(name="lookahead", family="model-free", engine="speculative", guarantee=AR,
           summary="Jacobi lookahead branch feeding an n-gram pool (Lookahead decoding)", drafter=LookaheadDrafter,
           batchable=True, aliases={"k": "window"}),
    Method(name="aded", family="model-free", engine="speculative", guarantee=AR,
           summary="a tri-gram table of the committed text, updated as it decodes, drafts a small tree by an "
                   "explore / exploit rule (UCB1, speclab's own; ADED, Liu et al. AAAI 2025)", drafter=AdedDrafter,
           batchable=True, tree=True),
    Method(name="tree-static", family="speculative-tree", engine="speculative", guarantee=AR,
           summary="a fixed expansion pattern over the draft's top-k (Medusa / SpecInfer)",
           drafter=StaticTreeDrafter, inputs=DRAFT, draft=DRAFT_LM, batchable=True, tree=True),
    Method(name="tree-dynamic", family="speculative-tree", engine="speculative", guarantee=AR,
           summary="grow the tree by cumulative draft probability under a node budget (EAGLE-2 / DySpec)",
           drafter=DynamicTreeDrafter, inputs=DRAFT, draft=DRAFT_LM, batchable=True, tree=True),
    Method(name="tree-rsd", family="speculative-tree", engine="speculative", guarantee=AR,
           summary="siblings drawn without replacement (Gumbel-Top-k) from the draft, verified by recursive "
                   "rejection against q renormalised without the earlier siblings (RSD, Jeon et al. 2024)",
           drafter=RSDDrafter, inputs=DRAFT, draft=DRAFT_LM, tree=True, rule="rsd"),
    Method(name="tree-rsd-s", family="speculative-tree", engine="speculative", guarantee=AR,
           summary="sequences drawn without replacement by Stochastic Beam Search over the draft's log-probabilities, "
                   "`width` kept per level, verified by recursive rejection (RSD-S, Jeon et al. 2024)",
           drafter=RSDSDrafter, inputs=DRAFT, draft=DRAFT_LM, tree=True, rule="rsd"),
    Method(name="spectr", family="speculative-tree", engine="speculative", guarantee=AR,
           summary="k draft chains sampled i.i.d., verified by K-SEQ: each position's candidates tested against "
                   "p / rho*, the chains that agree with the emitted token kept (SpecTr, Sun et al. NeurIPS 2023)",
           drafter=SpecTrDrafter, inputs=DRAFT, draft=DRAFT_LM, tree=True, rule="k-seq"),
    Method(name="eagle", family="feature-head", engine="speculative", guarantee=AR,
           summary="EAGLE-2: a one-layer head on the target's hidden state grows a dynamic tree (draft: an EAGLE "
                   "head)", drafter=EagleDrafter, inputs=TARGET_AND_DRAFT, draft=EAGLE_HEAD, tree=True),
    Method(name="graft", family="feature-head", engine="speculative", guarantee=AR,
           summary="Graft: EAGLE-2's tree pruned where the head is unsure, prompt lookup's copy grafted into the "
                   "room, one budget (draft less, retrieve more; greedy; draft: an EAGLE head)",
           drafter=GraftDrafter, inputs=TARGET_AND_DRAFT, draft=EAGLE_HEAD, tree=True),
    Method(name="eagle-chain", family="feature-head", engine="speculative", guarantee=AR,
           summary="EAGLE: the head drafts a chain of k tokens from the target's hidden state (draft: an EAGLE "
                   "head)", drafter=EagleChainDrafter, inputs=TARGET_AND_DRAFT, draft=EAGLE_HEAD),
    Method(name="eagle3", family="feature-head", engine="speculative", guarantee=AR,
           summary="EAGLE-2's tree from an EAGLE-3 drafter in the layout vLLM, SGLang and speculators use (draft: "
                   "its directory, speculators or SpecForge)", drafter=Eagle3Drafter, inputs=TARGET_AND_DRAFT,
           draft=EAGLE3_DRAFTER, tree=True),
    Method(name="eagle3-chain", family="feature-head", engine="speculative", guarantee=AR,
           summary="an EAGLE-3 drafter (speculators / SpecForge layout) drafts a chain of k tokens, as vLLM does",
           drafter=Eagle3ChainDrafter, inputs=TARGET_AND_DRAFT, draft=EAGLE3_DRAFTER),
    Method(name="medusa", family="feature-head", engine="speculative", guarantee=AR,
           summary="Medusa-1: K heads on the last hidden state, a static tree of top-k products (draft: Medusa "
                   "heads)", drafter=MedusaDrafter, inputs=TARGET_AND_DRAFT, draft=MEDUSA_HEADS, tree=True),
    Method(name="pearl", family="speculative", engine="speculative", guarantee=AR,
           summary="a draft LM drafts on a second thread while the target verifies: pre-verify of the first draft "
                   "token, post-verify of the rest while it drafts on (PEARL, Liu et al. ICLR 2025)",
           drafter=PearlDrafter, inputs=DRAFT, draft=DRAFT_LM),
    Method(name="foreal", family="sentence-handoff", engine="speculative", guarantee="lossy", rule="unverified",
           summary="the target leads each sentence's first n tokens, the draft writes the rest unverified (the target "
                   "only reads them); a gate hands a sentence to the leader with probability p (FoReaL-Decoding, Li "
                   "et al. 2025)",
           drafter=ForealDrafter, inputs={"draft": the_draft, "sentences": sentences_of_target}, draft=DRAFT_LM),
]:
    register(_m)

from speclab.decoding.drafters.dllm import DllmDrafter  # noqa: E402
register(Method(name="dllm-draft", family="speculative", engine="speculative", guarantee=AR,
                summary="a block-diffusion LM fills k mask slots after the committed text in `steps` forwards, the "
                        "most confident first; the target verifies the block as a chain or tree (DFlash, Chen et "
                        "al. 2026; FlexDraft, Zhang et al. 2026)", drafter=DllmDrafter, inputs=DRAFT,
                draft=Draft("dllm", "a block-diffusion LM", {"smollm2-135m": "smollm2-dllm"})))
from speclab.decoding.drafters.osd import OsdDrafter  # noqa: E402
register(Method(name="osd", family="speculative", engine="speculative", guarantee=AR,
                summary="draft-model's chain with the draft distilled online (train=all: the whole draft, a copy the "
                        "caller owns; train=head: a low-rank adapter on its head) on the target's distributions where "
                        "the verify rejected, every `interval` buffered positions, by KL, reverse KL or JSD; the "
                        "caller's history keeps it across requests (OSD, Liu et al. ICML 2024)",
                drafter=OsdDrafter, inputs=DRAFT, draft=DRAFT_LM))
from speclab.decoding.drafters.clover import CloverDrafter  # noqa: E402
register(Method(name="clover", family="feature-head", engine="speculative", guarantee=AR,
                summary="Medusa-style heads on the last hidden state made regressive: each head also reads the token "
                        "the head before it drafted (an attention decoder), after an augmenting layer over the "
                        "prefix's hidden states; a tree by cumulative head probability (Clover, Xiao et al. 2024)",
                drafter=CloverDrafter, inputs=TARGET_AND_DRAFT, tree=True,
                draft=Draft("clover", "Clover heads", {"smollm2-135m": "smollm2-clover", "code-target": "code-clover"})))
from speclab.decoding.drafters.falcon import FalconDrafter  # noqa: E402
register(Method(name="falcon", family="feature-head", engine="speculative", guarantee=AR,
                summary="EAGLE's head made semi-autoregressive: each forward drafts k tokens, the last real entry "
                        "and k-1 mask entries after it, trained by glancing distillation; a tree by cumulative "
                        "draft probability (Falcon, Gao et al. AAAI 2025)",
                drafter=FalconDrafter, inputs=TARGET_AND_DRAFT, tree=True,
                draft=Draft("falcon", "a Falcon head", {"code-target": "code-falcon"})))
from speclab.decoding.drafters.peagle import PEagleDrafter  # noqa: E402
register(Method(name="peagle", family="feature-head", engine="speculative", guarantee=AR,
                summary="EAGLE's head drafts the round's k tokens in one forward: the last real entry, then k-1 "
                        "copies of one learned mask state in place of the features and tokens not drafted yet; "
                        "verified as a chain (P-EAGLE, Hui et al. 2026)",
                drafter=PEagleDrafter, inputs=TARGET_AND_DRAFT,
                draft=Draft("peagle", "a P-EAGLE head", {"code-target": "code-peagle"})))
from speclab.decoding.drafters.flexdraft import FlexDraftDrafter  # noqa: E402
register(Method(name="flexdraft", family="speculative", engine="speculative", guarantee=AR,
                summary="the target drafts a block itself: one forward over the pending token and k-1 mask rows "
                        "whose attention in the last layers is tuned (low rank), on the target's own cache; slot 1 "
                        "is the target's next token; the block is cut where the product of confidences falls under "
                        "theta, then verified (FlexDraft, Zhang et al. 2026, sequential form)",
                drafter=FlexDraftDrafter, inputs=TARGET_AND_DRAFT,
                draft=Draft("flexdraft", "a FlexDraft adapter", {"code-target": "code-flexdraft"})))
from speclab.decoding.drafters.causal_tree import CausalTreeDrafter  # noqa: E402
register(Method(name="causal-tree", family="speculative-tree", engine="speculative", guarantee=AR,
                summary="causal parallel tree drafting: one forward of the target drafts a whole tree with tuned "
                        "mask rows that are tree-causal (each sees the context and its own branch's rows) and carry "
                        "a learned branch rank, so a side branch's next token follows its own first token; verified "
                        "as a tree (JetSpec, Hu et al. 2026; DFlash, Chen et al. 2026; on FlexDraft's mask rows, "
                        "Zhang et al. 2026)",
                drafter=CausalTreeDrafter, inputs=TARGET_AND_DRAFT, tree=True,
                draft=Draft("causal-tree", "a causal-tree adapter", {"code-target": "code-causal-tree"})))
from speclab.decoding.drafters.hidden_transfer import HiddenTransferDrafter  # noqa: E402
register(Method(name="hidden-transfer", family="feature-head", engine="speculative", guarantee=AR,
                summary="trained linear maps turn the target's state after layer l into pseudo states for the next K "
                        "positions, which run through the target's own layers l+1..L on its cache (a draft step "
                        "after the verify); a tree by cumulative draft probability (Hidden Transfer, Wu et al. 2024)",
                drafter=HiddenTransferDrafter, inputs=TARGET_AND_DRAFT, tree=True,
                draft=Draft("hidden-transfer", "transfer layers", {"code-target": "code-hidden-transfer"})))
from speclab.decoding.drafters.ppd import PPDDrafter  # noqa: E402
register(Method(name="ppd", family="feature-head", engine="speculative", guarantee=AR,
                summary="trained prompt vectors ride in the verify after the root and the likeliest candidates: the "
                        "target's own rows there guess the tokens 2, 3, ... ahead; a static tree of top-k products "
                        "sized to this machine's verify costs (Hardware-Aware Parallel Prompt Decoding, Chen et al. "
                        "2024; draft: prompt tokens)",
                drafter=PPDDrafter, inputs=TARGET_AND_DRAFT, tree=True,
                draft=Draft("ppd", "prompt tokens", {"code-target": "code-ppd"})))
from speclab.decoding.drafters.lud import LudDrafter  # noqa: E402
register(Method(name="lud", family="feature-head", engine="speculative", guarantee="lossy", rule="unverified",
                summary="the target fine-tuned (a low-rank delta) on lexical units of its own text emits a unit a "
                        "forward: its next token, then k-1 placeholder rows' guesses while each reaches a confidence "
                        "threshold, kept unverified (rule=exact: verified by the next forward) (Lexical Unit "
                        "Decoding, Sun et al. LREC-COLING 2024; draft: the fine-tune)",
                drafter=LudDrafter, inputs=TARGET_AND_DRAFT,
                draft=Draft("lud", "a LUD fine-tune", {"code-target": "code-lud"})))
from speclab.decoding.drafters.m2r2 import M2R2Drafter  # noqa: E402
register(Method(name="m2r2", family="self-speculative", engine="speculative", guarantee=AR,
                summary="the target's first layers plus trained accelerator adapters (a residual stream R times as "
                        "fast, on the target's own cache) draft through its own head and exit early, fixed or by "
                        "confidence; the full target verifies (M2R2, Bhendawade et al. 2025; draft: an accelerator)",
                drafter=M2R2Drafter, inputs=TARGET_AND_DRAFT,
                draft=Draft("m2r2", "an M2R2 accelerator", {"code-target": "code-m2r2"})))
from speclab.decoding.drafters.rapid import RapidDrafter  # noqa: E402
register(Method(name="rapid", family="speculative", engine="speculative", guarantee=AR,
                summary="a RAG drafter: draft-model's chain with the draft reading only the prompt's chunks that BM25 "
                        "ranks best against its last `query` tokens, `retrieve` tokens of them; the target reads it all "
                        "(RAPID, Chen et al. ICML 2025; its enriched target: rule=rapid, lossy)",
                drafter=RapidDrafter, inputs=DRAFT, draft=DRAFT_LM, batchable=True,
                adaptive=lambda p: p["threshold"] is not None or p["schedule"] != "fixed"))
from speclab.decoding.drafters.s2d import S2DDrafter  # noqa: E402
register(Method(name="s2d", family="speculative", engine="speculative", guarantee=AR,
                summary="one sorted (nested) draft LM serves several targets: each drafts a chain from the sub-draft "
                        "depth that serves it, the shallowest whose agreement with that target's own text reaches a "
                        "threshold (S2D: sorted speculative decoding, Kavehzadeh et al. 2024; draft: code-s2d)",
                drafter=S2DDrafter, inputs=DRAFT,
                draft=Draft("sorted-draft", "a sorted draft model (speclab train s2d)",
                            {"code-target": "code-s2d", "code-target-s": "code-s2d"})))
from speclab.decoding.drafters.rasd import RASDDrafter  # noqa: E402
register(Method(name="rasd", family="feature-head", engine="speculative", guarantee=AR,
                summary="a retrieval tree (the continuations of the context's longest earlier suffix) pruned where "
                        "the EAGLE head gives a branch's first token little probability, fused with the head's tree by "
                        "longest prefix matching, one verify (RASD, Quan et al. Findings of ACL 2025; draft: an EAGLE "
                        "head)", drafter=RASDDrafter, inputs={**TARGET_AND_DRAFT, "key": vocabulary_of_target},
                draft=EAGLE_HEAD, tree=True))
from speclab.decoding.superposed import SuperposedConfig  # noqa: E402
register(Method(name="superposed", family="superposed", engine="superposed", guarantee="lossy", sampling=False,
                summary="k drafts for the user from one forward a token over the superposition (score-weighted mix) "
                        "of the drafts' last token embeddings; each step keeps the best k of k x topk candidates, "
                        "the LM's log-probability interpolated with an n-gram table's (the shipped prompt sets "
                        "and the model's own text); no verify (Superposed Decoding, Shen et al. NeurIPS 2024)",
                config=SuperposedConfig))


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
    register(Method(name=f"dag-{_s}", family="dag", engine="dag", guarantee="deterministic", summary=_d,
                    sampling=_s in ("sample", "all"), config=DecodeConfig, strategy=_s))


# diffusion: one row per commit policy; FreeDave is lossless against greedy one-token-per-step decoding
# only (it refuses a temperature); the others commit several tokens a step where one-per-step would one
DLLM_RUN_PARAMS = ("gen_length", "block_length", "eos_stop")
DLLM = dict(family="diffusion", engine="diffusion", guarantee="lossy", run_params=DLLM_RUN_PARAMS, loop=denoise)
DLLM_OWN = {"dllm-freedave": dict(guarantee="identical-to-one-per-step", loop=freedave, sampling=False),
            "dllm-entropy-bound": dict(noise_canvas=True)}   # where a row differs from DLLM
DLLM_POLICIES = {   # method -> (its policy's config, summary)
    "dllm-lowconf": (LowConfidence, "LLaDA: fixed steps per block, commit the most confident (or random) masked "
                                    "positions"),
    "dllm-threshold": (Threshold, "Fast-dLLM: commit every position above a confidence threshold (or the factor "
                                  "rule)"),
    "dllm-prophet": (Prophet, "Prophet: low-confidence steps, commit everything once the top-2 logit gap is large"),
    "dllm-sched": (Sched, "SchED: low-confidence steps, exit when the margin passes a progress-aware threshold"),
    "dllm-localleap": (LocalLeap, "LocalLeap: high-confidence anchors relax the threshold around them"),
    "dllm-freedave": (FreeDave, "FreeDave: K drafts verified in one batched forward; lossless vs one-token-per-step"),
    "dllm-entropy-bound": (EntropyBound, "DiffusionGemma's sampler: commit the lowest-entropy positions while their "
                                         "entropy sum stays under a bound (on DiffusionGemma: its whole noise-canvas "
                                         "loop)"),
    "dllm-llada21-edit": (JointThreshold, "LLaDA 2.1 token editing (SGLang JointThreshold): commit above a threshold "
                                          "and rewrite committed tokens the model now proposes otherwise, with "
                                          "post-edit steps"),
    "dllm-r2": (R2, "R²-dLLM: threshold commits plus confident windows, same-token runs and predictions stable for "
                    "n steps"),
    "dllm-adablock": (AdaBlock, "AdaBlock-dLLM: threshold commits in adaptive blocks that end at a confident "
                                "delimiter (inside the engine's block)"),
    "dllm-ete": (ETE, "ETE (From Bits to Rounds, Fu et al. 2025; speclab's reading of its abstract): threshold "
                      "commits across blocks, plus uncertain slots explored until a round carries a budget of nats"),
    "dllm-learn2pd": (Learn2PD, "Learn2PD: a filter trained on the dLLM's own runs commits the slots it scores as "
                                "final; end-of-text prediction"),
    "dllm-fastv2": (FastV2, "threshold commits in sub-blocks filled left to right, each step running only the "
                            "sub-block on a stale cache of its block where it can (Fast-dLLM v2, Wu et al. 2025)"),
    "dllm-dparallel": (EntropyThreshold, "dParallel (Chen et al. 2025): commit every slot whose entropy is under a "
                                         "threshold (nats), for a dLLM distilled to be certain sooner"),
}
for _name, (_config, _summary) in DLLM_POLICIES.items():
    register(Method(name=_name, config=_config, summary=_summary, **DLLM | DLLM_OWN.get(_name, {})))
