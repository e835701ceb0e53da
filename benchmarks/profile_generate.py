"""Where one greedy generate() call spends its time beside the instrumented loop: a cProfile of each.

Usage (from the repository root):  python -m benchmarks.profile_generate [--calls N] [--top K]

In one process with 1 intra-op / 1 inter-op thread, on the synthetic stand-in (pythia-14m's architecture) and
P1: each variant is warmed up, then N calls of each are profiled (cProfile, one profile per variant), and the
cumulative time of the functions that matter is printed per call: the model's forward, and the rest of
generate()'s own work (input preparation, logits processors, stopping criteria, cache and kwargs updates, the
per-step copy of the last logits). Both variants make 16 greedy selections with the cache; generate() runs with
the generation trials' settings (output_logits and output_scores on, a dict returned) and, as a second line,
with plain sequences (both off), so that what those outputs cost is seen apart from what generate() always does.

cProfile adds its own cost to every Python call, more to the variant that makes more calls, so the shares are
a picture of where the time goes, not a measurement of the overhead (benchmarks/overhead.py measures that).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import load_model  # noqa: E402
from inferlab import protocol  # noqa: E402
from inferlab.measure import usage  # noqa: E402
from inferlab.measure.decode_loop import run_greedy_loop  # noqa: E402
from inferlab.measure.sampling import build_generation_config, greedy_generation_config  # noqa: E402


def _profile(function, calls: int) -> pstats.Stats:
    """calls of function() under one profile, with the cyclic collector off for every variant alike (as the
    timing trials run by default): a collection's pause would land in whichever call met it."""
    gc.collect()
    gc.disable()
    try:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            function()
        profile.disable()
    finally:
        gc.enable()
    return pstats.Stats(profile)


def _processors(stats: pstats.Stats, calls: int) -> list[tuple[str, float, float]]:
    """(processor class, ms per call, calls per call) of each logits processor's __call__."""
    import inspect

    from transformers.generation import logits_process

    classes = {}
    for _, cls in inspect.getmembers(logits_process, inspect.isclass):
        if "__call__" in vars(cls):
            classes[vars(cls)["__call__"].__code__.co_firstlineno] = cls.__name__
    rows = []
    for (file, line, function), (primitive, _, _, cumulative, _) in stats.stats.items():
        if "generation/logits_process" in file and function == "__call__":
            rows.append((classes.get(line, f"line {line}"), cumulative / calls * 1e3, primitive / calls))
    return sorted(rows, key=lambda r: -r[1])


def _cumulative(stats: pstats.Stats, path_part: str, name: str) -> tuple[float, int]:
    """(cumulative seconds, primitive calls) of the functions whose file contains path_part and name is `name`."""
    total, count = 0.0, 0
    for (file, _, function), (primitive, _, _, cumulative, _) in stats.stats.items():
        if path_part in file and function == name:
            total += cumulative
            count += primitive
    return total, count


def _top_own(stats: pstats.Stats, top: int) -> list[tuple[str, float, int]]:
    """The functions with the most time of their own (tottime), outside the model's modules."""
    rows = []
    for (file, line, function), (primitive, _, own, _, _) in stats.stats.items():
        if "/torch/nn/modules/" in file or "modeling_gpt_neox" in file:
            continue
        rows.append((f"{Path(file).name}:{line} {function}", own, primitive))
    return sorted(rows, key=lambda r: -r[1])[:top]


def _selections(output, prompt_length: int) -> int:
    """How many ids a variant's call selected (generate() may stop at EOS; the loop never does)."""
    if hasattr(output, "generated_ids"):
        return len(output.generated_ids)
    sequences = output.sequences if hasattr(output, "sequences") else output
    return int(sequences.shape[1] - prompt_length)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="profiled calls of each variant (default 20)")
    parser.add_argument("--top", type=int, default=12, help="functions listed by their own time (default 12)")
    args = parser.parse_args(argv)
    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    torch.set_num_interop_threads(protocol.INTER_OP_THREADS)
    n = protocol.TIMING_NEW_TOKENS
    with tempfile.TemporaryDirectory() as tmp:
        model, prompt, eos, description = load_model(Path(tmp))
    input_ids = torch.tensor([prompt], dtype=torch.long)
    mask = torch.ones_like(input_ids)
    trials = build_generation_config(protocol.CONDITIONS["G"], eos, eos)  # the greedy generation trials' own config
    trials.validate()
    plain = greedy_generation_config(n, eos, eos)  # the same, plain sequences: no logits or scores returned

    def loop():  # the collector is already off around every profiled call (_profile): no collection of its own
        return run_greedy_loop(model, input_ids, mask, use_cache=True, new_tokens=n, eos_token_id=eos,
                               collector_policy=usage.ON_IN_SPANS)

    def generate(config):
        def call():
            with torch.inference_mode():
                return model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config,
                                      use_model_defaults=False)
        return call

    variants = {"instrumented loop": loop, "generate, the greedy trials' config (logits and scores out)":
                generate(trials), "generate, plain sequences (no logits or scores out)": generate(plain)}
    print(f"model: {description}; {n} selections per call; {args.calls} profiled calls each; "
          f"threads {torch.get_num_threads()}/{torch.get_num_interop_threads()}; torch {torch.__version__}")
    for name, function in variants.items():
        made = _selections(function(), input_ids.shape[1])  # warmup, not profiled
        stats = _profile(function, args.calls)
        total = stats.total_tt / args.calls
        # the model's forward is nested (the causal-LM forward calls the base model's): the outermost counts
        top_forward = max((v[3] for k, v in stats.stats.items()
                           if "modeling_gpt_neox" in k[0] and k[2] == "forward"), default=0.0) / args.calls
        print(f"\n{name}: {made} selections a call; {total * 1e3:.2f} ms per call under the profiler "
              f"({total / made * 1e3:.2f} ms a selection); the model's outermost forward {top_forward * 1e3:.2f} ms "
              f"({top_forward / total:.0%}); everything else {(total - top_forward) * 1e3:.2f} ms "
              f"({(total - top_forward) / made * 1e3:.2f} ms a selection)")
        for label, (part, function_name) in {
                "prepare_inputs_for_generation": ("generation/utils", "prepare_inputs_for_generation"),
                "_update_model_kwargs_for_generation": ("generation/utils", "_update_model_kwargs_for_generation"),
                "stopping criteria": ("generation/stopping_criteria", "__call__"),
                "_prepare_cache_for_generation": ("generation/utils", "_prepare_cache_for_generation"),
                "_get_logits_processor": ("generation/utils", "_get_logits_processor"),
                "_prepare_special_tokens": ("generation/utils", "_prepare_special_tokens"),
                "_validate_model_kwargs / generation config": ("generation/utils", "_validate_model_kwargs"),
                "tensor .to (copies)": ("", "to"),
        }.items():
            seconds, calls = _cumulative(stats, part, function_name)
            if calls:
                print(f"  {label:<45} {seconds / args.calls * 1e3:8.3f} ms per call, {calls / args.calls:g} calls")
        for processor, ms, calls in _processors(stats, args.calls):
            print(f"    processor {processor:<41} {ms:8.3f} ms per call, {calls:g} calls")
        print("  most own time outside the model's modules:")
        for where, own, calls in _top_own(stats, args.top):
            print(f"    {own / args.calls * 1e3:8.3f} ms  {calls / args.calls:7g} calls  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
