"""A Gradescope autograder that runs the instructor's copy: `inferlab autograder gradescope -o autograder.zip`
writes the zip, and the two scripts in it (setup.sh, run_autograder) call this module inside Gradescope's
container. docs/grading.md describes the zip's layout, what a learner submits and the AUTOGRADER_ROOT and
AUTOGRADER_PYTHON variables.

`run` always makes the course's own run from the course's copy, with the learner's predictions and explanation
taken from what was handed in, and scores every item from it; a handed-in archive is a claim checked against
that run by inferlab.grading.replayed.CourseRun. The submission is data: nothing in it is imported, collected
or executed. It writes /autograder/results/results.json (the gradescope format of inferlab.grading.formats).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from inferlab.base import learner_text
from inferlab.base.outputs import OutputPathError, output_kind, write_bytes_atomic
from inferlab.gradescope.autograder_scripts import SCRIPTS

ROOT_VARIABLE, DEFAULT_ROOT = "AUTOGRADER_ROOT", "/autograder"
PYTHON_VARIABLE = "AUTOGRADER_PYTHON"
CONFIG_FORMAT, CONFIG_SCHEMA = "inferlab-autograder", 1
COURSE = "course"  # the folder of the zip that holds the course's settings and files
CONFIG_FILE = f"{COURSE}/autograder.json"
# What of this checkout goes into the zip: the harness (what a run's source hashes cover) and what installs it.
PROJECT_TREES = ("inferlab", "experiments")
PROJECT_FILES = ("conftest.py", "pytest.ini", "pyproject.toml", "requirements.lock", "requirements.in", "Makefile",
                 "predictions.md", "explanation.md")
SKIPPED = ("__pycache__", ".pyc", ".egg-info")
PREDICTION_NAMES = ("my_predictions.md", "predictions.md")  # the first found wins, at the shallowest depth
EXPLANATION_NAMES = ("my_explanation.md", "explanation.md")
MAX_TEXT_BYTES = learner_text.MAX_BYTES  # a predictions or explanation file larger than this is not a learner's text
RUN_TIMEOUT_S = 900  # the experiment's own session limit is well below; Gradescope's default limit is 10 minutes
ATTACH_TIMEOUT_S = 120  # attach reads one file and writes one copy: seconds, unless the machine is stuck
ATTACH_TIMED_OUT = 124  # its status then, as timeout(1) gives: the grade goes on, saying "(attach exit 124)"
ACCEPT = ("writing", "archive")  # what a course takes (--accept): the two text files, a `pack` archive
ACCEPT_WORDS = {"writing": "predictions and an explanation (the two text files)", "archive": "a `pack` archive"}
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every entry's timestamp: the same checkout gives the same bytes


class AutograderError(Exception):
    """The autograder cannot be built from what was given (a usage error: exit 2)."""


# --- building the zip ----------------------------------------------------------------------------------


def _project_root() -> Path:
    from inferlab.specimen import PROJECT_ROOT

    return PROJECT_ROOT


def project_files(root: Path) -> list[str]:
    """The checkout's files that go into the zip, relative and sorted (no caches, no built specimens)."""
    found = [name for name in PROJECT_FILES if (root / name).is_file()]
    for tree in PROJECT_TREES:
        for path in (root / tree).rglob("*"):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and not path.is_symlink() and not any(part in relative for part in SKIPPED):
                found.append(relative)
    found += [p.relative_to(root).as_posix() for p in (root / "artifacts").glob("*.json") if p.is_file()]
    return sorted(found)


