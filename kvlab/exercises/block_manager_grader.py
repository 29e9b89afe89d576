"""The grading engine of lab 03's build-it block manager: allocate_slots, fork and free on
the learner's manager and on kvlab's ``BlockManager`` side by side.

The two managers may pick different physical blocks (any free block will do), so they are
compared by what must agree (refusals, how many copies, and that the block a step writes
is held by nobody else), and the learner's state is checked against the invariants of
paged memory after every operation (``kvlab.exercises.block_manager_invariants``).

``first_difference``, ``random_ops``, ``candidates`` and ``show_op`` are the build-it's
``Search`` (``kvlab.exercises.build_block_manager``); ``new_manager``, ``run`` and ``view``
its ``Replay``. Not handled: prefix caching (lab 06), swapping.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable

from kvlab.cache.base import CacheUsage
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.manager import CacheFullError
from kvlab.exercises.block_manager_invariants import check_invariants
from kvlab.exercises.grading import block_infos, plural
from kvlab.exercises.learner_pool import LearnerError, call_learner

NUM_BLOCKS = 12
BLOCK_SIZE = 4
Op = tuple  # ("allocate_slots", seq_id, n), ("fork", parent, child) or ("free", seq_id)
# The criterion a learner's method stands for when it raises something unexpected.
_CRITERION_OF = {
    "allocate_slots": "grows",
    "slot_mapping": "slot_mapping",
    "free": "ref_cnt",
    "fork": "fork",
}
# What a failure of each kind most often means, named where the operation and the state
# it saw point to it.
MISCONCEPTIONS = {
    # A sequence id comes back after its free (kvlab's engine frees a preempted request and
    # allocates it again under the same id): a free that forgets part of the sequence shows
    # only then, as a wrong count or an error of the call that reuses the id.
    "free_forgets": "free must forget the whole sequence (its block table and its num_tokens): "
    "an id used again after free starts from nothing",
    "fork_blocks": "the child starts with every block of its parent, in order",
    "fork_list": "give the child a copy of the list: when one of them grows, the other must not",
    "fork_tokens": "the child holds its parent's tokens (num_tokens too)",
    "fork_takes": "a fork shares blocks; it takes none (that is the point of ref_cnt)",
    "raise_full": "when too few blocks are free, raise CacheFullError (imported in cell 1)",
    "count_first": "count every block the call needs (new ones, and a copy-on-write block) "
    "against len(free_blocks) before taking any",
    "count_new": "only the blocks the new tokens need count: ceil((num_tokens + new) / "
    "block_size) minus the blocks already held, plus one for a shared last block",
    "check_first": "check that the blocks are there first, then take them",
    "copy": "before writing into a partly filled block that another sequence holds, take a "
    "fresh block, copy into it (return (old, new)) and put it in the table",
    "copy_full": "a full shared last block needs no copy: the new tokens go into new blocks",
    "copy_shared": "copy only a last block that someone else holds (ref_cnt > 1)",
    "copy_replaces": "return (the shared block, its fresh copy), and the copy replaces the "
    "shared block in this sequence's table",
    "write_shared": "a shared block is never written in place: copy it first",
}


def first_difference(make: Callable, ops: list[Op]) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first difference, or None."""
    mine, ref = make(NUM_BLOCKS, BLOCK_SIZE), BlockManager(NUM_BLOCKS, BLOCK_SIZE, False)
    freed: set[int] = set()
    for index, op in enumerate(ops):
        where = f"operation {index + 1}, {show_op(op)}"
        started = op[2] if op[0] == "fork" else op[1]  # a fork's child, or the one allocated
        reused = op[0] != "free" and started in freed
        try:
            failure = _one_op(mine, ref, op, where) or check_invariants(mine, ref, op, where)
        except LearnerError as error:  # a bug in the method it names: the message shows it
            why = MISCONCEPTIONS["free_forgets"] if reused else ""
            return _CRITERION_OF[error.method], f"{where}: {error}", why
        if failure is not None:
            if reused and failure[0] == "grows":
                detail = f"{failure[1]} (seq {started} was freed before)"
                return failure[0], detail, MISCONCEPTIONS["free_forgets"]
            return failure
        if op[0] == "free":
            freed.add(op[1])
    return None


def _state(mine) -> tuple:
    return copy.deepcopy((mine.block_tables, mine.num_tokens, mine.ref_cnt, mine.free_blocks))


