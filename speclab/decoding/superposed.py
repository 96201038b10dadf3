"""Superposed Decoding (Shen et al., NeurIPS 2024; RAIVNLab/SuperposedDecoding): k drafts for the
user from ONE forward a token. Not speculative: nothing verifies the drafts, so it keeps no
guarantee (lossy); k=1 with alpha=0 is plain greedy decoding, token for token.

One step, read top to bottom (the reference's `superpose.py`, defaults of `p15_d3_mixed.json`):

    superpose  the next input is sum_d w_d E[last token of draft d], w = softmax(draft scores s_d)
               (one vector, one position of the cache: the k drafts share the forward and the cache)
    forward    ONE target forward over it -> logits; log P = log_softmax(logits / temp), kept on its
               top `topk` tokens and renormalised there (the same P for every draft)
    score      per draft d and candidate v: (1 - alpha) log P(v) + alpha log P_ngram(v | draft d),
               P_ngram = sum_n weight_n count(ctx_n, v) / count(ctx_n) over the contexts of the draft's
               last n = 1..5 tokens the table holds; a draft none of whose candidates the n-gram
               supports gets (1 - alpha) log P(v) - penalty instead
    keep       the best k of {s_d + score_d(v)} and of the finished drafts (a finished draft keeps its
               place while it scores among the best k; one ending in end-of-text finishes)
    stop       at max_new_tokens, or when every draft kept has finished

The reference keeps k alive drafts from the best 2k and a separate pool of finished ones; here a
finished draft competes for its place (plain beam search), so k=1 with alpha=0 is greedy decoding
exactly, end of text included, and a run can stop before max_new_tokens.

The output (`Result.ids`) is the best of the drafts returned; `drafts(trace)` gives all k, best
first. Scores are kept in log space: the reference's probabilities at temp 0.06 underflow to 0 for
all but the top tokens (a candidate then scores -inf); here they keep their finite scores.

The n-gram table (`ngram_table`) counts the shipped prompt sets' text (speclab/prompts, every set)
plus text the model itself writes: its greedy continuations, `self_text` tokens each, of the
`chat-dev` questions (a model with a chat template) and the `code-complete` prompts. It is cached
per model in the user cache (models.gguf.cache_root()/superposed, safetensors: the token streams,
written atomically; the counts are rebuilt on load).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from speclab.beam import final_drafts
from speclab.decoding.result import Result
from speclab.decoding.speculative import with_runners
from speclab.models.backends import make_lm, resolve
from speclab.models.lean.archs import VERIFY_ROOM
from speclab.models.loading import as_model, chat_prompt, encode_prompt, model_info, token_table
from speclab.trace import RECORD_LEVELS, Round, Sampling, Totals, Trace


NGRAM_MAX = 5                           # the table's longest context (the reference's six-gram)


@dataclass
class SuperposedConfig:
    k: int = 3                          # drafts (the paper's n_drafts)
    topk: int = 9                       # candidates a draft takes from P (n_token_sample)
    alpha: float = 0.54                 # weight of the n-gram log-probability
    temp: float = 0.06                  # temperature of the LM's log-probabilities in the score
    ngram_weights: str | list = "0.01,0.04,0.15,0.18,0.12"  # contexts of 1, 2, ... tokens (i_weights)
    penalty: float = 200.0              # subtracted where the n-gram supports none of a draft's candidates
    self_text: int = 64                 # the model's own tokens a prompt in the n-gram table (0: none)

    def check(self) -> "SuperposedConfig":
        """ValueError, one line, for a value the method cannot run with."""
        for name in ("k", "topk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"superposed: {name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.self_text, int) or isinstance(self.self_text, bool) or self.self_text < 0:
            raise ValueError(f"superposed: self_text must be an integer >= 0, got {self.self_text!r}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"superposed: alpha must be in [0, 1] (0: no n-gram), got {self.alpha!r}")
        if not self.temp > 0:
            raise ValueError(f"superposed: temp must be > 0 (it divides the logits), got {self.temp!r}")
        if self.penalty < 0:
            raise ValueError(f"superposed: penalty must be >= 0, got {self.penalty!r}")
        w = self.ngram_weights
        try:
            w = [float(x) for x in (w.split(",") if isinstance(w, str) else w)]
        except (TypeError, ValueError):
            w = None
        if not w or len(w) > NGRAM_MAX or not all(0 <= x < math.inf for x in w):
            raise ValueError(f"superposed: ngram_weights must be 1 to {NGRAM_MAX} numbers >= 0, comma-separated (contexts "
                             f"of 1, 2, ... tokens), got {self.ngram_weights!r}")
        if self.alpha > 0 and not sum(w) > 0:
            raise ValueError("superposed: ngram_weights are all 0 while alpha > 0: give a weight, or alpha=0")
        self.weights = tuple(w)             # what the score reads (not a field: the trace keeps the given form)
        return self


# -- the n-gram table -------------------------------------------------------------------------------
class NgramTable:
    """Next-token counts after every context of 1..n_max tokens of some token streams."""

    def __init__(self, docs: list[list[int]], n_max: int = NGRAM_MAX):
        self.n_max, self.tokens = n_max, sum(len(d) for d in docs)
        self.counts: list[dict[tuple, dict[int, int]]] = [{} for _ in range(n_max)]
        for doc in docs:
            for n in range(1, n_max + 1):
                table = self.counts[n - 1]
                for i in range(n, len(doc)):
                    nxt = table.setdefault(tuple(doc[i - n:i]), {})
                    nxt[doc[i]] = nxt.get(doc[i], 0) + 1
        self.totals = [{c: sum(d.values()) for c, d in t.items()} for t in self.counts]

    def probs(self, context: list[int], tokens: list[int], weights) -> list[float]:
        """P_ngram(v | context) for each v of `tokens`: sum over n of weights[n-1] * count(last n
        tokens, v) / count(last n tokens), over the contexts the table holds (the reference's
        interpolation: its weights do not sum to 1)."""
        out = [0.0] * len(tokens)
        for n, w in enumerate(weights[: self.n_max], 1):
            if not w or len(context) < n:
                continue
            ctx = tuple(context[-n:])
            nxt = self.counts[n - 1].get(ctx)
            if nxt is None:
                continue
            total = self.totals[n - 1][ctx]
            for j, t in enumerate(tokens):
                c = nxt.get(t)
                if c:
                    out[j] += w * c / total
        return out


SELF_TEXT_SETS = ("chat-dev", "code-complete")     # what the model writes on for its own text
CONTEXT_KEPT = 5                                   # prompt tokens kept before a self-text continuation


def _greedy(lm, ids: list[int], n: int, eos: int | None) -> list[int]:
    lm.reset()
    logits = lm.forward(torch.tensor(ids, device=lm.device), logits_to_keep=1)
    out = []
    for _ in range(n):
        t = int(logits[-1].argmax())
        out.append(t)
        if t == eos or len(out) == n:
            break
        logits = lm.forward(torch.tensor([t], device=lm.device), logits_to_keep=1)
    return out


def _table_docs(model, tok, self_text: int, backend: str) -> list[list[int]]:
    """The shipped prompt sets' text (raw, a chat question as its text) and the model's greedy text."""
    from speclab.prompts import SETS, load_prompts
    text = lambda p: p["chat"] if isinstance(p, dict) else p
    docs = [tok(text(p), add_special_tokens=False)["input_ids"] for s in SETS for p in load_prompts(s)]
    if self_text:
        n_pos = getattr(model.config, "max_position_embeddings", None) or 2048
        lm = make_lm(model, "target", backend, max_len=n_pos + VERIFY_ROOM)
        chat = bool(getattr(tok, "chat_template", None))
        for s in SELF_TEXT_SETS:
            if s.startswith("chat") and not chat:
                continue
            for p in load_prompts(s):
                ids = chat_prompt(tok, text(p)) if isinstance(p, dict) else tok(p, add_special_tokens=False)["input_ids"]
                ids = ids[-(n_pos - self_text - 1):]
                docs.append(ids[-CONTEXT_KEPT:] + _greedy(lm, ids, self_text, tok.eos_token_id))
    return docs


def table_path(model, tok, self_text: int) -> tuple[Path, dict]:
    """Where a model's table is cached, and the key its file records (a changed prompt set, dtype or
    self_text makes a new file)."""
    from speclab.models.gguf import cache_root
    from speclab.prompts import PROMPT_DIR
    prompts = hashlib.sha1(b"".join(f.read_bytes() for f in sorted(PROMPT_DIR.glob("*.jsonl")))).hexdigest()
    name = str(getattr(model, "name_or_path", "") or type(model).__name__)
    key = dict(model=name, vocab=len(tok), dtype=str(next(model.parameters()).dtype), self_text=self_text,
               prompts=prompts[:16], version=1)
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name).name)[:60] or "model"
    return cache_root() / "superposed" / f"{stem}-{digest}.safetensors", key


def ngram_table(model, tok, self_text: int = 64, backend: str = "auto") -> NgramTable:
    """The model's n-gram table: read from the user cache, or built (its own text decoded greedily,
    about self_text x 100 forwards) and cached first."""
    from safetensors.torch import save_file
    path, key = table_path(model, tok, self_text)
    if not path.exists():
        docs = _table_docs(model, tok, self_text, backend)
        lens = torch.tensor([len(d) for d in docs], dtype=torch.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")    # atomic: a reader never sees half a file
        try:
            save_file({"tokens": torch.tensor([t for d in docs for t in d], dtype=torch.int32),
                       "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])},
                      str(tmp), metadata={"speclab": json.dumps(key)})
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return _load_table(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load_table(path: str, mtime: int) -> NgramTable:
    """A cached file's table, once per process (read-only, as a loaded model is: models.zoo.load_shared)."""
    from safetensors.torch import load_file
    d = load_file(path)
    toks, offs = d["tokens"].tolist(), d["offsets"].tolist()
    return NgramTable([toks[a:b] for a, b in zip(offs, offs[1:])])


