"""Train the zoo's byte-level BPE tokenizer on the corpus and save it as a transformers tokenizer.

Special tokens: <|endoftext|> separates documents (bos = eos), <|pad|> pads batches, <|mask|> is
the masked-diffusion LM's mask token (one tokenizer for the whole zoo).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"


def train_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 8192):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD, mask_token=MASK,
        model_max_length=512, clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
    return fast