def _git(root: Path, *args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def course_settings(specimen: Optional[str], artifacts: Optional[Path], reference: Optional[Path],
                    rubric: Optional[Path], accept: tuple = ACCEPT) -> tuple[dict, dict]:
    """The zip's autograder.json and the course files to copy ({name in the zip: source path}), every input
    checked first (AutograderError naming what is wrong)."""
    from inferlab import protocol
    from inferlab.grading.reference import ReferenceError, load_reference
    from inferlab.grading.rubric import RubricError, load_rubric
    from inferlab.specimen import SpecimenError, check_specimen_files, load_runnable_spec

    if not accept or any(a not in ACCEPT for a in accept):
        raise AutograderError(f"--accept {','.join(accept)}: expected one or both of {', '.join(ACCEPT)}")
    root = _project_root()
    name = specimen or (protocol.DEFAULT_SPECIMEN if artifacts is not None else "standin")
    try:
        spec = load_runnable_spec(name)
    except SpecimenError as error:
        raise AutograderError(f"--specimen {name}: {error}") from None
    copies: dict[str, Path] = {}
    if artifacts is not None:
        verification = check_specimen_files(Path(artifacts), spec)
        if not verification.get("ok"):
            raise AutograderError(f"--artifacts {artifacts}: the copy fails verification against {spec.name}'s pins: "
                                  f"{'; '.join(verification.get('problems') or ['see check-artifacts'])}")
        for row in verification["files"]:
            if row.get("present"):
                copies[f"{COURSE}/specimen/{row['name']}"] = Path(artifacts) / row["name"]
    elif not spec.synthetic:
        raise AutograderError(f"the specimen {spec.name} is not built offline: give --artifacts DIR (your verified "
                              f"copy of its files, which go into the zip), or --specimen standin")
    if reference is not None:
        try:
            load_reference(reference)
        except ReferenceError as error:
            raise AutograderError(f"--reference: {error}") from None
        copies[f"{COURSE}/reference.json"] = Path(reference)
    if rubric is not None:
        try:
            load_rubric(rubric)
        except RubricError as error:
            raise AutograderError(f"--rubric: {error}") from None
        copies[f"{COURSE}/rubric.toml"] = Path(rubric)
    import inferlab

    config = {"format": CONFIG_FORMAT, "schema": CONFIG_SCHEMA,
              "made_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "specimen": spec.name, "artifacts": f"{COURSE}/specimen" if artifacts is not None else None,
              "reference": f"{COURSE}/reference.json" if reference is not None else None,
              "rubric": f"{COURSE}/rubric.toml" if rubric is not None else None,
              "accept": [a for a in ACCEPT if a in accept],
              "project": {"inferlab_version": inferlab.__version__, "git_commit": _git(root, "rev-parse", "HEAD"),
                          "git_dirty": bool(_git(root, "status", "--porcelain", "--untracked-files=no")),
                          "lock_sha256": _sha256(root / "requirements.lock")}}
    return config, copies


def _entry(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
    info.external_attr = (0o755 if executable else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def write_gradescope_zip(output: Path, specimen: Optional[str] = None, artifacts: Optional[Path] = None,
                         reference: Optional[Path] = None, rubric: Optional[Path] = None,
                         accept: tuple = ACCEPT) -> dict:
    """Write the autograder zip: made whole in memory, then written as a new file (never over one) or through a
    device or FIFO, by inferlab.base.outputs' rule. Returns the config."""
    output = Path(output)
    try:
        output_kind(output, replace=False)  # refused before the copies are read
    except OutputPathError as error:
        raise AutograderError(f"{error} (the autograder is written to a new file)") from None
    config, copies = course_settings(specimen, artifacts, reference, rubric, accept)
    root = _project_root()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in SCRIPTS.items():
            _entry(archive, name, text.encode(), executable=True)
        for name in project_files(root):
            _entry(archive, name, (root / name).read_bytes())
        _entry(archive, CONFIG_FILE, (json.dumps(config, indent=2) + "\n").encode())
        for name, source in sorted(copies.items()):
            _entry(archive, name, Path(source).read_bytes())
    try:
        write_bytes_atomic(output, buffer.getvalue(), replace=False)
    except OutputPathError as error:
        raise AutograderError(str(error)) from None
    return config


# --- inside the container ------------------------------------------------------------------------------


def autograder_root() -> Path:
    """AUTOGRADER_ROOT, else /autograder."""
    return Path(os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT)


def read_config(source: Path) -> dict:
    """The zip's autograder.json (inside the container: source is /autograder/source)."""
    path = Path(source) / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise AutograderError(f"{path}: expected the autograder's settings, actual: unreadable ({error})") from None
    if not isinstance(config, dict) or config.get("format") != CONFIG_FORMAT or config.get("schema") != CONFIG_SCHEMA:
        raise AutograderError(f"{path}: expected format {CONFIG_FORMAT} schema {CONFIG_SCHEMA}")
    return config


def prepare(source: Path) -> int:
    """setup.sh's last step: acquire (offline: the stand-in is built) and verify the course's specimen."""
    from inferlab.specimen import SpecimenError, acquire, load_spec

    config = read_config(source)
    artifacts = Path(source) / config["artifacts"] if config.get("artifacts") else None
    try:
        acquired = acquire(load_spec(config["specimen"]), artifacts_dir=artifacts, offline=True)
    except SpecimenError as error:
        print(f"autograder prepare: the course's copy of {config['specimen']} cannot be used: {error}", file=sys.stderr)
        return 2
    print(f"autograder prepare: {config['specimen']} ready ({acquired['acquisition']}: {acquired['directory']})")
    return 0


def _candidates(folder: Path) -> list[Path]:
    """Every regular file under folder, shallowest first, never through a symbolic link."""
    found = []
    for top, folders, files in os.walk(folder, followlinks=False):
        folders[:] = sorted(f for f in folders if not (Path(top) / f).is_symlink())
        found += [Path(top) / f for f in sorted(files) if not (Path(top) / f).is_symlink()]
    return sorted(found, key=lambda p: (len(p.relative_to(folder).parts), str(p)))


def _one(found: list[Path], names: tuple[str, ...], folder: Path) -> Optional[Path]:
    """The file of the first name (in names' order) found at the shallowest depth; AutograderError when two files
    of that name sit at that depth."""
    for name in names:
        matches = [p for p in found if p.name == name]
        if not matches:
            continue
        depth = len(matches[0].relative_to(folder).parts)
        level = [p for p in matches if len(p.relative_to(folder).parts) == depth]
        if len(level) > 1:
            raise AutograderError(f"the submission holds {len(level)} files named {name} at the same depth: "
                                  f"{', '.join(p.relative_to(folder).as_posix() for p in level)}; keep one")
        return level[0]
    return None


def find_submission(folder: Path) -> dict:
    """What the submission holds: {"kind": "pack", "archive": path} or {"kind": "files", "predictions": path or
    None, "explanation": path or None}; AutograderError when it holds neither, or is ambiguous."""
    from inferlab.submission.archive import ARCHIVE_SUFFIXES

    folder = Path(folder)
    if not folder.is_dir():
        raise AutograderError(f"{folder}: no submission folder")
    found = _candidates(folder)
    archives = [p for p in found if p.name.endswith(ARCHIVE_SUFFIXES)]
    if len(archives) > 1:
        raise AutograderError(f"the submission holds {len(archives)} archives "
                              f"({', '.join(p.relative_to(folder).as_posix() for p in archives)}); submit one `pack` "
                              "archive, or your predictions and explanation only")
    if archives:
        return {"kind": "pack", "archive": archives[0]}
    predictions, explanation = _one(found, PREDICTION_NAMES, folder), _one(found, EXPLANATION_NAMES, folder)
    if predictions is None and explanation is None:
        raise AutograderError(f"the submission holds no `pack` archive ({', '.join(ARCHIVE_SUFFIXES)}) and no "
                              f"predictions ({' or '.join(PREDICTION_NAMES)}) or explanation "
                              f"({' or '.join(EXPLANATION_NAMES)})")
    return {"kind": "files", "predictions": predictions, "explanation": explanation}


def _copy_text(source: Path, target: Path) -> None:
    """A learner's text file copied out of the submission as bytes, never opened as code: the one check of a
    learner's text (inferlab.base.learner_text) that --predictions and `attach` make too."""
    try:
        data = learner_text.read(source, "the submitted file")
    except learner_text.NotText as error:
        raise AutograderError(str(error)) from None
    target.write_bytes(data)


def clean_environment() -> dict:
    """This process's environment without what would let a file outside the course's copy into Python or pytest."""
    dropped = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONINSPECT")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PYTEST_")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def make_run(source: Path, config: dict, work: Path, predictions: Optional[Path]) -> tuple[Path, str]:
    """The experiment, offline, on the course's specimen, from the course's copy (cwd = source), with the learner's
    predictions: (the run folder, the end of its output)."""
    run_dir = work / "run"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "experiments",
               "--specimen", config["specimen"], "--offline", "--record-dir", str(run_dir)]
    if config.get("artifacts"):
        command += ["--artifacts", str(Path(source) / config["artifacts"])]
    if predictions is not None:
        command += ["--predictions", str(predictions)]
    done = subprocess.run(command, cwd=source, env=clean_environment(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    return run_dir, (done.stdout + done.stderr)[-3000:]


def _attach(source: Path, run_dir: Path, explanation: Path) -> int:
    """`inferlab attach RUN_DIR FILE --kind explanation` in its own process from the course's copy, as the run was
    made (grading sits below the command line and does not import it); its exit status."""
    command = [sys.executable, "-m", "inferlab", "attach", str(run_dir), str(explanation), "--kind", "explanation"]
    try:
        return subprocess.run(command, cwd=source, env=clean_environment(), stdin=subprocess.DEVNULL,
                              timeout=ATTACH_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"autograder: attach did not finish in {ATTACH_TIMEOUT_S} s; the run is graded without the explanation",
              file=sys.stderr)
        return ATTACH_TIMED_OUT


def _refusal(message: str) -> str:
    """results.json for a submission that cannot be graded: no points, and why."""
    data = {"score": 0.0, "output": message, "visibility": "visible",
            "tests": [{"name": "A submission to grade", "status": "failed", "output": message,
                       "visibility": "visible"}]}
    return json.dumps(data, indent=2) + "\n"


def _metadata(root: Path) -> dict:
    """The submission's id and time from Gradescope's submission_metadata.json, when it is there (shown only)."""
    try:
        data = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: data.get(k) for k in ("id", "created_at") if isinstance(data, dict) and k in data}


def _work_folder(root: Path) -> Path:
    """root/work, or a new folder beside it when the same container grades again (nothing is overwritten)."""
    work = root / "work"
    if work.exists():
        work = Path(tempfile.mkdtemp(prefix="work-", dir=root))
    work.mkdir(parents=True, exist_ok=True)
    return work


def archive_writing(archive: Path, work: Path) -> dict:
    """The learner's writing in a `pack` archive, copied out as text: {"predictions": path or None, "explanation":
    path or None} (the predictions the run was given, the last explanation attached to it); AutograderError when
    the archive cannot be read."""
    import tarfile

    from inferlab.submission.archive import UnsafeArchive, unpack
    from inferlab.reading.runview import RunView

    try:
        unpacked = unpack(archive)
    except (UnsafeArchive, OSError, tarfile.TarError, EOFError) as error:
        raise AutograderError(f"{archive.name}: expected a `pack` archive, actual: unreadable ({error})") from None
    found = {"predictions": None, "explanation": None}
    try:
        view = RunView.read(unpacked.run_dir)
        given = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
        explained = [e for e in view.addenda if e.get("kind") == "explanation" and isinstance(e.get("file"), str)]
        for name, relative in (("predictions", given.get("copied_to") if given.get("supplied") else None),
                               ("explanation", explained[-1]["file"] if explained else None)):
            path = unpacked.run_dir / relative if isinstance(relative, str) else None
            if path is not None and path.is_file() and not path.is_symlink():
                found[name] = work / f"{name}.md"
                _copy_text(path, found[name])
    finally:
        unpacked.remove()
    return found


def _scored_from(data: dict, grade, archive: Optional[str]) -> None:
    """Each test of results.json says which run its score came from (in its output and in extra_data)."""
    writing = {str(number) for number, item in grade.rubric.items.items() if item.sections}
    sources = {}
    for test in data.get("tests", []):
        if "number" in test:
            where = ("your writing as handed in, attached to the course's run" if test["number"] in writing else
                     "the course's run, made here")
        elif test.get("name") == "Integrity of the run":
            where = "the course's run" + (f", and your archive {archive} checked against it" if archive else "")
        else:
            continue
        sources[test["name"]] = where
        test["output"] = f"scored from: {where}\n" + (test.get("output") or "")
    data.setdefault("extra_data", {}).setdefault("autograder", {})["scored_from"] = sources


def grade_submission(root: Path) -> tuple[str, Optional[object]]:
    """The results.json text for root/submission, and the grade (None when it could not be graded).

    The course's run is always made here, with the learner's writing (the two text files, or those in the
    archive), and every item is scored from it; a handed-in archive is a claim checked against that run
    (replayed.CourseRun): each contradiction, and each integrity problem of the archive, is one of the grade."""
    from inferlab.grading import formats
    from inferlab.grading.grade import grade_source
    from inferlab.grading.reference import load_reference
    from inferlab.grading.replayed import CourseRun, MadeHere
    from inferlab.grading.rubric import load_rubric

    source = root / "source"
    config = read_config(source)
    rubric = load_rubric(source / config["rubric"] if config.get("rubric") else None)
    reference_file = source / config["reference"] if config.get("reference") else None
    reference = load_reference(reference_file) if reference_file else None
    accept = config.get("accept") or list(ACCEPT)
    try:
        found = find_submission(root / "submission")
        kind = "archive" if found["kind"] == "pack" else "writing"
        if kind not in accept:
            raise AutograderError(f"this course takes {' or '.join(ACCEPT_WORDS[a] for a in accept)}, and the "
                                  f"submission holds {ACCEPT_WORDS[kind]}")
        work = _work_folder(root)
        writing = archive_writing(found["archive"], work) if kind == "archive" else {
            name: found[name] for name in ("predictions", "explanation")}
    except AutograderError as error:
        return _refusal(str(error)), None
    what = {name: ("" if path is None else f"{found['archive'].name}'s {name}" if kind == "archive" else
                   f"your {path.name}") for name, path in writing.items()}
    predictions = None
    if writing["predictions"] is not None:
        predictions = work / "predictions.md"
        if writing["predictions"] != predictions:
            try:  # a learner's text that is not one (binary, empty, too long) is theirs to fix, not a set-up fault
                _copy_text(writing["predictions"], predictions)
            except AutograderError as error:
                return _refusal(f"your predictions cannot be graded: {error}"), None
    target, tail = make_run(source, config, work, predictions)
    if not (target / "manifest.json").is_file():
        return _refusal(f"the course's experiment run did not start:\n{tail}"), None
    lines = [f"the autograder ran the experiment on {config['specimen']} (offline) with "
             + (what["predictions"] if predictions else "no predictions file")]
    if writing["explanation"] is not None:
        explanation = work / "explanation.md"
        if writing["explanation"] != explanation:
            try:
                _copy_text(writing["explanation"], explanation)
            except AutograderError as error:
                return _refusal(f"your explanation cannot be graded: {error}"), None
        status = _attach(source, target, explanation)
        lines.append(f"attached {what['explanation']}" + ("" if status == 0 else f" (attach exit {status})"))
    grade = grade_source(target, rubric, reference, reference_file=str(reference_file) if reference_file else None,
                         replay=MadeHere())
    grade.not_checked = [line for line in grade.not_checked if not line.startswith("replay: none made")]
    if kind == "archive":
        claim = grade_source(found["archive"], rubric, replay=CourseRun(target))
        problems = claim.integrity_problems
        grade.integrity += [f"your archive {found['archive'].name}: {line}" for line in problems]
        grade.not_checked += [f"your archive: {line}" for line in claim.not_checked if line.startswith("against ")]
        grade.facts["archive_against_course_run"] = claim.facts.get("against")
        lines.append(f"checked your archive {found['archive'].name} against the course's run: "
                     + (f"{len(problems)} integrity problem(s)" if problems else "no contradiction"))
    data = json.loads(formats.gradescope(grade))
    data["output"] = "\n".join(lines) + "\n\n" + data["output"]
    data.setdefault("extra_data", {})["autograder"] = {"submission": _metadata(root), "course": config["project"],
                                                       "how": lines}
    _scored_from(data, grade, found["archive"].name if kind == "archive" else None)
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n", grade


def run(root: Path) -> int:
    """run_autograder: grade the submission and write root/results/results.json (always, even for a refusal)."""
    from inferlab.base.records import write_text_atomic

    results = Path(root) / "results"
    results.mkdir(parents=True, exist_ok=True)
    try:
        text, grade = grade_submission(Path(root))
    except AutograderError as error:
        text, grade = _refusal(f"the autograder is not set up: {error}"), None
    except (OSError, subprocess.SubprocessError, ValueError) as error:  # still a results.json that says why
        text, grade = _refusal(f"the autograder failed: {type(error).__name__}: {error}"), None
    write_text_atomic(results / "results.json", text)
    print(f"autograder: results.json written to {results}"
          + (f" (grade exit {grade.exit_status}, score {grade.score:g} of {grade.max_score:g})" if grade else ""))
    return 0


def main(argv=None) -> int:
    """`python -m inferlab.gradescope.autograder prepare|run` (setup.sh's last step, and run_autograder)."""
    import argparse

    parser = argparse.ArgumentParser(prog="inferlab.gradescope.autograder",
                                     description="inside Gradescope's container: prepare (setup.sh) or run")
    parser.add_argument("step", choices=("prepare", "run"))
    args = parser.parse_args(argv)
    root = autograder_root()
    if args.step == "prepare":
        return prepare(root / "source")
    return run(root)


if __name__ == "__main__":
    sys.exit(main())
