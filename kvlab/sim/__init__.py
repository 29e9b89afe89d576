"""Simulation at data-center scale (labs 03 and 07): request traces replayed with no model.

trace       make_trace: Poisson arrivals, ShareGPT- or Alpaca-like lengths, seeded
memory      the real KV bookkeeping (block manager, contiguous arena), no tensors
simulator   simulate: a fast path of the engine's loop, measuring KV memory per step, on
            an equal-step clock or one that prices each step (a GPU's roofline)
metrics     SimResult: KV memory in five parts, from token states to free, time-averaged;
            throughput and latency
paper       the PagedAttention paper's Figure 2 figures beside kvlab's
            (python -m kvlab.sim)
servers     the seed article's four servers at A100 scale: the request rate each sustains
"""
