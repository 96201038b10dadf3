"""Model-free drafters that copy: prompt lookup (n-gram match) and suffix matching.

prompt-lookup   find an earlier occurrence of the last n tokens (n = max_ngram down to
                min_ngram) in prompt + output, the earliest by default (`prefer="recent"` for the
                latest); propose the k tokens that followed it, and k_full (default 2k + 1: twice
                the verify's rows) right after a draft the target accepted whole (a copy in progress
                tends to go on; k_full = k turns this off). The default k = 5 fits the bf16 CPU
                kernel: it applies each weight to up to 6 rows in one pass, so a verify of 1 + 5
                rows costs about what one row costs, and 1 + 11 rows two passes (BENCHMARKS.md,
                the cost of a verify). With `grow` > 0 the draft length also follows the evidence:
                min(k, max(1, grow * (n - 1))) for a match of n tokens, so a lone 1-gram hit
                (often chance) costs a 2-token verify, not a longer one. With k="auto" each round
                drafts the length this machine's verify costs favour (decoding.costs, as eagle's
                budget="auto"): the continuation's positions get acceptance chances learned in the
                run, per state (a copy in progress or not; the match's n-gram length), and the
                round keeps the n of up to AUTO_K tokens that maximise expected tokens per unit of
                cost (n = 0: a plain step). On AVX2, where extra verify rows are dear, the drafts
                shorten outside a copy; where they hide behind the weight stream, they stay long.
suffix          SuffixDecoding: a suffix automaton over the prompt, the output so far AND, given a
                `history=SuffixHistory()` the caller owns, that owner's earlier requests, finds the
                longest suffix of the context seen before; the draft length grows with the match
                length (k = min(max_k, factor * match)).
All drafts are point masses (q = 1): under sampling they are accepted with probability p(x).

A SuffixHistory is what a caller keeps across requests; the methods with other such state (OSD's
online drafts, SWIFT's skip sets) keep it in a RequestStore, found beside the caller's
SuffixHistory (`RequestStore.named_by`) or passed as `history` itself.
"""
from __future__ import annotations

import bisect
import heapq
import threading
from collections import OrderedDict

from speclab.decoding.costs import fit_nodes, given_curve
from speclab.decoding.drafters.model import check_k
from speclab.decoding.speculative import Context, Drafter
from speclab.decoding.tree import DraftTree
from speclab.records import TreeFit
from speclab.trace import Decision


