"""What the experiment measures with the model, one module per part of the protocol: loading (the controls), inputs,
sampling, decode_loop, cache_check, memory, batching; usage (did a sample have the CPU) and stats (the records'
arithmetic)."""
