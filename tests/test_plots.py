"""The report's plots: drawn from records alone, robust to one outlier, legends off the data, partial runs labelled."""

from __future__ import annotations

import copy

import pytest

from inferlab import report
from inferlab.run.records import RECORDS_FILE, REPORT_FILE
from inferlab.read.runview import RunView
from inferlab.report import plots
from inferlab.report import measures
from inferlab.report.verdict import decide, partial_note

from fixtures_records import copy_run
from fixture_runs import runs, shared, fixture_runs  # noqa: F401 (runs is a fixture)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PARTIAL = "the run did not finish; 60 of 66 planned tests have an outcome"


rich_run = shared("rich_run", "rich_plots", "The shared rich run with the plots its report drew (never change it: "
                  "copy it).")


@pytest.fixture(scope="module")
def rich_view(tmp_path_factory) -> RunView:
    """The shared rich run's view (the records and tensors rich_run has, without its drawn PNGs)."""
    return RunView.read(fixture_runs(tmp_path_factory).get("rich"))


@pytest.fixture(scope="module")
def records(rich_view) -> list[dict]:
    return rich_view.records  # in the current schema


@pytest.fixture(scope="module")
def drawn(records, rich_view):
    """figure(name, with_ratios=False): each plot drawn once from the shared records (not partial; the cache plot
    with or without its bound ratios), shared by the tests that only read the figure."""
    ratios = measures.bound_ratios(rich_view)
    figures = {}

    def figure(name: str, with_ratios: bool = False):
        if (name, with_ratios) not in figures:
            extra = {"bound_ratios": ratios} if with_ratios else {}
            figures[(name, with_ratios)] = plots.DRAWERS[name](records, None, **extra)
        return figures[(name, with_ratios)]

    return figure


def with_outlier(records: list[dict], factor: float = 200.0) -> tuple[list[dict], float]:
    """A copy of the records where one measured trial's timings are `factor` times longer; returns its TTFT in ms."""
    changed = copy.deepcopy(records)
    trial = next(r for r in changed if r["kind"] == "timing_trial" and not r["warmup"] and r["prompt_id"] == "P1")
    trial["token_times_s"] = [t * factor for t in trial["token_times_s"]]
    trial["ttft_s"] *= factor
    trial["mean_post_first_interval_s"] *= factor
    return changed, trial["ttft_s"] * 1e3


def texts(figure) -> list[str]:
    found = [t.get_text() for t in figure.texts]
    if figure._suptitle is not None:
        found.append(figure._suptitle.get_text())
    for axis in figure.axes:
        found += [t.get_text() for t in axis.texts] + [axis.get_title()]
    return found


@pytest.mark.slow
def test_plots_are_written_linked_and_byte_identical_when_redrawn(rich_run, records, tmp_path):
    text = (rich_run / REPORT_FILE).read_text()
    pngs = sorted(rich_run.glob("*.png"))
    assert len(pngs) == 3
    for png in pngs:
        assert png.read_bytes().startswith(PNG_SIGNATURE)
        assert f"]({png.name})" in text
    view = RunView.read(rich_run)
    results = plots.write_plots(tmp_path, records, partial=partial_note(decide(view), view),
                                bound_ratios=measures.bound_ratios(view))
    assert all(r["written"] for r in results if r["available"])
    assert [r["name"] for r in results if not r["available"]] == ["cpu_share"]  # its trials carry no CPU readings
    for result in (r for r in results if r["written"]):
        assert (tmp_path / result["file"]).read_bytes() == (rich_run / result["file"]).read_bytes()


def test_one_outlier_does_not_flatten_the_other_trials(records):
    changed, outlier_ms = with_outlier(records)
    figure = plots.draw_ttft_interval(changed, None)
    ttft_axis = figure.axes[0]
    bottom, top = ttft_axis.get_ylim()
    assert bottom == 0
    typical = [r["ttft_s"] * 1e3 for r in records if r["kind"] == "timing_trial" and not r["warmup"]]
    assert max(typical) < top < outlier_ms / 10  # the axis fits the bulk, far below the outlier
    assert f"{outlier_ms:.3g}" in texts(figure)  # the clipped value is written beside its marker


