"""The invariants of paged memory, checked on lab 03's build-it block manager after every
operation (``block_manager_grader`` runs them), whichever free blocks it took:

    grows         it holds the sequences kvlab's manager holds, each with kvlab's token
                  count, in ``ceil(num_tokens / block_size)`` blocks
    slot_mapping  a position's slot goes through the block table:
                  ``block_table[pos // block_size] * block_size + pos % block_size``
    ref_cnt       a block's ``ref_cnt`` is the number of tables holding it, and the free
                  list is exactly the blocks with ``ref_cnt == 0``, each once

Not handled: what the operations themselves must return (copies, refusals: the grader
compares those with kvlab's), prefix caching (lab 06's grader).
"""

from __future__ import annotations

from collections import Counter

from kvlab.exercises.grading import plural
from kvlab.exercises.learner_pool import call_learner


def check_invariants(mine, ref, op: tuple, where: str) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first invariant the learner's
    manager ``mine`` breaks after ``op`` (``where``, in words), or None; ``ref`` is kvlab's
    after the same operations. The misconception is named from ``op`` (every invariant held
    before it), or left empty when nothing points at one."""
    if set(mine.block_tables) != set(ref.seq_ids()):
        seqs = f"sequences {sorted(mine.block_tables)}, expected {sorted(ref.seq_ids())}"
        return "grows", f"after {where}: {seqs}", _wrong_sequences(mine, op)
    for seq_id, table in mine.block_tables.items():
        failure = _check_table(mine, ref, op, seq_id, table, where)
        if failure:
            return failure
    held = Counter(b for table in mine.block_tables.values() for b in table)
    wrong = [b for b in range(ref.num_blocks) if mine.ref_cnt[b] != held[b]]
    if wrong:
        b = wrong[0]
        tables = plural(held[b], "block table")
        detail = f"block {b} has ref_cnt {mine.ref_cnt[b]}, but it is in {tables}"
        return "ref_cnt", f"after {where}: {detail}", _wrong_ref_cnt(mine, op, b, held[b])
    free = list(mine.free_blocks)
    unheld = sorted(b for b in range(ref.num_blocks) if held[b] == 0)
    if sorted(free) != unheld:
        detail = f"after {where}: free_blocks is {sorted(free)}, expected {unheld}"
        return "ref_cnt", detail, _wrong_free_blocks(mine, op, free, held)
    return None


def _check_table(mine, ref, op: tuple, seq_id: int, table: list, where: str):
    """One sequence's token count, block count and slot mapping."""
    size, grown = ref.block_size, op[0] == "allocate_slots" and op[1] == seq_id
    num_tokens = mine.num_tokens.get(seq_id)
    if num_tokens != ref.num_tokens(seq_id):
        count = f"num_tokens[{seq_id}] is {num_tokens}, expected {ref.num_tokens(seq_id)}"
        why = "num_tokens grows by num_new_tokens" if grown else ""
        return "grows", f"after {where}: {count}", why
    need = -(-num_tokens // size)
    if len(table) != need:
        why = ""
        if grown and len(table) > need:
            why = "a sequence takes a new block only when its last one is full"
        elif grown:
            why = "count the blocks for all its tokens, old and new: ceil(num_tokens / size)"
        detail = (
            f"after {where}: seq {seq_id} holds {plural(num_tokens, 'token')} in "
            f"{len(table)} blocks {table}, expected {need}"
        )
        return "grows", detail, why
    return _check_slot_mapping(mine, seq_id, table, num_tokens, size, where)


# ---- the misconception, from the operation that broke an invariant -------------------------


def _wrong_sequences(mine, op: tuple) -> str:
    """The learner holds other sequences than kvlab's after ``op``."""
    if op[0] == "free" and op[1] in mine.block_tables:
        return "free forgets the sequence: drop its block table"
    if op[0] == "allocate_slots" and op[1] not in mine.block_tables:
        return "allocate_slots on an unknown seq_id starts it: store its block table"
    return ""


def _wrong_ref_cnt(mine, op: tuple, block: int, num_tables: int) -> str:
    """``ref_cnt[block]`` is not the number of tables holding it after ``op``."""
    too_low = mine.ref_cnt[block] < num_tables
    if op[0] == "fork":
        return "fork adds 1 to the ref_cnt of every block the child shares" if too_low else ""
    if op[0] == "free":
        if too_low:
            return (
                "free must give back only blocks nobody else holds: subtract 1 from ref_cnt, "
                "and free the block at 0"
            )
        return "free subtracts 1 from the ref_cnt of every block of the sequence, shared or not"
    in_table = block in mine.block_tables.get(op[1], ())
    if not in_table and not too_low:  # the growing sequence let go of it: a copy-on-write
        return "copy-on-write moves the sequence off the shared block: subtract 1 from its ref_cnt"
    return "a block taken from free_blocks starts at ref_cnt 1" if in_table and too_low else ""


def _wrong_free_blocks(mine, op: tuple, free: list, held: Counter) -> str:
    """``free_blocks`` is not exactly the blocks no table holds, after ``op``."""
    if len(set(free)) < len(free):
        return "a block went back to free_blocks twice"
    still_held = [b for b in free if held[b]]
    if op[0] == "free":
        if still_held:
            return "freed a block another sequence still holds: it goes back only at ref_cnt 0"
        return "a block whose ref_cnt drops to 0 goes back to free_blocks"
    if op[0] != "allocate_slots" or not still_held:
        return ""
    if still_held[0] in mine.block_tables.get(op[1], ()):
        return "a block the sequence takes leaves free_blocks"
    return (
        "copy-on-write gave the shared block back while another sequence holds it: it goes "
        "back only at ref_cnt 0"
    )


def _check_slot_mapping(mine, seq_id, table, num_tokens, size, where):
    expected = [table[pos // size] * size + pos % size for pos in range(num_tokens)]
    got = call_learner("slot_mapping", mine.slot_mapping, seq_id, 0, num_tokens)
    got = None if got is None else list(got)
    if got != expected:
        why = "slot = block_table[pos // block_size] * block_size + pos % block_size"
        if got == list(range(num_tokens)):
            why = "a position's slot goes through the block table: " + why
        detail = (
            f"after {where}: slot_mapping(seq {seq_id}, 0, {num_tokens}) "
            f"= {got}, expected {expected} (block table {table})"
        )
        return "slot_mapping", detail, why
    if num_tokens > 1:
        tail = call_learner("slot_mapping", mine.slot_mapping, seq_id, 1, num_tokens - 1)
        if tail is None or list(tail) != expected[1:]:
            call = f"slot_mapping(seq {seq_id}, 1, {num_tokens - 1})"
            detail = f"after {where}: {call} = {tail}, expected {expected[1:]}"
            return "slot_mapping", detail, "start is the first position, num how many follow"
    return None
