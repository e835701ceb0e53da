"""inferlab.measure.summaries: what the sampling summary counts."""

from __future__ import annotations

from inferlab import protocol
from inferlab.measure.summaries import sampling_summary


def test_an_eos_as_the_last_allowed_token_is_not_an_early_stop():
    def trial(trial_id, length, last):
        ids = [5] * (length - 1) + [last]
        return {"prompt_id": "P1", "trial_id": trial_id, "condition": "S1", "seed": 17, "is_rerun": False,
                "status": "ok", "generated_ids": ids, "generated_length": length,
                "stop_reason": "eos" if last == 0 else "max_new_tokens"}

    summary = sampling_summary([trial("a", 4, 0), trial("b", protocol.MAX_NEW_TOKENS, 0)], "P1")
    assert summary["per_condition"]["S1"]["early_eos"] == 1 and summary["early_eos_total"] == 1


def test_the_post_first_interval_comes_from_the_nanosecond_stamps_when_a_record_has_them():
    from inferlab.measure.summaries import post_first_interval, post_first_interval_s, token_times

    stamps = [1_000_000_007, 1_000_100_011, 1_000_200_013]  # perf_counter_ns values, t_1..t_3
    assert post_first_interval_s(stamps) == (stamps[-1] - stamps[0]) / 2 / 1e9
    assert post_first_interval_s(stamps[:1]) is None
    seconds = [(t - 1_000_000_000) / 1e9 for t in stamps]
    record = {"token_times_ns": stamps, "token_times_s": seconds}
    assert post_first_interval(record) == post_first_interval_s(stamps)
    assert post_first_interval({"token_times_s": seconds}) == (seconds[-1] - seconds[0]) / 2
    assert post_first_interval({**record, "mean_post_first_interval_s": 0.5}) == 0.5  # as recorded, first
    # One name per field: the times in seconds are read from token_times_s only.
    assert token_times(record) == seconds and token_times({"token_times": seconds}) is None
