"""What the experiment computes with the model: its inputs, the generate() trials, the timed decode loop, the cache
check, memory, batching, loading and inspection, and the arithmetic of their records (summaries, contention)."""
