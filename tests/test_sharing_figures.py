"""Lab 06's pictures (``kvlab.widgets.sharing_figures``), built from small inputs.

Each figure must draw what its lab cell says it draws: the traces, the title that says what
to see, axes with units. The recordings must label what happened and animate.
"""

from __future__ import annotations

import pytest

from kvlab import LLM, SamplingParams
from kvlab.cache import PagedKVCache
from kvlab.engine.metrics import ManualClock, RunMetrics, StepStats
from kvlab.engine.step_cost import Roofline
from kvlab.measure.step_cost import PreemptionCost, preemption_costs
from kvlab.memory import preset
from kvlab.widgets import StepView
from kvlab.widgets.sharing_figures import (
    PoolRecording,
    block_size_figure,
    crossover_figure,
    first_swap_win,
    preemption_figure,
    replay_requests,
    seconds_by_kind,
    speedup_figure,
    step_label,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def stats(step: int, prefill: int = 0, decode: int = 0, **events) -> StepStats:
    """A StepStats with the fields the figures read; the rest neutral."""
    fields = dict(admitted=(), finished=(), preempted=(), swapped_out=(), swapped_in=())
    fields.update(events)
    return StepStats(
        step=step,
        time=float(step),
        scheduled_ids=(),
        scheduled_samples=(),
        scheduled_num_tokens=(),
        num_prefill_tokens=prefill,
        num_decode_tokens=decode,
        num_blocks_swapped=0,
        num_blocks_prefetched=0,
        num_running=0,
        num_waiting=0,
        num_swapped=0,
        kv_usage=0.0,
        kv_utilization=1.0,
        num_free_blocks=0,
        **fields,
    )


def test_step_label_names_arrivals_and_finishes_once_per_request():
    assert step_label(stats(3)) == "step 3"
    assert step_label(stats(0, admitted=("0",))) == "step 0: request 0 arrives"
    # n samples of one request share its id: named once.
    both = stats(7, admitted=("2", "3"), finished=("0", "0", "0"))
    assert step_label(both) == "step 7: requests 2, 3 arrive; request 0 finishes"


def test_speedup_figure_draws_one_line_against_the_output_length():
    fig = speedup_figure([1, 8, 64], [2.5, 2.0, 1.2], hit_rate=0.649)
    assert len(fig.data) == 1
    assert list(fig.data[0].x) == [1, 8, 64] and list(fig.data[0].y) == [2.5, 2.0, 1.2]
    assert "65% hit rate" in fig.layout.title.text
    assert fig.layout.xaxis.type == "log" and "output tokens" in fig.layout.xaxis.title.text
    assert "speed-up (x)" in fig.layout.yaxis.title.text
    assert [shape.y0 for shape in fig.layout.shapes] == [1]  # the "no gain" line


def test_preemption_figure_marks_preemptions_and_comebacks():
    steady = RunMetrics(steps=[stats(0, prefill=40), stats(1, decode=4), stats(2, decode=4)])
    preempting = RunMetrics(
        steps=[
            stats(0, prefill=40),
            stats(1, decode=3, preempted=("3",), swapped_out=("3",)),
            stats(2, decode=1, swapped_in=("3",)),
            stats(3, prefill=20),
        ]
    )
    fig = preemption_figure({"no preemption": steady, "swap": preempting})
    names = [(t.name, t.showlegend) for t in fig.data]
    assert names == [
        ("prefill tokens", True),
        ("decode tokens", True),
        ("prefill tokens", False),
        ("decode tokens", False),
    ]
    texts = [a.text for a in fig.layout.annotations]
    assert "no preemption" in texts and "swap" in texts  # the subplot titles
    assert "req 3 preempted, swapped out" in texts
    assert "req 3 swapped in" in texts
    assert "resumed: a 20-token prefill" in texts
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.title.text == "tokens"
    assert fig.layout.xaxis2.title.text == "engine step"


def test_crossover_figure_marks_where_swapping_wins():
    llama = preset("llama-2-7b")
    lengths = list(range(256, 4097, 256))
    tables = {
        "A100-40GB": preemption_costs(Roofline.of(llama, "a100-40gb"), lengths),
        "never": [PreemptionCost(n, swap_s=1.0, recompute_s=0.5) for n in lengths],
    }
    cross = first_swap_win(tables["A100-40GB"])
    assert cross is not None and first_swap_win(tables["never"]) is None
    fig = crossover_figure(tables)
    assert [t.name for t in fig.data] == ["recompute", "swap out and back in"] * 2
    assert [t.showlegend for t in fig.data] == [True, True, False, False]
    assert f"A100-40GB: swap from {cross:,} tokens" in fig.layout.title.text
    assert "never: recompute up to 4,096" in fig.layout.title.text
    assert [shape.x0 for shape in fig.layout.shapes] == [cross]  # one dotted line, A100 only
    assert fig.layout.xaxis.title.text == "tokens the preempted sequence holds"
    assert fig.layout.yaxis.title.text == "extra time of the step (ms)"


def test_block_size_figure_hatches_the_sizes_where_swapping_never_wins():
    fig = block_size_figure(
        {"bytes only": {16: 1152, 64: 1152}, "+ 5 us": {16: None, 64: 3648}}, 8192
    )
    assert [t.name for t in fig.data] == ["bytes only", "+ 5 us"]
    hatched = fig.data[1]
    assert list(hatched.y) == [8192, 3648]
    assert list(hatched.marker.pattern.shape) == ["/", ""]
    assert list(hatched.text) == ["never to 8,192", "3,648"]
    assert fig.layout.xaxis.title.text == "block size (tokens)"
    assert "tokens" in fig.layout.yaxis.title.text


def test_replay_requests_names_adopted_and_evicted_blocks():
    # 4 blocks of 4 tokens; each prompt is 2 full blocks and 1 token (3 blocks).
    cache = PagedKVCache(1, 1, 2, num_blocks=4, block_size=4, device="cpu")
    a, b = list(range(9)), list(range(100, 109))
    snapshots, cached = replay_requests(cache, [(0, "A", a), (1, "B", b), (0, "A again", a)])
    assert cached == [0, 0, 4]  # A's first block survived B; its second did not
    labels = [s.label for s in snapshots]
    assert labels[0] == "A asks: adopts nothing"
    assert labels[1] == "A done: blocks 0, 1, 2 freed, 2 of them cached"
    assert labels[2].startswith("B asks: adopts nothing, evicts block")
    assert labels[4].startswith("A again asks: adopts block 0")
    assert [s.step for s in snapshots] == list(range(6))


def test_pool_recording_labels_every_step_and_animates():
    llm = LLM("tiny", block_size=4, num_blocks=32, clock=ManualClock(1.0), device="cpu")
    recording = PoolRecording(llm)
    prompt = list(range(3, 14))  # two full blocks and a partial one
    llm.generate(
        [prompt, prompt],
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        use_tqdm=False,
        on_step=recording,
        arrival_times=[0, 1],
    )
    labels = [s.label for s in recording.snapshots]
    assert labels[0] == "step 0: request 0 arrives"
    assert labels[1] == "step 1: request 1 arrives"
    assert len(recording.snapshots) == len(llm.metrics.steps)
    shared = [b for b in recording.snapshots[1].infos if b.ref_cnt == 2]
    assert len(shared) == 2  # request 1 adopted request 0's two full blocks
    view = recording.view("hits", step=1)
    assert isinstance(view, StepView) and "step 1: request 1 arrives" in view.page_map.title
    assert view.to_animation().num_frames == len(recording.snapshots)


def test_seconds_by_kind_splits_a_run_into_prefill_and_decode_steps():
    run = RunMetrics(
        steps=[stats(0, prefill=40), stats(1, decode=4), stats(2, decode=4)], start_time=-0.5
    )
    # Step k ends at time k: the prefill step took 0.5 s, the decode steps 1 s each.
    assert seconds_by_kind(run) == {"prefill": (1, 40, 0.5), "decode": (2, 8, 2.0)}
    mixed = RunMetrics(steps=[stats(0, prefill=40, decode=3)], start_time=-1.0)
    with pytest.raises(ValueError, match="step 0 computed prefill and decode tokens"):
        seconds_by_kind(mixed)
