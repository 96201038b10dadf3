"""The smollm2-draft recipe's pieces on a tiny random Llama: trimmed vocabulary and its coverage,
the loss (targets outside the subset ignored), one training step that lowers it, the batch layout,
and the checkpoint round trip. Nothing here loads SmolLM2 or trains for real."""
import math

import pytest
import torch

from speclab.train import checkpoint as ck
from speclab.train import smollm2_draft as sd

V = 64


@pytest.fixture
def base():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_head_ids_ranked_by_frequency_with_specials():
    tokens = torch.tensor([5] * 10 + [7] * 6 + [9] * 3 + [11] * 1, dtype=torch.int32)
    ids = sd.select_head_ids(tokens, n=3, always=[2], vocab_size=V)
    assert ids.tolist() == [5, 7, 2]          # two most frequent, then the special (count 0)
    assert sd.coverage(tokens, ids) == pytest.approx(16 / 20)
    idx = sd.subset_index(ids, V)
    assert idx[5] == 0 and idx[7] == 1 and idx[2] == 2 and idx[9] == -1


def test_loss_ignores_targets_outside_subset(base):
    head = torch.arange(0, 32)
    model = sd.init_draft(base, head, [0, 3])
    sub = sd.subset_index(head, V)
    x = torch.randint(0, V, (2, 6))
    y = torch.randint(0, 32, (2, 6))
    mask = torch.ones_like(y)
    ce, _ = sd.draft_loss(model, x, y, None, None, sub, mask, kl_weight=0.0)
    y2 = y.clone()
    y2[:, 3] = 40                              # outside the subset: the position drops out
    ce2, st2 = sd.draft_loss(model, x, y2, None, None, sub, mask, kl_weight=0.0)
    mask3 = mask.clone()
    mask3[:, 3] = 0
    ce3, _ = sd.draft_loss(model, x, y, None, None, sub, mask3, kl_weight=0.0)
    assert st2["ntok"] == 10
    assert torch.allclose(ce2, ce3)
    assert math.isfinite(float(ce.detach())) and not torch.allclose(ce, ce2)


def test_kl_zero_when_draft_matches_target(base):
    """With the target's top-k equal to the draft's own (renormalised) distribution over those
    ids, the KL term is exactly the loss of a top-k truncation: 0 when k covers the subset."""
    head = torch.arange(0, 8)
    model = sd.init_draft(base, head, [0])
    sub = sd.subset_index(head, V)
    x = torch.randint(0, V, (1, 5))
    with torch.no_grad():
        h = model.model(input_ids=x).last_hidden_state
        logq = torch.log_softmax(h @ model.lm_head.weight.t(), -1)      # (1, 5, 8)
    lp, ids = logq.half().float(), head.expand(1, 5, 8)
    y = ids[..., 0]
    loss, st = sd.draft_loss(model, x, y, lp, ids, sub, torch.ones_like(y), kl_weight=1.0)
    assert st["kl"] == pytest.approx(0.0, abs=2e-3)


def test_one_step_lowers_loss(base):
    head = torch.arange(0, 48)
    model = sd.init_draft(base, head, [0, 1, 3]).train()
    sub = sd.subset_index(head, V)
    params = sd.trainable(model)
    assert "model.embed_tokens.weight" not in params and "lm_head.weight" not in params
    opt = torch.optim.AdamW(list(params.values()), lr=1e-2)
    torch.manual_seed(1)
    x = torch.randint(0, V, (4, 12))
    y = torch.randint(0, 48, (4, 12))
    lp, ids = torch.randn(4, 12, 8).log_softmax(-1), torch.randint(0, V, (4, 12, 8))
    m = torch.ones_like(y)
    l0, _ = sd.draft_loss(model, x, y, lp, ids, sub, m)
    opt.zero_grad()
    l0.backward()
    opt.step()
    with torch.no_grad():
        l1, _ = sd.draft_loss(model, x, y, lp, ids, sub, m)
    assert float(l1) < float(l0)
    assert model.model.embed_tokens.weight is base.model.embed_tokens.weight   # shared, untouched