# -- the loop -----------------------------------------------------------------------------------------
@dataclass
class Draft:
    tokens: list[int]
    score: float
    alive: bool = True


def decode(lm, prompt_ids: list[int], cfg: SuperposedConfig, table: NgramTable | None, max_new_tokens: int,
           eos: int | None, record: str | None, progress=None):
    """Run the steps; returns (final drafts best first, rounds, totals)."""
    k, a, rich = cfg.k, cfg.alpha, record is not None
    lm.reset()
    f0, t0 = lm.forwards, time.perf_counter()
    ids_at = "cpu" if getattr(lm, "host_ids", False) else lm.device
    alive, fin, rounds = [Draft([], 0.0)], [], []
    for step in range(max_new_tokens):
        t1 = time.perf_counter()
        if step == 0:                                   # the prompt's forward, as ar runs it
            logits = lm.forward(torch.tensor(prompt_ids, device=ids_at), logits_to_keep=1)
        else:                                           # superpose: sum_d w_d E[last token of d]
            w = torch.softmax(torch.tensor([d.score for d in alive], dtype=torch.float64), 0)
            rows = lm.embed_ids(torch.tensor([d.tokens[-1] for d in alive], device=lm.device)).float()
            vec = (w.to(rows)[:, None] * rows).sum(0, keepdim=True)                  # (1, C)
            logits = lm.forward(None, embeds=vec, logits_to_keep=1)
        t2 = time.perf_counter()
        lp = torch.log_softmax(logits[-1].float() / cfg.temp, -1)
        top_lp, top_ids = lp.topk(min(cfg.topk, lp.numel()))
        # ties (bf16 logits have them) go to the lower id, as argmax (ar) breaks them
        order = sorted(range(len(top_ids)), key=lambda j: (-float(top_lp[j]), int(top_ids[j])))
        top_lp, top_ids = top_lp[order], top_ids[order]
        lm_lp = (top_lp - torch.logsumexp(top_lp, 0)).tolist()               # renormalised on the top-k
        cand_tokens = top_ids.tolist()
        cands, table_rows, penalised = [], [], []
        for i, d in enumerate(alive):                   # score: (1 - a) log P + a log P_ngram
            ng = table.probs(prompt_ids + d.tokens, cand_tokens, cfg.weights) if a > 0 else None
            pen = ng is not None and not any(ng)
            penalised.append(pen)
            for j, (tok, l) in enumerate(zip(cand_tokens, lm_lp)):
                ng_lp = None if ng is None or ng[j] <= 0 else math.log(ng[j])
                s = l if a == 0 else (1 - a) * l - cfg.penalty if pen else \
                    None if ng_lp is None else (1 - a) * l + a * ng_lp
                if s is not None:
                    cands.append((d.score + s, i, tok))
                table_rows.append([i if step else -1, tok, round(l, 4), None if ng_lp is None else round(ng_lp, 4),
                                   None if s is None else round(s, 4)])
        # keep: the k best of the finished drafts (carried, entry = their place in the last beam)
        # and the new candidates; stable, so ties keep that order (finished, then draft, then rank)
        cands = [(f.score, len(alive) + j, -1) for j, f in enumerate(fin)] + cands
        kept = sorted(cands, key=lambda c: -c[0])[:k]
        prev = alive + fin
        grown = [(s, i, t, Draft(prev[i].tokens + [t], s, alive=t != eos)) if t >= 0 else (s, i, t, prev[i])
                 for s, i, t in kept]
        grown = [g for g in grown if g[3].alive] + [g for g in grown if not g[3].alive]     # alive first
        alive, fin = [g[3] for g in grown if g[3].alive], [g[3] for g in grown if not g[3].alive]
        beam = alive + fin
        done = step + 1 == max_new_tokens or not alive
        info = dict(sp_parent=[g[1] if step else -1 for g in grown], sp_token=[g[2] for g in grown])
        if rich:
            w = torch.softmax(torch.tensor([d.score for d in alive] or [0.0], dtype=torch.float64), 0).tolist()
            info.update(sp_score=[round(d.score, 4) for d in beam], sp_alive=[d.alive for d in beam],
                        sp_weight=[round(x, 4) for x in w[: len(alive)]] + [0.0] * len(fin),
                        sp_cand=table_rows, sp_penalised=penalised)
        if done:
            order = sorted(range(len(beam)), key=lambda e: -beam[e].score)
            info["sp_final"] = order
        rnd = Round(emitted=-1, emitted_kind="target", kept=0, info=info)
        rnd.verify_s, rnd.draft_s = t2 - t1, time.perf_counter() - t2
        rounds.append(rnd)
        if progress is not None:
            progress(1)
        if done:
            break
    out = [beam[e].tokens for e in order]
    tot = Totals(wall_s=time.perf_counter() - t0, target_forwards=lm.forwards - f0, new_tokens=len(out[0]),
                 verify_s=sum(r.verify_s for r in rounds), draft_s=sum(r.draft_s for r in rounds))
    return out, rounds, tot


