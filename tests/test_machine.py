"""inferlab.host.machine and benchmarks/overhead.py: the machine's fingerprint and caches, where benchmark results go,
and how the overhead benchmark orders, places and judges its rounds."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from inferlab.host import machine

try:
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None


def test_a_result_is_appended_after_the_earlier_ones_outside_tracked_files_unless_asked(tmp_path):
    from benchmarks.overhead import build_parser

    path = tmp_path / "deeper" / "results.jsonl"
    machine.append_result({"n": 1}, path)
    machine.append_result({"n": 2}, path)
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [1, 2]
    ignored = subprocess.run(["git", "-C", str(machine.PROJECT_ROOT), "check-ignore", "-q", str(machine.RESULTS_FILE)])
    assert ignored.returncode == 0, f"{machine.RESULTS_FILE} is not ignored by git"
    assert build_parser().parse_args([]).results == machine.RESULTS_FILE != machine.TRACKED_RESULTS_FILE


@pytest.mark.slow  # a real benchmark run, in process, on a tiny model
def test_the_benchmark_records_what_ran_to_the_file_it_is_given(tmp_path, monkeypatch):
    """The commit is read as the benchmark starts; its thread settings are noted here, not made (torch takes the
    inter-op count only before any parallel work)."""
    import torch

    import benchmarks.overhead as overhead
    from inferlab import protocol
    from inferlab.specimen.build import tiny_gpt_neox

    threads = {}
    monkeypatch.setattr(torch, "set_num_threads", lambda count: threads.setdefault("intra_op", count))
    monkeypatch.setattr(torch, "set_num_interop_threads", lambda count: threads.setdefault("inter_op", count))
    monkeypatch.setattr(overhead, "load_model", lambda workdir: (tiny_gpt_neox(seed=0), [5, 17, 33], 0, "tiny"))
    states = iter([{"commit": "as it started", "dirty": False}])
    monkeypatch.setattr(overhead, "git_state", lambda root: next(states, {"commit": "as it ended", "dirty": True}))
    monkeypatch.chdir(machine.PROJECT_ROOT)
    assert overhead.main(["--rounds", "7", "--record-to", str(tmp_path / "chosen.jsonl")]) == 0
    assert threads == {"intra_op": protocol.INTRA_OP_THREADS, "inter_op": protocol.INTER_OP_THREADS}
    [result] = [json.loads(line) for line in (tmp_path / "chosen.jsonl").read_text().splitlines()]
    assert result["rounds"] == 7 and result["machine"] == machine.machine_fingerprint()
    assert result["git"] == {"commit": "as it started", "dirty": False}
    assert result["paired"]["verdict"].startswith("this run cannot tell: its rounds did not use every stack depth")


def test_a_benchmark_result_carries_its_ratios_and_what_ran():
    from benchmarks.overhead import make_result

    per_token_ns = {"instrumented": [110.0, 100.0, 105.0], "bare": [100.0, 100.0, 100.0],
                    "hooked": [101.0, 102.0, 100.0], "bare_again": [100.0, 100.5, 99.0],
                    "generate": [120.0, 121.0, 119.0]}
    warm = {"instrumented": [1, 2], "bare": [1, 2], "generate": [1, 2]}
    result = make_result(per_token_ns, warm, "stand-in", prompt_tokens=9, selections=16, rounds=3)
    fingerprint = result["machine"]  # the hardware, and no host name
    assert set(fingerprint) == {"system", "machine", "cpu_model", "logical_cpus"} and all(fingerprint.values())
    assert fingerprint == machine.machine_fingerprint() and result["recorded_utc"] and set(result["git"]) >= {"commit"}
    assert (result["overhead_ratio"], result["generate_ratio"]) == (1.05, 1.2)
    assert result["ids_equal"] == {"instrumented_vs_bare": True, "instrumented_vs_generate": True}
    assert result["paired"]["overhead"] == 1.05 and result["paired"]["aa"] == 1.0
    # the per-forward hook alone, and the rest of the instrumentation without it, each from its own rounds
    assert result["hook"]["median"] == pytest.approx(1.01) and result["readings_without_hook"]["median"] == \
        pytest.approx(statistics.median([110 / 101, 100 / 102, 105 / 100]))
    assert json.loads(json.dumps(result)) == result


def rounds_around(centre: float, spread: float = 0.1, count: int = 11) -> list:
    """count per-token times evenly spread by +-spread around centre (a run's rounds, without randomness)."""
    return [centre + spread * (2 * i / (count - 1) - 1) for i in range(count)]


@pytest.mark.parametrize("instrumented, bare_again, verdict", [
    (rounds_around(100.4), rounds_around(100.0), "within 1%"),
    (rounds_around(99.6), rounds_around(100.0), "within 1%"),
    (rounds_around(105.0), rounds_around(100.0), "over 1%"),
    (rounds_around(100.5), rounds_around(100.7), "this run cannot tell: the overhead is within the noise of 1%"),
    (rounds_around(100.4), rounds_around(103.0), "this run cannot tell whether the overhead is within 1%"),
    (rounds_around(100.4)[:5], rounds_around(100.0)[:5], "this run cannot tell whether the overhead is within 1%"),
    # one round a full collection doubled moves the median's interval by one rank (a deviation would call it +-9 %)
    (rounds_around(100.4)[:-1] + [200.0], rounds_around(100.0), "within 1%"),
    (rounds_around(97.0), rounds_around(100.0), "this run cannot tell: the instrumented loop came out faster"),
], ids=["within", "within-below", "over", "within-the-noise", "a-a-too-far", "too-few-rounds", "one-slow-round",
        "faster"])
def test_the_benchmark_claims_the_1_percent_bound_only_above_its_own_noise(instrumented, bare_again, verdict):
    from benchmarks.overhead import paired_ratios

    timings = {"instrumented": instrumented, "bare": [100.0] * len(instrumented), "bare_again": bare_again}
    assert paired_ratios(timings)["verdict"].startswith(verdict)
    assert paired_ratios(timings, placements_balanced=False)["verdict"].startswith(
        "this run cannot tell: its rounds did not use every stack depth")


def test_the_median_interval_is_the_binomial_order_statistics_one():
    """n = 20: P(Bin(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(<= 6), so x(6) and x(15); under 6 values no interval."""
    import math

    from benchmarks.overhead import median_interval

    assert median_interval([float(v) for v in range(20, 0, -1)]) == (6.0, 15.0)
    assert median_interval(list(range(1, 101))) == (40, 61)
    assert median_interval([1, 2, 3, 4, 5]) == (-math.inf, math.inf)


def test_every_round_runs_at_one_stack_depth_the_depths_are_used_evenly_and_every_variant_follows_each_other_one():
    """at_depth puts exactly `depth` frames below the call, and each pass of STACK_DEPTHS rounds uses each depth once;
    a verdict needs whole passes of both the depths and the order cycle. Read as one stream across rounds, the cycle
    has every ordered pair of different variants equally often and no variant twice in a row (a rotation of one order
    put the instrumented loop after generate in 3 of 4 rounds)."""
    from benchmarks.overhead import (STACK_DEPTHS, VARIANTS, at_depth, balanced_cycle, balanced_rounds, depth_use,
                                     full_pass_rounds, preceded_by, round_depths, round_orders)

    def frames_below() -> int:
        frame, count = sys._getframe(1), 0
        while frame is not None and frame.f_code is at_depth.__code__:
            count, frame = count + 1, frame.f_back
        return count

    assert [at_depth(depth, frames_below) for depth in (0, 1, 5, STACK_DEPTHS - 1)] == [1, 2, 6, STACK_DEPTHS]
    depths = round_depths(2 * STACK_DEPTHS)
    assert sorted(depths) == sorted(list(range(STACK_DEPTHS)) * 2) and depth_use(depths) == "2"
    assert depth_use(round_depths(STACK_DEPTHS + 1)) == "1 to 2"
    assert all(abs(a - b) > 1 for a, b in zip(depths, depths[1:]))  # neighbouring rounds are not neighbouring depths
    assert full_pass_rounds() == len(balanced_cycle(len(VARIANTS))) * STACK_DEPTHS == 4 * STACK_DEPTHS
    assert balanced_rounds(2 * full_pass_rounds())
    assert not balanced_rounds(full_pass_rounds() + 1) and not balanced_rounds(STACK_DEPTHS)
    for count in (2, 3, 4, 5):
        cycle = balanced_cycle(count)
        assert all(sorted(order) == list(range(count)) for order in cycle)
        stream = [i for order in cycle + cycle[:1] for i in order][: len(cycle) * count + 1]
        pairs = list(zip(stream, stream[1:]))
        assert all(a != b for a, b in pairs)
        assert len({pairs.count((a, b)) for a in range(count) for b in range(count) if a != b}) == 1
    names = ["instrumented", "bare", "bare_again", "generate"]
    counts = preceded_by(round_orders(names, 10 * len(balanced_cycle(len(names)))))
    assert counts["generate"] == {"instrumented": 10, "bare": 10, "bare_again": 10}


@pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11)
                    or not hasattr(resource, "RUSAGE_THREAD"),
                    reason="STACK_DEPTHS counts at_depth frames of CPython 3.11's size (other versions size frames "
                           "otherwise), and the page faults are read per thread (Linux)")
