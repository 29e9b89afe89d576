"""Lab 04's figures, built from small replays: what each one draws (traces, axes, titles).

The lab shows who waits while seats are empty (``queue_figure``), where requests were
preempted and recomputed (``timeline_figure``), knob sweeps (``sweep_figure``), a step's
cost against its tokens with the ridge (``step_cost_figure``) and the token budget's
trade-off (``budget_figure``). Each test pins what the learner is meant to see in it.
"""

from __future__ import annotations

import pytest
from test_replay import tiny_llm

from kvlab.engine.step_cost import LinearCost, Roofline, StepCostClock
from kvlab.measure.replay import TraceRequests, replay
from kvlab.memory import preset
from kvlab.sim.trace import make_trace
from kvlab.widgets.batching_figures import (
    PreemptionRecording,
    budget_figure,
    counts_over_time,
    queue_figure,
    ridge_tokens,
    step_cost_figure,
    sweep_figure,
    timeline_figure,
)

A100 = Roofline.of(preset("llama-2-7b"), "a100-40gb")

pytestmark = pytest.mark.usefixtures("one_thread")


def requests(num_requests=8, rate=20.0, max_output_len=10) -> TraceRequests:
    trace = make_trace(num_requests, "alpaca", arrival_rate=rate, seed=0, max_model_len=512)
    return TraceRequests.from_trace(trace, 256, max_output_len=max_output_len)


@pytest.fixture(scope="module")
def policies(tiny_model):
    work = requests()
    settings = {
        "static": dict(scheduling="static"),
        "dynamic": dict(scheduling="dynamic", batch_timeout=0.1),
        "continuous": dict(),
    }
    return {name: replay(tiny_llm(tiny_model, **s), work) for name, s in settings.items()}


def test_queue_figure_draws_running_and_waiting_per_run_under_the_seats(policies):
    fig = queue_figure(policies, max_num_seqs=4, title="Seats left empty")
    assert fig.layout.title.text == "Seats left empty"
    assert len({t.yaxis for t in fig.data}) == len(policies)  # one row per run
    names = {t.name for t in fig.data}
    assert names == {"running", "waiting", "seats (max_num_seqs = 4)"}
    listed = [t.name for t in fig.data if t.showlegend]
    assert sorted(listed) == sorted(names)  # each once in the legend
    assert fig.layout.xaxis3.title.text == "time (s)"
    seats = [t for t in fig.data if t.name.startswith("seats")]
    assert all(list(t.y) == [4, 4] for t in seats)


def test_queue_rows_share_one_time_range_and_one_requests_range(policies):
    fig = queue_figure(policies, max_num_seqs=4)
    first_arrival = min(min(r.arrival_times) for r in policies.values())
    last_end = max(counts_over_time(r)[0][-1] for r in policies.values())
    # The seat line runs to the end of the longest run in every row, not its own.
    seats = [t for t in fig.data if t.name.startswith("seats")]
    assert len(seats) == len(policies)
    assert all(list(t.x) == [first_arrival, last_end] for t in seats)
    assert list(fig.layout.xaxis.range) == [first_arrival, last_end]
    y_ranges = [tuple(fig.layout[f"yaxis{k if k > 1 else ''}"].range) for k in (1, 2, 3)]
    assert len(set(y_ranges)) == 1  # heights compare across rows
    tallest = max(max(t.y) for t in fig.data)
    assert y_ranges[0][0] == 0 and y_ranges[0][1] > tallest


def test_timeline_rows_are_named_as_the_step_log_names_requests(policies):
    fig = timeline_figure({"static": policies["static"]})
    assert list(fig.layout.yaxis.categoryarray) == [f"r{i}" for i in range(8)]
    assert "r0:P" in policies["static"].step_log()


def test_dynamic_batching_waits_before_its_first_step_and_the_counts_show_it(policies):
    dynamic = policies["dynamic"]
    first_start = dynamic.step_starts()[0]
    times, running, waiting = counts_over_time(dynamic)
    before = [i for i, t in enumerate(times[:-1]) if t < first_start]
    assert before, "the first request arrived before the first batch started"
    assert all(running[i] == 0 and waiting[i] > 0 for i in before)
    assert running[-1] == waiting[-1] == 0  # everyone done at the end
    # Never more running than seats, and the stacked top is running + waiting.
    assert max(running) <= 4
    fig = queue_figure({"dynamic": dynamic})
    running_trace, waiting_trace = fig.data
    assert list(waiting_trace.y) == [r + w for r, w in zip(running, waiting, strict=True)]
    assert list(waiting_trace.customdata) == waiting


