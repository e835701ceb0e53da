"""Whole experiment runs in a scratch project: the default run without a hub, tampered copies, the plan."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from inferlab import protocol

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(pytester, monkeypatch):
    """A scratch copy of the experiment (tests, specs, plugin registration) with its own artifact cache."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    shutil.copytree(REPO_ROOT / "experiments", pytester.path / "experiments",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (pytester.path / "artifacts").mkdir()
    for spec in (REPO_ROOT / "artifacts").glob("*.json"):
        shutil.copy(spec, pytester.path / "artifacts" / spec.name)
    shutil.copy(REPO_ROOT / "conftest.py", pytester.path / "conftest.py")
    shutil.copy(REPO_ROOT / "pytest.ini", pytester.path / "pytest.ini")
    return pytester


def closed_loopback_endpoint() -> str:
    """An http endpoint on 127.0.0.1 where nothing listens (the port was just released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def outcome(all_records: list[dict], test_suffix: str) -> dict:
    return next(r for r in all_records if r["kind"] == "test_outcome" and r["test"].endswith(test_suffix))


def test_default_run_without_a_hub_fails_at_acquisition_and_keeps_evidence(project, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_loopback_endpoint())
    result = project.runpytest_subprocess("experiments", "--record-dir", "run")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    run = project.path / "run"
    found = records(run)
    acquisition = next(r for r in found if r["kind"] == "artifact_acquisition")
    assert acquisition["ok"] is False and acquisition["acquisition"] == "download"
    assert "expected the hub endpoint to accept a connection" in acquisition["error"]
    assert "--artifacts" in acquisition["error"]
    load = outcome(found, "test_model_load")
    assert load["outcome"] == "skipped" and "artifacts_verified" in load["skip_reason"]
    trial = outcome(found, "test_generation_trial[P1-G-rep1]")
    assert trial["outcome"] == "skipped"
    assert not [r for r in found if r["kind"] in ("model_load", "generation", "timing_trial")]
    assert not (project.path / "artifacts" / "cache" / "pythia-14m").exists() or not any(
        (project.path / "artifacts" / "cache" / "pythia-14m").rglob("*.safetensors"))
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["exit_status"] == 1
    assert "report.md" in manifest["files"]
    assert "test_acquisition" in (run / "report.md").read_text()


def test_offline_default_run_names_the_missing_files(project):
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "--offline")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    acquisition = next(r for r in records(project.path / "run") if r["kind"] == "artifact_acquisition")
    assert "model.safetensors" in acquisition["error"] and "--artifacts" in acquisition["error"]


def test_tampered_copy_through_artifacts_is_refused_with_evidence(project, tmp_path):
    from inferlab import standin

    copy = tmp_path / "tampered"
    standin.build(copy)
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 0x01
    (copy / "model.safetensors").write_bytes(bytes(weights))
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "--specimen", "standin",
                                          "--artifacts", str(copy))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    found = records(project.path / "run")
    files = {r["name"]: r for r in found if r["kind"] == "artifact_file"}
    assert set(files) == set(protocol.ALLOWLISTED_FILES)
    weight_row = files["model.safetensors"]
    assert weight_row["ok"] is False and weight_row["acquisition"] == "reuse:artifacts_dir"
    assert weight_row["expected_sha256"] in weight_row["problem"] and weight_row["sha256"] in weight_row["problem"]
    assert all(files[name]["ok"] for name in files if name != "model.safetensors")
    assert outcome(found, "test_model_load")["outcome"] == "skipped"
    assert not [r for r in found if r["kind"] == "model_load"]
    # the next steps blame the copy, not the checkout, in the terminal and at the head of the report
    advice = "Your --artifacts copy of the synthetic standin specimen failed verification"
    assert advice in result.stdout.str() and advice in (project.path / "run" / "report.md").read_text()


def test_plan_of_the_real_experiment_matches_the_protocol(project):
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "--plan")
    assert result.ret == pytest.ExitCode.OK
    plan = json.loads((project.path / "run" / "plan.json").read_text())
    assert plan["cap_violations"] == [] and plan["shortfalls"] == []
    totals = plan["totals"]
    assert (totals["generation_trials"], totals["generation_new_tokens"]) == (26, 416)
    assert (totals["timing_warmups"], totals["timing_measured"], totals["timing_selections"]) == (4, 20, 384)
    assert totals["cache_forwards"] <= 16 and (totals["core_trials"], totals["core_selections"]) == (50, 800)
    assert totals["other_forwards"] == 0 and "memory_forwards" not in totals  # issue 26 A3
    ids = [entry["test"].split("[")[-1].rstrip("]") for entry in plan["schedule"]
           if "test_generation_trial" in entry["test"]]
    assert ids == [trial.test_id for trial in protocol.generation_trials()]
    assert [r["kind"] for r in records(project.path / "run")] == ["plan", "session_end"]
    result.stdout.fnmatch_lines(["*test_generation_trial[[]P1-S2-seed23[]]*"])
    from inferlab.verify import verify_run

    checked = verify_run(project.path / "run")  # a plan folder says it is one, and verify knows it
    assert checked["problems"] == [] and checked["plan_folder"] is True
    manifest = json.loads((project.path / "run" / "manifest.json").read_text())
    assert manifest["mode"] == "plan" and manifest["complete"] is False and not (project.path / "run" / "report.md").exists()


REPLAY_SCRIPT = r'''
import json, sys
import torch
from transformers import GenerationConfig, GPTNeoXForCausalLM

directory, records_path, trial_ids = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
torch.set_num_threads(1)
model = GPTNeoXForCausalLM.from_pretrained(directory, local_files_only=True, use_safetensors=True,
                                           trust_remote_code=False, dtype=torch.float32,
                                           attn_implementation="eager").eval()
found = {}
for line in open(records_path):
    record = json.loads(line)
    if record["kind"] == "generation" and record["trial_id"] in trial_ids:
        config = GenerationConfig.from_dict(record["generation_config"])
        if record["seed"] is not None:
            torch.manual_seed(record["seed"])
        with torch.inference_mode():
            output = model.generate(input_ids=torch.tensor([record["prompt_ids"]]),
                                    attention_mask=torch.ones(1, len(record["prompt_ids"]), dtype=torch.long),
                                    generation_config=config, use_model_defaults=False)
        found[record["trial_id"]] = {"recorded": record["generated_ids"],
                                     "replayed": output.sequences[0, len(record["prompt_ids"]):].tolist()}
print(json.dumps(found))
'''


def run_stand_in_subset(project, selection: str) -> tuple[Path, str]:
    """Run the -k selection of the experiment on the stand-in: (record dir, verified specimen directory)."""
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "--specimen", "standin",
                                          "-k", selection)
    assert result.ret == pytest.ExitCode.OK
    run = project.path / "run"
    return run, next(r for r in records(run) if r["kind"] == "artifact_acquisition")["directory"]


def run_script(script: str, *args) -> object:
    """Run a script in a fresh Python process; its last stdout line is JSON."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_stand_in_records_replay_in_a_fresh_process_with_plain_transformers(project):
    run, directory = run_stand_in_subset(project, "test_10_specimen or test_20_inputs or test_generation_trial")
    assert len([r for r in records(run) if r["kind"] == "generation"]) == len(protocol.generation_trials())
    trial_ids = ["P1-G-rep1", "P1-S2-seed23", "P2-S3-seed31", "P2-S1-seed17-rerun"]
    found = run_script(REPLAY_SCRIPT, directory, run / "records.jsonl", ",".join(trial_ids))
    assert sorted(found) == sorted(trial_ids)
    for trial_id, ids in found.items():
        assert ids["replayed"] == ids["recorded"], trial_id


