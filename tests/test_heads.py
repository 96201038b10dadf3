"""EAGLE and Medusa heads (speclab.models.heads, decoding/drafters/heads.py, train/heads.py) on the
code zoo with untrained heads: lossless greedy and sampling, the training forward equal to the
drafting forward, the training-time-test mask, a training step that lowers the loss, the adapter
round trip and the errors of a wrong pairing. The trained smollm2 heads: tests/test_real_model.py."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import sampled_drafts_are_point_mass, toy_heads

import speclab
from speclab.models.heads import build_eagle, build_medusa, eagle_fuse, head_config
from speclab.train import heads as th

NEW = 48


@pytest.fixture(scope="module")
def heads(target):
    """conftest's toy EAGLE and Medusa heads, each with the target's tokenizer."""
    return {k: (m, target[1]) for k, m in toy_heads(target).items()}


CASES = {"eagle-full-tree": ("eagle", dict(budget=10, width=3, depth=4, threshold=None)),
         "eagle-defaults": ("eagle", dict()),
         "eagle-lookup": ("eagle", dict(lookup=4)),
         "eagle-override": ("eagle", dict(override=3, lookup=4)),   # a long match drafts its copy alone
         # a tree sized to given verify costs (rows nearly free: the untrained head's trees are kept)
         "eagle-fitted": ("eagle", dict(budget="auto", costs=[1.0, 1.0, 1.0, 1.01, 1.01, 1.02, 1.02, 1.03, 1.03, 1.04])),
         "eagle-chain-k4": ("eagle-chain", dict(k=4)),
         "eagle-chain-heuristic": ("eagle-chain", dict(schedule="heuristic")),
         "medusa-defaults": ("medusa", dict())}
HEAD_OF = {"eagle": "eagle", "eagle-chain": "eagle", "medusa": "medusa"}     # method -> the head it drafts with


@pytest.mark.parametrize("case", CASES)
def test_greedy_identical_to_ar(case, target, heads, heldout_prompts):
    method, params = CASES[case]
    drafted = accepted = 0
    for prompt in heldout_prompts[:6]:
        ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
        r = speclab.generate(target, prompt, method, draft=heads[HEAD_OF[method]], max_new_tokens=NEW, **params)
        assert r.ids == ref, f"{method} diverged from ar on {prompt[:40]!r}"
        t = r.trace.totals
        assert t.new_tokens == len(ref) and t.accepted == sum(len(x.accepted) for x in r.trace.rounds)
        assert not r.trace.rounds[0].drafted       # round 1: the prompt has no hidden state yet
        drafted, accepted = drafted + t.drafted, accepted + t.accepted
    assert drafted > 0 and accepted > 0            # the heads draft, and some of it is right


def test_provenance_and_coverage(target, heads, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[0], "eagle", draft=heads["eagle"], max_new_tokens=24, record="full",
                         threshold=None)                    # an untrained head is sure of nothing: grow every depth
    n_prompt = len(r.trace.prompt_ids)
    rnd = r.trace.rounds[1]                        # drafted from the hidden state of the prompt's last token
    assert {n.source for n in rnd.nodes if n.depth == 1} == {f"h{n_prompt - 1}"}
    assert any(n.source == f"h{n_prompt - 1}+1" for n in rnd.nodes if n.depth == 2)
    m = speclab.generate(target, heldout_prompts[0], "medusa", draft=heads["medusa"], max_new_tokens=24, record="full")
    assert {n.source for n in m.trace.rounds[1].nodes} <= {f"medusa{d}@h{n_prompt - 1}" for d in (1, 2, 3)}
    from speclab.figures.tree import source_text          # the tree view says it in words
    assert source_text(f"h{n_prompt - 1}+1").startswith(f"EAGLE head on the target's hidden state at position {n_prompt - 1}")
    assert source_text("medusa2@h7") == "Medusa head 2 on the target's hidden state at position 7"
    assert source_text("3-gram@12") == "copied: what followed the last 3 tokens where they occurred at position 12"
    # a token outside the trimmed vocabulary can never be drafted: each one is recorded
    V = target[0].config.vocab_size
    for res in (r, m):
        for rnd in res.trace.rounds:
            miss = rnd.info.get("coverage_miss")
            assert (miss is not None) == (rnd.emitted >= V - 50)
            assert all(n.token < V - 50 for n in rnd.nodes)


@pytest.mark.parametrize("method", ["eagle", "eagle-chain"])
def test_a_smaller_draft_vocabulary_drafts_only_its_ids(method, target, heads, heldout_prompts):
    """vocab=N scores the head's first N ids (its most frequent): only those are drafted, every
    other emitted token is a coverage miss, and greedy stays identical to ar."""
    head = heads["eagle"][0]
    keep = set(head.lm_head.head_ids[:256].tolist())
    misses = 0
    for prompt in heldout_prompts[:3]:
        ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
        r = speclab.generate(target, prompt, method, draft=heads["eagle"], max_new_tokens=NEW, vocab=256, record="full")
        assert r.ids == ref
        for rnd in r.trace.rounds:
            assert all(n.token in keep for n in rnd.nodes)
            assert ("coverage_miss" in rnd.info) == (rnd.emitted not in keep)
            misses += "coverage_miss" in rnd.info
    assert misses > 0                              # 256 of the code zoo's ids leave some out
    with pytest.raises(ValueError, match="vocab must be an integer in 64"):
        speclab.generate(target, heldout_prompts[0], method, draft=heads["eagle"], max_new_tokens=4, vocab=10 ** 6)


@pytest.mark.parametrize("method,params", [("eagle", dict(budget=6, width=2, depth=3)), ("medusa", dict())])
def test_sampled_trees_are_point_mass(method, params, target, heads):
    """Sampled, the trees of the heads' top choices tell the rule no q: their law is the point-mass
    tree walk's, tested with power in test_sampling_power.py (eagle-chain's sampled chain is that
    file's feature-head family)."""
    sampled_drafts_are_point_mass(target, method, draft=heads[HEAD_OF[method]], **params)


