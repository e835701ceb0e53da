"""A deterministic, synthetic checkpoint with pythia-14m's exact architecture, built offline.

The stand-in lets the whole harness (verification, loading, generation, caching, timing)
run where the real weights cannot be fetched. Its weights are constructed, not trained: they
mean nothing about pythia-14m. Every file carries the same bytes on every build, so the
specimen spec `artifacts/standin.json` pins the size and SHA-256 of all six files.

Design notes:
- The weights come from inferlab.synthetic.recipe (numpy PCG64, no torch), which writes down a small
  "successor" structure by hand so that next-token distributions are peaked and depend on
  the last three tokens, logits span tens of units and EOS is sometimes sampled: a trained
  model's shape without its knowledge. The replica specimen uses the same recipe.
- They are stored as float16 (as the real checkpoint is) under the real checkpoint's tensor
  names, in a safetensors file of exactly the real file's size (28,143,920 bytes: the same 76
  tensors and the same header length; no padding was needed).
- The tokenizer is a byte-level BPE trained deterministically on a small built-in corpus
  containing every word of the protocol's prompts, with "<|endoftext|>" as id 0; the other
  vocabulary slots hold made-up filler words, so every id decodes to something visible.
- The stand-in's "revision" is not a hub commit (the repository does not exist): it is
  sha1(RECIPE) as 40 hex digits, so changing the recipe changes the revision.

Usage: python -m inferlab.standin DIR   (DIR must be new or empty)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from inferlab import protocol
from inferlab.base.commands import spelled
from inferlab.base.records import write_bytes_atomic
from inferlab.synthetic import recipe

# Bump the version suffix whenever any built byte changes; the revision follows it.
RECIPE = f"inferlab-standin-pythia-14m-architecture/recipe-{recipe.VERSION}"
# Written into config.json, so these bytes are pinned (artifacts/standin.json): the text names the recipe module by
# the path it had when they were pinned (now inferlab.synthetic.recipe); changing it means a new recipe version.
SYNTHETIC_NOTE = (
    "Synthetic stand-in built offline by inferlab.standin: pythia-14m's architecture with constructed "
    f"weights (inferlab.recipe {recipe.VERSION}, numpy PCG64 seed {recipe.SEED}), not trained. "
    "Not EleutherAI/pythia-14m; its outputs carry no meaning."
)

# Values of the real pythia-14m config.json (its sizes are the recipe's, which lays out the same tensors),
# plus the synthetic marker.
CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "bos_token_id": recipe.EOS_ID,
    "classifier_dropout": 0.1,
    "eos_token_id": recipe.EOS_ID,
    "hidden_act": "gelu",
    "hidden_dropout": 0.0,
    "hidden_size": recipe.HIDDEN,
    "initializer_range": 0.02,
    "intermediate_size": recipe.INTERMEDIATE,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "gpt_neox",
    "num_attention_heads": recipe.HEADS,
    "num_hidden_layers": recipe.LAYERS,
    "rope_scaling": None,
    "rotary_emb_base": recipe.ROTARY_BASE,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.57.1",
    "use_cache": True,
    "use_parallel_residual": True,
    "vocab_size": recipe.VOCAB,
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
    return recipe.expected_shapes()


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


def file_contents(variant: recipe.Variant = recipe.BASE) -> dict[str, bytes]:
    """The six allowlisted files' bytes, keyed by file name (a recipe variant only changes the weights)."""
    from safetensors.numpy import save

    contents = {
        "config.json": _json_bytes(CONFIG),
        "tokenizer.json": tokenizer_json().encode("utf-8"),
        "tokenizer_config.json": _json_bytes(TOKENIZER_CONFIG),
        "special_tokens_map.json": _json_bytes(SPECIAL_TOKENS_MAP),
        "generation_config.json": _json_bytes(GENERATION_CONFIG),
        # "format": "pt" is what the real file's header carries; it also tells transformers
        # the tensors follow the PyTorch layout.
        "model.safetensors": save(recipe.weights(variant), metadata={"format": "pt"}),
    }
    if set(contents) != set(protocol.ALLOWLISTED_FILES):
        raise RuntimeError(f"stand-in files {sorted(contents)} differ from {sorted(protocol.ALLOWLISTED_FILES)}")
    return contents


class BuildRefused(Exception):
    """The target directory is not new or empty: building there could overwrite someone's files."""


def check_target(directory: Path) -> None:
    """Refuse a target that is a file or a non-empty directory, touching nothing."""
    if directory.exists() and not directory.is_dir():
        raise BuildRefused(f"{directory}: expected a new or empty directory, actual: an existing file")
    if directory.is_dir() and any(directory.iterdir()):
        entries = sorted(p.name for p in directory.iterdir())
        raise BuildRefused(
            f"{directory}: expected a new or empty directory, actual: it holds {len(entries)} "
            f"{'entry' if len(entries) == 1 else 'entries'} "
            f"({', '.join(entries[:6])}{', ...' if len(entries) > 6 else ''}); nothing was written"
        )


def write_files(directory: Path, contents: dict[str, bytes]) -> dict:
    """Write whole files atomically into a new or empty directory: {name: {size, sha256}}.

    Raises BuildRefused, before writing anything, when the directory is a file or not empty.
    """
    check_target(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, data in contents.items():
        write_bytes_atomic(directory / name, data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return files


def build(directory, variant: recipe.Variant = recipe.BASE) -> dict:
    """Write the six stand-in files into a new or empty directory; return {directory, files: {name: {size, sha256}}}.

    Raises BuildRefused, before writing anything, when the directory is a file or not empty.
    """
    start = time.perf_counter()
    directory = Path(directory)
    files = write_files(directory, file_contents(variant))
    return {
        "directory": str(directory),
        "recipe": RECIPE,
        "variant": variant.describe(),
        "revision": revision(),
        "files": files,
        "elapsed_s": time.perf_counter() - start,
    }


def command_line(prog: str, what: str, build_into, refusals: tuple, argv=None) -> int:
    """`python -m <prog> DIR`: build into a new or empty DIR, print the files as JSON; exit 2 with the reason if
    refused."""
    parser = argparse.ArgumentParser(prog=prog, description=sys.modules[build_into.__module__].__doc__.splitlines()[0])
    parser.add_argument("directory", help=f"where to write {what}: a new or empty directory")
    args = parser.parse_args(argv)
    try:
        result = build_into(Path(args.directory).expanduser())
    except refusals as error:
        print(f"{prog}: refused: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a target that cannot be created: under a file, under /proc, read-only
        print(f"{prog}: could not write {args.directory}: {error.strerror or error}"
              f"{f' ({error.filename})' if error.filename else ''}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def main(argv=None) -> int:
    """Command line: build the stand-in into a new or empty DIR and print the file sizes and hashes as JSON."""
    return command_line(spelled("-m inferlab.standin", "python"), "the six files", build, (BuildRefused,), argv)


if __name__ == "__main__":
    sys.exit(main())
