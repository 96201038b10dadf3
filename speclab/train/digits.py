"""The two-task digits problem of digits-dllm (reference note C.1), chosen so that parallel
decoding errors are measurable automatically.

    ADD 123+456=   ->  579 then <|endoftext|> up to 8 answer slots   (one right answer)
    SUM 27=        ->  any 6 digits summing to 27, then 2 x <|endoftext|>  (many right answers)

ADD has left/right dependencies through carries; SUM is multimodal, so committing several
positions in parallel, each from its own marginal, can break the sum: validity measures that.
Held-out split: ADD pairs with (a * 1000 + b) % 10 == 3 are never trained on. SUM has only 55
prompts (s = 0..54), all seen in training; what is measured on SUM is validity of the answer.
"""
from __future__ import annotations

import random
from pathlib import Path

ANSWER_LEN = 8
EOS, MASK, PAD = "<|endoftext|>", "<|mask|>", "<|pad|>"
VOCAB = [*"0123456789", "+", "=", EOS, MASK, PAD, "ADD", "SUM"]


def build_tokenizer(out_dir: str | Path | None = None):
    """A word-level tokenizer over the 17 symbols; saved like any transformers tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"ADD|SUM|\d|\+|="), behavior="isolated")])
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOS, MASK, PAD])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD,
                                   mask_token=MASK, unk_token=PAD, clean_up_tokenization_spaces=False)
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def held_out(a: int, b: int) -> bool:
    return (a * 1000 + b) % 10 == 3


def add_example(rng: random.Random, split: str = "train") -> tuple[str, str]:
    while True:
        a, b = rng.randrange(1000), rng.randrange(1000)
        if held_out(a, b) == (split == "test"):
            return f"ADD {a:03d}+{b:03d}=", str(a + b)


def sum_example(rng: random.Random) -> tuple[str, str]:
    digits = [rng.randrange(10) for _ in range(6)]
    return f"SUM {sum(digits):02d}=", "".join(map(str, digits))


def answer_ids(answer: str) -> list[int]:
    """Answer text -> exactly ANSWER_LEN ids, padded with <|endoftext|>."""
    ids = [VOCAB.index(c) for c in answer]
    return ids + [VOCAB.index(EOS)] * (ANSWER_LEN - len(ids))


def check(prompt: str, output: str) -> bool:
    """ADD: exact sum. SUM: six digits whose sum is s. `output` is the decoded answer (EOS removed)."""
    task, rest = prompt.split(maxsplit=1)
    out = output.replace(EOS, "").strip()
    if task == "ADD":
        a, b = rest.rstrip("=").split("+")
        return out == str(int(a) + int(b))
    s = int(rest.rstrip("="))
    return len(out) == 6 and out.isdigit() and sum(map(int, out)) == s


def eval_prompts(n: int, seed: int = 1234) -> list[dict]:
    """n held-out ADD prompts and n SUM prompts: [{"task", "prompt"}]."""
    rng = random.Random(seed)
    return ([{"task": "ADD", "prompt": add_example(rng, "test")[0]} for _ in range(n)]
            + [{"task": "SUM", "prompt": sum_example(rng)[0]} for _ in range(n)])
