"""Sampling tests with power (issue 69): per lossless family, the joint law of the first two sampled
tokens at T = 0.7 and 1 against the target's own (tests/sampling_law.py: N draws detect a binned TV
of 0.05 with power >= 0.9 at alpha = 0.001), and a broken variant of the family that the same test
rejects: a bug a real implementation could have, built here without touching the library.

One budget per family: one method per family carries the draws (chain: draft-model; tree:
tree-dynamic; feature heads: eagle-chain; block drafters: dllm-draft; schedules: pearl; RAG
drafter: rapid, on a prompt long enough to retrieve from). The
multi-draft family (spectr, tree-rsd) drives its rule over tables of a tiny pair's logits in
test_spectr.py and test_rules.py, with the same law and draw count; tree-rsd-s (whose sibling count
per node is random) runs its real drafter and rule on the pair here.

The models are a tiny random one-layer Llama target and a perturbed copy as its draft, built from
a config: a forward there is mostly Python overhead, a fraction of one on the toy zoo, and a draft
that is often wrong puts the rejection paths (residuals, recursive rejection) on most draws, where
the bugs below live. The batchable families (chain, tree) draw as lanes of the batch engine
(sampling_law.draw_pairs_in_batch)."""
from __future__ import annotations

import copy

import pytest
import torch

import sampling_law as law_of
from sampling_law import N, N_BROKEN, TEMPERATURES, departs, draw_pairs, draw_pairs_in_batch, follows, target_law
from speclab.decoding.acceptance import Sampler
from speclab.decoding.registry import build_drafter
from speclab.decoding.speculative import Drafter, forwards_of
from speclab.models.backends import make_lm

pytestmark = pytest.mark.usefixtures("one_thread")     # tiny products: one thread (conftest)

V, PROMPT = 16, [1, 2, 3]


