"""Drafters that read the target's own hidden state (speclab.models.heads): EAGLE and Medusa.

Every verify forward already computes the target's last-layer hidden state x_t at each row; the
drafter keeps those of the committed rows (the pending tokens and the accepted path), so its input
costs nothing extra. The token the target just emitted has no hidden state yet (it is pending):
drafting starts from the last committed position that has one.

eagle-chain  k tokens, one EAGLE head step each (fixed, threshold or heuristic length).
eagle        EAGLE-2: a dynamic tree grown by cumulative draft probability under a node budget; each
             depth is one head forward over the tree so far (tree attention in the head's cache).
             With lookup=K, prompt lookup's copy (up to K tokens after an earlier occurrence of the
             last n >= ngram tokens) is grafted onto the tree: the head for open text, the copy for
             text that repeats, both in one verify. Lossless under sampling too: the tree's nodes (the
             head's top choices and the copy) tell the rule no q, so the verify walks them as point
             masses (recursive rejection; acceptance.py), whose law is the target's for any
             candidates that depend on the committed text alone.
medusa       Medusa-1: a static tree of top-k products, all K heads from one position, one call.
             Heads that carry their held-out rank accuracies (`medusa_rank_acc` in their config,
             written by `speclab train medusa`) get the paper's calibrated tree of `budget` nodes.

Provenance, in each node's `source`: "h{t}" = fed by the target's hidden state at position t;
"h{t}+{j}" = j steps of the head's own predicted features past it (eagle; an EAGLE-3 head reads
position t at several layers); "medusa{k}@h{t}" = head
k read position t. A target token outside the head's trimmed vocabulary could never have been
drafted: the round records it as `coverage_miss` in its info.

Host reads per round (a device -> host transfer, which waits for the device): eagle-chain one, its
tokens and their q together (with `threshold`, one per step instead); eagle one per depth
(trees.grow_dynamic: top-k, ranking and the chosen nodes on the device, the nodes' tokens and
their parents' head outputs gathered there for the next depth); medusa one (every head's top-k
ids and probabilities together). Reading the verify's captured features reads nothing. Each head
forward over a tree builds its tree mask on the host from the parents already read, and copies it
to the device.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from speclab.decoding.costs import given_curve
from speclab.decoding.drafters.lookup import PromptLookupDrafter, SuffixDrafter
from speclab.decoding.drafters.model import ChainDrafter, OwnDraftLM, check_k, host_read
from speclab.decoding.drafters.trees import Growing, calibrated_paths, check_budget, check_paths, grow_dynamic
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree
from speclab.models import kernels
from speclab.records import HeadCoverage, TreeFit
from speclab.models.heads import MedusaHeads, check_base, eagle_fuse, eagle_input, eagle_layers

MEDUSA_PATHS = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
                [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]]
MEDUSA_BUDGET = 5               # nodes of the calibrated tree (set from the verify cost; BENCHMARKS.md)


def _name(m) -> str:
    return str(getattr(m, "name_or_path", None) or type(m).__name__)


@dataclass(frozen=True)
class HeadKind:
    """A feature head's kind: what its draft must be and which target layers it reads."""
    train: str                                  # `speclab train <train> --target ...` makes one
    what: str                                   # how a message names it
    fits: Callable[[object], bool]              # is this module one
    layers: Callable[[object, int], tuple]      # (its config, the target's layer count) -> layers it reads


EAGLE = HeadKind("eagle", "an EAGLE head (e.g. smollm2-eagle)", lambda head: hasattr(head, "eagle_fc"), eagle_layers)
MEDUSA = HeadKind("medusa", "Medusa heads (e.g. smollm2-medusa)", lambda head: isinstance(head, MedusaHeads),
                  lambda config, n: (n,))


