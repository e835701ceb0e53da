"""`inferlab autograder gradescope`: the zip, and its run_autograder end to end with Gradescope's folders replaced
by a temporary root (AUTOGRADER_ROOT), for a pack archive and for predictions + explanation only (issue 31 item 5).

The "image" is built once per module as Gradescope builds it: the zip unpacked into root/source and its setup.sh
run, with the installation step skipped (AUTOGRADER_PYTHON is this .venv's Python, which has the lock). Each
submission then gets a fresh copy of that root, as each Gradescope submission gets a fresh container. Every
submission also carries code that, if anything ran it, would write a marker file: a conftest.py, a pytest.ini
that loads a plugin, a sitecustomize.py, an experiments/ test and an inferlab/ package.

One submission (the two text files) runs run_autograder whole, making the course's run, as Gradescope runs it.
The two archives are graded by the same step in this process, the course's run they would make (the same
predictions, byte for byte) taken from that submission's: submit_here says exactly what it stands in for."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from inferlab.gradescope import autograder
from inferlab.grading.evidence import FAIL
from inferlab.reading import addenda

from fixtures_records import REPO_ROOT
from grading_helpers import answered_explanation, answered_predictions
from forging import nudge_first_step_logits
from shared_runs import COURSE_CI_SCRIPT, inferlab_command, made_once, share_grader_copies

DOC = REPO_ROOT / "docs" / "grading.md"


def evil_files(folder: Path, marker: Path) -> None:
    """Code a submission could carry, each piece writing `marker` if it were ever imported or run."""
    payload = f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"
    (folder / "conftest.py").write_text(payload)
    (folder / "sitecustomize.py").write_text(payload)
    (folder / "evil_plugin.py").write_text(payload)
    (folder / "pytest.ini").write_text("[pytest]\naddopts = -p evil_plugin\n")
    (folder / "experiments").mkdir()
    (folder / "experiments" / "test_evil.py").write_text(payload + "def test_evil():\n    pass\n")
    (folder / "inferlab").mkdir()
    (folder / "inferlab" / "__init__.py").write_text(payload)


def unzip(archive: Path, target: Path) -> None:
    """What Gradescope does with the zip: its files into target, with their modes."""
    with zipfile.ZipFile(archive) as opened:
        for info in opened.infolist():
            opened.extract(info, target)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(target / info.filename, mode)


def script_env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "PYTHONPATH"}
    env.update({autograder.ROOT_VARIABLE: str(root), autograder.PYTHON_VARIABLE: sys.executable})
    return env


def run_script(root: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(root / "source" / name)], cwd=root, env=script_env(root), capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The autograder zip (default: the stand-in), unpacked and set up once: {zip, root, setup}."""
    def make(folder: Path) -> dict:
        status, printed = inferlab_command("autograder", "gradescope", "-o", folder / "autograder.zip")
        assert status == 0, printed
        root = folder / "root"
        unzip(folder / "autograder.zip", root / "source")
        done = run_script(root, "setup.sh")
        return {"zip": str(folder / "autograder.zip"), "root": str(root), "returncode": done.returncode,
                "output": done.stdout + done.stderr}

    return made_once(tmp_path_factory, "autograder-image", make)


def container(image: dict, tmp_path: Path, files: dict) -> tuple[Path, Path]:
    """A fresh container: the set-up root copied, and the submission's files and the evil code put in place.
    (root, the marker path)."""
    root = tmp_path / "autograder"
    shutil.copytree(image["root"], root, symlinks=True)
    submission = root / "submission"
    submission.mkdir()
    for name, content in files.items():
        target = submission / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy(content, target)
        else:
            target.write_text(content)
    marker = tmp_path / "code-from-the-submission-ran"
    evil_files(submission, marker)
    (root / "submission_metadata.json").write_text(json.dumps({"id": 123456, "created_at": "2026-12-01T20:00:00Z"}))
    return root, marker


def submit(image: dict, tmp_path: Path, files: dict) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """A fresh container with the submission, and run_autograder run in it as Gradescope runs it: (root, the marker
    path, the finished process)."""
    root, marker = container(image, tmp_path, files)
    return root, marker, run_script(root, "run_autograder")


