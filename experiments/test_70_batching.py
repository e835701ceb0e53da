"""Optional bounded extension: the two prompts singly and as a left-padded two-row batch, both orders."""

import pytest

from inferlab import protocol

BATCH_FILE = "batching_first_step_logits"
pytestmark = [pytest.mark.batching, pytest.mark.optional_extension]


@pytest.mark.records("batching")
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.provides("batching")
@pytest.mark.budget(category="batching", calls=4, selections=6 * protocol.MAX_NEW_TOKENS)
def test_batching_calls(model, tokenizer, tensor_store, forward_window, record):
    from inferlab.measure import batching, loading

    result, tensors = batching.run_batching(model, tokenizer, dict(protocol.PROMPTS))
    mode = forward_window.summary()
    common = {key: value for key, value in result.items() if key not in ("calls", "comparisons", "summary")}
    for call in result["calls"]:
        index = call["call_index"]
        # Only the first step is compared, so only it is kept: (B, vocab) instead of (B, 16, vocab).
        first_step = tensor_store.put(BATCH_FILE, f"call{index}", tensors[f"call{index}_step_logits"][:, 0, :])
        record("batching", record_type="call", **call, first_step_logits=first_step,
               singletons_note="singletons are fresh calls of this extension, not reused from the core trials")
    record("batching", record_type="summary", **common, comparisons=result["comparisons"], **result["summary"],
           forward_mode=mode)
    assert not loading.violation_message(mode), loading.violation_message(mode)
    assert result["summary"]["generate_calls"] <= protocol.BATCHING_MAX_CALLS
    assert result["summary"]["all_row_mappings_verified"], "a batch row's unpadded prompt differs from its request's"


@pytest.mark.requires("batching")
@pytest.mark.parametrize("order", [list(protocol.PROMPTS), list(reversed(protocol.PROMPTS))], ids="-".join)
def test_batch_rows_map_to_their_requests(order, inferlab_run):
    """Each row of the batch in this order holds its own request's prompt, and matches that request's singleton."""
    call = next(r for r in inferlab_run.records_of("batching")
                if r["record_type"] == "call" and r["call_type"] == "batch" and r["request_ids"] == order)
    assert call["row_to_request"] == {str(row): request for row, request in enumerate(order)}
    summary = next(r for r in inferlab_run.records_of("batching") if r["record_type"] == "summary")
    rows = [c for c in summary["comparisons"] if c["batch_call_index"] == call["call_index"]]
    assert [c["request_id"] for c in rows] == order
    assert all(c["unpadded_prompt_matches_singleton"] for c in rows), rows