RECOMPUTE_SCRIPT = r'''
import json, sys
import torch
from safetensors.torch import load_file
from transformers import GPTNeoXForCausalLM

directory, run_dir, atol, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
torch.set_num_threads(1)
model = GPTNeoXForCausalLM.from_pretrained(directory, local_files_only=True, use_safetensors=True,
                                           trust_remote_code=False, dtype=torch.float32,
                                           attn_implementation="eager").eval()
stored = load_file(run_dir + "/tensors/cache_logits.safetensors")
rows = []
for line in open(run_dir + "/records.jsonl"):
    record = json.loads(line)
    if record["kind"] != "cache_comparison":
        continue
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([record["prefix_ids"]]), use_cache=False).logits[0, -1]
    uncached = stored[record["tensors"]["uncached"]["key"]]
    rows.append({"prefix_length": record["prefix_length"],
                 "max_abs_diff": float((logits - uncached).abs().max()),
                 "bound": float((atol + rtol * uncached.abs()).min())})
print(json.dumps(rows))
'''


def test_stand_in_uncached_logits_agree_with_an_independent_recomputation(project):
    """A fresh process with plain transformers recomputes each recorded uncached prefix's last logits."""
    run, directory = run_stand_in_subset(project, "test_10_specimen or test_20_inputs or P1-G-rep1 or test_40_cache")
    tolerance = protocol.CACHE_TOLERANCE
    rows = run_script(RECOMPUTE_SCRIPT, directory, run, tolerance.atol, tolerance.rtol)
    assert 1 <= len(rows) <= protocol.CACHE_MAX_TARGET_TOKENS
    for row in rows:  # the criterion's tightest bound anywhere in the vector: stricter than element by element
        assert row["max_abs_diff"] <= row["bound"], (row, tolerance.describe())


