"""The pool of physical KV blocks: who holds each block, which are free, which are cached.

Paged allocation cuts the KV memory into ``num_blocks`` blocks of ``block_size`` token
slots (the seed article says "page"; kvlab says block). This module only does the
bookkeeping, in pure Python, so the tensor cache (``kvlab.cache.paged``) and the
model-free memory simulator (``kvlab.sim.simulator``) run the very same logic.

Every block has a ``ref_cnt``: how many sequences hold it. A block with ``ref_cnt == 0``
is free. A free block that still carries a ``block_hash`` is *cached*: its K/V are intact,
and a new sequence whose prompt starts with the same tokens can adopt it instead of
recomputing it (prefix caching). Cached blocks are evicted only when a fresh block is
needed and no plain free block is left, least recently freed first (LRU):

    free queue (eviction order) ->  [b7 cached] [b2] [b9 cached] [b4]   <- freed blocks join here
                                     evicted first                       evicted last

How a block's hash is made, and how a prompt finds its cached prefix, is
``kvlab.cache.prefix_cache``.

Not handled here: the tensors (see ``kvlab.cache.paged``), per-sequence block tables (see
``kvlab.cache.block_manager``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import match_prefix


class BlockPool:
    """``num_blocks`` physical blocks with reference counts, a free queue and a prefix cache.

    Attributes:
        num_blocks: blocks in the pool.
        ref_cnt: per block, how many sequences hold it (0: free or cached).
        block_hash: per block, its chained hash while it can serve a prefix hit, else None.
        num_held_blocks: blocks with ``ref_cnt > 0``, counted as they change.
    """

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.num_held_blocks = 0
        self.block_hash: list[int | None] = [None] * num_blocks
        # NOTE: an OrderedDict is a queue that can also drop an entry from its middle in
        # O(1): a prefix hit takes a cached block out of the queue wherever it sits.
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block_hash -> block_id

    @property
    def num_free_blocks(self) -> int:
        """Blocks ``allocate`` can hand out now: plain free ones plus evictable cached ones."""
        return len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a ``block_hash`` (held or free)."""
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """The free blocks in eviction order: the first one is handed out (or evicted) next."""
        return list(self._free_queue)

    def allocate(self, num: int) -> list[int]:
        """Take ``num`` blocks from the head of the free queue, each with ``ref_cnt`` 1.

        A cached block taken this way is evicted: its hash leaves the prefix cache.

        Raises:
            CacheFullError: fewer than ``num`` blocks are free; nothing changes.
        """
        if num < 0:
            raise ValueError(f"num must be >= 0, got {num}")
        if num > self.num_free_blocks:
            raise CacheFullError(
                f"need {num} free blocks, only {self.num_free_blocks} of {self.num_blocks} are free"
            )
        block_ids = [self._free_queue.popitem(last=False)[0] for _ in range(num)]
        for block_id in block_ids:
            if self.block_hash[block_id] is not None:
                self._evict(block_id)
            self.ref_cnt[block_id] = 1
        self.num_held_blocks += num
        return block_ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block nobody holds joins the free queue's tail.

        Its ``block_hash`` stays, so it can still serve a prefix hit until it is evicted.
        Pass a sequence's blocks tail first: its last blocks, the least likely to be shared
        by another prompt, are then evicted first.
        """
        for block_id in block_ids:
            if self.ref_cnt[block_id] <= 0:
                raise ValueError(f"block {block_id} is freed but nobody holds it (double free)")
            self.ref_cnt[block_id] -= 1
            if self.ref_cnt[block_id] == 0:
                self._free_queue[block_id] = None
                self.num_held_blocks -= 1

    def share(self, block_ids: Iterable[int]) -> None:
        """Add one holder to each held block (a fork: parent and child now share it)."""
        for block_id in block_ids:
            if self.ref_cnt[block_id] <= 0:
                raise ValueError(f"block {block_id} is not held, so it cannot be shared")
            self.ref_cnt[block_id] += 1

    def match_prefix(self, block_size: int, token_ids) -> tuple[list[int], list[int]]:
        """The cached blocks of the longest full-block prefix of ``token_ids``, and their
        hashes; changes nothing (``kvlab.cache.prefix_cache.match_prefix``)."""
        return match_prefix(self, block_size, token_ids)

    def lookup(self, block_hash: int) -> int | None:
        """The block whose contents have this hash, or None; changes nothing."""
        return self._cached.get(block_hash)

    def take_cached(self, block_id: int) -> None:
        """Add a holder to a block found by ``lookup``; a free one leaves the free queue."""
        if self.block_hash[block_id] is None:
            raise ValueError(f"block {block_id} carries no block_hash: it is not cached")
        if self.ref_cnt[block_id] == 0:
            del self._free_queue[block_id]
            self.num_held_blocks += 1
        self.ref_cnt[block_id] += 1

    def cache(self, block_id: int, block_hash: int) -> bool:
        """Give a full, held block its hash so later prompts can find it.

        Returns:
            False when another block already serves this hash (two sequences computed the
            same prefix side by side); this block then stays uncached.
        """
        if self.ref_cnt[block_id] <= 0:
            raise ValueError(f"block {block_id} is free; only a held, full block can be cached")
        if block_hash in self._cached or self.block_hash[block_id] is not None:
            return self._cached.get(block_hash) == block_id
        self.block_hash[block_id] = block_hash
        self._cached[block_hash] = block_id
        return True

    def _evict(self, block_id: int) -> None:
        """Forget a cached block's hash: its K/V are about to be overwritten."""
        del self._cached[self.block_hash[block_id]]
        self.block_hash[block_id] = None
