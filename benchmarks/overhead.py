"""Cost of the timing instrumentation: instrumented loop vs the bare same-forwards loop vs generate().

Usage (from the repository root):  python -m benchmarks.overhead [--rounds N] [--record-to FILE]

In one process with 1 intra-op / 1 inter-op thread: warm each variant up, then over N interleaved
rounds time one complete 16-selection greedy run of
  (a) run_greedy_loop   (cache on, timestamps, the thread-usage readings at the ends of its spans (CPU time,
                         switches, the thread's and the process's page faults), the collection watch, and the
                         session's per-forward hook (inferlab.measure.loading.ForwardWatch): everything a trial runs),
  (b) bare_greedy_loop  (the same forwards and selections, no timestamps, no hook),
  (h) bare_greedy_loop with the per-forward hook registered (around the call, outside its timing): what the hook
       alone costs; (a)/(h) is then what the stamps, the usage reads and the watch cost without it,
  (c) model.generate    (greedy, min_new_tokens = max_new_tokens so EOS cannot stop it early),
  (b') bare_greedy_loop again, an A/A control: the same code as (b), so its distance from (b) is this
       benchmark's own noise, the smallest overhead it can resolve,
each measured from outside with perf_counter_ns and divided by the number of selections. Every timed call runs as
a timing trial's spans do by default: with the cyclic collector off, after one full collection and gc.freeze()
before the first round (COLLECTOR_DESIGN), so no variant pays for a collection another left due. The calls form one
stream in which every variant comes right after each other variant equally often (balanced_cycle; a rotation of
one fixed order would put (a) after (c) in 3 of 4 rounds and (b') never, so whatever generate leaves behind would
count as instrumentation, and the A/A control would not share it).

Where a call sits on CPython's frame stack matters as much as what it does. Since 3.11 the interpreter keeps
its frames in 16 KiB chunks and frees a chunk as soon as the frame that opened it returns (CPython issue
gh-142183, fixed only in 2026 releases: Debian 13's 3.13.5 shows it too, benchmarks/page_faults.py): a forward whose calls cross a chunk boundary maps and unmaps a
chunk each time, dozens of times a token. Measured here with the bare loop alone, moving its starting depth one
small frame at a time changed its page faults per call from 64 to 2880, in a pattern that comes back every
chunk. Two variants whose own frames differ by a few locals start the model at different offsets, so a
comparison made at one depth measures that accident as well as the variants: at one depth the instrumented call
made about 1070 chunk mappings to the bare loop's 720 and spent 2 to 4 ms more of a 260 ms call in the kernel
(most likely the earlier 1.03 "overhead"), at another the loop without its kept logits came out 2 % faster than
bare. So every round runs all its variants at one stack depth (at_depth: `depth` frames of exactly
STACK_FRAME_SLOTS slots below the timed call), and the rounds step through the STACK_DEPTHS depths whose frames
one chunk holds, each equally often: every variant meets the chunk's offsets alike (sampled every 128 bytes),
and what is left is what the variants do. The verdict is then about the loops averaged over placements; at any
one placement, as in a real run, the two can differ by a few percent either way.

Besides the ratio of medians, each round's a/b and b'/b are taken (neighbours in time, at the same depth, so a
slow drift of the machine cancels), with a distribution-free 95 % interval of their median (order statistics:
a call that a garbage collection or the host's steal doubled moves it no more than any other slow call). The
verdict on the 1 % bound is drawn only from whole passes of depths and orders (a multiple of full_pass_rounds),
and only when the noise (the A/A distance, or the interval's larger half, whichever is larger) is below it;
"within 1%" needs the overhead plus the noise inside 1 % on either side. Otherwise it says it cannot tell.
The model is the synthetic stand-in (pythia-14m's architecture), built offline. The result, with this
machine's fingerprint, the date and the commit it ran, is appended to runs/benchmarks/overhead.jsonl (untracked),
or to the file --record-to names (benchmarks/results.jsonl to add it to the tracked record). No experiment run
reads it. The last line is exactly:  overhead_ratio=<a/b> generate_ratio=<c/b>
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferlab import protocol  # noqa: E402
from inferlab.host import machine  # noqa: E402
from inferlab.host.environment import git_state  # noqa: E402
from inferlab.measure import usage  # noqa: E402
from inferlab.measure.loading import ForwardWatch  # noqa: E402
from inferlab.measure.decode_loop import bare_greedy_loop, run_greedy_loop  # noqa: E402
from inferlab.measure.sampling import greedy_generation_config  # noqa: E402

MIN_ROUNDS = 7
OVERHEAD_BOUND = 0.01  # the instrumented loop's goal: within 1 % of the bare one
VARIANTS = ("instrumented", "bare", "hooked", "bare_again", "generate")
HOOKED = ("instrumented", "hooked")  # run with the session's per-forward hook registered, as every trial is


def load_model(workdir: Path):
    """(model, input_ids, eos id, description): the stand-in, built offline, with P1 tokenized."""
    from inferlab.measure.loading import load_specimen
    from inferlab.specimen import load_spec
    from inferlab.specimen.build import STANDIN

    STANDIN.build(workdir)
    loaded = load_specimen(workdir, load_spec("standin"))
    tokenizer = loaded["tokenizer"]
    ids = tokenizer(protocol.PROMPTS["P1"], add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
    return loaded["model"], ids, tokenizer.eos_token_id, "stand-in (inferlab.standin), P1 tokenized"


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's command line: --rounds, --record-to."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=full_pass_rounds(),
                        help=f"interleaved rounds (default {full_pass_rounds()}, about 8 minutes on a quiet machine; at least "
                             f"{MIN_ROUNDS}, and a multiple of {full_pass_rounds()} for a verdict)")
    parser.add_argument("--record-to", dest="results", type=Path, default=machine.RESULTS_FILE, metavar="FILE",
                        help=f"append the result to this JSON Lines file (default: {machine.RESULTS_FILE}, which git "
                             f"ignores; pass {machine.TRACKED_RESULTS_FILE.relative_to(machine.PROJECT_ROOT)} to add it "
                             f"to the tracked record)")
    return parser


def main(argv=None) -> int:
    """Run the benchmark and print medians, then the ratio line last."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds {args.rounds}: at least {MIN_ROUNDS} required")

    # Threads first: torch accepts the inter-op count only before parallel work starts.
    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    torch.set_num_interop_threads(protocol.INTER_OP_THREADS)

    n = protocol.TIMING_NEW_TOKENS
    # the code that runs is the code as it starts: a commit or an edit made during a long run is not its state
    started_at = git_state(machine.PROJECT_ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        model, prompt, eos, description = load_model(Path(tmp))
    input_ids = torch.tensor([prompt], dtype=torch.long)  # (1, T)
    mask = torch.ones_like(input_ids)
    config = greedy_generation_config(n, eos, eos, min_new_tokens=n)

    def instrumented():  # every reading a trial takes; the collector is off already (collector_state, below)
        return run_greedy_loop(model, input_ids, mask, use_cache=True, new_tokens=n, eos_token_id=eos,
                               collector_policy=usage.ON_IN_SPANS).generated_ids

    def bare():
        return bare_greedy_loop(model, input_ids, mask, use_cache=True, new_tokens=n)

    def generate():
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=mask, generation_config=config, use_model_defaults=False
            )
        return out[0, input_ids.shape[1] :].tolist()

    variants = {"instrumented": instrumented, "bare": bare, "hooked": bare, "bare_again": bare, "generate": generate}
    names = list(VARIANTS)
    orders = round_orders(names, args.rounds)
    depths = round_depths(args.rounds)
    # warmup, not measured, in the cycle's last order: the first measured call follows what the cycle puts before it
    warm = {}
    for i in balanced_cycle(len(names))[-1]:
        with forward_hook(model, names[i] in HOOKED):
            warm[names[i]] = variants[names[i]]()
    for name, ids in warm.items():
        if len(ids) != n:
            raise RuntimeError(f"benchmark: {name} made {len(ids)} selections, expected {n}")

    per_token_ns = {name: [] for name in variants}
    collection = usage.collect_once("benchmarks/overhead.py: after the warmup, before the first measured round")
    for order, depth in zip(orders, depths):
        for name in order:
            with collector_state(), forward_hook(model, name in HOOKED):  # outside the timed call
                per_token_ns[name].append(at_depth(depth, functools.partial(timed_call, variants[name])) / n)

    result = make_result(per_token_ns, warm, description, int(input_ids.shape[1]), n, args.rounds, git=started_at)
    print(f"model: {description}; prompt tokens: {input_ids.shape[1]}; selections per run: {n}; rounds: {args.rounds}")
    print(f"threads: intra-op {torch.get_num_threads()}, inter-op {torch.get_num_interop_threads()}")
    print(f"ids equal (instrumented, bare, generate): {warm['instrumented'] == warm['bare']}, "
          f"{warm['instrumented'] == warm['generate']} (generate suppresses EOS via min_new_tokens)")
    for name in names:
        summary = result["per_token_ns"][name]
        print(f"{name:>12}: median {summary['median'] / 1e3:9.2f} us/token  min {summary['min'] / 1e3:9.2f}  "
              f"max {summary['max'] / 1e3:9.2f}")
    preceded = preceded_by(orders)
    print("order: each variant right after each other one (balanced_cycle, "
          f"{len(balanced_cycle(len(names)))} rounds a cycle): "
          + "; ".join(f"{name} after " + ", ".join(f"{before} {count}" for before, count in preceded[name].items())
                      for name in names))
    paired = result["paired"]
    print(f"stack placement: {STACK_DEPTHS} depths of {STACK_FRAME_SLOTS} slots each (what one {STACK_CHUNK_BYTES // 1024}"
          f" KiB chunk of the frame stack holds), each round at one of them, each depth {depth_use(depths)} times")
    print(f"per round (neighbours in time), median: instrumented/bare {paired['overhead']:.4f} "
          f"[{paired['interval'][0]:.4f}, {paired['interval'][1]:.4f}], A/A bare again/bare {paired['aa']:.4f}: "
          f"noise ±{paired['noise']:.2%}; {paired['verdict']}")
    hook, readings = result["hook"], result["readings_without_hook"]
    print(f"per round, median: the per-forward hook alone (hooked/bare) {hook['median']:.4f} [{hook['interval'][0]:.4f}, "
          f"{hook['interval'][1]:.4f}]; stamps, usage reads and watch without it (instrumented/hooked) "
          f"{readings['median']:.4f} [{readings['interval'][0]:.4f}, {readings['interval'][1]:.4f}]")
    cost = usage.usage_read_cost(10_000)
    watch = usage.watch_cost(10_000)
    print(f"thread-usage reading ({', '.join(usage.READING_FIELDS)}; {usage.usage_sources()}): "
          f"{cost['usage_per_read_ns'] / 1e3:.2f} us per read, 3 per trial, 1 of them inside the timed loop; "
          f"collection watch {watch['watch_per_collection_ns'] / 1e3:.2f} us per collection inside a span")
    result["order"] = {"design": ORDER_DESIGN, "cycle_rounds": len(balanced_cycle(len(names))), "preceded_by": preceded}
    result["stack_placement"] = {"design": STACK_DESIGN, "depths": STACK_DEPTHS, "frame_slots": STACK_FRAME_SLOTS,
                                 "chunk_bytes": STACK_CHUNK_BYTES, "uses_per_depth": depth_use(depths)}
    result["usage_read_cost"] = {**cost, "sources": usage.usage_sources(), "fields": list(usage.READING_FIELDS)}
    result["collector"] = {"design": COLLECTOR_DESIGN, **watch, "collection": collection}
    machine.append_result(result, args.results)
    print(f"result appended to {args.results}")
    print(f"overhead_ratio={result['overhead_ratio']:.3f} generate_ratio={result['generate_ratio']:.3f}")
    return 0


