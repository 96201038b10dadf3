"""m2r2: the target drafts through an accelerated residual stream and exits early (M2R2, Bhendawade
et al. 2025, arXiv 2502.02040; the stream itself: speclab/models/m2r2.py).

    draft    each draft token runs the fast stream: the target's first layers plus the trained
             accelerator adapters, on the target's own cache (the slow stream's keys and values of
             the committed text, shared), through the target's own final norm and head. The fast
             stream after j layers is trained to line up with the slow one after R j layers, so its
             exit after E = L / R layers already agrees with the final layer where the plain exit
             after E (layer-skip's) does not
    exit     fixed after `exit_after` layers (default: the stream's depth E); or, with
             `exit_threshold`, after the first layer from `min_exit` on whose top-1 confidence
             reaches it (each test costs an LM-head product; an early exit's skipped layers get
             keys and values from its exit state, CALM's state propagation)
    length   `k` tokens a round, or ChainDrafter's `threshold` stop (the draft's q below it) up to
             `max_k`, or its heuristic schedule
    verify   the full target verifies the chain with the exact rule: lossless

The paper's ARLA router (the exit decided from the fast stream's latent changes) is replaced by
the exit's top-1 confidence, and the paper fine-tunes the model; speclab trains adapters on the
frozen target (`speclab train m2r2`; the toy part `code-m2r2` for code-target). The paper's MoE
ahead-of-time expert loading has no counterpart here (no MoE target).

Recorded per round: records.StreamExit (per drafted token the exit layer and its confidence, the
threshold, the stream's depth and rate; on the first round the held-out agreement with the final
layer per layer, plain exits and the accelerated stream, from the part's training), SkipMask (the
layers the round's deepest exit ran) and one Decision("m2r2-exit", {"layer", "confidence"},
threshold, output=layer, at=depth) per drafted token. figures.m2r2 draws them.
"""
from __future__ import annotations

import torch

from speclab.decoding.drafters.heads import _name
from speclab.decoding.drafters.model import ChainDrafter, host_read
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree
from speclab.records import StreamExit
from speclab.trace import Decision


class M2R2Drafter(ChainDrafter):
    name = "m2r2"

    def __init__(self, target_model, draft, exit_after: int | None = None, exit_threshold: float | None = None,
                 min_exit: int = 1, **kw):
        super().__init__(**kw)
        from speclab.models.m2r2 import Accelerator
        if not isinstance(draft, Accelerator):
            raise ValueError(f"method 'm2r2' needs an M2R2 accelerator as its draft (e.g. code-m2r2), got "
                             f"{_name(draft)}: train one with `speclab train m2r2 --target ...`")
        draft.check_target(target_model, _name(target_model))
        E = draft.layers
        exit_after = E if exit_after is None else exit_after
        if isinstance(exit_after, bool) or not isinstance(exit_after, int) or not 1 <= exit_after <= E:
            raise ValueError(f"m2r2: exit_after must be an integer in 1..{E} (the accelerated stream's depth), "
                             f"got {exit_after!r}")
        if exit_threshold is not None and (isinstance(exit_threshold, bool) or not 0 < exit_threshold < 1):
            raise ValueError(f"m2r2: exit_threshold must be in (0, 1) (the top-1 confidence an earlier exit needs) "
                             f"or None (a fixed exit), got {exit_threshold!r}")
        if isinstance(min_exit, bool) or not isinstance(min_exit, int) or not 1 <= min_exit <= exit_after:
            raise ValueError(f"m2r2: min_exit must be an integer in 1..{exit_after} (exit_after), got {min_exit!r}")
        self.acc, self.exit_after, self.exit_threshold, self.min_exit = draft, exit_after, exit_threshold, min_exit
        self.n_layers = target_model.config.num_hidden_layers

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        if not hasattr(target, "kv") or not hasattr(target, "layers"):
            raise ValueError("m2r2 drafts inside the target on speclab's lean forward (a plain Llama-family "
                             f"target); this target runs on {type(target).__name__}: use backend='auto' or 'lean'")
        from speclab.models.m2r2 import fold
        self.folded = fold(target, self.acc)      # the accelerator folded into the fast layers' products
        self.first = True

    def exit_test(self):
        """The early-exit rule: None (fixed exit) or (layer, logits) -> exit here?"""
        t = self.exit_threshold
        if t is None:
            return None
        return lambda layer, logits: layer >= self.min_exit and float(logits.softmax(-1).max()) >= t

    @torch.inference_mode()
    def propose(self, ctx: Context) -> DraftTree:
        from speclab.models.m2r2 import fast_forward
        base = self.target.length
        layers, confs = [], []
        test = self.exit_test()

        def step(inp):
            logits, layer = fast_forward(self.target, self.folded, inp, self.exit_after, test)
            layers.append(layer)
            if self.record is not None:
                confs.append(logits.softmax(-1).max())
            self.forwards += 1
            return logits

        pending = torch.tensor(ctx.ids[len(ctx.ids) - ctx.pending:], device=ctx.device)
        tokens, q_tok, dists = self.run_chain(step, pending)
        self.target.keep(base)          # the draft's entries: the verify writes every layer of those slots
        deepest = max(layers)
        tree = DraftTree.chain(tokens, q_tok, "m2r2", dists, k=len(tokens), exit_layer=deepest,
                               skip="." * deepest + "x" * (self.n_layers - deepest))
        if self.record is not None:
            conf = host_read(torch.stack(confs))[0]
            rec = StreamExit(m2r2_exits=layers, m2r2_conf=[round(c, 4) for c in conf],
                             m2r2_threshold=self.exit_threshold, m2r2_depth=self.acc.layers, m2r2_rate=self.acc.rate)
            if self.first:
                align = self.acc.alignment()
                rec = StreamExit(**{**rec.info(), "m2r2_align_plain": align["plain"], "m2r2_align_fast": align["fast"]})
            tree.info.update(rec.info())
            tree.decisions += [Decision("m2r2-exit", {"layer": l, "confidence": round(c, 4)}, self.exit_threshold,
                                        output=l, at=d) for d, (l, c) in enumerate(zip(layers, conf))]
        self.first = False
        return tree

    def observe(self, out: Outcome):
        self.adapt(out)