AUTO_K = 16         # k="auto": the longest draft a round may choose
# k="auto"'s prior chance that a drafted token is accepted, given the ones before it were: right
# after a draft accepted whole (a copy goes on: AUTO_PRIOR_COPY), else by the match's n-gram length (a 1-gram hit is
# mostly chance). Worth AUTO_WEIGHT rounds of evidence; each run then learns its own.
AUTO_PRIOR_COPY, AUTO_PRIOR = 0.9, {1: 0.25, 2: 0.5, 3: 0.7}
AUTO_WEIGHT = 2.0


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, k: int | str = 5, max_ngram: int = 3, min_ngram: int = 1, prefer: str = "first",
                 grow: int = 0, k_full: int | None = None, costs: list | None = None, target_model=None):
        super().__init__()
        if isinstance(k, str) and k != "auto":
            raise ValueError(f"prompt-lookup: k must be a token count or 'auto' (sized to this machine's verify "
                             f"costs), got {k!r}")
        self.fitted = k == "auto"
        # costs: c(T) for T = 1, 2, ... rows to size with instead of this machine's (another machine's)
        self.given_costs = given_curve(costs, self.fitted, "prompt-lookup")
        if self.fitted:
            if target_model is None:
                raise ValueError("prompt-lookup: k='auto' sizes each draft to the target's verify costs, so it needs "
                                 "target_model (the registry's prompt-lookup passes it)")
            k = AUTO_K
            k_full = k if k_full is None else k_full
        self.cost_model = target_model              # whose verify costs a fitted draft reads
        check_k(k)
        k_full = 2 * k + 1 if k_full is None else k_full         # twice the verify rows: 2 (k + 1)
        check_k(k_full, "k_full")
        if k_full < k:
            raise ValueError(f"k_full (the draft length after a fully accepted draft) must be >= k = {k}, got {k_full}")
        if type(min_ngram) is not int or type(max_ngram) is not int or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if prefer not in ("first", "recent"):
            raise ValueError(f"prefer must be 'first' (earliest match, as transformers) or 'recent', got {prefer!r}")
        if type(grow) is not int or grow < 0:
            raise ValueError(f"grow must be an integer >= 0 (0 = always k tokens), got {grow}")
        self.k, self.max_ngram, self.min_ngram, self.prefer, self.grow = k, max_ngram, min_ngram, prefer, grow
        self.k_full = k_full
        self.streak = False                 # the last draft was accepted whole

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.streak = False
        if self.fitted:
            from speclab.decoding.costs import machine_curve
            self.curve = self.given_costs or machine_curve(self.cost_model)[0]   # measured once per model and path
            # state -> per draft position: [rounds whose draft reached it, rounds that accepted it]
            self.counts: dict[tuple, list[list[int]]] = {}
            self.asked: tuple | None = None    # the last round's (state, tokens drafted)
            self.fits = 0

    def observe(self, out):
        if len(out.tree):                   # an ar round (gated off) says nothing
            self.streak = len(out.path) == len(out.tree)
        if self.fitted and self.asked is not None:
            state, n = self.asked
            seen = self.counts.setdefault(state, [[0, 0] for _ in range(AUTO_K)])
            m = len(out.path)               # a chain: its first m tokens accepted
            for i in range(min(m + 1, n)):
                seen[i][0] += 1
                seen[i][1] += i < m
            self.asked = None

    def _fit(self, cont: list[int], n_gram: int, tree_info: dict) -> int:
        """How many of the continuation's tokens to draft: each position's chance of acceptance
        given the ones before it, learned in this run per state from a prior (AUTO_PRIOR, worth
        AUTO_WEIGHT rounds): (accepted + weight x prior) / (reached + weight). Chained into
        cumulative chances, sized to the verify costs by fit_nodes."""
        state = (self.streak, min(n_gram, 3))
        seen = self.counts.get(state, [])
        prior = AUTO_PRIOR_COPY if self.streak else AUTO_PRIOR[state[1]]
        chance, scores = 1.0, []
        for i in range(len(cont)):
            reached, kept = seen[i] if i < len(seen) else (0, 0)
            chance *= (kept + AUTO_WEIGHT * prior) / (reached + AUTO_WEIGHT)
            scores.append(chance)
        n, gain, cost = fit_nodes(scores, self.curve)
        self.fits += 1
        tree_info.update(TreeFit(fit_nodes=n, fit_expect=round(gain, 3), fit_cost=round(cost, 3),
                                 fit_curve=[self.curve[T] for T in sorted(self.curve)] if self.fits == 1 else None).info())
        self.asked = (state, n)
        return n

    def propose(self, ctx: Context) -> DraftTree:
        ids = ctx.ids
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            tail = ids[-n:]
            starts = range(0, len(ids) - n) if self.prefer == "first" else range(len(ids) - n - 1, -1, -1)
            for j in starts:
                if ids[j:j + n] == tail:
                    k = self.k_full if self.streak else self.k
                    k = min(k, max(1, self.grow * (n - 1))) if self.grow else k
                    cont = ids[j + n: j + n + k]
                    info = {}
                    if self.fitted:
                        cont = cont[:self._fit(cont, n, info)]
                    tree = DraftTree.chain(cont, [1.0] * len(cont), f"{n}-gram@{j}", ngram=n, match_at=j)
                    tree.info.update(info)
                    return tree
        return DraftTree(info={"ngram": 0})


