"""Lab 07's figures, built from small inputs: what each draws (traces, titles, axes)."""

from __future__ import annotations

import pytest

from kvlab.widgets.capstone_figures import (
    METHOD_COLORS,
    SERVER_STYLES,
    concurrency_figure,
    latency_figure,
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


def test_step_cost_figure_colours_each_run_and_draws_medians_and_the_clock():
    measured = {
        "kvlab-contiguous": [(1, 0.050), (1, 0.054)],
        "kvlab-paged": [(3, 0.060), (3, 0.070), (3, 0.062)],
    }
    fig = step_cost_figure(measured, lambda n: 0.045 + 0.003 * n, title="Wider steps cost more")
    contiguous, paged, medians, clock = fig.data
    assert contiguous.name == "kvlab-contiguous: one step"
    assert list(contiguous.x) == [1, 1] and list(contiguous.y) == pytest.approx([50, 54])
    assert contiguous.marker.color == METHOD_COLORS["kvlab-contiguous"]
    assert paged.marker.color == METHOD_COLORS["kvlab-paged"]
    assert list(paged.y) == pytest.approx([60, 70, 62])
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
        step_cost_figure({"kvlab-paged": []}, lambda n: 0.0, title="t")


def test_latency_figure_draws_each_server_the_limit_and_the_flat_out_rates():
    curves = {
        "one at a time": [(0.1, 0.01), (0.3, 0.05), (0.5, 0.9)],
        "paged, continuous": [(0.1, 0.009), (1.0, 0.009), (10.0, 0.3)],
    }
    flat = {"one at a time": 0.34, "paged, continuous": 9.9}
    fig = latency_figure(curves, 0.1, flat, title="Paged turns up 29x later")
    lines = [trace for trace in fig.data if trace.showlegend is not False]
    names = [trace.name for trace in lines]
    assert names == [
        "one at a time",
        "paged, continuous",
        "latency limit, 0.1 s per token",
        "dotted: the server's rate flat out",
    ]
    one, paged, limit = lines[:3]
    assert list(one.x) == [0.1, 0.3, 0.5] and list(one.y) == [0.01, 0.05, 0.9]
    assert paged.line.color == SERVER_STYLES["paged, continuous"][0]
    assert set(limit.y) == {0.1}
    # One dotted vertical line per server, at its flat-out rate, in its colour.
    verticals = [trace for trace in fig.data if trace.showlegend is False]
    assert [tuple(v.x) for v in verticals] == [(0.34, 0.34), (9.9, 9.9)]
    assert all(v.line.dash == "dot" for v in verticals)
    assert verticals[1].line.color == SERVER_STYLES["paged, continuous"][0]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert fig.layout.title.text == "Paged turns up 29x later"
    assert fig.layout.xaxis.title.text.startswith("request rate (requests per second")
    assert fig.layout.yaxis.title.text.startswith("normalized latency (s per output token")


def test_latency_figure_refuses_no_points_and_a_bad_limit():
    with pytest.raises(ValueError, match="curves"):
        latency_figure({"paged, continuous": []}, 0.1, {}, title="t")
    with pytest.raises(ValueError, match="limit"):
        latency_figure({"paged, continuous": [(1.0, 0.01)]}, 0.0, {}, title="t")
