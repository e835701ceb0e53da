"""A tiny specimen on disk (the six allowlisted files) and its spec, for loading it rightly or wrongly on purpose."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from inferlab.specimen.build import ENDOFTEXT, tiny_gpt_neox

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_SPEC_NAME = "tiny"
TINY_CORPUS = ("The quick brown fox jumps over the lazy dog.", "A small boat sailed across a quiet lake.",
               "Notebooks, windows, tables and chairs lay beside the door.",
               "Tabs\tand\nnewlines, caf\u00e9s and numbers 0123456789.")


def tiny_tokenizer(vocab_size: int = 300):
    """A small byte-level BPE fast tokenizer with "<|endoftext|>" at id 0 and no pad token, like the specimen's."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TINY_CORPUS, vocab_size=vocab_size, min_frequency=1, special_tokens=[ENDOFTEXT],
                            show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, unk_token=ENDOFTEXT)


def build_tiny_specimen(directory: Path, drop: tuple = (), extra: tuple = ()) -> Path:
    """Write a tiny GPT-NeoX checkpoint and tokenizer to directory; drop or add weight tensors by name."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPTNeoXTokenizerFast

    directory = Path(directory)
    backend = tiny_tokenizer()
    tokenizer = GPTNeoXTokenizerFast(tokenizer_object=backend.backend_tokenizer, bos_token=ENDOFTEXT,
                                     eos_token=ENDOFTEXT, unk_token=ENDOFTEXT)
    model = tiny_gpt_neox(vocab_size=len(tokenizer))
    model.config.architectures = ["GPTNeoXForCausalLM"]
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    if drop or extra:
        weights = load_file(directory / "model.safetensors")
        for name in drop:
            del weights[name]
        for name in extra:
            weights[name] = torch.zeros(3)
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def write_spec(artifacts_dir: Path, specimen_dir: Path, name: str = TINY_SPEC_NAME) -> Path:
    """artifacts_dir/<name>.json pinning every file of specimen_dir as it is now (synthetic, not Pythia)."""
    template = json.loads((REPO_ROOT / "artifacts" / "standin.json").read_text())
    expected = {}
    for file_name in template["files"]:
        data = (Path(specimen_dir) / file_name).read_bytes()
        pin = template["expected"][file_name]
        expected[file_name] = {**pin, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    config = json.loads((Path(specimen_dir) / "config.json").read_text())
    architecture = {field: config.get(field) for field in template["architecture"]}  # the tiny one's own
    spec = {**template, "repo_id": "inferlab/tiny-test-specimen", "revision": "0" * 40,
            "description": "A tiny random GPT-NeoX written by the harness's tests; not Pythia.",
            "synthetic": True, "expected": expected, "architecture": architecture}
    path = Path(artifacts_dir) / f"{name}.json"
    path.write_text(json.dumps(spec, indent=2))
    return path
