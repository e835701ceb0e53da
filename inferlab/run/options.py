"""The options of a run and the markers of its tests, as data; the path options checked before anything is
written; the name of a new run's folder.

The plugin adds OPTIONS to one option group and MARKERS to the markers; each help text says its default.
A refused path is a PathOptionError naming the option, the path, what is there and what was expected;
the plugin turns it into a usage error. Nothing here writes.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.base import learner_text
from inferlab.base.commands import spelled
from inferlab.base.records import describe_path

HELP = {
    "record_dir": "directory for this run's records; must be new or empty (required with experiments unless "
                  "--runs-dir is given; no default)",
    "runs_dir": "make a new record dir under this directory, named <UTC time>-<specimen> (and -plan with --plan); "
                "at the end a suffix says how the run ended: -failed (the harness failed, or the specimen could not be "
                "acquired), -findings (only protocol "
                "diagnostics failed: the protocol ran and found something), -partial, -partial-failed, "
                "-partial-findings or -incomplete (default: none)",
    "specimen": f"specimen to run: a name with a spec in artifacts/<name>.json (default: {protocol.DEFAULT_SPECIMEN}; "
    f"'standin' is the synthetic, non-Pythia checkpoint)",
    "artifacts": "reuse the six specimen files from this directory after verifying them (default: none; "
    "the project cache under artifacts/cache/ is tried, then a bounded download)",
    "offline": "never open a network connection; missing files are an error (default: off; HF_HUB_OFFLINE=1 in the "
               "environment also turns it on, and the records say which did)",
    "plan": "write plan.json and print the ordered schedule without loading a model (default: off)",
    "predictions": "copy this predictions file into the record dir before any model computation (default: none)",
    "gc_in_spans": "leave Python's cyclic garbage collector on inside the timed spans, to measure what it costs as a "
                   "condition of its own (default: off: the collector off inside each timed block, as timeit does, "
                   "after one full collection before the first trial; the plan, the manifest and every trial say "
                   "which)",
}
# pytest's addoption settings per flag; every dest starts with inferlab_.
OPTIONS = {
    "--record-dir": {"dest": "inferlab_record_dir", "metavar": "DIR", "default": None, "help": HELP["record_dir"]},
    "--runs-dir": {"dest": "inferlab_runs_dir", "metavar": "DIR", "default": None, "help": HELP["runs_dir"]},
    "--specimen": {"dest": "inferlab_specimen", "metavar": "NAME", "default": protocol.DEFAULT_SPECIMEN,
                   "help": HELP["specimen"]},
    "--artifacts": {"dest": "inferlab_artifacts", "metavar": "DIR", "default": None, "help": HELP["artifacts"]},
    "--offline": {"dest": "inferlab_offline", "action": "store_true", "default": False, "help": HELP["offline"]},
    "--plan": {"dest": "inferlab_plan", "action": "store_true", "default": False, "help": HELP["plan"]},
    "--predictions": {"dest": "inferlab_predictions", "metavar": "FILE", "default": None,
                      "help": HELP["predictions"]},
    "--gc-in-spans": {"dest": "inferlab_gc_in_spans", "action": "store_true", "default": False,
                      "help": HELP["gc_in_spans"]},
}
MARKERS = (
    "provides(name): this test establishes the named check for later tests",
    "requires(*names): skip unless every named check passed earlier",
    "budget(category, selections=0, forwards=0, calls=0): what the test spends",
    "records(*kinds): the record kinds this test writes; the plan carries them, readers ask the plan which tests "
    "produce a kind, and the record fixture refuses any other kind",
    "optional_extension: an optional part of the protocol (on a module): leaving it out does not make a run partial",
    "batching: the optional batching extension (deselect with -m 'not batching')",
    "diagnostic: a protocol diagnostic or observation; its failure is a finding about the computation, kept with "
    "its evidence, not a broken harness",
)

def collection_refusal(experiments: bool, getoption, option) -> Optional[str]:
    """Why the collected session must not run, or None: the experiment's options given to a session that collected
    no experiment test (they would be silently ignored), or pytest-timeout's --timeout given to the experiment (its
    trials have the protocol's limit, which --timeout would silently not change)."""
    given = [flag for flag, settings in OPTIONS.items() if getoption(settings["dest"]) not in (settings["default"], None)]
    if not experiments:
        if given and not option.collectonly:
            return (f"{', '.join(given)}: options of the experiment, and no experiment test was collected; run them "
                    f"with the experiments folder: {spelled('-m pytest experiments ' + ' '.join(given) + ' ...', 'python')}")
        return None
    if getattr(option, "timeout", None) is not None:
        return (f"--timeout {option.timeout}: the experiment gives each trial the protocol's limit of "
                f"{protocol.TRIAL_LIMIT_S} s itself (inferlab/protocol.py, TRIAL_LIMIT_S); leave --timeout out")
    return None


