"""The exercises of lab 04."""

from __future__ import annotations

import math

from kvlab.exercises.base import Exercise, Mistake, register

# Exercise 04.static_idle_seats: one static batch of requests that arrived together.
_STATIC_MAX_NUM_SEQS, _STATIC_OUTPUT_LENS = 4, (3, 10, 4, 6)
# Exercise 04.dynamic_start: an idle engine, dynamic batching.
_DYNAMIC_MAX_NUM_SEQS, _DYNAMIC_TIMEOUT, _DYNAMIC_ARRIVALS = 4, 0.5, (0.0, 0.2, 0.3, 1.2)
# Exercise 04.watermark: admission with watermark, while requests run.
_WATERMARK_NUM_BLOCKS, _WATERMARK, _WATERMARK_PROMPT_BLOCKS = 120, 0.1, 7


def _static_idle_seats() -> int:
    """Seat-steps left empty: every seat is held until the longest output is done."""
    steps = max(_STATIC_OUTPUT_LENS)  # the prefill step already samples the first token
    return _STATIC_MAX_NUM_SEQS * steps - sum(_STATIC_OUTPUT_LENS)


def _dynamic_start() -> float:
    """When the first dynamic batch starts: full, or the oldest request timed out."""
    arrivals = sorted(_DYNAMIC_ARRIVALS)
    timeout_at = arrivals[0] + _DYNAMIC_TIMEOUT
    full = len(arrivals) >= _DYNAMIC_MAX_NUM_SEQS
    full_at = arrivals[_DYNAMIC_MAX_NUM_SEQS - 1] if full else math.inf
    return min(timeout_at, full_at)


def _watermark_reserve() -> int:
    """The blocks the admission rule keeps free: watermark x num_blocks, rounded down."""
    return int(_WATERMARK * _WATERMARK_NUM_BLOCKS)  # as KVCacheManager.watermark_blocks


def _watermark_free_blocks() -> int:
    """Free blocks needed to admit: the prompt's blocks plus the reserve that must stay."""
    return _WATERMARK_PROMPT_BLOCKS + _watermark_reserve()


register(
    Exercise(
        exercise_id="04.static_idle_seats",
        question=(
            f"Static batching, max_num_seqs {_STATIC_MAX_NUM_SEQS}. Four requests arrive "
            "together and form one batch; they generate "
            f"{', '.join(map(str, _STATIC_OUTPUT_LENS))} tokens (the prefill step gives "
            "each its first token, then one token per step). "
            "Counting one seat per request per step, how many seat-steps stay empty while "
            "this batch runs?"
        ),
        answer=_static_idle_seats,
        hint="the batch runs until its longest request is done; count all its seat-steps, "
        "then subtract the ones that produced a token.",
        mistakes=(
            Mistake(lambda: sum(_STATIC_OUTPUT_LENS), "those are the seat-steps in use."),
            Mistake(
                lambda: _STATIC_MAX_NUM_SEQS * max(_STATIC_OUTPUT_LENS),
                "that is every seat-step of the batch, busy or not.",
            ),
            Mistake(lambda: max(_STATIC_OUTPUT_LENS), "that is how many steps the batch runs."),
        ),
        explanation="A finished request keeps its seat empty until the whole batch ends; "
        "continuous batching hands it to a waiting request at the next step.",
    ),
    Exercise(
        exercise_id="04.dynamic_start",
        question=(
            f"Dynamic batching, max_num_seqs {_DYNAMIC_MAX_NUM_SEQS}, batch_timeout "
            f"{_DYNAMIC_TIMEOUT} s. The engine is idle; requests arrive at "
            f"{', '.join(f'{t:g}' for t in _DYNAMIC_ARRIVALS)} s. At what time (in seconds) "
            "does the first batch start?"
        ),
        answer=_dynamic_start,
        hint="a batch starts when max_num_seqs requests wait, or when the oldest waiting "
        "request has waited batch_timeout, whichever comes first.",
        mistakes=(
            Mistake(lambda: min(_DYNAMIC_ARRIVALS), "that is static batching: no waiting."),
            Mistake(
                lambda: sorted(_DYNAMIC_ARRIVALS)[2] + _DYNAMIC_TIMEOUT,
                "the timeout counts from the oldest waiting request, not the newest.",
            ),
            Mistake(
                lambda: sorted(_DYNAMIC_ARRIVALS)[_DYNAMIC_MAX_NUM_SEQS - 1],
                "the batch does not wait to be full: the timeout fires first.",
            ),
        ),
        abs_tol=1e-9,
        explanation="The oldest request's timeout fires before the batch fills; three "
        "requests start together.",
    ),
    Exercise(
        exercise_id="04.watermark",
        question=(
            f"A paged pool of {_WATERMARK_NUM_BLOCKS} blocks, watermark "
            f"{_WATERMARK}. Some requests are running. A waiting request's prompt "
            f"needs {_WATERMARK_PROMPT_BLOCKS} new blocks (no prefix-cache hit). How many "
            "free blocks must the pool have, at least, for the scheduler to admit it?"
        ),
        answer=_watermark_free_blocks,
        hint="after it takes its blocks, watermark x num_blocks blocks (rounded "
        "down, as vLLM does) must still be free.",
        mistakes=(
            Mistake(lambda: _WATERMARK_PROMPT_BLOCKS, "you left out the reserve."),
            Mistake(
                _watermark_reserve, "that is the reserve alone; the prompt's blocks come on top."
            ),
        ),
        explanation="The reserve lets running requests grow without being preempted.",
    ),
)
