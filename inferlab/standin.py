"""A deterministic, synthetic checkpoint with pythia-14m's exact architecture, built offline.

The stand-in lets the whole harness (verification, loading, generation, caching, timing)
run where the real weights cannot be fetched. Its weights are random: its outputs mean
nothing about pythia-14m. Every file carries the same bytes on every build, so the
specimen spec `artifacts/standin.json` pins the size and SHA-256 of all six files.

Design notes:
- Weights come from numpy's PCG64 generator, not torch's initialisation, so the bytes do
  not depend on the torch version. They are stored as float16 (as the real checkpoint is)
  under the real checkpoint's tensor names, in a safetensors file of exactly the real
  file's size (28,143,920 bytes: the same 76 tensors and the same header length; no
  padding was needed). The tests compare that size with the pin in pythia-14m.json.
- The tokenizer is a byte-level BPE trained deterministically on a small built-in corpus
  containing every word of the protocol's prompts, with "<|endoftext|>" as id 0.
- The stand-in's "revision" is not a hub commit (the repository does not exist): it is
  sha1(RECIPE) as 40 hex digits, so changing the recipe changes the revision.

Usage: python -m inferlab.standin DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from inferlab import protocol
from inferlab.records import write_bytes_atomic

# Bump the version suffix whenever any built byte changes; the revision follows it.
RECIPE = "inferlab-standin-pythia-14m-architecture/recipe-v2"
SEED = 14
INIT_STD = 0.02
SYNTHETIC_NOTE = (
    "Synthetic stand-in built offline by inferlab.standin: pythia-14m's architecture with random "
    "weights (numpy PCG64, seed 14). Not EleutherAI/pythia-14m; its outputs carry no meaning."
)

# Values of the real pythia-14m config.json, plus the synthetic marker.
CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "classifier_dropout": 0.1,
    "eos_token_id": 0,
    "hidden_act": "gelu",
    "hidden_dropout": 0.0,
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": 4,
    "num_hidden_layers": 6,
    "rope_scaling": None,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.57.1",
    "use_cache": True,
    "use_parallel_residual": True,
    "vocab_size": 50304,
    "inferlab_synthetic": True,
    "inferlab_note": SYNTHETIC_NOTE,
}

GENERATION_CONFIG = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 0, "transformers_version": "4.57.1"}

ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, "<|padding|>"]  # ids 0 and 1, as in the real tokenizer
SPECIAL_TOKENS_MAP = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
TOKENIZER_CONFIG = {
    "add_bos_token": False,
    "add_eos_token": False,
    "add_prefix_space": False,
    "bos_token": ENDOFTEXT,
    # Decoding must give back the exact source text, so no space clean-up.
    "clean_up_tokenization_spaces": False,
    "eos_token": ENDOFTEXT,
    "tokenizer_class": "GPTNeoXTokenizerFast",
    "unk_token": ENDOFTEXT,
    "inferlab_synthetic": True,
    "inferlab_note": SYNTHETIC_NOTE,
}
TOKENIZER_VOCAB_SIZE = 1024  # an upper bound for the trainer; the corpus yields fewer

# Fixed training text. The prompts are included verbatim; the rest only gives BPE pairs
# to merge. Never read from outside the module, so the tokenizer cannot drift.
CORPUS = (
    "The small red boat crossed the lake. A notebook lay beside the window.",
    "The boat was small and red, and the lake was calm when it crossed at dawn.",
    "A notebook, a pencil and a lamp lay on the table beside the open window.",
    "The window looked over the lake, where a small boat crossed from one side to the other.",
    "She wrote in the notebook every morning; the pages filled with notes about the weather.",
    "Red leaves fell on the water. The wind crossed the lake and moved the boat.",
    "He lay the map beside the notebook and traced the route across the lake.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128. Punctuation: , . ; : ! ? ' \" ( ) - .",
    "The quick brown fox jumps over the lazy dog. A small model reads the text one token at a time.",
    "Inference runs the trained model; sampling chooses the next token; a cache keeps the past.",
)


def revision() -> str:
    """The stand-in's pinned revision: sha1 of RECIPE as 40 hex digits (not a hub commit)."""
    return hashlib.sha1(RECIPE.encode("utf-8")).hexdigest()


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of pythia-14m's model.safetensors, in a fixed order."""
    vocab, hidden = CONFIG["vocab_size"], CONFIG["hidden_size"]
    inner = CONFIG["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"gpt_neox.embed_in.weight": (vocab, hidden)}
    for layer in range(CONFIG["num_hidden_layers"]):
        prefix = f"gpt_neox.layers.{layer}."
        shapes.update(
            {
                prefix + "input_layernorm.weight": (hidden,),
                prefix + "input_layernorm.bias": (hidden,),
                prefix + "post_attention_layernorm.weight": (hidden,),
                prefix + "post_attention_layernorm.bias": (hidden,),
                prefix + "attention.query_key_value.weight": (3 * hidden, hidden),
                prefix + "attention.query_key_value.bias": (3 * hidden,),
                prefix + "attention.dense.weight": (hidden, hidden),
                prefix + "attention.dense.bias": (hidden,),
                prefix + "mlp.dense_h_to_4h.weight": (inner, hidden),
                prefix + "mlp.dense_h_to_4h.bias": (inner,),
                prefix + "mlp.dense_4h_to_h.weight": (hidden, inner),
                prefix + "mlp.dense_4h_to_h.bias": (hidden,),
            }
        )
    shapes["gpt_neox.final_layer_norm.weight"] = (hidden,)
    shapes["gpt_neox.final_layer_norm.bias"] = (hidden,)
    shapes["embed_out.weight"] = (vocab, hidden)
    return shapes


def weights(seed: int = SEED) -> dict[str, np.ndarray]:
    """float16 tensors: matrices ~ N(0, INIT_STD) from PCG64(seed), layer-norm weights 1, biases 0."""
    rng = np.random.Generator(np.random.PCG64(seed))
    tensors = {}
    for name, shape in tensor_shapes().items():
        if name.endswith(".bias"):
            tensors[name] = np.zeros(shape, dtype=np.float16)
        elif "layernorm" in name or "layer_norm" in name:
            tensors[name] = np.ones(shape, dtype=np.float16)
        else:
            draw = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
            tensors[name] = draw.astype(np.float16)
    return tensors


def tokenizer_json() -> str:
    """The serialized fast tokenizer: byte-level BPE trained on CORPUS, "<|endoftext|>" = id 0."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    if tokenizer.token_to_id(ENDOFTEXT) != 0 or tokenizer.get_vocab_size() > CONFIG["vocab_size"]:
        raise RuntimeError(
            f"stand-in tokenizer: expected {ENDOFTEXT!r} at id 0 and at most {CONFIG['vocab_size']} tokens, "
            f"got id {tokenizer.token_to_id(ENDOFTEXT)} and {tokenizer.get_vocab_size()} tokens"
        )
    serialized = json.loads(tokenizer.to_str(pretty=False))
    _fill_vocabulary(serialized["model"]["vocab"], CONFIG["vocab_size"])
    return json.dumps(serialized, ensure_ascii=False, separators=(",", ":"))


FILLER_CONSONANTS = "bdfgklmnprstvz"
FILLER_VOWELS = "aeiou"


def filler_token(index: int) -> str:
    """A pronounceable pseudo-word for a vocabulary slot the trained BPE left empty, e.g. 'Ġkafo'.

    'Ġ' is byte-level BPE's space, so decoded noise reads as separate made-up words.
    """
    syllables = []
    while True:
        index, syllable = divmod(index, len(FILLER_CONSONANTS) * len(FILLER_VOWELS))
        consonant, vowel = divmod(syllable, len(FILLER_VOWELS))
        syllables.append(FILLER_CONSONANTS[consonant] + FILLER_VOWELS[vowel])
        if index == 0:
            return "\u0120" + "".join(syllables)


def _fill_vocabulary(vocab: dict, size: int) -> None:
    """Give every model id below size a token, so each id the random model selects decodes to something.

    The filler tokens have no merges, so BPE never produces them when encoding: the prompts tokenize
    exactly as with the trained vocabulary alone.
    """
    taken = set(vocab)
    next_id, counter = len(vocab), 0
    while next_id < size:
        candidate = filler_token(counter)
        counter += 1
        if candidate not in taken:
            vocab[candidate] = next_id
            taken.add(candidate)
            next_id += 1


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("utf-8")


def file_contents() -> dict[str, bytes]:
    """The six allowlisted files' bytes, keyed by file name."""
    from safetensors.numpy import save

    contents = {
        "config.json": _json_bytes(CONFIG),
        "tokenizer.json": tokenizer_json().encode("utf-8"),
        "tokenizer_config.json": _json_bytes(TOKENIZER_CONFIG),
        "special_tokens_map.json": _json_bytes(SPECIAL_TOKENS_MAP),
        "generation_config.json": _json_bytes(GENERATION_CONFIG),
        # "format": "pt" is what the real file's header carries; it also tells transformers
        # the tensors follow the PyTorch layout.
        "model.safetensors": save(weights(), metadata={"format": "pt"}),
    }
    if set(contents) != set(protocol.ALLOWLISTED_FILES):
        raise RuntimeError(f"stand-in files {sorted(contents)} differ from {sorted(protocol.ALLOWLISTED_FILES)}")
    return contents


def build(directory) -> dict:
    """Write the six stand-in files into directory; return {directory, files: {name: {size, sha256}}, elapsed_s}."""
    start = time.perf_counter()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, data in file_contents().items():
        write_bytes_atomic(directory / name, data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {
        "directory": str(directory),
        "recipe": RECIPE,
        "revision": revision(),
        "files": files,
        "elapsed_s": time.perf_counter() - start,
    }


def main(argv=None) -> int:
    """Command line: build the stand-in into DIR and print the file sizes and hashes as JSON."""
    parser = argparse.ArgumentParser(prog="python -m inferlab.standin", description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="where to write the six files (created if missing)")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.directory), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