def test_training_forward_equals_drafting_forward(target, heads):
    """train/heads.eagle_forward (the HF layer with the TTT mask) gives, at step 1 and step 2, the
    outputs the drafter computes with the lean forward and its own cache."""
    from speclab.models.backends import make_lm
    base, _ = target
    head = heads["eagle"][0]
    T = 12
    tok = torch.randint(0, 500, (1, T))
    with torch.no_grad():
        hs = base(input_ids=tok, output_hidden_states=True).hidden_states[-1]  # post-norm f (1, T, C)
        o = th.eagle_forward(head, hs, tok, U=2)                               # (2, 1, T-1, C)
        lm = make_lm(head, "eagle", "fast")
        lm.capture_layers = (1,)
        lm.forward(None, embeds=eagle_fuse(head, hs[0, :T - 1], tok[0, 1:]))
        step1 = lm.captured[1][0]
        assert torch.allclose(step1, o[0, 0], atol=1e-4)
        # step 2 at entry t: the head's own prediction for position t, after the committed t-1 entries
        t = 7
        lm.keep(t)
        x = eagle_fuse(head, head.model.norm(step1[t - 1:t]), tok[0, t + 1:t + 2])
        lm.forward(None, embeds=x)
        assert torch.allclose(lm.captured[1][0, -1], o[1, 0, t], atol=1e-4)


@pytest.fixture(scope="module")
def eagle3(target, heads):
    """The EAGLE head above given EAGLE-3's layer fusion over the target's layers 1 and L, fc3 at
    its initialisation (the last layer alone) and then with random weights on layer 1."""
    base, tok = target
    L = base.config.num_hidden_layers
    head = build_eagle(base, head_config(base.config, "eagle", layers=[1, L]), heads["eagle"][0].lm_head.head_ids)
    head.load_state_dict(heads["eagle"][0].state_dict(), strict=False)
    return head.eval(), tok


def test_eagle3_head_starts_as_the_top_only_head_and_stays_lossless(target, heads, eagle3, heldout_prompts):
    """fc3 starts as the last layer alone, so the fused head drafts exactly what the top-only head
    with the same weights drafts; with weight on layer 1 it drafts otherwise, and stays lossless."""
    import copy
    prompt = heldout_prompts[1]
    runs = [speclab.generate(target, prompt, "eagle", draft=h, max_new_tokens=NEW, record="light")
            for h in (heads["eagle"], eagle3)]
    assert runs[0].ids == runs[1].ids
    assert [[n.token for n in r.nodes] for r in runs[0].trace.rounds] == \
        [[n.token for n in r.nodes] for r in runs[1].trace.rounds]
    mixed = copy.deepcopy(eagle3[0])
    C = target[0].config.hidden_size
    with torch.no_grad():
        torch.manual_seed(1)
        mixed.eagle_fc3.weight[:, :C] = torch.randn(C, C) * 0.5
    ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
    other = None
    for method in ("eagle", "eagle-chain"):
        r = speclab.generate(target, prompt, method, draft=(mixed, eagle3[1]), max_new_tokens=NEW, record="light")
        assert r.ids == ref and r.trace.totals.drafted > 0
        if method == "eagle":
            other = [[n.token for n in rnd.nodes] for rnd in r.trace.rounds]
    assert other != [[n.token for n in r.nodes] for r in runs[0].trace.rounds]


