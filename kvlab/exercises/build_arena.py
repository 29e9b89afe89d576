"""Build it (lab 02): a first-fit arena of your own, checked, then run inside the engine.

The learner writes three methods of a contiguous arena (the stub is in lab 02):

    reserve(seq_id, num_slots) -> start   first-fit: the first hole, in address order,
                                          of at least num_slots slots; CacheFullError
                                          (and no change) when no hole is long enough
    free(seq_id)                          its range becomes free; neighbours merge
    holes() -> [(start, length), ...]     every free run, merged, in address order

``check_arena(MyArena)`` grades it criterion by criterion. Random sequences of reserves
and frees run on the learner's arena and on kvlab's ``ContiguousArena`` side by side; the
first difference names the broken criterion, is shrunk to the fewest operations that
still show it, and comes with the misconception it most often means. Only when every
criterion holds does the arena serve real requests: SmolLM2 (or any model) generates
through ``ContiguousKVCache`` with the learner's arena placing every range, and the tokens
must equal kvlab's own run, which equals Hugging Face ``generate`` (the oracle of
``tests/test_cache_equivalence.py``).

    hint_arena(1), hint_arena(2), ...   help in steps, from a nudge to the algorithm
    reveal_arena()                      kvlab's own reserve, free and holes

Not handled: partial credit within a criterion; grading anything but the three methods.
"""

from __future__ import annotations

import inspect

from kvlab.cache.contiguous_arena import ContiguousArena, Range
from kvlab.exercises.arena_grader import (
    NUM_SLOTS,
    first_difference,
    random_ops,
    show_op,
    shrink,
    valid_ops,
)
from kvlab.exercises.grading import (
    Hint,
    Report,
    Verdict,
    check_calls,
    hint,
    one_torch_thread,
    show_ops,
    shrunk_failures,
    verdicts_until_failure,
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


STUCK = "Stuck? hint_arena(1), then 2 and 3; print(reveal_arena()) shows kvlab's own."


def _report(verdicts: list[Verdict]) -> Report:
    return Report(verdicts, CRITERIA, STUCK)


# ---- the check ----------------------------------------------------------------------------


def check_arena(
    arena_class, model=None, num_sequences: int = 300, seed: int = 0, prompts=None
) -> Report:
    """Grade a learner's arena class (``arena_class(num_slots)``; see the module docstring).

    Args:
        arena_class: the class to grade.
        model: a loaded model for the last criterion (default: SmolLM2-135M).
        num_sequences: random operation sequences tried per run (seeded: the same each time).
        seed: the seed of those sequences.
        prompts: token-id prompts for the generation (default: six chat prompts).
    """
    written = check_written(arena_class)
    verdicts = [written]
    if not written.passed:
        return _report(verdicts)
    failures = shrunk_failures(
        arena_class,
        first_difference,
        shrink,
        lambda rng: valid_ops(random_ops(rng, rng.randint(2, 24))),
        show_ops(show_op),
        num_sequences,
        seed,
    )
    # Only up to the first failure: a sequence stops at its first difference, so a later
    # criterion that no sequence reached failing is not known to hold.
    graded, failed = verdicts_until_failure(list(CRITERIA)[1:-1], failures)
    verdicts += graded
    if failed:
        return _report(verdicts)
    verdicts.append(check_generation(arena_class, model, prompts))
    return _report(verdicts)


def check_written(arena_class) -> Verdict:
    """The first criterion: every method runs on a fresh arena."""
    calls = (("holes", ()), ("reserve", (0, 4)), ("holes", ()), ("free", (0,)), ("holes", ()))
    return check_calls(lambda: arena_class(NUM_SLOTS), calls, "arena")


def check_generation(arena_class, model, prompts) -> Verdict:
    """Serve prompts with the learner's arena placing every range, against kvlab's own."""

    from kvlab.cache.contiguous import ContiguousKVCache
    from kvlab.measure.serve import serve
    from kvlab.memory import KVSpec
    from kvlab.model.loading import chat_prompt, load_model
    from kvlab.model.runner import ModelRunner

    tokenizer = None
    if model is None:
        model, tokenizer = load_model("smollm2-135m", device="cpu")
    if prompts is None:
        if tokenizer is None:
            raise ValueError("prompts=None needs the default model (SmolLM2, with its tokenizer)")
        questions = [
            "What is the capital of France?",
            "Name three primary colors.",
            "What is 2 + 2?",
            "Write a haiku about memory.",
        ]
        prompts = [chat_prompt(tokenizer, q) for q in questions]
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
        return Verdict(
            "generation",
            False,
            f"with your arena the requests started at steps {yours.start_steps}, with "
            f"kvlab's at {kvlab.start_steps} (they arrived at {arrivals})",
            "a reserve refused a range that a hole could hold, so a request waited",
        )
    if yours.outputs == kvlab.outputs:
        return Verdict(
            "generation",
            True,
            f"{len(prompts)} requests, the same tokens as with kvlab's arena (= HF generate)",
        )
    pairs = zip(yours.outputs, kvlab.outputs, strict=True)
    bad = [i for i, (a, b) in enumerate(pairs) if a != b]
    return Verdict(
        "generation",
        False,
        f"requests {bad} came out different from kvlab's",
        "two ranges shared slots: one request's K/V overwrote another's",
    )


class LearnerArena(ContiguousArena):
    """kvlab's arena bookkeeping (tokens per range, counts) with a learner's placement.

    ``reserve``, ``free`` and ``holes`` go to the learner's arena; this class records each
    range where the learner put it, unchecked, so that a wrong placement corrupts K/V
    exactly as it would in a real engine.
    """

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


def hint_arena(level: int = 1) -> Hint:
    """Help in steps: 1 a nudge, 2 the holes, 3 the whole algorithm, numbered."""
    return hint(HINTS, level)


def reveal_arena() -> str:
    """kvlab's own reserve, holes and free (``kvlab.cache.contiguous_arena``)."""
    return "\n".join(
        inspect.getsource(method)
        for method in (
            ContiguousArena.reserve,
            ContiguousArena.holes,
            ContiguousArena.free,
            ContiguousArena._first_fit,
        )
    )
