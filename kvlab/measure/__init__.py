"""Measurements the labs make, and the benchmarks.

naive_hf         lab 01: Hugging Face's own cache measured (bytes per token, step time)
padded_batch     lab 01: a left-padded batch's cache, real tokens against padding
serve            labs 02-03: requests served greedily through the engine over one cache
experiments      labs 02-03: fragmentation, how many requests fit, block-size trade-off
replay           lab 04: a seeded trace replayed through LLM, step logs and timelines
kernel_viz       lab 05: which blocks each Triton program reads
capstone         lab 07: the seed article's claims measured
workload         the benchmarks' requests (ShareGPT-like lengths, scaled) and Result
hf_baselines     Hugging Face one at a time, in padded batches, and generate_batch
bench            python -m kvlab.measure.bench: kvlab against Hugging Face, end to end
engine_overhead  python -m kvlab.measure.engine_overhead: the engine's own cost per step
"""