STACK_CHUNK_BYTES = 16 * 1024  # a frame-stack chunk: DATA_STACK_CHUNK_SIZE in CPython 3.11's Python/pystate.c
STACK_CHUNK_HEADER_SLOTS = 3  # the chunk's own fields (previous, size, top) before its first frame
STACK_FRAME_SLOTS = 16  # one at_depth frame on CPython 3.11: 3 locals, a 4-deep value stack, the frame's own 9
# How many at_depth frames one chunk holds: a frame goes into a chunk only while it is smaller than the room left
# (push_chunk's test), so 2045 usable slots take 127 frames of 16, not 128; the boundaries a deeper call meets then
# repeat every 127 depths (tests/test_machine.py finds them so, from page faults).
STACK_DEPTHS = -(-(STACK_CHUNK_BYTES // 8 - STACK_CHUNK_HEADER_SLOTS - STACK_FRAME_SLOTS) // STACK_FRAME_SLOTS)
STACK_DESIGN = ("each round runs all its variants below the same number of at_depth frames; the rounds step through "
                "every depth from 0 to depths - 1, the frames one chunk of CPython's frame stack holds, each equally "
                "often; offsets are sampled every frame (128 bytes), so variants whose own frames differ by other "
                "amounts meet nearby offsets, not identical ones")


COLLECTOR_DESIGN = ("one full gc.collect() and gc.freeze() before the first measured round (usage.collect_once, "
                    "as a run does once before its timing trials), then every timed call, of every variant, with the "
                    "cyclic collector off (usage.TimedBlock under off_in_spans, outside the timed call), as a "
                    "timing trial has it by default; the instrumented variant keeps its collection watch and every "
                    "usage reading, so what it adds is what a trial adds inside its spans")


@contextlib.contextmanager
def forward_hook(model, on: bool):
    """The session's per-forward hook (loading.ForwardWatch) registered on the model while `on`, else nothing."""
    watch = ForwardWatch(model) if on else None
    try:
        yield
    finally:
        if watch is not None:
            watch.remove()


def collector_state():
    """The collector as a timing trial has it by default, around one timed call (COLLECTOR_DESIGN)."""
    return usage.TimedBlock(usage.OFF_IN_SPANS)


def at_depth(depth: int, call, _slot=None):
    """call() with `depth` more frames of this function below it, each STACK_FRAME_SLOTS slots on CPython 3.11 (the
    unused parameter makes it 16); a test finds the chunk boundaries every STACK_DEPTHS of these frames, so an edit
    that changed its size cannot shift the placement silently."""
    if depth <= 0:
        return call()
    return at_depth(depth - 1, call)


def timed_call(function) -> int:
    """Nanoseconds that one call of function() took (perf_counter_ns), read in the innermost frame."""
    start = time.perf_counter_ns()
    function()
    return time.perf_counter_ns() - start


def round_depths(rounds: int) -> list[int]:
    """Each round's stack depth: 0, 1, ..., STACK_DEPTHS - 1 in a fixed spread order (a stride coprime with the
    count, so that neighbouring rounds sit far apart in the chunk), repeated; balanced when rounds is a multiple."""
    stride = 37  # any fixed stride coprime with STACK_DEPTHS visits every depth once a pass
    if math.gcd(stride, STACK_DEPTHS) != 1:
        raise ValueError(f"stride {stride} is not coprime with {STACK_DEPTHS} depths")
    return [(r * stride) % STACK_DEPTHS for r in range(rounds)]


def full_pass_rounds(variants: int = len(VARIANTS)) -> int:
    """The fewest rounds in which every stack depth and every order of the balanced cycle come equally often."""
    return math.lcm(len(balanced_cycle(variants)), STACK_DEPTHS)


def balanced_rounds(rounds: int) -> bool:
    """Whether `rounds` rounds use every stack depth and every order of the cycle equally often."""
    return rounds % full_pass_rounds() == 0


def depth_use(depths: list[int]) -> str:
    """How often the rounds used each depth: 'k' when all equally, else 'k to k+1'."""
    counts = [depths.count(d) for d in range(STACK_DEPTHS)]
    return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)} to {max(counts)}"