def test_two_stand_in_runs_compare_with_every_generated_id_equal(project):
    from inferlab.compare import compare

    selection = ["-k", "test_10_specimen or test_20_inputs or test_generation_trial"]
    for name in ("first", "second"):
        result = project.runpytest_subprocess("experiments", "--record-dir", name, "--specimen", "standin", *selection)
        assert result.ret == pytest.ExitCode.OK
    comparison = compare(project.path / "first", project.path / "second")
    rows = comparison["generation"]
    assert len(rows) == len(protocol.generation_trials())
    assert all(row["equal"] for row in rows), [row for row in rows if not row["equal"]]


def test_offline_stand_in_run_needs_no_network_and_proves_the_block(project):
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "--specimen", "standin", "--offline",
                                          "-k", "test_10_specimen or test_20_inputs or P1-G-rep1")
    assert result.ret == pytest.ExitCode.OK
    found = records(project.path / "run")
    guard = next(r for r in found if r["kind"] == "offline_guard")
    assert guard["offline"] is True and "network access blocked" in guard["outcome"]
    assert next(r for r in found if r["kind"] == "generation")["status"] == "ok"
    manifest = json.loads((project.path / "run" / "manifest.json").read_text())
    assert manifest["options"]["network_blocked_for_session"] is True


# --- the newcomer's first failure, and partial runs (issues 17.2, 15.2, 15.3, 15.12) -------------------


def test_without_a_hub_the_reason_is_printed_once_in_full_with_the_next_steps(project, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_loopback_endpoint())
    result = project.runpytest_subprocess("experiments", "--record-dir", "run")
    output = result.stdout.str() + result.stderr.str()
    found = records(project.path / "run")
    error = next(r for r in found if r["kind"] == "artifact_acquisition")["error"]
    assert output.count("Connection refused") == 1 and error in output
    skip_reason = outcome(found, "test_model_load")["skip_reason"]  # the records keep every reason uncut
    assert error in skip_reason and len(skip_reason) > 300
    from inferlab import guidance, specimen

    steps = guidance.acquisition_next_steps(specimen.load_spec("pythia-14m").as_dict())
    lines = result.stdout.lines
    start = lines.index("Next steps:")
    assert [line.strip() for line in lines[start + 1:start + 1 + len(steps)]] == \
        [f"{n}. {step}" for n, step in enumerate(steps, start=1)]
    assert lines.index("Next steps:") > next(i for i, line in enumerate(lines) if error in line)
    planned = len(json.loads((project.path / "run" / "plan.json").read_text())["schedule"])
    # the status line comes after pytest's own counts: the last line of the output (issue 26 A7)
    assert result.stdout.lines[-2].startswith("=") and "1 failed" in result.stdout.lines[-2]
    assert result.stdout.lines[-1].startswith(f"inferlab: the session reached its end: all {planned} planned tests")
    assert "the HARNESS FAILED: 1 harness-integrity check(s)" in result.stdout.lines[-1]


def plan_of(project, *args) -> tuple[dict, object]:
    result = project.runpytest_subprocess("--record-dir", "plan", "--plan", *args)
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    return json.loads((project.path / "plan" / "plan.json").read_text()), result


def test_a_keyword_selection_is_a_partial_plan_counted_per_protocol_part(project):
    plan, result = plan_of(project, "experiments", "-k", "test_10_specimen")
    assert plan["protocol_complete"] is False
    deselected = sum(part["collected"] - part["planned"] for part in plan["parts"] if not part["optional"])
    assert plan["partial_reasons"][0] == f"-k 'test_10_specimen' deselected {deselected} protocol test(s)"
    core = [part for part in plan["parts"] if not part["optional"] and part["file"] != "experiments/test_10_specimen.py"]
    for part in core:  # every core part is counted, not only generation and timing
        assert any(s.startswith(f"{part['file']} (") and f"0 of its {part['collected']} tests planned" in s
                   for s in plan["shortfalls"]), (part, plan["shortfalls"])
    assert plan["optional_left_out"] and "test_70_batching.py" in plan["optional_left_out"][0]
    end = [r for r in records(project.path / "plan") if r["kind"] == "session_end"][0]
    assert end["plan_only"] is True and end["complete"] is False
    result.stdout.fnmatch_lines(["inferlab: a PLAN only (12 tests planned)*PARTIAL, not the complete protocol: -k*"])


def test_one_experiment_file_alone_is_a_partial_plan(project):
    plan, _ = plan_of(project, "experiments/test_30_sampling.py")
    assert "the command named experiments/test_30_sampling.py instead of the whole experiments folder" \
        in plan["partial_reasons"]
    assert any(s.startswith("experiments/test_40_cache.py (") and "not collected" in s for s in plan["shortfalls"])


