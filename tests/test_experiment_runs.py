"""Whole experiment runs in a scratch project: the runs `make test` checks, the default run without a hub,
tampered copies, the plan.

Runs of one configuration are made once per session (shared_runs) and read by every test that needs them;
plans, and selections that load no model, run in process."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from inferlab import protocol
from shared_runs import REPO_ROOT, experiment_once, inferlab_command, records

pytestmark = pytest.mark.process


def closed_loopback_endpoint() -> str:
    """An http endpoint on 127.0.0.1 where nothing listens (the port was just released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def outcome(all_records: list[dict], test_suffix: str) -> dict:
    return next(r for r in all_records if r["kind"] == "test_outcome" and r["test"].endswith(test_suffix))


def acquired_directory(run_dir: Path) -> str:
    """The verified specimen directory a run used (its artifact_acquisition record)."""
    return next(r for r in records(run_dir) if r["kind"] == "artifact_acquisition")["directory"]


# --- the runs `make test` used to make and check in steps of its own -------------------------------------


@pytest.mark.process
def test_the_make_test_stand_in_run_verifies_and_its_report_regenerates(standin_run):
    """`pytest experiments --specimen standin --record-dir D` (the session's shared run, default acquisition) passed;
    `inferlab verify D` and `inferlab report D --check` each exit 0 with their OK line (the command's own main(), in
    this process: the installed command in a new one is tests/test_installation.py's). The replica's run is
    tests/test_replica_runs.py's."""
    run = standin_run
    status, printed = inferlab_command("verify", run)
    assert status == 0 and printed.splitlines()[-1].startswith("verify: OK ("), printed
    status, printed = inferlab_command("report", run, "--check")
    assert status == 0 and printed.splitlines()[-1] == (
        f"report: regenerated text is identical to report.md in {run}"), printed
    acquisition = next(r for r in records(run) if r["kind"] == "artifact_acquisition")
    assert acquisition["acquisition"] == "built_offline" and acquisition["ok"] is True
    assert Path(acquisition["directory"]).is_relative_to(run.parent / "artifacts" / "cache")  # never the checkout's


# --- the default specimen without a hub: one run, read by three tests ------------------------------------


@pytest.fixture(scope="module")
def no_hub(tmp_path_factory):
    """The default run where the hub endpoint accepts no connection (cacheprovider on, for the --lf test): an inner
    session of this worker, since the acquisition reads HF_ENDPOINT when it runs (specimen.hub.resolve_endpoint)."""
    return experiment_once(tmp_path_factory, "no-hub", "-p", "cacheprovider",
                           env={"HF_ENDPOINT": closed_loopback_endpoint()}, here=True)


def test_default_run_without_a_hub_fails_at_acquisition_and_keeps_evidence(no_hub):
    assert no_hub.returncode == pytest.ExitCode.TESTS_FAILED, no_hub.tail()
    run = no_hub.run
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
    assert not (no_hub.project / "artifacts" / "cache" / "pythia-14m").exists() or not any(
        (no_hub.project / "artifacts" / "cache" / "pythia-14m").rglob("*.safetensors"))
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["exit_status"] == 1
    assert "report.md" in manifest["files"]
    assert "test_acquisition" in (run / "report.md").read_text()


def test_grade_of_a_run_whose_acquisition_failed_gives_the_one_cause(no_hub):
    status, printed = inferlab_command("grade", no_hub.run)
    failing = [line for line in printed.splitlines() if line.strip().startswith("FAIL")]
    machine = [line for line in failing if "nothing was measured: the specimen could not be acquired" in line]
    assert status == 1 and len(machine) == 5, printed  # one line for each of items 2 to 6, the same cause
    assert "expected the hub endpoint to accept a connection" in machine[0]


def test_offline_default_run_names_the_missing_files(project):
    result = project.runpytest("experiments", "--record-dir", "run", "--offline")  # stops at acquisition: in process
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    acquisition = next(r for r in records(project.path / "run") if r["kind"] == "artifact_acquisition")
    assert "model.safetensors" in acquisition["error"] and "--artifacts" in acquisition["error"]


def test_tampered_copy_through_artifacts_is_refused_with_evidence(project, tmp_path):
    from inferlab.specimen.build import STANDIN

    copy = tmp_path / "tampered"
    STANDIN.build(copy)
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 0x01
    (copy / "model.safetensors").write_bytes(bytes(weights))
    # refused at verification, so no model is loaded: in process
    result = project.runpytest("experiments", "--record-dir", "run", "--specimen", "standin", "--artifacts", str(copy))
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
    result = project.runpytest("experiments", "--record-dir", "run", "--plan")  # a plan loads no model: in process
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
    from inferlab.read.verify import verify_run

    checked = verify_run(project.path / "run")  # a plan folder says it is one, and verify knows it
    assert checked["problems"] == [] and checked["plan_folder"] is True
    manifest = json.loads((project.path / "run" / "manifest.json").read_text())
    assert manifest["mode"] == "plan" and manifest["complete"] is False and not (project.path / "run" / "report.md").exists()


def replay_with_plain_transformers(directory: str, run_dir: Path, trial_ids: list[str]) -> dict:
    """Trials replayed, and every recorded uncached prefix's last logits recomputed, by plain transformers calls
    on the run's own specimen copy: none of the harness's code, in this worker (its torch threads are the
    protocol's, tests/conftest.py; a Python of its own reproducing every id is test_grade's bundle comparison)."""
    import torch
    from safetensors.torch import load_file
    from transformers import GenerationConfig, GPTNeoXForCausalLM

    tolerance = protocol.CACHE_TOLERANCE
    model = GPTNeoXForCausalLM.from_pretrained(directory, local_files_only=True, use_safetensors=True,
                                               trust_remote_code=False, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    stored = load_file(run_dir / "tensors" / "cache_logits.safetensors")
    replayed, recomputed = {}, []
    for record in records(run_dir):
        if record["kind"] == "generation" and record["trial_id"] in trial_ids:
            config = GenerationConfig.from_dict(record["generation_config"])
            if record["seed"] is not None:
                torch.manual_seed(record["seed"])
            with torch.inference_mode():
                output = model.generate(input_ids=torch.tensor([record["prompt_ids"]]),
                                        attention_mask=torch.ones(1, len(record["prompt_ids"]), dtype=torch.long),
                                        generation_config=config, use_model_defaults=False)
            replayed[record["trial_id"]] = {"recorded": record["generated_ids"],
                                            "replayed": output.sequences[0, len(record["prompt_ids"]):].tolist()}
        elif record["kind"] == "cache_comparison":
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([record["prefix_ids"]]), use_cache=False).logits[0, -1]
            uncached = stored[record["tensors"]["uncached"]["key"]]
            recomputed.append({"prefix_length": record["prefix_length"],
                               "max_abs_diff": float((logits - uncached).abs().max()),
                               "bound": float((tolerance.atol + tolerance.rtol * uncached.abs()).min())})
    return {"replayed": replayed, "recomputed": recomputed}


REPLAYED_TRIALS = ["P1-G-rep1", "P1-S2-seed23", "P2-S3-seed31", "P2-S1-seed17-rerun"]


@pytest.fixture(scope="module")
def plain_transformers(standin_run):
    """Four trials of the stand-in run replayed with plain transformers, its uncached prefixes recomputed."""
    return replay_with_plain_transformers(acquired_directory(standin_run), standin_run, REPLAYED_TRIALS)


def test_stand_in_records_replay_with_plain_transformers(standin_run, plain_transformers):
    """A recorded trial of every condition (greedy, and seeded sampling under S1, S2, S3) is enough to replay it
    with plain transformers: its generation config, prompt ids and seed."""
    conditions = {trial.condition for trial in protocol.generation_trials() if trial.test_id in REPLAYED_TRIALS}
    assert conditions == set(protocol.CONDITIONS)
    assert len([r for r in records(standin_run) if r["kind"] == "generation"]) == len(protocol.generation_trials())
    found = plain_transformers["replayed"]
    assert sorted(found) == sorted(REPLAYED_TRIALS)
    for trial_id, ids in found.items():
        assert ids["replayed"] == ids["recorded"], trial_id


def test_stand_in_uncached_logits_agree_with_an_independent_recomputation(plain_transformers):
    """Plain transformers recomputes each recorded uncached prefix's last logits."""
    tolerance = protocol.CACHE_TOLERANCE
    rows = plain_transformers["recomputed"]
    assert 1 <= len(rows) <= protocol.CACHE_MAX_TARGET_TOKENS
    for row in rows:  # the criterion's tightest bound anywhere in the vector: stricter than element by element
        assert row["max_abs_diff"] <= row["bound"], (row, tolerance.describe())


# --- the newcomer's first failure, and partial runs (issues 17.2, 15.2, 15.3, 15.12) -------------------


def test_without_a_hub_the_reason_is_printed_once_in_full_with_the_next_steps(no_hub):
    output = no_hub.stdout + no_hub.stderr
    found = records(no_hub.run)
    error = next(r for r in found if r["kind"] == "artifact_acquisition")["error"]
    assert output.count("Connection refused") == 1 and error in output
    skip_reason = outcome(found, "test_model_load")["skip_reason"]  # the records keep every reason uncut
    assert error in skip_reason and len(skip_reason) > 300
    from inferlab import specimen

    steps = specimen.acquisition_next_steps(specimen.load_spec("pythia-14m").as_dict())
    lines = no_hub.lines
    start = lines.index("Next steps:")
    assert [line.strip() for line in lines[start + 1:start + 1 + len(steps)]] == \
        [f"{n}. {step}" for n, step in enumerate(steps, start=1)]
    assert lines.index("Next steps:") > next(i for i, line in enumerate(lines) if error in line)
    planned = len(json.loads((no_hub.run / "plan.json").read_text())["schedule"])
    # the status line comes after pytest's own counts: the last line of the output (issue 26 A7)
    assert lines[-2].startswith("=") and "1 failed" in lines[-2]
    # a failed acquisition is its own ending, not a broken harness (issue 34 item 2)
    assert lines[-1].startswith(f"inferlab: NOTHING was measured: the specimen could not be acquired (no connection "
                                f"to the hub); the session reached its end: all {planned} planned tests")
    assert "HARNESS" not in lines[-1]


def plan_of(project, *args) -> tuple[dict, object]:
    result = project.runpytest("--record-dir", "plan", "--plan", *args)  # a plan loads no model: in process
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


def test_last_failed_after_a_failed_run_is_partial_and_never_complete(no_hub, pytester, monkeypatch):
    """The no-hub run failed with the cache provider on; --lf in a copy of its project (its .pytest_cache too)
    runs in process: the one test it selects fails at acquisition again, without loading a model."""
    assert no_hub.returncode == pytest.ExitCode.TESTS_FAILED, no_hub.tail()
    shutil.copytree(no_hub.project, pytester.path, dirs_exist_ok=True)
    monkeypatch.setenv("HF_ENDPOINT", closed_loopback_endpoint())
    again = pytester.runpytest("experiments", "--record-dir", "again", "--lf")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    end = [r for r in records(pytester.path / "again") if r["kind"] == "session_end"][0]
    assert end["tests_planned"] == 1 and end["complete"] is False
    assert end["partial_reasons"][0] == "--lf: only the tests that failed last time were collected and run"
    manifest = json.loads((pytester.path / "again" / "manifest.json").read_text())
    assert manifest["complete"] is False and "PARTIAL" in manifest["status"]
    again.stdout.fnmatch_lines(["inferlab: *PARTIAL, not the complete protocol: --lf*"])


def test_no_experiment_spends_forwards_outside_the_protocols_budget():
    """Issue 26 A3: the budget is the trials, the cache test's 16 forwards and the batching calls; anything else
    (such as an extra prefill to weigh a cache) is a cap violation, and the experiments declare none."""
    import ast

    from inferlab.run import plan

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
    result = project.runpytest("experiments", "--record-dir", "run", "--specimen", "standin", "-k", "cache",
                               "-rs")  # every selected test stops at its prerequisites: no model, in process
    found = records(project.path / "run")
    skipped = outcome(found, "test_cache_criterion_declared")
    reason = skipped["skip_reason"]
    assert skipped["outcome"] == "skipped" and "prerequisite 'model_inspection' has not run" in reason
    assert "-k 'cache' deselected them" in reason and "test_model_inspection" in reason
    assert "-k 'cache or test_thread_controls or test_acquisition or test_artifact_file or " in reason
    out = result.stdout.str()
    assert "inferlab/plugin.py" not in out and "experiments/test_40_cache.py:" in out


def test_the_sessions_one_hint_followed_exactly_runs_every_test_it_waited_for(project):
    """`-k matched_prefix` names, at its end, one -k that adds every prerequisite, the cache test's reference trial
    (P1-G-rep1) among them; that -k, typed as printed, runs the matched-prefix test and skips nothing."""
    first = project.runpytest("experiments", "--record-dir", "first", "--specimen", "standin", "-k", "matched_prefix")
    line = next(line for line in first.stdout.lines if "to run them all, -k '" in line)
    keyword = line.split("-k '", 1)[1].rsplit("'", 1)[0]
    assert "P1-G-rep1" in keyword and keyword.startswith("matched_prefix or ")
    project.runpytest("experiments", "--record-dir", "second", "--specimen", "standin", "-k", keyword)
    outcomes = [r for r in records(project.path / "second") if r["kind"] == "test_outcome"]
    assert [r["test"] for r in outcomes if r["outcome"] != "passed"] == []
    assert outcome(outcomes, "test_matched_prefix")["outcome"] == "passed"


def test_one_file_alone_is_told_which_files_to_name_too(project):
    project.runpytest("experiments/test_40_cache.py", "--record-dir", "run", "--specimen", "standin")  # no model
    reason = outcome(records(project.path / "run"), "test_cache_criterion_declared")["skip_reason"]
    assert "the command named only experiments/test_40_cache.py" in reason
    assert "to include them: name experiments/test_10_specimen.py too" in reason


@pytest.mark.parametrize("value", ["1", "true"])
def test_the_hubs_offline_variable_is_honoured_as_offline_and_recorded_so(project, monkeypatch, value):
    """Issue 26 B7: HF_HUB_OFFLINE=1 used to be ignored: the run still connected."""
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    result = project.runpytest("experiments", "--record-dir", "run", "-k", "test_network_guard")  # in process
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    manifest = json.loads((project.path / "run" / "manifest.json").read_text())
    assert manifest["options"]["offline"] is True and manifest["options"]["offline_from"] == f"HF_HUB_OFFLINE={value}"
    assert manifest["options"]["network_blocked_for_session"] is True
    guard = next(r for r in records(project.path / "run") if r["kind"] == "offline_guard")
    assert guard["offline"] is True and guard["outcome"].startswith("blocked")


def test_the_offline_variable_is_read_as_huggingface_hub_reads_it():
    from huggingface_hub.constants import _is_true

    from inferlab.run.session import offline_setting

    for value in ("1", "0", "true", "TRUE", "yes", "on", "no", "", "2", "false"):
        assert offline_setting(False, {"HF_HUB_OFFLINE": value})[0] is _is_true(value), value
    assert offline_setting(False, {"TRANSFORMERS_OFFLINE": "1"}) == (True, "TRANSFORMERS_OFFLINE=1")
    assert offline_setting(True, {}) == (True, "--offline") and offline_setting(False, {}) == (False, None)