class SuffixAutomaton:
    """Online suffix automaton over a token sequence (Blumer et al.): O(1) amortised extend.

    Each state keeps `end`, the end position of its first occurrence, so a match can be continued
    by reading the text after it, and `occ`, how many times its strings occur (the size of its end
    set, kept up to date as the text grows: the new position is added to every state on the new
    state's suffix-link path), so the continuations of a match can be counted (SuffixDecoding's
    frequencies).
    """

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link, self.len, self.end, self.occ = [-1], [0], [-1], [0]
        self.last = 0
        self.text: list[int] = []

    def extend(self, c: int):
        self.text.append(c)
        cur = len(self.len)
        self.next.append({}); self.len.append(self.len[self.last] + 1)
        self.link.append(-1); self.end.append(len(self.text) - 1); self.occ.append(1)
        p = self.last
        while p != -1 and c not in self.next[p]:
            self.next[p][c] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][c]
            if self.len[p] + 1 == self.len[q]:
                self.link[cur] = q
            else:
                clone = len(self.len)
                self.next.append(dict(self.next[q])); self.len.append(self.len[p] + 1)
                self.link.append(self.link[q]); self.end.append(self.end[q]); self.occ.append(self.occ[q])
                while p != -1 and self.next[p].get(c) == q:
                    self.next[p][c] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        p = self.link[cur]
        while p > 0:                        # the new end position: one more occurrence of each suffix
            self.occ[p] += 1
            p = self.link[p]

    def step(self, state: int, length: int, c: int) -> tuple[int, int]:
        """Matching statistics: extend a match (state, length) by token c, falling back on links."""
        while state and c not in self.next[state]:
            state = self.link[state]
            length = self.len[state]
        if c in self.next[state]:
            return self.next[state][c], length + 1
        return 0, 0


SEPARATOR = -1  # between requests in a history automaton: never matched by a real token


class _Index:
    """One vocabulary's earlier requests in one automaton; `starts` maps text offsets to requests."""

    def __init__(self, version: int):
        self.auto, self.starts, self.version = SuffixAutomaton(), [], version

    def append(self, n: int, ids: list[int]) -> None:
        self.starts.append((len(self.auto.text), n))
        for c in ids:
            self.auto.extend(c)
        self.auto.extend(SEPARATOR)


class RequestStore:
    """A method's state across requests by key (a subclass per method: OSD's online drafts, SWIFT's
    skip sets), owned by whoever serves the requests (a session, a bench pass, a script): nothing is
    shared unless the caller passes the same store to each run. `copies`: `get` returns a copy of
    what was put (a state the run then changes)."""
    copies = False

    def __init__(self):
        self._items: dict[tuple, object] = {}
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key):
        with self.lock:
            v = self._items.get(key)
            return v.copy() if self.copies and v is not None else v

    def put(self, key, value) -> None:
        with self.lock:
            self._items[key] = value

    def values(self) -> list:
        """What is stored, as put (no copies)."""
        with self.lock:
            return list(self._items.values())

    @classmethod
    def named_by(cls, history, attr: str, what: str, method: str = ""):
        """The store a run's `history` names: one of this class, or the one kept as `attr` beside a
        SuffixHistory's texts (what the dashboard and the bench pass to every method that takes
        `history`); None: none. `what` says in the error what the store holds, `method` names it."""
        if history is None or isinstance(history, cls):
            return history
        if isinstance(history, SuffixHistory):
            with history.lock:
                return history.__dict__.setdefault(attr, cls())
        raise ValueError(f"{method + ': ' if method else ''}history must be a speclab {cls.__name__} or "
                         f"SuffixHistory ({what}), got {type(history).__name__}")