def test_timeline_marks_preemptions_and_recomputes_only_where_they_happened(tiny_model):
    work = requests(num_requests=8, rate=40.0, max_output_len=24)
    tight = replay(tiny_llm(tiny_model, num_blocks=16), work)
    roomy = replay(tiny_llm(tiny_model), work)
    assert tight.metrics.num_preemptions > 0 and roomy.metrics.num_preemptions == 0
    fig = timeline_figure({"tight": tight, "roomy": roomy})
    marks = {t.name: t for t in fig.data if t.name in ("preempted", "recomputed")}
    assert set(marks) == {"preempted", "recomputed"}
    assert len(marks["preempted"].x) == tight.metrics.num_preemptions
    assert {t.yaxis for t in marks.values()} == {"y"}  # the tight run's row only
    listed = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(listed) == sorted({t.name for t in fig.data})
    # Every recompute comes after a preemption of the same request.
    preempted = list(zip(marks["preempted"].y, marks["preempted"].x, strict=True))
    for label, start in zip(marks["recomputed"].y, marks["recomputed"].x, strict=True):
        assert any(r == label and t <= start for r, t in preempted)


def test_sweep_figure_draws_one_panel_per_metric_and_one_line_per_sweep(tiny_model):
    work = requests()
    sweeps = {
        load: {
            t: replay(tiny_llm(tiny_model, scheduling="dynamic", batch_timeout=t), work)
            for t in (0.0, 0.2)
        }
        for load in ("a", "b")
    }
    reference = {"a": replay(tiny_llm(tiny_model), work)}
    metrics = {"e2e_p99": "E2E p99 (s)", "mean_batch_size": "mean batch"}
    fig = sweep_figure(sweeps, metrics, "batch_timeout (s)", reference, title="Timeouts")
    assert [a.text for a in fig.layout.annotations] == list(metrics.values())
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "batch_timeout (s)"
    lines = [t for t in fig.data if t.name in sweeps]
    assert len(lines) == len(sweeps) * len(metrics)
    assert list(lines[0].x) == [0.0, 0.2]
    assert list(lines[0].y) == [sweeps["a"][t].summary["e2e_p99"] for t in (0.0, 0.2)]
    dotted = [t for t in fig.data if t.name == "continuous, a"]
    assert len(dotted) == len(metrics) and dotted[0].line.dash == "dot"
    assert fig.layout.title.text == "Timeouts"


def test_the_ridge_is_where_arithmetic_outlasts_reading_the_weights():
    # An A100 does ~200 FLOPs per byte it reads; a token costs 1 FLOP per fp16 weight byte.
    ridge = ridge_tokens(A100)
    assert 190 <= ridge <= 215
    linear = LinearCost(
        base=0.05, per_prefill_token=1e-3, per_decode_seq=2e-3, per_context_token=0.0
    )
    assert ridge_tokens(linear) is None  # it pays for every token: no flat part
    fig = step_cost_figure({"A100": A100, "CPU": linear}, max_tokens=512, title="Cost")
    assert [a.text for a in fig.layout.annotations if a.text in ("A100", "CPU")] == ["A100", "CPU"]
    assert f"ridge: {ridge_tokens(A100, 512)} tokens" in [a.text for a in fig.layout.annotations]
    assert len(fig.layout.shapes) == 1  # the ridge line, on the A100 panel only
    assert fig.layout.yaxis.title.text == "step time (ms)"
    assert fig.layout.xaxis2.title.text == "tokens computed in the step"
    a100_line, cpu_line = fig.data
    assert a100_line.y[0] == pytest.approx(a100_line.y[5], rel=0.02)  # flat under the ridge
    assert cpu_line.y[-1] > 10 * cpu_line.y[0]


