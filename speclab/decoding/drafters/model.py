"""Model drafters: a separate small draft model, and the target's own early exit (layer skip).

draft-model   k tokens from a draft LM with its own KV cache (`vocab=N`: a trimmed-vocabulary draft
              scores only its head's N most frequent ids). Length policies:
              fixed k; `threshold` (stop once the draft's probability of its own token falls below
              the threshold, up to max_k; SpecDec++'s trained stop is `specdec++`, drafters/specdecpp.py);
              `schedule="heuristic"` (transformers: k += 2 after a fully accepted draft, k -= 1 otherwise).
layer-skip    LayerSkip self-speculation: draft with the first L layers of the target through its
              shared final norm and head. The draft writes into the TARGET's cache for layers < L
              (those entries equal what the target itself computes for committed tokens, so they
              are reused, never recomputed) and drops its speculative entries before verify.
              exit_layer="auto" picks L online (DEL style): every verify also scores each candidate
              exit on the committed tokens, and L maximises expected tokens per unit of cost.
"""
from __future__ import annotations

import torch

from speclab.decoding.acceptance import greedy_ids, sample, warp
from speclab.decoding.speculative import Context, Drafter, Outcome, forwards_of
from speclab.decoding.tree import DraftTree
from speclab.models.backends import make_lm
from speclab.models.hf import early_exit_view
from speclab.trace import Decision


def check_k(k: int, name: str = "k"):
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"{name} must be an integer >= 1 (number of draft tokens per round), got {k!r}")


def host_read(*xs: torch.Tensor) -> list:
    """Tensors of one shape (ids, probabilities) read to the host in ONE transfer (a transfer waits
    for the device), each as the nested lists .tolist() gives: float64 holds every id and every
    float32 exactly, and integer tensors come back as ints."""
    both = torch.stack([x.double() for x in xs]).tolist()
    return [_typed(b, x.dtype) for b, x in zip(both, xs)]


def _typed(rows, dtype):
    if dtype.is_floating_point:
        return rows
    return [_typed(r, dtype) for r in rows] if isinstance(rows, list) else int(rows)


class ChainDrafter(Drafter):
    """Shared draft loop: k single-token steps of a causal LM, greedy or sampled. Host reads: one
    per round (the tokens and their q together), or with `threshold` one per step (the stop test
    needs q on the host) and none after."""

    def __init__(self, k: int = 4, threshold: float | None = None, max_k: int = 8,
                 schedule: str = "fixed"):
        super().__init__()
        check_k(k)
        if threshold is not None and not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if schedule not in ("fixed", "heuristic"):
            raise ValueError(f"schedule must be 'fixed' or 'heuristic', got {schedule!r}")
        self.k0, self.threshold, self.max_k, self.schedule = k, threshold, max(max_k, k), schedule

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.k = self.k0

    def draft_length(self) -> int:
        return self.max_k if self.reads_each_step() else self.k

    def reads_each_step(self) -> bool:
        """Each draft step reads its token and q to the host, for stop_after to decide there."""
        return self.threshold is not None

    def stop_after(self, i: int, token: int, q_tok: float) -> bool:
        """After draft step i (0-based), which drafted `token` with probability q_tok: stop drafting?
        (SpecDec++'s drafter overrides it with its head's rule.)"""
        return q_tok < self.threshold

    def run_chain(self, step, first, ids: torch.Tensor | None = None) -> tuple[list[int], list, torch.Tensor | None]:
        """Draft up to draft_length() tokens: step(first) gives the logits (V,) of the first draft
        token, step(token (1,)) those of the next. Returns tokens, their q, and q dists (k, V) when
        sampling (the rule needs them) or recording "full" (the views show them; greedy ignores them).
        ids (N,): step gives logits over these token ids only (a trimmed-vocabulary draft, greedy,
        not recording "full"; see subset_ids): the argmax and its q are the same, found over N."""
        inp = first
        toks, dists, confs = [], [], []
        read_t, read_q = [], []                 # what a threshold's per-step read brought to the host
        per_step = self.reads_each_step()
        need_q = self.record is not None or per_step
        for i in range(self.draft_length()):
            logits = step(inp)                                              # (V,)
            if self.sampler.greedy:
                tok = greedy_ids(logits)
                if need_q:
                    q = logits.softmax(-1)
                    confs.append(q[tok])
                    if self.record == "full":       # the distribution the argmax came from, for the views
                        dists.append(q)
                if ids is not None:
                    tok = ids[tok]
            else:
                q = warp(logits, self.sampler)
                tok = sample(q, self.gen)
                dists.append(q)
                confs.append(q[tok])
            toks.append(tok)
            if per_step:                        # the step's one read: its token and q together
                t, c = host_read(tok.reshape(()), confs[-1].reshape(()))
                read_t.append(t)
                read_q.append(c)
                if self.stop_after(i, t, c):
                    break
            inp = tok.view(1)
        if per_step:
            tokens, q_tok = read_t, read_q
        elif confs:                             # the round's one read: tokens and q together
            tokens, q_tok = host_read(torch.stack(toks).reshape(-1), torch.stack(confs).reshape(-1))
        else:
            tokens, q_tok = torch.stack(toks).reshape(-1).tolist(), [None] * len(toks)
        return tokens, q_tok, (torch.stack(dists) if dists else None)

    @staticmethod
    def lm_step(lm, subset: bool = False):
        """The step of a causal LM with its own cache: run the given ids, logits of the last
        (subset: over its trimmed head's own ids only)."""
        if subset:
            return lambda inp: lm.forward(inp, logits_to_keep=1, subset=True)[-1]
        return lambda inp: lm.forward(inp, logits_to_keep=1)[-1]

    def subset_ids(self, lm) -> torch.Tensor | None:
        """The ids of lm's trimmed head when drafting can score only those: greedy (the argmax of
        the V-wide spread, -inf elsewhere, is one of them) and no "full" record (which keeps the
        V-wide q for the views); the lean forward then skips building that spread."""
        ids = getattr(lm, "head_ids", None)
        return ids if ids is not None and self.sampler.greedy and self.record != "full" else None

    def adapt(self, out: Outcome):
        if self.schedule == "heuristic" and len(out.tree):     # an ar round (gated off) says nothing
            drafted = len(out.tree)
            self.k = min(self.max_k, self.k + 2) if len(out.path) == drafted else max(1, self.k - 1)


