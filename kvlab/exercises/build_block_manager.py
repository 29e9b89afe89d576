"""Build it (lab 03): a paged block manager of your own, checked, then run inside the engine.

The learner writes four methods of a block manager over ``num_blocks`` blocks of
``block_size`` slots (the stub, with its state, is in lab 03): ``allocate_slots`` (a new block
only when the last is full, copy-on-write of a shared one, CacheFullError and no change when
too few are free), ``slot_mapping``, ``fork`` and ``free``; ``CRITERIA`` says what each must
do, hints 2 and 3 how.

``check_block_manager(MyBlockManager)`` grades it (``grading.BuildIt``): seeded random
sequences of those calls on the learner's manager and on kvlab's ``BlockManager`` side by
side (``block_manager_grader``); then SmolLM2 serves requests (one with two samples, so
``fork`` and copy-on-write run for real) with the learner's manager handing out every
block (``block_manager_engine``), and the tokens must equal kvlab's own run.

    hint_block_manager(1), (2), (3)   help in steps, from a nudge to the algorithm
    reveal_block_manager()            kvlab's own methods

Not handled: prefix caching (lab 06), swapping, partial credit within a criterion.
"""

from __future__ import annotations

from kvlab.cache.block_manager import BlockManager
from kvlab.exercises import block_manager_grader as grader
from kvlab.exercises.block_manager_engine import check_generation
from kvlab.exercises.grading import BuildIt, Replay, Report, Search, Verdict, check_calls

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
WRITTEN_CALLS = (
    ("allocate_slots", (0, 5)),
    ("slot_mapping", (0, 0, 5)),
    ("fork", (0, 1)),
    ("free", (1,)),
)


def check_written(manager_class) -> Verdict:
    """The first criterion: every method runs on a fresh manager; a fork that leaves its
    child no token count is named if a later call fails on it."""
    return check_calls(
        lambda: grader.new_manager(manager_class), WRITTEN_CALLS, "manager", _fork_why
    )


def _fork_why(manager, name: str, args: tuple) -> str:
    """After a fork that left the child a block table but no token count, what it forgot."""
    tables, num_tokens = getattr(manager, "block_tables", {}), getattr(manager, "num_tokens", {})
    if name == "fork" and args[1] in tables and args[1] not in num_tokens:
        return (
            "fork gives the child its parent's token count too: "
            "num_tokens[child] = num_tokens[parent]"
        )
    return ""


BLOCK_MANAGER = BuildIt(
    CRITERIA,
    HINTS,
    stuck="Stuck? hint_block_manager(1), then 2 and 3; print(reveal_block_manager()) shows "
    "kvlab's own.",
    written=check_written,
    search=Search(grader.first_difference, grader.candidates, grader.random_ops, grader.show_op),
    reveal_sources=lambda: (
        BlockManager._allocate,
        BlockManager._needs_copy,
        BlockManager._copy_last_block,
        BlockManager.slot_mapping,
        BlockManager.fork,
        BlockManager.free,
    ),
    replay=Replay(
        "allocate_slots", "your block manager", grader.new_manager, grader.run, grader.view
    ),
)
hint_block_manager, reveal_block_manager = BLOCK_MANAGER.hint, BLOCK_MANAGER.reveal


def check_block_manager(
    manager_class, model=None, num_sequences: int = 300, seed: int = 0, prompts=None
) -> Report:
    """``BLOCK_MANAGER.check`` of ``manager_class(num_blocks, block_size)`` on
    ``num_sequences`` seeded random sequences of calls; the last criterion serves
    ``prompts`` (default: the chat questions) on ``model`` (default: SmolLM2-135M)."""
    return BLOCK_MANAGER.check(
        manager_class, lambda: check_generation(manager_class, model, prompts), num_sequences, seed
    )
