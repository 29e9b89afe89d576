"""The grading engine of lab 06's build-it prefix cache: the learner's block pool inside one
``BlockManager``, kvlab's ``BlockPool`` inside another, the same requests through both.

    first_difference(make, ops)   the first criterion a sequence of requests breaks, what
                                  happened, and the misconception it most often means
    random_ops(rng, n)            seeded requests whose prompts share prefixes (so blocks
                                  are hit, freed, kept cached and evicted)
    shrink(make, ops, criterion)  the fewest operations still breaking it
    PROBES                        fixed cases the random requests rarely reach (a refusal,
                                  a gap in the free queue, several plain blocks freed at once)

The pools must agree exactly (the policy is fixed, so the block ids are too): after every
operation the ``ref_cnt`` of every block, the free queue's order (plain blocks first, the
blocks of one free in their order; then cached blocks, least recently used first: vLLM
0.32.0's rule, ``kvlab.cache.block_pool``), which blocks carry which ``block_hash`` (a
hash may have several copies, in the order they were hashed; a hash with none left is
gone from ``cached``), and how many prompt tokens each new request finds cached.
``LearnerPool`` puts the learner's pool behind the interface the manager reads
(``kvlab.exercises.learner_pool``). Not handled: hash collisions, partial-block hits.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import BlockPool
from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import ROOT_HASH, hash_block_tokens
from kvlab.exercises.grading import shrink_loop
from kvlab.exercises.learner_pool import LearnerError, LearnerPool, call

NUM_BLOCKS = 10
BLOCK_SIZE = 2
PREFIXES = ((1, 2, 3, 4, 5, 1), (1, 2, 4, 3), (5, 5, 1, 2, 3))
Op = tuple  # ("add", seq_id, prompt), ("grow", seq_id, token) or ("free", seq_id)
EMPTY_HASH = (
    "allocate evicts: when it takes the last block of a hash, the hash leaves cached too "
    "(del cached[h]); an empty list left there makes match_prefix find a hash with no block"
)
_CRITERION_OF = {
    "allocate": "ref_cnt",
    "free": "ref_cnt",
    "take_cached": "ref_cnt",
    "cache": "cache",
    "match_prefix": "match_prefix",
}


def managers(make: Callable) -> tuple[BlockManager, BlockManager]:
    """(the learner's pool in a BlockManager, kvlab's), both with prefix caching on."""
    learner = LearnerPool(make(NUM_BLOCKS))
    return (
        BlockManager(NUM_BLOCKS, BLOCK_SIZE, True, pool=learner),
        BlockManager(NUM_BLOCKS, BLOCK_SIZE, True),
    )


def first_difference(make: Callable, ops: list[Op]) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first difference, or None."""
    mine, ref = managers(make)
    for index, op in enumerate(ops):
        where = f"operation {index + 1}, {show_op(op)}"
        why = _wrong_match(mine, ref, op) if op[0] == "add" else ""
        try:
            got = apply_op(mine, op)
        except LearnerError as error:
            if _empty_hashes(mine.pool.learner):
                return "cache", f"{where}: {error}", EMPTY_HASH
            return _CRITERION_OF[error.method], f"{where}: {error}", "a bug in the method it names"
        except Exception as error:  # noqa: BLE001 - kvlab's manager, fed the learner's answers
            criterion = "match_prefix" if op[0] == "add" else "ref_cnt"
            detail = f"{where}: the block manager failed on what your pool returned: {error}"
            return criterion, detail, why or "a method returned something the manager cannot use"
        expected = apply_op(ref, op)
        failure = _compare(mine, ref, got, expected, why, op, where)
        if failure is not None:
            return failure
    return None


