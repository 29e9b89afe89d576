"""The exercises of lab 03."""

from __future__ import annotations

from kvlab.cache.block_manager import BlockManager
from kvlab.exercises.base import Exercise, Mistake, register

# Exercise 03.prefix_hit: A's prompt ran and is cached; B shares its first 70 tokens.
_PREFIX_BLOCK_SIZE, _PROMPT_A_LEN, _SHARED_LEN, _PROMPT_B_LEN = 16, 100, 70, 120
# Exercise 03.cow_copies: a 37-token prompt forked into 4 sequences.
_COW_BLOCK_SIZE, _COW_PROMPT_LEN, _COW_NUM_SEQS = 16, 37, 4


def _empty_slots(num_tokens: int, block_size: int) -> int:
    manager = BlockManager(-(-num_tokens // block_size), block_size, False)
    manager.allocate_slots(0, num_tokens)
    return len(manager.block_table(0)) * block_size - num_tokens


def _prefix_hit_tokens() -> int:
    """Prompt tokens of B found in the prefix cache after A ran."""
    prompt_a = list(range(_PROMPT_A_LEN))
    prompt_b = prompt_a[:_SHARED_LEN] + list(range(1000, 1000 + _PROMPT_B_LEN - _SHARED_LEN))
    manager = BlockManager(32, _PREFIX_BLOCK_SIZE, enable_prefix_caching=True)
    manager.allocate_slots(0, len(prompt_a), token_ids=prompt_a)
    manager.free(0)
    return manager.add_sequence(1, prompt_b)


def _cow_copies() -> int:
    manager = BlockManager(16, _COW_BLOCK_SIZE, enable_prefix_caching=False)
    manager.allocate_slots(0, _COW_PROMPT_LEN)
    for child in range(1, _COW_NUM_SEQS):
        manager.fork(0, child)
    return sum(len(manager.allocate_slots(seq_id, 1)) for seq_id in range(_COW_NUM_SEQS))


register(
    Exercise(
        exercise_id="03.empty_slots",
        question=(
            "A sequence of 1,000 tokens is stored in blocks of block_size 32. How many "
            "slots of its blocks are empty?"
        ),
        answer=lambda: _empty_slots(1000, 32),
        hint="it holds ceil(1000 / 32) blocks; count their slots, then subtract the tokens.",
        mistakes=(
            Mistake(
                lambda: 1000 % 32,
                "that is how many tokens the last block holds, not how many slots are empty.",
            ),
            Mistake(lambda: -(-1000 // 32) * 32, "that is every slot it holds."),
            Mistake(lambda: -(-1000 // 32), "that is the number of blocks."),
        ),
        explanation="Only the last block can be partly empty: under block_size slots.",
    ),
    Exercise(
        exercise_id="03.prefix_hit",
        question=(
            f"Prefix caching is on, block_size {_PREFIX_BLOCK_SIZE}. Request A's "
            f"{_PROMPT_A_LEN}-token prompt has run, and its blocks stay cached. Request "
            f"B's prompt has {_PROMPT_B_LEN} tokens; its first {_SHARED_LEN} equal A's, "
            "then they differ. How many of B's prompt tokens must its prefill compute?"
        ),
        answer=lambda: _PROMPT_B_LEN - _prefix_hit_tokens(),
        hint="a cached block serves a hit only if all of its tokens (and all before) match.",
        mistakes=(
            Mistake(
                lambda: _PROMPT_B_LEN - _SHARED_LEN,
                "only whole blocks are shared: the block in which the two prompts part "
                "ways differs, so it is computed again.",
            ),
            Mistake(
                lambda: _prefix_hit_tokens(),
                "that is how many tokens B reuses; the question asks how many it computes.",
            ),
            Mistake(lambda: _PROMPT_B_LEN, "B's first full blocks equal A's: it adopts them."),
        ),
        explanation="B adopts the whole blocks that match, and computes the rest.",
    ),
    Exercise(
        exercise_id="03.cow_copies",
        question=(
            f"A {_COW_PROMPT_LEN}-token prompt sits in blocks of {_COW_BLOCK_SIZE} (the "
            f"last holds {_COW_PROMPT_LEN % _COW_BLOCK_SIZE} tokens). Parallel sampling "
            f"forks it into {_COW_NUM_SEQS} sequences that share every block. Then each of "
            "them, one after the other, writes its first new token. How many blocks get "
            "copied (copy-on-write)?"
        ),
        answer=_cow_copies,
        hint="a sequence copies a block only if it writes into it while someone else holds it.",
        mistakes=(
            Mistake(
                lambda: _COW_NUM_SEQS,
                "by the time the last sequence writes, everyone else has copied away: it "
                "holds the block alone (ref_cnt 1) and writes in place.",
            ),
            Mistake(
                lambda: (_COW_NUM_SEQS - 1) * -(-_COW_PROMPT_LEN // _COW_BLOCK_SIZE),
                "the full blocks are never written again: they stay shared.",
            ),
            Mistake(lambda: 0, "a shared block is never written in place."),
        ),
        explanation="Only the partly filled last block is copied, once per extra holder.",
    ),
)
