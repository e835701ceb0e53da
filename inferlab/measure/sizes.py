"""Sizes of a GPT-NeoX model that follow from its config alone: its parameter count and its KV-cache bytes.

Pure arithmetic on a config's attributes (a transformers config, or any object with the same names), with no
torch, so that the experiment (inferlab.measure.memory) and a reader of a finished run (verify's consistency checks)
use one formula.
"""

from __future__ import annotations

from typing import Any


def expected_kv_cache_bytes(config: Any, tokens: int, dtype_bytes: int = 4, batch_size: int = 1) -> int:
    """2 (keys and values) x layers x heads x head_dim x tokens x batch x bytes per element."""
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * tokens * batch_size * dtype_bytes


def gpt_neox_parameter_count(config: Any) -> int:
    """Parameters of a GPTNeoXForCausalLM from its config alone (no model needed).

    Per layer: two LayerNorms (weight + bias), fused QKV and output projections, and the
    two MLP projections, all with biases; plus the input embedding, the final LayerNorm,
    and the output embedding unless it is tied to the input one.
    """
    hidden, intermediate, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    per_layer = (
        2 * 2 * hidden  # input and post-attention LayerNorms
        + hidden * 3 * hidden + 3 * hidden  # query_key_value
        + hidden * hidden + hidden  # attention output dense
        + hidden * intermediate + intermediate  # dense_h_to_4h
        + intermediate * hidden + hidden  # dense_4h_to_h
    )
    embeddings = vocab * hidden * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_hidden_layers * per_layer + 2 * hidden  # + final LayerNorm