class FeatureReader:
    """Mixin: capture the target's hidden states at each verify (the last layer's; an EAGLE-3 head
    also earlier ones, its `eagle_layers`); keep the committed rows' features in `self.feats`
    (n, C) for positions [self.fed, self.fed + n), not yet given to the head."""

    @torch.inference_mode()
    def propose(self, ctx: Context) -> DraftTree:
        if self.feats is None:                  # first round: the prompt has no hidden states yet
            return DraftTree()
        return self.draft_at(ctx, len(ctx.ids) - 2)

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        """The round's drafts from the features of positions up to t, the last committed one."""
        raise NotImplementedError

    def read_target(self, target_model, head, kind: HeadKind, method: str):
        if head is None or not kind.fits(head):
            raise ValueError(f"method {method!r} needs {kind.what} as its draft, got {_name(head)}: "
                             f"train one with `speclab train {kind.train} --target ...`")
        check_base(head.config, target_model.config, _name(head), _name(target_model))
        n = len(target_model.model.layers)
        self.layers = kind.layers(head.config, n)
        if self.layers[-1] != n:
            raise ValueError(f"the head {_name(head)} reads target layers {list(self.layers)}, not ending at the "
                             f"last of {_name(target_model)}'s {n}: train a head for this target")
        self.drafts_from(head.lm_head.head_ids, head.config.vocab_size)

    def drafts_from(self, ids: torch.Tensor, vocab_size: int):
        """The ids the head scores: an emitted token outside them is a coverage miss."""
        self.in_head = torch.zeros(vocab_size, dtype=torch.bool)
        self.in_head[ids.cpu()] = True

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        target.capture_layers = self.layers
        self.feats, self.fed = None, 0

    def end(self):
        self.target.capture_layers = ()
        self.feats = None

    def observe(self, out: Outcome):
        hs = [self.target.captured.get(l) for l in self.layers]
        if any(h is None for h in hs):
            raise RuntimeError("the target forward did not capture its hidden states; "
                               "its backend must support capture_layers")
        rows = list(range(out.n_pending)) + [out.n_pending + i for i in out.path]
        new = self.prepare([h[0, rows] for h in hs])                       # (rows, C), pre-norm
        self.feats = new if self.feats is None else torch.cat([self.feats, new])
        if not self.in_head[out.emitted]:
            out.tree.info["coverage_miss"] = out.emitted
        super().observe(out)

    def feed(self, ctx: Context, **kw):
        """Give the head every committed (feature, next token) pair it has not seen: entries
        fed..n-2 (the last token is pending). Returns its logits at n-2 and its output (1, C) there
        (the feature its next step reads); `head_rows` runs the head itself."""
        n = len(ctx.ids)
        assert self.head_length == self.fed and self.fed + len(self.feats) == n - 1
        nxt = torch.tensor(ctx.ids[self.fed + 1:n], device=self.feats.device)
        logits, out = self.head_rows(self.feats, nxt, **kw)
        self.fed, self.feats = n - 1, None
        return logits, out

    def prepare(self, xs: list[torch.Tensor]) -> torch.Tensor:
        """The committed rows' states at self.layers -> the features kept (the last layer's)."""
        return xs[-1]


