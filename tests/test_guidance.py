"""The next steps after a failed acquisition agree with the rules the verification applies."""

from __future__ import annotations

from inferlab import guidance, specimen


def test_a_valid_copy_is_described_as_the_verification_accepts_it():
    spec = specimen.load_spec("pythia-14m")
    text = guidance.acquisition_next_steps(spec.as_dict())[0]
    assert all(name in text for name in spec.required_files)
    assert "generation_config.json only if that revision has it" in text  # optional, probably absent
    assert "README.md or .gitattributes" in text and "exactly the 6" not in text
    assert spec.expected["model.safetensors"]["sha256"] in text


def test_a_refused_copy_of_a_synthetic_specimen_points_at_the_copy_not_the_harness():
    steps = guidance.acquisition_next_steps(specimen.load_spec("standin").as_dict(), "reuse:artifacts_dir")
    assert "--artifacts copy" in steps[0] and "`.venv/bin/python -m inferlab.standin NEWDIR`" in steps[0]
    built = guidance.acquisition_next_steps(specimen.load_spec("standin").as_dict(), "built_offline")
    assert "make test" in built[0]
