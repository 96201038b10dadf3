"""SpecDec++: the acceptance head (one shared ResBlock, safetensors round trip), the stopping rule
(threshold and bounds, one recorded decision per draft step, K = what was drafted), lossless greedy
decoding on the toy zoo with the zoo's head, the target's joint of two sampled tokens at T = 1 while
K varies, the trainer's labels, loss and written head, and the figure's data."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.specdecpp import SpecDecPPDrafter
from speclab.figures.specdecpp import head_pairs, stopping_figure
from speclab.figures.views import view_of
from speclab.models.acceptance_head import for_draft, head_info, load_head, paired_head, save_head
from speclab.models.lean.forward import LeanLM
from speclab.trace import Trace, replay
from speclab.train import specdecpp as trainer

from sampling_law import pair_counts  # tests/ is on the path, as for conftest
from test_rules import chi2_p

pytestmark = pytest.mark.usefixtures("one_thread")     # a toy's tiny products (conftest)
NEW = 40


def constant_head(draft, a: float, where, reads: str = "token") -> str:
    """A head that says p_accept = a for every state: its output layer reads nothing, its bias is
    the log-odds of a (a real head with chosen weights, saved and loaded as any other)."""
    head = for_draft(draft)
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.copy_(torch.tensor([0.0, math.log(a / (1 - a))]))
    save_head(head, where, {"draft": "constant", "reads": reads})
    return str(where)


# -- the head ---------------------------------------------------------------------------------------
def test_the_head_applies_one_resblock_n_times_and_round_trips_through_safetensors(draft, tmp_path):
    torch.manual_seed(0)
    head = for_draft(draft[0], num_layers=3)
    assert set(head.state_dict()) == {"norm", "block.linear.weight", "block.linear.bias", "out.weight", "out.bias"}
    x = torch.randn(5, head.hidden_size)
    f = torch.nn.functional.rms_norm(x, (head.hidden_size,), draft[0].model.norm.weight.float(), head.eps)
    for _ in range(3):
        f = f + torch.nn.functional.silu(head.block.linear(f))
    assert torch.allclose(head(x), head.out(f), atol=1e-6)
    save_head(head, tmp_path / "h", {"draft": "code-draft", "note": "test"})
    back = load_head(tmp_path / "h")
    assert torch.equal(back.p_accept(x), head.p_accept(x))
    assert head_info(tmp_path / "h")["note"] == "test" and not list((tmp_path / "h").glob("*.tmp"))
    assert paired_head("code-draft").name == "code-specdecpp" and paired_head("no-such-draft") is None


# -- the stopping rule ------------------------------------------------------------------------------
@pytest.mark.parametrize("a,h,min_k,max_k,reads,K,why", [
    (0.9, 0.3, 2, 8, "token", 5, "threshold"),     # 1 - 0.9^3 = 0.27 <= 0.3 < 1 - 0.9^4 = 0.34: stop at K = 5
    (0.9, 0.3, 2, 8, "context", 4, "threshold"),   # the same, y_K's estimate in the product at K
    (0.5, 0.3, 3, 8, "token", 3, "threshold"),     # K = 2 passes h (0.5) but min_k = 3 goes on
    (0.99, 0.3, 2, 4, "token", 4, "max_k"),        # never passes h before the bound
])
def test_the_rule_stops_by_threshold_and_bounds_and_records_every_step(target, draft, tmp_path, a, h, min_k,
                                                                       max_k, reads, K, why):
    head = constant_head(draft[0], a, tmp_path / "const", reads)
    prompt = "def parse(line):"
    ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
    r = speclab.generate(target, prompt, "specdec++", draft=draft, max_new_tokens=NEW, head=head, threshold=h,
                         min_k=min_k, max_k=max_k)
    assert r.ids == ref
    for rd in r.trace.rounds:
        ds = [d for d in rd.decisions if d.policy == "specdec++"]
        assert len(ds) == rd.drafted and [d.at for d in ds] == list(range(1, rd.drafted + 1))
        assert [d.output for d in ds] == ["go"] * (rd.drafted - 1) + ["stop"]
        assert ds[-1].note == rd.info["stop"]
        for d in ds:
            assert d.inputs["of"] == (d.at - 1 if reads == "token" else d.at)
            assert d.threshold == h and d.inputs["p_any_reject"] == pytest.approx(1 - a ** d.inputs["of"], abs=1e-5)
            assert d.inputs["p_accept"] == pytest.approx(1.0 if d.inputs["of"] == 0 else a, abs=1e-5)
        if ds[-1].note != "eos":
            assert rd.drafted == K and ds[-1].note == why
        if min_k == 3:
            assert ds[1].note == "min_k" and ds[1].output == "go"


@pytest.mark.parametrize("kw,words", [
    (dict(threshold=0.0), "threshold must be in"),
    (dict(threshold=1.5), "threshold must be in"),
    (dict(min_k=0), "min_k must be an integer >= 1"),
    (dict(max_k=2.5), "max_k must be an integer >= 1"),
    (dict(min_k=5, max_k=3), r"min_k \(5\) must be <= max_k \(3\)"),
    (dict(head="/no/such/head"), "neither a zoo name nor a directory"),
])
def test_bad_parameters_are_one_line_errors_that_say_what_to_do(draft, kw, words):
    with pytest.raises(ValueError, match=words) as e:
        SpecDecPPDrafter(draft[0], **kw)
    assert "\n" not in str(e.value)


def test_a_draft_without_a_head_in_the_zoo_says_how_to_train_one():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    model.name_or_path = "my-draft"
    with pytest.raises(ValueError, match="no acceptance head for the draft 'my-draft'.*speclab train specdecpp"):
        SpecDecPPDrafter(model)


# -- lossless ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zoo_runs(target, draft, heldout_prompts):
    prompts = heldout_prompts[:3]
    refs = [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in prompts]
    runs = [speclab.generate(target, p, "specdec++", draft=draft, max_new_tokens=NEW) for p in prompts]
    return refs, runs


def test_greedy_is_identical_to_ar_on_the_toy_zoo_with_the_zoos_head(zoo_runs, tmp_path):
    refs, runs = zoo_runs
    assert [r.ids for r in runs] == refs
    rounds = [rd for r in runs for rd in r.trace.rounds]
    assert sum(len(rd.accepted) for rd in rounds) > 0
    assert len({rd.drafted for rd in rounds if rd.drafted}) >= 2            # the head varies K
    assert all(len(rd.decisions) == rd.drafted for rd in rounds)
    back = Trace.load(runs[0].trace.save(tmp_path / "specdecpp.json"))
    assert replay(back) == runs[0].trace.output_ids
    assert [rd.decisions for rd in back.rounds] == [rd.decisions for rd in runs[0].trace.rounds]


def test_the_first_two_sampled_tokens_follow_the_targets_joint_while_k_varies(tmp_path):
    """A random toy target and draft, a random head (T = 1, top-k 4): whatever K the head picks from
    the draft's own states, the first two tokens are distributed as the target's joint (chi-square,
    p-value > 0.001)."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=24, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
               max_position_embeddings=64, initializer_range=0.3, eos_token_id=None, bos_token_id=None)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, **cfg)).eval()
    small = LlamaForCausalLM(LlamaConfig(hidden_size=16, **cfg)).eval()
    head = for_draft(small)
    torch.nn.init.normal_(head.out.weight, std=1.0)
    save_head(head, tmp_path / "h", {"draft": "random"})
    prompt, s, V, n = [3, 7, 1, 9], Sampler(1.0, top_k=4), 24, 600
    with torch.no_grad():
        p = lambda ids: warp(model(input_ids=torch.tensor([ids])).logits[0, -1], s)   # noqa: E731
        first = p(prompt)
        joint = torch.stack([first[x] * p(prompt + [x]) for x in range(V)])            # (V, V)
    drafter = SpecDecPPDrafter(small, head=str(tmp_path / "h"), threshold=0.5, min_k=1, max_k=4)
    counts, firsts = pair_counts(LeanLM(model, "target"), lambda: drafter, prompt, s, n, V)
    ks = {r.drafted for r in firsts}
    assert len(ks) >= 2
    support = joint > 0                     # top-k 4: the cells outside it never occur
    assert counts[~support].sum() == 0
    assert chi2_p(counts[support], joint[support]) > 1e-3


