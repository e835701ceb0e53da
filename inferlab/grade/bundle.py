"""A Gradescope autograder: `inferlab autograder gradescope -o autograder.zip` writes the zip; its two scripts call
this module inside Gradescope's container (`python -m inferlab.grade.bundle prepare|run`).

For every submission the bundle first makes the course's own run (offline, from the course's copy of the harness),
the evidence a handed-in `pack` archive is graded against (inferlab.grade.grade). The submission is data: nothing
in it is imported or executed. results.json shows the learner's texts beside a summary of the course's run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Optional

# main() checks the environment first: at import, this module needs nothing but the standard library
from inferlab.files import PROJECT_ROOT, OutputPathError, replace_hint, require_environment, write_bytes_atomic

ROOT_VARIABLE, DEFAULT_ROOT = "AUTOGRADER_ROOT", "/autograder"
CONFIG_FILE = "course/autograder.json"
REFERENCE_DIR = "course/reference"  # the published small files the replica is built from
REFERENCE_VARIABLE = "INFERLAB_PYTHIA_REFERENCE"
PROJECT_TREES = ("inferlab", "experiments")
PROJECT_FILES = ("conftest.py", "pytest.ini", "pyproject.toml", "requirements.lock", "requirements.in", "Makefile",
                 "predictions.md", "explanation.md")
PREDICTION_NAMES = ("my_predictions.md", "predictions.md")
EXPLANATION_NAMES = ("my_explanation.md", "explanation.md")
RUN_TIMEOUT_S = 900
ZIP_TIME = (1980, 1, 1, 0, 0, 0)

SCRIPTS = ("setup.sh", "run_autograder")  # beside this module; Gradescope runs them from the zip's root


class BundleError(Exception):
    """The autograder cannot be built, or a submission cannot be graded; the message says why."""


def _entry(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
    info.external_attr = (0o755 if executable else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def project_files(root: Path) -> list[str]:
    """The checkout's files that go into the zip: the harness, what installs it, the specimen specs."""
    found = [name for name in PROJECT_FILES if (root / name).is_file()]
    for tree in PROJECT_TREES:
        found += [p.relative_to(root).as_posix() for p in (root / tree).rglob("*")
                  if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    found += [p.relative_to(root).as_posix() for p in (root / "artifacts").glob("*.json")]
    return sorted(found)


def write_zip(output: Path, specimen: Optional[str], artifacts: Optional[Path], rubric: Optional[Path],
              replace: bool = False) -> dict:
    """Write the autograder zip by the output rule; every input is checked first (BundleError)."""
    from inferlab import specimen as specimens
    from inferlab.grade import rubric as rubrics

    name = specimen or ("pythia-14m" if artifacts is not None else "standin")
    try:
        spec = specimens.load_runnable_spec(name)
    except specimens.SpecimenError as error:
        raise BundleError(f"--specimen {name}: {error}") from None
    copies: dict[str, Path] = {}
    if artifacts is not None:
        checked = specimens.check_specimen_files(Path(artifacts), spec)
        if not checked.get("ok"):
            raise BundleError(f"--artifacts {artifacts}: fails verification against {spec.name}'s pins: "
                              + "; ".join(checked.get("problems") or []))
        copies.update({f"course/specimen/{row['name']}": Path(artifacts) / row["name"]
                       for row in checked["files"] if row.get("present")})
    elif not spec.synthetic:
        raise BundleError(f"{spec.name} is not built offline: give --artifacts DIR (your verified copy, which goes "
                          "into the zip), or --specimen standin")
    if name == "replica":
        reference = Path(os.environ.get(REFERENCE_VARIABLE) or PROJECT_ROOT.parent / "shared/reference/pythia-14m")
        if not reference.is_dir():
            raise BundleError(f"--specimen replica needs the published small files it is built from: {reference} is "
                              f"not a folder (set {REFERENCE_VARIABLE})")
        copies.update({f"{REFERENCE_DIR}/{p.name}": p for p in sorted(reference.iterdir()) if p.is_file()})
    if rubric is not None:
        try:
            rubrics.load(rubric)
        except rubrics.RubricError as error:
            raise BundleError(f"--rubric: {error}") from None
        copies["course/rubric.toml"] = Path(rubric)
    config = {"specimen": spec.name,
              "artifacts": "course/specimen" if artifacts is not None else None,
              "reference": REFERENCE_DIR if name == "replica" else None,
              "rubric": "course/rubric.toml" if rubric is not None else None}
    buffer = io.BytesIO()
    copies.update({script: Path(__file__).with_name(script) for script in SCRIPTS})
    copies.update({relative: PROJECT_ROOT / relative for relative in project_files(PROJECT_ROOT)})
    with zipfile.ZipFile(buffer, "w") as archive:
        _entry(archive, CONFIG_FILE, (json.dumps(config, indent=2) + "\n").encode())
        for relative, source in sorted(copies.items()):
            _entry(archive, relative, source.read_bytes(), executable=relative in SCRIPTS)
    try:
        write_bytes_atomic(output, buffer.getvalue(), replace=replace)
    except OutputPathError as error:  # the same hint as grade's (docs/records.md: one output rule)
        raise BundleError(replace_hint(error)) from None
    return config


# --- inside the container --------------------------------------------------------------------------------------


def read_config(source: Path) -> dict:
    """The zip's settings, written by the harness the zip holds (so never another version's)."""
    path = source / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise BundleError(f"{path}: the autograder's settings are unreadable ({error})") from None
    if config.get("reference"):
        os.environ[REFERENCE_VARIABLE] = str(source / config["reference"])
    return config


def prepare(source: Path) -> int:
    """setup.sh's last step: the course's specimen acquired offline and verified (a synthetic one is built)."""
    from inferlab.specimen import SpecimenError, acquire, load_spec

    config = read_config(source)
    artifacts = source / config["artifacts"] if config.get("artifacts") else None
    try:
        done = acquire(load_spec(config["specimen"]), artifacts_dir=artifacts, offline=True)
    except SpecimenError as error:
        print(f"autograder prepare: {config['specimen']} cannot be made ready: {error}", file=sys.stderr)
        return 2
    print(f"autograder prepare: {config['specimen']} ready ({done['acquisition']})")
    return 0


def find_submission(folder: Path) -> dict:
    """{"archive": path} or {"predictions": path|None, "explanation": path|None}; BundleError when it holds neither."""
    from inferlab.grade.archive import SUFFIXES

    # every regular file, shallowest first; rglob's ** never follows a symbolic link
    found = sorted((p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) if folder.is_dir() else [],
                   key=lambda p: (len(p.relative_to(folder).parts), str(p)))
    archives = [p for p in found if p.name.endswith(SUFFIXES)]
    if len(archives) > 1:
        raise BundleError(f"the submission holds {len(archives)} archives; hand in one `pack` archive")
    if archives:
        return {"archive": archives[0]}
    texts = {kind: next((p for name in names for p in found if p.name == name), None)
             for kind, names in (("predictions", PREDICTION_NAMES), ("explanation", EXPLANATION_NAMES))}
    if not any(texts.values()):
        raise BundleError("the submission holds no `pack` archive (.tar.gz) and no predictions or explanation "
                          f"({', '.join(PREDICTION_NAMES + EXPLANATION_NAMES)})")
    return texts


def make_course_run(source: Path, config: dict, run_dir: Path) -> str:
    """The course's run, offline, from the course's copy; the end of its output."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "experiments", "--specimen",
               config["specimen"], "--offline", "--record-dir", str(run_dir)]
    if config.get("artifacts"):
        command += ["--artifacts", str(source / config["artifacts"])]
    dropped = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONINSPECT")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PYTEST_")}
    done = subprocess.run(command, cwd=source, env={**env, "PYTHONNOUSERSITE": "1"}, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    return (done.stdout + done.stderr)[-3000:]


def course_summary(view) -> str:
    """A few lines of the course's run: what the learner's writing is read against."""
    generations = [r for r in view.kind("generation") if r.get("status", "ok") == "ok"]
    greedy = {}
    for record in generations:
        if record.get("condition") == "G":
            greedy.setdefault(record.get("prompt_id"), set()).add(tuple(record.get("generated_ids") or []))
    prefixes = view.kind("cache_comparison")
    lines = [f"specimen {view.specimen_spec().get('name')}; {len(generations)} generation trials completed",
             "greedy repetitions identical: " + ", ".join(f"{p} {'yes' if len(s) == 1 else 'no'}"
                                                          for p, s in sorted(greedy.items())),
             f"matched prefixes: {len(prefixes)}, max abs diff "
             f"{max((p.get('max_abs_diff') or 0 for p in prefixes), default=None)}, all within the declared "
             f"tolerance: {all(p.get('passed', (p.get('checks') or {}).get('within_tolerance')) for p in prefixes)}"]
    for summary in view.kind("timing_summary"):
        interval = summary.get("mean_post_first_interval_s") or {}
        if interval.get("median") is not None:
            lines.append(f"timing {summary.get('prompt_id')} cache {'on' if summary.get('use_cache') else 'off'}: "
                         f"median mean post-first interval {interval['median'] * 1e3:.3f} ms")
    return "\n".join(lines)


def _learner(root: Path) -> Optional[str]:
    """Who Gradescope says submitted (submission_metadata.json's users), or None."""
    try:
        users = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8")).get("users") or []
        return ", ".join(str(u.get("email") or u.get("name") or u.get("id")) for u in users) or None
    except (OSError, ValueError, AttributeError):
        return None


def grade_submission(root: Path) -> tuple:
    """(the grade of root/submission, graded against the course's run made here first; that run's summary)."""
    from inferlab import writing
    from inferlab.grade import grade, rubric
    from inferlab.read.runview import RunView

    source = root / "source"
    config = read_config(source)
    rules = rubric.load(source / config["rubric"] if config.get("rubric") else None)
    learner = _learner(root)
    found = find_submission(root / "submission")
    work = root / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tail = make_course_run(source, config, work / "course-run")
    if not (work / "course-run" / "manifest.json").is_file():
        raise BundleError(f"the course's run did not start (a set-up fault, not yours):\n{tail}")
    course = RunView.read(work / "course-run")
    if "archive" in found:
        result = grade.grade_source(found["archive"], rules, course, "the course's run, made here")
    else:
        texts = grade.Writing()
        for name in ("predictions", "explanation"):
            if found[name] is not None:
                try:
                    setattr(texts, name, writing.read(found[name], f"your {name}").decode("utf-8"))
                except writing.NotText as error:
                    raise BundleError(str(error)) from None
        result = grade.grade_writing(texts, rules, "your writing")
    result.learner = learner or result.learner
    return result, course_summary(course)


def run(root: Path) -> int:
    """run_autograder: write root/results/results.json, always (a refusal says why)."""
    from inferlab.grade import formats, grade

    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        result, summary = grade_submission(root)
    except (BundleError, OSError, subprocess.SubprocessError, ValueError) as error:
        result, summary = grade.Grade("your submission", None, learner=_learner(root), error=str(error)), None
    text = formats.gradescope(result, time.monotonic() - began, summary)
    write_bytes_atomic(results / "results.json", text.encode())
    print(f"autograder: {results / 'results.json'} written")
    return 0


def command(args) -> int:
    """`inferlab autograder gradescope -o ZIP` (inferlab.cli): write the zip; the exit status."""
    try:
        config = write_zip(args.output, args.specimen, args.artifacts, args.rubric, replace=args.replace)
    except BundleError as error:
        print(f"autograder: {error}", file=sys.stderr)
        return 2
    print(f"autograder: {args.output} written (specimen {config['specimen']})")
    return 0


def main(argv=None) -> int:
    require_environment("inferlab.grade.bundle")
    parser = argparse.ArgumentParser(prog="inferlab.grade.bundle", description="inside Gradescope's container")
    parser.add_argument("step", choices=("prepare", "run"))
    args = parser.parse_args(argv)
    root = Path(os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT)
    return prepare(root / "source") if args.step == "prepare" else run(root)


if __name__ == "__main__":
    sys.exit(main())
