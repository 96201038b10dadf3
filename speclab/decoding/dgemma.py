"""DiffusionGemma's sampler (transformers' `DiffusionGemmaForBlockDiffusion.generate`, 5.23) as
speclab's step loop, recorded step by step: `dllm-entropy-bound` on a DiffusionGemma model.

The model is an encoder-decoder over blocks of `canvas_length` L. The encoder runs the prompt,
then each committed block, once, writing their keys / values into the cache. The decoder denoises
an L-token canvas that starts as UNIFORM-RANDOM tokens (noise, not masks) and reads the cache;
it also reads its previous step's tempered logits (self-conditioning). Each step t = N..1:

    T_t       = t_min + (t_max - t_min) * t / N                  (a float32 tensor, as transformers)
    x_sample  ~ softmax(logits / T_t)   per position;  x_argmax = argmax(logits / T_t)
    H         = entropy(softmax(logits / T_t))   per position
    accepted  = positions sorted by H (ascending) whose predecessors' H sum to <= entropy_bound
    canvas    = x_sample where accepted, fresh uniform noise elsewhere (re-noised)
    stop when x_argmax equals the last `stability_threshold` argmax canvases and mean H < confidence_threshold

The block commits x_argmax of its last step. There is no greedy mode: the randomness (initial
canvas, samples, re-noise) comes from torch's global generator in a fixed order, so speclab seeds
it inside `torch.random.fork_rng` (the caller's RNG state is untouched) and makes the same calls in
the same order: the same seed gives transformers' tokens, token for token (tests/test_dgemma.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from speclab.models.hf import cache_kw
from speclab.trace import DenoiseStep, Totals


def is_dgemma(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == "diffusion_gemma"


@dataclass
class DGemmaSampler:
    """The generation-config knobs of DiffusionGemma (transformers' defaults)."""
    entropy_bound: float = 0.1
    max_denoising_steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005

    def check(self):
        if not self.entropy_bound >= 0:
            raise ValueError(f"entropy_bound must be >= 0 (nats), got {self.entropy_bound}")
        if not isinstance(self.max_denoising_steps, int) or self.max_denoising_steps < 1:
            raise ValueError(f"max_denoising_steps must be an integer >= 1, got {self.max_denoising_steps!r}")
        if not 0 < self.t_min <= self.t_max:
            raise ValueError(f"need 0 < t_min <= t_max, got t_min={self.t_min}, t_max={self.t_max}")
        if not isinstance(self.stability_threshold, int) or self.stability_threshold < 0:
            raise ValueError(f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}")


def canvas_length(model) -> int:
    return int(model.config.canvas_length)


@torch.inference_mode()
def dgemma_decode(model, prompt_ids: list[int], sampler: DGemmaSampler, gen_length: int, seed: int = 0,
                  record: str | None = "light", eos_id: int | None = None, progress=None):
    """One decode, batch 1. Returns (output ids, DenoiseSteps, Totals); positions are generation
    coordinates. gen_length must be a multiple of the canvas length (whole blocks, as transformers)."""
    from transformers import DynamicCache
    sampler.check()
    L, V = canvas_length(model), model.config.get_text_config().vocab_size
    if gen_length % L:
        raise ValueError(f"gen_length={gen_length} must be a multiple of this DiffusionGemma's canvas length {L} "
                         "(it decodes whole canvases)")
    dev = next(model.parameters()).device
    N = sampler.max_denoising_steps
    pad = int(model.config.get_text_config().pad_token_id or 0)       # stands for slots of later blocks
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    ids = torch.tensor([list(prompt_ids)], device=dev)
    P = ids.shape[1]
    new = ids
    steps: list[DenoiseStep] = []
    out: list[int] = []
    t0, forwards = time.perf_counter(), 0
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        for b in range(gen_length // L):
            lo, hi, start = b * L, (b + 1) * L, P + b * L
            model.model.encoder(input_ids=new, **cache_kw(model.model.encoder, cache),
                                position_ids=torch.arange(start - new.shape[1], start, dtype=torch.int32,
                                                          device=dev)[None])
            canvas = torch.randint(0, V, (1, L), device=dev)                    # noise, not masks
            dec_pos = torch.arange(start, start + L, dtype=torch.int32, device=dev)[None]
            sc, hist, argmax = None, None, canvas
            for cur in range(N, 0, -1):
                logits = model(decoder_input_ids=canvas, **cache_kw(model, cache), self_conditioning_logits=sc,
                               decoder_position_ids=dec_pos).logits              # (1, L, V) fp32
                forwards += 1
                temp = sampler.t_min + (sampler.t_max - sampler.t_min) * (torch.tensor(cur, dtype=torch.int32) / N)
                pl = logits / temp
                probs = torch.softmax(pl, dim=-1, dtype=torch.float32)
                sampled = torch.multinomial(probs.view(-1, V), num_samples=1).squeeze(-1).view(1, L)
                new_argmax = pl.argmax(-1)
                ent = torch.distributions.Categorical(logits=pl).entropy()        # (1, L)
                s_ent, s_idx = torch.sort(ent, dim=-1)
                sel = torch.cumsum(s_ent, dim=-1) - s_ent <= sampler.entropy_bound
                accepted = torch.scatter(torch.zeros_like(sel), -1, s_idx, sel)
                noise = torch.randint(0, V, (1, L), device=dev)
                new_canvas = torch.where(accepted, sampled, noise)
                if sampler.stability_threshold == 0:
                    stable = True
                else:
                    if hist is None:
                        hist = torch.full((sampler.stability_threshold, 1, L), -1, dtype=new_argmax.dtype, device=dev)
                    stable = bool((hist == new_argmax[None]).all())
                    hist = torch.roll(hist, -1, 0)
                    hist[-1] = new_argmax
                mean_h = float(ent.mean())
                done = stable and mean_h < sampler.confidence_threshold
                last = done or cur == 1
                if record:
                    steps.append(_record(record, (lo, hi), gen_length, pl[0], new_argmax[0], sampled[0], accepted[0],
                                         ent[0], new_canvas[0], float(temp), stable, mean_h, last, out, pad))
                canvas, argmax, sc = new_canvas, new_argmax, pl.to(model.model.decoder.embed_tokens.weight.dtype)
                if last:
                    break
            block = argmax[0].tolist()
            out += block
            new = argmax
            if progress:
                progress(len(out), gen_length)
            if eos_id is not None and eos_id in block:                             # the answer ended
                break
    if eos_id is not None and eos_id in out:
        out = out[: out.index(eos_id) + 1]
    wall = time.perf_counter() - t0
    return out, steps, Totals(wall_s=wall, target_forwards=forwards, new_tokens=len(out), verify_s=wall)


def _record(level, block, G, pl, argmax, sampled, accepted, ent, canvas, temp, stable, mean_h, last, out, pad):
    """One step. masked = every slot not committed yet (the block's slots are noise or provisional
    samples until the block commits; later blocks are not looked at: confidence 0); top1 = the
    argmax canvas, conf = its tempered probability; committed = the whole block on the block's
    last step (its argmax); remasked = the slots re-noised by this step."""
    lo, hi = block
    p = pl.softmax(-1)
    top = p.topk(2, dim=-1)
    later = G - hi
    info = {"canvas": "noise", "temperature": round(temp, 5), "sampled": sampled.tolist(),
            "accepted": [lo + i for i in accepted.nonzero().flatten().tolist()],
            "stable": bool(stable), "mean_entropy": round(mean_h, 5)}
    if level == "full":
        info["entropy"] = [round(float(e), 4) for e in ent] + [0.0] * later
    return DenoiseStep(block=block, masked=list(range(lo, G)), top1=argmax.tolist() + [pad] * later,
                       conf=[round(float(c), 5) for c in top.values[:, 0]] + [0.0] * later,
                       margin=[round(float(m), 5) for m in top.values[:, 0] - top.values[:, 1]] + [0.0] * later,
                       committed=list(range(lo, hi)) if last else [],
                       remasked=[lo + i for i in (~accepted).nonzero().flatten().tolist()],
                       threshold=None, tokens=out + (argmax if last else canvas).tolist() + [pad] * later, info=info)
