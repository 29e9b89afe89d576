"""Where K and V live, and who owns which slot.

Two halves. Bookkeeping, plain Python: ``manager`` is the interface the scheduler talks to
(admit, allocate_slots, fork, free, usage), ``contiguous_manager`` (over
``contiguous_arena``) and ``block_manager`` (over ``block_pool``, with ``prefix_cache``'s
block hashes; forks, copy-on-write and prefix hits included) implement it, and
``kvlab.sim.simulator`` reuses them. Storage, torch: ``base`` is the interface the model
runner reads and writes through (with one step's ``ForwardBatch`` and ``StepMetadata``);
``naive`` (one growing tensor per sequence), ``contiguous`` and ``paged`` (one
preallocated pool, bookkeeping in a manager); ``swap`` holds the CPU pool swapped blocks
are copied to.

Lesson ladder: naive -> contiguous -> paged.
"""

from kvlab.cache.base import (
    BlockInfo,
    CacheUsage,
    ForwardBatch,
    KVCache,
    PooledKVCache,
    StepMetadata,
)
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import BlockPool
from kvlab.cache.contiguous import ContiguousKVCache, num_slots_for_budget
from kvlab.cache.contiguous_arena import RESERVATION_POLICIES, ContiguousArena, reservation_size
from kvlab.cache.contiguous_manager import ContiguousManager
from kvlab.cache.manager import CacheFullError, DecodeAllocation, KVCacheManager, KVUsage
from kvlab.cache.naive import NaiveKVCache
from kvlab.cache.paged import PagedKVCache, num_blocks_for_budget
from kvlab.cache.prefix_cache import hash_block_tokens

__all__ = [
    "RESERVATION_POLICIES",
    "BlockInfo",
    "BlockManager",
    "BlockPool",
    "CacheFullError",
    "CacheUsage",
    "ContiguousArena",
    "ContiguousKVCache",
    "ContiguousManager",
    "DecodeAllocation",
    "ForwardBatch",
    "KVCache",
    "KVCacheManager",
    "KVUsage",
    "NaiveKVCache",
    "PagedKVCache",
    "PooledKVCache",
    "StepMetadata",
    "hash_block_tokens",
    "num_blocks_for_budget",
    "num_slots_for_budget",
    "reservation_size",
]
