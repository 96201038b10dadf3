"""Hidden Transfer (speclab.models.hidden_transfer, decoding/drafters/hidden_transfer.py,
train/hidden_transfer.py) on the code zoo with the shipped toy transfer `code-hidden-transfer`:
lossless greedy, the sampled law of a tiny pair against the target's (and a misreported variant that
the same test rejects), the draft step equal to the training forward, the record and its figure, a
wrong pairing, and a trainer that runs."""
import pytest
import torch

import speclab
from conftest import greedy_identical_to_ar, sampled_drafts_are_point_mass, tokens_a_forward
from speclab.decoding.acceptance import Sampler
from speclab.models import zoo
from speclab.models.hidden_transfer import HiddenTransfer, transfer_config


@pytest.fixture(scope="module")
def transfer(target):
    """The toy zoo's transfer layers for code-target, with the target's tokenizer."""
    return zoo.load("code-hidden-transfer")[0], target[1]


@pytest.mark.parametrize("params, n", [(dict(), 2), (dict(budget=8, width=2, depth=3, threshold=None), 1)],
                         ids=["defaults", "deeper-tree"])
def test_greedy_identical_to_ar(params, n, target, transfer, heldout_prompts, heldout_ar):
    greedy_identical_to_ar(target, heldout_prompts[:n], "hidden-transfer", transfer, params, heldout_ar, record=None)


def test_the_trained_toy_accepts_more_than_one_token_a_round(target, transfer, heldout_prompts):
    assert tokens_a_forward(target, heldout_prompts[0], "hidden-transfer", draft=transfer) > 1.2


def test_the_draft_step_equals_the_training_forward(target, transfer, heldout_prompts):
    """Round 1 drafts from the state after layer l at the prompt's last position t: each offset's
    recorded top-1 (token, probability) is the training forward's pseudo row for anchor t."""
    from speclab.train.hidden_transfer import transfer_forward
    base, ht = target[0], transfer[0]
    r = speclab.generate(target, heldout_prompts[0], "hidden-transfer", draft=transfer, max_new_tokens=4,
                         record="light")
    rnd = r.trace.rounds[1]
    ids = list(r.trace.prompt_ids) + [r.trace.rounds[0].emitted]
    t = len(ids) - 2
    with torch.no_grad():
        # K more tokens so the (unused) teacher rows exist; the pseudo rows see positions <= t only
        student, _ = transfer_forward(base, ht, torch.tensor([ids + [0] * ht.k]), torch.tensor([[t]]))
        q = base.lm_head(base.model.norm(student[0, 0])).float().softmax(-1)          # (K, V)
    top = q.max(-1)
    assert rnd.info["transfer_layer"] == ht.layer and rnd.info["transfer_at"] == 1
    assert [p[0] for p in rnd.info["transfer_pred"]] == top.indices.tolist()
    assert [p[1] for p in rnd.info["transfer_pred"]] == pytest.approx(top.values.tolist(), abs=2e-3)
    first = [n for n in rnd.nodes if n.depth == 1]
    assert max(n.q for n in first) == pytest.approx(float(top.values[0]), abs=2e-3)


def test_the_record_and_its_figure(target, transfer, heldout_prompts):
    from speclab.figures.hidden_transfer import transfer_agreement, transfer_figure
    from speclab.figures.views import view_of
    from speclab.records import TransferPrediction
    r = speclab.generate(target, heldout_prompts[1], "hidden-transfer", draft=transfer, max_new_tokens=24,
                         record="light")
    t = r.trace
    assert "transfer agreement" in view_of(t).names
    layer, tally = transfer_agreement(t)
    assert layer == transfer[0].layer and len(tally) == transfer[0].k
    # offset 1 predicts the first token each round commits: its hits counted another way
    hits = n = 0
    for rnd in t.rounds[1:]:
        rec = TransferPrediction.of(rnd)
        written = (rnd.path_tokens + [rnd.emitted])[0]
        if rec.transfer_at < len(t.output_ids):
            hits, n = hits + (rec.transfer_pred[0][0] == written), n + 1
    assert tally[0] == [hits, n] and n == len(t.rounds) - 1
    fig = transfer_figure(t, 2)
    assert list(fig.data[0].y) == pytest.approx([h / m for h, m in tally])
    assert f"layer {layer}" in fig.layout.title.text
    plain = speclab.generate(target, heldout_prompts[1], "hidden-transfer", draft=transfer, max_new_tokens=24,
                             record=None)
    assert plain.ids == r.ids and "transfer agreement" not in view_of(plain.trace).names