@pytest.fixture(scope="module")
def writing_submitted(image, tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The module's one whole run_autograder that makes the course's run: a submission of the two text files
    (answered_predictions, answered_explanation), as submit() returns it."""
    return submit(image, tmp_path_factory.mktemp("writing"), {"lab12/my_predictions.md": answered_predictions(),
                                                                "lab12/my_explanation.md": answered_explanation()})


def submit_here(image: dict, tmp_path: Path, files: dict, course_run: Path, monkeypatch) -> tuple[Path, Path]:
    """A fresh container with the submission, graded by run_autograder's own step (autograder.run) in this process,
    and the course's run it makes taken from course_run: one made by the bundle here with the same course copy and
    predictions of the same bytes. make_run is asserted to be asked for exactly that run (the course's specimen,
    offline, those predictions), then hands back a copy of what that session wrote (the explanation attached to it
    later, in addenda, left out); everything after it runs as in the container. Making that run is what
    writing_submitted checks end to end, once for the module. (root, the marker path)"""
    root, marker = container(image, tmp_path, files)
    given = json.loads((course_run / "manifest.json").read_text())["predictions"]
    made = []

    def the_shared_run(source, config, work, predictions):
        assert (source, config["specimen"], config.get("artifacts")) == (root / "source", "standin", None)
        assert predictions is not None and predictions.read_bytes() == (course_run / given["copied_to"]).read_bytes()
        attached = {addenda.LEDGER_FILE, addenda.ADDENDA_DIR}
        made.append(shutil.copytree(course_run, work / "run", symlinks=True, ignore=lambda folder, names: (
            attached.intersection(names) if Path(folder) == course_run else ())))
        return made[-1], "the shared course run"

    monkeypatch.setattr(autograder, "make_run", the_shared_run)
    monkeypatch.setenv(autograder.ROOT_VARIABLE, str(root))
    assert autograder.main(["run"]) == 0 and len(made) == 1
    return root, marker


def consistent_with_grade_json(results: dict, graded: dict) -> None:
    """results.json has one test per item plus integrity, with grade --format json's scores and statuses."""
    run = graded["runs"][0]
    tests = {t.get("number"): t for t in results["tests"] if "number" in t}
    assert sorted(tests, key=int) == [str(n) for n in range(1, 8)], results["tests"]
    for item in run["items"]:
        test = tests[str(item["number"])]
        assert test["score"] == item["points"] and test["max_score"] == item["max_points"], (test, item)
        assert test["status"] == ("failed" if item["status"] == FAIL else "passed"), (test, item)
    assert results["score"] == run["score"]
    integrity = [t for t in results["tests"] if t["name"] == "Integrity of the run"]
    assert len(integrity) == 1 and integrity[0]["status"] == ("passed" if run["integrity"]["ok"] else "failed")
    assert results["extra_data"]["exit_status"] == run["exit_status"]


def grade_json(target: Path, standin_dir: Path) -> dict:
    """`grade TARGET --format json --replay` in this process, on this process's one grader's copy (every replay
    after the first reuses its model and the outputs it computed, and still compares each part with the run)."""
    with pytest.MonkeyPatch.context() as patch:
        share_grader_copies(patch)
        status, printed = inferlab_command("grade", target, "--format", "json", "--replay", "--specimen", "standin",
                                           "--artifacts", standin_dir)
    return json.loads(printed)


# --- the zip ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_zip_holds_the_two_scripts_at_its_root_and_the_course_copy_pinned(tmp_path):
    status, printed = inferlab_command("autograder", "gradescope", "-o", tmp_path / "autograder.zip")
    assert status == 0 and "specimen standin" in printed, printed
    with zipfile.ZipFile(tmp_path / "autograder.zip") as opened:
        names = {info.filename: info for info in opened.infolist()}
        config = json.loads(opened.read(autograder.CONFIG_FILE))
        lock = opened.read("requirements.lock")
    for name in ("setup.sh", "run_autograder"):
        assert names[name].external_attr >> 16 & stat.S_IXUSR, name
    for name in ("inferlab/grading/grade.py", "experiments/test_10_specimen.py", "conftest.py", "pytest.ini",
                 "pyproject.toml", "requirements.lock", "artifacts/standin.json",
                 "inferlab/grading/default_rubric.toml"):
        assert name in names, name
    assert not [n for n in names if "__pycache__" in n or n.startswith("artifacts/cache") or n.startswith("tests/")]
    assert lock == (REPO_ROOT / "requirements.lock").read_bytes()
    assert config["specimen"] == "standin" and config["accept"] == ["writing", "archive"]
    assert config["project"]["lock_sha256"] == __import__("hashlib").sha256(lock).hexdigest()
    setup = autograder.SCRIPTS["setup.sh"]
    assert "--cpu-index" in setup and "https://download.pytorch.org/whl/cpu" in setup
    assert "inferlab.host.installation --lock requirements.lock" in setup


def test_the_zip_is_refused_for_a_copy_reference_or_rubric_that_cannot_be_used(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert inferlab_command("autograder", "gradescope", "-o", tmp_path / "a.zip", "--artifacts",
                            tmp_path / "empty")[0] == 2
    assert "fails verification against pythia-14m's pins" in capsys.readouterr().err
    (tmp_path / "ref.json").write_text("{}")
    assert inferlab_command("autograder", "gradescope", "-o", tmp_path / "a.zip", "--reference",
                            tmp_path / "ref.json")[0] == 2
    assert "--reference: " in capsys.readouterr().err
    (tmp_path / "rubric.toml").write_text("schema = 1\n")
    assert inferlab_command("autograder", "gradescope", "-o", tmp_path / "a.zip", "--rubric",
                            tmp_path / "rubric.toml")[0] == 2
    assert "--rubric: " in capsys.readouterr().err
    assert inferlab_command("autograder", "gradescope", "-o", tmp_path / "a.zip", "--specimen", "pythia-14m")[0] == 2
    assert "give --artifacts DIR" in capsys.readouterr().err
    assert not (tmp_path / "a.zip").exists() and not list(tmp_path.glob("*.partial"))


def test_what_a_submission_holds_is_found_by_name_never_through_a_link(tmp_path):
    folder = tmp_path / "submission"
    (folder / "repo").mkdir(parents=True)
    (folder / "repo" / "my_predictions.md").write_text("p")
    (folder / "explanation.md").write_text("e")
    found = autograder.find_submission(folder)
    assert found == {"kind": "files", "predictions": folder / "repo" / "my_predictions.md",
                     "explanation": folder / "explanation.md"}
    (folder / "linked.tar.gz").symlink_to(tmp_path)
    assert autograder.find_submission(folder)["kind"] == "files"  # a link is never followed, nor read
    (folder / "a.tar.gz").write_bytes(b"")
    assert autograder.find_submission(folder) == {"kind": "pack", "archive": folder / "a.tar.gz"}
    (folder / "repo" / "b.tgz").write_bytes(b"")
    with pytest.raises(autograder.AutograderError, match="2 archives"):
        autograder.find_submission(folder)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(autograder.AutograderError, match="no `pack` archive"):
        autograder.find_submission(tmp_path / "nothing")


# --- run_autograder end to end ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.process
def test_setup_sh_skips_its_installation_and_prepares_the_specimen_offline(image):
    assert image["returncode"] == 0, image["output"][-3000:]
    assert "the installation step is skipped" in image["output"]
    assert "autograder prepare: standin ready" in image["output"]


@pytest.mark.slow
@pytest.mark.process
def test_run_autograder_makes_its_own_run_with_an_archives_writing_and_checks_the_archive_against_it(
        image, course_ci, writing_submitted, standin_dir, tmp_path, monkeypatch):
    archive = course_ci["out"] / "submission.tar.gz"
    root, marker = submit_here(image, tmp_path, {"my-run.tar.gz": archive}, writing_submitted[0] / "work" / "run",
                               monkeypatch)
    results = json.loads((root / "results" / "results.json").read_text())
    assert not marker.exists(), marker.read_text()
    run = root / "work" / "run"  # the course's run, made here: every item is scored from it
    assert json.loads((run / "manifest.json").read_text())["predictions"]["supplied"] is True
    consistent_with_grade_json(results, grade_json(run, standin_dir))
    assert results["extra_data"]["exit_status"] == 0, results["output"][-3000:]
    items = {t["number"]: t["status"] for t in results["tests"] if "number" in t}
    assert items == {str(n): "passed" for n in range(1, 8)}  # as before: the archive's writing, graded
    assert "with my-run.tar.gz's predictions" in results["output"] and "attached my-run.tar.gz's explanation" in \
        results["output"]
    assert "checked your archive my-run.tar.gz against the course's run: no contradiction" in results["output"]
    against = results["extra_data"]["autograder"]
    assert against["submission"] == {"id": 123456, "created_at": "2026-12-01T20:00:00Z"}
    assert against["scored_from"]["Integrity of the run"].endswith("your archive my-run.tar.gz checked against it")
    assert sum(where == "the course's run, made here" for where in against["scored_from"].values()) == 5
    assert "scored from: the course's run" in next(t["output"] for t in results["tests"] if t.get("number") == "5")


@pytest.mark.slow
@pytest.mark.process
def test_an_archive_whose_saved_tensor_moved_in_its_last_bits_scores_0_naming_where_it_contradicts_the_course_run(
        image, course_ci, writing_submitted, tmp_path, monkeypatch):
    """Every hash and figure of the forged run redone, so it passes every file check: the course's run, made here
    on the same machine with the same kernels, gives every tensor bit for bit, and this one is not."""
    forged = nudge_first_step_logits(course_ci["run"], tmp_path / "forged", "P1-G-rep1")
    assert inferlab_command("pack", forged["run"], "-o", tmp_path / "forged.tar.gz")[0] == 0
    root, marker = submit_here(image, tmp_path / "container", {"my-run.tar.gz": tmp_path / "forged.tar.gz"},
                               writing_submitted[0] / "work" / "run", monkeypatch)
    results = json.loads((root / "results" / "results.json").read_text())
    assert not marker.exists(), marker.read_text()
    assert results["score"] == 0.0 and results["extra_data"]["exit_status"] == 3, results["output"][-3000:]
    integrity = next(t for t in results["tests"] if t["name"] == "Integrity of the run")
    assert integrity["status"] == "failed"
    where = f"{forged['file']}[{forged['key']}]"
    assert f"your archive my-run.tar.gz: contradicts the course's run: saved tensor generation P1-G-rep1 " \
           f"first_step_logits ({where})" in results["output"], results["output"][-3000:]
    assert f"element [{forged['element']}]" in results["output"]


def test_a_course_that_takes_writing_only_refuses_an_archive_before_any_run(tmp_path):
    root = tmp_path / "autograder"
    (root / "source" / autograder.COURSE).mkdir(parents=True)
    (root / "source" / autograder.CONFIG_FILE).write_text(json.dumps({
        "format": autograder.CONFIG_FORMAT, "schema": autograder.CONFIG_SCHEMA, "specimen": "standin",
        "accept": ["writing"]}))
    (root / "submission").mkdir()
    (root / "submission" / "run.tar.gz").write_bytes(b"")
    text, grade = autograder.grade_submission(root)
    assert grade is None and not (root / "work").exists()
    assert "this course takes predictions and an explanation (the two text files), and the submission holds a " \
           "`pack` archive" in json.loads(text)["output"]
    with pytest.raises(autograder.AutograderError, match="expected one or both of writing, archive"):
        autograder.course_settings("standin", None, None, None, accept=("everything",))


@pytest.mark.slow
@pytest.mark.process
def test_run_autograder_makes_the_run_itself_from_predictions_and_an_explanation(writing_submitted, standin_dir):
    root, marker, done = writing_submitted
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert not marker.exists(), marker.read_text()
    run = root / "work" / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["specimen"]["name"] == "standin" and "--offline" in manifest["command"]
    consistent_with_grade_json(results, grade_json(run, standin_dir))
    assert results["extra_data"]["exit_status"] == 0, results["output"][-3000:]
    items = {t["number"]: t["status"] for t in results["tests"] if "number" in t}
    assert items == {str(n): "passed" for n in range(1, 8)}
    assert "the autograder ran the experiment on standin (offline) with your my_predictions.md" in results["output"]
    assert "attached your my_explanation.md" in results["output"]


@pytest.mark.slow
@pytest.mark.process
def test_run_autograder_writes_a_results_json_that_says_why_for_an_empty_submission(image, tmp_path):
    root, marker, done = submit(image, tmp_path, {})
    results = json.loads((root / "results" / "results.json").read_text())
    assert done.returncode == 0 and results["score"] == 0.0 and not marker.exists()
    assert "no `pack` archive" in results["tests"][0]["output"]


@pytest.mark.process
def test_a_predictions_file_that_is_not_text_is_the_learners_to_fix_not_a_set_up_fault(image, tmp_path):
    """The one check of a learner's text refuses it before any run is made, and results.json says it is the
    learner's file, not that the autograder is not set up."""
    root, marker, done = submit(image, tmp_path, {"predictions.md": "", "explanation.md": answered_explanation()})
    results = json.loads((root / "results" / "results.json").read_text())
    assert done.returncode == 0 and results["score"] == 0.0 and not marker.exists()
    output = results["tests"][0]["output"]
    assert output.startswith("your predictions cannot be graded: ") and "predictions.md" in output, output
    assert "not set up" not in output and not (root / "work" / "run").exists()


# --- the CI examples ---------------------------------------------------------------------------------------


def ci_blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    return {("github" if "runs-on:" in block else "gitlab"): block for block in blocks if "course-grade" in block}


def test_the_ci_examples_take_the_harness_from_the_courses_repository_at_a_pinned_commit():
    blocks = ci_blocks()
    github, gitlab = blocks["github"], blocks["gitlab"]
    assert "repository: " in github and "ref: ${{ env.HARNESS_COMMIT }}" in github and "path: harness" in github
    assert "path: learner" in github and "harness/.ci/course-grade" in github
    assert "PREDICTIONS: learner/my_predictions.md" in github
    assert 'checkout --detach "$HARNESS_COMMIT"' in gitlab and "HARNESS_COMMIT" in gitlab
    for name, block in blocks.items():
        assert re.search(r"^\s*(- )?(run: )?\.ci/course-grade", block, flags=re.M) is None, name
    text = DOC.read_text(encoding="utf-8")
    assert "learner-side ci is feedback" in " ".join(text.lower().split())


@pytest.mark.process
def test_the_course_script_refuses_a_harness_that_is_not_the_pinned_commit_or_holds_the_learners_files(tmp_path):
    harness = tmp_path / "harness"
    (harness / ".ci").mkdir(parents=True)
    shutil.copy(COURSE_CI_SCRIPT, harness / ".ci" / COURSE_CI_SCRIPT.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    script = [str(harness / ".ci" / COURSE_CI_SCRIPT.name)]
    done = subprocess.run(script, cwd=tmp_path, env={**env, "HARNESS_COMMIT": "0" * 40}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and f"not the pinned commit {'0' * 40}" in done.stderr, done.stderr
    (harness / "my_predictions.md").write_text("mine")
    done = subprocess.run(script, cwd=harness, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "inside the harness" in done.stderr, done.stderr


def test_an_attach_that_does_not_finish_is_said_and_the_grade_goes_on(monkeypatch, tmp_path, capsys):
    def stuck(command, **kwargs):
        assert command[1:4] == ["-m", "inferlab", "attach"] and kwargs["timeout"] == autograder.ATTACH_TIMEOUT_S
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    monkeypatch.setattr(autograder.subprocess, "run", stuck)
    status = autograder._attach(tmp_path, tmp_path / "run", tmp_path / "explanation.md")
    assert status == autograder.ATTACH_TIMED_OUT
    assert f"attach did not finish in {autograder.ATTACH_TIMEOUT_S} s" in capsys.readouterr().err
