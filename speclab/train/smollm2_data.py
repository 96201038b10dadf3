"""The self-generated training text of `smollm2-draft`: what the target writes and reads.

  chat    (Magpie) the target is fed only the chat template's user-turn prefix and samples a
          question; then it answers that question greedily. (--self-instruct) the question is
          the next item the target writes for a numbered list of hand-written seed questions
  code    prefixes of Python source (training modules only), continued greedily
  corpus  stdlib windows the target reads in one forward (label: its argmax there)

Every position the target produced keeps its top-8 next-token log-probs, so training adds a KL term
without running the target again. Rows are stored flattened in safetensors (save_rows / load_rows).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from speclab.models.loading import chat_prompt
from speclab.prompts import PROMPT_DIR

BASE = "smollm2-135m"
TOPK = 8
# what produced each token of a row; training predicts only tokens the target itself wrote
TEMPLATE, QUESTION, ANSWER, CODE_PREFIX, CODE_GEN, CORPUS = 0, 1, 2, 3, 4, 5
TRAINED_KINDS = (QUESTION, ANSWER, CODE_GEN, CORPUS)
# CORPUS: stdlib text read by the target in one forward; its label is the target's argmax there,
# not the next corpus token (a forward over a window costs far less per token than decoding it)
SOURCES = {"chat": 0, "code": 1, "corpus": 2}


# ----------------------------------------------------------------------------------------------
# 1. self-generated text

class TopKRecorder:
    """A logits processor that keeps the target's top-k log-probs at every generation step and
    returns the scores untouched. Custom processors run before the temperature / top-p warpers
    in transformers' generate, so what it sees are the raw logits."""

    def __init__(self, k: int = TOPK):
        self.k, self.lp, self.ids = k, [], []

    def __call__(self, input_ids, scores):
        lp, ids = torch.log_softmax(scores.float(), -1).topk(self.k, -1)  # (B, k)
        self.lp.append(lp.half())
        self.ids.append(ids.int())
        return scores

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, steps, k) log-probs and ids, then reset."""
        lp, ids = torch.stack(self.lp, 1), torch.stack(self.ids, 1)
        self.lp, self.ids = [], []
        return lp, ids


@dataclass
class Row:
    tokens: list[int]
    kinds: list[int]
    top_lp: torch.Tensor   # (T, k) float16: target's top-k log-probs FOR token t (predicted at t-1)
    top_ids: torch.Tensor  # (T, k) int32; rows of zeros / has_top False where not recorded
    has_top: list[int]
    split: str             # "chat" or "code"


def left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = torch.tensor(s)
        mask[i, L - len(s):] = 1
    return ids, mask


@torch.inference_mode()
def generate_batch(target, prompts: list[list[int]], eos: int, max_new: int, sample: bool,
                   temperature: float = 1.0, top_p: float = 0.95, tok=None, seed: int = 0):
    """Continue each prompt; returns per row (new tokens cut after the first eos, their top-k
    log-probs and ids, whether it ended with eos).

    With `tok` given and speclab's bf16 kernel available (speclab.models.kernels), the batch runs on
    speclab's own batched `ar` (one shared-slot cache, ~550 tokens/s at 8 rows on the 2-core CPU,
    against ~100-260 for transformers' generate()): the same tokens greedy, sampled lane i with seed
    + i, but no top-k is recorded (log-probs and ids come back None; training then uses CE only)."""
    from speclab.models import kernels
    p0 = next(target.parameters())
    if tok is not None and eos == tok.eos_token_id and kernels.available(p0.device, p0.dtype):
        from speclab.api import generate
        outs = generate((target, tok), prompts, "ar", max_new_tokens=max_new, record=None, seed=seed,
                        temperature=temperature if sample else 0.0, top_p=top_p if sample else None)
        return [(r.ids, None, None, bool(r.ids) and r.ids[-1] == eos) for r in outs]
    from transformers import LogitsProcessorList
    ids, mask = left_pad(prompts, eos)
    rec = TopKRecorder()
    kw = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if sample else dict(do_sample=False)
    out = target.generate(ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=eos,
                          pad_token_id=eos, logits_processor=LogitsProcessorList([rec]), **kw)
    new = out[:, ids.shape[1]:]                                             # (B, steps)
    lp, tid = rec.take()                                                    # (B, steps, k)
    res = []
    for b in range(len(prompts)):
        row = new[b].tolist()
        ended = eos in row
        n = row.index(eos) + 1 if ended else len(row)
        res.append((row[:n], lp[b, :n], tid[b, :n], ended))
    return res


def chat_prefix(tok) -> list[int]:
    """The template's text up to and including '<|im_start|>user\\n' (SmolLM2 inserts its default
    system prompt first: kept, since every user of the template gets it too)."""
    probe = "\x00PROBE\x00"
    text = tok.apply_chat_template([{"role": "user", "content": probe}], tokenize=False)
    return tok(text[:text.index(probe)], add_special_tokens=False)["input_ids"]


# Openers for instruction-style questions. Left alone, SmolLM2's Magpie questions are mostly
# first-person requests (most begin "I'm" or "Can"), far from
# the instructions people type ("Explain ...", "Write a Python function ..."); the drafts and heads
# trained on them agree about half as often on the bench's hand-written questions as on held-out
# Magpie rows (the gap measured: see SEED_QUESTIONS below). Forcing the first word spreads them.
# Single instruction words (the commonest first words of instruction-tuning sets such as Alpaca's),
# not phrases from the bench's questions, which stay held out.
OPENERS = ("Explain", "Write", "Describe", "Give", "Create", "Generate", "List", "Summarize", "Compare", "What",
           "How", "Why", "Suggest", "Rewrite", "Design", "Calculate", "Outline", "Identify", "Translate", "Classify")


# Self-instruct questions (--self-instruct), for the gap above: a drafter trained on Magpie questions
# agrees less often with the target after hand-written questions than after the target's own,
# although the target is as sure of its answers there (scripts/head_agreement.py measures the gap;
# docs/training.md, the training text). So the target is shown a numbered list of hand-written seed
# questions and writes the next one (Self-Instruct's bootstrap, without its filtering model).
SEED_QUESTIONS = Path(__file__).with_name("seed_questions.txt")
# the chat prompt sets (test and dev) stay held out: a written question whose content words mostly
# match one of theirs is dropped
HELD_OUT_QUESTIONS = [PROMPT_DIR / f for f in ("chat.jsonl", "chat-dev.jsonl")]
STOPWORDS = frozenset("a an and are as at be by can do does for from how i in is it its me my of on or "
                      "that the this to what when where which who why with you your".split())


def content_words(text: str) -> frozenset[str]:
    return frozenset(w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split()
                     if w not in STOPWORDS)


def seed_questions() -> list[str]:
    lines = SEED_QUESTIONS.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def held_out_words() -> list[frozenset[str]]:
    rows = [json.loads(line) for p in HELD_OUT_QUESTIONS for line in p.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return [content_words(r["chat"]) for r in rows if "chat" in r]


def too_close(words: frozenset[str], held: list[frozenset[str]], limit: float = 0.5) -> bool:
    """Jaccard overlap of content words above `limit` with any held-out question."""
    return any(len(words & h) > limit * len(words | h) for h in held)


def instruct_prompt(tok, seeds: list[str], rng: random.Random, shown: int = 6) -> list[int]:
    """A numbered list of `shown` seed questions, the next number open, as plain text (no template)."""
    picks = rng.sample(seeds, shown)
    text = "Questions people asked an AI assistant:\n" + "".join(f"{i + 1}. {q}\n" for i, q in enumerate(picks))
    return tok(text + f"{shown + 1}.", add_special_tokens=False)["input_ids"]


def instruct_question(text: str) -> str:
    """The written list item cut at its line's end (or the end of turn an instruct model writes
    there), or "" if it is not a usable question."""
    text = text.replace("<|im_end|>", "\n")
    q = text.split("\n", 1)[0].strip()
    ok = "\n" in text and 3 <= len(q.split()) <= 40 and q[:1].isalpha() and q[-1:] in "?." and "  " not in q
    return q if ok else ""


def magpie_questions(target, tok, prefix, batch: int, max_q: int, temperature: float, seed: int,
                     openers: tuple[str, ...], rnd: int, seen: set) -> list[tuple]:
    """One round of `batch` Magpie questions: (text, opener ids, sampled ids, their top-k lp, ids)."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    opened = [openers[(rnd * batch + i) % len(openers)] if openers else "" for i in range(batch)]
    o_ids = [tok(o, add_special_tokens=False)["input_ids"] if o else [] for o in opened]
    qs = generate_batch(target, [prefix + o for o in o_ids], eos, max_q, sample=True, temperature=temperature,
                        tok=tok, seed=seed + rnd * batch)          # lane i: seed + rnd * batch + i
    good = []
    for oi, (q_ids, q_lp, q_tid, ended) in zip(o_ids, qs):
        text = tok.decode(oi + q_ids[:-1]).strip() if ended else ""
        if ended and len(q_ids) >= 4 and text and text not in seen:
            seen.add(text)
            good.append((text, oi, q_ids, q_lp, q_tid))
    return good


