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
from kvlab.exercises.build_prefix_cache import (
    CRITERIA,
    LearnerPool,
    check_generation,
    check_prefix_cache,
    hint_prefix_cache,
    reveal_prefix_cache,
)
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


PLANTED = [
    (FreeToTheFront, "lru"),
    (OneQueueForAll, "lru"),
    (PlainBlocksReversed, "lru"),
    (HitStaysInQueue, "lru"),
    (HitAddsNoHolder, "ref_cnt"),
    (FreeForgetsTheHash, "cache"),
    (ReuseKeepsTheHash, "cache"),
    (EvictionLeavesAnEmptyList, "cache"),
    (OneBlockPerHash, "cache"),
    (MatchesTheLastToken, "match_prefix"),
    (UnchainedHashes, "match_prefix"),
    (SkipsAMiss, "match_prefix"),
    (NoHits, "match_prefix"),
    (LastCopyFirst, "match_prefix"),
    (TakesThenRefuses, "refuses"),
]


def test_the_stub_scores_nothing():
    report = check_prefix_cache(Stub)
    assert report.score == 0
    assert "allocate() is not written yet" in report.verdicts[0].detail


@pytest.mark.parametrize(("planted", "criterion"), PLANTED, ids=lambda x: getattr(x, "__name__", x))
def test_each_planted_defect_fails_its_criterion(planted, criterion):
    report = check_prefix_cache(planted, num_sequences=200)
    failed = [v for v in report.verdicts if not v.passed]
    assert [v.criterion for v in failed] == [criterion], repr(report)
    assert failed[0].misconception
    assert not report.passed


def test_an_evicted_hash_left_in_cached_is_blamed_on_allocate_not_match_prefix():
    report = check_prefix_cache(EvictionLeavesAnEmptyList, num_sequences=200)
    failed = [v for v in report.verdicts if not v.passed]
    assert [v.criterion for v in failed] == ["cache"], repr(report)
    assert failed[0].misconception.startswith("allocate evicts")
    assert "leaves cached" in failed[0].misconception
    assert "is an empty list" in failed[0].detail


def test_a_right_pool_passes_every_property(monkeypatch):
    import kvlab.exercises.build_prefix_cache as build

    monkeypatch.setattr(build, "check_generation", lambda *a: build.Verdict("generation", True))
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
    assert hint_prefix_cache(1) != hint_prefix_cache(3)
    with pytest.raises(ValueError, match="level=0 is not allowed: use 1 to 3"):
        hint_prefix_cache(0)
    assert "def match_prefix" in reveal_prefix_cache()
