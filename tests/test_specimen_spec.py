"""Specimen specs: the shipped ones pin what the protocol says, and a spec that departs from it is refused by name."""

from __future__ import annotations

import json

import pytest

from inferlab import protocol, specimen
from inferlab.specimen import SpecimenError


def test_the_shipped_specs_pin_the_protocols_allowlist_cap_and_publisher_weights_and_a_third_is_a_json_file(tmp_path):
    for path in sorted(specimen.DEFAULT_ARTIFACTS_ROOT.glob("*.json")):
        spec = specimen.load_spec(path.stem)
        assert spec.files == protocol.ALLOWLISTED_FILES and spec.bundle_cap_bytes == protocol.BUNDLE_CAP_BYTES
        assert spec.optional_files == ("generation_config.json",), path
    pythia = specimen.load_spec("pythia-14m")
    assert (pythia.repo_id, pythia.revision, pythia.synthetic) == (protocol.PINNED_REPO_ID, protocol.PINNED_REVISION,
                                                                   False)
    assert pythia.expected["model.safetensors"] == {
        "size": 28_143_920, "sha256": "116a02532db461f91386a5b20f942ff2c8d4de7341e21b55caafc3d7b25f49a1"}
    # the published small files' hashes are informational only: their pins stay null, a differing copy is not refused
    assert sorted(pythia.reference["files"]) == sorted(set(protocol.ALLOWLISTED_FILES) - {
        "generation_config.json", "model.safetensors"})
    assert all(pythia.expected[name] == {"size": None, "sha256": None} for name in pythia.reference["files"])
    data = json.loads((specimen.DEFAULT_ARTIFACTS_ROOT / "standin.json").read_text())
    (tmp_path / "third.json").write_text(json.dumps({**data, "description": "another specimen"}))
    assert specimen.load_spec("third", tmp_path).description == "another specimen"


BAD_SPECS = {
    "unknown-name": (None, "nowhere.json: expected a specimen spec file, actual: missing"),
    "not-json": ("{not json", "unreadable"),
    "missing-field": (lambda d: d.pop("expected"), "missing ['expected']"),
    "unknown-key": (lambda d: d.update(mirror="https://example.org"), "actual extra ['mirror']"),
    "branch-revision": (lambda d: d.update(revision="main"), "revision: expected a 40-hex commit hash, actual 'main'"),
    "allowlist-differs": (lambda d: d["files"].__setitem__(0, "pytorch_model.bin"), "files: expected the allowlist"),
    "cap-above-protocol": (lambda d: d.update(bundle_cap_bytes=protocol.BUNDLE_CAP_BYTES + 1),
                           "bundle_cap_bytes: expected an int"),
    "required-file-listed-optional": (lambda d: d.update(optional_files=["config.json"]),
                                      "optional_files: expected a list drawn from"),
    "required-file-pinned-absent": (lambda d: d["expected"].update({"config.json": {"absent": True}}),
                                    "expected[config.json]: pinned absent, but config.json is required"),
    "absent-false": (lambda d: d["expected"].update({"generation_config.json": {"absent": False}}),
                     "expected[generation_config.json].absent: expected true"),
    "weights-unpinned": (lambda d: d["expected"].update({"model.safetensors": {"size": 1, "sha256": None}}),
                         "expected[model.safetensors]: expected a pinned size and sha256"),
    "reference-branch": (lambda d: d.update(reference={"revision": "main", "note": "", "files": {}}),
                         "reference.revision: expected a 40-hex commit hash"),
    "reference-unknown-file": (lambda d: d.update(reference={"revision": "0" * 40, "note": "", "files": {"x": {}}}),
                               "reference.files: expected allowlisted names"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_a_spec_departing_from_the_protocol_is_refused_naming_its_file(tmp_path, case):
    change, message = BAD_SPECS[case]
    data = json.loads((specimen.DEFAULT_ARTIFACTS_ROOT / "standin.json").read_text())
    if callable(change):
        change(data)
    if change is not None:
        (tmp_path / f"{case}.json").write_text(change if isinstance(change, str) else json.dumps(data))
    name = case if change is not None else "nowhere"
    with pytest.raises(SpecimenError) as error:
        specimen.load_spec(name, tmp_path)
    assert f"{name}.json" in str(error.value) and message in str(error.value), str(error.value)