def test_budget_figure_puts_one_point_per_budget_at_ttft_against_the_longest_gap(tiny_model):
    chats = [[5] * 8 for _ in range(2)]
    work = TraceRequests(chats + [[7] * 300], [12, 12, 2], [0.0, 0.0, 0.02])
    runs = {
        b: replay(
            tiny_llm(
                tiny_model,
                max_num_batched_tokens=b,
                block_size=16,
                num_blocks=64,
                clock=StepCostClock(A100),
            ),
            work,
        )
        for b in (512, 64)
    }
    fig = budget_figure(runs, [0, 1], [2], decode_step_s=0.009, title="Budget")
    points = fig.data[0]
    assert list(points.text) == ["budget 512", "budget 64"]
    assert list(points.x) == [1e3 * runs[b].mean_ttft([2]) for b in runs]
    assert list(points.y) == [1e3 * runs[b].longest_token_gap([0, 1]) for b in runs]
    assert points.y[0] > points.y[1]  # the whole prompt stalls the decodes
    assert points.x[0] < points.x[1]  # chunks delay its first token
    assert list(fig.data[1].y) == [9.0, 9.0]
    assert "time to first token" in fig.layout.xaxis.title.text
    assert "longest gap" in fig.layout.yaxis.title.text


def test_longest_gap_and_mean_ttft_read_the_requests_metrics(policies):
    run = policies["continuous"]
    metrics = [o.metrics for o in run.outputs]
    assert run.longest_token_gap() == max(m.max_token_gap for m in metrics)
    assert run.longest_token_gap([1]) == metrics[1].max_token_gap
    assert run.mean_ttft([0, 2]) == pytest.approx((metrics[0].ttft + metrics[2].ttft) / 2)


def test_every_sweep_panel_starts_at_zero(policies):
    sweeps = {"a": {0.0: policies["static"], 0.1: policies["dynamic"]}}
    fig = sweep_figure(sweeps, {"e2e_p99": "E2E", "num_preemptions": "preemptions"}, "knob")
    assert fig.layout.yaxis.rangemode == fig.layout.yaxis2.rangemode == "tozero"


def recorded(model, mode):
    """A tight pool's replay with a PreemptionRecording, and the recording."""
    llm = tiny_llm(model, num_blocks=16, preemption_mode=mode, enable_prefix_caching=False)
    recording = PreemptionRecording(llm)
    work = requests(num_requests=8, rate=40.0, max_output_len=24)
    return replay(llm, work, on_step=recording.on_step), recording


def test_a_preemption_recording_keeps_and_labels_the_steps_around_each_preemption(tiny_model):
    result, recording = recorded(tiny_model, "recompute")
    frames, rest = recording.frames(result)
    steps = {s.step: s for s in result.metrics.steps}
    preempting = [s.step for s in result.metrics.steps if s.preempted]
    assert preempting and len(frames) < len(steps)  # only the steps that matter
    by_step = {f.step: f for f in frames}
    for step in preempting:
        assert "preempted: " in by_step[step].label and "blocks freed" in by_step[step].label
        assert step - 1 in by_step  # the pool before, the victim's blocks still held
    assert frames[rest].step == preempting[0]
    # The label counts the blocks the victim held the step before.
    first = frames[rest]
    victim = steps[first.step].preempted[0]
    seq_id = int(first.label.split("(seq ")[1].split(")")[0])
    held = sum(seq_id in b.seq_ids for b in frames[rest - 1].infos)
    assert first.label.startswith(f"r{[o.request_id for o in result.outputs].index(victim)} ")
    assert f"preempted: {held} blocks freed" in first.label and held > 0
    assert not any(seq_id in b.seq_ids for b in first.infos)  # its blocks are gone
    resumed = [f for f in frames if "resumed" in f.label]
    assert resumed and all(f.step > preempting[0] for f in resumed)
    view = recording.view(result, title="Out of blocks", weight_bytes=1000)
    assert view.slider.value == rest
    assert "Out of blocks: r" in view.page_map.title and "freed" in view.page_map.title


def test_a_swap_recording_says_swapped_out_and_in(tiny_model):
    result, recording = recorded(tiny_model, "swap")
    labels = [f.label for f in recording.frames(result)[0]]
    assert any("swapped out: " in label and "to CPU" in label for label in labels)
    assert any("swapped in" in label for label in labels)


def test_a_recording_without_preemptions_or_of_another_replay_is_refused(tiny_model):
    llm = tiny_llm(tiny_model)
    recording = PreemptionRecording(llm)
    result = replay(llm, requests(), on_step=recording.on_step)
    assert recording.frames(result) == ([], None)
    with pytest.raises(ValueError, match="nobody was preempted"):
        recording.view(result, title="none")
    other = replay(tiny_llm(tiny_model, max_num_seqs=1), requests())
    with pytest.raises(ValueError, match="steps but"):
        recording.frames(other)
