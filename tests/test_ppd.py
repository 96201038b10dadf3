"""PPD (speclab.models.ppd, decoding/drafters/ppd.py, train/ppd.py) on the code zoo with the shipped
toy prompt tokens `code-ppd`: lossless greedy, the sampled law against the target's (with a broken
variant that the same test rejects), the prompt rows equal to the training forward, the tree sized
by the machine's costs and its records, the figure, wrong pairings, and a trainer that runs."""
import pytest
import torch

import speclab
from conftest import greedy_identical_to_ar, tokens_a_forward, trainer_runs
from speclab.decoding.drafters.ppd import PPDDrafter, fit_shape
from speclab.models import zoo
from speclab.models.ppd import PromptTokens, ppd_config, prompt_mask


@pytest.fixture(scope="module")
def ppd(target):
    """The toy zoo's prompt tokens for code-target, with the target's tokenizer."""
    return zoo.load("code-ppd")[0], target[1]


@pytest.mark.parametrize("params, n", [(dict(), 2), (dict(budget=6, attach=2), 1)], ids=["auto", "fixed"])
def test_greedy_identical_to_ar(params, n, target, ppd, heldout_prompts, heldout_ar):
    greedy_identical_to_ar(target, heldout_prompts[:n], "ppd", ppd, params, heldout_ar, record=None)


def test_the_trained_toy_accepts_more_than_one_token_a_round(target, ppd, heldout_prompts):
    assert tokens_a_forward(target, heldout_prompts[0], "ppd", draft=ppd, budget=6) > 1.15


def test_the_trace_is_faithful_and_the_same_at_every_record_level(target, ppd, heldout_prompts, monkeypatch):
    """Replay gives the output; the recorded target forwards are the lean forwards that ran (one a
    round: the prompt rows ride in the verify) and no draft forward ran; sampled outputs do not
    depend on the recording level."""
    from speclab.models.lean.forward import LeanLM
    from speclab.trace import replay
    ran, real = [0], LeanLM.forward

    def counted(self, ids, *a, **kw):
        ran[0] += self.name == "target"
        return real(self, ids, *a, **kw)
    monkeypatch.setattr(LeanLM, "forward", counted)
    r = speclab.generate(target, heldout_prompts[1], "ppd", draft=ppd, max_new_tokens=32, record="full", budget=4)
    t = r.trace
    assert replay(t) == t.output_ids and t.totals.target_forwards == ran[0] == len(t.rounds)
    assert t.totals.draft_forwards == 0 and t.totals.accepted > 0
    outs = [speclab.generate(target, heldout_prompts[2], "ppd", draft=ppd, max_new_tokens=24, temperature=0.9, seed=3,
                             record=level, budget=4).ids for level in (None, "light", "full")]
    assert outs[0] == outs[1] == outs[2]


def test_the_guesses_are_the_training_forwards_prompt_rows(target, ppd, heldout_prompts):
    """A round's candidates at depth 1 are the top ranks of prompt token 1's row in the last verify,
    after the node the walk stopped at: the rows the trainer's forward (transformers' own, under
    prompt_mask) gives prompt token 1 after the committed text."""
    base, _ = target
    r = speclab.generate(target, heldout_prompts[0], "ppd", draft=ppd, max_new_tokens=6, record="light", budget=4)
    ids = list(r.trace.prompt_ids)             # round 0's verify: the prompt, its prompt rows after its last token
    rnd = r.trace.rounds[1]
    T, m = len(ids), ppd[0].m
    vis, pos = prompt_mask(T, m, torch.tensor([T - 1]))
    x = torch.cat([base.get_input_embeddings()(torch.tensor(ids)), ppd[0].prompt.detach().to(base.dtype)])
    with torch.no_grad():
        logits = base(inputs_embeds=x[None], attention_mask=torch.where(vis, 0.0, float("-inf"))[None, None],
                      position_ids=pos[None]).logits[0, T]
    top = logits.softmax(-1).topk(4)
    depth1 = [i for i, p in enumerate(rnd.nodes) if p.depth == 1]
    assert [rnd.nodes[i].token for i in depth1] == top.indices.tolist()[:len(depth1)]
    assert rnd.nodes[depth1[0]].q == pytest.approx(float(top.values[0]), abs=1e-4)
    assert rnd.info["ppd_guess"][0][0] == rnd.nodes[depth1[0]].token and rnd.info["ppd_from"] == "root"
    assert {n.source for n in rnd.nodes} == {f"ppd{d}@root" for d in {n.depth for n in rnd.nodes}}


def test_the_tree_follows_the_machines_costs(target, ppd, heldout_prompts):
    """Dear extra rows (each a forward) keep the tree small; free ones let it grow; the choice and the
    alternatives weighed are in the first round's record."""
    def fit(costs):
        r = speclab.generate(target, heldout_prompts[0], "ppd", draft=ppd, max_new_tokens=4, costs=costs)
        return r.trace.rounds[0].info
    cheap, dear = fit([1.0] + [1.01] * 29), fit(list(range(1, 31)))
    assert cheap["ppd_nodes"] > dear["ppd_nodes"] and cheap["ppd_rows"] > dear["ppd_rows"]
    for info in (cheap, dear):
        rates = [w[5] for w in info["ppd_weighed"]]
        assert info["ppd_rate"] == pytest.approx(max(rates), abs=1e-4)
        assert info["ppd_rows"] == 1 + info["ppd_nodes"] + ppd[0].m * (1 + len(info["ppd_attach"]))
    assert fit_shape([[0.9, 0.05]] * 3, 3, {T: 1.0 for T in range(1, 11)})[0]["nodes"] >= 6