# -- the trainer ------------------------------------------------------------------------------------
def test_the_loss_is_the_papers_weighted_soft_bce():
    logits, a, w = torch.tensor([[0.0, 1.0], [2.0, -1.0]]), torch.tensor([1.0, 0.25]), 6.0
    ls = logits.log_softmax(-1)
    want = -(w * 0.75 * ls[1, 0] + 1.0 * ls[0, 1] + 0.25 * ls[1, 1]) / (w * 0.75 + 1.25)
    assert trainer.weighted_bce(logits, a, w).item() == pytest.approx(want.item(), rel=1e-6)
    assert trainer.auc(torch.tensor([0.9, 0.8, 0.1, 0.3]), torch.tensor([True, True, False, False])) == 1.0
    assert trainer.auc(torch.tensor([0.5, 0.5]), torch.tensor([True, False])) == 0.5


def test_the_trainer_labels_the_targets_text_trains_and_writes_a_head_that_loads(target, draft, tmp_path):
    model, tok = target
    rows = trainer.write_text(model, tok, trainer.prompts_for(tok, 0, 4, seed=0), max_new=16, log=lambda *a, **k: None)
    assert len(rows) == 4 and all(len(ids) - n == 16 for ids, n in rows)
    X, y, q = trainer.examples(model, draft[0], rows, "greedy", mixing=0.0)
    assert X.shape == (64, draft[0].config.hidden_size) and set(y.unique().tolist()) <= {0.0, 1.0}
    assert ((q > 0) & (q <= 1)).all()
    Xm, _, _ = trainer.examples(model, draft[0], rows, "greedy", mixing=0.5)
    assert 0 < len(Xm) < 64                                        # mixed-in target tokens carry no loss
    _, ys, _ = trainer.examples(model, draft[0], rows, "soft", mixing=0.0)
    Xc, yc, _ = trainer.examples(model, draft[0], rows[:1], "greedy", mixing=0.0, reads="context")
    assert torch.equal(Xc[1:], X[:15]) and torch.equal(yc, y[:16])   # the state one position earlier
    assert ((ys >= 0) & (ys <= 1)).all() and ((ys > 0) & (ys < 1)).any()
    head = for_draft(draft[0])
    state = trainer.train_head(head, X, y, minutes=1.0, batch=16, epochs=2)
    assert state["step"] == 8
    ev = trainer.evaluate(head, X, y)
    assert ev["n"] == 64 and 0 <= ev["brier"] <= 1 and sum(c[3] for c in ev["calibration"]) == 64
    save_head(head, tmp_path / "trained", {"draft": "code-draft", "held_out": ev})
    assert torch.equal(load_head(tmp_path / "trained").p_accept(X), head.p_accept(X))


# -- the figure -------------------------------------------------------------------------------------
def test_the_figure_pairs_each_scored_and_judged_token_with_its_verdict(zoo_runs):
    trace = zoo_runs[1][0].trace
    pairs = head_pairs(trace)
    want = sum(min(rd.drafted - 1, len(rd.accepted) + 1) for rd in trace.rounds if rd.drafted)
    assert len(pairs) == want and pairs
    assert all(acc == (d <= len(trace.rounds[i].accepted)) for i, d, _, acc in pairs)
    fig = stopping_figure(trace, 2)
    bars = next(t for t in fig.data if t.name == "accepted")
    assert list(bars.y) == [len(rd.accepted) for rd in trace.rounds]
    assert list(next(t for t in fig.data if t.name == "current").x) == [3, 3]
    names = [f.name for f in view_of(trace).summary]
    assert "stopping rule" in names and "decisions over the run" in names
