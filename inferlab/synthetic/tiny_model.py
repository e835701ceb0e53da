"""A tiny, randomly initialised GPT-NeoX for offline tests and benchmarks of the harness.

It shares the specimen's architecture family (rotary, parallel residual, untied embeddings)
at a size that builds in milliseconds. It is never used as the experiment's specimen.
"""

from __future__ import annotations

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM


def tiny_config(**overrides) -> GPTNeoXConfig:
    """A small GPTNeoXConfig; keyword arguments override its fields."""
    fields = dict(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        max_position_embeddings=256,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    fields.update(overrides)
    return GPTNeoXConfig(**fields)


def tiny_gpt_neox(seed: int = 0, **overrides) -> GPTNeoXForCausalLM:
    """A seeded tiny model in float32, eval mode, eager attention, on the CPU."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = GPTNeoXForCausalLM(tiny_config(**overrides))
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(torch.float32).eval()


TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "A small boat sailed across a quiet lake.",
    "Notebooks, windows, tables and chairs lay beside the door.",
    "Tabs\tand\nnewlines, caf\u00e9s and numbers 0123456789.",
)
ENDOFTEXT = "<|endoftext|>"


def tiny_tokenizer(vocab_size: int = 300):
    """A small byte-level BPE fast tokenizer with "<|endoftext|>" at id 0 and no pad token, like the specimen's."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TINY_CORPUS, vocab_size=vocab_size, min_frequency=1, special_tokens=[ENDOFTEXT],
                            show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT,
                                   unk_token=ENDOFTEXT)