def llama(seed: int, layers: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def pair():
    """The target and its draft: the target's weights plus noise (it agrees often, not always)."""
    target = llama(0)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return target, draft


@pytest.fixture(scope="module")
def lm(pair):
    return make_lm(pair[0], "target")


@pytest.fixture(scope="module")
def laws(pair):
    return {T: target_law(pair[0], PROMPT, Sampler(T)) for T in TEMPERATURES}


class Misreported(Drafter):
    """A drafter whose trees are changed by `fix(tree, sampler, inner)` before the verify sees them:
    what the rule is told of the draft (its tokens, their q) is no longer what the draft did."""

    def __init__(self, inner: Drafter, fix):
        super().__init__()
        self.inner, self.fix = inner, fix

    forwards = forwards_of("inner")

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.inner.begin(ctx, target, sampler, gen, record)

    def propose(self, ctx):
        tree = self.inner.propose(ctx)
        self.fix(tree, self.sampler, self.inner)
        return tree

    def observe(self, out):
        self.inner.observe(out)

    def end(self):
        self.inner.end()


# -- chain: draft-model (speculative sampling, residual resampling, the bonus from p) --------------
def chain(pair):
    return build_drafter("draft-model", pair[0], pair[1], dict(k=2))


@pytest.mark.parametrize("T", TEMPERATURES)
def test_chain_follows_the_target(T, pair, laws):
    follows(laws[T], draw_pairs_in_batch(pair[0], lambda: chain(pair), PROMPT, Sampler(T)))


def next_row(tree, sampler, inner):
    """Each draft token's q read from the row after its own (an off-by-one between the draft's
    logits rows and its tokens); the last keeps its own."""
    q = tree.q_map()
    for node in sorted(q)[:-1]:
        tree.set_q(node, q[node + 1])


def test_chain_with_q_from_the_next_row_is_caught(pair, laws):
    departs(laws[0.7], draw_pairs_in_batch(pair[0], lambda: Misreported(chain(pair), next_row), PROMPT,
                                           Sampler(0.7), n=N_BROKEN))


# -- tree: tree-dynamic (point-mass top-k children, recursive rejection without replacement) -------
def tree(pair):
    return build_drafter("tree-dynamic", pair[0], pair[1], dict(budget=4, width=2, depth=2))


@pytest.mark.parametrize("T", TEMPERATURES)
def test_tree_follows_the_target(T, pair, laws):
    follows(laws[T], draw_pairs_in_batch(pair[0], lambda: tree(pair), PROMPT, Sampler(T)))


def top_k_as_sampled(tree, sampler, inner):
    """The root's top-k children handed on with the draft's q, as if sampled from it (EAGLE-1's
    test on EAGLE-2's deterministic children): accepted with min(1, p/q), the residual (p - q)+."""
    tree.set_q(-1, inner.root_q)


def test_tree_verifying_its_top_k_children_as_samples_is_caught(pair, laws):
    departs(laws[1.0], draw_pairs_in_batch(pair[0], lambda: Misreported(tree(pair), top_k_as_sampled), PROMPT,
                                           Sampler(1.0), n=N_BROKEN))


# -- stochastic beam: tree-rsd-s (sequences without replacement, recursive rejection over siblings) --
def rsd_s_first_two(walk, T: float, n: int, width: int = 4, seed: int = 0):
    """Counts (V, V) of the first two tokens of RSD-S rounds over the tiny pair's logit tables
    (test_spectr.model_tables, V = 6): the drafter's own grow_beam keeps `width` of the width x 6
    second-level children, so a first-level node keeps 0 to `width` siblings, as many as their
    scores win; `walk` verifies. Returns the counts and the target's joint."""
    from test_rules import first_two_joint, tally_first_two
    from test_spectr import V as V6, model_tables

    from speclab.decoding.drafters.rsd_s import grow_beam
    p_log, q_log = model_tables()
    q_probs = {key: lg.softmax(-1) for key, lg in q_log.items()}
    s, g = Sampler(T), torch.Generator().manual_seed(seed)
    draw = lambda: torch.rand((), generator=g).item()      # noqa: E731

    def prefix(tree, node):
        return tuple(tree.tokens[i] for i in tree.path_to(node))

    def q_at(tree):                                         # the draft's probabilities, as a draft forward gives them
        return torch.stack([q_probs[prefix(tree, i)] for i in range(-1, len(tree))])
    counts = torch.zeros(V6, V6)
    for _ in range(n):
        tree = grow_beam(width, 2, q_at, s, g, record=False)
        path, emitted, _, _ = walk(tree.children(), tree.tokens, tree.q_map(),
                                   lambda node: p_log[prefix(tree, node)], s, g, draw)
        tally_first_two(counts, [tree.tokens[i] for i in path] + [emitted], p_log, s, g)
    return counts, first_two_joint(p_log, s, V6)


@pytest.mark.parametrize("T", TEMPERATURES)
def test_rsd_s_follows_the_target(T):
    """A stochastic beam of 4 over 2 levels verified by `rsd`: the joint of the first two tokens is
    the target's (N draws, 6 cells, alpha 0.001)."""
    from speclab.decoding.rules import get_rule
    counts, joint = rsd_s_first_two(get_rule("rsd").make({}), T, N)
    follows(law_of.table_law(joint), law_of.pairs_of(counts))


def test_rsd_s_verified_with_the_full_q_for_every_sibling_is_caught():
    """The negative control: the beam's siblings tested against the full q, as if drawn with
    replacement (the exact rule's recursion, what the row would run without its own rule). It departs
    by a binned TV of about 0.08, under the 0.1 that N_BROKEN is sized for, so it draws N."""
    from speclab.decoding.rules.rsd import make
    counts, joint = rsd_s_first_two(make({}, renormalise=False), 0.7, N)
    departs(law_of.table_law(joint), law_of.pairs_of(counts))


# -- feature heads: eagle-chain (an EAGLE head on the target's hidden state samples a chain) -------
@pytest.fixture(scope="module")
def eagle(pair):
    """An EAGLE head over the tiny target whose layer is a copy of the target's and whose fusion passes
    the next token's embedding through (fusion [0 | I]): it runs the target's own layer over the
    committed tokens shifted by one, so its q is near the target's, differs per position, and its
    draft is taken on about a fifth of draws."""
    from speclab.models.heads import build_eagle, head_config
    base = pair[0]
    torch.manual_seed(0)
    head = build_eagle(base, head_config(base.config, "eagle"), torch.arange(V))
    C = base.config.hidden_size
    with torch.no_grad():
        head.model.layers[0].load_state_dict(base.model.layers[-1].state_dict())
        head.eagle_fc.weight.zero_()
        head.eagle_fc.weight[:, C:] = torch.eye(C)
        head.eagle_fc.bias.zero_()
    return head.eval()


def heads(pair, eagle):
    return build_drafter("eagle-chain", pair[0], eagle, dict(k=2))


@pytest.mark.parametrize("T", TEMPERATURES)
def test_feature_head_follows_the_target(T, pair, lm, laws, eagle):
    """Round 1 has no hidden state to draft from, so the head's chain drafts the second token."""
    follows(laws[T], draw_pairs(lm, heads(pair, eagle), PROMPT, Sampler(T)))


def test_feature_head_with_q_from_the_next_row_is_caught(pair, lm, laws, eagle):
    """The chain's off-by-one on the head's rows: the head's q at the second draft step reported for
    the first."""
    departs(laws[1.0], draw_pairs(lm, Misreported(heads(pair, eagle), next_row), PROMPT, Sampler(1.0), n=N_BROKEN))


# -- block drafters: dllm-draft (a block-diffusion LM fills k mask slots in one forward) ----------
@pytest.fixture(scope="module")
def dllm(pair):
    """The draft read as a block-causal diffusion LM, and the top-k its runs sample with: its mask is
    the target's least likely first token outside the prompt, and top-k cuts that token and every
    one below it (a committed mask is no canvas the drafter can read)."""
    from speclab.models.dllm import mark_dllm
    draft = copy.deepcopy(pair[1])
    with torch.no_grad():
        order = pair[0](torch.tensor([PROMPT])).logits[0, -1].argsort().tolist()     # least likely first
    mask = next(t for t in order if t not in PROMPT)
    mark_dllm(draft.config, mask, shift=True)
    draft.config.speclab_block_causal = True
    return draft, V - 1 - order.index(mask)


@pytest.fixture(scope="module")
def block_laws(pair, dllm):
    return {T: target_law(pair[0], PROMPT, Sampler(T, top_k=dllm[1])) for T in TEMPERATURES}


def block(dllm):
    from speclab.decoding.drafters.dllm import DllmDrafter
    return DllmDrafter(dllm[0], k=2, steps=1)


@pytest.mark.parametrize("T", TEMPERATURES)
def test_block_drafter_follows_the_target(T, lm, block_laws, dllm):
    follows(block_laws[T], draw_pairs(lm, block(dllm), PROMPT, Sampler(T, top_k=dllm[1])))


def argmax_fill(tree, sampler, inner):
    """Every slot filled with its row's argmax, as a diffusion decoder commits, while the rule is
    still told the slot was sampled from q."""
    q = tree.q_map()
    for i, parent in enumerate(tree.parents):
        if parent in q:
            tree.tokens[i] = int(q[parent].argmax())
            tree.q_tok[i] = float(q[parent].max())


def test_block_drafter_filling_argmax_tokens_under_q_is_caught(lm, block_laws, dllm):
    departs(block_laws[1.0], draw_pairs(lm, Misreported(block(dllm), argmax_fill), PROMPT,
                                        Sampler(1.0, top_k=dllm[1]), n=N_BROKEN))


# -- RAG drafter: rapid (draft-model's chain, the draft reading a retrieved slice of the prompt) ----
# 16 tokens of head in chunks of 4, a query of 4: the draft reads 2 chunks and the query (12 of 20)
LONG = list(range(1, 16)) + [4, 9, 9, 4, 2]


def rag(pair):
    return build_drafter("rapid", pair[0], pair[1], dict(k=2, chunk=4, retrieve=8, query=4))


@pytest.fixture(scope="module")
def long_laws(pair):
    return {T: target_law(pair[0], LONG, Sampler(T)) for T in (0.7, 1.0)}


def test_rag_drafter_follows_the_target(pair, long_laws):
    """At T = 1 only: the chain's rule and residuals are draft-model's, drawn at both temperatures
    above; what is new here is the draft's context, which no temperature touches."""
    follows(long_laws[1.0], draw_pairs_in_batch(pair[0], lambda: rag(pair), LONG, Sampler(1.0)))


def test_rag_drafts_verified_against_the_enriched_target_are_caught(pair, lm, long_laws):
    """The same drafts verified by RAPID's own rule (the target moved toward the draft, eta 4): what
    keeps the RAG drafter lossless is the exact rule, and the test sees the difference."""
    from functools import partial

    from speclab.decoding.speculative import decode
    enriched = partial(decode, rule="rapid", rule_params=dict(eta=4.0))
    departs(long_laws[0.7], draw_pairs(lm, rag(pair), LONG, Sampler(0.7), n=N_BROKEN, decode=enriched))


# -- schedules: pearl (pre-verify of the first draft token, post-verify while it drafts on) -------
def pearl(pair):
    from speclab.decoding.drafters.pearl import PearlDrafter
    return PearlDrafter(pair[1], gamma=2, overlap=False)


@pytest.mark.parametrize("T", TEMPERATURES)
def test_schedule_follows_the_target(T, pair, lm, laws):
    follows(laws[T], draw_pairs(lm, pearl(pair), PROMPT, Sampler(T)))


def test_schedule_with_an_unclipped_residual_is_caught(pair, lm, laws, monkeypatch):
    """PEARL's own chain test resamples from |p - q| normalised: the residual not clipped at zero
    (abs for clamp), so tokens the draft over-proposed come back."""
    from speclab.decoding.drafters import pearl as module
    monkeypatch.setattr(module, "residual", lambda p, q: (p - q).abs() / (p - q).abs().sum())
    departs(laws[0.7], draw_pairs(lm, pearl(pair), PROMPT, Sampler(0.7), n=N_BROKEN))


# -- adaptive length: speckv (a model over the draft's confidence and entropy picks each round's k) --
@pytest.fixture(scope="module")
def length_model(pair, tmp_path_factory):
    """A SpecKV length model over k = 1..4 that drafts 4 where the draft's confidence is above its
    median over the contexts of a second round (the prompt and one token) and 1 below it."""
    from speclab.decoding.drafters.speckv import LengthModel, save_model
    with torch.no_grad():
        conf = torch.stack([pair[1](input_ids=torch.tensor([PROMPT + [x]])).logits[0, -1].softmax(-1).max()
                            for x in range(V)])
        m = LengthModel(4)
        for p in m.parameters():
            p.zero_()
        m.net[0].weight[0, 0] = 1.0
        m.net[2].weight[:, 0] = 8.0
        m.mean.copy_(torch.tensor([conf.median().item(), 0.0]))
        m.std.copy_(torch.tensor([1e-3, 1.0]))
    return save_model(m, tmp_path_factory.mktemp("speckv") / "m", {"cost": 0.3, "draft": "random"})


def test_adaptive_length_follows_the_target(pair, lm, laws, length_model):
    """At T = 1 only: the chain's rule and residuals are draft-model's, drawn at both temperatures
    above; what is new is a length read from the draft's own first distribution of each round (after
    a rejection it differs), which must not move the law; the lengths do vary over the rounds."""
    from speclab.decoding.speculative import decode
    drafter = build_drafter("speckv", pair[0], pair[1], dict(model=str(length_model)))
    follows(laws[1.0], draw_pairs(lm, drafter, PROMPT, Sampler(1.0)))
    lengths = {rd.drafted for s in range(40) for rd in decode(lm, drafter, PROMPT, 2, Sampler(1.0), seed=s, record=None)[1]}
    assert len(lengths) >= 2


def test_the_draw_count_is_the_power_calculations():
    """N is what scipy's noncentral chi-square gives (module docstring of sampling_law), and a law at
    TV 0.05 of the worst shape is in fact rejected at least 90% of the time: 400 simulated tests."""
    import numpy as np
    from scipy.stats import chi2
    assert N == law_of.draws_for() == 2921 and N_BROKEN == law_of.draws_for(tv=0.1) == 731
    rng = np.random.default_rng(0)
    p = np.array([0.3, 0.2, 0.15, 0.15, 0.1, 0.1])
    half = np.array([1, 1, 0, 0, 0, 0], bool)                  # target mass 0.5 gains, 0.5 loses
    alt = p + np.where(half, 0.05 * p / p[half].sum(), -0.05 * p / p[~half].sum())
    counts = rng.multinomial(N, alt, size=400)
    stat = ((counts - N * p) ** 2 / (N * p)).sum(1)
    assert (stat > chi2.isf(law_of.ALPHA, len(p) - 1)).mean() >= 0.88
