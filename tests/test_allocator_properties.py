"""Stateful property tests: long random runs of add / append / fork / free on both allocators.

Each token's K/V is a fixed function of the token ids up to and including it (as in a real
model), so two sequences with the same prefix hold the same K/V, and a prefix-cache hit can
be checked against what was computed for that prefix. Appended tokens get globally fresh
ids, so forked sequences diverge at once: a shared block written in place would show up
as another sequence reading a K/V that is not its own.

After every rule: every sequence reads back exactly its own K/V, no block is leaked or
double-freed, each ``ref_cnt`` equals the number of block tables that hold the block, and
contiguous ranges never overlap. A refused request must leave the bookkeeping and the
tensors exactly as they were.

The paged cache has two fast paths, each checked against its slow one: ``allocate_decode``
must leave the block manager exactly as ``allocate_slots`` one sequence at a time would,
and the incremental block table ``begin_step`` gathers must equal the block manager's
lists (same padded block tables, same slot mappings).
"""

from __future__ import annotations

import collections
import copy
import itertools
import os
import random

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.cache import (
    RESERVATION_POLICIES,
    BlockManager,
    CacheFullError,
    ContiguousKVCache,
    ForwardBatch,
    KVCache,
    PagedKVCache,
)

NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM = 2, 2, 4
NUM_BLOCKS = 12
CONTIGUOUS_SLOTS, MAX_MODEL_LEN = 48, 24
# Prompts are made of these 4-token segments, so different prompts share whole blocks, at
# the same or at different positions ([S0][S1] and [S2][S1] share a block, not a prefix).
SEGMENTS = [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34], [41, 42, 43, 44]]
# Up to 40 random operations per run (about 32 on average): 50 runs locally (about 1,600
# operations per allocator, a few seconds), 400 in CI (about 13,000; at least 10,000 is
# checked below). CI sets CI=true; HYPOTHESIS_PROFILE overrides.
STEPS_PER_RUN = 40
MIN_OPERATIONS = {"dev": 1_000, "ci": 10_000}
for _name, _runs in (("dev", 50), ("ci", 400)):
    settings.register_profile(
        _name,
        max_examples=_runs,
        stateful_step_count=STEPS_PER_RUN,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
SETTINGS = settings.get_profile(PROFILE)

# Operations each machine ran in this session (invariants run after every one).
OPERATIONS: collections.Counter[str] = collections.Counter()

_kv_memo: dict[int, torch.Tensor] = {}


def token_kv(prefix_hash: int) -> torch.Tensor:
    """(num_layers, 2, num_kv_heads, head_dim): the K/V of the token ending this prefix."""
    if prefix_hash not in _kv_memo:
        rng = random.Random(prefix_hash)
        values = [rng.uniform(-1, 1) for _ in range(NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_DIM)]
        _kv_memo[prefix_hash] = torch.tensor(values).view(NUM_LAYERS, 2, NUM_KV_HEADS, HEAD_DIM)
    return _kv_memo[prefix_hash]


class Seq:
    """What the test expects of one sequence."""

    def __init__(self, max_len: int):
        self.max_len = max_len  # prompt + max_tokens
        self.prefix_hashes: list[int] = []  # one per token

    def extend(self, token_ids: list[int]) -> None:
        parent = self.prefix_hashes[-1] if self.prefix_hashes else 0
        for token_id in token_ids:
            parent = hash((parent, token_id))
            self.prefix_hashes.append(parent)

    def expected(self) -> torch.Tensor:
        """(num_tokens, num_layers, 2, num_kv_heads, head_dim)"""
        return torch.stack([token_kv(h) for h in self.prefix_hashes])


class AllocatorMachine(RuleBasedStateMachine):
    """Shared rules; subclasses build the cache and check their own bookkeeping."""

    def __init__(self):
        super().__init__()
        self.cache: KVCache
        self.seqs: dict[int, Seq] = {}
        self.ids = itertools.count()
        self.fresh_tokens = itertools.count(1000)

    def make_cache(self, choice) -> KVCache:
        raise NotImplementedError

    def would_fit(self, seq_id: int, num_new: int) -> bool:
        raise NotImplementedError

    def snapshot(self):
        raise NotImplementedError

    # ---- rules -------------------------------------------------------------------------

    @rule(
        segments=st.lists(st.sampled_from(range(len(SEGMENTS))), max_size=3),
        num_fresh=st.integers(0, 6),
        max_tokens=st.integers(0, 6),
    )
    def add_request(self, segments, num_fresh, max_tokens):
        prompt = [token for i in segments for token in SEGMENTS[i]]
        prompt += [next(self.fresh_tokens) for _ in range(num_fresh)]
        if not prompt or len(prompt) + max_tokens > MAX_MODEL_LEN:
            return
        seq_id = next(self.ids)
        before = self.snapshot()
        try:
            computed = self.cache.add_request(seq_id, prompt, max_tokens)
        except CacheFullError:
            self.assert_unchanged(before)
            return
        seq = Seq(len(prompt) + max_tokens)
        seq.extend(prompt[:computed])
        self.seqs[seq_id] = seq
        if not self.try_step({seq_id: prompt[computed:]}):
            self.cache.free(seq_id)  # the paged cache already holds its adopted prefix
            del self.seqs[seq_id]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def append(self, data):
        seq_ids = data.draw(st.lists(st.sampled_from(sorted(self.seqs)), min_size=1, unique=True))
        lengths = data.draw(
            st.lists(st.integers(1, 3), min_size=len(seq_ids), max_size=len(seq_ids))
        )
        new_tokens = {
            s: [next(self.fresh_tokens) for _ in range(n)]
            for s, n in zip(seq_ids, lengths, strict=True)
        }
        self.try_step(new_tokens)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), then_append=st.booleans())
    def fork(self, data, then_append):
        parent = data.draw(st.sampled_from(sorted(self.seqs)))
        child = next(self.ids)
        before = self.snapshot()
        try:
            self.cache.fork(parent, child)
        except CacheFullError:
            self.assert_unchanged(before)
            return
        seq = Seq(self.seqs[parent].max_len)
        seq.prefix_hashes = list(self.seqs[parent].prefix_hashes)
        self.seqs[child] = seq
        if then_append:  # both write next to the tokens they share: copy-on-write
            self.try_step({s: [next(self.fresh_tokens)] for s in (parent, child)})

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)))
        self.cache.free(seq_id)
        del self.seqs[seq_id]

    # ---- checks ------------------------------------------------------------------------

    @invariant()
    def count_the_operation(self):
        OPERATIONS[type(self).__name__] += 1

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        seq_ids = [s for s, seq in self.seqs.items() if seq.prefix_hashes]
        if not seq_ids:
            return
        batch = ForwardBatch(
            seq_ids=seq_ids,
            query_start_loc=torch.zeros(len(seq_ids) + 1, dtype=torch.long),
            seq_lens=torch.tensor([len(self.seqs[s].prefix_hashes) for s in seq_ids]),
            positions=torch.zeros(0, dtype=torch.long),
        )
        for index, seq_id in enumerate(seq_ids):
            expected = self.seqs[seq_id].expected()
            for layer in range(NUM_LAYERS):
                key, value = self.cache.read(layer, self.cache.begin_step(batch), index)
                assert torch.equal(key, expected[:, layer, 0]), f"seq {seq_id} K, layer {layer}"
                assert torch.equal(value, expected[:, layer, 1]), f"seq {seq_id} V, layer {layer}"

    def try_step(self, new_tokens: dict[int, list[int]]) -> bool:
        """Allocate, write and check one step; a refused sequence leaves the step unchanged."""
        admitted = {}
        for seq_id, token_ids in new_tokens.items():
            if not token_ids:
                continue
            fits = self.would_fit(seq_id, len(token_ids))
            before = self.snapshot()
            try:
                self.cache.allocate_slots(seq_id, len(token_ids), token_ids=token_ids)
            except CacheFullError:
                assert not fits, f"seq {seq_id} was refused {len(token_ids)} tokens that fit"
                self.assert_unchanged(before)
                continue
            assert fits, f"seq {seq_id} was given {len(token_ids)} tokens that cannot fit"
            admitted[seq_id] = token_ids
        if not admitted:
            return not any(new_tokens.values())
        self.write_step(admitted)
        return True

    def write_step(self, new_tokens: dict[int, list[int]]) -> None:
        seq_ids = list(new_tokens)
        num_computed = [len(self.seqs[s].prefix_hashes) for s in seq_ids]
        batch = ForwardBatch.build(seq_ids, num_computed, [len(new_tokens[s]) for s in seq_ids])
        for seq_id, token_ids in new_tokens.items():
            self.seqs[seq_id].extend(token_ids)
        rows = torch.cat(
            [self.seqs[s].expected()[done:] for s, done in zip(seq_ids, num_computed, strict=True)]
        )  # (num_tokens, num_layers, 2, num_kv_heads, head_dim)
        self.cache.begin_step(batch)
        for layer in range(NUM_LAYERS):
            self.cache.write(
                layer, self.cache.begin_step(batch), rows[:, layer, 0], rows[:, layer, 1]
            )

    def assert_unchanged(self, before) -> None:
        after = self.snapshot()
        assert before[:-1] == after[:-1], "a refused request changed the bookkeeping"
        assert all(torch.equal(a, b) for a, b in zip(before[-1], after[-1], strict=True))


