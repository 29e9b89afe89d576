"""Build it (lab 02): a first-fit arena of your own, checked, then run inside the engine.

The learner writes three methods of a contiguous arena (the stub is in lab 02): first-fit
``reserve(seq_id, num_slots) -> start``, ``free(seq_id)`` and ``holes() -> [(start, length),
...]``; ``CRITERIA`` says what each must do, the third hint how.

``check_arena(MyArena)`` grades it (``grading.BuildIt``): seeded random reserves and frees
on the learner's arena and on kvlab's ``ContiguousArena`` side by side (``arena_grader``);
then SmolLM2 (or any model) generates through ``ContiguousKVCache`` with the learner's arena
placing every range, and the tokens must equal kvlab's own run, which equals Hugging Face
``generate`` (the oracle of ``tests/test_cache_equivalence.py``).

    hint_arena(1), hint_arena(2), ...   help in steps, from a nudge to the algorithm
    reveal_arena()                      kvlab's own reserve, free and holes

Not handled: partial credit within a criterion; grading anything but the three methods.
"""

from __future__ import annotations

from kvlab.cache.contiguous_arena import ContiguousArena, Range
from kvlab.exercises import arena_grader as grader
from kvlab.exercises.grading import (
    BuildIt,
    Replay,
    Report,
    Search,
    Verdict,
    check_calls,
    different_requests,
    model_and_prompts,
    one_torch_thread,
)

CRITERIA = {
    "written": "reserve, free and holes run (none raises NotImplementedError)",
    "first_fit": "reserve returns the start of the first hole that is long enough",
    "refuses": "reserve raises CacheFullError exactly when no hole is long enough",
    "refusal_changes_nothing": "a refused reserve leaves every hole as it was",
    "holes": "holes() lists every free run once: merged, in address order",
    "generation": "real requests through the engine give the tokens of Hugging Face",
}

HINTS = (
    "Keep the reserved ranges sorted by their start: the holes are what lies between them.",
    "holes(): walk the sorted ranges with a cursor at slot 0. A range that starts after "
    "the cursor leaves the hole (cursor, start - cursor); move the cursor to its end. "
    "After the last range, the tail (cursor, num_slots - cursor) is a hole if not empty.",
    """The whole algorithm, over self.ranges (seq_id -> (start, length)):
1. holes(): cursor = 0; for (start, length) in sorted(self.ranges.values()): if start >
   cursor, the hole (cursor, start - cursor) is free; then cursor = start + length.
2. After the loop, if cursor < num_slots, (cursor, num_slots - cursor) is a hole too.
3. reserve(seq_id, num_slots): for (start, length) in holes(), the first with
   length >= num_slots wins: self.ranges[seq_id] = (start, num_slots); return start.
4. No hole long enough: raise CacheFullError before changing anything.
5. free(seq_id): del self.ranges[seq_id]; the next holes() merges the neighbours itself.""",
)

WRITTEN_CALLS = (("holes", ()), ("reserve", (0, 4)), ("holes", ()), ("free", (0,)), ("holes", ()))
ARENA = BuildIt(
    CRITERIA,
    HINTS,
    stuck="Stuck? hint_arena(1), then 2 and 3; print(reveal_arena()) shows kvlab's own.",
    written=lambda cls: check_calls(lambda: cls(grader.NUM_SLOTS), WRITTEN_CALLS, "arena"),
    search=Search(grader.first_difference, grader.candidates, grader.random_ops, grader.show_op),
    reveal_sources=lambda: (
        ContiguousArena.reserve,
        ContiguousArena.holes,
        ContiguousArena.free,
        ContiguousArena._first_fit,
    ),
    replay=Replay(
        "reserve", "your arena, slot by slot", grader.ArenaRun.of, grader.run, grader.view
    ),
)
hint_arena, reveal_arena = ARENA.hint, ARENA.reveal


def check_arena(
    arena_class, model=None, num_sequences: int = 300, seed: int = 0, prompts=None
) -> Report:
    """``ARENA.check`` of ``arena_class(num_slots)`` on ``num_sequences`` seeded random
    sequences; the last criterion serves ``prompts`` (default: the chat questions) on
    ``model`` (default: SmolLM2-135M)."""
    return ARENA.check(
        arena_class, lambda: check_generation(arena_class, model, prompts), num_sequences, seed
    )


def check_generation(arena_class, model, prompts) -> Verdict:
    """Serve prompts with the learner's arena placing every range, against kvlab's own."""
    from kvlab.cache.contiguous import ContiguousKVCache
    from kvlab.measure.serve import serve
    from kvlab.memory import KVSpec
    from kvlab.model.runner import ModelRunner

    model, prompts = model_and_prompts(model, prompts)
    runner = ModelRunner(model)
    spec = KVSpec.from_config(model.config, dtype=model.dtype)
    # Three requests run together (their ranges must not overlap); the first two finish at
    # step 11 and leave a hole at the front, where the fourth, arriving at step 12 while
    # the third still runs, must be placed.
    arrivals = [0, 0, 2, 12, 13, 14][: len(prompts)]
    results = {}
    with one_torch_thread():
        for name, arena in (("yours", LearnerArena(arena_class, 256)), ("kvlab", None)):
            cache = ContiguousKVCache.from_spec(
                spec, 256, reservation_policy="exact", device="cpu", arena=arena
            )
            results[name] = serve(runner, cache, prompts, 12, arrival_steps=arrivals)
    yours, kvlab = results["yours"], results["kvlab"]
    if yours.start_steps != kvlab.start_steps:
        detail = (
            f"with your arena the requests started at steps {yours.start_steps}, with "
            f"kvlab's at {kvlab.start_steps} (they arrived at {arrivals})"
        )
        why = "a reserve refused a range that a hole could hold, so a request waited"
        return Verdict("generation", False, detail, why)
    why = "two ranges shared slots: one request's K/V overwrote another's"
    detail = f"{len(prompts)} requests, the same tokens as with kvlab's arena (= HF generate)"
    failure = different_requests(yours.outputs, kvlab.outputs, why)
    return failure or Verdict("generation", True, detail)


class LearnerArena(ContiguousArena):
    """kvlab's arena bookkeeping (tokens per range, counts) with a learner's placement:
    ``reserve``, ``free`` and ``holes`` go to the learner's arena, and each range is recorded
    where the learner put it, unchecked, so a wrong placement corrupts K/V as it would in a
    real engine."""

    def __init__(self, arena_class, num_slots: int) -> None:
        super().__init__(num_slots)
        self.learner = arena_class(num_slots)

    def holes(self) -> list[tuple[int, int]]:
        return list(self.learner.holes())

    def reserve(self, seq_id: int, num_slots: int) -> int:
        start = self.learner.reserve(seq_id, num_slots)
        self._ranges[seq_id] = Range(start, num_slots)
        self._starts.append((start, seq_id))
        self._starts.sort()
        self.num_reserved_slots += num_slots
        return start

    def free(self, seq_id: int) -> None:
        self.learner.free(seq_id)
        r = self._ranges.pop(seq_id)
        self._starts.remove((r.start, seq_id))
        self.num_reserved_slots -= r.num_slots
        self.num_used_slots -= r.num_tokens
