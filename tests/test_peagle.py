"""P-EAGLE (speclab.models.peagle, decoding/drafters/peagle.py, train/peagle.py) on the code zoo with
the shipped toy head `code-peagle`: lossless greedy, the law of the mask slot's sampled token with
a negative control, the one drafting forward equal to the training forward, the block's record, a
wrong pairing, and a trainer that runs."""
import pytest
import torch

import speclab
from conftest import greedy_identical_to_ar, one_distribution, tokens_a_forward, trainer_runs
from sampling_law import N, N_BROKEN, TEMPERATURES, departs, draw_pairs, follows, table_law
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.peagle import PEagleDrafter
from speclab.decoding.speculative import decode
from speclab.models import zoo
from speclab.models.backends import make_lm
from speclab.models.peagle import PEagleHead, peagle_config


@pytest.fixture(scope="module")
def peagle(target):
    """The toy zoo's P-EAGLE head for code-target, with the target's tokenizer."""
    return zoo.load("code-peagle")[0], target[1]


@pytest.mark.parametrize("params, n", [(dict(), 2), (dict(k=2), 1)], ids=["defaults", "k=2"])
def test_greedy_identical_to_ar(params, n, target, peagle, heldout_prompts, heldout_ar):
    greedy_identical_to_ar(target, heldout_prompts[:n], "peagle", peagle, params, heldout_ar, record=None)


def test_the_trained_toy_accepts_more_than_one_token_a_round(target, peagle, heldout_prompts):
    assert tokens_a_forward(target, heldout_prompts[0], "peagle", draft=peagle) > 1.3


def test_the_block_is_one_forward_and_recorded(target, peagle, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[1], "peagle", draft=peagle, max_new_tokens=16, record="light")
    K = peagle[0].k
    t = len(r.trace.prompt_ids) - 1
    rnd = r.trace.rounds[1]
    assert [n.source for n in rnd.nodes] == [f"peagle.{d}@h{t}" for d in range(1, K + 1)]
    assert rnd.info["pblock_tokens"] == [n.token for n in rnd.nodes]
    assert rnd.info["pblock_q"] == pytest.approx([n.q for n in rnd.nodes], abs=1e-5)
    assert rnd.info["pblock_mask"] == [False] + [True] * (K - 1)
    assert rnd.info["pblock_forwards"] == 1 and rnd.info["head_forwards"] == 1 and rnd.info["shape"] == "parallel"
    drafting = [x for x in r.trace.rounds if x.nodes]
    assert r.trace.totals.draft_forwards == len(drafting)                  # one head forward a drafting round
    none = speclab.generate(target, heldout_prompts[1], "peagle", draft=peagle, max_new_tokens=16, record=None)
    assert none.ids == r.ids


def test_the_drafting_forward_equals_the_training_forward(target, peagle, heldout_prompts):
    """A round's K slot probabilities are train_forward's slots at the last committed position t
    (every real entry the target's feature and token, the mask slots after it)."""
    base, _ = target
    head = peagle[0]
    r = speclab.generate(target, heldout_prompts[0], "peagle", draft=peagle, max_new_tokens=4, record="light")
    rnd = r.trace.rounds[1]
    ids = list(r.trace.prompt_ids) + [r.trace.rounds[0].emitted]
    t = len(ids) - 2
    got = []                                # the last layer's output, pre-norm
    hook = base.model.layers[-1].register_forward_hook(lambda _m, _i, o: got.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        base(input_ids=torch.tensor([ids]))
        hook.remove()
        f = head.feature([got[0][0]])
        o = head.train_forward(f[None], torch.tensor([ids]))[:, 0]         # (K, n, C)
        q = head.logits(o[:, t]).softmax(-1)                               # (K, N): slots 1..K
    pos = {int(v): i for i, v in enumerate(head.lm_head.head_ids)}
    for d, nd in enumerate(rnd.nodes):
        assert nd.token == int(head.lm_head.head_ids[q[d].argmax()])
        assert nd.q == pytest.approx(float(q[d, pos[nd.token]]), abs=2e-3)


def test_the_mask_state_is_one_entry_shared_by_every_slot(peagle):
    m = peagle[0].mask
    assert m.shape[0] == peagle[0].k - 1 and torch.equal(m, m[:1].expand_as(m))


def test_wrong_pairings_say_what_to_do(target, peagle):
    falcon = zoo.load("code-falcon")[0]
    with pytest.raises(ValueError, match="needs a P-EAGLE head.*speclab train peagle"):
        speclab.generate(target, "def f(x):", "peagle", draft=(falcon, target[1]))
    with pytest.raises(ValueError, match="k <= "):
        speclab.generate(target, "def f(x):", "peagle", draft=peagle, k=peagle[0].k + 1)


# -- sampling: the law of the second and third tokens, the mask slot's among them ---------------
V, PROMPT = 16, [1, 2, 3]


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama target (tied embeddings: the head scores as it does) and a P-EAGLE head
    over it whose layer is the target's and whose fusion passes the token's embedding through: slot
    1's q is close to the target's, so the mask slot is reached on most draws; the mask slot reads
    a fixed token's embedding, so its q is broad and often wrong (rejections and residuals)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3,
                      tie_word_embeddings=True)
    base = LlamaForCausalLM(cfg).eval()
    head = PEagleHead(base, peagle_config(cfg, 1, 2, mask_token_id=5), torch.arange(V))
    C = cfg.hidden_size
    with torch.no_grad():
        head.layers[0].load_state_dict(base.model.layers[-1].state_dict())
        head.fc.weight.zero_()
        head.fc.weight[:, C:] = torch.eye(C)
        head.fc.bias.zero_()
    return base, head.eval()