def _one_op(mine, ref, op: Op, where: str):
    """Run ``op`` on both managers; the difference it shows, or None."""
    if op[0] == "free":
        ref.free(op[1])
        call_learner("free", mine.free, op[1])
        return None
    if op[0] == "fork":
        _, parent, child = op
        ref.fork(parent, child)
        free_before = len(mine.free_blocks)
        call_learner("fork", mine.fork, parent, child)
        tables, counts = mine.block_tables, mine.num_tokens
        if child not in tables or tables[child] != tables.get(parent):
            mine_and_parent = f"{tables.get(child)}, its parent's {tables.get(parent)}"
            detail = f"{where}: the child's block table is {mine_and_parent}"
            return "fork", detail, MISCONCEPTIONS["fork_blocks"]
        if tables[child] is tables[parent]:
            detail = f"{where}: the child's block table is the parent's list itself"
            return "fork", detail, MISCONCEPTIONS["fork_list"]
        if counts.get(child) != counts.get(parent):
            detail = (
                f"{where}: num_tokens is {counts.get(child, 'missing')} for the child, "
                f"{counts.get(parent, 'missing')} for its parent"
            )
            return "fork", detail, MISCONCEPTIONS["fork_tokens"] if child not in counts else ""
        if len(mine.free_blocks) != free_before:
            detail = f"{where}: {free_before - len(mine.free_blocks)} blocks taken"
            return "fork", detail, MISCONCEPTIONS["fork_takes"]
        return None
    return _allocate(mine, ref, op, where)


def _allocate(mine, ref, op: Op, where: str):
    _, seq_id, num_new = op
    before = _state(mine)
    old_table = list(mine.block_tables.get(seq_id, []))
    num_old = mine.num_tokens.get(seq_id, 0)
    free_before = ref.num_free_blocks
    expected = call_learner("allocate_slots", ref.allocate_slots, seq_id, num_new)
    try:
        got = call_learner("allocate_slots", mine.allocate_slots, seq_id, num_new)
    except LearnerError as error:
        if not isinstance(expected, CacheFullError):
            raise
        detail = f"{where}: {error}, where too few blocks are free ({ref.num_free_blocks})"
        return "refuses", detail, MISCONCEPTIONS["raise_full"]
    if isinstance(expected, CacheFullError) != isinstance(got, CacheFullError):
        if isinstance(expected, CacheFullError):
            detail = f"{where}: succeeded, but only {ref.num_free_blocks} blocks are free"
            return "refuses", detail, MISCONCEPTIONS["count_first"]
        why = MISCONCEPTIONS["count_new"]
        needed = free_before - ref.num_free_blocks
        if needed == free_before:
            why = f"a call that needs as many blocks as are free ({needed}) fits: >, not >="
        return "refuses", f"{where}: raised CacheFullError, but there was room", why
    if isinstance(got, CacheFullError):
        if _state(mine) != before:
            detail = (
                f"{where}: raised CacheFullError after changing "
                "the block tables, num_tokens, ref_cnt or free_blocks"
            )
            return "refusal_changes_nothing", detail, MISCONCEPTIONS["check_first"]
        return None
    return _check_copies(mine, op, num_old, old_table, got, len(expected), where)