def drafts(trace_or_result) -> list[list[int]]:
    """The k drafts a superposed run returned, best first, as token ids (read from its trace)."""
    return final_drafts(getattr(trace_or_result, "trace", trace_or_result))


# -- the engine's door (decoding/engines.py: the superposed Engine row) ---------------------------------
def run_superposed(target, prompt, method: str = "superposed", max_new_tokens: int = 128, record="light", seed=0,
                   device=None, dtype="auto", draft=None, chat: bool = False, temperature=0.0, top_k=None,
                   top_p=None, progress=None, backend: str = "auto", **params) -> Result:
    """Decode `prompt` into k drafts; the Result is the best one, its trace holds all k (drafts())."""
    if record not in RECORD_LEVELS:
        raise ValueError(f"record must be one of None, 'light', 'full', got {record!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if temperature or top_k is not None or top_p is not None:
        raise ValueError(f"{method} scores its k drafts deterministically (no sampling): drop temperature, "
                         "top_k and top_p (its own knobs are k, topk, alpha, temp)")
    if draft is not None:
        raise ValueError(f"{method} takes no draft model: the target alone writes its k drafts")
    if isinstance(prompt, (list, tuple)) and any(isinstance(p, (str, list, tuple)) for p in prompt):
        raise ValueError(f"{method} takes one prompt at a time")
    cfg = SuperposedConfig(**params).check()
    model, tok = as_model(target, device, dtype)
    n_pos = getattr(model.config, "max_position_embeddings", None)
    ids = encode_prompt(tok, chat_prompt(tok, prompt) if chat else prompt, max_new_tokens, n_pos)
    if resolve(model, backend, len(ids) + max_new_tokens) == "hf":
        raise ValueError(f"{method} feeds the model a mixed input vector, which speclab's lean forward takes (Llama, "
                         "Qwen2, Qwen3, Mistral); transformers' forward here does not: use backend='auto' on one of those")
    table = ngram_table(model, tok, cfg.self_text, backend) if cfg.alpha > 0 else None
    lm = make_lm(model, "target", backend, max_len=len(ids) + max_new_tokens + VERIFY_ROOM)
    out, rounds, totals = decode(lm, ids, cfg, table, max_new_tokens, tok.eos_token_id, record, progress)
    p = dict(asdict(cfg), max_new_tokens=max_new_tokens,
             backend=type(lm).__name__, **({"chat": True} if chat else {}),
             **({"ngram_tokens": table.tokens} if table is not None else {}))
    models = with_runners({"target": model_info(model, getattr(model, "name_or_path", "target"))}, lm)
    trace = Trace(engine="superposed", method=method, params=p, guarantee="lossy", models=models,
                  sampling=Sampling(0.0, None, None, seed), record=record, prompt_ids=ids, output_ids=out[0],
                  totals=totals, rounds=rounds)
    seen = trace.mentioned_ids() | {t for d in out for t in d} | {
        t for r in rounds for t in r.info["sp_token"] if t >= 0} | {
        int(c[1]) for r in rounds for c in r.info.get("sp_cand", ())}
    trace.token_text = token_table(tok, seen)
    return Result(text=tok.decode(out[0]), ids=list(out[0]), trace=trace)