def apply_op(manager: BlockManager, op: Op):
    """Run ``op``; for an "add", the prompt tokens found cached (None if it did not fit)."""
    if op[0] == "free":
        manager.free(op[1])
        return None
    if op[0] == "grow":
        try:
            manager.allocate_slots(op[1], 1, [op[2]])
        except CacheFullError:
            pass
        return None
    _, seq_id, prompt = op
    computed = manager.add_sequence(seq_id, list(prompt))
    try:
        manager.allocate_slots(seq_id, len(prompt) - computed, list(prompt[computed:]))
    except CacheFullError:
        manager.free(seq_id)
        return None
    return computed


def _compare(mine, ref, got, expected, why, op, where):
    pool, ref_pool = mine.pool.learner, ref.pool
    if got != expected:
        return "match_prefix", f"{where}: found {got} prompt tokens cached, kvlab {expected}", why
    if op[0] == "add" and got and mine.block_table(op[1]) != ref.block_table(op[1]):
        return (
            "match_prefix",
            f"{where}: adopted blocks {mine.block_table(op[1])[: got // BLOCK_SIZE]}, "
            f"kvlab {ref.block_table(op[1])[: got // BLOCK_SIZE]}",
            why,
        )
    if list(pool.free_queue) != ref_pool.free_block_ids():
        return (
            "lru",
            f"after {where}: free_queue is {list(pool.free_queue)}, expected "
            f"{ref_pool.free_block_ids()}",
            _wrong_queue(pool, ref_pool),
        )
    if list(pool.ref_cnt) != ref_pool.ref_cnt:
        b = next(i for i, n in enumerate(ref_pool.ref_cnt) if pool.ref_cnt[i] != n)
        return (
            "ref_cnt",
            f"after {where}: block {b} has ref_cnt {pool.ref_cnt[b]}, expected "
            f"{ref_pool.ref_cnt[b]}",
            "a prefix hit adds a holder (take_cached: ref_cnt "
            "+ 1), free takes one away, allocate sets 1",
        )
    empty = _empty_hashes(pool)
    if empty:
        detail = f"after {where}: cached[{empty[0]}] is an empty list, its last block reused"
        return "cache", detail, EMPTY_HASH
    mine_cached = {h: list(blocks) for h, blocks in pool.cached.items() if blocks}
    if mine_cached != _cached(ref_pool) or list(pool.block_hash) != ref_pool.block_hash:
        return (
            "cache",
            f"after {where}: cached blocks {_cached_ids(mine_cached)}, "
            f"expected {_cached_ids(_cached(ref_pool))}",
            _wrong_cache(mine_cached, pool, ref_pool),
        )
    return None


def _empty_hashes(pool) -> list[int]:
    """The hashes a learner's ``cached`` still lists with no block left."""
    return [h for h, blocks in pool.cached.items() if not blocks]


def _wrong_match(mine, ref, op) -> str:
    """What a learner's prefix match most likely got wrong, for the prompt of ``op``
    (asked before the operation runs; a match changes nothing)."""
    ids = list(op[2])
    try:
        blocks, _ = mine.pool.learner.match_prefix(BLOCK_SIZE, ids)
    except Exception:  # noqa: BLE001 - reported by the operation itself
        return ""
    expected, _ = ref.pool.match_prefix(BLOCK_SIZE, ids)
    if list(blocks) == expected:
        return ""
    if len(blocks) * BLOCK_SIZE >= len(ids):
        return (
            "stop one token short: the block holding the prompt's last token is always "
            "computed, because its logits pick the first output token"
        )
    hashes = ref.pool.block_hash
    if len(blocks) == len(expected) and [hashes[b] for b in blocks] == [
        hashes[b] for b in expected
    ]:
        return (
            "a hash with several cached copies: take the first one cached, cached[hash][0], "
            "the copy kvlab's lookup finds"
        )
    if len(blocks) <= len(expected):
        return (
            "chain the hashes: each block's hash is hash_block_tokens(the previous "
            "block's hash, its tokens), from ROOT_HASH, so it stands for the whole prefix: "
            "equal tokens after a different prefix are a different block"
        )
    return "stop at the first block the cache lacks: a prefix has no gaps"


