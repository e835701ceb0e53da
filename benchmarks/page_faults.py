"""Where a timing trial's minor page faults come from: the instrumented loop's own count, per span, in conditions
that separate the candidates.

Usage (from the repository root):  python -m benchmarks.page_faults [--calls N]

On the stand-in, with 1 thread, after a warmup of each: the thread's minor faults (getrusage(RUSAGE_THREAD)) of
  - a timing trial's prefill span and loop span (run_greedy_loop's own readings), and of the bare loop, for P1 and
    P1x8 with the cache on and off: the cache's tensors differ by prompt and setting, so a count that does not is
    not theirs;
  - the same trial (P1, cache on) started below 0 to STACK_DEPTHS - 1 padding frames (benchmarks.overhead.at_depth),
    every SWEEP_STEP-th: the interpreter's frame-stack chunks are met at other places as the depth moves, the
    tensors are not.
  - with --timing ROUNDS: what the faults cost, the frame-placement effect itself: the same bare loop started at
    the sweep's depth with the most faults and at the one with the fewest, one after the other in each round
    (their order alternating), its time at the first over its time at the second, the median of the rounds with
    its distribution-free 95 % interval (benchmarks.overhead.median_interval), and the same for two runs at the
    same depth (A/A).
Run it again under MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456
(glibc keeps all freed memory) to see whether the allocator returning memory causes them. Prints one JSON object;
with --record-to FILE (benchmarks/results.jsonl for the tracked record, which a run quotes) it is also appended
there with this machine's fingerprint, the date and the commit. The findings are in docs/timing.md ("Minor page
faults").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import STACK_DEPTHS, at_depth, median_interval, timed_call  # noqa: E402
from inferlab import protocol  # noqa: E402
from inferlab.host import machine  # noqa: E402
from inferlab.host.environment import git_state  # noqa: E402
from inferlab.measure.decode_loop import bare_greedy_loop, run_greedy_loop  # noqa: E402

SWEEP_STEP = 6


def thread_faults() -> int:
    """This thread's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def main(argv=None) -> int:
    """Measure and print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6, help="measured calls per condition (default 6)")
    parser.add_argument("--timing", type=int, default=0, metavar="ROUNDS",
                        help="also time the bare loop at the most and the fewest faulting depth (default 0: no)")
    parser.add_argument("--record-to", dest="results", type=Path, default=None, metavar="FILE",
                        help="append the result to this JSON Lines file (default: none, printed only)")
    args = parser.parse_args(argv)
    started_at = git_state(machine.PROJECT_ROOT)  # the code that runs is the code as it starts
    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    torch.set_num_interop_threads(protocol.INTER_OP_THREADS)
    from inferlab.measure.loading import load_specimen
    from inferlab.specimen import load_spec
    from inferlab.specimen.build import STANDIN

    with tempfile.TemporaryDirectory() as tmp:
        STANDIN.build(Path(tmp))
        loaded = load_specimen(Path(tmp), load_spec("standin"))
    model, tokenizer = loaded["model"], loaded["tokenizer"]
    inputs = {}
    for prompt_id, text in protocol.TIMING_PROMPTS.items():
        ids = torch.tensor([tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]])
        inputs[prompt_id] = (ids, torch.ones_like(ids))  # (1, T) each

    def trial(prompt_id: str, use_cache: bool) -> tuple[int, int]:
        spans = run_greedy_loop(model, *inputs[prompt_id], use_cache=use_cache).to_record()["cpu_evidence"]
        return spans["prefill"]["thread_minor_faults"], spans["loop"]["thread_minor_faults"]

    def bare(prompt_id: str, use_cache: bool) -> int:
        before = thread_faults()
        bare_greedy_loop(model, *inputs[prompt_id], use_cache=use_cache)
        return thread_faults() - before

    found = {"benchmark": "benchmarks/page_faults.py", "git": started_at, "machine": machine.machine_fingerprint(),
             "recorded_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
             "python": sys.version.split()[0], "torch": torch.__version__,
             "malloc_settings": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
             "forwards_per_loop": protocol.TIMING_NEW_TOKENS}
    for prompt_id in protocol.TIMING_PROMPTS:
        for use_cache in (True, False):
            trial(prompt_id, use_cache), bare(prompt_id, use_cache)  # warmup
            trials = [trial(prompt_id, use_cache) for _ in range(args.calls)]
            found[f"{prompt_id} cache {'on' if use_cache else 'off'}"] = {
                "trial_prefill": sorted(p for p, _ in trials), "trial_loop": sorted(loop for _, loop in trials),
                "bare_loop": sorted(bare(prompt_id, use_cache) for _ in range(args.calls))}
    sweep = {depth: at_depth(depth, lambda: trial("P1", True))[1] for depth in range(0, STACK_DEPTHS, SWEEP_STEP)}
    found["P1 cache on, trial loop by stack depth"] = {str(depth): count for depth, count in sweep.items()}
    if args.timing:
        worst, best = max(sweep, key=sweep.get), min(sweep, key=sweep.get)
        found["placement_timing"] = {"depths": {"most_faults": worst, "fewest_faults": best},
                                     **placement_timing(lambda: bare("P1", True), worst, best, args.timing)}
    print(json.dumps(found, indent=1))
    if args.results is not None:
        machine.append_result(found, args.results)
    return 0


def placement_timing(call, worst: int, best: int, rounds: int) -> dict:
    """The same call's time at depth `worst` over its time at `best`, and at `best` over `best` again (A/A): per
    round, the two in alternating order; the medians with their 95 % intervals."""
    ratios, same = [], []
    for index in range(rounds):
        order = [(worst, "w"), (best, "b"), (best, "a")]
        times = {name: at_depth(depth, lambda: timed_call(call)) for depth, name in (order if index % 2 else order[::-1])}
        ratios.append(times["w"] / times["b"])
        same.append(times["a"] / times["b"])
    return {"rounds": rounds, "most_over_fewest": statistics.median(ratios),
            "interval": list(median_interval(ratios)), "aa": statistics.median(same),
            "aa_interval": list(median_interval(same))}


if __name__ == "__main__":
    sys.exit(main())
