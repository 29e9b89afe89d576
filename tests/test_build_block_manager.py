"""Lab 03's build-it exercise: the grader passes a right block manager, gives an untouched
stub nothing, and catches each planted defect with the criterion meant for it.

The managers below are what learners write: four methods over the state the lab's stub
sets up (``block_tables``, ``num_tokens``, ``ref_cnt``, ``free_blocks``). ``Right`` is
written from scratch (not kvlab's code), and takes free blocks from the end of the list
where kvlab takes the front, so the check is shown to accept an independent solution
that picks other blocks; each planted defect changes one thing in it.
"""

from __future__ import annotations

import pytest

from kvlab.cache.manager import CacheFullError
from kvlab.cache.paged import PagedKVCache
from kvlab.exercises.block_manager_engine import LearnerBlockManager
from kvlab.exercises.build_block_manager import (
    CRITERIA,
    check_block_manager,
    check_generation,
    hint_block_manager,
    reveal_block_manager,
)
from kvlab.exercises.grading import Verdict
from tests.solutions.lab03_block_manager import MyBlockManager

pytestmark = pytest.mark.usefixtures("one_thread")


class Stub:
    """The lab's starting point: the state, no method written."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self.free_blocks = list(range(num_blocks))
        self.block_tables = {}
        self.num_tokens = {}

    def allocate_slots(self, seq_id, num_new_tokens):
        raise NotImplementedError

    def slot_mapping(self, seq_id, start, num):
        raise NotImplementedError

    def fork(self, parent_seq_id, child_seq_id):
        raise NotImplementedError

    def free(self, seq_id):
        raise NotImplementedError


Right = MyBlockManager  # the solution, as a learner writes it


class BlockPerCall(Right):
    """A new block on every call, full last block or not."""

    def allocate_slots(self, seq_id, num_new_tokens):
        copies = super().allocate_slots(seq_id, num_new_tokens)
        if self.num_tokens[seq_id] % self.block_size and self.free_blocks:
            self.block_tables[seq_id].append(self._take())
        return copies


class OnlyNewTokensCounted(Right):
    """Blocks for the new tokens alone, as if the last block had no room left."""

    def allocate_slots(self, seq_id, num_new_tokens):
        table = self.block_tables.get(seq_id, [])
        new = -(-num_new_tokens // self.block_size)
        if new > len(self.free_blocks):
            raise CacheFullError("full")
        table.extend(self._take() for _ in range(new))
        self.block_tables[seq_id] = table
        self.num_tokens[seq_id] = self.num_tokens.get(seq_id, 0) + num_new_tokens
        return []


class SlotIsPosition(Right):
    def slot_mapping(self, seq_id, start, num):
        return list(range(start, start + num))


class FreeIgnoresRefCnt(Right):
    """Frees every block of the sequence, shared or not."""

    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self.ref_cnt[block] = 0
            if block not in self.free_blocks:
                self.free_blocks.append(block)
        del self.num_tokens[seq_id]


class MissedDecrement(Right):
    """Frees only the blocks it held alone: a shared block keeps its count, and leaks."""

    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            if self.ref_cnt[block] == 1:
                self._release(block)
        del self.num_tokens[seq_id]


class DoubleFree(Right):
    """A block goes back to the free list when its count drops to 1, not 0: once while its
    other holder still uses it, and a second time when that one frees it."""

    def _release(self, block):
        self.ref_cnt[block] -= 1
        if self.ref_cnt[block] <= 1:
            self.free_blocks.append(block)


class FreeForgetsOnlyTheTable(Right):
    """Frees the blocks but keeps the sequence's token count: harmless until its id comes
    back (kvlab's engine reuses a preempted request's id), then it grows from a stale count."""

    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self._release(block)


class ForkSharesTheList(Right):
    def fork(self, parent_seq_id, child_seq_id):
        super().fork(parent_seq_id, child_seq_id)
        self.block_tables[child_seq_id] = self.block_tables[parent_seq_id]


class ForkCopiesBlocks(Right):
    """Gives the child fresh blocks instead of sharing."""

    def fork(self, parent_seq_id, child_seq_id):
        parent = self.block_tables[parent_seq_id]
        self.block_tables[child_seq_id] = [self._take() for _ in parent]
        self.num_tokens[child_seq_id] = self.num_tokens[parent_seq_id]


class NoCopyOnWrite(Right):
    def _needs_copy(self, table, held):
        return False


class CopiesFullBlocks(Right):
    """Copies a shared last block even when it is full."""

    def _needs_copy(self, table, held):
        return bool(table) and self.ref_cnt[table[-1]] > 1


class RefusesWhenExactlyEnough(Right):
    """Off by one: refuses when the free blocks are exactly as many as it needs."""

    def allocate_slots(self, seq_id, num_new_tokens):
        table = self.block_tables.get(seq_id, [])
        held = self.num_tokens.get(seq_id, 0)
        new = -(-(held + num_new_tokens) // self.block_size) - len(table)
        if new + self._needs_copy(table, held) >= len(self.free_blocks) > 0:
            raise CacheFullError("full")
        return super().allocate_slots(seq_id, num_new_tokens)


class TakesThenChecks(Right):
    """Takes blocks one by one and raises when the list runs dry, keeping what it took."""

    def allocate_slots(self, seq_id, num_new_tokens):
        table = self.block_tables.setdefault(seq_id, [])
        held = self.num_tokens.get(seq_id, 0)
        new = -(-(held + num_new_tokens) // self.block_size) - len(table)
        copies = []
        if self._needs_copy(table, held):
            if not self.free_blocks:
                raise CacheFullError("full")
            fresh = self._take()
            self._release(table[-1])
            copies.append((table[-1], fresh))
            table[-1] = fresh
        for _ in range(new):
            if not self.free_blocks:
                raise CacheFullError("full")
            table.append(self._take())
        self.num_tokens[seq_id] = held + num_new_tokens
        return copies


class RaisesValueError(Right):
    def allocate_slots(self, seq_id, num_new_tokens):
        try:
            return super().allocate_slots(seq_id, num_new_tokens)
        except CacheFullError:
            raise ValueError("no room") from None


class ForkForgetsRefCnt(Right):
    """The child gets the parent's blocks and count, but their ref_cnt stays as it was."""

    def fork(self, parent_seq_id, child_seq_id):
        self.block_tables[child_seq_id] = list(self.block_tables[parent_seq_id])
        self.num_tokens[child_seq_id] = self.num_tokens[parent_seq_id]