def test_leaving_out_only_the_optional_batching_keeps_the_protocol_complete(project):
    plan, _ = plan_of(project, "experiments", "-m", "not batching")
    assert plan["protocol_complete"] is True and plan["partial_reasons"] == []
    assert len(plan["optional_left_out"]) == 1 and "deselected" in plan["optional_left_out"][0]


def test_last_failed_after_a_failed_run_is_partial_and_never_complete(project, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_loopback_endpoint())
    first = project.runpytest_subprocess("experiments", "--record-dir", "first", "-p", "cacheprovider")
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    again = project.runpytest_subprocess("experiments", "--record-dir", "again", "--lf")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    end = [r for r in records(project.path / "again") if r["kind"] == "session_end"][0]
    assert end["tests_planned"] == 1 and end["complete"] is False
    assert end["partial_reasons"][0] == "--lf: only the tests that failed last time were collected and run"
    manifest = json.loads((project.path / "again" / "manifest.json").read_text())
    assert manifest["complete"] is False and "PARTIAL" in manifest["status"]
    again.stdout.fnmatch_lines(["inferlab: *PARTIAL, not the complete protocol: --lf*"])


def test_no_experiment_spends_forwards_outside_the_protocols_budget():
    """Issue 26 A3: the budget is the trials, the cache test's 16 forwards and the batching calls; anything else
    (such as an extra prefill to weigh a cache) is a cap violation, and the experiments declare none."""
    import ast

    from inferlab import plan

    categories = set()
    for path in (REPO_ROOT / "experiments").glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "budget":
                categories |= {ast.unparse(k.value) for k in node.keywords if k.arg == "category"}
    # test_50_timing names its category with a variable that is either timing category
    assert categories == {"'generation'", "category", "'cache'", "'batching'"}
    extra = {"index": 0, "test": "x", "budget": {"category": "memory", "forwards": 2}}
    totals = plan.plan_totals([extra])
    assert totals["other_forwards"] == 2 and "memory_forwards" not in totals
    assert protocol.cap_violations(totals) == ["other_forwards: planned 2, protocol allows at most 0"]


def test_a_selection_without_its_prerequisites_says_which_tests_to_add_and_points_at_the_test(project):
    """Issue 26 B3: `-k cache` used to skip everything with "prerequisite 'model_inspection' has not run",
    located in inferlab/plugin.py."""
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "--specimen", "standin", "-k", "cache",
                                          "-rs")
    found = records(project.path / "run")
    skipped = outcome(found, "test_cache_criterion_declared")
    reason = skipped["skip_reason"]
    assert skipped["outcome"] == "skipped" and "prerequisite 'model_inspection' has not run" in reason
    assert "-k 'cache' deselected them" in reason and "test_model_inspection" in reason
    assert "-k 'cache or test_thread_controls or test_acquisition or test_artifact_file or " in reason
    out = result.stdout.str()
    assert "inferlab/plugin.py" not in out and "experiments/test_40_cache.py:" in out


def test_one_file_alone_is_told_which_files_to_name_too(project):
    project.runpytest_subprocess("experiments/test_40_cache.py", "--record-dir", "run", "--specimen", "standin")
    reason = outcome(records(project.path / "run"), "test_cache_criterion_declared")["skip_reason"]
    assert "the command named only experiments/test_40_cache.py" in reason
    assert "to include them: name experiments/test_10_specimen.py too" in reason


@pytest.mark.parametrize("value", ["1", "true"])
def test_the_hubs_offline_variable_is_honoured_as_offline_and_recorded_so(project, monkeypatch, value):
    """Issue 26 B7: HF_HUB_OFFLINE=1 used to be ignored: the run still connected."""
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    result = project.runpytest_subprocess("experiments", "--record-dir", "run", "-k", "test_network_guard")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    manifest = json.loads((project.path / "run" / "manifest.json").read_text())
    assert manifest["options"]["offline"] is True and manifest["options"]["offline_from"] == f"HF_HUB_OFFLINE={value}"
    assert manifest["options"]["network_blocked_for_session"] is True
    guard = next(r for r in records(project.path / "run") if r["kind"] == "offline_guard")
    assert guard["offline"] is True and guard["outcome"].startswith("blocked")


def test_the_offline_variable_is_read_as_huggingface_hub_reads_it():
    from huggingface_hub.constants import _is_true

    from inferlab.run import options

    for value in ("1", "0", "true", "TRUE", "yes", "on", "no", "", "2", "false"):
        assert options.offline_setting(False, {"HF_HUB_OFFLINE": value})[0] is _is_true(value), value
    assert options.offline_setting(False, {"TRANSFORMERS_OFFLINE": "1"}) == (True, "TRANSFORMERS_OFFLINE=1")
    assert options.offline_setting(True, {}) == (True, "--offline") and options.offline_setting(False, {}) == (False, None)
