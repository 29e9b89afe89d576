"""The invariants of paged memory, checked on lab 03's build-it block manager after every
operation (``kvlab.exercises.block_manager_grader`` runs the operations).

The learner's manager may pick other physical blocks than kvlab's (any free block will
do), so its state is checked against what must hold whichever blocks it took:

    grows         it holds the sequences kvlab's manager holds, each with kvlab's token
                  count, in ``ceil(num_tokens / block_size)`` blocks
    slot_mapping  a position's slot goes through the block table:
                  ``block_table[pos // block_size] * block_size + pos % block_size``
    ref_cnt       a block's ``ref_cnt`` is the number of tables holding it, and the free
                  list is exactly the blocks with ``ref_cnt == 0``, each once

``call_learner`` runs one of the learner's methods, for these checks and the grader's: a
``CacheFullError`` is returned as an answer, any other error raised as a ``LearnerError``.

Not handled: what the operations themselves must return (copies, refusals: the grader
compares those with kvlab's), prefix caching (lab 06's grader).
"""

from __future__ import annotations

from collections import Counter

from kvlab.cache.manager import CacheFullError
from kvlab.exercises.learner_pool import LearnerError


def call_learner(name: str, method, *args):
    """``method(*args)``, or the ``CacheFullError`` it raised: a refusal is an answer to
    compare. Any other error is a ``LearnerError``, a verdict on the method ``name``."""
    try:
        return method(*args)
    except CacheFullError as error:
        return error
    except Exception as error:  # noqa: BLE001 - any error of the learner's code is a verdict
        raise LearnerError(name, f"{name}() raised {type(error).__name__}: {error}") from error


def check_invariants(mine, ref, where: str) -> tuple[str, str, str] | None:
    """The learner's state after an operation, against paged memory's invariants.

    Args:
        mine: the learner's manager.
        ref: kvlab's ``BlockManager``, after the same operations.
        where: the operation, for the message.

    Returns:
        (criterion, what happened, misconception) of the first invariant broken, or None.
    """
    size = ref.block_size
    if set(mine.block_tables) != set(ref.seq_ids()):
        return (
            "grows",
            f"after {where}: sequences {sorted(mine.block_tables)}, expected "
            f"{sorted(ref.seq_ids())}",
            "allocate_slots on an unknown seq_id starts it; free forgets it",
        )
    for seq_id, table in mine.block_tables.items():
        num_tokens = mine.num_tokens.get(seq_id)
        if num_tokens != ref.num_tokens(seq_id):
            return (
                "grows",
                f"after {where}: seq {seq_id} holds {num_tokens} tokens, expected "
                f"{ref.num_tokens(seq_id)}",
                "num_tokens grows by num_new_tokens",
            )
        need = -(-num_tokens // size)
        if len(table) != need:
            why = (
                "a sequence takes a new block only when its last one is full"
                if len(table) > need
                else "count the blocks for all its tokens, old and new: ceil(num_tokens / size)"
            )
            return (
                "grows",
                f"after {where}: seq {seq_id} holds {num_tokens} tokens in "
                f"{len(table)} blocks {table}, expected {need}",
                why,
            )
        failure = _check_slot_mapping(mine, seq_id, table, num_tokens, size, where)
        if failure:
            return failure
    held = Counter(b for table in mine.block_tables.values() for b in table)
    wrong = [b for b in range(ref.num_blocks) if mine.ref_cnt[b] != held[b]]
    if wrong:
        b = wrong[0]
        why = (
            "free must give back only blocks nobody else holds: subtract 1 from ref_cnt, "
            "and free the block at 0"
            if mine.ref_cnt[b] < held[b]
            else "each table that holds a block adds 1 to its ref_cnt (fork too); free subtracts 1"
        )
        return (
            "ref_cnt",
            f"after {where}: block {b} has ref_cnt {mine.ref_cnt[b]}, but it is in "
            f"{plural(held[b], 'block table')}",
            why,
        )
    free = list(mine.free_blocks)
    unheld = sorted(b for b in range(ref.num_blocks) if held[b] == 0)
    if sorted(free) != unheld:
        if len(set(free)) < len(free):
            why = "a block went back to free_blocks twice"
        elif set(free) & set(held):
            why = "freed a block another sequence still holds"
        else:
            why = "free_blocks must hold exactly the blocks with ref_cnt 0"
        return "ref_cnt", f"after {where}: free_blocks is {sorted(free)}, expected {unheld}", why
    return None


def _check_slot_mapping(mine, seq_id, table, num_tokens, size, where):
    expected = [table[pos // size] * size + pos % size for pos in range(num_tokens)]
    got = call_learner("slot_mapping", mine.slot_mapping, seq_id, 0, num_tokens)
    got = None if got is None else list(got)
    if got != expected:
        why = "slot = block_table[pos // block_size] * block_size + pos % block_size"
        if got == list(range(num_tokens)):
            why = "a position's slot goes through the block table: " + why
        return (
            "slot_mapping",
            f"after {where}: slot_mapping(seq {seq_id}, 0, {num_tokens}) "
            f"= {got}, expected {expected} (block table {table})",
            why,
        )
    if num_tokens > 1:
        tail = call_learner("slot_mapping", mine.slot_mapping, seq_id, 1, num_tokens - 1)
        if tail is None or list(tail) != expected[1:]:
            return (
                "slot_mapping",
                f"after {where}: slot_mapping(seq {seq_id}, 1, "
                f"{num_tokens - 1}) = {tail}, expected {expected[1:]}",
                "start is the first position, num how many follow",
            )
    return None


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