def test_token_times_clip_an_outlier_and_start_at_zero(records):
    changed, _ = with_outlier(records)
    figure = plots.draw_token_times(changed, None)
    p1_axis = figure.axes[0]
    assert p1_axis.get_ylim()[0] == 0
    longest = max(t for r in changed if r["kind"] == "timing_trial" and not r["warmup"] and r["prompt_id"] == "P1"
                  for t in r["token_times_s"])
    assert p1_axis.get_ylim()[1] < longest * 1e3 / 10
    assert any("values above the clipped axis" in t for t in texts(figure))


@pytest.mark.slow
def test_without_an_outlier_nothing_is_clipped(drawn):
    figure = drawn("ttft_interval")  # plots.draw_ttft_interval(records, None)
    assert not any(axis.texts for axis in figure.axes)
    assert all(axis.get_ylim()[0] == 0 for axis in figure.axes)


def test_clip_limit_ignores_ordinary_noise_and_catches_one_outlier():
    noisy = [10.0, 10.4, 9.8, 11.2, 10.1, 12.9, 10.6]
    assert plots.clip_limit(noisy) is None
    limit = plots.clip_limit(noisy + [400.0])
    assert limit is not None and max(noisy) < limit < 400.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["token_times", "ttft_interval", "cache_max_abs_diff"])
def test_legends_sit_outside_every_axes(drawn, name):
    figure = drawn(name, with_ratios=name == "cache_max_abs_diff")
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    legends = figure.legends + [axis.get_legend() for axis in figure.axes if axis.get_legend() is not None]
    assert legends, "the plot has no legend"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for axis in figure.axes:
            if axis.axison:
                assert not box.overlaps(axis.get_window_extent(renderer)), f"{name}: legend covers an axes"


def test_cache_plot_shows_the_error_as_a_fraction_of_each_elements_bound(rich_view, drawn):
    ratios = measures.bound_ratios(rich_view)
    figure = drawn("cache_max_abs_diff", with_ratios=True)  # plots.draw_cache_diff(records, None, bound_ratios=ratios)
    ratio_axis = figure.axes[1]
    assert "bound" in ratio_axis.get_title()
    drawn = sorted(y for collection in ratio_axis.collections for _, y in collection.get_offsets())
    expected = sorted(r["bound_ratio"] for r in ratios if r["bound_ratio"] > 0)
    assert drawn[-len(expected):] == pytest.approx(expected)
    assert any(line.get_ydata()[0] == 1.0 for line in ratio_axis.get_lines())


@pytest.mark.parametrize("name", ["token_times", "ttft_interval", "cache_max_abs_diff"])
def test_a_partial_runs_plots_say_so_in_their_title(records, drawn, name):
    figure = plots.DRAWERS[name](records, None, partial=PARTIAL)
    assert figure._suptitle.get_text().startswith(f"{plots.PARTIAL_PREFIX}: {PARTIAL}")
    complete = drawn(name)  # plots.DRAWERS[name](records, None)
    assert plots.PARTIAL_PREFIX not in complete._suptitle.get_text()


@pytest.mark.slow
def test_write_report_labels_the_plots_of_an_unfinished_run_as_partial(rich_run, tmp_path, monkeypatch):
    run = copy_run(rich_run, tmp_path / "unfinished")
    lines = (run / RECORDS_FILE).read_text().splitlines()
    (run / RECORDS_FILE).write_text("\n".join(l for l in lines if '"session_end"' not in l) + "\n")
    seen = {}
    original = plots.write_plots

    def capture(record_dir, records, partial=None, bound_ratios=None):
        seen["partial"] = partial
        return original(record_dir, records, partial=partial, bound_ratios=bound_ratios)

    monkeypatch.setattr(plots, "write_plots", capture)
    report.write_report(run)
    assert seen["partial"].startswith("the run did not finish")

    def capture_only(record_dir, records, partial=None, bound_ratios=None):  # only the argument is read here
        seen["partial"] = partial
        return []

    monkeypatch.setattr(plots, "write_plots", capture_only)
    report.write_report(copy_run(rich_run, tmp_path / "finished"))
    assert seen["partial"] is None
