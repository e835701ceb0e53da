"""Every forward observed from inside it: inference mode on and the model not training (issue 26, A4)."""

from __future__ import annotations

import pytest
import torch

from inferlab.measure import forward_mode
from inferlab.measure.cache_check import run_matched_prefix
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9]


@pytest.fixture
def watched():
    model = tiny_gpt_neox(seed=0)
    watch = forward_mode.ForwardWatch(model)
    yield model, watch
    watch.remove()


def test_the_librarys_forwards_all_keep_the_controls(watched):
    model, watch = watched
    window = watch.window()
    ids = torch.tensor([PROMPT])
    loop = run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True, new_tokens=4)
    run_matched_prefix(model, PROMPT, loop.generated_ids[:3])
    summary = window.summary()
    assert summary["forwards"] == 4 + 2 * 3  # a prefill and three steps, then 2m forwards of the cache test
    assert summary["violation_count"] == 0 and summary["all_inference_mode"] and summary["none_training"]
    assert forward_mode.violation_message(summary) is None


def test_a_forward_outside_inference_mode_or_in_training_mode_is_a_violation_with_its_number(watched):
    model, watch = watched
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        model(ids)  # forward 1: before the window, and within the controls
    window = watch.window()
    model(ids)  # forward 2: no inference mode
    model.train()
    with torch.inference_mode():
        model(ids)  # forward 3: training
    model.eval()
    summary = window.summary()
    assert summary["forwards"] == 2 and summary["violation_count"] == 2
    assert summary["violations"] == [
        {"forward": 2, "inference_mode": False, "training": False, "grad_enabled": True},
        {"forward": 3, "inference_mode": True, "training": True, "grad_enabled": False}]
    assert not summary["all_inference_mode"] and not summary["none_training"]
    message = forward_mode.violation_message(summary)
    assert message.startswith("2 of 2 forwards broke the controls") and "forward 2 of the session" in message
    later = watch.window()
    with torch.inference_mode():
        model(ids)
    assert later.summary()["violation_count"] == 0  # a window sees only its own forwards


def test_removing_the_watch_stops_counting(watched):
    model, watch = watched
    watch.remove()
    with torch.inference_mode():
        model(torch.tensor([PROMPT]))
    assert watch.forwards == 0
