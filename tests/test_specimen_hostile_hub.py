"""A hostile loopback hub: one total deadline bounds everything, bad bodies are refused, nothing partial is kept.

A test that waits for the deadline to expire uses a short one (EXPIRING_DEADLINE_S), so it takes about
that long; the others use SHORT_DEADLINE_S, long enough never to expire on a loaded machine, short
enough to end a hang. pytest-timeout's mark turns a regression (an unbounded wait) into a failure
instead of a hang. No assertion is about speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from inferlab import specimen
from inferlab.specimen import DeadlineExpired, SpecimenError, lock

from child_process import popen_signallable

SHORT_DEADLINE_S = 2.0
EXPIRING_DEADLINE_S = 0.5  # a stall or a trickle (a few bytes every 0.2-0.25 s) outlasts it
HANG_GUARD_S = 30  # far beyond the deadline: only a wait the deadline failed to bound reaches it
WEIGHTS = "model.safetensors"
REPO_ROOT = Path(__file__).resolve().parents[1]


def left_behind(root: Path, spec) -> list[str]:
    """Everything under the cache root's specimen folder except the lock file: must be empty after a failure."""
    folder = root / spec.name
    return sorted(p.name for p in folder.iterdir() if p.name != spec.revision + ".lock") if folder.is_dir() else []


# --- 1. one total deadline --------------------------------------------------------------------------

DEADLINE_FAULTS = {
    "accept-then-stall-on-metadata": ("HEAD", "config.json", "stall"),
    "headers-trickled-on-metadata": ("HEAD", "tokenizer.json", "trickle_headers"),
    "accept-then-stall-on-a-body": ("GET", "tokenizer_config.json", "stall"),
    "headers-trickled-on-a-body": ("GET", "config.json", "trickle_headers"),
    "body-trickled-a-few-bytes-per-second": ("GET", WEIGHTS, "trickle"),
}


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("case", sorted(DEADLINE_FAULTS))
def test_one_deadline_bounds_a_stalling_or_trickling_hub(serve, standin_dir, download_spec, tmp_path, case):
    method, name, mode = DEADLINE_FAULTS[case]
    hub = serve(standin_dir, download_spec, faults={(method, name): mode})
    outcome = specimen.acquisition_outcome(download_spec, cache_root=tmp_path, endpoint=hub.endpoint,
                                           deadline_s=EXPIRING_DEADLINE_S)
    assert outcome["ok"] is False and outcome["deadline_expired"] is True
    assert outcome["deadline_s"] == EXPIRING_DEADLINE_S
    assert f"the acquisition deadline of {EXPIRING_DEADLINE_S:g} s expired while" in outcome["error"]
    assert name in outcome["error"]  # what was being waited for
    assert not specimen.cache_dir(download_spec, tmp_path).exists() and left_behind(tmp_path, download_spec) == []
    assert hub.metadata_came_first()
    if method == "HEAD":
        assert hub.gets() == []


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_redirect_loop_on_a_body_is_refused_without_waiting(serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec, faults={("GET", "special_tokens_map.json"): "redirect_forever"})
    with pytest.raises(SpecimenError, match="expected the file within 5 redirects") as error:
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint, deadline_s=SHORT_DEADLINE_S)
    assert not isinstance(error.value, DeadlineExpired)
    assert hub.requested("GET").count("special_tokens_map.json") == 6  # the request and five redirects
    assert left_behind(tmp_path, download_spec) == []


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_server_error_on_a_body_is_refused(serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec, faults={("GET", WEIGHTS): "500"})
    with pytest.raises(SpecimenError, match=f"expected HTTP 200 with the body of {WEIGHTS}, actual HTTP 500"):
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint, deadline_s=SHORT_DEADLINE_S)
    assert left_behind(tmp_path, download_spec) == [] and hub.metadata_came_first()


# --- 2. bad bodies ------------------------------------------------------------------------------------

