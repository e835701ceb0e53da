"""Part 3: what the model actually receives, recorded exactly for every prompt of the lab."""

import pytest

from inferlab import protocol

ALL_PROMPTS = {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}


@pytest.mark.records("input", "phase")
@pytest.mark.requires("model_load")
@pytest.mark.provides("inputs")
@pytest.mark.parametrize("prompt_id", list(ALL_PROMPTS))
def test_input(prompt_id, encoded_prompts, record):
    encoded = encoded_prompts[prompt_id]
    fields = encoded["record"]
    record("input", **fields)
    record("phase", name="tokenization", prompt_id=prompt_id, elapsed_s=fields["tokenization_s"],
           label="the tokenizer call alone (add_special_tokens=False); the decode-back checks are not timed")
    assert fields["source"] == ALL_PROMPTS[prompt_id]
    assert fields["serialized_matches_source"], (
        f"{prompt_id}: serialized {fields['serialized']!r} differs from source {fields['source']!r}"
    )
    assert fields["length"] == len(fields["token_ids"]) == sum(fields["attention_mask"])


@pytest.mark.records("eos_ids")
@pytest.mark.requires("model_load")
def test_eos_ids_agree_across_the_checkpoint_files(tokenizer, model, acquisition, record):
    """The tokenizer, config.json and (if the checkpoint has one) generation_config.json name one EOS id."""
    from inferlab.measure import inputs

    check = inputs.eos_cross_check(acquisition["directory"], tokenizer, model.config)
    record("eos_ids", **check)
    assert check["agree"], f"EOS ids differ between sources: {check['eos_token_id_by_source']}"
