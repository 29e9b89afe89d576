"""The exercises of lab 02."""

from __future__ import annotations

from kvlab.cache.contiguous_arena import ContiguousArena, reservation_size
from kvlab.exercises.base import Exercise, Mistake, register

# Exercise 02.internal_waste: one request under policy "max_model_len".
_WASTE_MAX_MODEL_LEN, _WASTE_PROMPT, _WASTE_OUTPUT = 512, 40, 20
# Exercise 02.largest_request: first-fit reservations, then the 1st and 3rd finish.
_ARENA_SLOTS, _ARENA_RANGES, _ARENA_FREED = 1000, (300, 200, 300, 100), (0, 2)


def _internal_waste(held_tokens: int) -> float:
    reserved = reservation_size("max_model_len", _WASTE_PROMPT, None, _WASTE_MAX_MODEL_LEN)
    return 1 - held_tokens / reserved


def _arena_after_frees() -> ContiguousArena:
    arena = ContiguousArena(_ARENA_SLOTS)
    for seq_id, num_slots in enumerate(_ARENA_RANGES):
        arena.reserve(seq_id, num_slots)
    for seq_id in _ARENA_FREED:
        arena.free(seq_id)
    return arena


register(
    Exercise(
        exercise_id="02.pow2_reservation",
        question=(
            "Under the 'pow2' policy a request reserves its prompt plus its max_tokens "
            "rounded up to a power of two. A request with a 100-token prompt and "
            "max_tokens=100 arrives at a server with max_model_len 4096. How many token "
            "slots does it reserve?"
        ),
        answer=lambda: reservation_size("pow2", 100, 100, 4096),
        hint="prompt_len + (max_tokens rounded up to a power of two), at most max_model_len.",
        mistakes=(
            Mistake(
                lambda: 256, "only the output is rounded up; the prompt's length is known exactly."
            ),
            Mistake(
                lambda: reservation_size("exact", 100, 100, 4096),
                "that is the 'exact' policy; 'pow2' rounds max_tokens up first.",
            ),
            Mistake(lambda: 4096, "that is the 'max_model_len' policy."),
        ),
        explanation="At most 2x the output is over-reserved (Orca (Pow2)).",
    ),
    Exercise(
        exercise_id="02.internal_waste",
        question=(
            f"Under the 'max_model_len' policy (max_model_len {_WASTE_MAX_MODEL_LEN}), a "
            f"request with a {_WASTE_PROMPT}-token prompt generates {_WASTE_OUTPUT} tokens. "
            "Just before it frees its range, what fraction of the slots it reserved hold "
            "none of its tokens (internal fragmentation)? (a number between 0 and 1)"
        ),
        answer=lambda: _internal_waste(_WASTE_PROMPT + _WASTE_OUTPUT - 1),
        hint=(
            "the range has max_model_len slots; the request fills prompt + output of "
            "them (less one: its last token is never fed back)."
        ),
        mistakes=(
            Mistake(
                lambda: 1 - _internal_waste(_WASTE_PROMPT + _WASTE_OUTPUT - 1),
                "that is the share that holds tokens; the question asks for the empty share.",
            ),
            Mistake(
                lambda: 100 * _internal_waste(_WASTE_PROMPT + _WASTE_OUTPUT - 1),
                "give a fraction between 0 and 1, not a percentage.",
                abs_tol=1.0,
            ),
        ),
        abs_tol=0.01,
        explanation="Close to 90% of the reservation never holds a token.",
    ),
    Exercise(
        exercise_id="02.largest_request",
        question=(
            f"An arena of {_ARENA_SLOTS:,} slots places reservations of "
            f"{', '.join(map(str, _ARENA_RANGES))} slots first-fit, in that order. Then "
            "the first and the third requests finish. What is the largest reservation "
            "(in slots) the arena can admit now?"
        ),
        answer=lambda: _arena_after_frees().largest_hole,
        hint="a reservation must be one unbroken range: list the holes (start, length).",
        mistakes=(
            Mistake(
                lambda: _arena_after_frees().num_free_slots,
                "that many slots are free in total, but in three separate holes: one "
                "range cannot span them (external fragmentation).",
            ),
            Mistake(
                lambda: _ARENA_SLOTS - sum(_ARENA_RANGES),
                "the freed ranges become holes too; not only the tail is free.",
            ),
            Mistake(
                lambda: _arena_after_frees().external_fragmentation(),
                "that is the free memory outside the largest hole: what no single request can use.",
            ),
        ),
        explanation="Most of the arena is free, yet a request one slot larger is refused.",
    ),
)