class SuffixHistory:
    """Earlier requests' text for the suffix method, owned by whoever serves the requests.

    A dashboard session keeps one, a bench pass keeps one, a script may keep one across its calls;
    nothing is shared unless the caller passes the same object (`history=`) to each run. Requests
    are kept per vocabulary (`key`: the target's vocabulary size and the checkpoint it came from),
    so ids of one tokenizer are never matched against another's. The store is bounded: past
    `max_tokens` tokens in all, the least recently used requests (the ones no draft came from for
    longest) are dropped down to 3/4 of the bound, and the automata that lost text are rebuilt
    (a new `version`, which tells a running drafter to restart its match). Adding a request extends
    its automaton in place: O(its length).
    """

    def __init__(self, max_tokens: int = 200_000):
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._docs: OrderedDict[tuple, list[int]] = OrderedDict()   # (key, n) -> ids, least recently used first
        self._index: dict = {}                                       # key -> _Index
        self._n = self._versions = self.tokens = 0
        self.lock = threading.RLock()       # readers (a running drafter) and writers (end of a run)

    @staticmethod
    def key_of(model) -> tuple:
        """The vocabulary a target model's ids belong to."""
        cfg = getattr(model, "config", None)
        return (getattr(cfg, "vocab_size", None),
                str(getattr(model, "name_or_path", "") or getattr(cfg, "_name_or_path", "")))

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, key, ids: list[int]) -> None:
        """Remember one request's text (prompt + output) under `key`."""
        ids = [int(t) for t in ids][-self.max_tokens:]
        if not ids:
            return
        with self.lock:
            self._n += 1
            self._docs[(key, self._n)] = ids
            self.tokens += len(ids)
            dropped = set()
            if self.tokens > self.max_tokens:
                while self.tokens > self.max_tokens * 3 // 4 and len(self._docs) > 1:
                    (k, _), old = self._docs.popitem(last=False)
                    self.tokens -= len(old)
                    dropped.add(k)
            if key in dropped or key not in self._index:
                dropped.add(key)
            else:
                self._index[key].append(self._n, ids)
            for k in dropped:
                self._rebuild(k)

    def _rebuild(self, key) -> None:
        self._versions += 1
        idx = _Index(self._versions)
        for (k, n), ids in self._docs.items():
            if k == key:
                idx.append(n, ids)
        if idx.starts:
            self._index[key] = idx
        else:
            self._index.pop(key, None)

    def index(self, key) -> _Index | None:
        """`key`'s automaton over its earlier requests (read it holding `lock`), or None."""
        return self._index.get(key)

    def touch(self, key, idx: _Index, pos: int) -> None:
        """A draft came from text position `pos` of `idx`: its request is now the most recently used."""
        i = bisect.bisect_right(idx.starts, (pos, float("inf"))) - 1
        with self.lock:
            if i >= 0 and (key, idx.starts[i][1]) in self._docs:
                self._docs.move_to_end((key, idx.starts[i][1]))

    def clear(self) -> None:
        with self.lock:
            self._docs.clear()
            self._index.clear()
            self.tokens = 0