BODY_FAULTS = {
    # mode: a piece of the refusal
    "reset": "the connection failed after",
    "truncated": "the body ended after",
    "longer": "refused before reading it",
    "shorter": "refused before reading it",
    "longer_no_length": "the body is longer than the",
    "wrong_bytes": "differ from what the hub describes",
}


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("name", ["tokenizer.json", WEIGHTS])
@pytest.mark.parametrize("mode", sorted(BODY_FAULTS))
def test_a_bad_body_is_refused_and_nothing_is_published(serve, standin_dir, download_spec, tmp_path, mode, name):
    hub = serve(standin_dir, download_spec, faults={("GET", name): mode})
    with pytest.raises(SpecimenError) as error:
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint, deadline_s=SHORT_DEADLINE_S)
    assert not isinstance(error.value, DeadlineExpired), str(error.value)
    assert BODY_FAULTS[mode] in str(error.value) and name in str(error.value)
    assert not specimen.cache_dir(download_spec, tmp_path).exists() and left_behind(tmp_path, download_spec) == []
    assert hub.metadata_came_first()


@pytest.mark.timeout(HANG_GUARD_S)
def test_right_length_wrong_bytes_of_an_unpinned_file_is_caught_by_the_hubs_etag(serve, standin_dir, download_spec,
                                                                                   tmp_path):
    # The pythia-14m spec pins only the weights: the small files' only check in transit is the hub's ETag.
    unpinned = {**download_spec.expected, "tokenizer.json": {"size": None, "sha256": None}}
    spec = download_spec.__class__(**{**download_spec.__dict__, "expected": unpinned})
    hub = serve(standin_dir, spec, faults={("GET", "tokenizer.json"): "wrong_bytes"})
    with pytest.raises(SpecimenError, match="tokenizer.json: the body's git_sha1 is [0-9a-f]{40}, but the hub's ETag"):
        specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint, deadline_s=SHORT_DEADLINE_S)


STAGING_WATCHER = """
import dataclasses, sys
sys.path.insert(0, {root!r})
from inferlab import specimen
spec = dataclasses.replace(specimen.load_spec("standin"), synthetic=False)
specimen.acquire(spec, cache_root={cache_root!r}, endpoint={endpoint!r}, deadline_s=120)
"""


