"""Lab 07's figures, built from small inputs: what each draws (traces, titles, axes)."""

from __future__ import annotations

import pytest

from kvlab.widgets.capstone_figures import (
    METHOD_COLORS,
    concurrency_figure,
    step_cost_figure,
)


def test_concurrency_figure_draws_one_stepped_line_per_method():
    fig = concurrency_figure(
        {"kvlab-contiguous": [2, 2, 1], "kvlab-paged": [3, 2], "hf-generate-batch": (3, 2)},
        title="Paged ran all 3 at once",
    )
    names = [trace.name for trace in fig.data]
    assert names == [
        "kvlab-contiguous (3 steps)",
        "kvlab-paged (2 steps)",
        "hf-generate-batch (2 steps)",
    ]
    assert list(fig.data[0].x) == [1, 2, 3] and list(fig.data[0].y) == [2, 2, 1]
    assert all(trace.line.shape == "hv" for trace in fig.data)
    assert fig.data[0].line.color == METHOD_COLORS["kvlab-contiguous"]
    assert fig.data[1].line.color == METHOD_COLORS["kvlab-paged"]
    assert fig.data[2].line.dash == "dash"  # visible where it lies on paged's line
    assert fig.layout.title.text == "Paged ran all 3 at once"
    assert fig.layout.xaxis.title.text == "engine step"
    assert fig.layout.yaxis.title.text == "requests computed in the step"


def test_concurrency_figure_refuses_an_empty_run():
    with pytest.raises(ValueError, match="runs"):
        concurrency_figure({"kvlab-paged": []}, title="t")


def test_step_cost_figure_draws_steps_medians_and_the_clock():
    measured = [(1, 0.050), (1, 0.054), (3, 0.060), (3, 0.070), (3, 0.062)]
    fig = step_cost_figure(measured, lambda n: 0.045 + 0.003 * n, title="Wider steps cost more")
    steps, medians, clock = fig.data
    assert list(steps.x) == [1, 1, 3, 3, 3]
    assert list(steps.y) == pytest.approx([50, 54, 60, 70, 62])
    assert list(medians.x) == [1, 3]
    assert list(medians.y) == pytest.approx([52, 62])
    assert list(clock.x) == [1, 2, 3]
    assert list(clock.y) == pytest.approx([48, 51, 54])
    assert clock.mode == "lines"
    assert fig.layout.title.text == "Wider steps cost more"
    assert fig.layout.xaxis.title.text == "sequences decoded in the step"
    assert fig.layout.yaxis.title.text == "time of the step (ms)"


def test_step_cost_figure_refuses_no_steps():
    with pytest.raises(ValueError, match="measured"):
        step_cost_figure([], lambda n: 0.0, title="t")
