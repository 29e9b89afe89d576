"""kvlab: a small, tested inference engine for learning how LLM servers manage the KV cache.

The subpackages follow the labs:

    env, memory        lab 00: the machine, and KV bytes from a model's config
    model              labs 00-01: load SmolLM2, kvlab's own forward pass, a greedy loop
    cache              labs 01-03, 06: where K/V live (naive, contiguous, paged) and the
                       bookkeeping behind them (block manager, prefix cache, swap)
    attention          labs 01, 05: the attention backends (reference, sdpa, triton)
    engine             lab 04 on: requests, scheduler, LLMEngine, LLM, metrics
    sim                labs 03, 07: traces replayed at data-center scale, no model
    measure            every lab's measurements, and the benchmarks
    widgets            page map, memory gauge, batching panel
    exercises          the labs' questions and their checks
    kernels            lab 05: the Triton kernels (the repository's top-level kernels/)

The names below are imported on first use, so that ``import kvlab.sim`` (no model)
does not pay for importing transformers.
"""

from __future__ import annotations

import importlib

from kvlab.env import EnvReport, default_device, env_report

_LAZY = {
    "LLM": "kvlab.engine.llm",
    "SamplingParams": "kvlab.engine.sampling_params",
    "chat_prompt": "kvlab.model.loading",
    "load_model": "kvlab.model.loading",
}

__all__ = ["LLM", "EnvReport", "SamplingParams", "chat_prompt", "default_device", "env_report"]
__all__ += ["load_model"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")