ORDER_DESIGN = ("every round runs each variant once; over a cycle of rounds, counting the stream across round "
                "boundaries too, every variant comes right after each other variant equally often")


def balanced_cycle(count: int) -> list[tuple[int, ...]]:
    """The shortest cycle of rounds (each a permutation of range(count)) in which, read as one repeating stream,
    every ordered pair of different variants stands next to each other equally often and no variant follows itself.

    Found by a depth-first search, the same every time; for 4 variants it is 3 rounds, each pair once.
    """
    if count < 2:
        return [tuple(range(count))]
    perms = list(itertools.permutations(range(count)))
    rounds = count - 1
    while True:  # a variant's `rounds` predecessors must split evenly over the count - 1 others
        found = _cycle_search([], {}, rounds, rounds // (count - 1), perms)
        if found:
            return found
        rounds += count - 1


def _cycle_search(cycle: list, counts: dict, rounds: int, target: int, perms: list) -> list:
    if len(cycle) == rounds:
        closing = (cycle[-1][-1], cycle[0][0])
        if closing[0] == closing[1] or counts.get(closing, 0) + 1 > target:
            return []
        total = dict(counts)
        total[closing] = total.get(closing, 0) + 1
        count = len(cycle[0])
        every = all(total.get((a, b), 0) == target for a in range(count) for b in range(count) if a != b)
        return list(cycle) if every else []
    for perm in perms:
        pairs = list(zip(perm, perm[1:])) + ([(cycle[-1][-1], perm[0])] if cycle else [])
        new = dict(counts)
        for pair in pairs:
            new[pair] = new.get(pair, 0) + 1
        if any(a == b for a, b in pairs) or any(new[pair] > target for pair in pairs):
            continue
        found = _cycle_search(cycle + [perm], new, rounds, target, perms)
        if found:
            return found
    return []


def round_orders(names: list, rounds: int) -> list[list]:
    """The order of each round: balanced_cycle over `names`, repeated (balanced exactly when rounds is a multiple
    of the cycle's length, off by the last partial cycle otherwise: preceded_by says by how much)."""
    cycle = balanced_cycle(len(names))
    return [[names[i] for i in cycle[r % len(cycle)]] for r in range(rounds)]


def preceded_by(orders: list[list]) -> dict:
    """For each variant, how often each other variant ran right before it in the measured stream."""
    stream = [name for order in orders for name in order]
    counts = {name: {} for name in (orders[0] if orders else [])}
    for before, name in zip(stream, stream[1:]):
        counts[name][before] = counts[name].get(before, 0) + 1
    return {name: dict(sorted(found.items())) for name, found in counts.items()}


def median_interval(values: list, confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics x(k) and x(n+1-k) with the largest k for
    which Binomial(n, 1/2) puts at most (1 - confidence) / 2 below k. Its coverage holds whatever the distribution
    (heavy tails included); with too few values for any such k (n < 6 at 95 %) it is unbounded."""
    ordered = sorted(values)
    n = len(ordered)
    tail, below, k = (1 - confidence) / 2, 0.0, 0
    while k < n and below + math.comb(n, k) / 2 ** n <= tail:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return -math.inf, math.inf
    return ordered[k - 1], ordered[n - k]


def paired_ratios(per_token_ns: dict, placements_balanced: bool = True) -> dict:
    """Each round's instrumented/bare and bare_again/bare, their medians, the A/A noise and the 1 % verdict.

    "within 1%" needs the whole of overhead +- noise inside 1 +- 1 %: an instrumented loop measured faster than the
    bare one beyond the noise is not a small overhead but something the design failed to balance, and a run whose
    rounds did not use every stack depth and every order equally often (placements_balanced False) cannot tell."""
    bare = per_token_ns["bare"]
    ratios = [a / b for a, b in zip(per_token_ns["instrumented"], bare)]
    overhead = statistics.median(ratios)
    aa = statistics.median(a / b for a, b in zip(per_token_ns["bare_again"], bare))
    # the noise: how far the A/A control landed from 1, or the larger half of the median ratio's 95 % interval,
    # whichever is larger
    low, high = median_interval(ratios)
    half_width = max(overhead - low, high - overhead)
    noise = max(abs(aa - 1), half_width)
    if not placements_balanced:
        verdict = ("this run cannot tell: its rounds did not use every stack depth and every order equally often "
                   f"(use a multiple of {full_pass_rounds()} rounds)")
    elif overhead - 1 > OVERHEAD_BOUND + noise:
        verdict = f"over {OVERHEAD_BOUND:.0%}"
    elif 1 - overhead > OVERHEAD_BOUND + noise:
        verdict = (f"this run cannot tell: the instrumented loop came out faster than the bare one by more than "
                   f"{OVERHEAD_BOUND:.0%} plus the noise, which no overhead explains (an unbalanced placement?)")
    elif noise >= OVERHEAD_BOUND:
        verdict = (f"this run cannot tell whether the overhead is within {OVERHEAD_BOUND:.0%}: the noise is not "
                   "below it (rerun on a quieter machine, or with more rounds)")
    elif abs(overhead - 1) + noise <= OVERHEAD_BOUND:
        verdict = f"within {OVERHEAD_BOUND:.0%}"
    else:
        verdict = f"this run cannot tell: the overhead is within the noise of {OVERHEAD_BOUND:.0%}"
    return {"overhead": overhead, "aa": aa, "interval": [low, high], "interval_half_width": half_width, "noise": noise,
            "verdict": verdict}


def ratio_of(numerators: list, denominators: list) -> dict:
    """The median of the per-round ratios and its distribution-free 95 % interval (median_interval)."""
    ratios = [a / b for a, b in zip(numerators, denominators)]
    return {"median": statistics.median(ratios), "interval": list(median_interval(ratios))}


def make_result(per_token_ns: dict, warm_ids: dict, description: str, prompt_tokens: int, selections: int,
                rounds: int, git: Optional[dict] = None) -> dict:
    """One benchmark result as a plain dict, with this machine's fingerprint and the software versions; `git` is
    the checkout's state as the benchmark started (read now when not given)."""
    import datetime
    import platform

    import transformers

    medians = {name: statistics.median(values) for name, values in per_token_ns.items()}
    return {
        "benchmark": "benchmarks/overhead.py",
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "git": git if git is not None else git_state(machine.PROJECT_ROOT),
        "machine": machine.machine_fingerprint(),
        "software": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()},
        "model": description,
        "prompt_tokens": prompt_tokens,
        "selections_per_run": selections,
        "rounds": rounds,
        "per_token_ns": {name: {"median": medians[name], "min": min(values), "max": max(values)}
                         for name, values in per_token_ns.items()},
        "ids_equal": {"instrumented_vs_bare": warm_ids["instrumented"] == warm_ids["bare"],
                      "instrumented_vs_generate": warm_ids["instrumented"] == warm_ids["generate"]},
        "overhead_ratio": medians["instrumented"] / medians["bare"],
        "paired": paired_ratios(per_token_ns, placements_balanced=balanced_rounds(rounds)),
        "hook": ratio_of(per_token_ns["hooked"], per_token_ns["bare"]),
        "readings_without_hook": ratio_of(per_token_ns["instrumented"], per_token_ns["hooked"]),
        "generate_ratio": medians["generate"] / medians["bare"],
    }


if __name__ == "__main__":
    sys.exit(main())
