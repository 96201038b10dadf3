"""NAME=VALUE method parameters as people type them: `--param schedule=heuristic` (CLI), the
dashboard's "other parameters" box, the bench's `draft-model[k=6;threshold=0.4]`. One parser for
all three, below each of them; then each value against the type its method declares
(`check_types`) and every number against its bound (`check_bounds`, the table BOUNDS), which every
engine's door calls, so the API, the CLI, the bench and the dashboard refuse the same values.
"""
from __future__ import annotations

import json
import math
import numbers
import types
import typing
from typing import Any


def parse_value(s: str) -> Any:
    """int, float, none / true / false, a JSON list ("[[0], [0, 0]]"), or the string itself. A number
    must be finite ("nan", "inf", "1e999" are refused): parameters are recorded in the trace, whose
    JSON other tools read, and no method has a use for one."""
    s = s.strip()
    for cast in (int, float):
        try:
            v = cast(s)
        except ValueError:
            continue
        if not math.isfinite(v):
            raise ValueError(f"value {s!r} is not a finite number")
        return v
    if s.startswith("["):
        try:
            v = json.loads(s, parse_constant=_no_constant)      # a JSON list: it starts with [
        except ValueError as e:                                 # JSONDecodeError, or NaN / Infinity
            raise ValueError(f"bad list value {s!r}: {e}") from e
        if not all(math.isfinite(x) for x in _numbers(v)):
            raise ValueError(f"bad list value {s!r}: its numbers must be finite")
        return v
    return {"none": None, "true": True, "false": False}.get(s.lower(), s)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _numbers(v: Any):
    """Every float or int in a parsed JSON value (json.loads turns 1e999 into inf)."""
    if isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _numbers(x)
    elif isinstance(v, float):
        yield v


def parse_assignment(item: str, example: str = "schedule=heuristic") -> tuple[str, Any]:
    """"name=value" -> (name with '-' as '_', parsed value); ValueError naming the expected form."""
    if "=" not in item:
        raise ValueError(f"parameter {item.strip()!r} needs the form name=value, e.g. {example}")
    name, value = item.split("=", 1)
    name = name.strip().replace("-", "_")
    if not name:
        raise ValueError(f"parameter {item.strip()!r} has no name: use name=value, e.g. {example}")
    return name, parse_value(value)


# -- a parsed value against the type its method declares -------------------------------------------
# `--param k=abc` parses to the string "abc"; a drafter or policy comparing it with a number fails
# with a TypeError deep in its code, so each value is checked first against the annotation of the
# constructor or config field it goes to: a number (int or float: whether it must be whole, and its
# range, are the method's own checks, whose messages say what the number means), bool, str, a class
# (a SuffixHistory), or none of them. The rest (a list of token ids, no annotation) is left to the
# method.
TYPE_WORDS = {int: "a number", float: "a number", bool: "true or false", str: "a string"}


def check_types(owner: str, params: dict, hints: dict) -> None:
    """ValueError naming the first parameter whose value its declared type (in `hints`) refuses."""
    for name, v in params.items():
        hint = hints.get(name)
        if hint is not None and _fits(hint, v) is False:
            arms = _arms(hint)
            want = " or ".join(dict.fromkeys(_word(t) for t in arms if t is not type(None)))
            want += " (or none)" if type(None) in arms else ""
            raise ValueError(f"{owner}: {name} must be {want}, got {_short(v)}")
    check_bounds(owner, params)             # every door that checks types checks bounds too


def _arms(hint) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _word(t) -> str:
    return TYPE_WORDS.get(t) or f"a {getattr(t, '__name__', t)}"


def _fits(hint, v) -> bool | None:
    """Whether `v` has the declared type; None where the annotation is one this does not read."""
    verdicts = [v is None if t is type(None) else _is(t, v) for t in _arms(hint)]
    if True in verdicts:
        return True
    return None if None in verdicts else False