def _wrong_queue(pool, ref_pool) -> str:
    mine, theirs = list(pool.free_queue), ref_pool.free_block_ids()
    if sorted(mine) == sorted(theirs):
        return (
            "allocate takes from the front of free_queue; free puts a block without a hash "
            "at the front (plain blocks are reused first, the blocks of one call in their "
            "order) and a cached block at the back (cached blocks are evicted least recently "
            "used first)"
        )
    if set(mine) > set(theirs):
        return "a prefix hit on a free block takes it out of free_queue (it is held again)"
    return "a block joins free_queue when its ref_cnt reaches 0, and only then"


def _cached(pool: BlockPool) -> dict[int, list[int]]:
    """``block_hash -> [block_id, ...]`` of kvlab's pool, each hash's copies in order."""
    hashes = {h for h in pool.block_hash if h is not None}
    return {h: pool.cached_blocks(h) for h in hashes}


def _cached_ids(cached: dict[int, list[int]]) -> list[int]:
    return sorted(block for blocks in cached.values() for block in blocks)


def _wrong_cache(mine_cached, pool, ref_pool) -> str:
    mine, theirs = set(_cached_ids(mine_cached)), set(_cached_ids(_cached(ref_pool)))
    if theirs - mine:
        for block in theirs - mine:
            h = ref_pool.block_hash[block]
            if len(ref_pool.cached_blocks(h)) > 1 and mine_cached.get(h):
                return (
                    "a block whose hash another block already has is hashed too, after it "
                    "in cached[hash]: each sequence keeps the blocks it computed, and a lookup "
                    "still finds a copy when the first is evicted"
                )
        return (
            "free keeps a block's hash: a free, cached block still serves hits until "
            "allocate hands it out again"
        )
    if mine - theirs:
        return (
            "allocate evicts: a cached block it hands out loses its hash (from cached and "
            "block_hash; a hash with no block left leaves cached)"
        )
    return (
        "block_hash[block] and cached[hash] must say the same thing, and cached[hash] lists "
        "a hash's blocks in the order they were hashed"
    )


def check_refusal(make: Callable) -> tuple[str, str, str] | None:
    """allocate asked for more blocks than are free raises CacheFullError, changing nothing."""
    pool = make(NUM_BLOCKS)
    before = copy.deepcopy((pool.ref_cnt, pool.block_hash, list(pool.free_queue), pool.cached))
    try:
        call("allocate", pool.allocate, NUM_BLOCKS + 1)
    except CacheFullError:
        after = (pool.ref_cnt, pool.block_hash, list(pool.free_queue), pool.cached)
        if after != before:
            return (
                "refuses",
                f"allocate({NUM_BLOCKS + 1}) raised CacheFullError after changing the pool",
                "check that enough blocks are free first, then take them",
            )
        return None
    except LearnerError as error:
        return (
            "refuses",
            str(error),
            "too few free blocks raises CacheFullError (imported in cell 1), no other error",
        )
    return (
        "refuses",
        f"allocate({NUM_BLOCKS + 1}) on a pool of {NUM_BLOCKS} returned",
        "raise CacheFullError when fewer than num blocks are free",
    )


def check_gap(make: Callable) -> tuple[str, str, str] | None:
    """A prompt whose first block was evicted while its second is still cached matches
    nothing: a prefix has no gaps (kvlab's eviction order makes this rare in the random
    requests, so it is checked directly)."""
    pool = make(4)
    tokens = [1, 2, 3, 4, 5]
    first = hash_block_tokens(ROOT_HASH, tokens[:2])
    second = hash_block_tokens(first, tokens[2:4])
    try:
        b0, b1 = call("allocate", pool.allocate, 2)
        call("cache", pool.cache, b0, first)
        call("cache", pool.cache, b1, second)
        call("free", pool.free, [b0])  # cached: behind the two never used
        call("allocate", pool.allocate, 3)  # the two never used, then b0: evicted
        blocks, _ = call("match_prefix", pool.match_prefix, 2, tokens)
    except (LearnerError, CacheFullError) as error:
        if _empty_hashes(pool):
            return "cache", f"evicting a prompt's first block: {error}", EMPTY_HASH
        return (
            "match_prefix",
            f"evicting a prompt's first block: {error}",
            "a bug in the method it names",
        )
    if list(blocks):
        return (
            "match_prefix",
            f"after the first block of {tokens[:4]} was evicted, match_prefix"
            f"(2, {tokens}) returned blocks {list(blocks)}",
            "stop at the first block the cache lacks: a prefix has no gaps",
        )
    return None


