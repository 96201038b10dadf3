"""Which tasks speculation helps: the bench by task category, in the spirit of SPEED-Bench.

SPEED-Bench's point is that acceptance depends on what is asked: a draft that copies (prompt
lookup, suffix) wins where the answer repeats the prompt (extraction, summarising, editing code)
and loses where it does not (chat, writing); a trained draft wins where the target is predictable.
So the prompts come in categories, each a small hand-written set shipped beside the other prompt
sets (speclab/prompts/category-NAME.jsonl, {"chat": ...} rows, none a training seed), and the
bench reports each category x method:

    speclab bench --target smollm2-135m --draft smollm2-draft --categories --methods ar,prompt-lookup,eagle
    speclab bench ... --categories coding,math          # a subset

Every category is its own prompt set (its own warm-up, `ar` on the same prompts, suffix's history
within the category), so its speed-up is against `ar` on its own prompts. The per-category rows
(`category_rows`) carry the counts they are computed from (prompts, new tokens, target forwards,
drafted, accepted, wall seconds), and an `all` row per method sums them: tau = new tokens /
target forwards, alpha = accepted / drafted, speed-up = ar's wall / the method's, over every
category. The figure is speclab/figures/categories.py, drawn from these rows alone.
"""
from __future__ import annotations

from speclab.prompts import PROMPT_DIR

# SPEED-Bench's qualitative split has coding, math, humanities / STEM questions, writing,
# summarisation, roleplay, RAG, multilingual and reasoning; these are the ones a 135M instruct
# model answers at all, with extraction standing in for RAG and translation for multilingual.
CATEGORIES = ("coding", "math", "extraction", "summarising", "translation", "chat", "qa", "writing")
PREFIX = "category-"
ALL = "all"          # the row that sums every category


def category_file(name: str) -> str:
    return str(PROMPT_DIR / f"{PREFIX}{name}.jsonl")


def category_sets(spec: str) -> list[str]:
    """`all` (or empty) -> every category's prompt file; "coding,math" -> those. One ValueError line
    for a name that is no category or one given twice."""
    names = [s.strip() for s in (spec or ALL).split(",") if s.strip()]
    if names in ([], [ALL]):
        names = list(CATEGORIES)
    bad = [n for n in names if n not in CATEGORIES]
    if bad:
        raise ValueError(f"--categories: unknown category {bad[0]!r}: use all or some of {', '.join(CATEGORIES)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--categories: {twice[0]!r} is given twice")
    return [category_file(n) for n in names]


def category_of(prompt_set: str) -> str:
    """A result's prompt set (a category file's stem) -> the category's name."""
    return prompt_set.removeprefix(PREFIX)


def category_rows(results: list[dict], traces: dict) -> list[dict]:
    """One row per category x method, then one `all` row per method summing them.

    results: `bench()`'s output per category (rows, prompt_set, prompts); traces: prompt set ->
    method label -> [Trace per prompt] (the first pass's), where drafted and accepted are read
    (bench rows give alpha, not its counts). tau, alpha and speed-up are recomputed from the
    counts, so a category row agrees with its bench row and the `all` row is the whole."""
    out = []
    for res in results:
        ar_wall = next(r["wall_s"] for r in res["rows"] if r["method"] == res.get("baseline", "ar"))
        for r in res["rows"]:
            ts = traces.get(res["prompt_set"], {}).get(r["method"]) or []
            verified = bool(ts) and all(t is not None for t in ts) and ts[0].steps_row().verify
            out.append(dict(
                category=category_of(res["prompt_set"]), method=r["method"], prompts=res["prompts"],
                new_tokens=r["new_tokens"], target_forwards=r["target_forwards"],
                drafted=sum(t.totals.drafted for t in ts) if verified else None,
                accepted=sum(t.totals.accepted for t in ts) if verified else None,
                wall_s=r["wall_s"], ar_wall_s=ar_wall, identical_rate=r.get("identical_rate"),
                timing=r.get("timing")))
    methods = list(dict.fromkeys(r["method"] for r in out))
    for m in methods:
        rows = [r for r in out if r["method"] == m]
        counted = all(r["drafted"] is not None for r in rows)
        total = lambda key: sum(r[key] for r in rows)
        out.append(dict(category=ALL, method=m, prompts=total("prompts"), new_tokens=total("new_tokens"),
                        target_forwards=total("target_forwards"),
                        drafted=total("drafted") if counted else None,
                        accepted=total("accepted") if counted else None,
                        wall_s=round(total("wall_s"), 4), ar_wall_s=round(total("ar_wall_s"), 4),
                        identical_rate=(round(sum(r["identical_rate"] * r["prompts"] for r in rows)
                                              / total("prompts"), 3)
                                        if all(r["identical_rate"] is not None for r in rows) else None),
                        timing=None))
    for r in out:
        r["tau"] = round(r["new_tokens"] / r["target_forwards"], 3) if r["target_forwards"] else None
        r["alpha"] = round(r["accepted"] / r["drafted"], 3) if r["drafted"] else None
        r["speedup"] = round(r["ar_wall_s"] / r["wall_s"], 3) if r["wall_s"] else None
    return out


def markdown(rows: list[dict]) -> str:
    """The category x method table: a row per method, a column per category, each cell
    `speed-up / tau / alpha` (alpha "-" where nothing is drafted)."""
    cats = list(dict.fromkeys(r["category"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["category"], r["method"]): r for r in rows}
    fmt = lambda r: (f"{r['speedup']:.2f}x / {r['tau']:.2f} / " + ("-" if r["alpha"] is None else f"{r['alpha']:.2f}")
                     if r else "")
    head = "| method | " + " | ".join(cats) + " |\n|" + "---|" * (len(cats) + 1) + "\n"
    return head + "".join(f"| `{m}` | " + " | ".join(fmt(cell.get((c, m))) for c in cats) + " |\n" for m in methods)


def print_categories(rows: list[dict]):
    print("\nby category: speed-up over ar on the same category's prompts / tau / alpha")
    print(markdown(rows))
