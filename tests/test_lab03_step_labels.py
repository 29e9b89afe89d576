"""Lab 03's step labels: what each step of a paged run did, in the order the engine does it.

The run under test, counted by hand: a pool of 6 blocks of 4 slots, prefix caching off,
three requests of 4 new tokens each (no EOS). Requests 0 and 1 (prompts of 5 and 3 tokens)
arrive at step 0 and take blocks 0 and 1, and 2. Request 1 feeds its 5th token at step 2
and takes block 3. Request 2 (a 6-token prompt) arrives at step 3 and starts in blocks 4
and 5, the step in which requests 0 and 1 end: the label names the start first, because a
step gives out blocks before it frees those of the requests that finished.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import random_prompts

from kvlab.cache import PagedKVCache
from kvlab.labs import Recording, block_step_labels
from kvlab.measure.serve import serve
from kvlab.model.runner import ModelRunner


@pytest.fixture(scope="module")
def run(tiny, one_thread):
    cache = PagedKVCache(2, 2, 16, 6, block_size=4, device="cpu", enable_prefix_caching=False)
    recording = Recording(tables=True)
    prompts = random_prompts(256, [5, 3, 6])
    result = serve(ModelRunner(tiny), cache, prompts, 4, arrival_steps=[0, 0, 3], on_step=recording)
    return recording, result


def test_each_step_says_who_started_where_who_grew_and_who_ended(run):
    recording, result = run
    assert recording.tables[2] == {0: [0, 1], 1: [2, 3]}
    assert block_step_labels(recording, result) == [
        "step 0: requests 0, 1 started",  # the first requests: the map shows where
        "step 1",
        "step 2: request 1 took block 3",
        "step 3: request 2 started in blocks 4, 5; request 0 ended; request 1 ended",
        "step 4",
        "step 5",
        "step 6: request 2 ended",
    ]


def test_the_view_titles_each_step_with_its_label(run):
    recording, result = run
    labels = block_step_labels(recording, result)
    view = recording.view("paged", 1000, step=3, labels=labels)
    assert f"paged: {labels[3]}" in repr(view)
    with pytest.raises(ValueError, match="give one each"):
        recording.view("paged", 1000, labels=labels[:1])


def test_labels_need_a_recording_of_the_tables(run):
    _, result = run
    with pytest.raises(ValueError, match="tables=True"):
        block_step_labels(Recording(), result)


def test_a_request_that_has_arrived_but_not_started_waits():
    recording = Recording(tables=True)
    for step, tables in enumerate([{0: [0, 1]}, {0: [0, 1, 2]}, {1: [2, 1]}]):
        recording.snapshots.append(SimpleNamespace(step=step))
        recording.tables.append(tables)
    result = SimpleNamespace(arrival_steps=[0, 1], start_steps=[0, 2])
    assert block_step_labels(recording, result) == [
        "step 0: request 0 started in blocks 0, 1",
        "step 1: request 0 took block 2; request 1 waits",
        "step 2: request 1 started in blocks 2, 1; request 0 ended",
    ]
