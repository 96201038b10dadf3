"""PEARL: the draft drafts while the target verifies, on two threads (Liu et al., ICLR 2025, "PEARL:
Parallel Speculative Decoding with Adaptive Draft Length"; code: smart-lty/ParallelSpeculativeDecoding,
src/engine.py `parallel_speculative_decoding`).

Every iteration runs two lanes at once over the same sequence `ids` (verified tokens, then maybe
unverified ones) and then decides:

    draft lane    gamma tokens x_1..x_gamma ~ q after ids (gamma draft forwards)
    target lane   ONE forward over the tokens its cache lacks; its last m + 1 rows are p for the m
                  unverified tokens at the end of ids and for the next token
    PRE  (m = 0, ids all verified)  pre-verify: test x_1 against p(.|ids) while x_2.. are drafted.
                  accept: ids += x_1..x_gamma (x_2.. unverified), mode POST.
                  reject: ids += t ~ resid(p, q); the draft cache back to ids; stay PRE.
    POST (m = gamma - 1)  post-verify: test the unverified v_1..v_m, then x_1 (the draft drafted on
                  while the target verified them).
                  all accepted: ids += x_1..x_gamma, stay POST.
                  first rejection at i: ids = verified + v_<i + t ~ resid(p_i, q_i); roll BOTH caches
                  back; mode PRE.

A test is the exact rule (greedy: the target's argmax; sampling: u <= p(x) / q(x), residual on a
rejection), so every verified token is the target's: lossless. The output is the verified tokens
only (the unverified tail at the end of the run is dropped).

How it fits speclab. The overlap does not fit the round engine's propose -> verify order (the draft
token PEARL tests at the target's last row is drafted DURING that verify), so this Drafter owns its
loop: `decode_loop`, which speculative.decode runs in place of its rounds; the API, the CLI, the
bench and the trace are the engine's. Each iteration is one `Round` (one target forward): its nodes
are the tokens tested, with p, q, u and the verdict; a rejection emits the correction; a round whose
tests all passed emits no target token (emitted = -1, kind "accepted": its last kept token is an
accepted draft token). Its `pearl` Decision holds the mode, the output positions tested, the
verdicts, what was rolled back and the run of accepted tokens since the last rejection; its output
is the next mode. `Trace.lanes` holds both lanes' spans: every draft forward and every target
forward, start and end.

Threads. `overlap=True`: the draft lane runs on a worker thread, the target lane on the caller's;
torch releases the GIL inside each op, so the two forwards overlap where their Python does not.
Each lane runs at ONE intra-op thread: two lanes of one thread each fill two cores. With torch's
OpenMP backend the intra-op count is per OS thread (a new thread starts from the process's last
setting), so the worker sets its own at start and the caller's thread is set for the run and
restored after (with a process-wide pool the same calls set it for the whole process). A lean
model's team size (models.kernels.TeamSize) then picks 1 in each lane. `overlap=False` runs the
same schedule with the lanes one after the other on the caller's thread at the caller's thread
count: the same tokens, decisions and forwards (random draws come only from the draft lane and
then the tests, in that order, either way), so the schedule is testable alone and the overlap's
gain measurable. On a GPU the lanes share the default stream (no stream per lane: not done), so
their kernels queue one after the other there.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from speclab.decoding.acceptance import accepts, greedy_ids, residual, sample, warp
from speclab.decoding.drafters.model import OwnDraftLM, check_k
from speclab.decoding.speculative import Context, Drafter, _topk
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED, Decision, DraftNode, Lane, Round, Span, Totals

PRE, POST = "PRE", "POST"


def test_chain(tokens: list[int], q_tok: list, q: torch.Tensor | None, rows: torch.Tensor, sampler, gen):
    """The exact rule on a chain: tokens (c,) with their q (c,) and q dists (c, V) (sampling; None when
    greedy), rows (c, V) the target's logits before each token. Returns (n accepted, the correction or
    None, the dist it was drawn from, u per test, p(x) per test, p rows)."""
    if sampler.greedy:
        top = greedy_ids(rows).tolist()
        n = next((i for i, (x, t) in enumerate(zip(tokens, top)) if x != t), len(tokens))
        return n, (top[n] if n < len(tokens) else None), None, [None] * (n + (n < len(tokens))), None
    p = warp(rows, sampler)                                                      # (c, V)
    us = []
    for i, x in enumerate(tokens):
        us.append(torch.rand((), generator=gen, device=gen.device).item())
        if not accepts(us[-1], p[i, x].item(), q_tok[i]):
            r = residual(p[i], q[i])
            return i, int(sample(r, gen)), r, us, p
    return len(tokens), None, None, us, p


class PearlDrafter(OwnDraftLM, Drafter):
    name = "pearl"

    def __init__(self, draft, backend: str = "auto", gamma: int = 5, overlap: bool = True):
        super().__init__()
        check_k(gamma, "gamma")
        if not isinstance(overlap, bool):
            raise ValueError(f"overlap must be True (draft beside verify, two threads) or False (the same "
                             f"schedule one lane after the other), got {overlap!r}")
        self.gamma, self.overlap = gamma, overlap
        self.attach_lm(draft, backend)
        self.lanes: list[Lane] = []

    def propose(self, ctx):
        raise RuntimeError("pearl drafts beside the verify in its own loop (PearlDrafter.decode_loop), not in "
                           "the round engine's propose -> verify order: run it through speclab.generate")

    # -- the two lanes -------------------------------------------------------------------------
    def draft_lane(self, pending: list[int], spans: list) -> tuple[list[int], list, torch.Tensor | None]:
        """gamma tokens after the draft cache plus `pending`: (tokens, q of each, q dists (gamma, V) when
        sampling or recording "full"). spans gets (start, end) of every forward."""
        s, lm = self.sampler, self.lm
        inp = torch.tensor(pending, device=self.device)
        toks, confs, dists = [], [], []
        with torch.inference_mode():
            for _ in range(self.gamma):
                t0 = time.perf_counter()
                logits = lm.forward(inp, logits_to_keep=1)[-1]                       # (V,)
                if s.greedy:
                    tok = greedy_ids(logits)
                    if self.record is not None:
                        q = logits.float().softmax(-1)
                        confs.append(q[tok])
                        if self.record == "full":
                            dists.append(q)
                else:
                    q = warp(logits, s)
                    tok = sample(q, self.gen)
                    dists.append(q)
                    confs.append(q[tok])
                toks.append(tok.reshape(()))
                inp = tok.reshape(1)
                spans.append((t0, time.perf_counter()))
        tokens = torch.stack(toks).tolist()
        q_tok = torch.stack(confs).tolist() if confs else [None] * len(tokens)
        return tokens, q_tok, (torch.stack(dists) if dists else None)

    def target_lane(self, target, pending: list[int], rows: int, spans: list) -> torch.Tensor:
        """The target's logits (rows, V) after the last `rows` of `pending` (one forward)."""
        t0 = time.perf_counter()
        at = "cpu" if getattr(target, "host_ids", False) else self.device
        logits = target.forward(torch.tensor(pending, device=at), logits_to_keep=rows)
        spans.append((t0, time.perf_counter()))
        return logits

    # -- the loop ------------------------------------------------------------------------------
    def decode_loop(self, target, prompt_ids: list[int], max_new_tokens: int, sampler, seed: int = 0,
                    record: str | None = "light", eos_id: int | None = None, progress=None, rule: str = "exact"):
        """PEARL until max_new_tokens verified tokens or EOS. Returns (new ids, rounds, totals), as
        speculative.decode does; the lanes' spans go to self.lanes (record None: none)."""
        if rule != "exact":
            raise ValueError(f"pearl verifies with the exact rule only (its tests are spread over two "
                             f"iterations), got rule={rule!r}")
        self.device = target.device
        gen = torch.Generator(device=self.device).manual_seed(seed)
        target.reset()
        tf0 = target.forwards
        self.begin(Context(list(prompt_ids), len(prompt_ids), len(prompt_ids), self.device), target, sampler, gen, record)
        df0 = self.lm.forwards
        threads = torch.get_num_threads()
        pool = None
        if self.overlap:        # one intra-op thread a lane (the module's docstring)
            torch.set_num_threads(1)
            pool = ThreadPoolExecutor(1, thread_name_prefix="pearl-draft", initializer=torch.set_num_threads,
                                      initargs=(1,))
        try:
            return self._loop(target, prompt_ids, max_new_tokens, eos_id, progress, pool, tf0, df0)
        finally:
            if pool is not None:
                pool.shutdown()
                torch.set_num_threads(threads)
            self.end()

    def _loop(self, target, prompt_ids, max_new_tokens, eos_id, progress, pool, tf0, df0):
        s, lm, gamma, record = self.sampler, self.lm, self.gamma, self.record
        ids, n_ver = list(prompt_ids), len(prompt_ids)   # ids[n_ver:]: unverified, drafted earlier
        q_un, qd_un = [], None                           # their q, and q dists (sampling / "full")
        mode, run = PRE, 0
        rounds, new, totals = [], [], Totals()
        d_spans, t_spans = [], []                        # (start, end, step) of every forward per lane
        t_start = time.perf_counter()
        while len(new) < max_new_tokens:
            m = len(ids) - n_ver
            d_pend, t_pend = ids[lm.length:], ids[target.length:]
            ds, ts = [], []
            if pool is not None:                                                        # both lanes at once
                lane = pool.submit(self.draft_lane, d_pend, ds)
                logits = self.target_lane(target, t_pend, m + 1, ts)
                x, q_x, qd_x = lane.result()
            else:                                                                       # the same, in turn
                x, q_x, qd_x = self.draft_lane(d_pend, ds)
                logits = self.target_lane(target, t_pend, m + 1, ts)
            step = len(rounds)
            d_spans += [(a, b, step) for a, b in ds]
            t_spans += [(a, b, step) for a, b in ts]
            # test the unverified tokens, then x_1, with the rows the target just computed
            cand = ids[n_ver:] + x[:1]                                                  # (m + 1,)
            q_tok = q_un + q_x[:1]
            qd = None if qd_x is None else (qd_x[:1] if qd_un is None else torch.cat([qd_un, qd_x[:1]]))
            n, t, dist, us, p = test_chain(cand, q_tok, qd, logits, s, self.gen)
            before = len(ids)
            if t is None:                       # every test passed: x_1 verified, x_2.. unverified
                committed, nxt = cand, POST
                ids += x
                n_ver = before + 1
                q_un, qd_un = q_x[1:], (None if qd_x is None else qd_x[1:])
                t_drop = d_drop = thrown = 0
                run += n
            else:                               # first rejection at n: back to the verified part + t
                committed, nxt = cand[:n] + [t], PRE
                keep_to = n_ver + n
                t_drop, d_drop = max(0, target.length - keep_to), max(0, lm.length - keep_to)
                target.keep(min(target.length, keep_to))
                lm.keep(min(lm.length, keep_to))
                thrown = (m - n - 1 if n < m else 0) + (gamma if n < m else gamma - 1)   # drafts never tested
                ids = ids[:keep_to] + [t]
                n_ver = len(ids)
                q_un, qd_un = [], None
                run += n
            keep = committed[: max_new_tokens - len(new)]
            if eos_id is not None and eos_id in keep:
                keep = keep[: keep.index(eos_id) + 1]
            out_pos = before - m - len(prompt_ids)       # output position of the first token tested
            rnd = Round(accepted=list(range(n)), path_tokens=cand[:n], emitted=-1 if t is None else t,
                        emitted_kind="accepted" if t is None else "correction", kept=len(keep), drafted=len(cand),
                        draft_s=sum(b - a for a, b in ds), verify_s=sum(b - a for a, b in ts),
                        info={"mode": mode, "gamma": gamma})
            if record is not None:
                self._record(rnd, cand, q_tok, qd, n, t, dist, us, p, logits, m)
                verdicts = [nd.decision for nd in rnd.nodes]
                rnd.decisions.append(Decision("pearl", {
                    "mode": mode, "tested": list(range(out_pos, out_pos + len(cand))), "verdicts": verdicts,
                    "unverified": m, "drafted": gamma, "rollback": thrown, "target_kv_dropped": t_drop,
                    "draft_kv_dropped": d_drop, "run": run}, output=nxt, at=0,
                    note=f"{mode} -> {nxt}" if nxt != mode else ""))
            if t is not None:
                run = 0
            mode = nxt
            rounds.append(rnd)
            new += keep
            totals.drafted += rnd.drafted
            totals.accepted += n
            totals.draft_s += rnd.draft_s
            totals.verify_s += rnd.verify_s
            if progress is not None:
                progress(len(keep))
            if eos_id is not None and keep and keep[-1] == eos_id:
                break
        totals.wall_s = time.perf_counter() - t_start
        totals.target_forwards = target.forwards - tf0
        totals.draft_forwards = lm.forwards - df0
        totals.new_tokens = len(new)
        self.lanes = [] if record is None else [
            Lane("draft", [Span(a - t_start, b - t_start, "draft", k) for a, b, k in d_spans]),
            Lane("target", [Span(a - t_start, b - t_start, f"{rounds[k].info['mode'].lower()}-verify", k)
                            for a, b, k in t_spans])]
        return new, rounds, totals

    def _record(self, rnd: Round, cand, q_tok, qd, n, t, dist, us, p, logits, m):
        """The round's nodes: every token tested, the carried ones first, then x_1."""
        s = self.sampler
        if p is None:                            # greedy: p for the record (its verdict needs only the argmax)
            p = logits.float().softmax(-1)
        rule = "greedy" if s.greedy else "spec-sampling"
        for i, tok in enumerate(cand):
            reached = i <= n and i < len(us)
            node = DraftNode(id=i, parent=i - 1, token=tok, depth=i + 1, q=q_tok[i],
                             source="draft, carried" if i < m else "draft", p=float(p[i, tok]), rule=rule,
                             decision=NOT_REACHED if not reached else (ACCEPTED if i < n else REJECTED),
                             u=us[i] if reached else None, try_order=0 if reached else None)
            if self.record == "full":
                node.p_topk = _topk(p[i])
                if qd is not None:
                    node.q_topk = _topk(qd[i])
            rnd.nodes.append(node)
        if self.record == "full" and t is not None:
            rnd.residual_topk = _topk(dist if dist is not None else p[n])