def test_sampled_trees_are_point_mass(target, transfer):
    sampled_drafts_are_point_mass(target, "hidden-transfer", draft=transfer, budget=4, width=2, depth=2)


# -- the sampled law, with power: a tiny two-layer pair (tests/sampling_law.py) -----------------------
def tiny_pair():
    """A tiny 2-layer target and random transfer layers at l = 1 (identity plus noise): often wrong, so
    the recursive rejection's residual paths carry many draws."""
    from test_sampling_power import llama
    model = llama(0, layers=2)
    torch.manual_seed(1)
    ht = HiddenTransfer(model, transfer_config(model.config, 1, 2))
    with torch.no_grad():
        ht.weight.add_(0.5 * torch.randn_like(ht.weight))
    return model, ht.eval()


def draws(model, ht, T: float, n: int, misreport: bool = False):
    from sampling_law import draw_pairs
    from speclab.decoding.drafters.hidden_transfer import HiddenTransferDrafter
    from speclab.models.backends import make_lm

    class Misreported(HiddenTransferDrafter):
        """The top-k children handed on with row 1's q, as if sampled from it."""

        def propose(self, ctx):
            tree = super().propose(ctx)
            if len(tree):
                tree.set_q(-1, self.rows[0])
            return tree
    cls = Misreported if misreport else HiddenTransferDrafter
    return draw_pairs(make_lm(model, "target"), cls(model, ht, budget=4, width=2, depth=2), [1, 2, 3], Sampler(T), n=n)


def test_the_sampled_law_is_the_targets_and_a_misreported_q_is_caught(one_thread):
    from sampling_law import N, N_BROKEN, departs, follows, target_law
    model, ht = tiny_pair()
    law = target_law(model, [1, 2, 3], Sampler(1.0))
    follows(law, draws(model, ht, 1.0, N))
    departs(law, draws(model, ht, 1.0, N_BROKEN, misreport=True))


def test_wrong_pairings_say_what_to_do(target):
    from speclab.models.heads import build_medusa, head_config
    medusa = build_medusa(target[0], head_config(target[0].config, "medusa", 2), torch.arange(300))
    with pytest.raises(ValueError, match="needs transfer layers.*speclab train hidden-transfer"):
        speclab.generate(target, "def f(x):", "hidden-transfer", draft=(medusa, target[1]))
    with pytest.raises(ValueError, match="layer must be in 1..7"):
        transfer_config(target[0].config, 8, 2)


def test_the_trainer_runs_and_its_transfer_loads_and_drafts(target, tmp_path, monkeypatch):
    """`speclab train hidden-transfer --self-text N` on the toy target: the target writes its text, a
    few steps run, and the saved transfer loads through the zoo and decodes identically to ar."""
    from speclab.train import clover, hidden_transfer
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(clover, "CACHE", str(tmp_path / "text"))
    out = tmp_path / "ht"
    assert hidden_transfer.main(["--target", "code-target", "--self-text", "6", "--max-new", "12", "--out", str(out),
                                 "--layer", "5", "--k", "2", "--groups", "2", "--seq-len", "16", "--batch", "2",
                                 "--max-steps", "2", "--minutes", "1", "--threads", "1", "--held-frac", "0.2"]) == 0
    assert (out / "model.safetensors").exists() and (out / "speclab_train.json").exists()
    ht = zoo.load(str(out))[0]
    assert isinstance(ht, HiddenTransfer) and ht.layer == 5 and ht.k == 2
    ref = speclab.generate(target, "def f(x):", "ar", max_new_tokens=12, record=None).ids
    assert speclab.generate(target, "def f(x):", "hidden-transfer", draft=(ht, target[1]), max_new_tokens=12).ids == ref