def second_and_third(model, sampler) -> torch.Tensor:
    """The target's exact law of its 2nd and 3rd new tokens after PROMPT, (V, V), float64."""
    with torch.no_grad():
        p1 = warp(model(torch.tensor([PROMPT])).logits[0, -1], sampler).double()
        joint = torch.zeros(V, V, dtype=torch.float64)
        for a in range(V):
            p2 = warp(model(torch.tensor([PROMPT + [a]])).logits[0, -1], sampler).double()
            rows = warp(model(torch.tensor([PROMPT + [a, b] for b in range(V)])).logits[:, -1], sampler).double()
            joint += p1[a] * p2[:, None] * rows
    return joint


def tokens_2_and_3(lm, drafter, prompt, n, sampler, seed, record):
    """Round 1 has no hidden state (ar); round 2's block drafts tokens 2 and 3 (slot 1, mask slot 2)."""
    new, a, b = decode(lm, drafter, prompt, n + 1, sampler, seed=seed, record=record)
    return new[1:], a, b


class ArgmaxMaskSlot(PEagleDrafter):
    """A broken P-EAGLE: the mask slot drafts its argmax but tells the rule it sampled from its q."""

    def draft_at(self, ctx, t):
        tree = super().draft_at(ctx, t)
        if len(tree) > 1 and 0 in tree.q_children:
            tree.tokens[1] = int(tree.q_children[0].argmax())
        return tree


@pytest.mark.parametrize("T", TEMPERATURES)
def test_sampled_blocks_follow_the_target(T, tiny, one_thread):
    base, head = tiny
    law = table_law(second_and_third(base, Sampler(T)))
    follows(law, draw_pairs(make_lm(base, "target"), PEagleDrafter(base, head, k=2), PROMPT, Sampler(T),
                            decode=tokens_2_and_3))


def test_a_mask_slot_drafting_its_argmax_under_its_q_is_caught(tiny, one_thread):
    base, head = tiny
    law = table_law(second_and_third(base, Sampler(1.0)))
    departs(law, draw_pairs(make_lm(base, "target"), ArgmaxMaskSlot(base, head, k=2), PROMPT, Sampler(1.0),
                            n=N_BROKEN, decode=tokens_2_and_3))


def test_the_trainer_runs_and_its_head_loads_and_drafts(target, tmp_path, monkeypatch):
    """`speclab train peagle --self-text N` on the toy target: the target writes its text, a few steps
    run, the saved head loads through the zoo and decodes identically to ar; and its loss falls on
    one distribution to learn."""
    from speclab.train import peagle as tp
    head = trainer_runs(target, tmp_path, monkeypatch, "peagle", "--k", "5", "--ffn", "64")
    assert isinstance(head, PEagleHead) and head.k == 5 and len(head.layers) == 1
    assert head.config.speculators_config["proposal_methods"][0]["speculative_tokens"] == 5
    base = target[0]
    torch.manual_seed(0)
    head = tp.build(base, torch.arange(400), tp.get_args(["--ffn", "64"]), None, 1)
    f = head.rms(torch.randn(2, 12, base.config.hidden_size))
    tok, lp, m = one_distribution()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(24):
        loss, _, _ = tp.falcon_loss(head, f, f, tok, lp, m)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert max(losses[-4:]) < losses[0]
    assert head.mask_hidden.grad is not None and head.mask_hidden.grad.abs().sum() > 0    # the mask state learns


def test_the_block_figure_draws_each_slot_by_its_verdict(target, peagle, heldout_prompts):
    from speclab.figures.peagle import block_figure
    from speclab.figures.views import view_of
    r = speclab.generate(target, heldout_prompts[0], "peagle", draft=peagle, max_new_tokens=24, record="light")
    assert "parallel block" in [s.name for s in view_of(r.trace).step]
    K = peagle[0].k
    for step, rnd in enumerate(r.trace.rounds):
        if not rnd.nodes:
            continue
        acc, rej, unreached, cond, mean_q = block_figure(r.trace, step).data
        a = len(rnd.accepted)
        assert [x for x in acc.x if x is not None] == list(range(1, a + 1))
        assert [x for x in rej.x if x is not None] == ([a + 1] if a < K else [])
        assert [x for x in unreached.x if x is not None] == list(range(a + 2, K + 1))
        assert list(cond.x) == list(range(1, K + 1)) and list(mean_q.x) == list(range(1, K + 1))
