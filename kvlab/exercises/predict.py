"""Predict, then run: the learner commits to a guess, the lab measures, ``reveal`` compares.

A lab asks for a prediction in a cell of its own before an experiment:

    prediction = None  # your guess: how many requests fit at once (a number)

runs the experiment, then reveals:

    reveal(prediction, measured, unit="requests", why="...")

which prints the guess beside the measurement, how far apart they are, and what explains
the number. A number is compared by ratio (within 10% counts as right); a choice (a string)
by its text, ignoring case and spaces at the ends. With no prediction written it says so in
a few words, and still shows the measurement and the explanation: a learner reading the
committed lab sees the answer, one running it can guess first.

Not handled: ranges as predictions, keeping score across a lab.
"""

from __future__ import annotations

from dataclasses import dataclass

CLOSE = 0.10  # a numeric guess within 10% of the measurement counts as right


@dataclass(frozen=True)
class Reveal:
    """A prediction beside its measurement; shows as a few lines in a notebook."""

    prediction: float | str | None  # the learner's guess (a number or a choice), or None
    measured: float | str  # what the experiment gave
    unit: str = ""  # of both numbers (e.g. "requests", "ms"), or ""
    why: str = ""  # what explains the measurement, in a sentence or two

    @property
    def right(self) -> bool | None:
        """Whether the guess holds (None without one)."""
        if self.prediction is None:
            return None
        if isinstance(self.measured, str):
            return str(self.prediction).strip().lower() == self.measured.strip().lower()
        return abs(float(self.prediction) - self.measured) <= CLOSE * abs(self.measured)

    def __repr__(self) -> str:
        measured = _show(self.measured, self.unit)
        if self.prediction is None:
            lines = [f"Measured: {measured} (no guess written)."]
        elif isinstance(self.measured, str):
            verdict = "Right" if self.right else "Not this time"
            lines = [f"{verdict}: you predicted {self.prediction!r}, the run gave {measured}."]
        else:
            guess = _show(self.prediction, self.unit)
            lines = [f"You predicted {guess}; measured {measured} ({self._how_far()})."]
        if self.why:
            lines.append(self.why)
        return "\n".join(lines)

    def _how_far(self) -> str:
        guess, measured = float(self.prediction), float(self.measured)
        if self.right:
            return "within 10%: right"
        if guess == 0 or measured == 0:
            return f"off by {abs(guess - measured):g}"
        ratio = measured / guess
        return f"{ratio:.2g}x your guess" if ratio > 1 else f"{1 / ratio:.2g}x below your guess"


def reveal(prediction, measured, *, unit: str = "", why: str = "") -> Reveal:
    """The learner's ``prediction`` beside the ``measured`` value (see the module docstring).

    Raises:
        TypeError: ``prediction`` is neither None, a number nor a string, or a number is
            compared with a choice.
    """
    if prediction is not None and not isinstance(prediction, int | float | str):
        raise TypeError(
            f"prediction={prediction!r} is not allowed: write a number, a choice in quotes, "
            "or leave None"
        )
    if isinstance(prediction, str) != isinstance(measured, str) and prediction is not None:
        kind = "a choice (a string)" if isinstance(measured, str) else "a number"
        raise TypeError(f"prediction={prediction!r} is not allowed: this one asks for {kind}")
    return Reveal(prediction, measured, unit, why)


def _show(value, unit: str) -> str:
    if isinstance(value, str):
        return repr(value)
    text = f"{value:,}" if float(value).is_integer() else f"{value:,.3g}"
    return f"{text} {unit}".strip()