class OwnDraftLM:
    """Mixin for drafters with their own draft LM and KV cache: its calls are the draft forwards."""

    def attach_lm(self, draft_model, backend: str):
        self.lm = make_lm(draft_model, "draft", backend)

    forwards = forwards_of("lm")

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.lm.reset()
        # a static-shape draft runner sizes its cache for the request the target was sized for
        # (the draft never runs past the target's committed tokens plus its own draft)
        request = getattr(target, "request", None)
        if request and hasattr(self.lm, "reserve"):
            self.lm.reserve(request)


class DraftModelDrafter(OwnDraftLM, ChainDrafter):
    name = "draft-model"

    def __init__(self, draft, backend: str = "auto", vocab: int | None = None, **kw):
        super().__init__(**kw)
        self.attach_lm(draft, backend)
        if vocab is not None:           # draft from the trimmed head's `vocab` most frequent ids only
            if not hasattr(self.lm, "trim_head"):
                raise ValueError(f"vocab={vocab} cuts the head of a trimmed-vocabulary draft on speclab's lean forward "
                                 f"(a plain Llama draft, backend='auto', 'fast' or 'exact'); this one runs through "
                                 f"transformers (backend={backend!r})")
            self.lm.trim_head(vocab)

    offset = 0          # the draft's positions less the target's (RAPID's draft reads a shorter slice)

    def draft_context(self, ctx: Context) -> list[int]:
        """The tokens the draft reads: the whole context (RAPID's, drafters/rapid.py: a retrieved slice)."""
        return ctx.ids

    def propose(self, ctx: Context) -> DraftTree:
        pending = self.draft_context(ctx)[self.lm.length:]      # the draft cache holds a prefix of it
        ids = self.subset_ids(self.lm)
        tokens, q_tok, dists = self.run_chain(self.lm_step(self.lm, ids is not None),
                                              torch.tensor(pending, device=ctx.device), ids)
        return DraftTree.chain(tokens, q_tok, "draft", dists, k=len(tokens))

    def observe(self, out: Outcome):
        # the draft cache ran the committed prefix plus drafts[:-1]; keep what the target accepted
        self.lm.keep(min(self.lm.length, out.prefix_len + self.offset + len(out.path)))
        self.adapt(out)


