"""Build it (lab 03): a paged block manager of your own, checked, then run inside the engine.

The learner writes four methods of a block manager over ``num_blocks`` blocks of
``block_size`` slots (the stub, with its state, is in lab 03):

    allocate_slots(seq_id, n) -> copies   room for n more tokens: a new block only when
                                          the last one is full; a shared, partly filled
                                          last block is copied first (copy-on-write) and
                                          [(old, new)] returned; CacheFullError (and no
                                          change) when the free blocks are too few
    slot_mapping(seq_id, start, num)      the slot of each position: table[pos // size] *
                                          size + pos % size
    fork(parent, child)                   the child shares every block (ref_cnt += 1)
    free(seq_id)                          ref_cnt -= 1 on each block; at 0 it is free again

``check_block_manager(MyBlockManager)`` grades it criterion by criterion. Seeded random
sequences of those calls run on the learner's manager and on kvlab's ``BlockManager`` side
by side; the learner's state is checked against the invariants of paged memory after every
call, and the first failure is shrunk to the fewest calls that still show it, with the
misconception it most often means. When every criterion holds, SmolLM2 serves requests
(one of them with two samples, so ``fork`` and copy-on-write run for real) through a
``PagedKVCache`` whose every block the learner's manager hands out, and the tokens must
equal kvlab's own run.

    hint_block_manager(1), (2), (3)   help in steps, from a nudge to the algorithm
    reveal_block_manager()            kvlab's own methods

Not handled: prefix caching (lab 06), swapping, partial credit within a criterion.
"""

from __future__ import annotations

import inspect

from kvlab.cache.block_manager import BlockManager
from kvlab.exercises.block_manager_engine import LearnerBlockManager, check_generation
from kvlab.exercises.block_manager_grader import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    first_difference,
    random_ops,
    show_op,
    shrink,
    valid_ops,
)
from kvlab.exercises.grading import (
    Hint,
    Report,
    Verdict,
    check_calls,
    hint,
    show_ops,
    shrunk_failures,
    verdicts_until_failure,
)

__all__ = [
    "CRITERIA",
    "LearnerBlockManager",
    "check_block_manager",
    "check_generation",
    "check_written",
    "hint_block_manager",
    "reveal_block_manager",
]

CRITERIA = {
    "written": "allocate_slots, slot_mapping, fork and free run (none raises NotImplementedError)",
    "grows": "a sequence holds ceil(num_tokens / block_size) blocks: a new one only when full",
    "slot_mapping": "slot_mapping goes through the block table, position by position",
    "ref_cnt": "ref_cnt counts the tables holding each block; free_blocks are those at 0",
    "fork": "fork gives the child its parent's blocks, shared, taking none",
    "copy_on_write": "a shared block is never written: a partly filled one is copied first",
    "refuses": "allocate_slots raises CacheFullError exactly when too few blocks are free",
    "refusal_changes_nothing": "a refused allocate_slots leaves every table and count as it was",
    "generation": "real requests (one forked) through the engine give kvlab's tokens",
}
HINTS = (
    "A sequence's blocks are block_tables[seq_id]; it needs ceil(num_tokens / block_size) of "
    "them. Work out how many new blocks a call needs (and whether it must copy) before you "
    "take any: then a refusal changes nothing by construction.",
    "Sharing: fork copies the parent's list, adds 1 to the ref_cnt of each of its blocks, "
    "and gives the child the parent's token count (num_tokens). free takes 1 from each "
    "block's ref_cnt; at 0 the block goes back to free_blocks. A shared last block that is "
    "partly filled (num_tokens % block_size != 0, ref_cnt > 1) is copied before a write.",
    """The whole allocate_slots(seq_id, n), with size = block_size:
1. table = block_tables.get(seq_id, []); held = num_tokens.get(seq_id, 0).
2. copy = held % size != 0 and ref_cnt[table[-1]] > 1 (a shared, partly filled last block).
3. new = ceil((held + n) / size) - len(table).
4. If new + copy > len(free_blocks): raise CacheFullError, having changed nothing.
5. If copy: take a fresh block (ref_cnt 1), take 1 from ref_cnt[table[-1]], put the fresh
   block in its place, and remember (old, fresh) to return.
6. Take the new blocks from free_blocks (ref_cnt 1 each); store the table and held + n;
   return the copy's [(old, fresh)], or [].
7. slot_mapping: [table[p // size] * size + p % size for p in range(start, start + num)].""",
)
STUCK = (
    "Stuck? hint_block_manager(1), then 2 and 3; print(reveal_block_manager()) shows kvlab's own."
)


def _report(verdicts: list[Verdict]) -> Report:
    return Report(verdicts, CRITERIA, STUCK)


def check_block_manager(
    manager_class, model=None, num_sequences: int = 300, seed: int = 0, prompts=None
) -> Report:
    """Grade a learner's block manager (``manager_class(num_blocks, block_size)``).

    Args:
        manager_class: the class to grade.
        model: a loaded model for the last criterion (default: SmolLM2-135M).
        num_sequences: random call sequences tried (seeded: the same each time).
        seed: the seed of those sequences.
        prompts: token-id prompts for the generation (default: four chat prompts).
    """
    written = check_written(manager_class)
    if not written.passed:
        return _report([written])
    verdicts = [written]
    failures = shrunk_failures(
        manager_class,
        first_difference,
        shrink,
        lambda rng: valid_ops(random_ops(rng, rng.randint(2, 20))),
        show_ops(show_op),
        num_sequences,
        seed,
    )
    graded, failed = verdicts_until_failure(list(CRITERIA)[1:-1], failures)
    verdicts += graded
    if failed:
        return _report(verdicts)
    verdicts.append(check_generation(manager_class, model, prompts))
    return _report(verdicts)


def check_written(manager_class) -> Verdict:
    """The first criterion: every method runs on a fresh manager; a fork that leaves its
    child no token count is named if a later call fails on it."""
    calls = (
        ("allocate_slots", (0, 5)),
        ("slot_mapping", (0, 0, 5)),
        ("fork", (0, 1)),
        ("free", (1,)),
    )
    return check_calls(lambda: manager_class(NUM_BLOCKS, BLOCK_SIZE), calls, "manager", _fork_why)


def _fork_why(manager, name: str, args: tuple) -> str:
    """After a fork that left the child a block table but no token count, what it forgot."""
    if name == "fork" and _child_without_count(manager, args[1]):
        return (
            "fork gives the child its parent's token count too: "
            "num_tokens[child] = num_tokens[parent]"
        )
    return ""


def _child_without_count(manager, child: int) -> bool:
    """Whether a fork left the child a block table but no token count (a later call on the
    child then finds none)."""
    tables, num_tokens = getattr(manager, "block_tables", {}), getattr(manager, "num_tokens", {})
    return child in tables and child not in num_tokens


def hint_block_manager(level: int = 1) -> Hint:
    """Help in steps: 1 a nudge, 2 sharing (fork, free, when to copy), 3 the whole
    allocate_slots, numbered."""
    return hint(HINTS, level)


def reveal_block_manager() -> str:
    """kvlab's own methods (``kvlab.cache.block_manager``; prefix caching is lab 06's)."""
    return "\n".join(
        inspect.getsource(method)
        for method in (
            BlockManager._allocate,
            BlockManager._needs_copy,
            BlockManager._copy_last_block,
            BlockManager.slot_mapping,
            BlockManager.fork,
            BlockManager.free,
        )
    )
