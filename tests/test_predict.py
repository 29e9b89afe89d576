"""Predict, then run: ``reveal`` compares a learner's guess with the measurement."""

from __future__ import annotations

import pytest

from kvlab.exercises.predict import reveal


def test_no_prediction_still_reveals_the_measurement_and_why():
    text = repr(reveal(None, 42, unit="requests", why="Blocks are taken as tokens arrive."))
    assert text.splitlines()[0] == "Measured: 42 requests (no guess written)."
    assert "Blocks are taken" in text


@pytest.mark.parametrize(
    ("guess", "right", "says"),
    [(40, True, "within 10%: right"), (10, False, "4.2x your guess"), (84, False, "2x below")],
)
def test_a_number_is_right_within_ten_percent(guess, right, says):
    shown = reveal(guess, 42, unit="requests")
    assert shown.right is right
    assert says in repr(shown) and f"You predicted {guess} requests" in repr(shown)


def test_a_choice_is_compared_by_its_text():
    assert reveal(" Paged ", "paged").right
    assert repr(reveal("contiguous", "paged")).startswith("Not this time")


def test_a_guess_of_the_wrong_kind_is_refused():
    with pytest.raises(TypeError, match="this one asks for a number"):
        reveal("many", 42)
    with pytest.raises(TypeError, match="prediction=\\[1\\] is not allowed"):
        reveal([1], 42)
