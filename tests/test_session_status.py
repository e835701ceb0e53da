"""Pure helpers of the session's honesty: the typed command, the predictions template, the status line."""

from __future__ import annotations

from pathlib import Path

from inferlab.host import environment
from inferlab.run import predictions, session_status

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_a_console_script_is_recorded_as_the_script_the_learner_ran():
    command, how = environment.typed_command(
        ["/repo/.venv/bin/python", "/repo/.venv/bin/pytest", "experiments", "-k", "a or b"],
        ["/repo/.venv/bin/pytest", "experiments", "-k", "a or b"], ("experiments", "-k", "a or b"), Path("/repo"))
    assert command == ".venv/bin/pytest experiments -k 'a or b'" and how.startswith("sys.orig_argv")


def test_python_dash_m_pytest_keeps_the_interpreter_as_typed():
    command, _ = environment.typed_command([".venv/bin/python", "-m", "pytest", "experiments", "--record-dir", "r"],
                                           ["/x/pytest/__main__.py", "experiments", "--record-dir", "r"],
                                           ("experiments", "--record-dir", "r"), Path("/repo"))
    assert command == ".venv/bin/python -m pytest experiments --record-dir r"


def test_an_in_process_call_says_that_the_launcher_is_unknown():
    command, how = environment.typed_command(["python", "-m", "pytest", "tests"], ["/x/pytest/__main__.py", "tests"],
                                             ("experiments", "--record-dir", "r"), Path("/repo"))
    assert command == "python -m pytest experiments --record-dir r" and "in-process" in how


def test_the_template_is_unanswered_even_with_changed_whitespace_and_answered_on_a_later_line():
    template = (REPO_ROOT / "predictions.md").read_text()
    assert predictions.template_status(template + "\n\n", template)["template_unanswered"] is True
    answered = template.replace("Why:\n", "Why:\nbecause greedy selection is deterministic\n", 1)
    status = predictions.template_status(answered, template)
    assert status["template_unanswered"] is False and status["template_check"] == "1 of 18 answer fields filled in"


def test_a_free_form_file_is_taken_as_answered():
    status = predictions.template_status("I expect identical greedy ids.\n", None)
    assert status["template_unanswered"] is False


def test_the_status_line_puts_an_unfinished_run_before_its_partial_reasons():
    end = session_status.session_end_fields(
        exit_status=2, exit_code_name="INTERRUPTED", signals=["SIGINT"], collect_only=False, plan_only=False,
        stopped_reason="interrupted by SIGINT", planned=["a", "b"], with_outcome={"a"},
        partial_reasons=["-k 'x' deselected 3 protocol test(s)"], optional_notes=[])
    assert end["complete"] is False and end["tests_without_outcome"] == ["b"]
    assert session_status.status_line(end, {"passed": 1}) == (
        "the run did NOT finish (interrupted by SIGINT): 1 of 2 planned tests have no outcome (1 passed); "
        "PARTIAL, not the complete protocol: -k 'x' deselected 3 protocol test(s)")


def test_the_status_line_of_a_complete_run_names_the_optional_extension_it_left_out():
    left_out = "experiments/test_70_batching.py (Part 7: batching): 0 of its 4 tests planned (4 deselected)"
    end = session_status.session_end_fields(
        exit_status=0, exit_code_name="OK", signals=[], collect_only=False, plan_only=False, stopped_reason=None,
        planned=["a"], with_outcome={"a"}, partial_reasons=[], optional_notes=[left_out])
    assert end["complete"] is True
    assert session_status.status_line(end, {"passed": 1}) == (
        "the session reached its end: all 1 planned tests have an outcome (1 passed); the plan is the complete "
        f"protocol; the optional extension was left out: {left_out}")
    end = session_status.session_end_fields(
        exit_status=0, exit_code_name="OK", signals=[], collect_only=False, plan_only=False, stopped_reason=None,
        planned=["a"], with_outcome={"a"}, partial_reasons=[], optional_notes=[])
    assert session_status.status_line(end, {"passed": 1}).endswith("; the plan is the complete protocol")


def test_an_experiment_module_is_optional_only_when_its_pytestmark_names_the_marker(tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "test_a.py").write_text('"""Part A."""\nimport pytest\npytestmark = pytest.mark.batching\n')
    (experiments / "test_b.py").write_text('"""Part B."""\nimport pytest\n'
                                           'pytestmark = [pytest.mark.batching, pytest.mark.optional_extension]\n')
    (experiments / "test_c.py").write_text('"""Part C."""\nimport pytest\n@pytest.mark.optional_extension\n'
                                           'def test_x():\n    pass\n')
    parts = {part["file"]: part for part in session_status.experiment_parts(tmp_path, "experiments")}
    assert [parts[f"experiments/test_{n}.py"]["optional"] for n in "abc"] == [False, True, False]
    assert parts["experiments/test_b.py"]["title"] == "Part B."


def test_the_project_declares_exactly_the_batching_extension_optional():
    parts = session_status.experiment_parts(REPO_ROOT, "experiments")
    assert [part["file"] for part in parts if part["optional"]] == ["experiments/test_70_batching.py"]