def test_eagle3_training_input_equals_drafting_input(target, eagle3):
    """train/heads.eagle_step1 over the states after layers 1 and L is what the drafter's prepare
    + norm give the head at run time."""
    from speclab.decoding.drafters.heads import EagleChainDrafter
    base, _ = target
    head = eagle3[0]
    tok = torch.randint(0, 500, (1, 10))
    L = base.config.num_hidden_layers
    got = {}
    hooks = [base.model.layers[l - 1].register_forward_hook(
        lambda _m, _i, o, l=l: got.__setitem__(l, o[0] if isinstance(o, tuple) else o)) for l in (1, L)]
    with torch.no_grad():
        base(input_ids=tok)
        for h in hooks:
            h.remove()
        pre = [got[1], got[L]]                                        # pre-norm states (1, T, C)
        train_in = th.eagle_step1(head, pre)[0]
        d = EagleChainDrafter(base, head)
        run_in = head.model.norm(d.prepare([p[0] for p in pre]))
    assert d.layers == (1, L)
    assert torch.allclose(train_in, run_in, atol=1e-5)


def test_eagle3_layers_checked(target, eagle3):
    base, tok = target
    L = base.config.num_hidden_layers
    bad = build_eagle(base, head_config(base.config, "eagle", layers=[1, L + 3]), torch.arange(10))
    with pytest.raises(ValueError, match="target layers"):
        speclab.generate(target, "def f(x):", "eagle", draft=(bad, tok))
    for spec in ("a,b", "0,4", "1,2"):
        with pytest.raises(SystemExit, match="--layers"):
            th.parse_layers(spec, 4)
    assert th.parse_layers("4,1", 4) == [1, 4] and th.parse_layers(None, 4) is None


def test_training_reaches_the_fusion_from_step_one(target, eagle3):
    """The loss of step 1 alone (the target's own features) trains the fusion and EAGLE-3's layer
    fusion: the committed entries a run-time head attends to are step-1 entries."""
    import copy
    base, _ = target
    head = copy.deepcopy(eagle3[0]).float().train()
    tok = torch.randint(0, 500, (1, 10))
    xs = [torch.randn(1, 10, base.config.hidden_size) for _ in range(2)]
    o = th.eagle_forward(head, th.eagle_step1(head, xs), tok, U=2)
    o[0].sum().backward()
    C = base.config.hidden_size
    assert head.eagle_fc.weight.grad.abs().sum() > 0
    assert head.eagle_fc3.weight.grad[:, :C].abs().sum() > 0       # layer 1's block, zero at the start


