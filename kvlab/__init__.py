"""kvlab: a small, tested inference engine for learning how LLM servers manage the KV cache.

The modules follow the labs: ``models`` and ``env`` (lab 00), ``memory``, ``runner`` and
``cache.naive`` (lab 01), ``cache.contiguous`` (lab 02), ``cache.paged`` and ``simulator``
(lab 03), ``scheduler``, ``engine`` and ``llm`` (lab 04), ``kernels`` (lab 05).

The names below are imported on first use, so that ``import kvlab.simulator`` (no model)
does not pay for importing transformers.
"""

from __future__ import annotations

import importlib

from kvlab.env import EnvReport, default_device, env_report

_LAZY = {
    "LLM": "kvlab.llm",
    "SamplingParams": "kvlab.sampling_params",
    "chat_prompt": "kvlab.models",
    "load_model": "kvlab.models",
}

__all__ = ["LLM", "EnvReport", "SamplingParams", "chat_prompt", "default_device", "env_report"]
__all__ += ["load_model"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvlab' has no attribute {name!r}")