def _check_copies(mine, op: Op, num_old, old_table, got, num_expected, where):
    _, seq_id, num_new = op
    copies = [tuple(pair) for pair in (got or [])]
    if len(copies) != num_expected:
        if num_expected:
            why = MISCONCEPTIONS["copy"]
        elif num_old % BLOCK_SIZE == 0:
            why = MISCONCEPTIONS["copy_full"]
        else:
            why = MISCONCEPTIONS["copy_shared"]
        return "copy_on_write", f"{where}: returned {copies}, expected {num_expected} copy", why
    table = mine.block_tables.get(seq_id, [])
    if copies:
        (src, dst), last = copies[0], (num_old - 1) // BLOCK_SIZE
        if src != old_table[last] or len(table) <= last or table[last] != dst:
            now = table[last] if len(table) > last else None
            detail = (
                f"{where}: returned {copies}; block {last} of the table "
                f"was {old_table[last]} and is now {now}"
            )
            return "copy_on_write", detail, MISCONCEPTIONS["copy_replaces"]
    positions = range(num_old, num_old + num_new)
    written = {table[pos // BLOCK_SIZE] for pos in positions if pos // BLOCK_SIZE < len(table)}
    shared = sorted(b for b in written if mine.ref_cnt[b] > 1)
    if shared:
        holders = mine.ref_cnt[shared[0]]
        detail = (
            f"{where}: the new tokens go into block {shared[0]}, which {holders} sequences hold"
        )
        return "copy_on_write", detail, MISCONCEPTIONS["write_shared"]
    return None


def show_op(op: Op) -> str:
    if op[0] == "allocate_slots":
        return f"allocate_slots(seq {op[1]}, {plural(op[2], 'token')})"
    if op[0] == "fork":
        return f"fork(seq {op[1]} -> seq {op[2]})"
    return f"free(seq {op[1]})"


# ---- random operations, and shrinking a failure -------------------------------------------


def random_ops(rng: random.Random) -> list[Op]:
    """2 to 20 operations on live sequences; a new sequence (or a fork's child) takes a freed
    id again half of the time, as the engine does with a preempted request."""
    ops, live, freed, next_id = [], [], [], 0

    def new_id() -> int:
        nonlocal next_id
        if freed and rng.random() < 0.5:
            return freed.pop(rng.randrange(len(freed)))
        next_id += 1
        return next_id - 1

    for _ in range(rng.randint(2, 20)):
        roll = rng.random()
        if live and roll < 0.15:
            child = new_id()
            ops.append(("fork", rng.choice(live), child))
            live.append(child)
        elif live and roll < 0.35:
            freed.append(live.pop(rng.randrange(len(live))))
            ops.append(("free", freed[-1]))
        elif live and roll < 0.8:
            ops.append(("allocate_slots", rng.choice(live), rng.choice([1, 1, 1, 2, 3, 5])))
        else:
            seq_id = new_id()
            ops.append(("allocate_slots", seq_id, rng.choice([1, 2, 3, 4, 5, 7, 9, 17])))
            live.append(seq_id)
    return valid_ops(ops)


def valid_ops(ops: list[Op]) -> list[Op]:
    """Drop operations on sequences that hold nothing (after shrinking removed their start)."""
    ref, kept = BlockManager(NUM_BLOCKS, BLOCK_SIZE, False), []
    for op in ops:
        if op[0] == "free":
            if op[1] not in ref:
                continue
            ref.free(op[1])
        elif op[0] == "fork":
            if op[1] not in ref or op[2] in ref:
                continue
            ref.fork(op[1], op[2])
        else:
            with contextlib.suppress(CacheFullError):  # a refused one is kept too
                ref.allocate_slots(op[1], op[2])
        kept.append(op)
    return kept


def candidates(ops: list[Op]):
    """Smaller cases: drop one operation or make an allocation smaller."""
    yield from (valid_ops(ops[:i] + ops[i + 1 :]) for i in range(len(ops)))
    for i, op in enumerate(ops):
        if op[0] == "allocate_slots":
            yield from (
                ops[:i] + [("allocate_slots", op[1], n)] + ops[i + 1 :] for n in range(1, op[2])
            )


# ---- a case replayed on the learner's manager (``kvlab.widgets.failure_replay``) -----------


def new_manager(manager_class):
    return manager_class(NUM_BLOCKS, BLOCK_SIZE)


def run(manager, op: Op) -> None:
    getattr(manager, op[0])(*op[1:])


def view(manager):
    """The learner's block tables as the page map draws a pool: who holds each block, how
    full. A block is drawn with as many holders as tables hold it; where the learner's
    ``ref_cnt`` says otherwise, the grader's verdict above the map names the block."""
    holders: dict[int, list[tuple[int, int]]] = {}
    for seq_id, table in manager.block_tables.items():
        for index, block in enumerate(table):
            holders.setdefault(block, []).append((seq_id, index))
    filled = {}
    for block, held_by in holders.items():
        seq_id, index = held_by[0]
        tokens = manager.num_tokens.get(seq_id, 0) - index * BLOCK_SIZE
        filled[block] = max(0, min(BLOCK_SIZE, tokens))
    usage = CacheUsage(NUM_BLOCKS * BLOCK_SIZE, len(holders) * BLOCK_SIZE, sum(filled.values()))
    return block_infos(holders, filled, NUM_BLOCKS), usage, BLOCK_SIZE
