"""Greedy decoding with the token kept on the device: the static runner's own `ar` loop.

The engine's round loop reads every token on the host before it stages the next step, so on a GPU
the device idles while the host syncs, runs the round's Python and launches the next graph (an 8B
step's graph costs the host 1.7 ms to launch). GreedyLoop runs the step, its argmax and the advance
of position and slot as one captured graph, and the host reads each token a step behind
(BENCHMARKS.md, GPU: 1.06-1.18x the round loop on an H100). A mixin of StaticLM: it uses its
buffers (inputs, staging), its graphs and capture, and its step.
"""
from __future__ import annotations

import time

import torch


class GreedyLoop:
    @torch.inference_mode()
    def greedy_run(self, token: int, steps: int, eos_id: int | None = None, on_token=None,
                   lag: int | None = None) -> tuple[list[int], list[float]]:
        """Up to `steps` greedy one-token forwards from `token` (pending: not yet in the cache), each
        step feeding its own argmax to the next ON THE DEVICE: the step, the argmax and the advance of
        the position and slot are one captured graph, so the host never stages a token. The host
        reads each token `lag` steps behind the device (default: 1 under graphs, so the next step is
        queued before the host waits for a token and the GPU does not idle between steps; 0 eager).
        Stops after eos_id: the `lag` steps already queued past it ran (self.forwards counts them)
        and their cache slots lie past self.n, which the next forward overwrites.

        Returns the tokens (the argmax of each step, as `ar`'s host loop computes it: the same step,
        the same greedy_ids) and the host clock when each was read. on_token(token) is called as each
        is read. Afterwards the cache holds `token` and every returned token but the last, which is
        pending, as after a verify."""
        if steps < 1:
            return [], []
        lag = (1 if self.graphs else 0) if lag is None else lag
        past, nl = self.n, len(self.layers)
        want = tuple(sorted({c for c in self.capture_layers if 0 < c <= nl}))
        self._fit(past + steps + lag + 1)
        self._stage([token], torch.tensor([past]), torch.tensor([0]), 1)
        if self.graphs:
            graph, nxt = self._loop_graph(nl, want)
            ring = torch.empty(steps + lag, dtype=torch.long, pin_memory=True)
            events = []

            def launch(i):
                graph.replay()
                ring[i].copy_(nxt[0], non_blocking=True)
                events.append(torch.cuda.Event())
                events[-1].record()
                self.replays += 1

            def read(j):
                events[j].synchronize()
                return int(ring[j])
        else:
            got = []

            def launch(i):
                got.append(int(self._loop_body(past + i, nl, want)[0]))

            read = got.__getitem__
        toks, times, end, i = [], [], steps, 0
        while i < end + lag:
            if i < end:
                launch(i)
                self.forwards += 1
            j = i - lag
            if 0 <= j < end:
                t = read(j)
                toks.append(t)
                times.append(time.perf_counter())
                if on_token is not None:
                    on_token(t)
                if t == eos_id:
                    end = j + 1                 # queue nothing more; read nothing after it
            i += 1
        self.n = past + len(toks)
        return toks, times

    def _loop_body(self, past: int, nl: int, want: tuple) -> torch.Tensor:
        """One step of greedy_run: the forward of inputs[0, 0] at slot inputs[2, 0], its argmax
        written back as the next step's input, position and slot advanced. Returns the argmax (1,)."""
        # float32 logits: argmax ties go to the lowest id, as the host loop's greedy_ids breaks them
        nxt = self._stepper()(1, 1, past, nl, want, True).argmax(-1)
        self.inputs[0, :1].copy_(nxt)
        self.inputs[1:3, :1] += 1
        return nxt

    def _loop_graph(self, nl: int, want: tuple):
        """greedy_run's captured step (once per layers run and capture set). The warm-up runs
        advance the inputs; they are put back before the first replay."""
        if want:
            self._wide |= set(want)
            want = tuple(sorted(c for c in self._wide if c <= nl))
        key = ("greedy-loop", nl, want)
        if key not in self._graphs:
            saved = self.inputs.clone()
            self._graphs[key] = self._capture(lambda: self._loop_body(0, nl, want))
            self.inputs.copy_(saved)
        return self._graphs[key]