WANTED = {"--record-dir": "a new directory, e.g. --record-dir runs/first",
          "--runs-dir": "the folder for new runs, e.g. --runs-dir runs",
          "--artifacts": "the directory that holds the specimen's files",
          "--predictions": "your copy of predictions.md"}


class PathOptionError(ValueError):
    """A path option that cannot work; the message names the option, the path and the reason."""


SPECIMEN_MARKERS = ("config.json", "model.safetensors")  # a folder holding both is a specimen's copy


def _inside(target: Path, folder: Path) -> bool:
    try:
        return target.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False  # refused later with its own reason if it cannot be used at all


def specimen_folder_around(target: Path) -> Optional[Path]:
    """The nearest folder at or above target that holds a specimen's files (config.json and model.safetensors)."""
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError):
        return None
    for folder in (resolved, *resolved.parents):
        if all(os.path.isfile(folder / name) for name in SPECIMEN_MARKERS):
            return folder
    return None


def refuse_inside_specimen_files(option: str, target: Path, artifacts: Optional[Path], cache_root: Optional[Path]):
    """A run written into a specimen's files breaks them: inside --artifacts, inside the project cache (which then
    fails verification for this run and every later one), or inside any folder that holds a specimen."""
    if artifacts is not None and _inside(target, artifacts):
        raise PathOptionError(f"{option}: {target} is inside the --artifacts folder {artifacts}: the run would "
                              f"be written into the specimen copy; choose a folder outside it")
    if cache_root is not None and _inside(target, cache_root):
        raise PathOptionError(f"{option}: {target} is inside the project's specimen cache {cache_root}: the run "
                              f"would be written into the cache, which would then fail verification for this run "
                              f"and every later one; choose a folder outside it, e.g. {WANTED[option]}")
    folder = specimen_folder_around(target)
    if folder is not None:
        raise PathOptionError(f"{option}: {target} is inside {folder}, which holds a specimen's files "
                              f"({', '.join(SPECIMEN_MARKERS)}): the run would be written into them; choose a "
                              f"folder outside it, e.g. {WANTED[option]}")


def check_paths(options: dict, cache_root: Optional[Path] = None) -> Optional[str]:
    """Refuse every path option that cannot work; returns the predictions path (None without one).

    options maps --record-dir, --runs-dir, --artifacts and --predictions to their values (None when not
    given). An empty path would mean the current folder; --artifacts must be a directory; the run must not
    be written into the specimen copy, the project cache (cache_root) or any folder holding a specimen;
    --predictions must be a learner's text (inferlab.base.learner_text: a regular UTF-8 file within its limit).
    """
    for option, value in options.items():
        if value is not None and not value.strip():
            raise PathOptionError(f"{option}: the path is empty ({value!r}), which would mean the current folder; "
                                  f"name {WANTED[option]}")
    artifacts = options.get("--artifacts")
    where = None
    if artifacts is not None:
        where = Path(os.path.expanduser(artifacts))
        if not os.path.isdir(where):  # False, not an error, for a path that cannot be examined
            raise PathOptionError(f"--artifacts: {where} {describe_path(where)}; expected a directory that holds "
                                  f"the specimen's files (check it first: {spelled('check-artifacts DIR')})")
    for option in ("--record-dir", "--runs-dir"):
        if options.get(option) is not None:
            refuse_inside_specimen_files(option, Path(os.path.expanduser(options[option])), where, cache_root)
    predictions = options.get("--predictions")
    if predictions is None:
        return None
    predictions = os.path.expanduser(predictions)
    if not os.path.isfile(predictions):
        what = describe_path(predictions)
        what += ", not a regular file" if what.startswith("is ") else ""
        raise PathOptionError(f"--predictions: {predictions} {what}; expected your copy of predictions.md")
    try:  # the check `attach` and the autograder make of a learner's text, before the run writes anything
        learner_text.read(predictions, "--predictions:")
    except learner_text.NotText as error:
        raise PathOptionError(f"{error} (your copy of predictions.md)") from None
    return predictions


