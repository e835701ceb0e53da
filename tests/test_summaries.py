"""inferlab.summaries.phase_summary: phases side by side, one row per (name, source)."""

from __future__ import annotations

from inferlab.summaries import phase_summary


def test_tokenization_and_output_decoding_sit_side_by_side():
    phases = [
        {"name": "model_and_tokenizer_load", "elapsed_s": 0.5},
        {"name": "tokenization", "prompt_id": "P1", "elapsed_s": 0.002},
        {"name": "tokenization", "prompt_id": "P2", "elapsed_s": 0.004},
        {"name": "output_decoding", "source": "generation", "trial_id": "P1-G-rep1", "elapsed_s": 0.001},
        {"name": "output_decoding", "source": "generation", "trial_id": "P1-G-rep2", "elapsed_s": 0.003},
        {"name": "output_decoding", "source": "generation", "trial_id": "P1-G-rep3", "elapsed_s": 0.002},
        {"name": "output_decoding", "source": "timing", "trial_id": "P1-cache_on-warmup", "elapsed_s": 0.006},
    ]
    rows = {(r["name"], r["source"]): r for r in phase_summary(phases)}
    assert list(rows) == [("model_and_tokenizer_load", None), ("tokenization", None),
                          ("output_decoding", "generation"), ("output_decoding", "timing")]
    generation = rows[("output_decoding", "generation")]
    assert (generation["n"], generation["elapsed_s"]["median"], generation["elapsed_s"]["min"],
            generation["elapsed_s"]["max"]) == (3, 0.002, 0.001, 0.003)
    assert rows[("tokenization", None)]["total_s"] == 0.006


def test_a_phase_without_a_number_is_left_out():
    assert phase_summary([{"name": "tokenization", "elapsed_s": None}]) == []


def test_an_eos_as_the_last_allowed_token_is_not_an_early_stop():
    from inferlab import protocol
    from inferlab.summaries import sampling_summary

    def trial(trial_id, length, last):
        ids = [5] * (length - 1) + [last]
        return {"prompt_id": "P1", "trial_id": trial_id, "condition": "S1", "seed": 17, "is_rerun": False,
                "status": "ok", "generated_ids": ids, "generated_length": length,
                "stop_reason": "eos" if last == 0 else "max_new_tokens"}

    summary = sampling_summary([trial("a", 4, 0), trial("b", protocol.MAX_NEW_TOKENS, 0)], "P1")
    assert summary["per_condition"]["S1"]["early_eos"] == 1 and summary["early_eos_total"] == 1
