"""Typed records: the method-specific facts a round or a denoising step carries, declared.

A round (speculative engines) or a denoising step (diffusion) keeps what its method alone knows in
its `info` object: a skip mask, a draft model's version, how far a block was filled. Each such fact
belongs to one small record type declared here, a frozen dataclass whose fields are the `info`
keys it owns, each with its JSON type. On disk nothing changes (the keys sit in `info` as before, so
every saved trace still loads); what the declaration buys:

- loading checks every declared key's type (a hand-edited or damaged file fails in one line, naming
  the key, instead of inside a figure), and `undeclared(trace)` lists keys nobody declared (the
  suite runs every method with SPECLAB_STRICT_RECORDS=1, which refuses them when a trace is built);
- a figure declares the record it draws (`FigureSpec(record=SkipMask)`, figures.views), so it shows
  for every trace that holds that record, whatever method wrote it, and no view names a method;
- readers get typed values: `SkipMask.of(round)` is a SkipMask or None, `column(trace, SkipMask,
  "skip")` one value (or None) per step;
- docs/trace-format.md lists every record with its keys (`schema_table()`; a test keeps it current).

A method with facts of its own declares them beside its drafter or policy:

    from speclab.records import Record, record

    @record("round")
    class BeamLevel(Record):
        '''One level of the beam: the candidates kept and their scores.'''
        beam_kept: list | None = None
        beam_scores: list | None = None

and writes them with `tree.info.update(BeamLevel(beam_kept=..., beam_scores=...).info())`, or as
plain keys. A key belongs to one record type per level; `register_record` refuses a second owner.
"""
from __future__ import annotations

from typing import Any

from speclab.record_types import (LEVELS, OWNER, RECORDS, STRICT_ENV, Record, check_info, column,  # noqa: F401
                                  holds, names, owner, parts, record, register_record, registered_record,
                                  remove_record, schema_table, undeclared)

# -- a speculative round's records ---------------------------------------------------------------
@record("round")
class DraftShape(Record):
    """The draft the round offered: its shape (chain, static, dynamic, spectr, rsd), its length k or
    node count, a dynamic tree's budget and growth, SpecTr's chains (k of length L), RSD's branching,
    the head count and head forwards of a head drafter, and the tree's depth (per-position acceptance)."""
    shape: str | None = None
    k: int | None = None
    L: int | None = None
    nodes: int | None = None
    budget: int | None = None
    grown: int | None = None
    levels: int | None = None
    branches: list[int] | None = None
    depth: int | None = None
    heads: int | None = None
    head_forwards: int | None = None


@record("round")
class SkipMask(Record):
    """Which layers ran: a character a layer ("." runs, "a" attention skipped, "m" MLP skipped, "x"
    both), of SWIFT's draft, Unified Layer Skipping's forward, or layer-skip's exit (exit_layer)."""
    skip: str | None = None
    exit_layer: int | None = None


@record("round")
class CostGate(Record):
    """The cost gate's choice this round (gate: "spec" or "ar" and why) and the speeds it compared."""
    gate: str | None = None
    ar_tok_s: float | None = None
    spec_tok_s: float | None = None


@record("round")
class LookupMatch(Record):
    """A model-free drafter's match: the n-gram length (prompt lookup, lookahead), where it matched,
    the suffix match's length and position, and lookahead's window."""
    ngram: int | None = None
    match: int | None = None
    match_at: int | None = None
    where: int | None = None
    window: int | None = None


@record("round")
class BigramTable(Record):
    """ADED's adaptive table: entries learned, bigrams held, and the round's explore / exploit counts."""
    learned: int | None = None
    bigrams: int | None = None
    explore: int | None = None
    exploit: int | None = None


@record("round")
class RecyclingTable(Record):
    """Token recycling's adjacency table: candidates kept per token (width)."""
    width: int | None = None


@record("round")
class BeamSearch(Record):
    """RSD-S's stochastic beam (tree-rsd-s): sequences kept per level (beam_width), and per level how
    many of the beam's sequences kept no child (beam_truncated: cut early); each level's candidates
    and scores are the round's `tree-rsd-s` decisions."""
    beam_width: int | None = None
    beam_truncated: list[int] | None = None


@record("round")
class DraftVersion(Record):
    """An online-distilled draft (OSD): the version that drafted this round, and seconds spent
    updating it after the round (update_s)."""
    draft_version: int | None = None
    update_s: float | None = None