def _is(t, v) -> bool | None:
    if t in (int, float):                   # numpy's numbers too: they are numbers.Real
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if t in (bool, str):
        return isinstance(v, t)
    if isinstance(t, type) and typing.get_origin(t) is None:     # a class, not list[int]
        return isinstance(v, t)
    return None


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# -- every numeric parameter against its bound ----------------------------------------------------
# The largest value each number may take, wherever it is parsed (the API through every engine's
# check_types, the CLI, the dashboard's form and URL arguments, the bench): a value past it would
# run for hours or fill memory (k=1000 drafts a thousand tokens a round; steps=10**9 denoises a
# billion times), so it is refused in one line that names the bound. The lower end is each method's
# own check (its message says what the number means: "k must be an integer >= 1"). A served page
# may be held tighter still (apps/service.py, Limits). A name means the same kind of size in every
# method that takes it; the bound is the loosest any of them needs.
SIZE, LENGTH, SCALE = 64, 8192, 1000
BOUNDS: dict[str, tuple[float, str]] = {
    # lengths: tokens and canvas slots (the real models' context is 8192)
    "max_new_tokens": (LENGTH, "new tokens"), "gen_length": (LENGTH, "canvas slots"),
    "block_length": (LENGTH, "slots a block"), "default_block": (LENGTH, "slots a block"),
    "sub_block": (LENGTH, "slots a sub-block"), "answer_length": (LENGTH, "answer slots"),
    "steps": (LENGTH, "steps"), "buffer": (LENGTH, "tokens buffered"), "interval": (LENGTH, "tokens between updates"),
    # draft sizes: tokens a round, nodes a tree, candidates a position
    "k": (SIZE, "draft tokens a round"), "max_k": (SIZE, "draft tokens a round"),
    "min_k": (SIZE, "draft tokens a round"), "k_full": (SIZE, "draft tokens a round"),
    "gamma": (SIZE, "draft tokens a round"), "L": (16, "draft chains"), "budget": (256, "tree nodes"),
    "width": (SIZE, "children a node"), "depth": (SIZE, "tree levels"), "topk": (SIZE, "candidates a token"),
    "keep": (256, "candidates kept"), "per_round": (SIZE, "exits tried a round"), "guesses": (SIZE, "guesses a round"),
    "ngram": (SIZE, "tokens an n-gram"), "max_ngram": (SIZE, "tokens an n-gram"), "min_ngram": (SIZE, "tokens an n-gram"),
    "min_match": (SIZE, "tokens matched"), "grow": (SIZE, "tokens added"), "lookup": (SIZE, "lookup drafts"),
    "override": (SIZE, "tokens matched"), "n": (LENGTH, "tokens the leader writes"),
    "chunk": (LENGTH, "tokens a chunk"), "query": (LENGTH, "query tokens"), "retrieve": (LENGTH, "tokens retrieved"),
    "retrieval": (256, "retrieval tree nodes"),
    "attach": (256, "candidates with prompt tokens"),
    "pool_size": (1024, "n-grams pooled"), "window": (1024, "positions in the window"),
    "draft_steps": (SIZE, "draft steps"), "branch_slots": (SIZE, "slots branched"), "branch_tokens": (SIZE, "tokens a branch"),
    "max_explore": (SIZE, "explorations a step"), "radius": (1024, "positions"), "window_unmasked": (1024, "positions"),
    "exit_layer": (1024, "layers"), "cold_start": (1024, "layers"), "cold_end": (1024, "layers"),
    "min_exit": (1024, "layers"), "exit_after": (1024, "layers"),
    "warmup": (LENGTH, "tokens at full depth"), "temporal_steps": (1024, "steps"), "max_post_edit_steps": (1024, "steps"), "rank": (1024, "adapter rank"),
    "vocab": (1_000_000, "draft vocabulary tokens"), "beam_size": (1024, "beams"), "top_k": (1_000_000, "tokens"),
    # search lengths of a method's own optimiser
    "opt_interval": (LENGTH, "rounds between optimisations"), "max_opt_iter": (100_000, "iterations"),
    "max_tolerance": (100_000, "rounds"),
    # scales, rates and margins: no cost grows with them, but a value past these means nothing
    "factor": (SCALE, "times the match"), "speedup": (SCALE, "times"), "overhead": (SCALE, "forwards"),
    "c_explore": (SCALE, "weight"), "lr": (SCALE, "learning rate"), "early": (SCALE, "margin"), "mid": (SCALE, "margin"),
    "late": (SCALE, "margin"), "tau_high": (SCALE, "margin"), "tau_low": (SCALE, "margin"),
    "beta": (SCALE, "weight"), "viterbi_beta": (SCALE, "weight"), "beam_alpha": (SCALE, "weight"),
    "temperature": (SCALE, "temperature"), "cost": (SCALE, "ar steps a drafted token"),
    "temp": (SCALE, "temperature"), "penalty": (SCALE, "log-probability penalty"),
    "self_text": (LENGTH, "tokens a prompt"),
}
# numbers that take any finite value: probabilities and fractions each method checks in [0, 1], and
# an entropy bound, where a huge value means "commit everything" (each is still finite: parse_value)
UNBOUNDED = {"threshold", "skip_ratio", "max_score", "alpha", "theta", "relaxed", "edit_threshold",
             "spatial_threshold", "temporal_threshold", "delimiter_threshold", "end_threshold", "top_p",
             "entropy_bound", "seed", "min_prob", "p", "prune", "exit_threshold", "depth_threshold"}


def check_bounds(owner: str, params: dict) -> None:
    """ValueError, in one line, for the first number in `params` past its bound in BOUNDS, e.g.
    "method 'prompt-lookup': k=1000 is past its bound of 64 (draft tokens a round): ask for 64 or less"."""
    for name, v in params.items():
        if name not in BOUNDS or isinstance(v, bool) or not isinstance(v, numbers.Real):
            continue
        limit, what = BOUNDS[name]
        if not math.isfinite(v):
            raise ValueError(f"{owner + ': ' if owner else ''}{name}={v} is not a finite number: give one up to {limit:g}")
        if v > limit:
            shown = str(v) if isinstance(v, numbers.Integral) or not math.isfinite(v) else f"{v:g}"
            raise ValueError(f"{owner + ': ' if owner else ''}{name}={shown} is past its bound of {limit:g} ({what}): "
                             f"ask for {limit:g} or less")
