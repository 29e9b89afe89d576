"""The KV cache an ``LLM`` builds: its settings checked, its size, the cache itself.

``LLM.__init__`` checks the cache settings together (``check_cache_settings``: a swap or a
Triton backend needs a paged cache), then sizes the pool like vLLM does:

    num_blocks given            that many blocks
    kv_cache_memory_bytes       as many blocks as the byte budget holds
    else, on CUDA               gpu_memory_utilization x the device's memory, minus what is
                                already allocated (the weights): ``default_kv_budget``
    else, on a CPU              1 GiB (``DEFAULT_CPU_KV_BYTES``)

A block holds ``block_size`` tokens of K and V in every layer, ``bytes_per_token x
block_size`` bytes (``kvlab.memory.KVSpec``), and the pool never gets more blocks than
``max_num_seqs`` sequences of ``max_model_len`` tokens could use (``num_blocks_for``).
``make_cache`` then allocates the paged pool, or a contiguous arena of the same token slots.

Not handled: activation memory (vLLM runs a profiling forward pass and subtracts its peak
from the budget; here the budget is all KV), memory other processes hold on the device.
"""

from __future__ import annotations

import math

import torch

from kvlab.attention import ATTENTION_BACKENDS
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.contiguous import ContiguousKVCache
from kvlab.cache.contiguous_arena import RESERVATION_POLICIES
from kvlab.cache.paged import PagedKVCache
from kvlab.memory import GIB
from kvlab.model.runner import ModelRunner

KV_CACHES = ("paged", "contiguous")
DEFAULT_CPU_KV_BYTES = GIB


def check_cache_settings(**settings) -> None:
    """``LLM``'s own checks of its cache settings, before anything is loaded or allocated.

    The attention backend is checked here too: the Triton kernels need a paged cache.
    (``SchedulerConfig`` checks the scheduling fields.)
    """
    kv_cache = settings["kv_cache"]
    _check_choice("kv_cache", kv_cache, KV_CACHES)
    _check_choice("attention_backend", settings["attention_backend"], tuple(ATTENTION_BACKENDS))
    _check_choice("reservation_policy", settings["reservation_policy"], RESERVATION_POLICIES)
    _check_int("block_size", settings["block_size"], 1, 256)
    for name in ("num_blocks", "max_model_len", "kv_cache_memory_bytes", "swap_space_bytes"):
        if settings[name] is not None:
            _check_int(name, settings[name], 1)
    _check_fraction("gpu_memory_utilization", settings["gpu_memory_utilization"])
    if not isinstance(settings["enable_prefix_caching"], bool):
        raise ValueError(
            f"enable_prefix_caching={settings['enable_prefix_caching']!r} is not allowed: "
            "use True or False"
        )
    if settings["attention_backend"] == "triton" and kv_cache != "paged":
        raise ValueError(
            "attention_backend='triton' is not allowed with kv_cache='contiguous': the "
            "Triton kernels read K/V block by block, and a contiguous cache's blocks are "
            "single slots; use kv_cache='paged'"
        )
    block_pool = settings["block_pool"]
    if block_pool is not None and not callable(block_pool):
        raise ValueError(
            f"block_pool={block_pool!r} is not allowed: use a class or function that takes "
            "num_blocks and returns a pool (kvlab.cache.block_pool.BlockPoolInterface)"
        )
    if block_pool is not None and kv_cache != "paged":
        raise ValueError(
            "block_pool is not allowed with kv_cache='contiguous': a contiguous cache "
            "reserves ranges, not blocks; use kv_cache='paged'"
        )
    if settings["preemption_mode"] == "swap" and kv_cache != "paged":
        raise ValueError(
            "preemption_mode='swap' is not allowed with kv_cache='contiguous': swapping "
            "moves blocks; use kv_cache='paged' or preemption_mode='recompute'"
        )


def default_kv_budget(device: torch.device, gpu_memory_utilization: float) -> int:
    """vLLM's sizing on CUDA (utilization x memory - what is allocated); 1 GiB on a CPU."""
    if device.type != "cuda":
        return DEFAULT_CPU_KV_BYTES
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(total * gpu_memory_utilization) - torch.cuda.memory_allocated(device)
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} leaves no KV memory: the "
            "weights already use that share of the device"
        )
    return budget


def num_blocks_for(
    runner: ModelRunner, budget: int, block_size: int, max_num_seqs: int, max_model_len: int
) -> int:
    """Blocks a KV budget holds, capped at what max_num_seqs full sequences could use."""
    block_bytes = runner.kv_spec().bytes_per_token * block_size
    num_blocks = budget // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"kv_cache_memory_bytes={budget} is not allowed: it holds no KV block "
            f"({block_bytes} bytes for {block_size} tokens of this model)"
        )
    return min(num_blocks, max_num_seqs * math.ceil(max_model_len / block_size))


def make_cache(kv_cache, runner, num_blocks, block_size, **options):
    """A ``PagedKVCache`` of ``num_blocks`` blocks, or a ``ContiguousKVCache`` of as many slots."""
    spec = runner.kv_spec()
    kv_shape = (spec.num_layers, spec.num_kv_heads, spec.head_dim)
    if kv_cache == "paged":
        block_pool = options["block_pool"]
        manager = BlockManager(
            num_blocks,
            block_size,
            options["enable_prefix_caching"],
            pool=block_pool(num_blocks) if block_pool is not None else None,
        )
        return PagedKVCache(
            *kv_shape,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=runner.dtype,
            device=runner.device,
            manager=manager,
        )
    # The same token slots as the paged pool would have, in one arena.
    return ContiguousKVCache(
        *kv_shape,
        num_slots=num_blocks * block_size,
        reservation_policy=options["reservation_policy"],
        max_model_len=options["max_model_len"],
        dtype=runner.dtype,
        device=runner.device,
        cell_size=block_size,
    )


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not allowed: use one of {choices}")


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        allowed = f"an int from {low} to {high}" if high is not None else f"an int >= {low}"
        raise ValueError(f"{name}={value!r} is not allowed: use {allowed}")


def _check_fraction(name: str, value) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed: use a number in (0, 1]")
