"""The grading engine of lab 06's build-it prefix cache: the learner's block pool inside one
``BlockManager`` (through ``LearnerPool``), kvlab's ``BlockPool`` inside another, the same
requests through both.

``first_difference``, ``random_ops``, ``candidates``, ``show_op`` and ``PROBES`` (fixed cases
the random requests rarely reach) are the build-it's ``Search``
(``kvlab.exercises.build_prefix_cache``); ``managers``, ``apply_op`` and ``view`` its ``Replay``.

The policy is fixed (vLLM 0.32.0's, ``kvlab.cache.block_pool``), so the pools must agree
exactly, block ids too. A misconception is named only when the learner's answer is the one
a known mistake gives: a prefix match is compared with kvlab's walk done wrong in each known
way and tried at other block sizes; a free queue, ``ref_cnt`` or ``cached`` that differs
is read against what the operation freed, adopted and took.

Not handled: hash collisions, partial-block hits.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.cache.base import CacheUsage
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import BlockPool
from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import ROOT_HASH, hash_block_tokens
from kvlab.exercises.learner_pool import LearnerError, LearnerPool, call

NUM_BLOCKS = 10
BLOCK_SIZE = 2
PREFIXES = ((1, 2, 3, 4, 5, 1), (1, 2, 4, 3), (5, 5, 1, 2, 3))
PROBE_SIZES = (2, 4, 8, 16, 32)  # block sizes a match is tried at (lab 06's BLOCK_SIZE is 16)
Op = tuple  # ("add", seq_id, prompt), ("grow", seq_id, token) or ("free", seq_id)
MISCONCEPTIONS = {
    "empty_hash": "allocate evicts: when it takes the last block of a hash, the hash leaves "
    "cached too (del cached[h]); an empty list left there makes match_prefix find a hash "
    "with no block",
    "evicts": "allocate evicts: a cached block it hands out loses its hash (from cached and "
    "block_hash; a hash with no block left leaves cached)",
    "exact_fit": "refuse only when fewer than num blocks are free (num > len(free_queue)): "
    "exactly num free blocks are enough",
    "copies_in_order": "cache appends a new copy at the end of cached[hash]: a hash's blocks "
    "stay in the order they were hashed, and match_prefix takes cached[hash][0], the oldest",
    "last_token": "stop one token short: the block holding the prompt's last token is always "
    "computed, because its logits pick the first output token",
    "chained": "chain the hashes: each block's hash is hash_block_tokens(the previous block's "
    "hash, its tokens), from ROOT_HASH, so it stands for the whole prefix: equal tokens after "
    "a different prefix are a different block",
    "gap": "stop at the first block the cache lacks: a prefix has no gaps",
    "first_copy": "a hash with several cached copies: take the first one cached, "
    "cached[hash][0], the copy kvlab's lookup finds",
    "hit_dequeues": "a prefix hit on a free block takes it out of free_queue (it is held again)",
    "allocate_dequeues": "allocate takes the blocks it hands out from the front of free_queue",
    "free_at_zero": "free takes one holder away (ref_cnt - 1); a block goes back to free_queue "
    "when its ref_cnt reaches 0, not while another sequence still holds it",
    "plain_front": "free puts a block without a hash at the front of free_queue, so it is "
    "reused first (the blocks of one call in their order); only a hashed block goes to the "
    "back",
    "hashed_back": "free puts a block with a hash at the back of free_queue: cached blocks are "
    "evicted least recently used first, after every plain block",
    "plain_order": "plain blocks freed together go to the front in the order they were "
    "freed: the first freed is reused first",
    "hit_adds": "a prefix hit adds a holder: take_cached does ref_cnt + 1, also on a block "
    "another sequence holds",
    "hit_adds_once": "a prefix hit adds one holder: take_cached does ref_cnt + 1 once, and "
    "match_prefix changes nothing",
    "allocate_holds": "allocate sets ref_cnt 1 on each block it hands out",
    "free_drops": "free takes one holder from each block it is given: ref_cnt - 1",
    "copies_hashed": "a block whose hash another block already has is hashed too, after it in "
    "cached[hash]: each sequence keeps the blocks it computed, and a lookup still finds a "
    "copy when the first is evicted",
    "free_keeps_hash": "free keeps a block's hash: a free, cached block still serves hits "
    "until allocate hands it out again",
    "both_maps": "cache sets block_hash[block_id] as well as cached[block_hash]",
    "rehash": "cache leaves a block that already has a hash as it is (check "
    "block_hash[block_id] first): listed twice, it stays in cached[hash] after allocate "
    "evicts it",
    "check_first": "check that enough blocks are free first, then take them",
    "raise_full": "too few free blocks raises CacheFullError (imported in cell 1), no other error",
    "refuse": "raise CacheFullError when fewer than num blocks are free",
}
# The misconception each mistaken walk (as _walk's arguments) shows, tried in order
MATCH_MISTAKES = {
    "chained": {"chained": False},
    "gap": {"past_a_miss": True},
    "first_copy": {"copy_at": -1},
}


def managers(make: Callable) -> tuple[BlockManager, BlockManager]:
    """(the learner's pool in a BlockManager, kvlab's), both with prefix caching on."""
    learner = LearnerPool(make(NUM_BLOCKS))
    return (
        BlockManager(NUM_BLOCKS, BLOCK_SIZE, True, pool=learner),
        BlockManager(NUM_BLOCKS, BLOCK_SIZE, True),
    )


@dataclass(frozen=True)
class Step:
    """One operation as kvlab's manager ran it: what a failure after it is read against."""

    op: Op
    where: str  # "operation 3, free seq 1"
    freed: list[int]  # the blocks a free gave back (its sequence's table)
    adopted: list[int]  # the cached blocks an add found
    taken: list[int]  # the blocks allocate handed out