def test_windows_and_batch_layout():
    rows_tokens = [[1, 10, 11, 12, 2], [20, 21, 22, 23, 24, 25, 26]]
    rows_kinds = [[sd.TEMPLATE, sd.QUESTION, sd.QUESTION, sd.ANSWER, sd.ANSWER],
                  [sd.CODE_PREFIX, sd.CODE_PREFIX, sd.CODE_GEN, sd.CODE_GEN, sd.CODE_GEN, sd.CODE_GEN, sd.CODE_GEN]]
    flat = [t for r in rows_tokens for t in r]
    data = {"tokens": torch.tensor(flat, dtype=torch.int32),
            "kinds": torch.tensor([k for r in rows_kinds for k in r], dtype=torch.uint8),
            "has_top": torch.tensor([int(k in sd.TRAINED_KINDS) for r in rows_kinds for k in r], dtype=torch.uint8),
            "top_lp": torch.zeros(len(flat), 8, dtype=torch.float16),
            "top_ids": torch.tensor(flat, dtype=torch.int32).unsqueeze(-1).expand(-1, 8).contiguous(),
            "offsets": torch.tensor([0, 5, 12]), "is_code": torch.tensor([0, 1], dtype=torch.uint8)}
    spans = sd.windows(data, [0, 1], seq_len=4)
    assert spans[0] == (0, 5)
    assert all(e - s <= 5 for s, e in spans) and spans[-1][1] == 12
    x, y, m, lp, ids = sd.make_batch(data, spans[:1], pad=2)
    assert x[0].tolist() == [1, 10, 11, 12] and y[0].tolist() == [10, 11, 12, 2]
    assert m[0].tolist() == [1, 1, 1, 1]       # the first label is a question token
    assert (ids[0, :, 0] == y[0]).all()        # top-k stored FOR each label
    x, y, m, lp, ids = sd.make_batch(data, [spans[1]], pad=2)
    assert x[0, 0] == 20 and m[0].tolist()[:2] == [0, 1]   # code prefix labels are not trained
    assert torch.isinf(lp[0, 0]).all()         # not recorded -> -inf, contributes no KL


def test_corpus_rows_learn_the_targets_argmax():
    """On corpus text the label is the target's argmax (top_ids[..., 0]), not the next text token."""
    data = {"tokens": torch.tensor([5, 6, 7, 8], dtype=torch.int32),
            "kinds": torch.tensor([sd.CODE_PREFIX, sd.CORPUS, sd.CORPUS, sd.CORPUS], dtype=torch.uint8),
            "has_top": torch.tensor([0, 1, 1, 1], dtype=torch.uint8),
            "top_lp": torch.zeros(4, 8, dtype=torch.float16),
            "top_ids": torch.tensor([0, 30, 31, 8], dtype=torch.int32).unsqueeze(-1).expand(-1, 8).contiguous(),
            "offsets": torch.tensor([0, 4]), "is_code": torch.tensor([2], dtype=torch.uint8)}
    x, y, m, lp, ids = sd.make_batch(data, sd.windows(data, [0], 8), pad=2)
    assert x[0].tolist() == [5, 6, 7] and y[0].tolist() == [30, 31, 8] and m[0].tolist() == [1, 1, 1]
    train, held = sd.split_rows(data, 0.5, seed=0)
    assert train == [0] and held == []          # corpus rows are never held out


