"""Lab 02's pictures: who waits for a range, and where a contiguous pool's slots go.

The run under test, counted by hand: an arena of 26 slots, policy ``exact``, three requests
of 4 new tokens each (no EOS), reserving 10, 10 and 12 slots and arriving at steps 0, 1
and 3. Request 0 ends after step 3 and leaves a 10-slot hole at the front; with the 6-slot
tail, 16 slots are free, but request 2 needs 12 in one range, so it waits. Request 1 ends
after step 4, the holes merge, and request 2 starts at step 5, at slot 0.
"""

from __future__ import annotations

import io
from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import random_prompts
from PIL import Image

from kvlab.cache import ContiguousKVCache
from kvlab.labs import Recording, waiting_at
from kvlab.measure.experiments import Fragmentation
from kvlab.measure.serve import serve
from kvlab.model.runner import ModelRunner
from kvlab.widgets.contiguous_figures import (
    PARTS,
    ArenaStepView,
    Queue,
    _waits,
    arena_step_view,
    queue_svg,
    queues,
    slots_over_time_figure,
    split_figure,
    step_labels,
)

SIZES = [10, 10, 12]  # exact reservations: prompt + 4 new tokens


@pytest.fixture(scope="module")
def run(tiny, one_thread):
    cache = ContiguousKVCache(2, 2, 16, 26, "exact", device="cpu", cell_size=2)
    recording = Recording(request_size=SIZES[2], arena=True)
    prompts = random_prompts(256, [6, 6, 8])
    result = serve(ModelRunner(tiny), cache, prompts, 4, arrival_steps=[0, 1, 3], on_step=recording)
    return recording, result


def test_an_arena_recording_keeps_holes_ranges_and_placements(run):
    recording, result = run
    assert result.start_steps == [0, 1, 5]
    assert recording.holes[3] == [(0, 10), (20, 6)]  # request 0's hole and the tail
    assert recording.ranges[3] == {1: (10, 10)}
    assert recording.holes[4] == [(0, 26)]  # request 1 ended: one hole
    assert recording.placements() == {0: (0, 10), 1: (10, 10), 2: (0, 12)}
    with pytest.raises(ValueError, match="arena=True"):
        Recording().placements()


def test_a_request_waits_from_its_arrival_until_the_step_before_it_starts(run):
    _, result = run
    assert [waiting_at(result, step) for step in range(7)] == [[], [], [], [2], [2], [], []]


def test_each_step_is_labelled_with_who_ended_who_was_placed_and_who_waits(run):
    recording, result = run
    labels = step_labels(recording, result, SIZES)
    assert labels[0] == "step 0"  # the first requests' places are on the map
    assert labels[1] == "step 1: request 1 placed at 10-19"
    assert labels[2] == "step 2"
    assert labels[3] == (
        "step 3: request 0 ended; request 2 waits: needs 12 in one range, largest hole 10"
    )
    assert labels[4] == "step 4: request 1 ended; request 2 fits, starts next step"
    assert labels[5] == "step 5: request 2 placed at 0-11"
    assert labels[-1] == "step 8: request 2 ended"


def test_a_step_places_before_it_frees_so_its_label_says_so():
    """One step placed request 2 and ended request 1 (the engine schedules first and frees
    finished requests at the step's end): the label lists them in that order."""
    recording = Recording(arena=True)
    for step, ranges, holes in [
        (0, {0: (0, 4), 1: (4, 4)}, [(8, 8)]),
        (1, {0: (0, 4), 2: (8, 6)}, [(4, 4), (14, 2)]),
    ]:
        recording.snapshots.append(SimpleNamespace(step=step))
        recording.ranges.append(ranges)
        recording.holes.append(holes)
    result = SimpleNamespace(refused={}, arrival_steps=[0, 0, 1], start_steps=[0, 0, 1])
    labels = step_labels(recording, result, [4, 4, 6])
    assert labels == ["step 0", "step 1: request 2 placed at 8-13; request 1 ended"]


def test_behind_the_first_in_line_the_others_only_wait():
    both = Queue(((4, 512), (5, 512)), ())
    assert _waits(both) == ["requests 4, 5 wait: largest hole 0"]
    assert both.verdict() == "too few free slots"
    first_fits = Queue(((4, 512), (5, 512)), ((0, 512),))
    assert _waits(first_fits) == ["request 4 fits, starts next step", "request 5 waits"]
    assert first_fits.verdict() == "a hole fits"
    stranded = Queue(((2, 12),), ((0, 10), (20, 6)))
    assert stranded.verdict() == "no hole fits: external fragmentation"
    assert _waits(Queue((), ((0, 26),))) == []