class SuffixDrafter(Drafter):
    """Matches the context against (a) itself and (b) the earlier requests in `history`, if given.

    history: a SuffixHistory the caller owns. Without one there is no cross-request history at all:
    each request drafts from its own prompt and output only.
    """
    name = "suffix"

    def __init__(self, max_k: int = 16, factor: float = 1.0, min_match: int = 2,
                 history: SuffixHistory | None = None, key=None, tree: bool = False, min_prob: float = 0.1):
        super().__init__()
        check_k(max_k, "max_k")
        if history is not None and not isinstance(history, SuffixHistory):
            raise ValueError(f"history must be a speclab SuffixHistory (or None for no history across requests), "
                             f"got {type(history).__name__}")
        if not isinstance(min_prob, (int, float)) or isinstance(min_prob, bool) or not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be a frequency in [0, 1], got {min_prob!r}")
        self.max_k, self.factor, self.min_match = max_k, factor, min_match
        self.history, self.key = history, key
        self.tree, self.min_prob = bool(tree), float(min_prob)

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.own = SuffixAutomaton()
        self.fed = 0
        self.hist_version, self.hist_state, self.hist_len, self.hist_fed = None, 0, 0, 0

    def _feed_history(self, ids: list[int]):
        """Matching statistics of the context against the history (held lock). A rebuilt automaton
        (another version) restarts the match from the start of the context."""
        idx = self.history.index(self.key)
        if idx is None:
            self.hist_version, self.hist_state, self.hist_len, self.hist_fed = None, 0, 0, 0
            return None
        if idx.version != self.hist_version:
            self.hist_version, self.hist_state, self.hist_len, self.hist_fed = idx.version, 0, 0, 0
        for c in ids[self.hist_fed:]:
            self.hist_state, self.hist_len = idx.auto.step(self.hist_state, self.hist_len, c)
        self.hist_fed = len(ids)
        return idx

    def propose(self, ctx: Context) -> DraftTree:
        for c in ctx.ids[self.fed:]:
            self.own.extend(c)
        self.fed = len(ctx.ids)
        if self.history is None:
            return self._draft(None)
        with self.history.lock:
            return self._draft(self._feed_history(ctx.ids))

    def _draft(self, idx: _Index | None) -> DraftTree:
        # (a) own text: the suffix link of the last state is the longest suffix seen earlier
        own_state = self.own.link[self.own.last]
        own_len = self.own.len[own_state] if own_state > 0 else 0
        candidates = []
        if own_len:
            candidates.append((own_len, self.own, own_state, "self"))
        if idx is not None and self.hist_len:
            candidates.append((self.hist_len, idx.auto, self.hist_state, "history"))
        if not candidates:
            return DraftTree(info={"match": 0})
        match, auto, state, where = max(candidates, key=lambda c: c[0])
        if match < self.min_match:
            return DraftTree(info={"match": match})
        k = max(1, min(self.max_k, int(self.factor * match)))
        if self.tree:
            return self._tree(auto, state, match, k, where)
        text, e = auto.text, auto.end[state]
        cont = []
        for t in text[e + 1: e + 1 + k]:
            if t == SEPARATOR:
                break
            cont.append(t)
        if where == "history" and cont:
            self.history.touch(self.key, idx, e)
        return DraftTree.chain(cont, [1.0] * len(cont), f"suffix:{where}", match=match, k=len(cont))

    def _tree(self, auto: SuffixAutomaton, state: int, match: int, budget: int, where: str) -> DraftTree:
        """SuffixDecoding's speculation tree: from the matched pattern, the continuations seen after it,
        each scored by its frequency (its occurrences over its siblings'), a node's score the product
        along its path; the best-scoring nodes are added first (best-first) up to `budget` nodes,
        a continuation seen less than `min_prob` of the time after its parent left out."""
        tree = DraftTree(info={"match": match, "where": where, "budget": budget})
        heap, order = [], 0

        def push(st: int, parent: int, score: float, depth: int):
            nonlocal order
            kids = [(c, t) for c, t in auto.next[st].items() if c != SEPARATOR]
            total = sum(auto.occ[t] for _, t in kids)
            for c, t in kids:
                f = auto.occ[t] / total
                if f >= self.min_prob:
                    order += 1      # ties: the earlier-seen child first (stable)
                    heapq.heappush(heap, (-score * f, order, c, t, parent, f, depth))
        push(state, -1, 1.0, 1)
        while heap and len(tree) < budget:
            neg, _, c, t, parent, f, depth = heapq.heappop(heap)
            node = tree.add(c, parent, 1.0, f"suffix:{where}")       # a point mass: accepted with p(x)
            if self.record:
                tree.decisions.append(Decision(self.name, {"frequency": round(f, 4), "score": round(-neg, 4),
                                                           "occurrences": auto.occ[t], "depth": depth},
                                               threshold=self.min_prob, output="draft", at=node))
            push(t, node, -neg, depth + 1)
        tree.info["k"] = len(tree)
        return tree

    def end(self):
        # this request becomes history for the owner's next ones (and for no one else)
        if self.history is not None:
            self.history.add(self.key, self.own.text)
