"""The next steps after a failed acquisition agree with the rules the verification applies."""

from __future__ import annotations

import pytest

from inferlab import specimen
from inferlab.specimen import guidance


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


def test_with_artifacts_given_the_first_step_is_to_fix_that_copy_not_to_add_artifacts():
    """Issue 26 B6: the step used to say 'add --artifacts DIR' to a learner who had passed it."""
    steps = guidance.acquisition_next_steps(specimen.load_spec("pythia-14m").as_dict(), "reuse:artifacts_dir")
    assert steps[0].startswith("Your --artifacts copy failed verification") and "add --artifacts" not in steps[0]
    assert "116a02532db461f91386a5b20f942ff2c8d4de7341e21b55caafc3d7b25f49a1" in steps[0]
    fresh = guidance.acquisition_next_steps(specimen.load_spec("pythia-14m").as_dict(), "download")
    assert fresh[0].startswith("Use a verified copy of the files: add --artifacts DIR")


@pytest.mark.parametrize("name, builder", [("standin", "inferlab.standin"), ("replica", "inferlab.replica")])
def test_a_synthetic_weight_file_is_never_advised_a_download(tmp_path, name, builder):
    """Issue 26 B6: a damaged stand-in used to be told 'run without --artifacts for the bounded download'."""
    from inferlab.specimen import weights

    damaged = tmp_path / "model.safetensors"
    damaged.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    advice = weights.diagnose(damaged, repo_id="inferlab/standin", revision="e65bb29c", pinned_size=10,
                              pinned_sha256="ab" * 32, built_by=builder)["advice"]
    assert "download" not in advice and f"python -m {builder} NEWDIR" in advice


def test_the_files_cell_has_no_stray_full_stop_before_its_count(tmp_path):
    from fixtures_records import build_failed_run, rewrite_records
    from inferlab.reading.runview import RunView
    from inferlab.report import page

    run = build_failed_run(tmp_path / "failed")

    def no_files(records):
        for record in records:
            if record["kind"] == "artifact_acquisition":
                record.update(ok=False, error="expected only the allowlisted files.")
        return [r for r in records if r["kind"] != "artifact_file"]

    rewrite_records(run, no_files)
    cell = page._files_cell(RunView.read(run))
    assert cell.endswith("expected only the allowlisted files; no file was examined"), cell