@pytest.mark.process
@pytest.mark.timeout(HANG_GUARD_S * 2)
def test_ctrl_c_during_a_download_removes_the_staging_folder(serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec, faults={("GET", WEIGHTS): "trickle"})
    cache_root = tmp_path / "cache"
    script = STAGING_WATCHER.format(root=str(REPO_ROOT), cache_root=str(cache_root), endpoint=hub.endpoint)
    # The child gets SIGINT's default handler, so its Ctrl-C is a KeyboardInterrupt even in a suite started
    # with SIGINT ignored (nohup, a background job), which every child would otherwise inherit.
    child = popen_signallable([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        partial = None
        while partial is None and child.poll() is None:  # wait until the weight file is being received
            found = list((cache_root / download_spec.name).glob(f".staging-*/{WEIGHTS}"))
            partial = found[0] if found else None
            time.sleep(0.02)
        assert partial is not None, f"the download never reached the weights: {child.communicate()}"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0 and "KeyboardInterrupt" in stderr
    assert not partial.parent.exists()
    assert left_behind(cache_root, download_spec) == []


@pytest.mark.slow
def test_staging_left_by_a_killed_run_is_removed_and_recorded(serve, standin_dir, download_spec, tmp_path):
    cache = specimen.cache_dir(download_spec, tmp_path)
    stale = cache.parent / f".staging-{cache.name}-999999"
    stale.mkdir(parents=True)
    (stale / WEIGHTS).write_bytes(b"partial")
    result = specimen.acquire(download_spec, cache_root=tmp_path, endpoint=serve(standin_dir, download_spec).endpoint)
    assert result["stale_staging_removed"] == [str(stale)] and not stale.exists()
    assert result["acquisition"] == "download"


# --- 3. two acquisitions at once -------------------------------------------------------------------------


@pytest.fixture
def lock_waits(monkeypatch):
    """Count the threads that found the cache lock taken (each waiting call is recorded once per pause)."""
    waiting: dict[int, int] = {}
    changed = threading.Condition()
    real_pause = lock._pause

    def pause(seconds):
        with changed:
            waiting[threading.get_ident()] = waiting.get(threading.get_ident(), 0) + 1
            changed.notify_all()
        real_pause(seconds)

    def until(count: int) -> None:
        with changed:
            assert changed.wait_for(lambda: len(waiting) >= count, timeout=HANG_GUARD_S), waiting

    monkeypatch.setattr(lock, "_pause", pause)
    return until


def in_thread(function, *args, **kwargs):
    """Run function in a thread; returns a callable that joins it and returns its result or raises its error."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 (handed to the test thread)
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join(HANG_GUARD_S)
        assert not thread.is_alive(), "the acquisition did not finish"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return join


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S * 2)
def test_a_second_download_waits_for_the_first_then_reuses_it(serve, standin_dir, download_spec, tmp_path,
                                                              lock_waits):
    hub = serve(standin_dir, download_spec, faults={("GET", WEIGHTS): "hold"})
    first = in_thread(specimen.acquire, download_spec, cache_root=tmp_path, endpoint=hub.endpoint, deadline_s=60)
    assert hub.held.wait(HANG_GUARD_S)  # the first is inside its download, holding the lock
    second = in_thread(specimen.acquire, download_spec, cache_root=tmp_path, endpoint=hub.endpoint, deadline_s=60)
    lock_waits(1)  # the second found the lock taken
    hub.release.set()
    first_result, second_result = first(), second()
    assert (first_result["acquisition"], second_result["acquisition"]) == ("download", "reuse:project_cache")
    assert second_result["lock"]["contended"] is True and first_result["lock"]["contended"] is False
    assert sorted(hub.requested("GET")) == sorted(download_spec.files)  # each body once
    assert second_result["verification"]["ok"]


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
def test_a_lock_held_past_the_deadline_is_a_clear_refusal(download_spec, tmp_path):
    cache = specimen.cache_dir(download_spec, tmp_path)
    with lock.held(cache, specimen.Deadline(60)):
        outcome = specimen.acquisition_outcome(download_spec, cache_root=tmp_path, endpoint="http://127.0.0.1:9",
                                               deadline_s=0.5)
    assert outcome["ok"] is False and outcome["deadline_expired"] is True
    assert f"waiting for pid {os.getpid()}, which holds {lock.lock_path(cache)}" in outcome["error"]


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S * 4)
def test_two_first_builds_of_the_standin_share_one_build(standin_spec, tmp_path, lock_waits):
    cache = specimen.cache_dir(standin_spec, tmp_path)
    with lock.held(cache, specimen.Deadline(60)):  # both start while the cache is locked and empty
        # Not offline=True: the offline guard patches process-wide socket functions, one block at a time.
        builds = [in_thread(specimen.acquire, standin_spec, cache_root=tmp_path, deadline_s=120)
                  for _ in range(2)]
        lock_waits(2)
    results = [join() for join in builds]
    assert sorted(r["acquisition"] for r in results) == ["built_offline", "reuse:project_cache"]
    assert all(r["verification"]["ok"] for r in results)


BUILD_STANDIN = """
import sys
sys.path.insert(0, {root!r})
from inferlab import specimen
result = specimen.acquire(specimen.load_spec("standin"), cache_root={cache_root!r}, offline=True)
print(result["acquisition"])
"""


@pytest.mark.process
@pytest.mark.timeout(HANG_GUARD_S * 6)
def test_two_processes_building_the_standin_at_once_both_succeed(tmp_path):
    """Issue 15.4's reproduction: without the lock one of them got a raw OSError."""
    script = BUILD_STANDIN.format(root=str(REPO_ROOT), cache_root=str(tmp_path))
    children = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate(timeout=HANG_GUARD_S * 5) for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    assert sorted(out.strip() for out, _ in outputs) in (["built_offline", "reuse:project_cache"],)