class PagedMachine(AllocatorMachine):
    @initialize(block_size=st.sampled_from([1, 2, 4]), enable_prefix_caching=st.booleans())
    def make(self, block_size, enable_prefix_caching):
        self.cache = PagedKVCache(
            NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, NUM_BLOCKS, block_size, device="cpu",
            enable_prefix_caching=enable_prefix_caching,
        )  # fmt: skip

    def would_fit(self, seq_id, num_new):
        return self.cache.manager.num_blocks_needed(seq_id, num_new) <= self.cache.num_free_blocks

    @precondition(lambda self: self.seqs)
    @rule(
        data=st.data(),
        num_steps=st.integers(1, 4),
        with_token_ids=st.sampled_from([True, True, True, False]),
    )
    def decode(self, data, num_steps, with_token_ids):
        """Decode steps through ``allocate_decode``, against ``allocate_slots`` one by one."""
        candidates = sorted(s for s, seq in self.seqs.items() if seq.prefix_hashes)
        if not candidates:
            return
        seq_ids = data.draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True))
        for _ in range(num_steps):
            if not self.decode_step(seq_ids, with_token_ids):
                return

    def decode_step(self, seq_ids: list[int], with_token_ids: bool) -> bool:
        """One ``allocate_decode`` call; True if every sequence got its slot."""
        token_ids = [next(self.fresh_tokens) for _ in seq_ids]
        oracle = copy.deepcopy(self.cache.manager)
        expected = 0
        for seq_id, token_id in zip(seq_ids, token_ids, strict=True):
            try:
                oracle.allocate_slots(seq_id, 1, [token_id] if with_token_ids else None)
            except CacheFullError:
                break
            expected += 1
        num_allocated = self.cache.allocate_decode(seq_ids, token_ids if with_token_ids else None)
        assert num_allocated == expected
        assert manager_state(self.cache.manager) == manager_state(oracle)
        if num_allocated:
            pairs = list(zip(seq_ids, token_ids, strict=True))[:num_allocated]
            self.write_step({seq_id: [token_id] for seq_id, token_id in pairs})
        return num_allocated == len(seq_ids)

    @invariant()
    def block_table_rows_match_the_manager(self):
        """``begin_step``'s gathered block table and slot mapping equal the slow path's."""
        if not hasattr(self, "cache"):
            return
        manager = self.cache.manager
        seq_ids = [s for s in manager.seq_ids() if manager.num_tokens(s)]
        if not seq_ids:
            return
        held = [manager.num_tokens(s) for s in seq_ids]
        # Every held token as a new one, so the slot mapping covers every position.
        batch = ForwardBatch.build(seq_ids, [0] * len(seq_ids), held)
        meta = self.cache.begin_step(batch)
        tables = [manager.block_table(s) for s in seq_ids]
        width = max(map(len, tables))
        assert meta.block_table.tolist() == [t + [0] * (width - len(t)) for t in tables]
        slots = [
            slot
            for s, n in zip(seq_ids, held, strict=True)
            for slot in manager.slot_mapping(s, 0, n)
        ]
        assert meta.slot_mapping.tolist() == slots
        assert meta.batch.seq_lens.tolist() == held

    def snapshot(self):
        manager = self.cache.manager
        pool = manager.pool
        tables = {s: (manager.block_table(s), manager.num_tokens(s)) for s in manager.seq_ids()}
        kv = [t.clone() for t in self.cache.kv_caches]
        return list(pool.ref_cnt), list(pool.block_hash), pool.free_block_ids(), tables, kv

    @invariant()
    def ref_cnt_counts_holders_and_nothing_leaks(self):
        if not hasattr(self, "cache"):
            return
        pool = self.cache.manager.pool
        holders = self.cache.manager.holders()
        for block_id in range(NUM_BLOCKS):
            assert pool.ref_cnt[block_id] == len(holders.get(block_id, []))
        free = pool.free_block_ids()
        assert len(free) == len(set(free)), "a block is in the free queue twice"
        assert set(free) == {b for b in range(NUM_BLOCKS) if pool.ref_cnt[b] == 0}
        # The usage counters, kept as operations happen, equal a walk over the blocks.
        usage = self.cache.manager.usage()
        filled = self.cache._filled_per_block()
        assert usage.num_reserved_slots == len(holders) * self.cache.block_size
        assert usage.num_used_slots == sum(filled.values())
        # Every cached block is a copy of its hash, and a lookup finds one of the copies.
        for block_id, block_hash in enumerate(pool.block_hash):
            if block_hash is not None:
                assert block_id in pool.cached_blocks(block_hash)
                assert pool.block_hash[pool.lookup(block_hash)] == block_hash
        assert pool.num_cached_blocks == sum(h is not None for h in pool.block_hash)
        # The free queue is the plain free blocks, then the cached ones (vLLM's two runs).
        cached = [pool.block_hash[b] is not None for b in free]
        assert cached == sorted(cached), f"a plain block sits behind a cached one: {free}"
        for seq_id in self.seqs:
            table = self.cache.block_table(seq_id)
            assert len(table) == -(-self.cache.num_tokens(seq_id) // self.cache.block_size)


def manager_state(manager: BlockManager):
    """Everything a block manager knows, comparable with ``==``."""
    pool = manager.pool
    seqs = {
        s: (
            manager.block_table(s),
            manager.num_tokens(s),
            manager._seqs[s].token_ids,
            manager._seqs[s].block_hashes,
        )
        for s in manager.seq_ids()
    }
    return list(pool.ref_cnt), list(pool.block_hash), pool.free_block_ids(), seqs


class ContiguousMachine(AllocatorMachine):
    @initialize(policy=st.sampled_from(RESERVATION_POLICIES))
    def make(self, policy):
        self.cache = ContiguousKVCache(
            NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, CONTIGUOUS_SLOTS, policy, MAX_MODEL_LEN,
            device="cpu",
        )  # fmt: skip

    def would_fit(self, seq_id, num_new):
        r = self.cache.arena.range_of(seq_id)
        return r.num_tokens + num_new <= r.num_slots

    def snapshot(self):
        arena = self.cache.arena
        ranges = {s: arena.range_of(s) for s in arena.seq_ids()}
        kv = [t.clone() for t in self.cache.kv_caches]
        return ranges, arena.holes(), arena.num_reserved_slots, arena.num_used_slots, kv

    @invariant()
    def ranges_are_disjoint_and_counted(self):
        if not hasattr(self, "cache"):
            return
        arena = self.cache.arena
        ranges = sorted((arena.range_of(s) for s in arena.seq_ids()), key=lambda r: r.start)
        for left, right in itertools.pairwise(ranges):
            assert left.start + left.num_slots <= right.start, "two ranges overlap"
        assert sum(r.num_slots for r in ranges) == arena.num_reserved_slots
        assert sum(r.num_tokens for r in ranges) == arena.num_used_slots
        usage = self.cache.manager.usage()
        assert (usage.num_reserved_slots, usage.num_used_slots) == (
            arena.num_reserved_slots,
            arena.num_used_slots,
        )
        assert sum(n for _, n in arena.holes()) == arena.num_free_slots
        assert all(r.num_tokens <= r.num_slots for r in ranges)
        assert all(0 <= r.start and r.start + r.num_slots <= CONTIGUOUS_SLOTS for r in ranges)


def _test_case(machine: type[AllocatorMachine]):
    """The machine's TestCase with two tests run in this order, in one class, so on one
    pytest-xdist worker: the random operations, then a check that there were enough (a
    module-level check could land on the other worker, where the machine never ran)."""
    case = machine.TestCase
    case.settings = SETTINGS
    case.test_1_random_operations = case.runTest  # unittest runs test* methods in name order

    def test_2_ran_enough_random_operations(self):
        """The CI profile drives at least 10,000 random operations through the allocator."""
        ran = OPERATIONS[machine.__name__]
        if not ran:
            pytest.skip(f"{machine.__name__} did not run in this session")
        assert ran >= MIN_OPERATIONS[PROFILE], (machine.__name__, ran)

    case.test_2_ran_enough_random_operations = test_2_ran_enough_random_operations
    return case


TestPagedProperties = _test_case(PagedMachine)
TestContiguousProperties = _test_case(ContiguousMachine)