def check_plain_order(make: Callable) -> tuple[str, str, str] | None:
    """Plain blocks freed in one call go to the front of free_queue in the order freed (a
    sequence in the random requests has one plain block at most, its partly filled last
    one, so this is checked directly; with prefix caching off every block is plain)."""
    pool = make(4)
    try:
        blocks = list(call("allocate", pool.allocate, 3))
        call("free", pool.free, blocks)
    except (LearnerError, CacheFullError) as error:
        return "lru", f"freeing three plain blocks: {error}", "a bug in the method it names"
    expected = blocks + [b for b in range(4) if b not in blocks]
    if list(pool.free_queue) != expected:
        return (
            "lru",
            f"on a pool of 4, allocate(3) returned {blocks}; after free({blocks}) "
            f"free_queue is {list(pool.free_queue)}, expected {expected}",
            "plain blocks freed together go to the front in the order they were freed: "
            "the first freed is reused first",
        )
    return None


def show_op(op: Op) -> str:
    if op[0] == "add":
        return f"add seq {op[1]} with prompt {list(op[2])}"
    if op[0] == "grow":
        return f"seq {op[1]} appends token {op[2]}"
    return f"free seq {op[1]}"


# ---- random operations, and shrinking a failure -------------------------------------------


def random_ops(rng: random.Random, length: int) -> list[Op]:
    ops, live, next_id = [], [], 0
    for _ in range(length):
        roll = rng.random()
        if live and roll < 0.3:
            ops.append(("free", live.pop(rng.randrange(len(live)))))
        elif live and roll < 0.5:
            ops.append(("grow", rng.choice(live), rng.randint(1, 5)))
        else:
            prefix = rng.choice(PREFIXES)[: rng.randint(0, 6)]
            tail = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 3)))
            ops.append(("add", next_id, prefix + tail))
            live.append(next_id)
            next_id += 1
    return ops


def valid_ops(ops: list[Op]) -> list[Op]:
    """Drop operations on sequences that are not running (after shrinking removed them)."""
    ref, kept = BlockManager(NUM_BLOCKS, BLOCK_SIZE, True, pool=BlockPool(NUM_BLOCKS)), []
    for op in ops:
        if op[0] != "add" and op[1] not in ref:
            continue
        if op[0] == "add" and op[1] in ref:
            continue
        apply_op(ref, op)
        kept.append(op)
    return kept


def shrink(make: Callable, ops: list[Op], criterion: str) -> list[Op]:
    """The fewest operations (and shortest prompts) that still fail ``criterion``."""

    def still_fails(candidate: list[Op]) -> bool:
        failure = first_difference(make, candidate)
        return failure is not None and failure[0] == criterion

    def candidates(ops: list[Op]):
        yield from (valid_ops(ops[:i] + ops[i + 1 :]) for i in range(len(ops)))
        for i, op in enumerate(ops):
            if op[0] == "add" and len(op[2]) > 1:
                yield ops[:i] + [("add", op[1], op[2][:-1])] + ops[i + 1 :]

    return shrink_loop(ops, still_fails, candidates)


# Fixed cases the random requests rarely reach; the check and its replay both run them.
PROBES = (check_gap, check_plain_order, check_refusal)
