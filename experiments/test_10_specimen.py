"""Part 2: the bounded specimen, its verification, and loading under the protocol's controls."""

import pytest

from inferlab import protocol
from inferlab.specimen import ACQUISITION_LABELS


@pytest.mark.records("thread_controls")
@pytest.mark.provides("thread_controls")
def test_thread_controls(thread_controls, record):
    record("thread_controls", **thread_controls)
    assert thread_controls["matches"], (
        f"threads: requested {thread_controls['requested']}, effective {thread_controls['effective']}; "
        f"errors {thread_controls['errors']}"
    )


@pytest.mark.records("offline_guard")
def test_network_guard_matches_the_offline_option(pytestconfig, record):
    """With --offline every connection is refused for the whole session, loopback included; without it, none is."""
    import socket

    from inferlab.specimen.netguard import NetworkBlocked

    offline = pytestconfig.getoption("inferlab_offline")
    probe = ("127.0.0.1", 9)  # loopback discard port: nothing leaves the machine either way
    try:
        socket.create_connection(probe, timeout=1).close()
        outcome = "connected"
    except NetworkBlocked as error:
        outcome = f"blocked: {error}"
    except OSError as error:
        outcome = f"reached the network stack: {type(error).__name__}"
    record("offline_guard", offline=offline, probe=f"connect {probe[0]}:{probe[1]}", outcome=outcome)
    assert outcome.startswith("blocked") == offline, f"--offline={offline}, but the probe was {outcome}"


@pytest.mark.records("specimen", "artifact_acquisition", "phase")
@pytest.mark.provides("acquisition", "artifacts_verified")
def test_acquisition(specimen_spec, acquisition, record):
    record("specimen", **specimen_spec.as_dict())
    record("artifact_acquisition", **{k: v for k, v in acquisition.items() if k != "verification"},
           synthetic=specimen_spec.synthetic)
    if acquisition["ok"]:
        record("phase", name="artifact_acquisition", elapsed_s=acquisition["elapsed_s"],
               label=ACQUISITION_LABELS[acquisition["acquisition"]])
    assert acquisition["ok"], f"acquisition ({acquisition['acquisition']}) failed: {acquisition['error']}"


@pytest.mark.records("artifact_file")
@pytest.mark.provides("artifacts_verified")
@pytest.mark.parametrize("name", protocol.ALLOWLISTED_FILES)
def test_artifact_file(name, specimen_spec, acquisition, verification, record):
    if verification is None:
        pytest.skip(f"not run: acquisition left no directory to verify ({acquisition['error']})")
    row = next((r for r in verification["files"] if r["name"] == name), None)
    assert row is not None, f"{name}: not examined; verification problems: {verification['problems']}"
    record("artifact_file", **row, acquisition=acquisition["acquisition"], directory=verification["directory"],
           specimen=specimen_spec.name, synthetic=specimen_spec.synthetic)
    assert row["ok"], row["problem"]


@pytest.mark.records("artifact_directory")
@pytest.mark.provides("artifacts_verified")
def test_no_files_besides_the_allowlist(acquisition, verification, record):
    """Every entry of the folder is recorded with its verdict; anything refused (README's rule) fails."""
    if verification is None:
        pytest.skip(f"not run: acquisition left no directory to verify ({acquisition['error']})")
    record("artifact_directory", directory=verification["directory"], extra_files=verification["extra_files"],
           entries=verification["entries"], bundle_bytes=verification["bundle_bytes"])
    assert not verification["extra_files"], (
        f"{verification['directory']}: expected only the allowlisted files (plus README.md, .gitattributes and "
        f"huggingface_hub's .cache/huggingface/ bookkeeping), actual refused {verification['extra_files']}"
    )


@pytest.mark.records("model_load", "phase")
@pytest.mark.requires("artifacts_verified", "thread_controls")
@pytest.mark.provides("model_load")
def test_model_load(loaded_specimen, specimen_spec, record):
    load = loaded_specimen["model_load"]
    record("model_load", **load, specimen=specimen_spec.name, synthetic=specimen_spec.synthetic)
    record("phase", name="model_and_tokenizer_load", elapsed_s=load["elapsed_s"],
           label="from_pretrained(model) start to tokenizer loaded, from the verified local directory")
    assert load["tokenizer"]["is_fast"], f"tokenizer: expected a fast tokenizer, actual {load['tokenizer']['class']}"
    assert load["training"] is False, "model.training: expected False after eval(), actual True"
    assert not load["load_problems"], (
        "the weights were not loaded from the checkpoint as they are: " + "; ".join(load["load_problems"])
    )


# Every test that runs or measures the model requires this check: a model off the CPU, not in
# float32, without eager attention or in training mode stops them, with the violations on record.
@pytest.mark.records("model_inspection")
@pytest.mark.requires("model_load")
@pytest.mark.provides("model_inspection")
def test_model_inspection(model, acquisition, specimen_spec, record):
    from inferlab.measure import loading

    inspection = loading.inspect_model(model, acquisition["directory"], specimen_spec.architecture)
    record("model_inspection", **inspection)
    assert not inspection["violations"], "outside the controls: " + "; ".join(inspection["violation_summary"])
