"""Measurements the labs make, and the benchmarks.

naive_hf     lab 01: Hugging Face's own cache measured (bytes per token, time per step)
experiments  labs 02-03: requests served through one cache, fragmentation, concurrency
replay       lab 04: a seeded trace replayed through LLM, step logs and timelines
kernel_viz   lab 05: which blocks each Triton program reads
capstone     lab 07: the seed article's claims measured
bench        python -m kvlab.measure.bench: kvlab against Hugging Face, and the
             engine's own cost per step
"""
