"""--revised-cache-criterion ATOL,RTOL --justification TEXT: parsing, pairing, and usage errors naming the value."""

from __future__ import annotations

import pytest

from inferlab import protocol
from inferlab.measure.revised_criterion import (
    RevisedCriterionError,
    check_options,
    from_options,
    parse_criterion,
)


def test_parse_two_numbers():
    option = parse_criterion("1e-4,2.5e-3")
    assert (option.atol, option.rtol, option.text) == (1e-4, 2.5e-3, "1e-4,2.5e-3")
    assert option.tolerance == protocol.Tolerance(atol=1e-4, rtol=2.5e-3)


@pytest.mark.parametrize("text, why", [
    ("1e-4", "1 part"), ("1e-4,1e-3,0", "3 part"), ("a,1e-3", "ATOL 'a' is not a number"),
    ("1e-4,", "RTOL '' is not a number"), ("-1e-4,1e-3", "ATOL '-1e-4' is not finite and >= 0"),
    ("1e-4,nan", "RTOL 'nan' is not finite and >= 0"), ("inf,0", "ATOL 'inf' is not finite"),
])
def test_bad_values_are_refused_by_name(text, why):
    with pytest.raises(RevisedCriterionError) as caught:
        parse_criterion(text)
    assert repr(text) in str(caught.value) and why in str(caught.value)


def test_a_criterion_needs_a_justification_and_the_other_way_round():
    with pytest.raises(RevisedCriterionError, match=r"--revised-cache-criterion 1e-4,1e-3: expected a --justification"):
        check_options(parse_criterion("1e-4,1e-3"), "   ")
    with pytest.raises(RevisedCriterionError, match=r"--justification 'because': expected it together"):
        check_options(None, "because")
    check_options(None, None)  # neither: nothing changes


def test_from_options_builds_the_record():
    revised = from_options(parse_criterion("1e-4,1e-3"), "  reduction order differs in the one-token path  ")
    record = revised.as_record()
    assert (record["atol"], record["rtol"]) == (1e-4, 1e-3)
    assert record["rule"] == "|a-b| <= 0.0001 + 0.001*|b| (b = uncached reference)"
    assert record["justification"] == "reduction order differs in the one-token path"
    assert "declared criterion" in record["label"]
    assert from_options(None, None) is None


@pytest.fixture
def suite(suite):
    """The plugin's scratch suite (tests/conftest.py) with one experiment that records something."""
    (suite.path / "experiments" / "test_exp.py").write_text(
        "import pytest\n@pytest.mark.records('x')\ndef test_a(record):\n    record('x')\n")
    return suite


@pytest.mark.parametrize("arguments, message", [
    (["--revised-cache-criterion", "1e-4"], "*--revised-cache-criterion*'1e-4'*"),
    (["--revised-cache-criterion", "x,1e-3", "--justification", "why"], "*--revised-cache-criterion*'x,1e-3'*"),
    (["--revised-cache-criterion", "1e-4,1e-3"], "*--revised-cache-criterion 1e-4,1e-3: expected a --justification*"),
    (["--justification", "because"], "*--justification 'because': expected it together*"),
    (["--revised-cache-criterion", "1e-4,1e-3", "--justification", "x"],
     "*--justification: expected a sentence saying why the criterion is justified, at least 6 words*"),
    (["--revised-cache-criterion", "1e300,1e300", "--justification", "the one-token path sums in another order"],
     "*expected RTOL below 1*"),
], ids=["one_number", "not_a_number", "no_justification", "justification_alone", "thin_justification", "rtol_1"])
def test_bad_options_are_usage_errors_and_write_nothing(suite, arguments, message):
    # in process: only the exit status, the text and the folder are read
    result = suite.runpytest("experiments", "--record-dir", "run", *arguments)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert not (suite.path / "run").exists()


def test_help_states_the_default(suite):
    result = suite.runpytest("--help")
    text = result.stdout.str()
    assert "--revised-cache-criterion=ATOL,RTOL" in text and "--justification=TEXT" in text
    assert "default: none, the declared criterion only" in " ".join(text.split())
