"""The exercises of lab 03."""

from __future__ import annotations

from kvlab.cache.block_manager import BlockManager
from kvlab.exercises.base import Exercise, Mistake, register


def _empty_slots(num_tokens: int, block_size: int) -> int:
    manager = BlockManager(-(-num_tokens // block_size), block_size, False)
    manager.allocate_slots(0, num_tokens)
    return len(manager.block_table(0)) * block_size - num_tokens


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
)