# huggingface_hub reads HF_HUB_OFFLINE (or else TRANSFORMERS_OFFLINE) as true when it is one of these, in any case.
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE_WORDS = ("1", "ON", "YES", "TRUE")


def offline_setting(option: bool, environ) -> tuple[bool, Optional[str]]:
    """(offline, what made it so): --offline, or the hub's own offline variable as huggingface_hub reads it, so
    that HF_HUB_OFFLINE=1 means the same as --offline; (False, None) when neither asks for it."""
    if option:
        return True, "--offline"
    name = next((n for n in OFFLINE_VARIABLES if environ.get(n)), None)
    if name is not None and environ[name].upper() in TRUE_WORDS:
        return True, f"{name}={environ[name]}"
    return False, None


TIMEOUT_PLUGIN = "timeout"  # pytest-timeout's plugin name, as -p no:timeout names it


def trial_bound_refusal(platform: str, has_interval_timers: bool, has_timeout_plugin: bool,
                        plugin_installed: bool = True, executable: Optional[str] = None) -> Optional[str]:
    """Why the per-trial limit cannot be enforced, so that the experiments must not run; None when it can.

    The limit is pytest-timeout's signal method: it needs POSIX interval timers and the plugin itself (which
    `-p no:timeout` removes). A run without the bound is never called the complete protocol: it is refused.
    plugin_installed is whether this interpreter (executable) has pytest-timeout at all: when it has not, the
    cause is the interpreter (a system pytest, not the project's .venv), and the message names it.
    """
    if not has_interval_timers:
        return (f"this platform ({platform}) has no POSIX interval timers, so the {protocol.TRIAL_LIMIT_S} s "
                f"per-trial limit cannot be enforced; the experiments refuse to run unbounded")
    if not has_timeout_plugin and not plugin_installed:
        return (f"this Python ({executable or 'the interpreter running pytest'}) is not the project's environment: "
                f"it has no pytest-timeout (pinned in requirements.lock), so the {protocol.TRIAL_LIMIT_S} s per-trial "
                f"limit cannot be enforced and the experiments refuse to run. Run them with the project's "
                f"interpreter: {spelled('-m pytest experiments ...', 'python')} (`make` builds .venv)")
    if not has_timeout_plugin:
        return (f"the pytest-timeout plugin is not loaded (for example by -p no:{TIMEOUT_PLUGIN}), so the "
                f"{protocol.TRIAL_LIMIT_S} s per-trial limit cannot be enforced; the experiments refuse to run "
                f"unbounded (leave out -p no:{TIMEOUT_PLUGIN}; pytest-timeout is pinned in requirements.lock)")
    return None


def parallel_refusal(workers) -> Optional[str]:
    """Why a run asked to spread its tests over processes (pytest-xdist's -n, which the lock installs for the
    harness's own tests) must not start; None for one process. The protocol's trials run one at a time, on the
    threads it sets: a timing taken beside another worker, or a schedule split between processes, is not it."""
    if workers in (None, 0, "0", "no"):
        return None
    return (f"the experiments run in one process, one test at a time, but -n {workers} (pytest-xdist) asks for "
            "parallel workers; leave out -n (it is for the harness's own tests in tests/)")