class LayerSkipDrafter(ChainDrafter):
    name = "layer-skip"
    captures_only_when_drafting = True   # observe() scores exits only after rounds that drafted

    def __init__(self, target_model, exit_layer: int | str = "auto", candidates=None,
                 overhead: float = 0.25, per_round: int = 3, **kw):
        super().__init__(**kw)
        n = len(getattr(getattr(target_model, "model", None), "layers", []))
        early_exit_view(target_model, 1 if exit_layer == "auto" else int(exit_layer))  # validates
        self.model, self.n_layers, self.overhead, self.per_round = target_model, n, overhead, per_round
        self.auto = exit_layer == "auto"
        trained = getattr(target_model.config, "speclab_exit_layers", None)
        if candidates is not None and not (isinstance(candidates, (list, tuple)) and candidates and all(
                type(c) is int and 1 <= c < n for c in candidates)):
            raise ValueError(f"candidates must be a non-empty list of exit layers 1..{n - 1}, got {candidates!r}")
        self.candidates = list(candidates or trained or range(1, n))
        self.layer = (self.candidates[len(self.candidates) // 2] if self.auto else int(exit_layer))
        self.forwards = 0

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.matches = {l: 1.0 for l in self.candidates}  # running acceptance estimate per exit
        self.turn = 0
        if self.auto:   # every verify also keeps the hidden state after each candidate exit
            target.capture_layers = self.candidates

    def end(self):
        self.target.capture_layers = ()

    def propose(self, ctx: Context) -> DraftTree:
        L = self.layer
        if self.auto:   # capture only the exits observe() scores after this round: each capture splits
            n = len(self.candidates)    # the target's forward at that layer
            self.scoring = {L, *(self.candidates[(self.turn + j) % n] for j in range(min(self.per_round, n)))}
            self.target.capture_layers = tuple(sorted(self.scoring))
        lm = self.target.exit_lm(L)                                         # shares the target cache
        pending = ctx.ids[len(ctx.ids) - ctx.pending:]
        tokens, q_tok, dists = self.run_chain(self.lm_step(lm), torch.tensor(pending, device=ctx.device))
        self.forwards += lm.forwards
        self.target.drop_layers_tail(L, len(pending) + len(tokens) - 1)     # undo speculative KV
        tree = DraftTree.chain(tokens, q_tok, f"exit{L}", dists, k=len(tokens), exit_layer=L,
                               skip="." * L + "x" * (self.n_layers - L))      # the layers the draft ran
        if self.auto and self.record is not None:     # DEL's estimates the exit was chosen by
            tree.decisions.append(Decision("del-exit", {
                "tokens_per_cost": round(self.expected_speed(L), 4), "exits": list(self.candidates),
                "alpha": [round(self.matches[c], 4) for c in self.candidates]}, output=L))
        return tree

    @torch.inference_mode()
    def observe(self, out: Outcome):
        self.adapt(out)
        self.captured = self.target.captured
        if not self.auto or not self.captured or not len(out.tree):
            return          # a round that drafted nothing (gated off) pays nothing for scoring exits
        # rows of the verify forward that predicted each committed token: the last pending token,
        # then each accepted node
        rows = [out.n_pending - 1] + [out.n_pending + i for i in out.path]
        want = torch.tensor(out.accepted_tokens + [out.emitted], device=out.logits.device)
        # each exit's head costs an LM-head matmul: score the current exit and `per_round` others
        # in turn (all 29 of a real model every round cost more than the target forward itself)
        n = len(self.candidates)
        self.turn = (self.turn + min(self.per_round, n)) % n
        for l in self.scoring:
            h = self.captured[l]
            hit = (self.target.final_norm_head(h[0, rows]).argmax(-1) == want).float().mean().item()
            self.matches[l] = 0.9 * self.matches[l] + 0.1 * hit
        self.captured = {}
        self.layer = max(self.candidates, key=self.expected_speed)

    def expected_speed(self, layer: int) -> float:
        """Expected tokens per round / cost of the round in target forwards (chain of length k)."""
        a, k = min(self.matches[layer], 0.999), self.draft_length()
        tokens = (1 - a ** (k + 1)) / (1 - a)
        cost = 1 + k * (self.overhead + (1 - self.overhead) * layer / self.n_layers)
        return tokens / cost
