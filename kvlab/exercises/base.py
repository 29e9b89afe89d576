"""What an exercise is, and ``check``, which marks an answer right or wrong with a hint.

An ``Exercise`` has a question, an answer computed from kvlab itself (never typed in), a
tolerance, a general hint and ``Mistake``s: wrong answers learners often give, each with
the hint that gets them unstuck. Each lab's exercises live in ``labNN.py`` and register
themselves in ``EXERCISES``.

Not handled: free-text answers, partial credit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    """A wrong answer learners often give, and the hint that gets them unstuck."""

    value: Callable[[], float]
    hint: str
    abs_tol: float | None = None  # None: the exercise's own tolerance


@dataclass(frozen=True)
class Exercise:
    """One question with a numeric answer."""

    exercise_id: str  # "<lab>.<name>", e.g. "01.kv_bytes_llama3_8b"
    question: str  # the text the lab shows
    answer: Callable[[], float]  # computes the right answer from kvlab
    hint: str  # for a wrong answer that matches no known mistake
    mistakes: tuple[Mistake, ...] = ()  # known wrong answers, each with its own hint
    abs_tol: float = 0.0  # how far from the answer still counts as right (0: exact)
    explanation: str = ""  # shown with "Correct", to confirm the reasoning

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
    if exercise_id not in EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; the exercises are {sorted(EXERCISES)}")
    return EXERCISES[exercise_id]


def _fmt(value: float) -> str:
    return f"{value:,}" if float(value).is_integer() else f"{value:.4g}"


EXERCISES: dict[str, Exercise] = {}
"""Every exercise by id (``"04.watermark"``); each lab module adds its own."""


def register(*exercises: Exercise) -> None:
    """Add a lab's exercises to ``EXERCISES``; an id may be used once."""
    for exercise in exercises:
        if exercise.exercise_id in EXERCISES:
            raise ValueError(f"exercise id {exercise.exercise_id!r} is used twice")
        EXERCISES[exercise.exercise_id] = exercise
