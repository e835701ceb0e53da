"""What the experiment measures with the model, one module per part of the protocol: loading (the controls), inputs,
sampling, decode_loop, cache_check, memory, batching; usage (was the thread kept waiting during a sample) and stats
(the records' arithmetic)."""
