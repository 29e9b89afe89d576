"""A learner's block pool behind the interface ``BlockManager`` reads (lab 06's build-it),
and ``call`` / ``call_learner``, which tell a learner method's ``CacheFullError`` (allowed)
from any other error (a bug in that method).

Not handled: a pool without the stub's four attributes (``ref_cnt``, ``block_hash``,
``free_queue``, ``cached``: ``block_hash -> [block_id, ...]``, the copies of a hash in the
order they were cached).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.cache.manager import CacheFullError


class LearnerError(Exception):
    """A learner's method raised something other than CacheFullError; ``method`` names it."""

    def __init__(self, method: str, message: str):
        super().__init__(message)
        self.method = method


def call(name: str, method, *args):
    """``method(*args)``; a CacheFullError passes through, any other error is a LearnerError."""
    try:
        return method(*args)
    except CacheFullError:
        raise
    except Exception as error:  # noqa: BLE001 - any error of the learner's code is a verdict
        raise LearnerError(name, f"{name}() raised {type(error).__name__}: {error}") from error


def call_learner(name: str, method, *args):
    """``method(*args)``, or the ``CacheFullError`` it raised: a refusal is an answer to
    compare. Any other error is a ``LearnerError``, a verdict on the method ``name``."""
    try:
        return call(name, method, *args)
    except CacheFullError as error:
        return error


class LearnerPool:
    """The interface ``BlockManager`` reads from its pool, over a learner's pool: every
    change goes to the learner's methods; every question is answered from the learner's
    state, unchecked, so a wrong answer misleads the manager exactly as a wrong
    ``BlockPool`` would. ``share`` (a fork adds a holder) is kvlab's.

    ``refused`` is ``(num, free blocks)`` of an ``allocate(num)`` the learner refused with
    CacheFullError although that many blocks were free, or None: the manager passes the
    refusal on as "the cache is full", so the grader reads it here.
    """

    def __init__(self, learner) -> None:
        self.learner = learner
        self.num_blocks = len(learner.ref_cnt)
        self.refused: tuple[int, int] | None = None

    @property
    def ref_cnt(self) -> list[int]:
        return self.learner.ref_cnt

    @property
    def block_hash(self) -> list[int | None]:
        return self.learner.block_hash

    @property
    def num_free_blocks(self) -> int:
        return len(self.learner.free_queue)

    @property
    def num_held_blocks(self) -> int:
        return sum(1 for n in self.learner.ref_cnt if n > 0)

    def allocate(self, num: int) -> list[int]:
        num_free = self.num_free_blocks
        try:
            return list(call("allocate", self.learner.allocate, num))
        except CacheFullError:
            if num <= num_free:
                self.refused = (num, num_free)
            raise

    def free(self, block_ids) -> None:
        call("free", self.learner.free, list(block_ids))

    def share(self, block_ids) -> None:
        for block_id in block_ids:
            self.learner.ref_cnt[block_id] += 1

    def take_cached(self, block_id: int) -> None:
        call("take_cached", self.learner.take_cached, block_id)

    def cache(self, block_id: int, block_hash: int) -> None:
        call("cache", self.learner.cache, block_id, block_hash)

    def match_prefix(self, block_size: int, token_ids: Sequence[int]):
        blocks, hashes = call("match_prefix", self.learner.match_prefix, block_size, token_ids)
        return list(blocks), list(hashes)
