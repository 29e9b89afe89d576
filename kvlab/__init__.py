"""kvlab: a small, tested inference engine for learning how LLM servers manage the KV cache.

The modules follow the labs: ``models`` and ``env`` (lab 00), ``memory``, ``runner``,
``naive_hf`` and ``cache.naive`` (lab 01), ``cache.contiguous`` and ``experiments`` (lab 02),
``cache.paged`` and ``simulator`` (lab 03), ``scheduler``, ``engine``, ``llm`` and ``replay``
(lab 04), ``kernels`` (lab 05), ``capstone`` and ``bench`` (labs 06 and 07).

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