def test_checkpoint_round_trip(base, tmp_path):
    head = torch.arange(0, 40)
    model = sd.init_draft(base, head, [0, 2]).train()
    sub = sd.subset_index(head, V)
    opt = torch.optim.AdamW(list(sd.trainable(model).values()), lr=1e-3)
    x, y = torch.randint(0, V, (2, 8)), torch.randint(0, 40, (2, 8))
    loss, _ = sd.draft_loss(model, x, y, None, None, sub, torch.ones_like(y), kl_weight=0)
    loss.backward()
    opt.step()
    ck.save_checkpoint(tmp_path / "ckpt", model, opt, {"step": 1, "elapsed": 2.0})
    assert not list((tmp_path / "ckpt").glob("*.pt"))

    model2 = sd.init_draft(base, head, [0, 2]).train()
    opt2 = torch.optim.AdamW(list(sd.trainable(model2).values()), lr=1e-3)
    state = ck.load_checkpoint(tmp_path / "ckpt", model2, opt2)
    assert state["step"] == 1
    for (k, p), p2 in zip(sd.trainable(model).items(), sd.trainable(model2).values()):
        assert torch.equal(p, p2), k
        assert torch.equal(opt.state[p]["exp_avg"], opt2.state[p2]["exp_avg"])
        assert float(opt2.state[p2]["step"]) == 1.0


def test_resume_without_a_checkpoint_starts_from_the_shipped_weights(base, tmp_path):
    """A fresh clone has the shipped draft but no checkpoint in the user cache: --resume continues
    from the shipped weights (fresh optimizer), never from scratch over them; with neither, it stops."""
    from speclab.models.adapter import save_draft
    head = torch.arange(0, 40)
    shipped = sd.init_draft(base, head, [0, 2]).train()
    with torch.no_grad():
        for p in sd.trainable(shipped).values():
            p.add_(0.25)                               # "trained": differs from a fresh init
    save_draft(shipped, tmp_path / "out", "tiny")
    fresh = sd.init_draft(base, head, [0, 2]).train()
    opt = torch.optim.AdamW(list(sd.trainable(fresh).values()), lr=1e-3)
    state = ck.resume_state(tmp_path / "no-ckpt", tmp_path / "out", fresh, opt, {"step": 0})
    assert state == {"step": 0} and not opt.state
    for (k, p), p2 in zip(sd.trainable(shipped).items(), sd.trainable(fresh).values()):
        assert torch.equal(p.to(torch.bfloat16).float(), p2), k      # shipped in bf16
    with pytest.raises(SystemExit, match="drop --resume"):
        ck.resume_state(tmp_path / "no-ckpt", tmp_path / "nothing", fresh, opt, {"step": 0})
    other = sd.init_draft(base, head, [0, 2, 3]).train()                 # a third layer the file lacks
    with pytest.raises(SystemExit, match="other settings"):
        ck.resume_state(tmp_path / "no-ckpt", tmp_path / "out", other, opt, {"step": 0})


def test_save_draft_round_trip(base, tmp_path):
    """The shipped adapter (speclab.models.adapter) loads back to the same draft logits."""
    from speclab.models.adapter import save_draft
    from speclab.models.heads import load_draft
    head = torch.tensor([3, 1, 2, 9, 4])
    model = sd.init_draft(base, head, [1, 3]).eval()
    save_draft(model, tmp_path / "draft", "tiny")
    back = load_draft(tmp_path / "draft", base, torch.float32)
    x = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        a, b = model(x).logits, back(x).logits
    assert torch.equal(back.lm_head.head_ids, head)
    assert torch.isinf(b[..., 5]).all()
    fin = torch.isfinite(a)
    assert torch.allclose(a[fin], b[fin], atol=0.1)   # stored in bf16


@pytest.mark.skipif(not __import__("speclab.models.kernels", fromlist=["x"]).available("cpu", torch.bfloat16),
                    reason="the lean generation path needs speclab's bf16 kernel")
