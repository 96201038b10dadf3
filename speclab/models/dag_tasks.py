"""The DA-Transformers' two toy tasks: inputs, their every correct output, parsing and encoding.

  numwords   "305"        -> "three hundred five" | "three hundred and five"
  dates      "2024-03-05" -> "5 march 2024" | "march 5 2024" | "2024 march 5" | "the 5th of march 2024"

What decoding needs to read a user's input (`TASKS[task].parse`, `encode_source`) lives here, below
both decoding and training (the DA-Transformer recipe trains on these tasks).
"""
from __future__ import annotations

import datetime
import functools
import itertools
import random
from dataclasses import dataclass
from typing import Callable

from speclab.models.dag import BOS, EOS, SPECIALS, Vocab

# -- the toy tasks ---------------------------------------------------------------------------------
ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
MONTHS = "january february march april may june july august september october november december".split()
YEARS = (1950, 2049)


def _ordinal(d: int) -> str:
    return f"{d}{'th' if 10 <= d % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"


def _below_1000(n: int) -> list[list[str]]:
    """Every English rendering of 0 < n < 1000: "and" after "hundred" is optional."""
    h, r = divmod(n, 100)
    rest = [] if r == 0 else [ONES[r]] if r < 20 else [TENS[r // 10]] + ([ONES[r % 10]] if r % 10 else [])
    if not h:
        return [rest]
    head = [ONES[h], "hundred"]
    return [head + rest, head + ["and"] + rest] if rest else [head]


def numwords_variants(src: str) -> list[list[str]]:
    n = int(src)
    if n == 0:
        return [["zero"]]
    th, rest = divmod(n, 1000)
    a = [v + ["thousand"] for v in _below_1000(th)] if th else [[]]
    b = _below_1000(rest) if rest else [[]]
    return [x + y for x, y in itertools.product(a, b)]


def dates_variants(src: str) -> list[list[str]]:
    y, m, d = (int(x) for x in src.split("-"))
    month = MONTHS[m - 1]
    return [[str(d), month, str(y)], [month, str(d), str(y)], [str(y), month, str(d)],
            ["the", _ordinal(d), "of", month, str(y)]]


def numwords_parse(text: str) -> str:
    s = text.strip()
    if not s:
        raise ValueError("empty input: give a whole number from 0 to 999999, e.g. 305")
    if not s.isascii() or not s.isdigit():
        raise ValueError(f"numwords takes digits only, got {text!r}: give a whole number from 0 to 999999, e.g. 305")
    if len(s) > 6:
        raise ValueError(f"{text!r} has {len(s)} digits but numwords-dat supports at most 6: "
                         "give a number from 0 to 999999")
    return str(int(s))


def dates_parse(text: str) -> str:
    s = text.strip()
    if not s:
        raise ValueError(f"empty input: give a date as YYYY-MM-DD between {YEARS[0]} and {YEARS[1]}, e.g. 2024-03-05")
    if len(s) > 10:
        raise ValueError(f"{text!r} is longer than the model supports (10 characters): "
                         "give a date as YYYY-MM-DD, e.g. 2024-03-05")
    try:
        d = datetime.date.fromisoformat(s) if len(s) == 10 else None
    except ValueError:
        d = None
    if d is None or not YEARS[0] <= d.year <= YEARS[1]:
        raise ValueError(f"{text!r} is not a date YYYY-MM-DD between {YEARS[0]} and {YEARS[1]}: "
                         "give one like 2024-03-05")
    return d.isoformat()


@functools.lru_cache(maxsize=None)
def _all_dates() -> tuple[str, ...]:
    d0, d1 = datetime.date(YEARS[0], 1, 1), datetime.date(YEARS[1], 12, 31)
    return tuple((d0 + datetime.timedelta(days=i)).isoformat() for i in range((d1 - d0).days + 1))


@functools.lru_cache(maxsize=None)
def heldout(task: str) -> tuple[str, ...]:
    """The fixed held-out inputs of a task (never trained on), in a fixed random order."""
    rng = random.Random(1234)
    if task == "numwords":
        xs = rng.sample(range(100, 10_000), 1000) + rng.sample(range(10_000, 1_000_000), 1500)
        xs = [str(n) for n in xs]
    else:
        xs = rng.sample(_all_dates(), 2000)
    rng.shuffle(xs)
    return tuple(xs)


def _sample_numwords(rng: random.Random) -> str:
    k = rng.randint(1, 6)                              # uniform over digit counts, not over numbers
    return str(rng.randint(0 if k == 1 else 10 ** (k - 1), 10 ** k - 1))


@dataclass(frozen=True)
class Task:
    name: str
    words: tuple[str, ...]             # target vocabulary (source characters are added to it)
    src_chars: str
    max_chars: int
    upsample: float                    # lambda
    parse: Callable[[str], str]        # validate + canonicalise, or raise ValueError
    variants: Callable[[str], list[list[str]]]
    sample: Callable[[random.Random], str]

    def vocab(self) -> Vocab:
        toks = list(SPECIALS)
        for t in list(self.src_chars) + list(self.words):
            if t not in toks:
                toks.append(t)
        return Vocab(toks)


TASKS = {
    "numwords": Task("numwords", tuple(ONES[1:] + TENS[2:] + ["zero", "hundred", "thousand", "and"]),
                     "0123456789", 6, 3.0, numwords_parse, numwords_variants, _sample_numwords),
    "dates": Task("dates", tuple([str(d) for d in range(1, 32)] + [_ordinal(d) for d in range(1, 32)]
                                 + MONTHS + [str(y) for y in range(YEARS[0], YEARS[1] + 1)]
                                 + ["the", "of"]),
                  "0123456789-", 10, 2.0, dates_parse, dates_variants,
                  lambda rng: rng.choice(_all_dates())),
}


def encode_source(task: Task, vocab: Vocab, text: str) -> list[int]:
    """Source text -> [BOS, chars..., EOS] ids (ValueError with what to do on bad input)."""
    return [BOS] + vocab.encode(list(task.parse(text))) + [EOS]
