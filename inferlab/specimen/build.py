"""The stand-in and the replica, built offline from the recipe's weights (recipe.py), and a tiny model for the
harness's own tests. What each holds and why: docs/specimens.md, "The stand-in and the replica". Neither is Pythia;
each revision is sha1 of its recipe name, not a hub commit, so a new recipe is a new revision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Callable

from inferlab.files import PROJECT_ROOT, spelled, write_bytes_atomic
from inferlab.specimen import recipe
from inferlab.specimen.spec import SpecimenError

# Written into config.json, so these bytes are pinned (artifacts/standin.json): the text names the recipe module by
# the path it had when they were pinned (now inferlab.specimen.recipe); changing it means a new recipe version.
SYNTHETIC_NOTE = ("Synthetic stand-in built offline by inferlab.standin: pythia-14m's architecture with constructed "
                  f"weights (inferlab.recipe {recipe.VERSION}, numpy PCG64 seed {recipe.SEED}), not trained. "
                  "Not EleutherAI/pythia-14m; its outputs carry no meaning.")
# The real pythia-14m config.json's values (its sizes are the recipe's), plus the synthetic marker.
CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "bos_token_id": recipe.EOS_ID, "classifier_dropout": 0.1, "eos_token_id": recipe.EOS_ID, "hidden_act": "gelu",
    "hidden_dropout": 0.0, "hidden_size": recipe.HIDDEN, "initializer_range": 0.02,
    "intermediate_size": recipe.INTERMEDIATE, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": recipe.HEADS, "num_hidden_layers": recipe.LAYERS,
    "rope_scaling": None, "rotary_emb_base": recipe.ROTARY_BASE, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.57.1", "use_cache": True, "use_parallel_residual": True,
    "vocab_size": recipe.VOCAB, "inferlab_synthetic": True, "inferlab_note": SYNTHETIC_NOTE,
}
GENERATION_CONFIG = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 0, "transformers_version": "4.57.1"}
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, "<|padding|>"]  # ids 0 and 1, as in the real tokenizer
SPECIAL_TOKENS_MAP = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
TOKENIZER_CONFIG = {
    "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False, "bos_token": ENDOFTEXT,
    "clean_up_tokenization_spaces": False,  # decoding must give back the exact source text
    "eos_token": ENDOFTEXT, "tokenizer_class": "GPTNeoXTokenizerFast", "unk_token": ENDOFTEXT,
    "inferlab_synthetic": True, "inferlab_note": SYNTHETIC_NOTE,
}
TOKENIZER_VOCAB_SIZE = 1024  # an upper bound for the trainer; the corpus yields fewer
# Fixed training text: the prompts verbatim, the rest only gives BPE pairs to merge. Never read from outside.
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
FILLER_CONSONANTS, FILLER_VOWELS = "bdfgklmnprstvz", "aeiou"
REFERENCE_ENV = "INFERLAB_PYTHIA_REFERENCE"  # tests point it elsewhere; learners never need it
DEFAULT_REFERENCE_DIR = PROJECT_ROOT.parent / "shared" / "reference" / "pythia-14m"
COPIED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HEADER_FILE = "model.safetensors.header"


class ReferenceUnavailable(SpecimenError):
    """The folder of published small files is missing or incomplete: the replica cannot be built."""


# --- the stand-in ---------------------------------------------------------------------------------------------


def filler_token(index: int) -> str:
    """A pronounceable made-up word for a vocabulary slot the trained BPE left empty, e.g. 'Ġkafo' ('Ġ' is byte-level
    BPE's space, so decoded noise reads as separate words)."""
    syllables = []
    while True:
        index, syllable = divmod(index, len(FILLER_CONSONANTS) * len(FILLER_VOWELS))
        consonant, vowel = divmod(syllable, len(FILLER_VOWELS))
        syllables.append(FILLER_CONSONANTS[consonant] + FILLER_VOWELS[vowel])
        if index == 0:
            return "\u0120" + "".join(syllables)


def tokenizer_json() -> str:
    """The serialized fast tokenizer: byte-level BPE trained on CORPUS, then every model id given a token."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)  # "<|endoftext|>" at id 0: the pinned bytes hold it
    serialized = json.loads(tokenizer.to_str(pretty=False))
    # Filler tokens have no merges, so BPE never produces them: the prompts tokenize as with the trained pieces alone.
    vocab, counter = serialized["model"]["vocab"], 0
    while len(vocab) < recipe.VOCAB:
        candidate, counter = filler_token(counter), counter + 1
        vocab.setdefault(candidate, len(vocab))
    return json.dumps(serialized, ensure_ascii=False, separators=(",", ":"))


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("utf-8")


def standin_contents(variant: recipe.Variant = recipe.BASE) -> dict[str, bytes]:
    """The stand-in's six allowlisted files, keyed by name (a recipe variant changes only the weights)."""
    from safetensors.numpy import save

    return {"config.json": _json_bytes(CONFIG), "tokenizer.json": tokenizer_json().encode("utf-8"),
            "tokenizer_config.json": _json_bytes(TOKENIZER_CONFIG),
            "special_tokens_map.json": _json_bytes(SPECIAL_TOKENS_MAP),
            "generation_config.json": _json_bytes(GENERATION_CONFIG),
            # "format": "pt", as in the real file's header, tells transformers the tensors follow PyTorch's layout
            "model.safetensors": save(recipe.weights(variant), metadata={"format": "pt"})}


# --- the replica ----------------------------------------------------------------------------------------------


def reference_dir() -> Path:
    """Where the published small files are expected: $INFERLAB_PYTHIA_REFERENCE, else ../shared/reference/pythia-14m."""
    configured = os.environ.get(REFERENCE_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_REFERENCE_DIR


def require_reference() -> Path:
    """The reference folder, checked to hold every file the replica copies; ReferenceUnavailable otherwise."""
    directory = reference_dir()
    missing = [name for name in (*COPIED_FILES, HEADER_FILE) if not (directory / name).is_file()]
    if missing:
        state = "absent" if not directory.is_dir() else f"lacks {missing}"
        raise ReferenceUnavailable(
            f"the replica specimen is built from pythia-14m's published small files, expected in {directory} (the "
            f"folder ../shared/reference/pythia-14m beside the project, or ${REFERENCE_ENV}); actual: {state}. It "
            f"exists on the course's CI machines, not in a learner's clone: use --specimen standin instead.")
    return directory


def weight_file_bytes(header: bytes, variant: recipe.Variant = recipe.BASE) -> bytes:
    """The real header, then the recipe's float16 tensors at exactly its offsets; ValueError on any mismatch."""
    tensors = recipe.weights(variant)
    entries = {name: entry for name, entry in json.loads(header).items() if name != "__metadata__"}
    if set(entries) != set(tensors):
        raise ValueError(f"{HEADER_FILE}: tensor names differ from the recipe's: {sorted(set(entries) ^ set(tensors))}")
    data = bytearray()
    for name, entry in sorted(entries.items(), key=lambda item: item[1]["data_offsets"][0]):
        array, offsets = tensors[name], entry["data_offsets"]
        if offsets != [len(data), len(data) + 2 * array.size] or (entry["dtype"], tuple(entry["shape"])) != (
                "F16", array.shape):
            raise ValueError(f"{HEADER_FILE}: {name} is {entry['dtype']} {entry['shape']} at {offsets}, the recipe "
                             f"gives float16 {array.shape} from {len(data)} (no gaps)")
        data += array.astype("<f2").tobytes()
    return struct.pack("<Q", len(header)) + header + bytes(data)


def replica_contents(variant: recipe.Variant = recipe.BASE) -> dict[str, bytes]:
    """The replica's five files, keyed by name (no generation_config.json)."""
    directory = require_reference()
    contents = {name: (directory / name).read_bytes() for name in COPIED_FILES}
    contents["model.safetensors"] = weight_file_bytes((directory / HEADER_FILE).read_bytes(), variant)
    return contents


# --- building one into a folder, and its command ---------------------------------------------------------------


def check_target(directory: Path) -> None:
    """Refuse a target that is a file or a non-empty folder (SpecimenError), touching nothing."""
    if directory.exists() and not directory.is_dir():
        raise SpecimenError(f"{directory}: expected a new or empty directory, actual: an existing file")
    entries = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if entries:
        raise SpecimenError(f"{directory}: expected a new or empty directory, actual: it holds {len(entries)} "
                           f"{'entry' if len(entries) == 1 else 'entries'} ({', '.join(entries[:6])}"
                           f"{', ...' if len(entries) > 6 else ''}); nothing was written")


@dataclasses.dataclass(frozen=True)
class Builder:
    """One offline specimen: its name (artifacts/<name>.json), its recipe name and how its files are made."""

    name: str
    recipe: str
    contents: Callable[[recipe.Variant], dict]

    def revision(self) -> str:
        """The pinned revision: sha1 of the recipe name as 40 hex digits (not a hub commit)."""
        return hashlib.sha1(self.recipe.encode("utf-8")).hexdigest()

    def build(self, directory, variant: recipe.Variant = recipe.BASE) -> dict:
        """Write the files into a new or empty folder: {directory, recipe, variant, revision, files: {name: {size,
        sha256}}, elapsed_s}. SpecimenError before anything is written when the folder is a file or not empty."""
        start, directory = time.perf_counter(), Path(directory)
        check_target(directory)
        contents = self.contents(variant)
        check_target(directory)  # again: making the files takes seconds
        files = {}
        for name, data in contents.items():
            write_bytes_atomic(directory / name, data)
            files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return {"directory": str(directory), "recipe": self.recipe, "variant": variant.describe(),
                "revision": self.revision(), "files": files, "elapsed_s": time.perf_counter() - start}

    def main(self, argv=None) -> int:
        """`python -m inferlab.<name> DIR`: build, print the files' sizes and hashes as JSON; exit 2 with the reason
        when refused."""
        import argparse

        prog = spelled(f"-m inferlab.{self.name}", "python")
        parser = argparse.ArgumentParser(prog=prog, description=f"Build the {self.name} specimen offline (not Pythia).")
        parser.add_argument("directory", help="where to write its files: a new or empty directory")
        args = parser.parse_args(argv)
        try:
            print(json.dumps(self.build(Path(args.directory).expanduser()), indent=2, sort_keys=True))
        except SpecimenError as error:
            print(f"{prog}: refused: {error}", file=sys.stderr)
            return 2
        except OSError as error:  # a target that cannot be created: under a file, under /proc, read-only
            print(f"{prog}: could not write {args.directory}: {error.strerror or error}"
                  f"{f' ({error.filename})' if error.filename else ''}", file=sys.stderr)
            return 2
        return 0


# Bump recipe.VERSION whenever a built byte changes: the recipe names and the revisions follow it.
STANDIN = Builder("standin", f"inferlab-standin-pythia-14m-architecture/recipe-{recipe.VERSION}", standin_contents)
REPLICA = Builder("replica", f"inferlab-replica-pythia-14m-small-files/recipe-{recipe.VERSION}", replica_contents)
BUILDERS = {builder.revision(): builder for builder in (STANDIN, REPLICA)}


# --- a tiny GPT-NeoX for the harness's own tests (never a specimen) ----------------------------------------------

def tiny_gpt_neox(seed: int = 0, **overrides):
    """A seeded, randomly initialised GPT-NeoX of the specimen's family (rotary, parallel residual, untied
    embeddings) that builds in milliseconds: float32, eval mode, eager attention, CPU; overrides set config fields."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    fields = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=256, use_parallel_residual=True,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = GPTNeoXForCausalLM(GPTNeoXConfig(**{**fields, **overrides}))
    finally:
        torch.random.set_rng_state(state)
    return model.to(torch.float32).eval()
