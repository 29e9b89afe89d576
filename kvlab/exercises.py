"""Lab exercises, and ``check``, which marks an answer right or wrong with a helpful hint.

    from kvlab.exercises import check, question
    print(question("01.kv_bytes_llama3_8b"))
    check("01.kv_bytes_llama3_8b", answer)   # "Correct ..." or a hint

Every answer is computed from kvlab itself (``kvlab.memory`` presets, the padding account
of ``kvlab.naive_hf``), never typed in, so it follows the library. A wrong answer that
matches a known mistake gets that mistake's hint; any other gets the exercise's general
hint; ``None`` (the placeholder in the labs) gets a reminder to fill it in.

Not handled: free-text answers, partial credit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.memory import GIB, preset
from kvlab.naive_hf import padded_cache_slots


@dataclass(frozen=True)
class Mistake:
    """A wrong answer learners often give, and the hint that gets them unstuck."""

    value: Callable[[], float]
    hint: str
    abs_tol: float | None = None  # None: the exercise's own tolerance


@dataclass(frozen=True)
class Exercise:
    """One question with a numeric answer.

    Attributes:
        exercise_id: ``"<lab>.<name>"``, e.g. ``"01.kv_bytes_llama3_8b"``.
        question: the text the lab shows.
        answer: computes the right answer from kvlab.
        hint: for a wrong answer that matches no known mistake.
        mistakes: known wrong answers, each with its own hint.
        abs_tol: how far from the answer still counts as right (0: exact).
        explanation: shown with "Correct", to confirm the reasoning.
    """

    exercise_id: str
    question: str
    answer: Callable[[], float]
    hint: str
    mistakes: tuple[Mistake, ...] = ()
    abs_tol: float = 0.0
    explanation: str = ""

    def matches(self, value: float, candidate: float, abs_tol: float | None = None) -> bool:
        tol = self.abs_tol if abs_tol is None else abs_tol
        return math.isclose(value, candidate, rel_tol=1e-9, abs_tol=tol)


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer; shows as its message in a notebook, and is truthy if right."""

    correct: bool
    message: str

    def __bool__(self) -> bool:
        return self.correct

    def __repr__(self) -> str:
        return self.message

    __str__ = __repr__


def check(exercise_id: str, answer) -> Feedback:
    """Mark ``answer`` for exercise ``exercise_id``: "Correct", or a hint to try again."""
    exercise = _get(exercise_id)
    if answer is None:
        return Feedback(False, "Not answered yet: replace `answer = None` with your number.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number (int or float), not {type(answer).__name__}.")
    right = exercise.answer()
    if exercise.matches(answer, right):
        return Feedback(True, f"Correct: {_fmt(right)}. {exercise.explanation}".rstrip())
    for mistake in exercise.mistakes:
        if exercise.matches(answer, mistake.value(), mistake.abs_tol):
            return Feedback(False, f"Not quite ({_fmt(answer)}). Hint: {mistake.hint}")
    return Feedback(False, f"Not quite ({_fmt(answer)}). Hint: {exercise.hint}")


def question(exercise_id: str) -> str:
    """The question of ``exercise_id``."""
    return _get(exercise_id).question


def _get(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        raise KeyError(
            f"no exercise {exercise_id!r}; the exercises are {sorted(EXERCISES)}"
        ) from None


def _fmt(value: float) -> str:
    return f"{value:,}" if float(value).is_integer() else f"{value:.4g}"


# --- Lab 01 ------------------------------------------------------------------------------

_LLAMA3_QUERY_HEADS = 32  # num_attention_heads in Llama-3-8B's config.json


def _llama3(**changes) -> int:
    """Llama-3-8B's KV bytes per token, with one factor of the formula changed."""
    spec = preset("llama-3-8b")
    factors = dict(kv=2, layers=spec.num_layers, heads=spec.num_kv_heads)
    factors.update(head_dim=spec.head_dim, dtype_bytes=spec.dtype_bytes)
    factors.update(changes)
    return math.prod(factors.values())


# The padded batch of exercise 01.padding_waste: prompt and answer lengths (EOS included).
_PROMPT_LENS, _OUTPUT_LENS = (12, 40, 25), (50, 6, 20)


def _padding_waste(slots: int, real: int) -> float:
    return 1 - real / slots


def _left_padding_only() -> float:
    slots, _ = padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)
    return sum(max(_PROMPT_LENS) - p for p in _PROMPT_LENS) / slots