# pytest's options that change the order the tests run in: (option dest, as typed, what it does).
REORDERING_OPTIONS = (
    ("failedfirst", "--ff (--failed-first)", "runs the tests that failed last time first"),
    ("newfirst", "--nf (--new-first)", "runs the tests of the most recently changed files first"),
    ("stepwise", "--sw (--stepwise)", "starts at the test that failed last time and stops at the next failure"),
    ("stepwise_skip", "--sw-skip (--stepwise-skip)", "starts at the test that failed last time and skips it"),
)
# Random-order plugins under the names pytest registers them by (pytest.ini blocks them; -p NAME unblocks one).
REORDERING_PLUGINS = ("randomly", "random_order", "pytest_randomly", "pytest_random_order", "random-order")
KEEPS_ORDER = ("the experiment runs in the protocol's order (every test after the checks it relies on, the trials "
               "in their schedule), so a run never changes it")


def reordering_refusal(option, has_plugin) -> Optional[str]:
    """Why a run whose options or plugins would reorder its tests must not start (None when none does), naming
    the option or plugin: checked before anything is written. option is pytest's option namespace; has_plugin(name)
    whether a plugin of that name is registered (pytest's pluginmanager.has_plugin). --lf is no reordering: it
    keeps the order and leaves tests out, which the run records as partial."""
    named = [(flag, what) for dest, flag, what in REORDERING_OPTIONS if getattr(option, dest, False)]
    named += [(f"-p {name}", "shuffles the tests") for name in REORDERING_PLUGINS if has_plugin(name)]
    if not named:
        return None
    flag, what = named[0]
    also = f" (and {', '.join(f for f, _ in named[1:])})" if len(named) > 1 else ""
    return f"{flag} {what}{also}: {KEEPS_ORDER}; leave {flag.split(' (')[0]} out"


def order_refusal(items: list[tuple[str, str, int]], collected: list[str]) -> Optional[str]:
    """Why the experiment tests, in the order they are about to run, are not in the protocol's order, naming the
    first test out of place; None when they are. items: (node id, file, line of its definition) in run order;
    collected: the node ids as pytest first collected them (their parametrized variants in declared order).
    The protocol's order is the files' name order, then each file's definition order, then the variants'."""
    first_seen = {nodeid: index for index, nodeid in enumerate(collected)}
    expected = sorted(items, key=lambda item: (item[1], item[2], first_seen.get(item[0], len(first_seen))))
    for position, (actual, wanted) in enumerate(zip(items, expected)):
        if actual[0] != wanted[0]:
            return (f"the tests are not in the protocol's order: {actual[0]} would run at position {position + 1}, "
                    f"where {wanted[0]} belongs. An option or plugin reordered them (pytest's --ff, --nf or --sw, a "
                    f"random-order plugin, a conftest hook), or the command named the experiment files out of their "
                    f"order; {KEEPS_ORDER}")
    return None


def run_dir_name(specimen_name: str, plan: bool) -> str:
    """<UTC time>-<specimen>, and -plan for a plan: `ls runs` tells specimens and plans apart."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{specimen_name}" + ("-plan" if plan else "")


# What a test file of this project imports that only the project's environment (.venv) has.
ENVIRONMENT_MODULES = ("torch", "transformers", "numpy", "safetensors", "matplotlib", "pytest_timeout")
_NO_MODULE = re.compile(r"No module named '([A-Za-z0-9_.]+)'")


def missing_module_hint(path: str, error_text: str, executable: str) -> Optional[str]:
    """For a test file that could not be imported because this Python lacks a module of the project's
    environment: one line naming the interpreter and the one to use; None for any other import error."""
    found = _NO_MODULE.search(error_text or "")
    if found is None or found.group(1).split(".")[0] not in ENVIRONMENT_MODULES:
        return None
    folder = path.split("/")[0] or path
    return (f"{path}: this Python ({executable}) cannot import {found.group(1)}: it is not the project's "
            f"environment. Run the tests with {spelled(f'-m pytest {folder}', 'python')} (`make` builds .venv)")