class CopyKeepsTheSourceCount(Right):
    """Copy-on-write that moves the sequence to a fresh block but leaves the shared block's
    ref_cnt as it was."""

    def allocate_slots(self, seq_id, num_new_tokens):
        table = self.block_tables.get(seq_id, [])
        held = self.num_tokens.get(seq_id, 0)
        copy = self._needs_copy(table, held)
        new = -(-(held + num_new_tokens) // self.block_size) - len(table)
        if new + copy > len(self.free_blocks):
            raise CacheFullError("full")
        copies = []
        if copy:
            fresh = self._take()
            copies.append((table[-1], fresh))
            table[-1] = fresh
        table.extend(self._take() for _ in range(new))
        self.block_tables[seq_id] = table
        self.num_tokens[seq_id] = held + num_new_tokens
        return copies


class ForkForgetsTheCount(Right):
    """The child shares the blocks but gets no token count: the free after the fork in the
    first criterion's calls finds none."""

    def fork(self, parent_seq_id, child_seq_id):
        table = self.block_tables[parent_seq_id]
        for block in table:
            self.ref_cnt[block] += 1
        self.block_tables[child_seq_id] = list(table)


class ForkForgetsTheCountFreeCopes(ForkForgetsTheCount):
    """The same fork, with a free that does not mind a missing count: caught at the fork."""

    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self._release(block)
        self.num_tokens.pop(seq_id, None)


class ForkPopsTheCount(Right):
    """The child takes the count away from its parent (pop for get): nothing the check
    sees says why, so it names no misconception."""

    def fork(self, parent_seq_id, child_seq_id):
        table = self.block_tables[parent_seq_id]
        for block in table:
            self.ref_cnt[block] += 1
        self.block_tables[child_seq_id] = list(table)
        self.num_tokens[child_seq_id] = self.num_tokens.pop(parent_seq_id)


NEW_BLOCK_WHEN_FULL = "a sequence takes a new block only when its last one is full"
PLANTED = [
    (BlockPerCall, "grows", NEW_BLOCK_WHEN_FULL),
    (OnlyNewTokensCounted, "grows", NEW_BLOCK_WHEN_FULL),
    (
        FreeForgetsOnlyTheTable,
        "grows",
        "free must forget the whole sequence (its block table and its num_tokens): an id "
        "used again after free starts from nothing",
    ),
    (
        SlotIsPosition,
        "slot_mapping",
        "a position's slot goes through the block table: slot = block_table[pos // "
        "block_size] * block_size + pos % block_size",
    ),
    (
        FreeIgnoresRefCnt,
        "ref_cnt",
        "free must give back only blocks nobody else holds: subtract 1 from ref_cnt, and "
        "free the block at 0",
    ),
    (
        MissedDecrement,
        "ref_cnt",
        "free subtracts 1 from the ref_cnt of every block of the sequence, shared or not",
    ),
    (
        DoubleFree,
        "ref_cnt",
        "copy-on-write gave the shared block back while another sequence holds it: it goes "
        "back only at ref_cnt 0",
    ),
    (ForkForgetsRefCnt, "ref_cnt", "fork adds 1 to the ref_cnt of every block the child shares"),
    (
        CopyKeepsTheSourceCount,
        "ref_cnt",
        "copy-on-write moves the sequence off the shared block: subtract 1 from its ref_cnt",
    ),
    (
        ForkSharesTheList,
        "fork",
        "give the child a copy of the list: when one of them grows, the other must not",
    ),
    (ForkCopiesBlocks, "fork", "the child starts with every block of its parent, in order"),
    (ForkForgetsTheCountFreeCopes, "fork", "the child holds its parent's tokens (num_tokens too)"),
    (ForkPopsTheCount, "fork", ""),
    (
        NoCopyOnWrite,
        "copy_on_write",
        "before writing into a partly filled block that another sequence holds, take a fresh "
        "block, copy into it (return (old, new)) and put it in the table",
    ),
    (
        CopiesFullBlocks,
        "copy_on_write",
        "a full shared last block needs no copy: the new tokens go into new blocks",
    ),
    (
        RefusesWhenExactlyEnough,
        "refuses",
        "a call that needs as many blocks as are free (1) fits: >, not >=",
    ),
    (
        RaisesValueError,
        "refuses",
        "when too few blocks are free, raise CacheFullError (imported in cell 1)",
    ),
    (
        TakesThenChecks,
        "refusal_changes_nothing",
        "check that the blocks are there first, then take them",
    ),
]


def verdicts(report):
    return {v.criterion: v for v in report.verdicts}


def test_a_free_that_keeps_the_count_is_named_when_the_id_comes_back():
    report = check_block_manager(FreeForgetsOnlyTheTable, num_sequences=200)
    (failed,) = [v for v in report.verdicts if not v.passed]
    assert "free must forget the whole sequence" in failed.misconception
    assert "was freed before" in failed.detail or "raised" in failed.detail


def test_the_stub_scores_nothing():
    report = check_block_manager(Stub)
    assert report.score == 0
    assert "allocate_slots() is not written yet" in verdicts(report)["written"].detail


@pytest.mark.parametrize(
    ("planted", "criterion", "misconception"), PLANTED, ids=[p[0].__name__ for p in PLANTED]
)
def test_each_planted_defect_fails_its_criterion_and_names_its_misconception(
    planted, criterion, misconception
):
    report = check_block_manager(planted, num_sequences=200)
    failed = [v for v in report.verdicts if not v.passed]
    assert [v.criterion for v in failed] == [criterion], repr(report)
    assert failed[0].misconception == misconception, repr(report)
    assert "shortest case" in failed[0].detail
    assert not report.passed


def test_a_fork_without_the_childs_count_is_shown_after_the_calls_before_it():
    report = check_block_manager(ForkForgetsTheCount)
    (failed,) = [v for v in report.verdicts if not v.passed]
    assert failed.criterion == "written"
    assert failed.detail == (
        "free(1) raised KeyError: 1 (on a fresh manager, after allocate_slots(0, 5); "
        "slot_mapping(0, 0, 5); fork(0, 1))"
    )
    assert failed.misconception == (
        "fork gives the child its parent's token count too: num_tokens[child] = num_tokens[parent]"
    )


def test_a_right_manager_passes_every_property(monkeypatch):
    import kvlab.exercises.build_block_manager as build

    monkeypatch.setattr(build, "check_generation", lambda *a: Verdict("generation", True))
    report = check_block_manager(Right)
    assert report.passed, repr(report)
    assert report.score == len(CRITERIA)


def test_a_right_manager_serves_real_requests_through_preemptions(tiny):
    prompts = [list(range(3, 17)), list(range(20, 27)), list(range(30, 45)), [5, 6, 7]]
    verdict = check_generation(Right, tiny, prompts)
    assert verdict.passed, verdict
    preempted = int(verdict.detail.split(" preempted")[0].rsplit(" ", 1)[1])
    assert preempted >= 1, verdict.detail  # a freed seq_id came back


def test_a_free_that_keeps_the_count_breaks_a_resumed_request(tiny):
    prompts = [list(range(3, 17)), list(range(20, 27)), list(range(30, 45)), [5, 6, 7]]
    verdict = check_generation(FreeForgetsOnlyTheTable, tiny, prompts)
    assert not verdict.passed, verdict


def test_a_manager_that_writes_shared_blocks_corrupts_generation(tiny):
    prompts = [list(range(3, 17)), list(range(20, 27)), list(range(30, 45)), [5, 6, 7]]
    verdict = check_generation(NoCopyOnWrite, tiny, prompts)
    assert not verdict.passed and "differ from kvlab's" in verdict.detail


def test_the_cache_refuses_a_manager_of_another_shape():
    manager = LearnerBlockManager(Right, 8, 4)
    with pytest.raises(ValueError, match="manager has num_blocks=8, block_size=4"):
        PagedKVCache(1, 1, 4, num_blocks=16, block_size=4, device="cpu", manager=manager)


def test_help_comes_in_steps():
    assert "fork" not in hint_block_manager(1)
    assert "the parent's token count" in hint_block_manager(2)  # a forked child needs it
    steps = [line[:2] for line in hint_block_manager(3).splitlines() if line[:1].isdigit()]
    assert steps == ["1.", "2.", "3.", "4.", "5.", "6.", "7."]
    with pytest.raises(ValueError, match="level=4 is not allowed: use 1 to 3"):
        hint_block_manager(4)
    assert "def _copy_last_block" in reveal_block_manager()
