"""The bench's quality columns (speclab/bench/quality.py) on the toy zoo: greedy identity with ar,
the first-token TV of each rule under sampling (the rules' `induced` laws against their own walks),
the target's NLL against a direct computation, distinct-n by hand, and the default seed."""
import math

import pytest
import torch
from conftest import refused_in_one_line

import speclab
from speclab.bench.quality import distinct_n, first_divergence, token_agreement
from speclab.bench.report import markdown
from speclab.bench.runner import DEFAULT_SEED, bench, parse_methods, sampling_seeds
from speclab.decoding.acceptance import Sampler, accept_prob, warp
from speclab.decoding.rules import get_rule, rule_params
from speclab.decoding.rules.base import total_variation


def test_distinct_n_counts_by_hand():
    samples = [[1, 2, 1, 2], [1, 3]]
    # unigrams 1 2 1 2 1 3: 3 distinct of 6; bigrams (1,2) (2,1) (1,2) | (1,3): 3 of 4 (none across samples)
    assert distinct_n(samples, 1) == 0.5 and distinct_n(samples, 2) == 0.75
    assert distinct_n([[5]], 2) is None


def test_token_agreement_and_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2                # a prefix differs at its end
    same = token_agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]])
    assert same["identical_tokens"] == 1.0 and same["first_divergence"] is None
    diff = token_agreement([[1, 2, 3, 4], [4, 5, 6]], [[1, 2, 0, 4], [9, 5]])
    # common lengths 4 + 2; equal tokens 3 + 1; first divergences at 2 and 0
    assert diff["identical_tokens"] == round(4 / 6, 4) and diff["first_divergence"] == 1.0 and diff["diverged"] == 2


class Embedded(torch.nn.Module):
    """A model with nothing but an input embedding: what lantern reads."""

    def __init__(self, V: int):
        super().__init__()
        self.e = torch.nn.Embedding(V, 3)
        self.e.weight.data = torch.randn(V, 3, generator=torch.Generator().manual_seed(1))

    def get_input_embeddings(self):
        return self.e


def walk_law(name: str, params: dict, logits, q, point_mass: bool, model) -> torch.Tensor:
    """The law of the first token a walk of the rule emits for one candidate x ~ q, read off the walk
    itself token by token: for each x, its acceptance (typical: the walk's verdict; lantern: min(1,
    p~(x) / q(x)) from the test it records; rapid: min(1, p^(x) / q(x)), recorded the same way) and,
    where it can reject, the distribution it samples."""
    V, S = logits.shape[-1], Sampler(1.0)
    walk = get_rule(name).make(rule_params(name, params), model)
    law = torch.zeros(V, dtype=torch.float64)
    for x in range(V):
        weight = float(q[x])
        if weight == 0:
            continue
        path, emitted, dist, tries = walk({-1: [0]}, [x], {} if point_mass else {-1: q},
                                          lambda node: logits, S, None, lambda: 1.0)   # u = 1: rejects unless a = 1
        if name == "typical":
            law[x if path else emitted] += weight
            continue
        a = accept_prob(tries[0].inputs["p_tilde"], tries[0].q_x)
        law[x] += weight * a
        if not path:
            law += weight * (1 - a) * dist.double()
    return law


@pytest.mark.parametrize("name,params", [("typical", {}), ("typical", dict(eps=0.2, delta=0.9)),
                                         ("lantern", dict(k=2, delta=0.25)), ("lantern", dict(k=3, delta=0.4)),
                                         ("rapid", dict(eta=1.0)), ("rapid", dict(eta=4.0))])
@pytest.mark.parametrize("point_mass", [False, True])
def test_a_rules_induced_law_is_its_walks(name, params, point_mass):
    """`induced` (the TV column's source) gives the law the rule's own walk emits, and it is not p."""
    V, g = 6, torch.Generator().manual_seed(0)
    logits = torch.randn(V, generator=g) * 1.5
    q = (torch.nn.functional.one_hot(torch.tensor(2), V).float() if point_mass
         else torch.randn(V, generator=g).softmax(-1))
    model = Embedded(V)
    P = warp(logits, Sampler(1.0))
    dist, slack = get_rule(name).induced(P, q, rule_params(name, params), model)
    assert slack == 0.0 and float(dist.sum()) == pytest.approx(1.0, abs=1e-6)
    assert total_variation(dist, walk_law(name, params, logits, q, point_mass, model)) < 1e-5
    assert total_variation(dist, P) > 0.01


def test_no_tv_where_the_rule_gives_no_law_or_the_root_holds_several_candidates():
    from speclab.bench.quality import induced_tv
    logits, S = torch.randn(6, generator=torch.Generator().manual_seed(0)), Sampler(1.0)
    assert "no induced law" in induced_tv("exact", {}, [(logits, None, [1])], S)
    assert "several candidates" in induced_tv("typical", {}, [(logits, None, [1]), (logits, None, [1, 2])], S)
    tvs, slack = induced_tv("typical", {}, [(logits, None, []), (logits, None, [1])], S)
    P = warp(logits, S)                  # nothing drafted: typical emits the argmax, TV = 1 - max p
    assert tvs[0] == pytest.approx(1 - float(P.max())) and slack == 0.0