def test_the_figure_draws_the_tree_and_acceptance_by_depth(target, ppd, heldout_prompts):
    from speclab.figures.views import view_of
    r = speclab.generate(target, heldout_prompts[1], "ppd", draft=ppd, max_new_tokens=24, budget=5, attach=1)
    spec = view_of(r.trace).spec("prompt-token tree")
    fig = spec.draw(r.trace, 2)
    info = r.trace.rounds[0].info
    tree = next(d for d in fig.data if d.name == "candidates")
    assert len(tree.x) == 1 + info["ppd_nodes"] and list(tree.marker.symbol).count("diamond") == 2
    measured = next(d for d in fig.data if d.name == "measured")
    trees = [rnd for rnd in r.trace.rounds if rnd.drafted]
    assert measured.y[0] == pytest.approx(sum(len(t.accepted) >= 1 for t in trees) / len(trees))
    plain = speclab.generate(target, heldout_prompts[1], "ar", max_new_tokens=4)
    assert "prompt-token tree" not in view_of(plain.trace).names


def test_wrong_pairings_say_what_to_do(target, ppd):
    from speclab.models.heads import build_medusa, head_config
    medusa = build_medusa(target[0], head_config(target[0].config, "medusa", 2), torch.arange(300))
    with pytest.raises(ValueError, match="needs trained prompt tokens.*speclab train ppd"):
        speclab.generate(target, "def f(x):", "ppd", draft=(medusa, target[1]))
    with pytest.raises(ValueError, match="lean forward"):
        speclab.generate(target, "def f(x):", "ppd", draft=ppd, backend="hf", max_new_tokens=4)
    with pytest.raises(ValueError, match="attach"):
        speclab.generate(target, "def f(x):", "ppd", draft=ppd, attach=2, max_new_tokens=4)
    for bad in ([1.2, 1.4], [1, 0.5]):             # c(T) starts at 1 and never falls under it
        with pytest.raises(ValueError, match="costs is c\\(T\\)"):
            speclab.generate(target, "def f(x):", "ppd", draft=ppd, costs=bad, max_new_tokens=4)
    with pytest.raises(ValueError, match="costs is c\\(T\\)"):  # a fixed budget has nothing to size
        speclab.generate(target, "def f(x):", "ppd", draft=ppd, budget=3, costs=[1, 1.1], max_new_tokens=4)


def test_the_trainer_runs_and_its_tokens_load_and_draft(target, tmp_path, monkeypatch):
    """`speclab train ppd --self-text N` on the toy target: a few steps, the saved prompt tokens load
    through the zoo (with their rank accuracies) and decode identically to ar."""
    toks = trainer_runs(target, tmp_path, monkeypatch, "ppd", "--anchors", "4", "--tokens", "2", "--ranks", "3")
    assert isinstance(toks, PromptTokens) and toks.m == 2
    assert len(toks.rank_acc) == 2 and all(len(a) == 3 for a in toks.rank_acc)


# -- sampling: the tiny pair of test_sampling_power, with random prompt tokens -------------------------
@pytest.fixture(scope="module")
def tiny():
    from test_sampling_power import llama

    from speclab.models.backends import make_lm
    base = llama(0)
    torch.manual_seed(0)
    cfg = ppd_config(base.config, 2)
    cfg.ppd_rank_acc = [[0.5, 0.3, 0.2, 0.1], [0.5, 0.3]]
    return base, make_lm(base, "target"), PromptTokens(base, cfg).eval()


def drafter(tiny):
    return PPDDrafter(tiny[0], tiny[2], budget=6)


@pytest.mark.parametrize("T", (0.7, 1.0))
def test_sampled_law_follows_the_target(T, tiny):
    """Round 1 (the prompt) carries the root's prompt rows; round 2 verifies their tree: the second
    token is drafted on most draws."""
    from sampling_law import draw_pairs, follows, target_law
    from test_sampling_power import PROMPT

    from speclab.decoding.acceptance import Sampler
    follows(target_law(tiny[0], PROMPT, Sampler(T)), draw_pairs(tiny[1], drafter(tiny), PROMPT, Sampler(T)))


def test_candidates_verified_as_samples_of_the_prompt_row_are_caught(tiny, monkeypatch):
    """The broken variant: the tree's top-k candidates handed to the rule with the prompt row's
    distribution as their q, as if sampled from it (accepted with min(1, p/q), the residual (p - q)+)."""
    from sampling_law import N_BROKEN, departs, draw_pairs, target_law
    from test_sampling_power import PROMPT

    from speclab.decoding.acceptance import Sampler
    propose, next_guess = PPDDrafter.propose, PPDDrafter.next_guess

    def keep_row(self, prompt_rows, anchors, last):
        next_guess(self, prompt_rows, anchors, last)
        if last in anchors:
            g = anchors.index(last)
            self.row = prompt_rows[g * self.m].float().softmax(-1)

    def as_sampled(self, ctx):
        tree = propose(self, ctx)
        if len(tree):
            tree.set_q(-1, self.row)
        return tree
    monkeypatch.setattr(PPDDrafter, "next_guess", keep_row)
    monkeypatch.setattr(PPDDrafter, "propose", as_sampled)
    departs(target_law(tiny[0], PROMPT, Sampler(1.0)),
            draw_pairs(tiny[1], drafter(tiny), PROMPT, Sampler(1.0), n=N_BROKEN))