@record("round")
class PearlMode(Record):
    """PEARL's mode for the round (pre-verify or post-verify) and its draft length gamma."""
    mode: str | None = None
    gamma: int | None = None


@record("round")
class BlockFill(Record):
    """A block drafter (dllm-draft, flexdraft): the denoising forwards it took to fill the block."""
    steps: int | None = None


@record("round")
class StopReason(Record):
    """Why a stopping rule (SpecDec++) ended the draft: "head", "max", "eos"."""
    stop: str | None = None


@record("round")
class SyntheticRound(Record):
    """Synthetic acceptance: the draft passes it ran, and rounds drafted off the reference answer."""
    passes: int | None = None
    off_reference: bool | None = None


@record("round")
class HeadCoverage(Record):
    """A feature head's round: the emitted token when no head candidate covered it (coverage_miss),
    the copy nodes grafted into the tree (grafted), and the head's leaves pruned to make room for
    them (pruned: Graft), or, where a long enough copy drafted alone and the head rested, the
    match's length (overridden: eagle's override=N, TensorRT-LLM's suffix-automaton enhancer)."""
    coverage_miss: int | None = None
    grafted: int | None = None
    pruned: int | None = None
    overridden: int | None = None


@record("round")
class TreeFit(Record):
    """A draft tree sized to this machine's verify costs (eagle's budget=auto, prompt-lookup's k=auto;
    decoding.costs): the nodes kept of those grown (fit_nodes; a chain's tokens), the tokens the round
    expected to commit (fit_expect: 1 + the calibrated cumulative draft probability of the kept nodes),
    its expected cost in one-row forwards (fit_cost: the verify of 1 + n rows plus the drafting), the
    calibration so far (fit_scale: tokens accepted over probability predicted; eagle's) and, on the
    first such round, the measured c(T) for T = 1, 2, ... rows (fit_curve)."""
    fit_nodes: int | None = None
    fit_expect: float | None = None
    fit_cost: float | None = None
    fit_scale: float | None = None
    fit_curve: list | None = None


@record("round")
class DrafterSource(Record):
    """Where an EAGLE-3 drafter came from: its checkpoint format and source."""
    drafter: dict[str, Any] | None = None


@record("round")
class RetrievedSlice(Record):
    """RAPID's RAG drafter: the spans [start, end) of the target's context its draft reads this round
    (the retrieved chunks, then the query and the text since), and the context length each model
    attends over (draft_ctx, full_ctx: the two KV caches)."""
    rag_spans: list[list[int]] | None = None
    draft_ctx: int | None = None
    full_ctx: int | None = None


@record("round")
class TransferPrediction(Record):
    """Hidden Transfer's draft step: the layer l whose state the transfer layers read, the output
    index of the token offset 1 predicts (offset j: transfer_at + j - 1), and per offset the pseudo
    state's top-1 prediction [token, probability]."""
    transfer_layer: int | None = None
    transfer_at: int | None = None
    transfer_pred: list[list[float]] | None = None


@record("round")
class Handoff(Record):
    """FoReaL's round: who wrote its tokens (owner: "leader", one token of the target; "draft", a
    chain the draft wrote and the target only read, then the leader's next token), the sentence the
    round began in (0-based), and the offsets among its committed tokens where a sentence started."""
    owner: str | None = None
    sentence: int | None = None
    starts: list[int] | None = None


@record("round")
class DraftLength(Record):
    """A learned length policy's choice (SpecKV): the draft length it chose for the round (chosen_k)
    and the draft-side features it read, the draft's confidence (max q) and entropy (nats) at the
    round's first draft position."""
    chosen_k: int | None = None
    confidence: float | None = None
    entropy: float | None = None


@record("round")
class RetrievalFusion(Record):
    """RASD's round: the retrieval tree's nodes (rasd_found) after a suffix match of rasd_match
    tokens, the nodes pruned with their branches because the draft gave the branch's first token
    too little probability (rasd_pruned), the kept nodes already in the draft's tree (rasd_shared:
    source "both") and those added below it (rasd_added)."""
    rasd_match: int | None = None
    rasd_found: int | None = None
    rasd_pruned: int | None = None
    rasd_shared: int | None = None
    rasd_added: int | None = None