@pytest.fixture(scope="module")
def sampled(target, draft):
    specs = parse_methods("ar,draft-model[k=3;rule=exact],draft-model[k=3;rule=typical;rule.eps=0.1]")
    return bench(target, draft, specs, "code-complete", max_new_tokens=6, limit=1, record=None, progress=False,
                 keep_traces=True, temperature=0.9)


def test_sampling_rows_report_tv_nll_and_distinct(sampled, target):
    rows = {r["method"]: r for r in sampled["rows"]}
    assert sampled["temperature"] == 0.9 and sampled["seeds"] == [DEFAULT_SEED]
    for label in ("ar", "draft-model[k=3;rule=exact]"):               # lossless: no TV, by the guarantee
        assert rows[label]["guarantee"] == "identical-to-ar" and rows[label]["tv_per_step"] == 0.0
    lossy = rows["draft-model[k=3;rule=typical;rule.eps=0.1]"]
    assert lossy["guarantee"] == "lossy" and lossy["tv_per_step"] > 0 and lossy["tv_slack"] == 0.0
    assert lossy["identical_rate"] is None and lossy["mismatches"] is None
    assert sampled["traces"][lossy["method"]][0].params["rule_params"] == dict(eps=0.1, delta=0.3)
    for label, row in rows.items():
        t = sampled["traces"][label][0]
        assert math.isfinite(row["nll"]) and row["nll"] > 0, label
        assert row["distinct_1"] == distinct_n([t.output_ids], 1) and row["distinct_2"] == distinct_n([t.output_ids], 2)
        assert row["distinct_1_ar"] == rows["ar"]["distinct_1"] and row["distinct_2_ar"] == rows["ar"]["distinct_2"]
    # the NLL per token: one teacher-forced forward of the target over prompt + text, fp32 log-softmax
    t = sampled["traces"][lossy["method"]][0]
    with torch.no_grad():
        logp = target[0](torch.tensor([t.prompt_ids + t.output_ids])).logits[0].float().log_softmax(-1)
    n = len(t.prompt_ids)
    direct = -sum(float(logp[n - 1 + j, tok]) for j, tok in enumerate(t.output_ids)) / len(t.output_ids)
    assert lossy["nll"] == pytest.approx(direct, abs=1e-3)
    table = markdown(sampled)
    assert "tv_per_step" in table and "identical_rate" not in table
    assert f"| {lossy['method']} |" in table and table.count("| lossy |") == 1


def test_greedy_rows_count_identical_tokens(target, draft):
    res = bench(target, draft, parse_methods("ar,draft-model[k=3]"), "code-complete", max_new_tokens=6,
                limit=1, record=None, progress=False)
    for r in res["rows"]:
        assert r["identical_tokens"] == 1.0 and r["first_divergence"] is None and r["diverged"] == 0
        assert r["guarantee"] == "identical-to-ar" and r["identical_rate"] == 1.0
    assert res["temperature"] == 0.0 and "identical_tokens" in markdown(res) and "tv_per_step" not in markdown(res)


def test_a_sampled_bench_without_a_seed_uses_the_default_seed(sampled, target):
    """--temperature alone is reproducible: the seed is DEFAULT_SEED (0), recorded in every trace, and
    the text is the one speclab.generate samples with seed 0; --seeds N adds S+1 .. S+N-1."""
    first = sampled["traces"]["ar"][0]
    assert DEFAULT_SEED == 0 and all(ts[0].sampling.seed == 0 for ts in sampled["traces"].values())
    again = speclab.generate(target, first.prompt_ids, "ar", max_new_tokens=6, temperature=0.9, seed=0, record=None)
    assert again.ids == first.output_ids
    assert sampling_seeds(0.9, None, 1) == [0] and sampling_seeds(0.9, 7, 3) == [7, 8, 9]


@pytest.mark.parametrize("args,msg", [
    (["--methods", "ar,hf-greedy", "--temperature", "0.7"], "peers decode greedily"),
    (["--methods", "ar", "--seeds", "3"], "greedy decoding draws nothing"),
    (["--methods", "ar", "--temperature", "-1"], "--temperature must be >= 0"),
    (["--methods", "draft-model[rule=typical]"], "has no greedy form"),
    (["--methods", "draft-model[rule=typical;rule.nope=1]", "--temperature", "0.7"], "does not take ['nope']"),
])
def test_sampling_flags_fail_in_one_line_before_a_model_loads(capsys, no_model_loads, args, msg):
    refused_in_one_line(capsys, ["bench", "--target", "code-target", "--draft", "code-draft", "--limit", "1",
                                 "--max-new-tokens", "4"] + args, msg)