def test_lean_generation_path_matches_decoding_each_prompt_alone():
    """generate_batch with a tokenizer runs speclab's batched ar: each row is what `ar` writes for
    that prompt alone (cut after the first eos), no top-k comes back, and sampling is seeded."""
    import speclab
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from speclab.models.zoo import ZOO_DIR
    from speclab.train.smollm2_data import generate_batch
    tok = AutoTokenizer.from_pretrained(ZOO_DIR / "tokenizer")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    prompts = [tok("def f(x):")["input_ids"], tok("import os\nprint(")["input_ids"], [5, 6, 7, 8, 9]]
    rows = generate_batch(model, prompts, tok.eos_token_id, 7, sample=False, tok=tok)
    for p, (ids, lp, tid, ended) in zip(prompts, rows):
        alone = speclab.generate((model, tok), p, "ar", max_new_tokens=7, record=None).ids
        assert ids == alone and lp is None and tid is None
        assert ended == (tok.eos_token_id in ids)
    a = generate_batch(model, prompts, tok.eos_token_id, 7, sample=True, tok=tok, seed=3)
    b = generate_batch(model, prompts, tok.eos_token_id, 7, sample=True, tok=tok, seed=3)
    assert [r[0] for r in a] == [r[0] for r in b]


@pytest.mark.skipif(not __import__("speclab.models.kernels", fromlist=["x"]).available("cpu", torch.bfloat16),
                    reason="the lean generation path needs speclab's bf16 kernel")
def test_openers_start_the_questions_and_are_never_trained_on():
    """With openers, each Magpie question begins with its lane's forced words; those tokens are
    TEMPLATE (the target did not choose them), the sampled rest QUESTION, the answer ANSWER."""
    import speclab
    from speclab.train.smollm2_data import ANSWER, QUESTION, TEMPLATE, chat_prefix, gen_chat
    model, tok = speclab.load("smollm2-135m", dtype="bf16")
    openers = ("Explain", "Write a Python function")
    rows = []
    for seed in range(4):                     # a sampled question may not end within max_q: try seeds
        rows = gen_chat(model, tok, 0.001, 2, 48, 6, 0.95, log=lambda *a, **k: None, seed=seed, openers=openers)
        if rows:
            break
    assert rows, "no sampled question ended within 48 tokens for 4 seeds"
    n_prefix = len(chat_prefix(tok))
    for r in rows:
        kinds = list(r.kinds)
        q = [t for t, k in zip(r.tokens, kinds) if k == QUESTION]
        forced = kinds[n_prefix:kinds.index(QUESTION)]
        opened = tok.decode(r.tokens[n_prefix:n_prefix + len(forced)])
        assert forced and set(forced) == {TEMPLATE} and opened in openers
        assert q and tok.decode(r.tokens[n_prefix:]).startswith(opened)
        assert kinds[-1] == ANSWER and not any(r.has_top[n_prefix:n_prefix + len(forced)])


def test_self_instruct_questions_keep_the_bench_held_out():
    """A written list item is cut at its line's end and kept only if it looks like a question; the
    bench's own questions and close paraphrases are caught by the overlap guard, and no seed question
    the target is shown comes close to one of them."""
    from speclab.train.smollm2_data import (content_words, held_out_words, instruct_question, seed_questions,
                                            too_close)
    assert instruct_question(" How do tides work?\n8. Why") == "How do tides work?"
    assert instruct_question(" How do tides work?<|im_end|>") == "How do tides work?"
    assert instruct_question(" How do tides work") == ""               # never ended: may be cut short
    assert instruct_question(" Why?\n") == ""                          # too short to be a request
    assert instruct_question(" 42 is the answer.\n") == ""
    held = held_out_words()
    assert len(held) >= 40                                              # the test and dev sets
    assert too_close(content_words("Why do we have leap years?"), held)
    assert too_close(content_words("Why is the sky blue? Explain it simply."), held)
    assert too_close(content_words("Explain simply why the sky is blue."), held)
    assert not too_close(content_words("Why is the ocean salty?"), held)
    seeds = seed_questions()
    assert len(seeds) >= 50 and len(set(seeds)) == len(seeds)
    assert not [q for q in seeds if too_close(content_words(q), held)]