@record("round")
class ParallelBlock(Record):
    """A block drafted in one forward (P-EAGLE): the K slots' tokens (pblock_tokens), their draft
    probabilities (pblock_q), per slot whether its entry was the learned mask state rather than a
    real feature and token (pblock_mask: slot 1 reads the last committed feature, the rest the mask),
    and the head forwards that drafted the block (pblock_forwards: 1)."""
    pblock_tokens: list[int] | None = None
    pblock_q: list[float] | None = None
    pblock_mask: list[bool] | None = None
    pblock_forwards: int | None = None


@record("round")
class PpdFit(Record):
    """PPD's tree sized to the machine, once per run (first round): candidates (ppd_nodes) as rank
    paths (ppd_paths), the candidates carrying prompt tokens besides the root (ppd_attach), the
    verify's rows (ppd_rows), tokens a tree round expects (ppd_expect), the chance the last accepted
    node carries prompt tokens (ppd_cover), the rate chosen in tokens per one-row forward (ppd_rate;
    budget=auto only), the predicted chance to accept d tokens or more per depth d (ppd_reach), the
    measured c(T) (ppd_curve) and the best shape per candidate count weighed (ppd_weighed: [nodes,
    attached, rows, expect, cost, rate] each)."""
    ppd_nodes: int | None = None
    ppd_paths: list[list[int]] | None = None
    ppd_attach: list[int] | None = None
    ppd_rows: int | None = None
    ppd_expect: float | None = None
    ppd_cover: float | None = None
    ppd_rate: float | None = None
    ppd_reach: list[float] | None = None
    ppd_curve: list[float] | None = None
    ppd_weighed: list[list[float]] | None = None


@record("round")
class PromptGuess(Record):
    """PPD's guesses this round's tree came from: per offset j (token j+1 past the last emitted one)
    the prompt token's top-1 [token, probability] (ppd_guess), and whose prompt rows in the last
    verify gave them (ppd_from: "root" or "n<node>")."""
    ppd_guess: list[list[float]] | None = None
    ppd_from: str | None = None


@record("round")
class LexicalUnit(Record):
    """LUD's unit from the round's forward: per placeholder j (the token j+1 past the round's own next
    token) its top-1 [token, probability] (a draw and its probability when sampling: lud_slots), the
    probability a placeholder must reach to join (lud_threshold), how many joined (lud_span: the unit
    is the round's next token and these, the next round's draft) and why it ended (lud_end:
    "threshold", "repeat" a placeholder repeating the token before it, "eos", "k" all joined,
    "rejected" the verify rejected a token of this round's draft, voiding the guesses)."""
    lud_slots: list[list[float]] | None = None
    lud_threshold: float | None = None
    lud_span: int | None = None
    lud_end: str | None = None


@record("round")
class RouterChoice(Record):
    """FiRST's choice for the request, on its first round: per layer the router's score (router_scores,
    None for the first and last layers, which always run; the training prompts' label frequencies
    where router_mode is "fixed"), the threshold a score must reach (router_threshold), the most
    layers it may skip (router_budget) and the layers skipped while decoding (router_skipped)."""
    router_scores: list[float | None] | None = None
    router_threshold: float | None = None
    router_budget: int | None = None
    router_skipped: list[int] | None = None
    router_mode: str | None = None


@record("round")
class SubDraft(Record):
    """S2D's sub-draft: the depth of the sorted draft this round drafted from (s2d_depth), the sorted
    depths (s2d_depths), and per depth the target's tokens scored so far (s2d_scored) and how many of
    them that sub-draft's greedy token matched (s2d_hits): its acceptance on this target."""
    s2d_depth: int | None = None
    s2d_depths: list[int] | None = None
    s2d_scored: int | None = None
    s2d_hits: list[int] | None = None


@record("round")
class StreamExit(Record):
    """M2R2's accelerated residual stream: per drafted token the layer its draft exited after
    (m2r2_exits) and that exit's top-1 confidence (m2r2_conf), the confidence an exit before
    exit_after needs (m2r2_threshold; absent: a fixed exit), the stream's depth E and rate R
    (m2r2_depth, m2r2_rate: the fast state after j layers is trained toward the slow one after R j),
    and on the first round the part's held-out top-1 agreement with the final layer per layer, for
    the plain exits (m2r2_align_plain, layers 1..L) and the accelerated stream (m2r2_align_fast, 1..E)."""
    m2r2_exits: list[int] | None = None
    m2r2_conf: list[float] | None = None
    m2r2_threshold: float | None = None
    m2r2_depth: int | None = None
    m2r2_rate: float | None = None
    m2r2_align_plain: list[float] | None = None
    m2r2_align_fast: list[float] | None = None


