"""The category bench (speclab/bench/categories.py): its prompt sets, a row per category x method
whose counts add up to the whole, the figure drawn from those rows, the dashboard's panel, and bad
names refused in one line. On the toy zoo (its tokenizer has no chat template, so the categories'
questions run as raw text); speed is not asserted (BENCHMARKS.md's job)."""
import json

import pytest
from conftest import refused_in_one_line

from speclab.bench import categories
from speclab.bench.categories import ALL, CATEGORIES, category_file, category_sets
from speclab.cli import main
from speclab.prompts import PROMPT_DIR, load_prompts

METHODS = ["ar", "draft-model[k=2]"]
PICKED = ["extraction", "chat"]


def test_every_category_loads_eight_distinct_questions():
    on_disk = sorted(p.stem.removeprefix("category-") for p in PROMPT_DIR.glob("category-*.jsonl"))
    assert on_disk == sorted(CATEGORIES)
    seen = set()
    for c in CATEGORIES:
        rows = load_prompts(category_file(c))
        assert len(rows) == 8 and all(isinstance(r, dict) and r["chat"].strip() for r in rows), c
        questions = {r["chat"] for r in rows}
        assert len(questions) == 8 and not questions & seen, c      # no question twice, in or across sets
        seen |= questions
    assert category_sets("all") == category_sets("") == [category_file(c) for c in CATEGORIES]
    assert category_sets("math, coding") == [category_file("math"), category_file("coding")]


@pytest.fixture(scope="module")
def raw_categories(tmp_path_factory):
    """The shipped categories' questions as raw-text prompt files ({"prompt": ...}), in a folder the
    bench reads its categories from: the toy zoo has no chat template to wrap them in."""
    d = tmp_path_factory.mktemp("categories")
    for c in CATEGORIES:
        rows = load_prompts(category_file(c))
        (d / f"category-{c}.jsonl").write_text("".join(json.dumps({"prompt": r["chat"]}) + "\n" for r in rows))
    return d


@pytest.fixture(scope="module")
def bench_json(raw_categories, tmp_path_factory):
    """One `speclab bench --categories` on two categories, one prompt each."""
    mp = pytest.MonkeyPatch()
    mp.setattr(categories, "PROMPT_DIR", raw_categories)
    out = tmp_path_factory.mktemp("bench") / "c.json"
    try:
        assert main(["bench", "--target", "code-target", "--draft", "code-draft", "--max-new-tokens", "6",
                     "--record", "none", "--methods", ",".join(METHODS), "--categories", ",".join(PICKED),
                     "--limit", "1", "--json", str(out)]) == 0
    finally:
        mp.undo()
    return json.loads(out.read_text())


def whole(raw_categories, method: str) -> tuple[int, int]:
    """New tokens and target forwards of `method` over the categories' first prompts decoded one
    after another, outside the bench: the whole the category rows must add up to."""
    from speclab.api import as_model
    from speclab.bench.runner import parse_methods, run_one
    from speclab.prompts import encode
    target, draft = as_model("code-target", "cpu", "auto"), as_model("code-draft", "cpu", "auto")
    runs = [run_one(parse_methods(method)[0], target, draft,
                    encode(target[1], load_prompts(str(raw_categories / f"category-{c}.jsonl"))[0], 6, None),
                    6, 4, 4, None) for c in PICKED]
    return sum(len(r["ids"]) for r in runs), sum(r["target_forwards"] for r in runs)


def test_a_row_per_category_and_method_whose_counts_add_up_to_the_whole(bench_json, raw_categories):
    rows = bench_json["categories"]
    assert [(r["category"], r["method"]) for r in rows] == \
        [(c, m) for c in PICKED for m in METHODS] + [(ALL, m) for m in METHODS]
    for m in METHODS:
        part = [r for r in rows if r["method"] == m and r["category"] != ALL]
        total = next(r for r in rows if r["method"] == m and r["category"] == ALL)
        for key in ("prompts", "new_tokens", "target_forwards", "drafted", "accepted"):
            if total[key] is not None:
                assert total[key] == sum(r[key] for r in part), (m, key)
        assert total["tau"] == round(total["new_tokens"] / total["target_forwards"], 3)
        assert total["prompts"] == len(PICKED)
        # greedy and stateless across prompts: the same prompts decoded outside the bench
        assert (total["new_tokens"], total["target_forwards"]) == whole(raw_categories, m), m
    # each category row agrees with its own bench row
    bench_rows = {(r["prompt_set"].removeprefix("category-"), r["method"]): r for r in bench_json["rows"]}
    for r in rows[:-len(METHODS)]:
        b = bench_rows[r["category"], r["method"]]
        assert (r["tau"], r["alpha"]) == (b["tau"], b["alpha"])
        assert r["speedup"] == pytest.approx(b["speedup_vs_ar"], rel=1e-2)
    assert all(r["speedup"] == 1.0 and r["alpha"] is None for r in rows if r["method"] == "ar")


def test_the_figure_draws_from_the_rows(bench_json):
    from speclab.figures.categories import category_figure
    rows = bench_json["categories"]
    fig = category_figure(rows)
    speed, acceptance = fig.data
    assert list(speed.y) == METHODS[1:] and list(speed.x) == PICKED + [ALL]      # ar, 1x by definition, left out
    cell = {(r["method"], r["category"]): r for r in rows}
    assert speed.text[0][0] == f"{cell['draft-model[k=2]', PICKED[0]]['speedup']:.2f}x"
    assert acceptance.z[0][-1] == cell["draft-model[k=2]", ALL]["tau"]
    assert f"α {cell['draft-model[k=2]', ALL]['alpha']:.2f}" in acceptance.text[0][-1]
    with pytest.raises(ValueError, match="besides the baseline"):
        category_figure([r for r in rows if r["method"] == "ar"])


def test_the_panel_shows_a_saved_bench_and_refuses_one_without_categories(bench_json, tmp_path):
    from speclab.apps.categories import CategoriesPanel
    path = tmp_path / "2026-01-01-categories.json"
    path.write_text(json.dumps(bench_json))
    panel = CategoriesPanel(path)
    assert panel.chart.object is not None and "| `draft-model[k=2]` |" in panel.table.object
    panel.show({k: v for k, v in bench_json.items() if k != "categories"}, "plain.json")
    assert "holds no category rows" in panel.note.object
    panel.column()


@pytest.mark.parametrize("names,msg", [
    ("coding,poetry", "--categories: unknown category 'poetry': use all or some of coding, math"),
    ("math,math", "--categories: 'math' is given twice"),
])
def test_bad_category_names_are_refused_in_one_line(capsys, no_model_loads, names, msg):
    refused_in_one_line(capsys, ["bench", "--target", "code-target", "--methods", "ar", "--categories", names], msg)