def test_the_frame_stack_boundaries_a_call_meets_repeat_every_stack_depths_depths():
    """The benchmark's premise, measured: a small call tree faults pages only where it crosses a chunk boundary, and
    those depths come back every STACK_DEPTHS frames, the frames one chunk holds."""
    from benchmarks.overhead import STACK_DEPTHS, at_depth

    def nested(depth: int) -> int:
        return nested(depth - 1) if depth else 0

    def faults() -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(50):
            nested(12)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    faulting = [depth for depth in range(520) if at_depth(depth, faults) >= 25]  # a crossing: one fault a call
    starts = [depth for depth in faulting if depth - 1 not in faulting]
    assert len(starts) >= 3, faulting
    assert [b - a for a, b in zip(starts, starts[1:])] == [STACK_DEPTHS] * (len(starts) - 1), starts


def test_the_machines_load_and_caches_come_from_the_platforms_files_or_are_said_unavailable(tmp_path, monkeypatch):
    proc, cpus = tmp_path / "proc", tmp_path / "cpu"
    (proc / "pressure").mkdir(parents=True)
    (proc / "loadavg").write_text("0.50 0.40 0.30 2/345 6789\n")
    (proc / "pressure" / "cpu").write_text("some avg10=1.50 avg60=2.00 avg300=3.00 total=123456\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (cpus / "cpu0" / "cpufreq").mkdir(parents=True)
    (cpus / "cpu0" / "cpufreq" / "scaling_cur_freq").write_text("2400000\n")
    monkeypatch.setattr(machine, "PROC", proc)
    monkeypatch.setattr(machine, "CPU_SYS", cpus)
    state = machine.machine_state()
    assert state["running_processes"] == {"available": True, "running": 2, "total": 345,
                                          "source": state["running_processes"]["source"]}
    assert state["cpu_pressure"]["some"] == {"avg10": 1.5, "avg60": 2.0, "avg300": 3.0, "total": 123456}
    assert state["cpu_frequency"]["mhz"] == {"cpu0": 2400.0} and machine.unexplained_readings(state) == []
    later = {**state, "read_at_ns": state["read_at_ns"] + 10_000_000,
             "cpu_pressure": {**state["cpu_pressure"], "some": {**state["cpu_pressure"]["some"], "total": 125456}}}
    assert machine.pressure_between(state, later) == pytest.approx(0.2)  # 2 ms of waiting in 10 ms
    # a platform without those files: each reading unavailable, and why
    monkeypatch.setattr(machine, "PROC", tmp_path / "no-proc")
    monkeypatch.setattr(machine, "CPU_SYS", tmp_path / "no-sys")
    state = machine.machine_state()
    for name, where in (("running_processes", "no-proc"), ("cpu_pressure", "no-proc"), ("cpu_frequency", "no-sys")):
        assert state[name]["available"] is False and where in state[name]["reason"], state[name]
        assert set(state[name]) == {"available", "reason"}  # nothing made up beside the reason
    assert machine.unexplained_readings(state) == []
    assert machine.unexplained_readings({**state, "cpu_pressure": {"available": False}}) == ["cpu_pressure"]
    assert machine.pressure_between(state, state) is None
    # the cache sizes from sysfs, or unknown where it is absent
    for index, (level, kind, size) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "64K"),
                                                 ("2", "Unified", "512K"), ("3", "Unified", "32768K")]):
        folder = tmp_path / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(value + "\n")
    found = machine.cache_sizes(tmp_path / "cache")
    assert [(e["level"], e["type"], e["bytes"]) for e in found["levels"]] == [
        (1, "Data", 32768), (1, "Instruction", 65536), (2, "Unified", 524288), (3, "Unified", 32 * 2**20)]
    assert found["largest_bytes"] == 32 * 2**20
    missing = machine.cache_sizes(tmp_path / "nowhere")
    assert missing["levels"] == [] and missing["largest_bytes"] == "unknown" and "unknown" in missing["note"]
