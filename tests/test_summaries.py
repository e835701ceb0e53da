"""inferlab.summaries: what the sampling summary counts."""

from __future__ import annotations

from inferlab import protocol
from inferlab.summaries import sampling_summary


def test_an_eos_as_the_last_allowed_token_is_not_an_early_stop():
    def trial(trial_id, length, last):
        ids = [5] * (length - 1) + [last]
        return {"prompt_id": "P1", "trial_id": trial_id, "condition": "S1", "seed": 17, "is_rerun": False,
                "status": "ok", "generated_ids": ids, "generated_length": length,
                "stop_reason": "eos" if last == 0 else "max_new_tokens"}

    summary = sampling_summary([trial("a", 4, 0), trial("b", protocol.MAX_NEW_TOKENS, 0)], "P1")
    assert summary["per_condition"]["S1"]["early_eos"] == 1 and summary["early_eos_total"] == 1
