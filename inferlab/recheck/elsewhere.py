"""A replay made in a child process under the run's own kernel settings: torch, MKL and oneDNN read them once,
before the first kernel runs, so a process that already computed cannot take them on.

When a run recorded kernel settings (inferlab.host.environment.KERNEL_ENV_VARS) other than this process's, the
replay is made by `python -m inferlab.recheck.elsewhere RUN_DIR --specimen NAME [--artifacts DIR]` with those
settings in its environment, offline; it prints its comparison as JSON and this process reads it back. Where this CPU
cannot honour a setting (a kernel set it lacks), the child's own conditions say so and its comparison is within
the tolerance (inferlab.recheck.agreement), naming what differed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from typing import Optional

from inferlab.recheck.agreement import Allowance, kernel_settings

CHILD_TIMEOUT_S = 900  # the replay stops itself at the protocol's session limit, well below


def settings_to_match(manifest: dict) -> Optional[dict]:
    """The run's recorded kernel settings when any differs from this process's environment, else None."""
    recorded = kernel_settings(manifest)
    return recorded if any(os.environ.get(name) != value for name, value in recorded.items()) else None


def replay_in_child(run_dir, specimen: str, artifacts: Optional[str], settings: dict) -> dict:
    """The replay's result made in a child under `settings`: {made, specimen, comparison, agree, rule, elapsed_s,
    settings}, or {made: False, reason}."""
    from inferlab.recheck.trusted import Comparison

    env = {k: v for k, v in os.environ.items() if k not in settings}
    env.update({name: value for name, value in settings.items() if value is not None})
    command = [sys.executable, "-m", "inferlab.recheck.elsewhere", str(run_dir), "--specimen", specimen]
    command += ["--artifacts", str(artifacts)] if artifacts else []
    shown = " ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in sorted(settings.items()))
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        data = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return {"made": False, "reason": f"the replay under the run's kernel settings ({shown}) failed: {error}"}
    if not isinstance(data, dict) or not data.get("made"):
        why = data.get("reason") if isinstance(data, dict) else (done.stderr.strip()[-500:] or f"exit {done.returncode}")
        return {"made": False, "reason": f"the replay under the run's kernel settings ({shown}) was not made: {why}"}
    return {**data, "comparison": Comparison(**data["comparison"]), "rule": Allowance(**data["rule"]),
            "settings": settings}


def main(argv=None) -> int:
    """The child: replay RUN_DIR offline and print one JSON line (the comparison, the rule, or why it was not
    made)."""
    import argparse

    from inferlab.recheck.replay import ReplayError, replay_run

    parser = argparse.ArgumentParser(prog="inferlab.recheck.elsewhere")
    parser.add_argument("run_dir")
    parser.add_argument("--specimen", required=True)
    parser.add_argument("--artifacts")
    args = parser.parse_args(argv)
    try:
        result = replay_run(args.run_dir, specimen=args.specimen, artifacts=args.artifacts, offline=True)
    except ReplayError as error:
        print(json.dumps({"made": False, "reason": str(error)}))
        return 0
    rule = result["rule"] or Allowance(0.0, 0.0, ["nothing was replayed"])
    print(json.dumps({"made": True, "specimen": result["specimen"], "agree": result["agree"],
                      "elapsed_s": result["elapsed_s"], "rule": asdict(rule),
                      "comparison": result["comparison"].as_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