def first_difference(make: Callable, ops: list[Op]) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first difference, or None. The
    misconception is read from the operation that failed and the state it saw; it is ""
    when no known mistake explains what the learner's pool did."""
    mine, ref = managers(make)
    for index, op in enumerate(ops):
        where = f"operation {index + 1}, {show_op(op)}"
        why = _wrong_match(make, mine, ref, op[2]) if op[0] == "add" else ""
        before = ref.block_table(op[1]) if op[1] in ref else []
        try:
            got = apply_op(mine, op)
        except LearnerError as error:
            return _raised(error, mine.pool.learner, where)
        except Exception as error:  # noqa: BLE001 - kvlab's manager, fed the learner's answers
            criterion = "match_prefix" if op[0] == "add" else "ref_cnt"
            detail = f"{where}: the block manager failed on what your pool returned: {error}"
            return criterion, detail, why
        if mine.pool.refused is not None:
            num, num_free = mine.pool.refused
            detail = f"{where}: allocate({num}) raised CacheFullError with {num_free} blocks free"
            return "refuses", detail, MISCONCEPTIONS["exact_fit"]
        expected = apply_op(ref, op)
        if op[0] == "add" and expected is None:
            where += " (it did not fit: the blocks it took were freed again)"
        after = ref.block_table(op[1]) if op[1] in ref else []
        adopted = after[: expected // BLOCK_SIZE] if op[0] == "add" and expected else []
        freed = before if op[0] == "free" else []
        taken = [b for b in after if b not in before and b not in adopted]
        step = Step(op, where, freed, adopted, taken)
        failure = _compare(mine, ref, got, expected, why, step)
        if failure is not None:
            return failure
    return None


def _raised(error: LearnerError, pool, where: str) -> tuple[str, str, str]:
    """The verdict on a learner's method that raised: the criterion of the method, unless
    an eviction left an empty list in ``cached`` (later calls trip over it)."""
    if _empty_hashes(pool):
        return "cache", f"{where}: {error}", MISCONCEPTIONS["empty_hash"]
    # cache and match_prefix have criteria of their own; allocate, free, take_cached: ref_cnt
    criterion = error.method if error.method in ("cache", "match_prefix") else "ref_cnt"
    return criterion, f"{where}: {error}", ""


def apply_op(manager: BlockManager, op: Op):
    """Run ``op``; for an "add", the prompt tokens found cached (None if it did not fit)."""
    if op[0] == "free":
        manager.free(op[1])
        return None
    if op[0] == "grow":
        with contextlib.suppress(CacheFullError):
            manager.allocate_slots(op[1], 1, [op[2]])
        return None
    _, seq_id, prompt = op
    computed = manager.add_sequence(seq_id, list(prompt))
    try:
        manager.allocate_slots(seq_id, len(prompt) - computed, list(prompt[computed:]))
    except CacheFullError:
        manager.free(seq_id)
        return None
    return computed


def _compare(mine, ref, got, expected, why, step: Step):
    """The first criterion on which the two managers disagree after ``step``, or None."""
    if got != expected:
        detail = f"{step.where}: found {got} prompt tokens cached, kvlab {expected}"
        return "match_prefix", detail, why
    if step.adopted and mine.block_table(step.op[1])[: len(step.adopted)] != step.adopted:
        found = mine.block_table(step.op[1])[: len(step.adopted)]
        return "match_prefix", f"{step.where}: adopted blocks {found}, kvlab {step.adopted}", why
    pool, ref_pool = mine.pool.learner, ref.pool
    return (
        _queue_failure(pool, ref_pool, step)
        or _ref_cnt_failure(pool, ref_pool, step)
        or _cache_failure(pool, ref_pool, step)
    )


# ---- what a learner's match got wrong -----------------------------------------------------


def _wrong_match(make: Callable, mine, ref, prompt) -> str:
    """The known mistake that gives the learner's match for ``prompt``, asked before the
    operation runs, on a copy of the learner's pool; "" if the match is right or no known
    mistake gives it."""
    ids = list(prompt)
    try:
        blocks, _ = copy.deepcopy(mine.pool.learner).match_prefix(BLOCK_SIZE, ids)
        blocks = list(blocks)
    except Exception:  # noqa: BLE001 - reported by the operation itself
        return ""
    if blocks == _walk(ref.pool, BLOCK_SIZE, ids):
        return ""
    if len(blocks) * BLOCK_SIZE >= len(ids):
        return MISCONCEPTIONS["last_token"]
    for key, mistake in MATCH_MISTAKES.items():
        if blocks == _walk(ref.pool, BLOCK_SIZE, ids, **mistake):
            return MISCONCEPTIONS[key]
    sizes = _sizes_it_matches(make)
    if sizes and BLOCK_SIZE not in sizes:
        return (
            "use the block_size argument, not a global such as the notebook's BLOCK_SIZE: "
            f"your match_prefix finds a prefix cached in blocks of {_or(sizes)} tokens, none "
            f"in blocks of {BLOCK_SIZE}, the block_size the check passes"
        )
    return ""


def _walk(pool: BlockPool, block_size: int, ids, chained=True, past_a_miss=False, copy_at=0):
    """The blocks a prefix walk over kvlab's ``pool`` finds: the right walk, or one with a
    known mistake (hashes not chained, going on past a miss, another copy of a hash)."""
    blocks, parent = [], ROOT_HASH
    for start in range(0, len(ids) - block_size, block_size):
        parent = hash_block_tokens(
            parent if chained else ROOT_HASH, ids[start : start + block_size]
        )
        copies = pool.cached_blocks(parent)
        if copies:
            blocks.append(copies[copy_at])
        elif not past_a_miss:
            break
    return blocks


def _sizes_it_matches(make: Callable) -> list[int]:
    """The block sizes at which the learner's ``match_prefix(size, tokens)`` finds a
    two-block prefix cached at that size, each on a fresh pool. Right, it finds them all; a
    match that walks a size of its own finds only that one."""
    sizes = []
    for size in PROBE_SIZES:
        tokens = list(range(1, 2 * size + 2))
        pool = make(NUM_BLOCKS)
        try:
            blocks = list(call("allocate", pool.allocate, 2))
            parent = ROOT_HASH
            for index, block in enumerate(blocks):
                parent = hash_block_tokens(parent, tokens[index * size : (index + 1) * size])
                call("cache", pool.cache, block, parent)
            found, _ = call("match_prefix", pool.match_prefix, size, tokens)
        except (LearnerError, CacheFullError):
            continue
        if list(found) == blocks:
            sizes.append(size)
    return sizes


def _or(values: list[int]) -> str:
    return ", ".join(map(str, values[:-1])) + " or " * (len(values) > 1) + str(values[-1])


# ---- what a learner's free queue, ref_cnt and cache got wrong -----------------------------


def _queue_failure(pool, ref_pool: BlockPool, step: Step):
    mine, theirs = list(pool.free_queue), ref_pool.free_block_ids()
    if mine == theirs:
        return None
    detail = f"after {step.where}: free_queue is {mine}, expected {theirs}"
    extra, missing = set(mine) - set(theirs), set(theirs) - set(mine)
    why = ""
    if extra & set(step.adopted):
        why = MISCONCEPTIONS["hit_dequeues"]
    elif extra & set(step.taken):
        why = MISCONCEPTIONS["allocate_dequeues"]
    elif any(pool.ref_cnt[b] == 0 < ref_pool.ref_cnt[b] for b in extra):
        why = MISCONCEPTIONS["free_at_zero"]
    elif not extra and not missing:  # the same blocks in another order: where a freed one went
        moved = [b for b in step.freed if b in theirs and mine.index(b) != theirs.index(b)]
        if moved:
            plain = ref_pool.block_hash[moved[0]] is None
            why = MISCONCEPTIONS["plain_front" if plain else "hashed_back"]
    return "lru", detail, why


def _ref_cnt_failure(pool, ref_pool: BlockPool, step: Step):
    if list(pool.ref_cnt) == ref_pool.ref_cnt:
        return None
    b = next(i for i, n in enumerate(ref_pool.ref_cnt) if pool.ref_cnt[i] != n)
    mine, theirs = pool.ref_cnt[b], ref_pool.ref_cnt[b]
    detail = f"after {step.where}: block {b} has ref_cnt {mine}, expected {theirs}"
    if b in step.adopted:
        why = MISCONCEPTIONS["hit_adds" if mine < theirs else "hit_adds_once"]
    elif b in step.taken:
        why = MISCONCEPTIONS["allocate_holds"]
    elif b in step.freed:
        why = MISCONCEPTIONS["free_drops"]
    else:
        why = ""
    return "ref_cnt", detail, why


def _cache_failure(pool, ref_pool: BlockPool, step: Step):
    empty = _empty_hashes(pool)
    if empty:
        detail = f"after {step.where}: cached[{empty[0]}] is an empty list, its last block reused"
        return "cache", detail, MISCONCEPTIONS["empty_hash"]
    mine = {h: list(blocks) for h, blocks in pool.cached.items() if blocks}
    theirs = _cached(ref_pool)
    if mine == theirs and list(pool.block_hash) == ref_pool.block_hash:
        return None
    mine_ids, their_ids = _cached_ids(mine), _cached_ids(theirs)
    if mine_ids != their_ids:
        detail = f"after {step.where}: blocks listed in cached {mine_ids}, expected {their_ids}"
        return "cache", detail, _wrong_cached_blocks(mine, ref_pool, step)
    for h, blocks in theirs.items():
        if mine.get(h) != blocks and sorted(mine.get(h, ())) == sorted(blocks):
            detail = (
                f"after {step.where}: blocks {blocks} carry one hash; cached lists them "
                f"{mine[h]}, expected {blocks}"
            )
            return "cache", detail, MISCONCEPTIONS["copies_in_order"]
    b = next((i for i, h in enumerate(ref_pool.block_hash) if pool.block_hash[i] != h), None)
    if b is None:
        return "cache", f"after {step.where}: cached lists a block under another hash", ""
    if pool.block_hash[b] is None:
        detail = f"after {step.where}: block_hash[{b}] is None, expected its hash (cached lists it)"
        return "cache", detail, MISCONCEPTIONS["both_maps"]
    detail = (
        f"after {step.where}: block_hash[{b}] is {pool.block_hash[b]}, "
        f"expected {ref_pool.block_hash[b]}"
    )
    why = MISCONCEPTIONS["evicts"] if b in step.taken and ref_pool.block_hash[b] is None else ""
    return "cache", detail, why


def _wrong_cached_blocks(mine: dict[int, list[int]], ref_pool: BlockPool, step: Step) -> str:
    """What a learner's cached got wrong, when it lists other blocks than kvlab's."""
    mine_ids, their_ids = set(_cached_ids(mine)), set(_cached_ids(_cached(ref_pool)))
    for block in their_ids - mine_ids:
        h = ref_pool.block_hash[block]
        if len(ref_pool.cached_blocks(h)) > 1 and mine.get(h):
            return MISCONCEPTIONS["copies_hashed"]
    if (their_ids - mine_ids) & set(step.freed):
        return MISCONCEPTIONS["free_keeps_hash"]
    if (mine_ids - their_ids) & set(step.taken):
        return MISCONCEPTIONS["evicts"]
    return ""


def _empty_hashes(pool) -> list[int]:
    """The hashes a learner's ``cached`` still lists with no block left."""
    return [h for h, blocks in pool.cached.items() if not blocks]


def _cached(pool: BlockPool) -> dict[int, list[int]]:
    """``block_hash -> [block_id, ...]`` of kvlab's pool, each hash's copies in order."""
    hashes = {h for h in pool.block_hash if h is not None}
    return {h: pool.cached_blocks(h) for h in hashes}


def _cached_ids(cached: dict[int, list[int]]) -> list[int]:
    return sorted(block for blocks in cached.values() for block in blocks)


def check_refusal(make: Callable) -> tuple[str, str, str] | None:
    """allocate hands out exactly as many blocks as are free, and asked for more raises
    CacheFullError, changing nothing."""
    try:
        call("allocate", make(NUM_BLOCKS).allocate, NUM_BLOCKS)
    except CacheFullError:
        detail = f"allocate({NUM_BLOCKS}) on a fresh pool of {NUM_BLOCKS} raised CacheFullError"
        return "refuses", detail, MISCONCEPTIONS["exact_fit"]
    except LearnerError as error:
        return "refuses", f"allocate({NUM_BLOCKS}) on a fresh pool of {NUM_BLOCKS}: {error}", ""
    pool = make(NUM_BLOCKS)
    before = copy.deepcopy((pool.ref_cnt, pool.block_hash, list(pool.free_queue), pool.cached))
    try:
        call("allocate", pool.allocate, NUM_BLOCKS + 1)
    except CacheFullError:
        if (pool.ref_cnt, pool.block_hash, list(pool.free_queue), pool.cached) != before:
            detail = f"allocate({NUM_BLOCKS + 1}) raised CacheFullError after changing the pool"
            return "refuses", detail, MISCONCEPTIONS["check_first"]
        return None
    except LearnerError as error:
        return "refuses", str(error), MISCONCEPTIONS["raise_full"]
    detail = f"allocate({NUM_BLOCKS + 1}) on a pool of {NUM_BLOCKS} returned"
    return "refuses", detail, MISCONCEPTIONS["refuse"]


def check_rehash(make: Callable) -> tuple[str, str, str] | None:
    """cache on a block that already has a hash leaves the pool as it is (kvlab's block
    manager hashes each block once, so the random requests never ask)."""
    pool = make(4)
    h = hash_block_tokens(ROOT_HASH, [1, 2])
    try:
        block = list(call("allocate", pool.allocate, 1))[0]
        call("cache", pool.cache, block, h)
        once = copy.deepcopy((list(pool.block_hash), pool.cached))
        call("cache", pool.cache, block, h)
    except (LearnerError, CacheFullError) as error:
        return "cache", f"caching block 0 twice under one hash: {error}", ""
    if (list(pool.block_hash), pool.cached) == once:
        return None
    detail = (
        f"on a pool of 4, allocate(1) returned [{block}]; cache({block}, h) made cached[h] "
        f"{once[1].get(h)}, and a second cache({block}, h) made it {pool.cached.get(h)}"
    )
    return "cache", detail, MISCONCEPTIONS["rehash"]


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
    except CacheFullError as error:
        detail = (
            f"evicting a prompt's first block, allocate refused though enough were free: {error}"
        )
        return "refuses", detail, MISCONCEPTIONS["exact_fit"]
    except LearnerError as error:
        return _raised(error, pool, "evicting a prompt's first block")
    if list(blocks):
        detail = (
            f"after the first block of {tokens[:4]} was evicted, match_prefix"
            f"(2, {tokens}) returned blocks {list(blocks)}"
        )
        return "match_prefix", detail, MISCONCEPTIONS["gap"]
    return None


def check_plain_order(make: Callable) -> tuple[str, str, str] | None:
    """Plain blocks freed in one call go to the front of free_queue in the order freed (a
    sequence in the random requests has one plain block at most, its partly filled last
    one, so this is checked directly; with prefix caching off every block is plain)."""
    pool = make(4)
    try:
        blocks = list(call("allocate", pool.allocate, 3))
        call("free", pool.free, blocks)
    except CacheFullError as error:
        return "refuses", f"allocate(3) on a pool of 4 free blocks raised {error!r}", ""
    except LearnerError as error:  # no block has a hash: the method's own criterion
        return _raised(error, pool, "freeing three plain blocks")
    expected = blocks + [b for b in range(4) if b not in blocks]
    if list(pool.free_queue) != expected:
        detail = (
            f"on a pool of 4, allocate(3) returned {blocks}; after free({blocks}) "
            f"free_queue is {list(pool.free_queue)}, expected {expected}"
        )
        return "lru", detail, MISCONCEPTIONS["plain_order"]
    return None


def show_op(op: Op) -> str:
    if op[0] == "add":
        return f"add seq {op[1]} with prompt {list(op[2])}"
    if op[0] == "grow":
        return f"seq {op[1]} appends token {op[2]}"
    return f"free seq {op[1]}"


# ---- random operations, and shrinking a failure -------------------------------------------


def random_ops(rng: random.Random) -> list[Op]:
    """2 to 16 requests added, grown and freed; the prompts share prefixes."""
    ops, live, next_id = [], [], 0
    for _ in range(rng.randint(2, 16)):
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
    return valid_ops(ops)


def valid_ops(ops: list[Op]) -> list[Op]:
    """Drop operations on sequences that are not running (after shrinking removed them)."""
    ref, kept = BlockManager(NUM_BLOCKS, BLOCK_SIZE, True, pool=BlockPool(NUM_BLOCKS)), []
    for op in ops:
        if (op[0] == "add") == (op[1] in ref):  # an add starts a sequence, the rest need one
            continue
        apply_op(ref, op)
        kept.append(op)
    return kept


def candidates(ops: list[Op]):
    """Smaller cases: drop one operation or a prompt's last token."""
    yield from (valid_ops(ops[:i] + ops[i + 1 :]) for i in range(len(ops)))
    for i, op in enumerate(ops):
        if op[0] == "add" and len(op[2]) > 1:
            yield ops[:i] + [("add", op[1], op[2][:-1])] + ops[i + 1 :]


def view(manager):
    """The learner's pool (in the manager ``managers`` builds) as a paged cache draws it:
    holders, fill, cached blocks, from the learner's ``ref_cnt`` and ``block_hash``."""
    from kvlab.engine.model_free import bookkeeping_cache

    cache = bookkeeping_cache(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, manager=manager)
    slots = manager.usage()  # in slots: the cache holds no tensors, its bytes are 0
    usage = CacheUsage(slots.num_slots, slots.num_reserved_slots, slots.num_used_slots)
    return tuple(cache.block_infos()), usage, BLOCK_SIZE


# Fixed cases the random requests rarely reach; the check and its replay both run them.
PROBES = (check_gap, check_plain_order, check_rehash, check_refusal)
