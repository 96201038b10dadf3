"""The training recipes run a few real steps on a small slice of the corpus."""
import json

import torch

from speclab.train.ar import DRAFT_SHAPE, TrainConfig, train_lm
from speclab.train.corpus import is_held_out, iter_texts, source_files
from speclab.models.zoo import ZOO_DIR


def test_split_is_by_whole_module():
    train, held = source_files("train"), source_files("heldout")
    assert held and train
    assert not {f.module for f in train} & {f.module for f in held}
    assert all(is_held_out(f.module) for f in held)


def test_tokenizer_recipe(tmp_path):
    from speclab.train.tokenizer import train_tokenizer
    texts = list(iter_texts("train"))[:20]
    tok = train_tokenizer(texts, tmp_path / "tok", vocab_size=600)
    assert len(tok) == 600 and tok.decode(tok("def f(x):\n")["input_ids"]) == "def f(x):\n"


def test_train_a_few_steps_then_resume(tmp_path):
    texts = list(iter_texts("train"))[:10]
    cfg = TrainConfig(minutes=5, seq_len=64, batch_size=2, max_steps=3, exit_layers=[2], warmup_steps=1,
                      checkpoint_minutes=100)
    shape = dict(DRAFT_SHAPE, num_hidden_layers=3)
    train_lm(tmp_path / "m", ZOO_DIR / "tokenizer", shape, cfg, texts=texts, log=lambda *_: None)
    state = json.loads((tmp_path / "m" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and (tmp_path / "m" / "model.safetensors").exists()
    cfg.max_steps = 5
    m = train_lm(tmp_path / "m", ZOO_DIR / "tokenizer", shape, cfg, texts=texts, log=lambda *_: None, resume=True)
    assert json.loads((tmp_path / "m" / "checkpoint" / "state.json").read_text())["step"] == 5
    from transformers import AutoModelForCausalLM
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert again.config.num_hidden_layers == 3
    w = dict(again.named_parameters())["model.layers.0.mlp.up_proj.weight"].float()  # stored fp16
    assert torch.allclose(w, dict(m.named_parameters())["model.layers.0.mlp.up_proj.weight"].half().float(), atol=1e-3)


def test_distill_step_runs(tmp_path):
    texts = list(iter_texts("train"))[:5]
    cfg = TrainConfig(minutes=5, seq_len=32, batch_size=2, max_steps=2, distill_from=str(ZOO_DIR / "code-draft"))
    train_lm(tmp_path / "d", ZOO_DIR / "tokenizer", DRAFT_SHAPE, cfg, texts=texts, log=lambda *_: None,
             init_from=ZOO_DIR / "code-draft")
    assert (tmp_path / "d" / "model.safetensors").exists()


def test_stdlib_tests_corpus_adds_training_text_only():
    small, big = source_files("train"), source_files("train", corpus="stdlib+tests")
    assert {f.path for f in small} < {f.path for f in big}
    assert any(f.module == "test" for f in big) and not any(f.module == "test" for f in small)
    assert source_files("heldout", corpus="stdlib+tests") == source_files("heldout")


def test_masked_diffusion_loss_only_counts_maskable_positions():
    from speclab.train.dllm import DIGITS_SHAPE, masked_diffusion_loss
    from speclab.models.dllm import mark_dllm
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(mark_dllm(LlamaConfig(vocab_size=17, **DIGITS_SHAPE), 13, shift=False))
    x = torch.randint(0, 10, (4, 12))
    g = torch.Generator().manual_seed(0)
    none = torch.zeros_like(x, dtype=torch.bool)
    assert masked_diffusion_loss(model, x, none, 13, g).item() == 0.0
    some = none.clone()
    some[:, -4:] = True
    loss = masked_diffusion_loss(model, x, some, 13, g)
    assert loss.item() > 0 and torch.isfinite(loss)


def test_dllm_recipes_run_a_few_steps(tmp_path):
    import speclab
    from speclab.models.dllm import is_dllm
    from speclab.train.dllm import DllmConfig, train_code, train_digits
    train_digits(tmp_path / "dig", DllmConfig(max_steps=3, batch_size=8), log=lambda *_: None)
    model, tok = speclab.load(tmp_path / "dig")
    assert is_dllm(model) and model.config.mask_token_id == tok.mask_token_id and not model.config.speclab_shift
    r = speclab.run((model, tok), "ADD 123+456=", "dllm-threshold", gen_length=8)
    assert len(r.ids) >= 1 and r.trace.totals.target_forwards >= 1
    texts = list(iter_texts("train"))[:5]
    train_code(tmp_path / "code", ZOO_DIR / "tokenizer", ZOO_DIR / "code-draft",
               DllmConfig(max_steps=2, batch_size=2, seq_len=64), log=lambda *_: None, texts=texts)
    model, tok = speclab.load(tmp_path / "code")
    assert is_dllm(model) and model.config.speclab_shift and model.config.mask_token_id == tok.mask_token_id


def test_sequence_level_distillation_text_is_the_teachers_greedy_continuation(tmp_path):
    from transformers import LlamaForCausalLM
    from speclab.train.selfgen import greedy_continuations
    teacher = LlamaForCausalLM.from_pretrained(ZOO_DIR / "code-draft", dtype=torch.float32).eval()
    stream = torch.arange(5, 900)
    rows = greedy_continuations(teacher, stream, 1e-6, torch.Generator().manual_seed(0), seq_len=64,
                                batch=3, log=lambda *_: None)
    assert rows.shape == (3, 64)
    with torch.no_grad():
        logits = teacher(rows).logits
    logits[..., teacher.config.eos_token_id] = -float("inf")  # generation runs past EOS (min_new_tokens)
    nxt = logits.argmax(-1)                                   # (3, 64): greedy choice after each prefix
    assert torch.equal(nxt[:, 24:-1], rows[:, 25:])           # past the longest prefix (24): teacher text
    cfg = TrainConfig(minutes=5, seq_len=64, batch_size=2, max_steps=2, distill_from=str(ZOO_DIR / "code-draft"),
                      selfgen_minutes=1e-6)
    logs = []
    train_lm(tmp_path / "s", ZOO_DIR / "tokenizer", DRAFT_SHAPE, cfg, texts=list(iter_texts("train"))[:5],
             log=logs.append, init_from=ZOO_DIR / "code-draft")
    assert any("teacher continuations" in str(m) for m in logs)
    cfg.selfgen_share, cfg.max_steps = 1.0, 1                # distil on the teacher's text alone
    train_lm(tmp_path / "s1", ZOO_DIR / "tokenizer", DRAFT_SHAPE, cfg, texts=list(iter_texts("train"))[:5],
             log=lambda *_: None, init_from=ZOO_DIR / "code-draft")
    assert (tmp_path / "s1" / "model.safetensors").exists()