def _requests_that_fit(device_bytes: int, weights: bool = True) -> int:
    spec = preset("llama-2-7b")
    free = device_bytes - (spec.weight_bytes if weights else 0)
    return free // spec.bytes_for(spec.max_model_len)


EXERCISES: dict[str, Exercise] = {
    exercise.exercise_id: exercise
    for exercise in (
        Exercise(
            exercise_id="01.kv_bytes_llama3_8b",
            question=(
                "Llama-3-8B has 32 layers, 32 query heads, 8 KV heads (grouped-query "
                "attention) and head_dim 128. How many bytes of KV cache does one token take "
                "with float16 K and V?"
            ),
            answer=lambda: preset("llama-3-8b").bytes_per_token,
            hint="bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes.",
            mistakes=(
                Mistake(
                    lambda: _llama3(heads=_LLAMA3_QUERY_HEADS),
                    "only the KV heads store keys and values: with grouped-query attention "
                    "several query heads share one KV head, so use 8, not 32.",
                ),
                Mistake(lambda: _llama3(kv=1), "every token stores a key AND a value."),
                Mistake(lambda: _llama3(dtype_bytes=4), "float16 takes 2 bytes, not 4."),
                Mistake(
                    lambda: _llama3() / 1024,
                    "that is the answer in KiB; give it in bytes.",
                ),
            ),
            explanation="A quarter of Llama-2-7B's 0.5 MiB: 4x fewer KV heads.",
        ),
        Exercise(
            exercise_id="01.padding_waste",
            question=(
                f"model.generate runs three chat requests as one batch: prompts of "
                f"{', '.join(map(str, _PROMPT_LENS))} tokens, answers of "
                f"{', '.join(map(str, _OUTPUT_LENS))} tokens (each answer counts its EOS). "
                "When the batch ends, what fraction of its cache's positions hold padding? "
                "(a number between 0 and 1)"
            ),
            answer=lambda: _padding_waste(*padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)),
            hint=(
                "every row is as long as the longest prompt plus the longest answer "
                "(less one: the last token is never fed back); a request needs only its "
                "own prompt + answer."
            ),
            mistakes=(
                Mistake(
                    lambda: 1 - _padding_waste(*padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)),
                    "that is the fraction holding real tokens; the question asks for padding.",
                ),
                Mistake(
                    _left_padding_only,
                    "left padding is only part of it: a request that finished early stays "
                    "in the batch, fed padding, until the longest answer ends.",
                ),
                Mistake(
                    lambda: 100 * _padding_waste(*padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)),
                    "give a fraction between 0 and 1, not a percentage.",
                ),
            ),
            abs_tol=0.01,
            explanation="Padding to the longest wastes both ends of the batch.",
        ),
        Exercise(
            exercise_id="01.requests_on_a100",
            question=(
                "Llama-2-7B (preset 'llama-2-7b', float16 weights and KV) serves requests of "
                "4096 tokens each on a GPU with 80 GiB. Each request reserves its whole "
                "4096-token KV cache up front. How many requests fit at once, next to the "
                "weights? (a whole number)"
            ),
            answer=lambda: _requests_that_fit(80 * GIB),
            hint=(
                "(device memory - weight bytes) // KV bytes of one 4096-token request; "
                "preset('llama-2-7b') has both."
            ),
            mistakes=(
                Mistake(
                    lambda: _requests_that_fit(80 * GIB, weights=False),
                    "the weights (about 6.7e9 parameters x 2 bytes) take their share first.",
                ),
                Mistake(
                    lambda: (
                        (80 * GIB - preset("llama-2-7b").weight_bytes)
                        / preset("llama-2-7b").bytes_for(4096)
                    ),
                    "only whole requests fit: round down.",
                    abs_tol=0.5,
                ),
            ),
            explanation=(
                "Reserving 4096 tokens per request caps the batch however short the "
                "requests really are; paged allocation (lab 03) holds only what is used."
            ),
        ),
    )
}