class EagleChainDrafter(FeatureReader, OwnDraftLM, ChainDrafter):
    name = "eagle-chain"

    def __init__(self, target_model, draft, vocab: int | None = None, **kw):
        super().__init__(**kw)
        self.read_target(target_model, draft, EAGLE, self.name)
        self.head = head = draft
        self.attach_lm(head, "fast")                     # its own one-layer cache, fed by embeds
        if vocab is not None:                            # draft from the `vocab` most frequent ids only
            self.lm.trim_head(vocab)
            self.drafts_from(self.lm.head_ids, head.config.vocab_size)
        self.lm.capture_layers = (1,)
        fc, fc3 = head.eagle_fc, getattr(head, "eagle_fc3", None)
        self.fc, self.fc3 = fc, fc3                      # the fusions in speclab's kernel where it runs
        if kernels.available(fc.weight.device, fc.weight.dtype):
            self.fc = kernels.Packed(fc.weight, fc.bias)
            if fc3 is not None:
                self.fc3 = kernels.Packed(fc3.weight)

    def prepare(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return eagle_input(self.head, xs, self.fc3)     # EAGLE-3's fusion of the layers, if it has one

    def fuse(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(T, C) pre-norm features, (T,) next tokens -> the head's (T, C) inputs."""
        # the head's final norm (a frozen copy of the target's) as its lean forward applies it:
        # in speclab's kernel where it runs, which costs less than the norm module's own call
        return eagle_fuse(self.head, self.lm.rms(feats.to(self.lm.dtype), self.lm.norm), tokens, self.fc)

    @property
    def head_length(self) -> int:
        return self.lm.length

    def head_rows(self, feats, nxt, subset: bool = False):
        """The head over (feature, next token) rows: logits (V,) at the last (subset: (N,) over the
        head's own ids) and its output (1, C) there."""
        logits = self.lm.forward(None, embeds=self.fuse(feats, nxt), subset=subset)
        return logits[-1], self.lm.captured[1][0, -1:]

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        state = {}
        ids = self.subset_ids(self.lm)               # greedy: score only the head's own ids

        def step(inp):
            if inp is None:
                logits, state["h"] = self.feed(ctx, subset=ids is not None)
                return logits
            x = self.fuse(state["h"], inp)
            logits = self.lm.forward(None, embeds=x, subset=ids is not None)
            state["h"] = self.lm.captured[1][0, -1:]
            return logits[-1]
        tokens, q_tok, dists = self.run_chain(step, None, ids)
        self.lm.keep(self.fed)                  # drop the head's speculative entries
        tree = DraftTree.chain(tokens, q_tok, "", dists, k=len(tokens))
        tree.source = [f"h{t}" if j == 0 else f"h{t}+{j}" for j in range(len(tokens))]
        return tree

    def observe(self, out: Outcome):
        super().observe(out)
        self.adapt(out)


OVERRIDE_K = 8      # eagle's override=N: the copy's length at most (on AVX2 a verify of 9 rows is ~2.3 forwards)


class EagleDrafter(EagleChainDrafter):
    """EAGLE-2: the dynamic tree of tree-dynamic, each depth one head forward over the tree so far.
    Its children are the head's top choices, so only the head's own N ids are scored and ranked
    (softmax and top-k over N, not over the V-wide spread with -inf elsewhere)."""
    name = "eagle"

    def __init__(self, target_model, draft, budget: int | str = 5, width: int = 3, depth: int = 3,
                 vocab: int | None = None, threshold: float | None = 0.2, lookup: int = 0, ngram: int = 2,
                 costs: list | None = None, override: int = 0):
        # budget="auto": each round keeps the nodes this machine's verify costs favour, of up to
        # width x depth grown (decoding.costs; its choice in the round's TreeFit record). costs: c(T)
        # for T = 1, 2, ... rows to size it with instead (another machine's, measured there)
        if isinstance(budget, str) and budget != "auto":
            raise ValueError(f"eagle: budget must be a node count or 'auto' (sized to this machine's verify "
                             f"costs), got {budget!r}")
        self.fitted = budget == "auto"
        self.given_costs = given_curve(costs, self.fitted, "eagle")
        budget = width * depth if self.fitted else budget
        check_budget(budget, width, depth, threshold)
        super().__init__(target_model, draft, vocab=vocab, k=depth)
        self.cost_model = target_model              # whose verify costs a fitted tree reads
        # tree_threshold: where the tree stops growing (self.threshold is the chain drafter's, unused here)
        self.budget, self.width, self.depth, self.tree_threshold = budget, width, depth, threshold
        # lookup: up to this many tokens copied after an earlier occurrence of the last n >= ngram
        # tokens, grafted onto the tree (a 1-token match is mostly chance: BENCHMARKS.md, eagle)
        self.lookup = None
        if lookup:
            check_k(lookup, "lookup")
            check_k(ngram, "ngram")
            self.lookup = PromptLookupDrafter(k=lookup, k_full=lookup, max_ngram=max(3, ngram), min_ngram=ngram)
        # override: where the context's end repeats an earlier stretch of at least this many tokens
        # (the longest such match, a suffix automaton's), the round drafts that copy alone and the
        # head rests (TensorRT-LLM's suffix-automaton enhancer)
        self.suffix = None
        if override:
            check_k(override, "override")
            self.suffix = SuffixDrafter(max_k=OVERRIDE_K, min_match=override)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        if self.suffix is not None:
            self.suffix.begin(ctx, target, sampler, gen, record)
        if self.fitted:
            from speclab.decoding.costs import machine_curve
            self.curve, self.one_row_s = machine_curve(self.cost_model)   # measured once per model and path
            if self.given_costs is not None:
                self.curve = self.given_costs
            self.predicted = self.accepted = 0.0    # the calibration: tokens accepted / probability predicted
            self.draft_costs: list[float] = []      # drafting's cost in one-row forwards, recent rounds
            self.chosen = None

    def _fit(self, scores: list[float]) -> int:
        from speclab.decoding.costs import fit_nodes
        recent = sorted(self.draft_costs[-8:])
        d = recent[len(recent) // 2] if recent else 0.0
        scale = min(4.0, max(0.25, (self.accepted + 1.0) / (self.predicted + 1.0)))
        n, gain, cost = fit_nodes(scores, self.curve, draft_cost=d, scale=scale)
        self.chosen = (n, gain, cost, scale, sum(scores[:n]))
        return n

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        if self.suffix is not None:             # fed every round; a long enough match drafts alone
            copy = self.suffix.propose(ctx)
            if len(copy):
                copy.info.update(HeadCoverage(overridden=copy.info["match"]).info())
                return copy
        outs, root_q = [], []                   # (1 + N, C): the head's output at the root, then per node

        def q_at(tree: Growing) -> torch.Tensor:
            if not root_q:                      # first call: the committed entries, then the root
                logits, root = self.feed(ctx, subset=True)
                root_q.append(logits.softmax(-1)[None])
                outs.append(root)
            if not len(tree):
                return root_q[0]
            feats = outs[0].index_select(0, tree.dev_parents + 1)              # (N, C): each node's parent's
            x = self.fuse(feats, tree.dev_tokens)
            logits = self.lm.forward(None, parents=tree.parents, embeds=x, subset=True)   # (nodes, N)
            outs[0] = torch.cat([outs[0][:1], self.lm.captured[1][0]])
            self.lm.keep(self.fed)              # tree entries are never kept in the head's cache
            return torch.cat([root_q[0], logits.softmax(-1)])
        t0 = time.perf_counter()
        tree = grow_dynamic(self.budget, self.width, self.depth, q_at,
                            label=lambda d: f"h{t}" if d == 1 else f"h{t}+{d - 1}", ids=self.lm.head_ids,
                            threshold=self.tree_threshold, fit=self._fit if self.fitted else None)
        if self.fitted:
            self.draft_costs.append((time.perf_counter() - t0) / self.one_row_s)
            n, gain, cost, scale, predicted = self.chosen
            self.predicted += predicted
            fit = TreeFit(fit_nodes=n, fit_expect=round(gain, 3), fit_cost=round(cost, 3), fit_scale=round(scale, 3),
                          fit_curve=[self.curve[T] for T in sorted(self.curve)] if len(self.draft_costs) == 1 else None)
            tree.info.update(fit.info())
        if self.lookup is not None:
            graft(tree, self.lookup.propose(ctx))
        return tree

    def observe(self, out: Outcome):
        if self.fitted and "fit_nodes" in out.tree.info:
            self.accepted += len(out.path)
        super().observe(out)


def graft(tree: DraftTree, chain: DraftTree):
    """Add a chain as a path from the root, through the nodes `tree` already has for its first
    tokens; info["grafted"]: how many nodes it added (they have no q: point masses under sampling)."""
    kids, node, added = tree.children(), -1, 0
    for tok, src in zip(chain.tokens, chain.source):
        same = [c for c in kids.get(node, []) if tree.tokens[c] == tok]
        if same:
            node = same[0]
        else:                                   # a new node has no children: the rest is new too
            node, added = tree.add(tok, node, None, src), added + 1
    tree.info["grafted"] = added


class MedusaDrafter(FeatureReader, Drafter):
    """Medusa-1: K heads read the last committed hidden state; the static pattern `paths` takes
    ranks of head d's distribution at depth d (top-k products), verified in one forward."""
    name = "medusa"

    def __init__(self, target_model, draft, paths=None, budget: int | None = None):
        super().__init__()
        self.read_target(target_model, draft, MEDUSA, self.name)
        self.heads = heads = draft
        rank_acc = getattr(heads.config, "medusa_rank_acc", None)
        if paths is not None and budget is not None:
            raise ValueError("medusa takes paths or budget, not both: budget sizes the calibrated tree")
        if paths is None and rank_acc:          # the tree calibrated on the heads' held-out text
            paths = calibrated_paths(rank_acc, MEDUSA_BUDGET if budget is None else budget)
        elif paths is None:                     # the default pattern, cut to the heads there are
            paths = [p for p in MEDUSA_PATHS if len(p) <= heads.n_heads][:budget]
        self.paths = check_paths(paths)
        deepest = max(len(p) for p in self.paths)
        if deepest > heads.n_heads:
            raise ValueError(f"medusa paths go {deepest} deep but the model has {heads.n_heads} heads: "
                             f"use paths of at most {heads.n_heads} ranks")
        self.ranks = max(max(p) for p in self.paths) + 1
        # only the heads the tree reads run (the calibrated tree of 5 reads heads 1-2 of 4)
        self.deepest = deepest
        W = heads.lm_head.weight                                    # (N, C): the target's kept rows
        # the trimmed head and the blocks in speclab's bf16 kernel where it runs (F.linear reads
        # them slower: docs/performance.md); the first layers, which all read the same norm(x), as one matrix
        self.w1 = self.w2 = None
        if kernels.available(W.device, W.dtype):
            self.score = kernels.Packed(W)
            self.w1 = kernels.Packed(torch.cat([w.weight for w in heads.w1[:deepest]]),   # (1, C) -> (1, d C)
                                     torch.cat([w.bias for w in heads.w1[:deepest]]))
            self.w2 = [kernels.Packed(w.weight) for w in heads.w2[:deepest]]
        else:
            self.score = lambda h: F.linear(h, W)

    def draft_at(self, ctx: Context, t: int) -> DraftTree:
        h = self.heads.hidden(self.feats[-1:], self.w1, self.w2, self.deepest)[:, 0]
        p = self.score(h).float().softmax(-1)                  # (deepest, N): head k -> token t+1+k
        self.forwards += 1
        self.feats = None
        top = p.topk(self.ranks, -1)                                         # over the kept ids only
        ids, probs = host_read(self.heads.lm_head.head_ids[top.indices], top.values)      # the round's one read
        tree, node_of = DraftTree(info={"shape": "static", "nodes": len(self.paths)}), {(): -1}
        for path in self.paths:                 # depth then rank: every parent before its children
            d, r = len(path) - 1, path[-1]      # a node at depth d+1 is head d+1's rank-r guess
            node_of[path] = tree.add(ids[d][r], node_of[path[:-1]], probs[d][r], f"medusa{d + 1}@h{t}")
        return tree