@pytest.mark.skipif(not __import__("speclab.models.kernels", fromlist=["x"]).available("cpu", torch.bfloat16),
                    reason="the lean generation path needs speclab's bf16 kernel")
def test_self_instruct_rows_answer_written_questions():
    """With self_instruct, each row is the chat template around a question the target wrote as the
    next item of a seed list (TEMPLATE: written in another context, never trained on), then its
    greedy answer (ANSWER)."""
    import speclab
    from speclab.train.smollm2_data import ANSWER, TEMPLATE, content_words, gen_chat, held_out_words, too_close
    model, tok = speclab.load("smollm2-135m", dtype="bf16")
    rows = []
    for seed in range(4):
        rows = gen_chat(model, tok, 0.001, 2, 48, 6, 0.95, log=lambda *a, **k: None, seed=seed, self_instruct=True)
        if rows:
            break
    assert rows, "no written question passed the filter for 4 seeds"
    held = held_out_words()
    for r in rows:
        kinds = list(r.kinds)
        first = kinds.index(ANSWER)
        assert set(kinds[:first]) == {TEMPLATE} and set(kinds[first:]) == {ANSWER}
        question = tok.decode(r.tokens[:first]).split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        assert question and not too_close(content_words(question), held)


def test_agreement_counts_greedy_text_without_a_recorded_top_k(base, tmp_path):
    """Rows from the lean generation path record no top-k: their answers are still the target's
    greedy tokens and count; their sampled questions do not."""
    from speclab.train.smollm2_data import ANSWER, QUESTION, TEMPLATE, TOPK, Row, load_rows, save_rows
    head = torch.arange(0, 40)
    model = sd.init_draft(base, head, [0, 2]).eval()
    sub = sd.subset_index(head, V)
    T = 12
    toks = torch.randint(0, 40, (T,)).tolist()
    kinds = [TEMPLATE] * 2 + [QUESTION] * 4 + [ANSWER] * 6
    row = Row(toks, kinds, torch.zeros(T, TOPK, dtype=torch.float16), torch.zeros(T, TOPK, dtype=torch.int32),
              [0] * T, "chat")
    save_rows([row], tmp_path / "rows.safetensors", {})
    data = load_rows(tmp_path / "rows.safetensors")
    res = sd.agreement(model, None, data, [0], sub, pad=0, seq_len=16)
    assert res["chat"]["positions"] == 6                      # the answer's tokens, not the question's
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):     # as agreement() computes it
        pred = head[model.model(input_ids=torch.tensor([toks[:-1]])).last_hidden_state[0].matmul(
            model.lm_head.weight.t()).argmax(-1)]
    want = sum(int(pred[t - 1] == toks[t]) for t in range(6, T))
    assert res["chat"]["agree"] == pytest.approx(want / 6)


def test_dev_agreement_counts_the_answer_tokens(base):
    """draft_agreement: the draft reads prompt + answer up to t and is scored on answer token t+1
    only (each answer token is the target's greedy token); it leaves the draft's mode as it was."""
    from speclab.train.dev_eval import Answer, draft_agreement
    head = torch.arange(0, 40)
    model = sd.init_draft(base, head, [0, 2]).train()
    torch.manual_seed(1)
    rows = [Answer(torch.randint(0, 40, (T,)), [], first) for T, first in ((12, 5), (9, 3))]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = hit = 0
        for r in rows:
            pred = head[model.model(input_ids=r.tokens[None, :-1]).last_hidden_state[0].matmul(
                model.lm_head.weight.t()).argmax(-1)]
            hit += sum(int(pred[t - 1] == r.tokens[t]) for t in range(r.first, len(r.tokens)))
            want += len(r.tokens) - r.first
    assert draft_agreement(model, rows) == pytest.approx(hit / want)
    assert want == 7 + 6 and model.training
