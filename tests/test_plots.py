"""The report's plots: drawn from records alone, robust to one outlier, legends off the data, partial runs labelled."""

from __future__ import annotations

import copy

import pytest

from inferlab import report
from inferlab.run.records import RECORDS_FILE, REPORT_FILE
from inferlab.read.runview import RunView
from inferlab.report import decide, evidence, partial_note, plots

from fixtures_records import copy_run
from fixture_runs import fixture_runs, plots_not_drawn, runs, shared  # noqa: F401 (fixtures)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PARTIAL = "the run did not finish; 60 of 66 planned tests have an outcome"

rich_run = shared("rich_run", "rich_plots", "The shared rich run with the plots its report drew (never change it).")


@pytest.fixture(scope="module")
def rich_view(tmp_path_factory) -> RunView:
    return RunView.read(fixture_runs(tmp_path_factory).get("rich"))


@pytest.fixture(scope="module")
def drawn(rich_view):
    """figure(name): each plot drawn once from the shared records (the cache plot with its bound ratios)."""
    figures = {}

    def figure(name: str):
        if name not in figures:
            extra = {"bound_ratios": evidence.bound_ratios(rich_view)} if name == "cache_max_abs_diff" else {}
            figures[name] = plots.DRAWERS[name](rich_view.records, None, **extra)
        return figures[name]

    return figure


def texts(figure) -> list[str]:
    found = [t.get_text() for t in figure.texts] + [figure._suptitle.get_text()]
    return found + [t.get_text() for axis in figure.axes for t in axis.texts] + [a.get_title() for a in figure.axes]


@pytest.mark.slow
def test_plots_are_written_linked_and_byte_identical_when_redrawn(rich_run, tmp_path):
    pngs = sorted(rich_run.glob("*.png"))
    assert len(pngs) == 3 and all(png.read_bytes().startswith(PNG_SIGNATURE) for png in pngs)
    assert all(f"]({png.name})" in (rich_run / REPORT_FILE).read_text() for png in pngs)
    view = RunView.read(rich_run)
    results = plots.write_plots(tmp_path, view.records, partial=partial_note(decide(view), view),
                                bound_ratios=evidence.bound_ratios(view))
    assert [r["name"] for r in results if not r["available"]] == ["cpu_share"]  # its trials carry no CPU readings
    assert all((tmp_path / r["file"]).read_bytes() == (rich_run / r["file"]).read_bytes() for r in results
               if r["available"])


def test_one_outlier_is_drawn_at_a_clipped_edge_with_its_value_and_the_bulk_stays_readable(rich_view, drawn):
    noisy = [10.0, 10.4, 9.8, 11.2, 10.1, 12.9, 10.6]  # ordinary noise clips nothing; one outlier is clipped
    assert plots.clip_limit(noisy) is None and max(noisy) < plots.clip_limit(noisy + [400.0]) < 400.0
    assert not any(axis.texts for axis in drawn("ttft_interval").axes)
    records = copy.deepcopy(rich_view.records)
    trial = next(r for r in records if r["kind"] == "timing_trial" and not r["warmup"] and r["prompt_id"] == "P1")
    trial["token_times_s"] = [t * 200 for t in trial["token_times_s"]]
    trial["ttft_s"] *= 200
    trial["mean_post_first_interval_s"] *= 200
    figure = plots.draw_ttft_interval(records, None)
    bottom, top = figure.axes[0].get_ylim()
    typical = [r["ttft_s"] * 1e3 for r in rich_view.records if r["kind"] == "timing_trial" and not r["warmup"]]
    assert bottom == 0 and max(typical) < top < trial["ttft_s"] * 1e3 / 10
    assert f"{trial['ttft_s'] * 1e3:.3g}" in texts(figure)
    figure = plots.draw_token_times(records, None)
    assert figure.axes[0].get_ylim()[1] < max(trial["token_times_s"]) * 1e3 / 10
    assert any("values above the clipped axis" in t for t in texts(figure))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["token_times", "ttft_interval", "cache_max_abs_diff"])
def test_legends_sit_outside_every_axes(drawn, name):
    figure = drawn(name)
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    assert figure.legends
    for box in (legend.get_window_extent(renderer) for legend in figure.legends):
        assert not any(box.overlaps(axis.get_window_extent(renderer)) for axis in figure.axes if axis.axison), name


def test_the_cache_plot_shows_the_error_as_a_fraction_of_each_elements_bound(rich_view, drawn):
    ratio_axis = drawn("cache_max_abs_diff").axes[1]
    found = sorted(y for collection in ratio_axis.collections for _, y in collection.get_offsets())
    expected = sorted(r["bound_ratio"] for r in evidence.bound_ratios(rich_view) if r["bound_ratio"] > 0)
    assert "bound" in ratio_axis.get_title() and found[-len(expected):] == pytest.approx(expected)
    assert any(line.get_ydata()[0] == 1.0 for line in ratio_axis.get_lines())


def test_a_partial_runs_plots_say_so_in_their_title_and_write_report_passes_it(rich_run, rich_view, drawn, tmp_path,
                                                                             plots_not_drawn):
    for name in ("token_times", "ttft_interval", "cache_max_abs_diff"):
        assert plots.DRAWERS[name](rich_view.records, None, partial=PARTIAL)._suptitle.get_text().startswith(
            f"{plots.PARTIAL_PREFIX}: {PARTIAL}")
        assert plots.PARTIAL_PREFIX not in drawn(name)._suptitle.get_text()
    unfinished = copy_run(rich_run, tmp_path / "unfinished")
    lines = (unfinished / RECORDS_FILE).read_text().splitlines()
    (unfinished / RECORDS_FILE).write_text("\n".join(l for l in lines if '"session_end"' not in l) + "\n")
    report.write_report(unfinished)
    report.write_report(copy_run(rich_run, tmp_path / "finished"))
    assert plots_not_drawn[0]["partial"].startswith("the run did not finish") and plots_not_drawn[1]["partial"] is None
