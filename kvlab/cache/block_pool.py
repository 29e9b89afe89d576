"""The pool of physical KV blocks: who holds each block, which are free, which are cached.

Paged allocation cuts the KV memory into ``num_blocks`` blocks of ``block_size`` token
slots (the seed article says "page"; kvlab says block). This module only does the
bookkeeping, in pure Python, so the tensor cache (``kvlab.cache.paged``) and the
model-free memory simulator (``kvlab.sim.simulator``) run the very same logic.

Every block has a ``ref_cnt``: how many sequences hold it. A block with ``ref_cnt == 0``
is free. A free block that still carries a ``block_hash`` is *cached*: its K/V are intact,
and a new sequence whose prompt starts with the same tokens can adopt it instead of
recomputing it (prefix caching). The free queue holds both kinds, in two runs:

    free queue:  front [b4] [b9] [b1] [b7 #] [b2 #] [b5 #] back    (# = has a block_hash)
                       plain blocks,   cached blocks, least
                       reused first    recently used first

``allocate`` takes from the front; ``free`` puts plain blocks at the front (the blocks of
one call in their order) and cached blocks at the back.

A plain free block (a sequence's partly filled last block; every block when prefix
caching is off) can serve no hit, so it is handed out before any cached block; a cached
block is evicted, its hash forgotten, only when no plain block is left, the least
recently used first (LRU). With prefix caching off every block is plain, so the block
freed last is reused first (vLLM's reason: GPU cache locality).

The rules are vLLM 0.32.0's (``vllm/v1/core/block_pool.py``: ``BlockPool.free_blocks``
prepends blocks without a hash to the free queue and appends cached ones, "Apply LRU
policy only to proper cache entries", vLLM PR 42656; ``get_new_blocks`` takes from the
front and evicts; ``FreeKVCacheBlockQueue.prepend_n`` / ``append_n`` in
``vllm/v1/core/kv_cache_utils.py``), and so is the prefix cache's (``BlockHashToBlockMap``
in ``block_pool.py``): a block whose hash another block already serves is cached too ("we
currently don't de-duplicate"), so a block table never changes under a running sequence,
and a lookup finds the first copy still cached.

The order of the free queue is the eviction policy, one small class: ``LRUEviction``, or
``AllToTheBack`` (one queue for every freed block, which lab 06 measures against it). How
a block's hash is made, and the map from hashes to blocks, is ``kvlab.cache.prefix_cache``.
``BlockPoolInterface`` declares what the block manager reads from a pool, for a pool of
one's own (lab 06's build-it: ``LLM(..., block_pool=...)``).

Not handled: resetting the prefix cache (vLLM's ``reset_prefix_cache``, after new weights):
a cached block leaves only by eviction. The tensors are ``kvlab.cache.paged``'s, the
per-sequence block tables ``kvlab.cache.block_manager``'s.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import PrefixCache


class BlockPoolInterface(Protocol):
    """What ``kvlab.cache.BlockManager`` (and the page map of ``PagedKVCache``) reads from
    and asks of its pool of blocks.

    ``BlockPool`` is kvlab's; lab 06's learner writes another
    (``kvlab.exercises.learner_pool.LearnerPool`` adapts it).
    """

    num_blocks: int
    ref_cnt: list[int]  # per block: how many sequences hold it
    block_hash: list[int | None]  # per block: its chained hash while cached

    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_held_blocks(self) -> int: ...
    def allocate(self, num: int) -> list[int]: ...
    def free(self, block_ids: Iterable[int]) -> None: ...
    def share(self, block_ids: Iterable[int]) -> None: ...
    def take_cached(self, block_id: int) -> None: ...
    def cache(self, block_id: int, block_hash: int) -> None: ...
    def match_prefix(
        self, block_size: int, token_ids: Sequence[int]
    ) -> tuple[list[int], list[int]]: ...


class LRUEviction:
    """The free queue in the order its blocks are handed out: plain blocks first, the one
    freed last first; then cached blocks, least recently used first (evicted in turn)."""

    def __init__(self, num_blocks: int) -> None:
        # NOTE: an OrderedDict is a queue that can also drop an entry from its middle, and
        # put one at its front, in O(1): a prefix hit takes a cached block out of the queue
        # wherever it sits, and a freed plain block goes to the front.
        self._queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[int]:
        return iter(self._queue)

    def pop(self) -> int:
        """The next block to hand out."""
        return self._queue.popitem(last=False)[0]

    def remove(self, block_id: int) -> None:
        """A prefix hit takes a free cached block back."""
        del self._queue[block_id]

    def push(self, freed: list[tuple[int, bool]]) -> None:
        """Blocks nobody holds any more, in the order freed, each with whether it is cached:
        a cached one to the back, a plain one to the front (one call's plain blocks keep
        their order there)."""
        plain = []
        for block_id, cached in freed:
            if cached:
                self._queue[block_id] = None
            else:
                plain.append(block_id)
        for block_id in reversed(plain):  # each to the front: the first freed ends up first
            self._queue[block_id] = None
            self._queue.move_to_end(block_id, last=False)


class AllToTheBack(LRUEviction):
    """One free queue: every freed block joins the back, plain or cached, in the order
    freed (kvlab's rule before vLLM 0.32.0's; lab 06 measures what LRU's order buys). A
    cached block can then be evicted while a plain one, which no prompt can hit, is free."""

    def push(self, freed: list[tuple[int, bool]]) -> None:
        for block_id, _ in freed:
            self._queue[block_id] = None


class BlockPool:
    """``num_blocks`` physical blocks with reference counts, a free queue and a prefix cache.

    Args:
        num_blocks: blocks in the pool.
        eviction_policy: the free queue's class (``LRUEviction``), built with
            ``num_blocks``.

    Attributes:
        num_blocks: blocks in the pool.
        ref_cnt: per block, how many sequences hold it (0: free or cached).
        block_hash: per block, its chained hash while it can serve a prefix hit, else None.
        num_held_blocks: blocks with ``ref_cnt > 0``, counted as they change.
        num_cached_blocks: blocks that carry a ``block_hash`` (held or free).
        free_queue: the free blocks, in the order the eviction policy hands them out.
        prefix_cache: ``block_hash -> blocks`` of every cached block.
    """

    def __init__(self, num_blocks: int, eviction_policy: type[LRUEviction] = LRUEviction) -> None:
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.num_held_blocks = 0
        self.block_hash: list[int | None] = [None] * num_blocks
        self.num_cached_blocks = 0
        self.free_queue = eviction_policy(num_blocks)
        self.prefix_cache = PrefixCache()

    @property
    def num_free_blocks(self) -> int:
        """Blocks ``allocate`` can hand out now: plain free ones plus evictable cached ones."""
        return len(self.free_queue)

    def free_block_ids(self) -> list[int]:
        """The free blocks in eviction order: the first one is handed out (or evicted) next."""
        return list(self.free_queue)

    def allocate(self, num: int) -> list[int]:
        """Take ``num`` blocks from the front of the free queue, each with ``ref_cnt`` 1.

        Plain blocks come first; a cached block taken this way is evicted: its hash leaves
        the prefix cache.

        Raises:
            CacheFullError: fewer than ``num`` blocks are free; nothing changes.
        """
        if num < 0:
            raise ValueError(f"num must be >= 0, got {num}")
        if num > self.num_free_blocks:
            raise CacheFullError(
                f"need {num} free blocks, only {self.num_free_blocks} of {self.num_blocks} are free"
            )
        block_ids = [self.free_queue.pop() for _ in range(num)]
        for block_id in block_ids:
            if self.block_hash[block_id] is not None:
                self._evict(block_id)
            self.ref_cnt[block_id] = 1
        self.num_held_blocks += num
        return block_ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block nobody holds goes back to the free queue.

        A plain block goes to the front, so it is reused first; the plain blocks of one
        call keep their order there. A cached block goes to the back and keeps its hash, so
        it can serve a prefix hit until it is evicted, least recently used first. Pass a
        sequence's blocks tail first: its last blocks, the least likely to be shared by
        another prompt, are then evicted first.

        Raises:
            ValueError: a block is freed more often than it is held; nothing changes.
        """
        block_ids = list(block_ids)
        for block_id, count in Counter(block_ids).items():
            if self.ref_cnt[block_id] < count:
                raise ValueError(f"block {block_id} is freed but nobody holds it (double free)")
        freed = []
        for block_id in block_ids:
            self.ref_cnt[block_id] -= 1
            if self.ref_cnt[block_id] == 0:
                self.num_held_blocks -= 1
                freed.append((block_id, self.block_hash[block_id] is not None))
        self.free_queue.push(freed)

    def share(self, block_ids: Iterable[int]) -> None:
        """Add one holder to each held block (a fork: parent and child now share it)."""
        for block_id in block_ids:
            if self.ref_cnt[block_id] <= 0:
                raise ValueError(f"block {block_id} is not held, so it cannot be shared")
            self.ref_cnt[block_id] += 1

    def match_prefix(self, block_size: int, token_ids) -> tuple[list[int], list[int]]:
        """The cached blocks of the longest full-block prefix of ``token_ids``, and their
        hashes; changes nothing (``PrefixCache.match_prefix``)."""
        return self.prefix_cache.match_prefix(block_size, token_ids)

    def lookup(self, block_hash: int) -> int | None:
        """A block whose contents have this hash (the first cached of its copies), or None;
        changes nothing."""
        return self.prefix_cache.lookup(block_hash)

    def cached_blocks(self, block_hash: int) -> list[int]:
        """Every block that carries this hash, the one ``lookup`` finds first."""
        return self.prefix_cache.blocks(block_hash)

    def take_cached(self, block_id: int) -> None:
        """Add a holder to a block found by ``lookup``; a free one leaves the free queue."""
        if self.block_hash[block_id] is None:
            raise ValueError(f"block {block_id} carries no block_hash: it is not cached")
        if self.ref_cnt[block_id] == 0:
            self.free_queue.remove(block_id)
            self.num_held_blocks += 1
        self.ref_cnt[block_id] += 1

    def cache(self, block_id: int, block_hash: int) -> None:
        """Give a full, held block its hash so later prompts can find it.

        If another block already serves this hash (two sequences computed the same prefix
        side by side), this one is cached too, behind it: each sequence keeps the blocks it
        computed, and a lookup still finds a copy after the first is evicted. Caching a
        block again under its own hash changes nothing.
        """
        if self.ref_cnt[block_id] <= 0:
            raise ValueError(f"block {block_id} is free; only a held, full block can be cached")
        if self.block_hash[block_id] is not None:
            if self.block_hash[block_id] != block_hash:
                raise ValueError(f"block {block_id} is cached under another hash already")
            return
        self.block_hash[block_id] = block_hash
        self.prefix_cache.add(block_hash, block_id)
        self.num_cached_blocks += 1

    def _evict(self, block_id: int) -> None:
        """Forget a cached block's hash: its K/V are about to be overwritten."""
        self.prefix_cache.remove(self.block_hash[block_id], block_id)
        self.block_hash[block_id] = None
        self.num_cached_blocks -= 1