def test_ttt_mask_rows():
    vis = th.ttt_mask(5, 3)
    T = 5
    see = lambda s, t: {((k // T) + 1, k % T) for k in vis[(s - 1) * T + t].nonzero()[:, 0].tolist()}
    assert see(1, 3) == {(1, 0), (1, 1), (1, 2), (1, 3)}
    assert see(2, 3) == {(1, 0), (1, 1), (1, 2), (2, 3)}
    assert see(3, 4) == {(1, 0), (1, 1), (1, 2), (2, 3), (3, 4)}


def test_hard_term_is_the_greedy_tokens_ce(target):
    """With a one-hot target distribution the soft CE is the CE to the greedy token, so the hard
    term (weight 1) doubles the loss: it scores the same token at the same entry, on the same mask."""
    base, _ = target
    torch.manual_seed(0)
    ids = torch.arange(400)
    head = build_eagle(base, head_config(base.config, "eagle"), ids).float()
    tok = torch.randint(0, 400, (2, 12))
    with torch.no_grad():
        x = base.model(input_ids=tok).last_hidden_state
        f = base.model.norm(x)
        greedy = torch.randint(0, 400, (2, 12))
        lp = torch.full((2, 12, 400), -1e4).scatter(-1, greedy[..., None], 0.0)  # one-hot p
        m = torch.ones(2, 12, dtype=torch.bool)
        m[1, 9:] = False
        soft = th.eagle_loss(head, tok, [x], f, lp, m, 2, 0.0)[0]
        both = th.eagle_loss(head, tok, [x], f, lp, m, 2, 0.0, hard_weight=1.0)[0]
    assert float(soft) > 1.0
    assert torch.allclose(both, 2 * soft, rtol=1e-4)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_few_steps_lower_the_loss(kind, target):
    base, _ = target
    torch.manual_seed(0)
    ids = torch.arange(400)
    head = (build_eagle(base, head_config(base.config, "eagle"), ids) if kind == "eagle"
            else build_medusa(base, head_config(base.config, "medusa", 2), ids)).float().train()
    for p in head.lm_head.parameters():
        p.requires_grad_(False)
    tok = torch.randint(0, 400, (2, 16))
    with torch.no_grad():
        x = base.model(input_ids=tok).last_hidden_state                     # post-norm stands in for x
        f = base.model.norm(x)
        lp = (f @ head.lm_head.weight.t()).log_softmax(-1)
    m = torch.ones(2, 16, dtype=torch.bool)
    loss_fn = (lambda: th.eagle_loss(head, tok, [x], f, lp, m, 2, 0.5)[0]) if kind == "eagle" else \
        (lambda: th.medusa_loss(head, [x], lp, m)[0])
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3)
    first = float(loss_fn())
    for _ in range(15):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    assert float(loss_fn()) < first * 0.9


def test_adapter_round_trip_and_wrong_pairings(target, draft, heads, tmp_path):
    from speclab.models.adapter import save_draft
    from speclab.models.heads import load_draft
    base, tok = target
    for kind in ("eagle", "medusa"):
        head = heads[kind][0]
        save_draft(head, tmp_path / kind, "code-target", kind=kind)
        back = load_draft(tmp_path / kind, base, torch.float32)
        assert type(back) is type(head)
        x = torch.randn(3, base.config.hidden_size)
        if kind == "medusa":
            assert torch.allclose(back(x), head(x).to(torch.bfloat16).float(), atol=0.1, equal_nan=True)
        else:
            assert torch.allclose(back.eagle_fc.weight, head.eagle_fc.weight.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        speclab.generate(target, "def f(x):", "eagle", draft=draft)
    with pytest.raises(ValueError, match="needs Medusa heads"):
        speclab.generate(target, "def f(x):", "medusa", draft=heads["eagle"])
    small = head_config(base.config, "eagle")
    small.hidden_size, small.intermediate_size = 32, 64
    other = build_eagle(base, head_config(base.config, "eagle"), torch.arange(10))
    other.config = small
    with pytest.raises(ValueError, match="hidden_size"):
        speclab.generate(target, "def f(x):", "eagle", draft=(other, tok))
    with pytest.raises(ValueError, match="at most 3 ranks"):
        speclab.generate(target, "def f(x):", "medusa", draft=heads["medusa"], paths=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


def test_graft_shares_the_nodes_the_tree_has():
    from speclab.decoding.drafters.heads import graft
    from speclab.decoding.tree import DraftTree
    tree = DraftTree()
    a = tree.add(5, -1, 0.6, "h3")
    b = tree.add(6, a, 0.5, "h3+1")
    tree.add(7, -1, 0.2, "h3")
    graft(tree, DraftTree.chain([5, 6, 9, 1], source="2-gram@0"))     # shares 5 -> 6, adds 9 -> 1 below
    assert tree.info["grafted"] == 2 and tree.tokens[3:] == [9, 1] and tree.parents[3:] == [b, 3]
    assert tree.source[3] == "2-gram@0" and tree.q_tok[3] is None
    graft(tree, DraftTree.chain([8], source="3-gram@1"))              # nothing shared: a new child of the root
    assert tree.info["grafted"] == 1 and tree.parents[-1] == -1
    graft(tree, DraftTree.chain([5, 6]))                               # already there: nothing added
    assert tree.info["grafted"] == 0 and len(tree) == 6


def test_eagle_with_lookup_grafts_copies_greedy_and_sampled(target, heads, heldout_prompts):
    grafted = counted = 0
    for prompt in heldout_prompts[:6]:
        r = speclab.generate(target, prompt, "eagle", draft=heads["eagle"], max_new_tokens=NEW, record="full", lookup=4)
        grafted += sum("-gram@" in n.source for rnd in r.trace.rounds for n in rnd.nodes)
        counted += sum(rnd.info.get("grafted", 0) for rnd in r.trace.rounds)
    assert grafted == counted > 0                 # code repeats itself: copies reach the tree, each one recorded
    # sampled: the head's nodes and the copies are point masses to the rule (the law: tests/test_graft.py)
    sampled_drafts_are_point_mass(target, "eagle", heldout_prompts[0], draft=heads["eagle"], lookup=4)
    sampled_drafts_are_point_mass(target, "eagle", heldout_prompts[0], draft=heads["eagle"], lookup=4, override=3)


def test_per_position_of_a_tree_without_node_records(target, heads, heldout_prompts):
    """record=None keeps no nodes; a tree round notes its depth so per-position acceptance stays exact."""
    from speclab import metrics
    runs = [speclab.generate(target, heldout_prompts[2], "eagle", draft=heads["eagle"], max_new_tokens=32, record=rec)
            for rec in (None, "light")]
    assert runs[0].ids == runs[1].ids
    assert metrics.per_position(runs[0].trace.rounds) == metrics.per_position(runs[1].trace.rounds)


def test_calibrated_tree_keeps_the_likeliest_paths():
    """Medusa-1's calibrated tree: the `budget` paths of highest product of rank accuracies,
    found best-first, equal to a brute force over every path; always a tree."""
    import itertools
    import math
    from speclab.decoding.drafters.trees import calibrated_paths, check_paths
    rng = torch.Generator().manual_seed(1)
    acc = [sorted(torch.rand(4, generator=rng).tolist(), reverse=True) for _ in range(3)]
    every = [p for d in (1, 2, 3) for p in itertools.product(range(4), repeat=d)]
    chance = lambda p: math.prod(acc[d][r] for d, r in enumerate(p))
    for budget in (1, 4, 9, 20):
        got = calibrated_paths(acc, budget)
        assert sorted(got) == sorted(sorted(every, key=lambda p: -chance(p))[:budget])
        assert check_paths(got) == got                       # parents present, depth-then-rank order
    assert calibrated_paths([[0.4, 0.5], [0.1]], 2) == [(0,), (1,)]   # measured noise made monotone
    with pytest.raises(ValueError, match="budget"):
        calibrated_paths(acc, 0)


def test_medusa_builds_its_calibrated_tree(target, heads, heldout_prompts):
    from speclab.decoding.drafters.heads import MedusaDrafter
    from speclab.decoding.drafters.trees import calibrated_paths
    head = heads["medusa"][0]
    assert len(MedusaDrafter(target[0], head, budget=5).paths) == 5     # uncalibrated: the default, cut
    acc = [[0.5, 0.2, 0.1], [0.3, 0.1, 0.05], [0.2, 0.1, 0.05]]
    head.config.medusa_rank_acc = acc
    try:
        d = MedusaDrafter(target[0], head, budget=6)
        assert d.paths == calibrated_paths(acc, 6) == [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]
        with pytest.raises(ValueError, match="not both"):
            MedusaDrafter(target[0], head, paths=[[0]], budget=3)
        ref = speclab.generate(target, heldout_prompts[1], "ar", max_new_tokens=NEW, record=None).ids
        r = speclab.generate(target, heldout_prompts[1], "medusa", draft=heads["medusa"], max_new_tokens=NEW, budget=4)
        assert r.ids == ref and max(x.drafted for x in r.trace.rounds) <= 4
    finally:
        del head.config.medusa_rank_acc


def test_rank_hits_count_where_the_target_went(target):
    """Heads with zero residuals predict the target's own next token at t; on a constant input that
    is also its token at t+k, so every head's rank-0 guess is right everywhere and no other rank is."""
    base, _ = target
    head = build_medusa(base, head_config(base.config, "medusa", 2), torch.arange(300)).float()
    x = torch.randn(1, 1, base.config.hidden_size).expand(2, 12, -1).contiguous()
    with torch.no_grad():
        lp = (base.model.norm(x) @ head.lm_head.weight.t()).log_softmax(-1)
        hits, n = th.medusa_rank_hits(head, [x], lp, torch.ones(2, 12, dtype=torch.bool), 3)
    assert n.tolist() == [22, 20]
    assert hits[:, 0].tolist() == [22, 20] and hits[:, 1:].sum() == 0


def test_a_tree_over_kept_ids_is_the_tree_over_the_full_vocabulary():
    """EAGLE's tree ranks only its head's N ids; spread to V with zeros elsewhere it is the same tree."""
    from speclab.decoding.drafters.trees import grow_dynamic
    gen = torch.Generator().manual_seed(3)
    V, ids = 500, torch.randperm(500, generator=gen)[:60]
    table = torch.rand(40, 60, generator=gen).softmax(-1)               # row i: after node i - 1
    sub = lambda tree: table[: 1 + len(tree)]
    full = lambda tree: torch.zeros(1 + len(tree), V).index_copy_(1, ids, sub(tree))
    a = grow_dynamic(8, 3, 4, sub, ids=ids)
    b = grow_dynamic(8, 3, 4, full)
    assert (a.tokens, a.parents, a.q_tok) == (b.tokens, b.parents, b.q_tok) and set(a.tokens) <= set(ids.tolist())


def test_medusa_blocks_with_one_fused_first_layer_equal_the_heads(heads):
    """The drafter's packed path runs the K first layers as one (K C, C) matrix (they all read the
    same norm(x)) and each second layer on its own: the same K blocks, in the same order."""
    m = heads["medusa"][0]
    torch.manual_seed(1)
    x = torch.randn(3, m.config.hidden_size)
    W1, b1 = torch.cat([w.weight for w in m.w1]), torch.cat([w.bias for w in m.w1])
    w2 = [lambda h, w=w: F.linear(h, w.weight) for w in m.w2]
    with torch.no_grad():
        fused, ref = m.hidden(x, w1=lambda n: F.linear(n, W1, b1), w2=w2), m.hidden(x)
    assert fused.shape == (m.n_heads, 3, m.config.hidden_size)
    torch.testing.assert_close(fused, ref)


def test_features_are_cached_per_data_set(target, tmp_path):
    """A merged run's features equal one pass over the merged rows, each set's cached in its own
    directory: adding a set computes only the new set's (its older caches stay untouched)."""
    from speclab.train.head_data import feature_cache, load_data, set_features, target_features
    from speclab.train.smollm2_data import Row, save_rows
    base, _ = target
    L, V = base.config.num_hidden_layers, base.config.vocab_size
    g = torch.Generator().manual_seed(0)
    dirs = []
    for s, lens in enumerate([(9, 17, 5), (12, 3), (20, 8, 8, 4)]):
        rows = [Row(torch.randint(0, V, (n,), generator=g).tolist(), [0] * n, torch.zeros(n, 8, dtype=torch.float16),
                    torch.zeros(n, 8, dtype=torch.int32), [0] * n, "chat") for n in lens]
        save_rows(rows, tmp_path / f"set{s}" / "rows.safetensors", {})
        dirs.append(str(tmp_path / f"set{s}"))
    layers = [1, L]
    two = set_features(base, dirs[:2], layers)
    cache0 = feature_cache(Path(dirs[0]), L, L)
    stamp = cache0.stat().st_mtime_ns
    three = set_features(base, dirs, layers)
    assert cache0.stat().st_mtime_ns == stamp and feature_cache(Path(dirs[2]), 1, L).exists()
    once = target_features(base, load_data(dirs), {l: tmp_path / f"all-{l}.safetensors" for l in layers})
    for l in layers:
        n2 = two[l].shape[0]
        assert three[l].shape == once[l].shape == (31 + 15 + 40, base.config.hidden_size)
        assert torch.equal(three[l][:n2], two[l])
        assert torch.allclose(three[l].float(), once[l].float(), atol=2e-2, rtol=2e-2)


def test_dev_rows_are_the_targets_greedy_answers(target, heads, tmp_path):
    """speclab.train.dev_eval: the answers are `ar`'s, the states read back give the target's
    greedy token at every answer position (so the head is scored against what the target wrote),
    and a head scores top-1 <= top-3 per position."""
    import json
    from speclab.train.dev_eval import agreement, answers, mean_agreement
    base, tok = target
    eagle, _ = heads["eagle"]
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def add(a, b):", "class Stack:"]))
    L = base.config.num_hidden_layers
    rows = answers(base, tok, str(path), [L], limit=2, tokens=12)
    for r, p in zip(rows, ["def add(a, b):", "class Stack:"]):
        ref = speclab.generate((base, tok), p, "ar", max_new_tokens=12, record=None).ids
        assert r.tokens[r.first:].tolist() == list(ref) and r.xs[0].shape == (len(r.tokens), base.config.hidden_size)
        logits = base.lm_head(base.model.norm(r.xs[0].float()))
        assert logits[r.first - 1:-1].argmax(-1).tolist() == list(ref)
        probs = logits[r.first - 1:-1].float().softmax(-1).max(-1).values
        assert torch.allclose(r.sure, probs, atol=1e-2)                 # how sure the target was
        a = agreement(eagle, r)
        assert a.shape == (len(r.tokens) - r.first - 1, 2) and (a[:, 0] <= a[:, 1]).all()
    assert mean_agreement(eagle, rows).shape == (2,) and not eagle.training


def test_a_head_started_from_another_is_saved_only_when_it_beats_it(target, heads, tmp_path, monkeypatch, capsys):
    """`speclab train eagle --init-from DIR` with a dev set: the head started from is the score to
    beat. A run that improves it writes --out; a run that does not (here: no step at all) writes
    nothing, so a worse head never replaces a better one."""
    import json
    import re
    from speclab.models.adapter import save_draft
    from speclab.train.smollm2_data import Row, save_rows
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))     # the trainer's checkpoints go there
    base, tok = target
    eagle, _ = heads["eagle"]
    save_draft(eagle, tmp_path / "init", "code-target", kind="eagle")    # its fusion is untrained: dev top-1 ~0
    text = [tok(p, add_special_tokens=False)["input_ids"] for p in ["def add(a, b):\n    return a + b\n"] * 12]
    rows = [Row(t, [0] * len(t), torch.zeros(len(t), 8, dtype=torch.float16), torch.zeros(len(t), 8, dtype=torch.int32),
                [0] * len(t), "chat") for t in text]
    save_rows(rows, tmp_path / "set" / "rows.safetensors", {})
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def add(a, b):", "class Stack:"]))

    def train(init, out, minutes):
        argv = ["eagle", "--target", "code-target", "--data-dirs", str(tmp_path / "set"), "--out", str(out),
                "--init-from", str(init), "--dev-prompts", str(dev), "--minutes", str(minutes), "--lr", "3e-3",
                "--warmup", "1", "--seq-len", "32", "--batch", "2", "--threads", "1", "--held-frac", "0.2"]
        assert th.main(argv) == 0
        return capsys.readouterr().out
    log = train(tmp_path / "init", tmp_path / "better", 0.1)
    start = float(re.search(r"at step 0: top-1 ([0-9.]+)", log).group(1))
    best = max(float(x) for x in re.findall(r"'dev1': ([0-9.]+)", log))
    assert best > start and (tmp_path / "better" / "model.safetensors").exists(), log[-800:]
    log = train(tmp_path / "better", tmp_path / "same", 0)
    assert not (tmp_path / "same").exists() and "nothing saved" in log, log[-800:]


def test_a_long_match_drafts_its_copy_alone(target, heads):
    """override=N: where the context's end repeats an earlier stretch of N or more tokens, the round
    verifies the suffix match's copy alone (the head rests), recorded; the text stays ar's."""
    prompt = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef add("
    ref = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
    r = speclab.generate(target, prompt, "eagle", draft=heads["eagle"], max_new_tokens=NEW, override=3, record="light")
    assert r.ids == ref
    alone = [x for x in r.trace.rounds if "overridden" in x.info]
    assert alone and all(x.info["overridden"] >= 3 and x.info["match"] == x.info["overridden"] for x in alone)
    assert all(n.source.startswith("suffix:") for x in alone for n in x.nodes)
    assert any(not n.source.startswith("suffix:") for x in r.trace.rounds for n in x.nodes)   # the head elsewhere
    sampled = speclab.generate(target, prompt, "eagle", draft=heads["eagle"], max_new_tokens=NEW, override=3,
                               temperature=0.7, seed=1, record="light")      # the copy alone, as point masses
    copies = [n for x in sampled.trace.rounds if "overridden" in x.info for n in x.nodes]
    assert copies and {n.rule for n in copies} == {"point-mass"}