# -- a denoising step's records ------------------------------------------------------------------
@record("step")
class NoiseCanvas(Record):
    """A noise-canvas sampler's step (DiffusionGemma): the canvas kind ("noise"), the sampling
    temperature, the tokens sampled for the block's slots, and the positions it accepted."""
    canvas: str | None = None
    temperature: float | None = None
    sampled: list[int] | None = None
    accepted: list[int] | None = None


@record("step")
class ForcedCommit(Record):
    """Positions committed although nothing passed the threshold (one a step keeps decoding moving)."""
    forced: list[int] | None = None


@record("step")
class StepEntropy(Record):
    """The predictive entropy of each masked slot (nats), and an entropy-bounded policy's bound and sum."""
    entropy: list[float] | None = None
    entropy_bound: float | None = None
    entropy_sum: float | None = None
    mean_entropy: float | None = None


@record("step")
class TopKCommit(Record):
    """A fixed count committed this step (low confidence, Prophet's and SchED's per-step k)."""
    k: int | None = None


@record("step")
class EarlyFinish(Record):
    """An early-commit rule fired (finish): Prophet's logit gap, SchED's g, or a DiffusionGemma
    canvas that stopped changing (stable)."""
    finish: bool | None = None
    gap: float | None = None
    g: float | None = None
    stable: bool | None = None


@record("step")
class AdaptiveBlock(Record):
    """AdaBlock's block for the step, [start, end), set where the model's delimiter fell."""
    adaptive_block: list[int] | None = None


@record("step")
class Anchors(Record):
    """LocalLeap's anchor positions: confident slots whose neighbourhood commits with them."""
    anchors: list[int] | None = None


@record("step")
class FastForward(Record):
    """Fast-dLLM v2's forward: which cache it ran (forward), its sub-block, rows scored, the AR first
    token, and why the step ended."""
    forward: str | None = None
    sub_block: list[int] | None = None
    rows: int | None = None
    ar_first: int | None = None
    why: str | None = None


@record("step")
class EditState(Record):
    """A revising policy (LLaDA 2.1 editing, R2): steps since the last edit, why the block finished,
    each slot's agreement streak, and the edits made by each rule."""
    post_edit_step: int | None = None
    block_done: str | None = None
    streak: list[int] | None = None
    by_rule: dict[str, Any] | None = None


@record("step")
class EteRound(Record):
    """ETE's round: the information committed (nats), the explored slots' share of it, the nats so far
    (rounds >= them / budget), the slots explored and their entropy (nats), the commits outside the
    active block, the cascades [slot, size] of the slots the round before explored, and how many
    slots crossed the threshold since."""
    information: float | None = None
    explore_information: float | None = None
    information_total: float | None = None
    explored: list[int] | None = None
    explored_entropy: list[float | None] | None = None
    outside_block: int | None = None
    cascade: list[list[int]] | None = None
    crossed: int | None = None


@record("step")
class DraftVerifyStep(Record):
    """FreeDave's step: the drafts it offered, how many the verify accepted, the tree node it took,
    their order, the draft tree itself, and whether a verify forward ran."""
    drafts: int | None = None
    accepted_drafts: int | None = None
    accepted_node: int | None = None
    order: list[int] | None = None
    tree: list[Any] | None = None
    verified_forward: bool | None = None


@record("step")
class LearnedScore(Record):
    """Learn2PD's filter: each slot's learned score (None: not eligible), and whether the end of text
    was committed this step."""
    score: list[float | None] | None = None
    end_of_text: int | None = None


@record("step")
class EntropyCommit(Record):
    """dParallel's entropy-threshold step: the threshold (nats), the eligible slots lowest entropy
    first (by_entropy) with their entropies (by_entropy_nats), and how many of them were at or under
    the threshold (the step commits that many, at least one)."""
    entropy_threshold: float | None = None
    by_entropy: list[int] | None = None
    by_entropy_nats: list[float] | None = None
    under_threshold: int | None = None