def test_labels_need_an_arena_recording_and_a_run_that_refused_none(run):
    recording, result = run
    with pytest.raises(ValueError, match="arena=True"):
        queues(Recording(), result, SIZES)
    refused = replace(result, refused={3: "too long"})
    with pytest.raises(ValueError, match="refused no request"):
        step_labels(recording, refused, SIZES)


def test_the_view_draws_the_waiting_request_beside_the_holes(run):
    recording, result = run
    view = arena_step_view(recording, result, SIZES, "exact, 26 slots", 1000, step=3)
    assert isinstance(view, ArenaStepView) and view.queue_view in view.children
    text = repr(view)
    assert "exact, 26 slots: step 3: request 0 ended; request 2 waits" in text
    assert "waiting for a range: request 2 (12 slots); free holes: 10 + 6" in text
    svg = view.to_svg()
    assert "request 2 needs" in svg and "16 free, no hole fits: external fragmentation" in svg
    assert "request 2 needs" in view.queue_view.value  # the live view shows it too
    view.show(6)  # request 2 runs: nobody waits
    assert "no request waits for a range" in view.to_svg()
    animation = view.to_animation()
    assert animation.num_frames == len(recording.snapshots)
    assert Image.open(io.BytesIO(animation.png)).n_frames == animation.num_frames
    assert view.slider.value == 6  # drawing the frames leaves the view where it was


def test_the_queue_strip_keeps_its_height_whoever_waits():
    nobody = queue_svg(Queue((), ((0, 26),)), 26)
    one = queue_svg(Queue(((2, 12),), ((0, 10), (20, 6))), 26)
    height = 'height="68"'
    assert height in nobody and height in one
    assert "free holes: 10 + 6" in one and one.count("<rect") == 1 + 3  # background, 3 bars
    three_rows = queue_svg(Queue((), ()), 26, rows=3)
    assert 'height="90"' in three_rows  # room for two waiting requests and the holes


def test_a_view_needs_one_queue_per_snapshot(run):
    recording, _ = run
    with pytest.raises(ValueError, match="give one each"):
        ArenaStepView(recording.snapshots, [], title="x")


def split(used, reservation, internal, external, capacity=100):
    return Fragmentation(capacity, used, internal, external, 8, reservation)


def test_the_split_figure_stacks_the_papers_four_kinds_and_free():
    fig = split_figure({"a": split(10, 5, 80, 0), "b": split(20, 5, 5, 10)}, title="what to see")
    assert [t.name for t in fig.data] == [name for name, _ in PARTS.values()]
    assert list(fig.data[0].x) == [10.0, 20.0] and list(fig.data[-1].x) == [5.0, 60.0]
    assert fig.layout.barmode == "stack" and fig.layout.title.text == "what to see"
    assert fig.layout.xaxis.title.text == "share of the KV pool's slots (%)"
    assert fig.layout.yaxis.title.text == "policy"
    with pytest.raises(ValueError, match="splits is empty"):
        split_figure({}, title="x")


def test_the_split_figure_leaves_out_a_part_no_policy_has():
    fig = split_figure({"a": split(10, 5, 80, 0), "b": split(20, 5, 5, 0)}, title="t")
    assert "external fragmentation" not in [t.name for t in fig.data]
    assert len(fig.data) == len(PARTS) - 1


def test_over_time_external_counts_only_while_a_request_waits():
    history = [split(10, 0, 0, 30), split(10, 0, 0, 30), split(10, 0, 0, 30)]
    fig = slots_over_time_figure(history, [[], [4], [4]], title="holes")
    external = next(t for t in fig.data if t.name == "external fragmentation")
    free = next(t for t in fig.data if t.name == "free")
    assert list(external.y) == [0, 30, 30] and list(free.y) == [90, 60, 60]
    (shade,) = fig.layout.shapes
    assert (shade.x0, shade.x1) == (1, 3)  # steps 1 and 2, each drawn one step wide
    assert shade.fillcolor and shade.line.width == 0  # shaded, as the annotation says
    assert fig.layout.annotations[0].text == "request 4 waits (shaded)"
    assert fig.layout.xaxis.title.text == "step" and fig.layout.yaxis.title.text == "slots"
    with pytest.raises(ValueError, match="give one each"):
        slots_over_time_figure(history, [[]], title="x")
