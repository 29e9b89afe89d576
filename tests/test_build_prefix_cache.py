"""Lab 06's build-it exercise: the grader passes a right block pool, gives an untouched stub
nothing, and catches each planted defect with the criterion meant for it.

``Right`` is written from scratch (not kvlab's code) over the state the lab's stub sets up
(``ref_cnt``, ``block_hash``, ``free_queue``, ``cached``); each planted defect changes one
thing in it. Two are kvlab's rules before it followed vLLM 0.32.0's: one free queue for
plain and cached blocks alike (``OneQueueForAll``), one cached block per hash
(``OneBlockPerHash``); both must now fail.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import ROOT_HASH, hash_block_tokens
from kvlab.exercises import prefix_cache_grader
from kvlab.exercises.build_prefix_cache import (
    CRITERIA,
    check_generation,
    check_prefix_cache,
    hint_prefix_cache,
    reveal_prefix_cache,
)
from kvlab.exercises.grading import Verdict
from kvlab.exercises.learner_pool import LearnerPool
from tests.solutions.lab06_prefix_cache import MyBlockPool

pytestmark = pytest.mark.usefixtures("one_thread")


class Stub:
    def __init__(self, num_blocks):
        self.ref_cnt = [0] * num_blocks
        self.block_hash = [None] * num_blocks
        self.free_queue = OrderedDict.fromkeys(range(num_blocks))
        self.cached = {}

    def allocate(self, num):
        raise NotImplementedError

    def free(self, block_ids):
        raise NotImplementedError

    def cache(self, block_id, block_hash):
        raise NotImplementedError

    def take_cached(self, block_id):
        raise NotImplementedError

    def match_prefix(self, block_size, token_ids):
        raise NotImplementedError


Right = MyBlockPool  # the solution, as a learner writes it
NOTEBOOK_BLOCK_SIZE = 16  # lab 06's BLOCK_SIZE, a global a learner may reach for


class FreeToTheFront(Right):
    """Every freed block, cached ones too, is handed out next (the last freed first)."""

    def free(self, block_ids):
        super().free(block_ids)
        for block in block_ids:
            if self.ref_cnt[block] == 0:
                self.free_queue.move_to_end(block, last=False)


class OneQueueForAll(Right):
    """Every freed block joins the back, plain or cached (kvlab's rule before vLLM's): a
    cached block can be evicted while a plain one is free."""

    def free(self, block_ids):
        for block in block_ids:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.free_queue[block] = None


class PlainBlocksReversed(Right):
    """Puts each plain block at the front as it is freed, so one call's blocks end up in
    reverse order."""

    def free(self, block_ids):
        for block in block_ids:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.free_queue[block] = None
                if self.block_hash[block] is None:
                    self.free_queue.move_to_end(block, last=False)


class HitStaysInQueue(Right):
    def take_cached(self, block_id):
        self.ref_cnt[block_id] += 1


class HitAddsNoHolder(Right):
    def take_cached(self, block_id):
        if self.ref_cnt[block_id] == 0:
            del self.free_queue[block_id]
            self.ref_cnt[block_id] = 1
        # a block already held by another sequence gets no extra holder


class FreeForgetsTheHash(Right):
    def free(self, block_ids):
        super().free(block_ids)
        for block in block_ids:
            if self.ref_cnt[block] == 0:
                self._forget(block)


class ReuseKeepsTheHash(Right):
    def _forget(self, block):
        pass


class EvictionLeavesAnEmptyList(Right):
    """Takes an evicted block out of cached[hash] but leaves the hash's empty list behind,
    so a later match_prefix finds the hash and raises IndexError on cached[hash][0]."""

    def _forget(self, block):
        block_hash = self.block_hash[block]
        if block_hash is not None:
            self.cached[block_hash].remove(block)
            self.block_hash[block] = None


class OneBlockPerHash(Right):
    """Leaves a block uncached when another block already serves its hash (kvlab's rule
    before vLLM's)."""

    def cache(self, block_id, block_hash):
        if block_hash not in self.cached:
            super().cache(block_id, block_hash)


class LastCopyFirst(Right):
    """Finds the copy cached last, not the first."""

    def match_prefix(self, block_size, token_ids):
        blocks, hashes = super().match_prefix(block_size, token_ids)
        return [self.cached[h][-1] for h in hashes], hashes


class MatchesTheLastToken(Right):
    def match_prefix(self, block_size, token_ids):
        return super().match_prefix(block_size, list(token_ids) + [0])


class UnchainedHashes(Right):
    """Hashes each block by its own tokens, not chained to the prefix before it."""

    def match_prefix(self, block_size, token_ids):
        blocks, hashes = [], []
        for index in range((len(token_ids) - 1) // block_size):
            h = hash_block_tokens(
                ROOT_HASH, token_ids[index * block_size : (index + 1) * block_size]
            )
            if h not in self.cached:
                break
            blocks.append(self.cached[h][0])
            hashes.append(h)
        return blocks, hashes


class NoHits(Right):
    def match_prefix(self, block_size, token_ids):
        return [], []


class SkipsAMiss(Right):
    """Goes on past the first block the cache lacks."""

    def match_prefix(self, block_size, token_ids):
        blocks, hashes, parent = [], [], ROOT_HASH
        for index in range((len(token_ids) - 1) // block_size):
            parent = hash_block_tokens(
                parent, token_ids[index * block_size : (index + 1) * block_size]
            )
            if parent in self.cached:
                blocks.append(self.cached[parent][0])
                hashes.append(parent)
        return blocks, hashes


class GlobalBlockSize(Right):
    """Walks the prompt in blocks of the notebook's BLOCK_SIZE (16), not of its block_size
    argument (the grader's 2)."""

    def match_prefix(self, block_size, token_ids):
        return super().match_prefix(NOTEBOOK_BLOCK_SIZE, token_ids)


class ExactFitRefused(Right):
    """Refuses allocate(num) when exactly num blocks are free (>= where > belongs)."""

    def allocate(self, num):
        if num >= len(self.free_queue):
            raise CacheFullError(f"{num} blocks wanted, {len(self.free_queue)} free")
        return super().allocate(num)


class RehashesAHashedBlock(Right):
    """Lists a block again when cache is called on a block that already has a hash."""

    def cache(self, block_id, block_hash):
        self.cached.setdefault(block_hash, []).append(block_id)
        self.block_hash[block_id] = block_hash


class NewestCopyFirst(Right):
    """Puts a hash's newest copy first in cached[hash], not after the older ones."""

    def cache(self, block_id, block_hash):
        if self.block_hash[block_id] is None:
            self.cached.setdefault(block_hash, []).insert(0, block_id)
            self.block_hash[block_id] = block_hash


class HitAddsTwoHolders(Right):
    def take_cached(self, block_id):
        super().take_cached(block_id)
        self.ref_cnt[block_id] += 1


class AllocateSetsNoHolder(Right):
    """Leaves ref_cnt as it was (0) on the blocks it hands out."""

    def allocate(self, num):
        blocks = super().allocate(num)
        for block in blocks:
            self.ref_cnt[block] = 0
        return blocks


class FreeDropsEveryHolder(Right):
    """Frees a block outright, though another sequence may still hold it."""

    def free(self, block_ids):
        for block in block_ids:
            self.ref_cnt[block] = min(self.ref_cnt[block], 1)
        super().free(block_ids)


class HashOnlyInCached(Right):
    """Lists the block in cached[hash] but leaves block_hash[block] None."""

    def cache(self, block_id, block_hash):
        if block_id not in self.cached.get(block_hash, ()):
            self.cached.setdefault(block_hash, []).append(block_id)


class TakesThenRefuses(Right):
    def allocate(self, num):
        taken = []
        for _ in range(num):
            if not self.free_queue:
                raise CacheFullError("out of blocks")
            block, _ = self.free_queue.popitem(last=False)
            self._forget(block)
            self.ref_cnt[block] = 1
            taken.append(block)
        return taken


# (mistake, the criterion that catches it, how the misconception named starts; "" for none)
PLANTED = [
    (FreeToTheFront, "lru", "free puts a block with a hash at the back"),
    (OneQueueForAll, "lru", "free puts a block without a hash at the front"),
    (PlainBlocksReversed, "lru", "plain blocks freed together go to the front in the order"),
    (HitStaysInQueue, "lru", "a prefix hit on a free block takes it out of free_queue"),
    (HitAddsNoHolder, "ref_cnt", "a prefix hit adds a holder"),
    (
        HitAddsTwoHolders,
        "ref_cnt",
        "a prefix hit adds one holder: take_cached does ref_cnt + 1 once",
    ),
    (AllocateSetsNoHolder, "ref_cnt", "allocate sets ref_cnt 1 on each block"),
    (FreeDropsEveryHolder, "lru", "free takes one holder away"),
    (FreeForgetsTheHash, "cache", "free keeps a block's hash"),
    (ReuseKeepsTheHash, "cache", "allocate evicts: a cached block it hands out loses its hash"),
    (EvictionLeavesAnEmptyList, "cache", "allocate evicts: when it takes the last block"),
    (OneBlockPerHash, "cache", "a block whose hash another block already has is hashed too"),
    (RehashesAHashedBlock, "cache", "cache leaves a block that already has a hash as it is"),
    (NewestCopyFirst, "cache", "cache appends a new copy at the end of cached[hash]"),
    (HashOnlyInCached, "cache", "cache sets block_hash[block_id] as well"),
    (MatchesTheLastToken, "match_prefix", "stop one token short"),
    (UnchainedHashes, "match_prefix", "chain the hashes"),
    (SkipsAMiss, "match_prefix", "stop at the first block the cache lacks"),
    (NoHits, "match_prefix", ""),  # no known mistake finds nothing at all: none is named
    (LastCopyFirst, "match_prefix", "a hash with several cached copies"),
    (GlobalBlockSize, "match_prefix", "use the block_size argument, not a global"),
    (TakesThenRefuses, "refuses", "check that enough blocks are free first"),
    (ExactFitRefused, "refuses", "refuse only when fewer than num blocks are free"),
]


def test_the_stub_scores_nothing():
    report = check_prefix_cache(Stub)
    assert report.score == 0
    assert "allocate() is not written yet" in report.verdicts[0].detail


@pytest.mark.parametrize(
    ("planted", "criterion", "misconception"),
    PLANTED,
    ids=[planted.__name__ for planted, _, _ in PLANTED],
)
def test_each_planted_defect_fails_its_criterion_and_names_its_misconception(
    planted, criterion, misconception
):
    report = check_prefix_cache(planted, num_sequences=200)
    failed = [v for v in report.verdicts if not v.passed]
    assert [v.criterion for v in failed] == [criterion], repr(report)
    if misconception:
        assert failed[0].misconception.startswith(misconception), repr(report)
    else:
        assert failed[0].misconception == "", repr(report)
    assert not report.passed


def test_copies_in_another_order_are_shown_as_they_differ():
    """Not as two equal-looking lists of the cached blocks."""
    (failed,) = [v for v in check_prefix_cache(NewestCopyFirst).verdicts if not v.passed]
    assert "blocks [2, 1] carry one hash; cached lists them [1, 2], expected [2, 1]" in (
        failed.detail
    )


def test_an_exact_fit_refused_is_told_apart_from_a_free_queue_mistake():
    (failed,) = [v for v in check_prefix_cache(ExactFitRefused).verdicts if not v.passed]
    assert "allocate(2) raised CacheFullError with 2 blocks free" in failed.detail
    assert prefix_cache_grader.check_refusal(ExactFitRefused) == (
        "refuses",
        "allocate(10) on a fresh pool of 10 raised CacheFullError",
        prefix_cache_grader.MISCONCEPTIONS["exact_fit"],
    )
    assert prefix_cache_grader.check_refusal(Right) is None


def test_caching_a_hashed_block_again_is_checked_directly():
    assert prefix_cache_grader.check_rehash(Right) is None
    criterion, detail, _ = prefix_cache_grader.check_rehash(RehashesAHashedBlock)
    assert criterion == "cache"
    assert "a second cache(0, h) made it [0, 0]" in detail


def test_a_global_block_size_is_named_with_the_size_it_walks():
    (failed,) = [v for v in check_prefix_cache(GlobalBlockSize).verdicts if not v.passed]
    assert "finds a prefix cached in blocks of 16 tokens, none in blocks of 2" in (
        failed.misconception
    )
    assert prefix_cache_grader._sizes_it_matches(Right) == list(prefix_cache_grader.PROBE_SIZES)
    assert prefix_cache_grader._sizes_it_matches(NoHits) == []


def test_an_evicted_hash_left_in_cached_is_blamed_on_allocate_not_match_prefix():
    report = check_prefix_cache(EvictionLeavesAnEmptyList, num_sequences=200)
    failed = [v for v in report.verdicts if not v.passed]
    assert [v.criterion for v in failed] == ["cache"], repr(report)
    assert failed[0].misconception.startswith("allocate evicts")
    assert "leaves cached" in failed[0].misconception
    assert "is an empty list" in failed[0].detail


def test_a_right_pool_passes_every_property(monkeypatch):
    import kvlab.exercises.build_prefix_cache as build

    monkeypatch.setattr(build, "check_generation", lambda *a: Verdict("generation", True))
    report = check_prefix_cache(Right)
    assert report.passed, repr(report)
    assert report.score == len(CRITERIA)


def test_a_right_pool_serves_the_engine_and_its_cache_hits(smollm2):
    model, tokenizer = smollm2
    verdict = check_generation(Right, model, tokenizer)
    assert verdict.passed, verdict
    assert "prompt tokens served from your cache" in verdict.detail


def test_a_pool_that_never_hits_is_caught_in_the_engine(smollm2):
    model, tokenizer = smollm2
    verdict = check_generation(NoHits, model, tokenizer)
    assert not verdict.passed
    assert "your pool served 0 prompt tokens from the cache" in verdict.detail


def test_the_manager_refuses_a_pool_of_another_size():
    with pytest.raises(
        ValueError, match="pool has 4 blocks, 4 free; the manager needs num_blocks=8"
    ):
        BlockManager(8, 2, True, pool=LearnerPool(Right(4)))


def test_help_comes_in_steps():
    assert hint_prefix_cache(1) != hint_prefix_cache(2) != hint_prefix_cache(3)
    assert "block_size argument (not the" in hint_prefix_cache(2)
    steps = hint_prefix_cache(3).splitlines()
    assert len(steps) > 20 and "  1. if num > len(free_queue): raise CacheFullError" in steps[1]
    with pytest.raises(ValueError, match="level=0 is not allowed: use 1 to 3"):
        hint_prefix_cache(0)
    assert "def match_prefix" in reveal_prefix_cache()
