"""Unit tests of the contiguous and paged allocators, shared behaviour parametrized over both.

The oracle is a plain dict of the K/V each sequence was given: whatever a cache does with
slots and blocks, every sequence must read back exactly its own tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvlab.cache import (
    BlockManager,
    BlockPool,
    CacheFullError,
    ContiguousArena,
    ContiguousKVCache,
    ForwardBatch,
    KVCache,
    PagedKVCache,
    hash_block_tokens,
    num_blocks_for_budget,
    num_slots_for_budget,
    reservation_size,
)
from kvlab.memory import preset

NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM = 2, 2, 4
BLOCK_SIZE = 4
CAPACITY = 64  # token slots in every cache built here
KINDS = ["contiguous", "paged"]


def make_cache(kind: str, capacity: int = CAPACITY, **kwargs) -> KVCache:
    shape = (NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM)
    if kind == "contiguous":
        kwargs.setdefault("reservation_policy", "exact")
        return ContiguousKVCache(*shape, num_slots=capacity, device="cpu", **kwargs)
    return PagedKVCache(
        *shape, num_blocks=capacity // BLOCK_SIZE, block_size=BLOCK_SIZE, device="cpu", **kwargs
    )


class Driver:
    """Runs steps on a cache with random K/V and remembers what each sequence was given."""

    def __init__(self, cache: KVCache, seed: int = 0):
        self.cache = cache
        self.generator = torch.Generator().manual_seed(seed)
        self.keys: dict[int, list[torch.Tensor]] = {}  # per seq: per layer (n, H, D)
        self.values: dict[int, list[torch.Tensor]] = {}

    def add(self, seq_id: int, prompt_len: int, max_tokens: int = 16) -> None:
        prompt = list(range(1000 + seq_id * 100, 1000 + seq_id * 100 + prompt_len))
        computed = self.cache.add_request(seq_id, prompt, max_tokens)
        assert computed == 0
        self.step({seq_id: prompt_len})

    def step(self, num_new: dict[int, int]) -> None:
        seq_ids = list(num_new)
        num_computed = [self.cache.num_tokens(s) if s in self.keys else 0 for s in seq_ids]
        for seq_id in seq_ids:
            self.cache.allocate_slots(seq_id, num_new[seq_id])
        batch = ForwardBatch.build(seq_ids, num_computed, [num_new[s] for s in seq_ids])
        self.cache.begin_step(batch)
        for layer in range(NUM_LAYERS):
            shape = (batch.num_tokens, NUM_KV_HEADS, HEAD_DIM)
            key = torch.randn(shape, generator=self.generator)
            value = torch.randn(shape, generator=self.generator)
            self.cache.write(layer, self.cache.begin_step(batch), key, value)
            starts = batch.query_start_loc.tolist()
            for i, seq_id in enumerate(seq_ids):
                rows = slice(starts[i], starts[i + 1])
                self._append(seq_id, layer, key[rows], value[rows])
        self.check(seq_ids)

    def fork(self, parent: int, child: int) -> None:
        self.cache.fork(parent, child)
        self.keys[child] = list(self.keys[parent])
        self.values[child] = list(self.values[parent])

    def free(self, seq_id: int) -> None:
        self.cache.free(seq_id)
        del self.keys[seq_id], self.values[seq_id]

    def check(self, seq_ids: list[int] | None = None) -> None:
        """Every sequence reads back exactly the K/V it was given, in every layer."""
        seq_ids = list(self.keys) if seq_ids is None else seq_ids
        batch = read_only_batch(seq_ids, [self.keys[s][0].shape[0] for s in seq_ids])
        for layer in range(NUM_LAYERS):
            for index, seq_id in enumerate(seq_ids):
                key, value = self.cache.read(layer, self.cache.begin_step(batch), index)
                assert torch.equal(key, self.keys[seq_id][layer]), f"seq {seq_id} K, L{layer}"
                assert torch.equal(value, self.values[seq_id][layer]), f"seq {seq_id} V"

    def _append(self, seq_id, layer, key, value):
        keys = self.keys.setdefault(seq_id, [torch.empty(0, NUM_KV_HEADS, HEAD_DIM)] * NUM_LAYERS)
        values = self.values.setdefault(seq_id, list(keys))
        keys[layer] = torch.cat([keys[layer], key])
        values[layer] = torch.cat([values[layer], value])


def read_only_batch(seq_ids: list[int], seq_lens: list[int]) -> ForwardBatch:
    """A batch that reads sequences without adding tokens (for checks only)."""
    return ForwardBatch(
        seq_ids=list(seq_ids),
        query_start_loc=torch.zeros(len(seq_ids) + 1, dtype=torch.long),
        seq_lens=torch.tensor(seq_lens, dtype=torch.long),
        positions=torch.zeros(0, dtype=torch.long),
    )


def snapshot(cache: KVCache):
    """Everything a refused request must leave as it was."""
    infos = cache.block_infos()
    tokens = {s: cache.num_tokens(s) for s in _seq_ids(cache)}
    return infos, tokens, cache.usage(), [kv.clone() for kv in cache.kv_caches]


def assert_same(before, after) -> None:
    assert before[:3] == after[:3]
    assert all(torch.equal(a, b) for a, b in zip(before[3], after[3], strict=True))


def _seq_ids(cache: KVCache) -> list[int]:
    return (
        cache.arena.seq_ids() if isinstance(cache, ContiguousKVCache) else cache.manager.seq_ids()
    )


# ---- shared behaviour --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_decode_reads_back_every_sequence(kind):
    driver = Driver(make_cache(kind))
    driver.add(0, prompt_len=5)
    driver.add(1, prompt_len=9)
    for _ in range(6):
        driver.step({0: 1, 1: 1})
    driver.step({0: 2, 1: 3})  # several new tokens each, in one batch
    driver.check()
    assert driver.cache.num_tokens(0) == 13 and driver.cache.num_tokens(1) == 18


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_prefill_and_decode_batch(kind):
    driver = Driver(make_cache(kind))
    driver.add(0, prompt_len=3)
    driver.cache.add_request(1, list(range(7)), 4)
    driver.step({0: 1, 1: 7})  # seq 0 decodes while seq 1 prefills
    driver.check()


@pytest.mark.parametrize("kind", KINDS)
def test_refused_request_changes_nothing(kind):
    cache = make_cache(kind)
    driver = Driver(cache)
    driver.add(0, prompt_len=30, max_tokens=10)
    before = snapshot(cache)
    with pytest.raises(CacheFullError, match="free"):
        cache.add_request(1, list(range(40)), 10)
        cache.allocate_slots(1, 40)
    if 1 in cache:  # the paged cache registers the request before allocating
        cache.free(1)
    assert_same(before, snapshot(cache))
    driver.check()


@pytest.mark.parametrize("kind", KINDS)
def test_free_returns_all_memory(kind):
    cache = make_cache(kind)
    driver = Driver(cache)
    for seq_id in range(3):
        driver.add(seq_id, prompt_len=6 + seq_id, max_tokens=4)
    assert cache.usage().reserved_bytes > 0
    for seq_id in range(3):
        driver.free(seq_id)
    usage = cache.usage()
    assert usage.reserved_bytes == 0 and usage.used_bytes == 0
    assert usage.capacity_bytes == CAPACITY * cache.bytes_per_slot
    assert all(info.ref_cnt == 0 for info in cache.block_infos())
    with pytest.raises(KeyError):
        cache.free(0)


@pytest.mark.parametrize("kind", KINDS)
def test_fork_then_diverge(kind):
    driver = Driver(make_cache(kind))
    driver.add(0, prompt_len=6, max_tokens=6)  # a partly filled last block (block_size 4)
    driver.fork(0, 1)
    driver.check()
    driver.step({0: 1, 1: 1})  # both write into the block they shared
    driver.step({1: 2})
    driver.check()
    driver.free(0)
    driver.check()


@pytest.mark.parametrize("kind", KINDS)
def test_usage_utilization(kind):
    cache = make_cache(
        kind,
        **(
            {"reservation_policy": "max_model_len", "max_model_len": 32}
            if kind == "contiguous"
            else {}
        ),
    )
    Driver(cache).add(0, prompt_len=5)
    usage = cache.usage()
    assert usage.used_bytes == 5 * cache.bytes_per_slot
    expected_reserved = 32 if kind == "contiguous" else 8  # whole range vs two blocks of 4
    assert usage.reserved_bytes == expected_reserved * cache.bytes_per_slot
    assert usage.utilization == pytest.approx(5 / expected_reserved)


@pytest.mark.parametrize("kind", KINDS)
def test_block_infos_cover_the_pool(kind):
    cache = make_cache(kind)
    driver = Driver(cache)
    driver.add(0, prompt_len=6)
    driver.add(1, prompt_len=3)
    infos = cache.block_infos()
    assert [info.block_id for info in infos] == list(range(CAPACITY // 4 if kind == "paged" else 4))
    held = [info for info in infos if info.ref_cnt]
    assert {s for info in held for s in info.seq_ids} == {0, 1}
    assert sum(info.num_filled for info in held) == 9
    assert held[0].logical_index == 0


@pytest.mark.parametrize("kind", KINDS)
def test_from_spec_and_budget(kind):
    spec = preset("smollm2-135m")
    if kind == "paged":
        num_blocks = num_blocks_for_budget(spec, 10 * spec.bytes_per_token * 16, block_size=16)
        cache = PagedKVCache.from_spec(spec, num_blocks, device="cpu")
        assert num_blocks == 10 and cache.kv_caches[0].shape == (2, 10, 16, 3, 64)
    else:
        num_slots = num_slots_for_budget(spec, 100 * spec.bytes_per_token + 5)
        cache = ContiguousKVCache.from_spec(spec, num_slots, device="cpu")
        assert num_slots == 100 and cache.kv_caches[0].shape == (2, 100, 3, 64)
    assert len(cache.kv_caches) == spec.num_layers
    assert cache.bytes_per_slot == spec.bytes_per_token
    with pytest.raises(ValueError, match="holds no"):
        num_slots_for_budget(spec, 10)


# ---- contiguous ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, prompt_len, max_tokens, expected",
    [
        ("max_model_len", 10, 5, 64),
        ("exact", 10, 5, 15),
        ("pow2", 10, 5, 18),  # output rounded up to 8
        ("pow2", 10, 16, 26),  # already a power of two
        ("pow2", 10, 40, 64),  # 10 + 64 capped at max_model_len
        ("pow2", 10, 0, 10),
    ],
)
def test_reservation_size(policy, prompt_len, max_tokens, expected):
    assert reservation_size(policy, prompt_len, max_tokens, max_model_len=64) == expected


def test_reservation_size_errors():
    with pytest.raises(ValueError, match="reservation_policy=.* is not allowed"):
        reservation_size("best", 1, 1, 8)
    with pytest.raises(ValueError, match="needs max_tokens"):
        reservation_size("exact", 1, None, 8)
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        reservation_size("exact", 5, 5, 8)


def test_arena_first_fit_holes_and_fragmentation():
    arena = ContiguousArena(20)
    assert [arena.reserve(s, 4) for s in range(5)] == [0, 4, 8, 12, 16]
    arena.free(1)
    arena.free(3)
    assert arena.holes() == [(4, 4), (12, 4)]
    # 8 slots free, but no 5-slot request fits: all 8 are external fragmentation for it.
    with pytest.raises(CacheFullError, match="largest hole has 4"):
        arena.reserve(9, 5)
    assert arena.external_fragmentation(5) == 8
    assert arena.external_fragmentation(4) == 0
    assert arena.external_fragmentation() == 4  # free slots outside the largest hole
    assert arena.reserve(9, 3) == 4  # first fit
    arena.grow(9, 2)
    assert arena.internal_fragmentation == 3 * 4 + 1  # three untouched ranges + one slot


def test_arena_refusal_names_external_fragmentation_only_when_there_is_some():
    arena = ContiguousArena(20)
    arena.reserve(0, 16)
    # One hole of 4: the free total is what is short, not how it lies.
    with pytest.raises(CacheFullError, match=r"needs 5 contiguous slots; only 4 of 20 are free$"):
        arena.reserve(1, 5)
    arena.reserve(1, 4)
    with pytest.raises(CacheFullError, match=r"only 0 of 20 are free$"):
        arena.reserve(2, 1)


def test_contiguous_range_cannot_outgrow_its_reservation():
    cache = make_cache("contiguous")
    driver = Driver(cache)
    driver.add(0, prompt_len=4, max_tokens=2)
    driver.step({0: 2})
    before = snapshot(cache)
    with pytest.raises(CacheFullError, match="cannot grow"):
        cache.allocate_slots(0, 1)
    assert_same(before, snapshot(cache))


def test_contiguous_exact_policy_has_no_internal_fragmentation_at_the_end():
    cache = make_cache("contiguous", reservation_policy="exact")
    driver = Driver(cache)
    driver.add(0, prompt_len=5, max_tokens=3)
    for _ in range(3):
        driver.step({0: 1})
    assert cache.usage().utilization == 1.0


def test_contiguous_needs_add_request_unless_it_reserves_max_model_len():
    with pytest.raises(KeyError, match="add_request"):
        make_cache("contiguous", reservation_policy="exact").allocate_slots(0, 1)
    cache = make_cache("contiguous", reservation_policy="max_model_len", max_model_len=32)
    cache.allocate_slots(0, 5)  # declared on the fly: a 32-slot range
    assert cache.arena.range_of(0).num_slots == 32 and cache.num_tokens(0) == 5


def test_contiguous_request_larger_than_the_arena_is_an_error():
    cache = make_cache("contiguous", reservation_policy="max_model_len", max_model_len=100)
    with pytest.raises(ValueError, match="arena has only"):
        cache.add_request(0, [1, 2], None)


# ---- paged: block pool, tables, copy-on-write, prefix caching --------------------------------


def test_block_pool_errors_and_counts():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert blocks == [0, 1, 2] and pool.num_free_blocks == 1
    with pytest.raises(CacheFullError, match="need 2 free blocks, only 1 of 4"):
        pool.allocate(2)
    pool.free([1])
    with pytest.raises(ValueError, match="double free"):
        pool.free([1])
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)


def test_block_pool_evicts_least_recently_freed_cached_block():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    for block_id, block_hash in ((a, 11), (b, 22), (c, 33)):
        pool.cache(block_id, block_hash)
    pool.free([b])
    pool.free([a])
    assert pool.free_block_ids() == [b, a]
    assert pool.lookup(22) == b
    assert pool.allocate(1) == [b]  # b was freed first: evicted first
    assert pool.lookup(22) is None and pool.lookup(11) == a
    pool.take_cached(a)  # a prefix hit takes a out of the free queue
    assert pool.ref_cnt[a] == 1 and pool.num_free_blocks == 0


def test_block_pool_reuses_plain_blocks_before_evicting_cached_ones():
    pool = BlockPool(6)
    a, b, c, d, e, f = pool.allocate(6)
    pool.cache(a, 11)
    pool.cache(b, 22)
    pool.free([c, a])  # c is plain: to the front; a is cached: to the back
    pool.free([d, b, e])  # d and e to the front, in the order freed, before c
    assert pool.free_block_ids() == [d, e, c, a, b]
    assert pool.allocate(3) == [d, e, c] and pool.lookup(11) == a  # nothing evicted
    assert pool.allocate(1) == [a] and pool.lookup(11) is None  # now the oldest cached one
    pool.free([f])
    assert pool.free_block_ids() == [f, b]


def test_block_pool_without_hashes_reuses_the_last_freed_block_first():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.free(blocks[:2])
    pool.free(blocks[2:])
    assert pool.free_block_ids() == [2, 3, 0, 1]
    assert pool.allocate(1) == [2]


def test_block_pool_refuses_a_double_free_and_changes_nothing():
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    with pytest.raises(ValueError, match="double free"):
        pool.free([a, b, b])
    assert pool.ref_cnt == [1, 1, 0] and pool.free_block_ids() == [2]


def test_block_pool_caches_a_second_copy_of_a_hash():
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    pool.cache(a, 11)
    pool.cache(b, 11)  # the same prefix, computed side by side
    pool.cache(b, 11)  # again: nothing changes
    assert pool.cached_blocks(11) == [a, b] and pool.num_cached_blocks == 2
    assert pool.lookup(11) == a
    pool.free([a, b])
    pool.allocate(2)  # the two plain blocks
    assert pool.allocate(1) == [a]  # evicts a: b still serves the hash
    assert pool.lookup(11) == b and pool.num_cached_blocks == 1
    pool.cache(a, 12)
    with pytest.raises(ValueError, match="another hash"):
        pool.cache(a, 13)


def test_block_hash_is_chained():
    first = hash_block_tokens(0, [1, 2, 3, 4])
    assert first == hash_block_tokens(0, (1, 2, 3, 4))
    assert hash_block_tokens(first, [5, 6]) != hash_block_tokens(0, [5, 6])


@pytest.mark.parametrize("block_size", [0, 257, 2.0])
def test_block_size_is_validated(block_size):
    with pytest.raises(ValueError, match="block_size must be an int from 1 to 256"):
        BlockManager(4, block_size)


def test_block_table_and_slot_mapping_tensors():
    cache = make_cache("paged")
    driver = Driver(cache)
    driver.add(0, prompt_len=6)  # blocks 0, 1
    driver.add(1, prompt_len=3)  # block 2
    cache.allocate_slots(0, 3)  # 9 tokens: a third block for seq 0
    cache.allocate_slots(1, 1)
    batch = ForwardBatch.build([0, 1], [6, 3], [3, 1])
    meta = cache.begin_step(batch)
    assert meta.block_table.dtype == torch.int32
    assert meta.block_table.tolist() == [[0, 1, 3], [2, 0, 0]]  # padded with 0
    # slot = block_id * block_size + offset: positions 6, 7, 8 of seq 0 and 3 of seq 1.
    assert meta.slot_mapping.tolist() == [1 * 4 + 2, 1 * 4 + 3, 3 * 4 + 0, 2 * 4 + 3]
    assert meta.batch.seq_lens.tolist() == [9, 4]


def test_step_before_allocate_is_an_error():
    cache = make_cache("paged")
    Driver(cache).add(0, prompt_len=3)
    with pytest.raises(ValueError, match="call allocate_slots first"):
        cache.begin_step(ForwardBatch.build([0], [3], [1]))


def test_fork_shares_blocks_and_copies_on_write():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    manager.allocate_slots(0, 6)  # blocks 0 (full) and 1 (2 of 4 filled)
    manager.fork(0, 1)
    assert manager.block_table(1) == [0, 1] and manager.pool.ref_cnt[:2] == [2, 2]
    copies = manager.allocate_slots(0, 1)  # seq 0 writes into shared block 1: copy it
    assert copies == [(1, 2)]
    assert manager.block_table(0) == [0, 2] and manager.pool.ref_cnt[:3] == [2, 1, 1]
    assert manager.allocate_slots(1, 1) == []  # block 1 now belongs to seq 1 alone
    manager.allocate_slots(0, 1)  # fills block 2
    manager.fork(0, 2)
    assert manager.allocate_slots(2, 1) == []  # last block full: a fresh block, no copy


def test_copy_on_write_refused_when_no_block_is_free():
    manager = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    manager.allocate_slots(0, 6)
    manager.fork(0, 1)
    assert manager.num_blocks_needed(0, 1) == 1
    with pytest.raises(CacheFullError, match="needs 1 free blocks"):
        manager.allocate_slots(0, 1)
    assert manager.block_table(0) == [0, 1] and manager.pool.ref_cnt == [2, 2]


def test_prefix_hit_adopts_the_computed_blocks():
    cache = make_cache("paged")
    prompt = list(range(100, 110))  # 10 tokens: two full blocks and a partial one
    assert cache.add_request(0, prompt) == 0
    cache.allocate_slots(0, len(prompt), token_ids=prompt)
    batch = ForwardBatch.build([0], [0], [10])
    keys = [torch.randn(10, NUM_KV_HEADS, HEAD_DIM) for _ in range(NUM_LAYERS)]
    for layer in range(NUM_LAYERS):
        cache.write(layer, cache.begin_step(batch), keys[layer], -keys[layer])
    cached_blocks = cache.block_table(0)[:2]
    cache.free(0)
    assert cache.num_free_blocks == CAPACITY // BLOCK_SIZE

    computed = cache.add_request(1, prompt[:9] + [7, 7, 7])  # shares 9 tokens: 2 full blocks
    assert computed == 8 and cache.block_table(1) == cached_blocks
    cache.allocate_slots(1, 4, token_ids=[prompt[8], 7, 7, 7])
    batch = ForwardBatch.build([1], [8], [4])
    for layer in range(NUM_LAYERS):
        cache.write(
            layer,
            cache.begin_step(batch),
            torch.zeros(4, NUM_KV_HEADS, HEAD_DIM),
            torch.zeros(4, 2, 4),
        )
        key, value = cache.read(layer, cache.begin_step(batch), 0)
        assert torch.equal(key[:8], keys[layer][:8]) and torch.equal(value[:8], -keys[layer][:8])


def test_prefix_hit_leaves_the_last_prompt_token_to_compute():
    manager = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(8))
    manager.allocate_slots(0, 8, token_ids=prompt)
    assert manager.pool.num_cached_blocks == 2
    assert len(manager.lookup_prefix(prompt)) == 1  # not both: token 7 must be computed
    assert len(manager.lookup_prefix(prompt + [9])) == 2
    assert manager.lookup_prefix([5] + prompt[1:]) == []  # the chain breaks at block 0


def test_cached_blocks_survive_free_until_evicted():
    manager = BlockManager(num_blocks=4, block_size=2)
    manager.allocate_slots(0, 4, token_ids=[1, 2, 3, 4])
    manager.free(0)
    assert manager.pool.num_cached_blocks == 2 and manager.num_free_blocks == 4
    manager.allocate_slots(1, 4)  # takes the two plain free blocks first
    assert len(manager.lookup_prefix([1, 2, 3, 4, 5])) == 2
    manager.allocate_slots(1, 2)  # now one cached block must be evicted
    assert manager.pool.num_cached_blocks == 1


def test_duplicate_prefix_is_cached_twice_and_either_copy_hits():
    manager = BlockManager(num_blocks=4, block_size=2)
    manager.allocate_slots(0, 2, token_ids=[1, 2])
    manager.allocate_slots(1, 2, token_ids=[1, 2])  # same tokens, computed side by side
    assert manager.pool.num_cached_blocks == 2
    assert manager.block_table(0) == [0] and manager.block_table(1) == [1]  # tables unchanged
    manager.free(0)
    manager.free(1)
    assert manager.lookup_prefix([1, 2, 3]) == [0]
    manager.allocate_slots(2, 6)  # the two plain blocks, then block 0 (the older cached one)
    assert manager.lookup_prefix([1, 2, 3]) == [1]  # the other copy still serves the prefix


def test_without_token_ids_no_block_is_cached():
    manager = BlockManager(num_blocks=4, block_size=2)
    manager.allocate_slots(0, 2, token_ids=[1, 2])
    manager.allocate_slots(0, 2)  # ids unknown: the chain ends here
    manager.allocate_slots(0, 2, token_ids=[5, 6])
    assert manager.pool.num_cached_blocks == 1


def test_token_ids_must_match_num_new_tokens():
    with pytest.raises(ValueError, match="token_ids has 1 ids"):
        BlockManager(4, 2).allocate_slots(0, 2, token_ids=[1])


# ---- the fast paths: allocate_decode and the incremental block table -----------------------


def test_allocate_decode_hashes_the_block_it_fills():
    manager = BlockManager(num_blocks=4, block_size=2)
    manager.allocate_slots(0, 1, token_ids=[1])
    result = manager.allocate_decode([0], [2])  # fills block 0 in place: no new block
    assert (result.num_allocated, result.copies) == (1, [])
    assert manager.lookup_prefix([1, 2, 3]) == manager.block_table(0) == [0]
    result = manager.allocate_decode([0], [3])  # block 0 is full: a new block
    assert manager.block_table(0) == [0, 1]
    row = manager.rows.rows([0])
    assert manager.rows.gather(row, np.array([2])).tolist() == [[0, 1]]  # the mirror too
    assert manager.rows.num_tokens[row].tolist() == [3]


def test_allocate_decode_copies_a_shared_last_block():
    cache = make_cache("paged")
    driver = Driver(cache)
    driver.add(0, prompt_len=6)  # blocks 0 (full) and 1 (2 of 4 filled)
    driver.fork(0, 1)
    assert cache.allocate_decode([0, 1], [7, 8]) == 2
    assert cache.block_table(0) == [0, 2]  # seq 0 copied the shared block 1
    assert cache.block_table(1) == [0, 1]  # then block 1 was seq 1's alone
    batch = ForwardBatch.build([0, 1], [6, 6], [1, 1])
    assert cache.begin_step(batch).slot_mapping.tolist() == [2 * 4 + 2, 1 * 4 + 2]
    driver.keys[0] = [k[:6] for k in driver.keys[0]]  # the prompt's K/V were copied too
    driver.values[0] = [v[:6] for v in driver.values[0]]
    batch = read_only_batch([0], [6])
    for layer in range(NUM_LAYERS):
        key, value = cache.read(layer, cache.begin_step(batch), 0)
        assert torch.equal(key, driver.keys[0][layer])


def test_allocate_decode_stops_at_the_first_sequence_that_does_not_fit():
    cache = make_cache("paged", capacity=3 * BLOCK_SIZE)
    for seq_id in range(3):
        cache.add_request(seq_id, [1, 2, 3, 4])
        cache.allocate_slots(seq_id, 4, [seq_id] * 4)  # every block full
    before = snapshot(cache)
    assert cache.allocate_decode([2, 0, 1], [5, 6, 7]) == 0
    assert_same(before, snapshot(cache))
    cache.free(1)
    assert cache.allocate_decode([2, 0, 1], [5, 6, 7]) == 1  # seq 2 took the free block
    assert [cache.num_tokens(s) for s in (0, 2)] == [4, 5]


def test_block_table_rows_grow_and_are_reused():
    cache = PagedKVCache(1, 1, 1, num_blocks=400, block_size=1, device="cpu")
    for seq_id in range(100):  # more sequences than the first rows
        cache.allocate_slots(seq_id, 3)
    cache.allocate_slots(7, 20)  # wider than the first width
    for seq_id in range(0, 100, 2):
        cache.free(seq_id)
    for seq_id in range(100, 150):  # reuse the freed rows
        cache.allocate_slots(seq_id, 2)
    seq_ids = list(range(1, 100, 2)) + list(range(100, 150))
    held = [cache.num_tokens(s) for s in seq_ids]
    meta = cache.begin_step(ForwardBatch.build(seq_ids, [0] * len(seq_ids), held))
    width = max(held)
    tables = [cache.block_table(s) + [0] * (width - len(cache.block_table(s))) for s in seq_ids]
    assert meta.block_table.tolist() == tables
    slots = [slot for s, n in zip(seq_ids, held, strict=True) for slot in cache.block_table(s)[:n]]
    assert meta.slot_mapping.tolist() == slots
