"""Lab 06's pictures (``kvlab.widgets.sharing_figures``), built from small inputs.

Each figure must draw what its lab cell says it draws: the traces, the title that says what
to see, axes with units. The recordings must label what happened and animate.
"""

from __future__ import annotations

import pytest

from kvlab import LLM, SamplingParams
from kvlab.cache.block_pool import BlockPool
from kvlab.engine.metrics import ManualClock, RunMetrics
from kvlab.engine.step_cost import Roofline
from kvlab.engine.step_stats import StepStats
from kvlab.measure.step_cost import PreemptionCost, preemption_costs
from kvlab.memory import preset
from kvlab.widgets import StepView
from kvlab.widgets.sharing_figures import (
    AllToTheBackPool,
    FreeQueue,
    PoolRecording,
    QueueStepView,
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


def test_step_label_names_arrivals_adoptions_copies_and_finishes_by_seq():
    assert step_label(3, {0: (0, 1)}, {0: (0, 1)}) == "step 3"
    assert step_label(0, {}, {0: (0, 1)}) == "step 0: seq 0 arrives"
    # A forked request's samples arrive together, sharing its blocks: one phrase.
    assert step_label(0, {}, {s: (0, 1) for s in range(4)}) == "step 0: seqs 0, 1, 2, 3 arrive"
    # Seq 1 arrives on seq 0's hashed blocks 0 and 1, and takes block 4 of its own.
    hit = step_label(2, {0: (0, 1, 2)}, {0: (0, 1, 2), 1: (0, 1, 4)}, hashed={0, 1})
    assert hit == "step 2: seq 1 arrives, adopts blocks 0, 1"
    # Copy-on-write: three of four seqs get their own copy of shared block 6.
    before = {s: (5, 6) for s in range(4)}
    after = {0: (5, 7), 1: (5, 8), 2: (5, 9), 3: (5, 6)}
    assert step_label(1, before, after) == "step 1: block 6 copied to 7, 8, 9 (seqs 0, 1, 2)"
    assert step_label(9, before, {}) == "step 9: seqs 0, 1, 2, 3 finish"
    assert step_label(9, {2: (1,)}, {}, preempted=True) == "step 9: seq 2 leaves"


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
    # The hatched bar is a trace of its own, in its series' slot, so the legend names it.
    assert [t.name for t in fig.data] == [
        "bytes only",
        "+ 5 us",
        "+ 5 us: never up to 8,192 (hatched)",
    ]
    solid, hatched = fig.data[1], fig.data[2]
    assert list(solid.x) == ["64"] and list(solid.y) == [3648]
    assert list(hatched.x) == ["16"] and list(hatched.y) == [8192]
    assert hatched.marker.pattern.shape == "/" and solid.offsetgroup == hatched.offsetgroup
    assert list(hatched.text) == ["never to 8,192"]
    assert list(fig.layout.xaxis.categoryarray) == ["16", "64"]
    assert fig.layout.xaxis.title.text == "block size (tokens)"
    assert "tokens" in fig.layout.yaxis.title.text


def test_replay_requests_names_adopted_taken_and_evicted_blocks():
    # 4 blocks of 4 tokens; each prompt is 2 full blocks and 1 token (3 blocks).
    a, b = list(range(9)), list(range(100, 109))
    replay = replay_requests([(0, "A", a), (1, "B", b), (0, "A again", a)], 4, 4)
    assert replay.cached_tokens == (0, 0, 4)  # A's first block survived B; its second did not
    assert replay.hit_rate == pytest.approx(4 / 27)
    labels = [s.label for s in replay.snapshots]
    assert labels[0] == "A asks: takes never-used blocks 0, 1, 2"
    assert labels[1] == "A done: blocks 2, 1, 0 freed, last first; 2 of them cached"
    # B takes A's plain last block and the block never used, then evicts A's second block
    # (freed before its first: least recently used).
    assert labels[2] == "B asks: takes plain block 2, takes never-used block 3, evicts block 1"
    assert labels[4] == "A again asks: adopts block 0, takes plain block 1, evicts block 3"
    assert [s.step for s in replay.snapshots] == list(range(6))
    assert replay.queues[1].blocks == (
        (2, "plain"),
        (3, "never used"),
        (1, "cached"),
        (0, "cached"),
    )
    assert replay.queues[1].describe() == (
        "free queue, front first: plain 2; never used 3; cached 1, 0"
    )


def test_all_to_the_back_pool_keeps_one_queue_in_the_order_freed():
    pool, old = BlockPool(5), AllToTheBackPool(5)
    for p in (pool, old):
        p.allocate(3)  # blocks 0, 1, 2
        p.cache(0, 100)
        p.free([2, 1, 0])  # as a sequence frees its blocks: last first
    assert pool.free_block_ids() == [2, 1, 3, 4, 0]  # plain to the front, hashed to the back
    assert old.free_block_ids() == [3, 4, 2, 1, 0]  # every freed block to the back
    with pytest.raises(ValueError, match="double free"):
        old.free([0])


def test_the_old_single_queue_evicts_what_vllms_rule_keeps():
    # Three prompts of 2 full blocks and 1 token each, asked twice, in a pool of 7 (lab 06's
    # eviction run in small): with one queue, the plain blocks wait behind cached ones.
    a, b, c = list(range(9)), list(range(100, 109)), list(range(200, 209))
    requests = [(0, "A", a), (1, "B", b), (2, "C", c)] * 2
    assert replay_requests(requests, 7, 4).cached_tokens == (0, 0, 0, 8, 8, 8)
    assert replay_requests(requests, 7, 4, AllToTheBackPool).cached_tokens == (0, 0, 0, 4, 4, 4)


def test_queue_step_view_draws_the_free_queue_in_every_frame():
    a = list(range(9))
    replay = replay_requests([(0, "A", a), (1, "B", list(range(100, 109)))], 4, 4)
    view = replay.view("queue", step=1)
    assert isinstance(view, QueueStepView) and not view.with_gauge
    assert view.children[-1] is view.queue_view  # the strip is under the map
    assert "free queue, front first: plain 2; never used 3; cached 1, 0" in repr(view)
    svg = view.to_svg()
    assert ">front<" in svg and ">back<" in svg and "taken first" in svg
    assert [f">{b}</text>" in svg for b in (2, 3, 1, 0)] == [True] * 4
    frames = view.frame_svgs([0, 3])
    assert "never used 3" in frames[0] and "free queue, front first" in frames[1]
    assert view.to_animation().num_frames == len(replay.snapshots)
    with pytest.raises(ValueError, match="1 queues for 4 snapshots"):
        QueueStepView(list(replay.snapshots), [FreeQueue(())])
    assert FreeQueue(()).describe() == "free queue: empty (every block is held)"


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
    assert labels[0] == "step 0: seq 0 arrives"
    assert labels[1] == "step 1: seq 1 arrives, adopts blocks 0, 1"
    assert len(recording.snapshots) == len(llm.metrics.steps)
    shared = [b for b in recording.snapshots[1].infos if b.ref_cnt == 2]
    assert len(shared) == 2  # request 1 adopted request 0's two full blocks
    view = recording.view("hits", step=1)
    assert isinstance(view, StepView) and "step 1: seq 1 arrives" in view.page_map.title
    assert not view.with_gauge
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
