"""The build-its' failing cases replayed on the page map (labs 02, 03, 06): the shortest
case the check prints, call by call, on the learner's own state, resting on the broken
call."""

from __future__ import annotations

import base64
import io

import pytest
from test_build_block_manager import FreeIgnoresRefCnt, Right, SlotIsPosition, Stub

from kvlab.exercises.build_arena import CRITERIA
from kvlab.widgets.failure_replay import FailureReplay, replay_failure

pytestmark = pytest.mark.usefixtures("one_thread")


def frames_of(bundle: dict) -> int:
    """The number of frames of the animated PNG in a notebook output."""
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(bundle["image/png"]))).n_frames


def test_nothing_to_replay_before_the_methods_exist_or_once_every_property_holds():
    stub = replay_failure(Stub)
    assert repr(stub) == "Nothing to replay yet: allocate_slots() is not written yet."
    assert stub._repr_mimebundle_() == ({"text/plain": repr(stub)}, {})
    assert repr(replay_failure(Right)).startswith("Nothing to replay: every property holds")


def test_a_freed_shared_block_is_replayed_up_to_the_free_that_breaks_ref_cnt():
    replay = replay_failure(FreeIgnoresRefCnt)
    assert isinstance(replay, FailureReplay)
    text = repr(replay)
    assert text.startswith("ref_cnt counts the tables holding each block")
    assert "step 2: fork(seq 0 -> seq 2)" in text and "step 3: free(seq 2)" in text
    view = replay.view
    assert view.slider.value == len(view.snapshots) - 1 == 3  # rests on the broken call
    last = {info.block_id: info for info in view.snapshots[-1].infos}
    assert last[11].seq_ids == (0,)  # the parent still holds the block the free gave back
    bundle, _ = replay._repr_mimebundle_()
    assert frames_of(bundle) == 4 and bundle["text/plain"] == text  # every call, animated


def test_a_wrong_slot_mapping_breaks_at_its_first_call():
    replay = replay_failure(SlotIsPosition)
    assert len(replay.view.snapshots) == 2 == frames_of(replay._repr_mimebundle_()[0])
    assert "slot = block_table[pos // block_size] * block_size" in repr(replay)


def test_lab_02_an_arena_that_overlaps_ranges_is_replayed_slot_by_slot():
    from test_build_arena import Overlapping
    from test_build_arena import Stub as ArenaStub

    assert repr(replay_failure(ArenaStub)) == "Nothing to replay yet: holes() is not written yet."
    replay = replay_failure(Overlapping)
    assert repr(replay).startswith(CRITERIA["holes"])  # the only criterion it breaks
    view = replay.view
    assert view.slider.value == len(view.snapshots) - 1 >= 1
    assert len(view.snapshots[-1].infos) == 64 and view.snapshots[-1].block_size is None
    assert frames_of(replay._repr_mimebundle_()[0]) == len(view.snapshots)


def test_lab_06_a_pool_that_never_chains_its_hashes_is_replayed_on_the_pool():
    from test_build_prefix_cache import Right as PoolRight
    from test_build_prefix_cache import Stub as PoolStub
    from test_build_prefix_cache import UnchainedHashes

    assert repr(replay_failure(PoolStub)) == "Nothing to replay yet: allocate() is not written yet."
    assert repr(replay_failure(PoolRight)).startswith("Nothing to replay: every property holds")
    replay = replay_failure(UnchainedHashes)
    assert repr(replay).startswith("match_prefix")
    last = replay.view.snapshots[-1]
    assert any(info.cached for info in last.infos)  # the pool's cached blocks are drawn


def test_a_class_of_no_build_it_is_refused():
    with pytest.raises(TypeError, match="none of the build-its replay_failure draws"):
        replay_failure(int)


def test_a_failure_only_a_fixed_probe_finds_is_named_not_called_correct():
    """The check runs fixed cases beside its random ones (several plain blocks freed at
    once); the replay runs the same ones, so it does not say every property holds."""
    from test_build_prefix_cache import PlainBlocksReversed

    text = repr(replay_failure(PlainBlocksReversed))
    assert text.startswith("free_queue: plain blocks at the front") and "broken" in text
    assert "after free([0, 1, 2]) free_queue is [2, 1, 0, 3]" in text


def test_no_likely_line_where_the_grader_names_no_misconception():
    from test_build_arena import FromTheTop

    text = repr(replay_failure(FromTheTop))
    assert text.startswith(CRITERIA["first_fit"]) and "placed at slot 63" in text
    assert "likely:" not in text


def test_with_two_bugs_the_replay_rests_on_the_call_that_breaks_the_criterion_named():
    # Its holes() lists the tail twice (wrong from the first reserve on), and its reserve
    # refuses an exact fit, which first shows at the fourth call: the verdict is first_fit,
    # so the replay goes on past the holes difference to that call.
    from test_build_arena import StrictlyLongerTailTwice

    replay = replay_failure(StrictlyLongerTailTwice)
    assert repr(replay).startswith(f"{CRITERIA['first_fit']}: broken at step 4")
    assert replay.view.slider.value == len(replay.view.snapshots) - 1 == 4


def test_lab_06_a_pool_whose_counts_and_holders_disagree_says_so_instead_of_raising():
    """The page map refuses a block whose ref_cnt says free while a sequence holds it; the
    replay draws the pool up to the call before and names the contradiction there."""
    from test_build_prefix_cache import AllocateSetsNoHolder, FreeDropsEveryHolder

    replay = replay_failure(AllocateSetsNoHolder)
    text = repr(replay)
    assert text.startswith("ref_cnt counts holders") and "broken at step 1" in text
    assert "step 1: add seq 9 with prompt [5]: not drawn, the pool contradicts itself: " in text
    assert "block 0 has ref_cnt 0 but seq_ids (9,)" in text
    assert len(replay.view.snapshots) == 1  # the empty pool: step 1 cannot be drawn
    later = repr(replay_failure(FreeDropsEveryHolder))
    assert "broken at step 5" in later and "step 5: " in later and "not drawn" in later
