"""kvlab: a small, tested inference engine for learning how LLM servers manage the KV cache.

The modules follow the labs: ``models`` and ``env`` (lab 00), ``memory`` and ``runner``
(lab 01), then the allocators, the scheduler, the engine and the kernels.
"""

from kvlab.env import EnvReport, default_device, env_report
from kvlab.models import chat_prompt, load_model

__all__ = ["EnvReport", "chat_prompt", "default_device", "env_report", "load_model"]
