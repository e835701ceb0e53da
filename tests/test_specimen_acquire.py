"""One path to a verified folder: --artifacts or the project cache reused or refused (never a fallback, never
repaired), a synthetic specimen built offline, one lock, no staging left behind, and the next steps when none is had."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import OfflineModeIsEnabled

from inferlab import specimen
from inferlab.measure import loading
from inferlab.specimen import SpecimenError
from inferlab.specimen.netguard import NetworkBlocked, block_network

from child_process import popen_signallable

HANG_GUARD_S = 30
WEIGHTS = "model.safetensors"
REPO_ROOT = Path(__file__).resolve().parents[1]


# --- --artifacts DIR ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_verified_copy_is_reused_offline_with_every_connection_refused_and_loads(standin_dir, standin_spec,
                                                                                    tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(standin_dir, home / "copy")
    monkeypatch.setenv("HOME", str(home))
    with block_network():  # --artifacts DIR --offline: the lab's offline reuse of the Lab 05 copy
        result = specimen.acquire(standin_spec, artifacts_dir="~/copy", cache_root=tmp_path / "cache", offline=True)
        loaded = loading.load_specimen(result["directory"], standin_spec)
    assert (result["acquisition"], result["directory"]) == ("reuse:artifacts_dir", str(home / "copy"))
    assert loaded["model_load"]["model_class"] == "GPTNeoXForCausalLM" and not (tmp_path / "cache").exists()


def flip_byte(directory):
    weights = bytearray((directory / WEIGHTS).read_bytes())
    weights[1_000_000] ^= 1
    (directory / WEIGHTS).write_bytes(weights)
    return [WEIGHTS, "sha256 expected"]


def add_pickle(directory):
    (directory / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    return ["pytorch_model.bin", "weights (name matches a refused pattern)"]


# A pin that fails and a file beside the allowlist; what else verification refuses is test_specimen_check's.
DAMAGES = {"flipped-byte": flip_byte, "pickle-beside": add_pickle}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_a_damaged_copy_is_refused_with_evidence_nothing_else_tried_and_never_loaded(standin_copy, standin_spec,
                                                                                     tmp_path, monkeypatch, case):
    from transformers import GPTNeoXForCausalLM, GPTNeoXTokenizerFast

    def forbidden(*args, **kwargs):
        raise AssertionError("from_pretrained was called on an unverified folder")

    monkeypatch.setattr(GPTNeoXForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(GPTNeoXTokenizerFast, "from_pretrained", forbidden)
    evidence = DAMAGES[case](standin_copy)
    with pytest.raises(SpecimenError) as error:
        specimen.acquire(standin_spec, artifacts_dir=standin_copy, cache_root=tmp_path / "cache")
    assert all(part in str(error.value) for part in evidence) and "nothing else is tried" in str(error.value)
    assert error.value.acquisition == "reuse:artifacts_dir" and not (tmp_path / "cache").exists()
    with pytest.raises(SpecimenError, match=re.escape(str(standin_copy))):
        loading.load_specimen(standin_copy, standin_spec)


# --- the project cache and the offline build ------------------------------------------------------------------


@pytest.mark.slow
def test_a_synthetic_specimen_is_built_offline_once_then_the_project_cache_is_reused(standin_spec, tmp_path):
    with block_network():
        first = specimen.acquire(standin_spec, cache_root=tmp_path, offline=True)
        second = specimen.acquire(standin_spec, cache_root=tmp_path, offline=True)
    assert (first["acquisition"], second["acquisition"]) == ("built_offline", "reuse:project_cache")
    assert first["directory"] == second["directory"] == str(specimen.cache_dir(standin_spec, tmp_path))


def test_a_damaged_project_cache_is_refused_with_its_evidence_not_repaired(standin_dir, standin_spec, tmp_path):
    cached = specimen.cache_dir(standin_spec, tmp_path)
    shutil.copytree(standin_dir, cached)
    shutil.copyfile(cached / "config.json", cached / WEIGHTS)
    outcome = specimen.acquisition_outcome(standin_spec, cache_root=tmp_path, offline=True)
    assert (outcome["ok"], outcome["acquisition"], outcome["directory"]) == (False, "reuse:project_cache", str(cached))
    assert [row["name"] for row in outcome["verification"]["files"] if not row["ok"]] == [WEIGHTS]
    assert f"the project cache {cached} failed verification" in outcome["error"]
    assert f"{WEIGHTS} in {cached}: size expected 28143920 bytes, actual 968 bytes" in outcome["error"]
    assert f"delete that folder (rm -r '{cached}') and run again" in outcome["error"]
    assert (cached / WEIGHTS).stat().st_size == 968  # nothing repaired silently


def test_offline_refuses_hub_calls_restores_the_flags_and_with_an_empty_cache_names_the_files(download_spec, tmp_path):
    before = constants.HF_HUB_OFFLINE
    url = hf_hub_url(download_spec.repo_id, WEIGHTS, revision=download_spec.revision, endpoint="http://127.0.0.1:9")
    with specimen.offline_mode(), pytest.raises((OfflineModeIsEnabled, NetworkBlocked)) as error:
        get_hf_file_metadata(url)
    assert error.type is OfflineModeIsEnabled and constants.HF_HUB_OFFLINE == before
    with block_network():
        outcome = specimen.acquisition_outcome(specimen.load_spec("pythia-14m"), cache_root=tmp_path, offline=True)
    assert outcome["ok"] is False and WEIGHTS in outcome["error"] and "--artifacts DIR" in outcome["error"]
    assert specimen.acquisition_cause(outcome, offline=True) == "--offline, and no verified copy was found"


# --- one lock, and staging never left behind -----------------------------------------------------------------------


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_lock_held_past_the_deadline_is_a_clear_refusal(download_spec, tmp_path):
    cache = specimen.cache_dir(download_spec, tmp_path)
    cache.parent.mkdir(parents=True)
    with FileLock(cache.with_name(cache.name + ".lock")):
        outcome = specimen.acquisition_outcome(download_spec, cache_root=tmp_path, endpoint="http://127.0.0.1:9",
                                               deadline_s=0.5)
    assert outcome["ok"] is False and outcome["deadline_expired"] is True
    assert f"waiting for another run, which holds {cache}.lock" in outcome["error"]


BUILD_STANDIN = """
import filelock  # what acquire imports on its way to the lock, before the parent is told
from inferlab import specimen
print("ready", flush=True)
result = specimen.acquire(specimen.load_spec("standin"), cache_root={cache_root!r}, offline=True)
print(result["acquisition"], result["lock"]["contended"])
"""


@pytest.mark.process
@pytest.mark.timeout(HANG_GUARD_S * 6)
def test_two_runs_filling_one_cache_at_once_both_succeed_the_second_waits_and_reuses(tmp_path):
    """Issue 15.4: without the lock one of them got a raw OSError. The same lock guards a download."""
    script = BUILD_STANDIN.format(cache_root=str(tmp_path))  # run in the checkout, which `-c` puts first on sys.path
    cache = specimen.cache_dir(specimen.load_spec("standin"), tmp_path)
    cache.parent.mkdir(parents=True)
    with FileLock(cache.with_name(cache.name + ".lock")):  # both start while the cache is locked and empty
        children = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT) for _ in range(2)]
        assert [child.stdout.readline() for child in children] == ["ready\n"] * 2  # both about to ask for the lock
    outputs = [child.communicate(timeout=HANG_GUARD_S * 5) for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    (built, _), (reused, waited) = sorted(out.split() for out, _ in outputs)
    assert (built, reused, waited) == ("built_offline", "reuse:project_cache", "True")


DOWNLOAD = """
import dataclasses
from inferlab import specimen
spec = dataclasses.replace(specimen.load_spec("standin"), synthetic=False)
specimen.acquire(spec, cache_root={cache_root!r}, endpoint={endpoint!r}, deadline_s=120)
"""


@pytest.mark.process
@pytest.mark.timeout(HANG_GUARD_S * 2)
def test_ctrl_c_during_a_download_removes_its_staging_and_the_next_run_removes_a_killed_ones(
        serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec, faults={("GET", WEIGHTS): "trickle"})
    cache_root = tmp_path / "cache"
    script = DOWNLOAD.format(cache_root=str(cache_root), endpoint=hub.endpoint)
    child = popen_signallable([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO_ROOT)
    try:
        partial = None
        while partial is None and child.poll() is None:  # wait until the weight file is being received
            partial = next(iter((cache_root / download_spec.name).glob(f".staging-*/{WEIGHTS}")), None)
            time.sleep(0.02)
        assert partial is not None, f"the download never reached the weights: {child.communicate()}"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0 and "KeyboardInterrupt" in stderr and not partial.parent.exists()
    stale = cache_root / download_spec.name / f".staging-{download_spec.revision}-999999"  # as a SIGKILL leaves it
    stale.mkdir()
    result = specimen.acquire(download_spec, cache_root=cache_root, endpoint=serve(standin_dir, download_spec).endpoint)
    assert result["stale_staging_removed"] == [str(stale)] and not stale.exists()


# --- what to do next ---------------------------------------------------------------------------------------------


def test_the_next_steps_describe_a_valid_copy_and_a_synthetic_specimens_never_send_the_learner_to_the_hub():
    spec = specimen.load_spec("pythia-14m")
    fresh = specimen.acquisition_next_steps(spec.as_dict(), "download")
    assert fresh[0].startswith("Use a verified copy of the files: add --artifacts DIR")
    assert all(name in fresh[0] for name in spec.required_files) and spec.expected[WEIGHTS]["sha256"] in fresh[0]
    assert "generation_config.json only if that revision has it" in fresh[0] and "README.md or .gitattributes" in \
        fresh[0]
    given = specimen.acquisition_next_steps(spec.as_dict(), "reuse:artifacts_dir")  # issue 26 B6
    assert given[0].startswith("Your --artifacts copy failed verification") and "add --artifacts" not in given[0]
    for path in ("reuse:artifacts_dir", "built_offline"):
        steps = specimen.acquisition_next_steps(specimen.load_spec("standin").as_dict(), path)
        assert "hub" not in " ".join(steps) and ("make test" in steps[0]) is (path == "built_offline"), path
        assert (path == "built_offline") or "`.venv/bin/python -m inferlab.standin NEWDIR`" in steps[0]