def instruct_questions(target, tok, seeds: list[str], held: list, rng: random.Random, batch: int, max_q: int,
                       temperature: float, seed: int, rnd: int, seen: set) -> tuple[list[tuple], int]:
    """One round of `batch` self-instruct questions, as magpie_questions gives them (no sampled
    tokens kept: the question is re-tokenised in the chat template), and how many were dropped as
    too close to a held-out question."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    qs = generate_batch(target, [instruct_prompt(tok, seeds, rng) for _ in range(batch)], eos, min(max_q, 48),
                        sample=True, temperature=temperature, tok=tok, seed=seed + rnd * batch)
    good, dropped = [], 0
    for q_ids, *_ in qs:
        text = instruct_question(tok.decode(q_ids))
        words = content_words(text)
        if not text or not words or text in seen:
            continue
        if too_close(words, held):
            dropped += 1
            continue
        seen.add(text)
        good.append((text, [], [], None, None))
    return good, dropped


def gen_chat(target, tok, minutes: float, batch: int, max_q: int, max_a: int, temperature: float,
             log=print, seed: int = 0, openers: tuple[str, ...] = (), self_instruct: bool = False) -> list[Row]:
    """Magpie rounds (sample `batch` questions, answer them greedily) for `minutes` of wall time.
    openers: lane i of round r starts its question with openers[(r * batch + i) % len]; those words
    are forced, not written by the target, so they are TEMPLATE tokens (never trained on).
    self_instruct: the questions are written as the next item of a list of seed questions instead
    (instruct_questions); written in another context, they are TEMPLATE tokens too."""
    from tqdm.auto import tqdm
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prefix = chat_prefix(tok)
    seeds, held, rng = seed_questions(), held_out_words(), random.Random(seed)      # for self_instruct
    rows, seen, t0, ntok, rnd, dropped = [], set(), time.time(), 0, 0, 0
    bar = tqdm(total=int(minutes * 60), unit="s", desc="chat rows")
    while time.time() - t0 < minutes * 60:
        if self_instruct:
            good, n = instruct_questions(target, tok, seeds, held, rng, batch, max_q, temperature, seed, rnd, seen)
            dropped += n
        else:
            good = magpie_questions(target, tok, prefix, batch, max_q, temperature, seed, openers, rnd, seen)
        rnd += 1
        if not good:
            continue
        prompts = [chat_prompt(tok, g[0]) for g in good]
        answers = generate_batch(target, prompts, eos, max_a, sample=False, tok=tok)
        for (text, oi, q_ids, q_lp, q_tid), p, (a_ids, a_lp, a_tid, _) in zip(good, prompts, answers):
            # p = prefix + question text (re-tokenised) + '<|im_end|>\n<|im_start|>assistant\n'
            # the question may re-tokenise differently from how it was sampled: store the prompt as
            # the chat template tokenises it (what a user sends), and the sampled top-k only when
            # the tokens agree
            q_new = p[len(prefix):]
            kinds = [TEMPLATE] * len(prefix)
            n_o, n_q = len(oi), len(q_ids)  # opener (forced), sampled question incl. '<|im_end|>'
            same = p[:len(prefix)] == prefix and q_new[:n_o + n_q] == oi + q_ids
            kinds += ([TEMPLATE] * n_o + [QUESTION] * n_q + [TEMPLATE] * (len(q_new) - n_o - n_q) if same
                      else [TEMPLATE] * len(q_new))
            T = len(p) + len(a_ids)
            top_lp = torch.zeros(T, TOPK, dtype=torch.float16)
            top_ids = torch.zeros(T, TOPK, dtype=torch.int32)
            has = [0] * T
            q0 = len(prefix) + n_o
            if same and q_lp is not None:
                top_lp[q0:q0 + n_q], top_ids[q0:q0 + n_q] = q_lp, q_tid
                has[q0:q0 + n_q] = [1] * n_q
            if a_lp is not None:                   # the lean path records no top-k: CE only there
                top_lp[len(p):], top_ids[len(p):] = a_lp, a_tid
                has[len(p):] = [1] * len(a_ids)
            rows.append(Row(p + a_ids, kinds + [ANSWER] * len(a_ids), top_lp, top_ids, has, "chat"))
            ntok += n_q + len(a_ids)
        progress(bar, log, "chat", len(rows), ntok, t0)
    progress(bar, log, "chat", len(rows), ntok, t0, done=True)
    if self_instruct:
        log(f"self-instruct: {dropped} written questions dropped as too close to the bench's held-out ones")
    return rows


def progress(bar, log, name: str, n_rows: int, ntok: int, t0: float, done: bool = False):
    """The bar (wall seconds of the budget) and a log line after each generation round, or the total."""
    dt = time.time() - t0
    if done:
        bar.close()
        log(f"{name}: {n_rows} rows, {ntok:,} generated tokens in {dt:.0f}s ({ntok / dt:.0f} tok/s)")
        return
    bar.update(min(int(dt), bar.total) - bar.n)
    bar.set_postfix(rows=n_rows, tok_s=f"{ntok / dt:.0f}")
    log(f"{name} round: {n_rows} rows, {ntok:,} tokens, {dt:.0f}s", flush=True)


def code_prefixes(tok, n: int, rng: random.Random, lo: int = 48, hi: int = 160) -> list[list[int]]:
    """`n` prefixes of training-side stdlib files, starting at a line boundary."""
    from speclab.train.corpus import iter_texts
    texts = [t for t in iter_texts("train") if len(t) > 2000]
    out = []
    while len(out) < n:
        t = rng.choice(texts)
        lines = t.splitlines(keepends=True)
        start = rng.randrange(0, max(1, len(lines) - 40))
        ids = tok("".join(lines[start:start + 120]), add_special_tokens=False)["input_ids"]
        L = rng.randint(lo, hi)
        if len(ids) > L:
            out.append(ids[:L])
    return out


def gen_code(target, tok, minutes: float, batch: int, max_new: int, seed: int, log=print) -> list[Row]:
    from tqdm.auto import tqdm
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    rows, t0, ntok = [], time.time(), 0
    bar = tqdm(total=int(minutes * 60), unit="s", desc="code rows")
    while time.time() - t0 < minutes * 60:
        prompts = code_prefixes(tok, batch, rng)
        # an <|endoftext|>-style stop is rare in code; eos only stops the odd chat-like turn
        for p, (g, lp, tid, _) in zip(prompts, generate_batch(target, prompts, eos, max_new, sample=False, tok=tok)):
            T = len(p) + len(g)
            top_lp = torch.zeros(T, TOPK, dtype=torch.float16)
            top_ids = torch.zeros(T, TOPK, dtype=torch.int32)
            if lp is not None:
                top_lp[len(p):], top_ids[len(p):] = lp, tid
            rows.append(Row(p + g, [CODE_PREFIX] * len(p) + [CODE_GEN] * len(g), top_lp, top_ids,
                            [0] * len(p) + [int(lp is not None)] * len(g), "code"))
            ntok += len(g)
        progress(bar, log, "code", len(rows), ntok, t0)
    progress(bar, log, "code", len(rows), ntok, t0, done=True)
    return rows


@torch.inference_mode()
def gen_corpus_kd(target, tok, minutes: float, batch: int, seq_len: int, seed: int, log=print) -> list[Row]:
    """Windows of training-side stdlib files read by the target in one forward each: its top-k at
    every position (the label is its argmax: what a greedy verify would accept there)."""
    from speclab.train.corpus import iter_texts
    from tqdm.auto import tqdm
    rng = random.Random(seed + 1)
    texts = [t for t in iter_texts("train") if len(t) > 4000]
    rows, t0, ntok = [], time.time(), 0
    bar = tqdm(total=int(minutes * 60), unit="s", desc="corpus top-k")
    while time.time() - t0 < minutes * 60:
        xs = []
        while len(xs) < batch:
            t = rng.choice(texts)
            a = rng.randrange(0, len(t) - 3000)
            a = t.rfind("\n", 0, a) + 1
            ids = tok(t[a:a + 4 * seq_len], add_special_tokens=False)["input_ids"][:seq_len]
            if len(ids) == seq_len:
                xs.append(ids)
        x = torch.tensor(xs)
        logits = target(input_ids=x).logits                                 # (B, T, V)
        for b in range(batch):
            lp, tid = torch.log_softmax(logits[b].float(), -1).topk(TOPK, -1)  # (T, k), for token t+1
            top_lp = torch.zeros(seq_len, TOPK, dtype=torch.float16)
            top_ids = torch.zeros(seq_len, TOPK, dtype=torch.int32)
            top_lp[1:], top_ids[1:] = lp[:-1].half(), tid[:-1].int()
            rows.append(Row(xs[b], [CODE_PREFIX] + [CORPUS] * (seq_len - 1), top_lp, top_ids,
                            [0] + [1] * (seq_len - 1), "corpus"))
            ntok += seq_len - 1
        bar.update(min(int(time.time() - t0), bar.total) - bar.n)
        log(f"corpus: {len(rows)} rows, {ntok:,} tokens, {time.time() - t0:.0f}s", flush=True)
    bar.close()
    log(f"corpus: {len(rows)} rows, {ntok:,} positions in {time.time() - t0:.0f}s ({ntok / (time.time() - t0):.0f} tok/s)")
    return rows


def merge(a: dict, b: dict) -> dict:
    """Two row files as one (b's rows after a's)."""
    out = {k: torch.cat([a[k], b[k]]) for k in a if k != "offsets"}
    out["offsets"] = torch.cat([a["offsets"], b["offsets"][1:] + a["offsets"][-1]])
    return out


def save_rows(rows: list[Row], path: Path, meta: dict):
    """Rows flattened: tokens/kinds/has_top (sum T,), top_lp/top_ids (sum T, k), offsets (R+1,)."""
    from safetensors.torch import save_file
    lens = torch.tensor([len(r.tokens) for r in rows])
    t = {
        "tokens": torch.tensor([x for r in rows for x in r.tokens], dtype=torch.int32),
        "kinds": torch.tensor([x for r in rows for x in r.kinds], dtype=torch.uint8),
        "has_top": torch.tensor([x for r in rows for x in r.has_top], dtype=torch.uint8),
        "top_lp": torch.cat([r.top_lp for r in rows]).contiguous(),
        "top_ids": torch.cat([r.top_ids for r in rows]).contiguous(),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
        "is_code": torch.tensor([SOURCES[r.split] for r in rows], dtype=torch.uint8),  # 0 chat 1 code 2 corpus
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(t, str(tmp))
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2))


def load_rows(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(path))


def split_rows(data: dict, held_frac: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices (train, held out): `held_frac` of the chat rows and of the code rows, fixed by seed."""
    rng = random.Random(seed)
    train, held = [i for i in range(len(data["is_code"])) if int(data["is_code"][i]) == 2], []
    for code in (0, 1):
        idx = [i for i in range(len(data["is_code"])) if int(data["is_code"][i]) == code]
        rng.shuffle(idx)
        n = max(1, round(len(idx) * held_frac)) if idx else 0
        held += sorted(idx[:n])
        train += idx[n:]
    return sorted(train), held
