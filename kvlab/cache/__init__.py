"""Where K and V live: the interface (``base``) and the allocators that implement it.

Lesson ladder: ``naive`` (one growing tensor per sequence) -> ``contiguous`` (one range
reserved per request; ``contiguous_arena`` does the bookkeeping) -> ``paged`` (blocks from
a shared pool; ``block_pool`` and ``block_manager`` do the bookkeeping, in pure Python, so
``kvlab.simulator`` reuses them).
"""

from kvlab.cache.base import BlockInfo, CacheFullError, CacheUsage, ForwardBatch, KVCache
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import BlockPool, hash_block_tokens
from kvlab.cache.contiguous import ContiguousKVCache, num_slots_for_budget
from kvlab.cache.contiguous_arena import POLICIES, ContiguousArena, reservation_size
from kvlab.cache.naive import NaiveKVCache
from kvlab.cache.paged import PagedKVCache, PagedMetadata, num_blocks_for_budget

__all__ = [
    "POLICIES",
    "BlockInfo",
    "BlockManager",
    "BlockPool",
    "CacheFullError",
    "CacheUsage",
    "ContiguousArena",
    "ContiguousKVCache",
    "ForwardBatch",
    "KVCache",
    "NaiveKVCache",
    "PagedKVCache",
    "PagedMetadata",
    "hash_block_tokens",
    "num_blocks_for_budget",
    "num_slots_for_budget",
    "reservation_size",
]
