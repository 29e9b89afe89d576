"""Lab exercises, and ``check``, which marks an answer right or wrong with a helpful hint.

    from kvlab.exercises import check, question
    print(question("01.kv_bytes_llama3_8b"))
    check("01.kv_bytes_llama3_8b", answer)   # "Correct ..." or a hint

Every answer is computed from kvlab itself (``kvlab.memory`` presets, the padding account
of ``kvlab.measure.naive_hf``, the allocators of ``kvlab.cache``), never typed in, so it follows the
library. A wrong answer that
matches a known mistake gets that mistake's hint; any other gets the exercise's general
hint; ``None`` (the placeholder in the labs) gets a reminder to fill it in.

Not handled: free-text answers, partial credit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.contiguous_arena import ContiguousArena, reservation_size
from kvlab.measure.naive_hf import padded_cache_slots
from kvlab.memory import GIB, preset


@dataclass(frozen=True)
class Mistake:
    """A wrong answer learners often give, and the hint that gets them unstuck."""

    value: Callable[[], float]
    hint: str
    abs_tol: float | None = None  # None: the exercise's own tolerance


@dataclass(frozen=True)
class Exercise:
    """One question with a numeric answer.

    Attributes:
        exercise_id: ``"<lab>.<name>"``, e.g. ``"01.kv_bytes_llama3_8b"``.
        question: the text the lab shows.
        answer: computes the right answer from kvlab.
        hint: for a wrong answer that matches no known mistake.
        mistakes: known wrong answers, each with its own hint.
        abs_tol: how far from the answer still counts as right (0: exact).
        explanation: shown with "Correct", to confirm the reasoning.
    """

    exercise_id: str
    question: str
    answer: Callable[[], float]
    hint: str
    mistakes: tuple[Mistake, ...] = ()
    abs_tol: float = 0.0
    explanation: str = ""

    def matches(self, value: float, candidate: float, abs_tol: float | None = None) -> bool:
        tol = self.abs_tol if abs_tol is None else abs_tol
        return math.isclose(value, candidate, rel_tol=1e-9, abs_tol=tol)


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer; shows as its message in a notebook, and is truthy if right."""

    correct: bool
    message: str

    def __bool__(self) -> bool:
        return self.correct

    def __repr__(self) -> str:
        return self.message

    __str__ = __repr__


def check(exercise_id: str, answer) -> Feedback:
    """Mark ``answer`` for exercise ``exercise_id``: "Correct", or a hint to try again."""
    exercise = _get(exercise_id)
    if answer is None:
        return Feedback(False, "Not answered yet: replace `answer = None` with your number.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number (int or float), not {type(answer).__name__}.")
    right = exercise.answer()
    if exercise.matches(answer, right):
        return Feedback(True, f"Correct: {_fmt(right)}. {exercise.explanation}".rstrip())
    for mistake in exercise.mistakes:
        if exercise.matches(answer, mistake.value(), mistake.abs_tol):
            return Feedback(False, f"Not quite ({_fmt(answer)}). Hint: {mistake.hint}")
    return Feedback(False, f"Not quite ({_fmt(answer)}). Hint: {exercise.hint}")


def question(exercise_id: str) -> str:
    """The question of ``exercise_id``."""
    return _get(exercise_id).question


def _get(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        raise KeyError(
            f"no exercise {exercise_id!r}; the exercises are {sorted(EXERCISES)}"
        ) from None


def _fmt(value: float) -> str:
    return f"{value:,}" if float(value).is_integer() else f"{value:.4g}"


# --- Lab 01 ------------------------------------------------------------------------------

_LLAMA3_QUERY_HEADS = 32  # num_attention_heads in Llama-3-8B's config.json


def _llama3(**changes) -> int:
    """Llama-3-8B's KV bytes per token, with one factor of the formula changed."""
    spec = preset("llama-3-8b")
    factors = dict(kv=2, layers=spec.num_layers, heads=spec.num_kv_heads)
    factors.update(head_dim=spec.head_dim, dtype_bytes=spec.dtype_bytes)
    factors.update(changes)
    return math.prod(factors.values())


# The padded batch of exercise 01.padding_waste: prompt and answer lengths (EOS included).
_PROMPT_LENS, _OUTPUT_LENS = (12, 40, 25), (50, 6, 20)


def _padding_waste(slots: int, real: int) -> float:
    return 1 - real / slots


def _left_padding_only() -> float:
    slots, _ = padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)
    return sum(max(_PROMPT_LENS) - p for p in _PROMPT_LENS) / slots


def _requests_that_fit(device_bytes: int, weights: bool = True) -> int:
    spec = preset("llama-2-7b")
    free = device_bytes - (spec.weight_bytes if weights else 0)
    return free // spec.bytes_for(spec.max_model_len)


EXERCISES: dict[str, Exercise] = {
    exercise.exercise_id: exercise
    for exercise in (
        Exercise(
            exercise_id="01.kv_bytes_llama3_8b",
            question=(
                "Llama-3-8B has 32 layers, 32 query heads, 8 KV heads (grouped-query "
                "attention) and head_dim 128. How many bytes of KV cache does one token take "
                "with float16 K and V?"
            ),
            answer=lambda: preset("llama-3-8b").bytes_per_token,
            hint="bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes.",
            mistakes=(
                Mistake(
                    lambda: _llama3(heads=_LLAMA3_QUERY_HEADS),
                    "only the KV heads store keys and values: with grouped-query attention "
                    "several query heads share one KV head, so use 8, not 32.",
                ),
                Mistake(lambda: _llama3(kv=1), "every token stores a key AND a value."),
                Mistake(lambda: _llama3(dtype_bytes=4), "float16 takes 2 bytes, not 4."),
                Mistake(
                    lambda: _llama3() / 1024,
                    "that is the answer in KiB; give it in bytes.",
                ),
            ),
            explanation="A quarter of Llama-2-7B's 0.5 MiB: 4x fewer KV heads.",
        ),
        Exercise(
            exercise_id="01.padding_waste",
            question=(
                f"model.generate runs three chat requests as one batch: prompts of "
                f"{', '.join(map(str, _PROMPT_LENS))} tokens, answers of "
                f"{', '.join(map(str, _OUTPUT_LENS))} tokens (each answer counts its EOS). "
                "When the batch ends, what fraction of its cache's positions hold padding? "
                "(a number between 0 and 1)"
            ),
            answer=lambda: _padding_waste(*padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)),
            hint=(
                "every row is as long as the longest prompt plus the longest answer "
                "(less one: the last token is never fed back); a request needs only its "
                "own prompt + answer."
            ),
            mistakes=(
                Mistake(
                    lambda: 1 - _padding_waste(*padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)),
                    "that is the fraction holding real tokens; the question asks for padding.",
                ),
                Mistake(
                    _left_padding_only,
                    "left padding is only part of it: a request that finished early stays "
                    "in the batch, fed padding, until the longest answer ends.",
                ),
                Mistake(
                    lambda: 100 * _padding_waste(*padded_cache_slots(_PROMPT_LENS, _OUTPUT_LENS)),
                    "give a fraction between 0 and 1, not a percentage.",
                ),
            ),
            abs_tol=0.01,
            explanation="Padding to the longest wastes both ends of the batch.",
        ),
        Exercise(
            exercise_id="01.requests_on_a100",
            question=(
                "Llama-2-7B (preset 'llama-2-7b', float16 weights and KV) serves requests of "
                "4096 tokens each on a GPU with 80 GiB. Each request reserves its whole "
                "4096-token KV cache up front. How many requests fit at once, next to the "
                "weights? (a whole number)"
            ),
            answer=lambda: _requests_that_fit(80 * GIB),
            hint=(
                "(device memory - weight bytes) // KV bytes of one 4096-token request; "
                "preset('llama-2-7b') has both."
            ),
            mistakes=(
                Mistake(
                    lambda: _requests_that_fit(80 * GIB, weights=False),
                    "the weights (about 6.7e9 parameters x 2 bytes) take their share first.",
                ),
                Mistake(
                    lambda: (
                        (80 * GIB - preset("llama-2-7b").weight_bytes)
                        / preset("llama-2-7b").bytes_for(4096)
                    ),
                    "only whole requests fit: round down.",
                    abs_tol=0.5,
                ),
            ),
            explanation=(
                "Reserving 4096 tokens per request caps the batch however short the "
                "requests really are; paged allocation (lab 03) holds only what is used."
            ),
        ),
    )
}


# --- Lab 02 ------------------------------------------------------------------------------

# Exercise 02.internal_waste: one request under policy "max_model_len".
_WASTE_MAX_MODEL_LEN, _WASTE_PROMPT, _WASTE_OUTPUT = 512, 40, 20
# Exercise 02.largest_request: first-fit reservations, then the 1st and 3rd finish.
_ARENA_SLOTS, _ARENA_RANGES, _ARENA_FREED = 1000, (300, 200, 300, 100), (0, 2)


def _internal_waste(held_tokens: int) -> float:
    reserved = reservation_size("max_model_len", _WASTE_PROMPT, None, _WASTE_MAX_MODEL_LEN)
    return 1 - held_tokens / reserved


def _arena_after_frees() -> ContiguousArena:
    arena = ContiguousArena(_ARENA_SLOTS)
    for seq_id, num_slots in enumerate(_ARENA_RANGES):
        arena.reserve(seq_id, num_slots)
    for seq_id in _ARENA_FREED:
        arena.free(seq_id)
    return arena


EXERCISES.update(
    (exercise.exercise_id, exercise)
    for exercise in (
        Exercise(
            exercise_id="02.pow2_reservation",
            question=(
                "Under the 'pow2' policy a request reserves its prompt plus its max_tokens "
                "rounded up to a power of two. A request with a 100-token prompt and "
                "max_tokens=100 arrives at a server with max_model_len 4096. How many token "
                "slots does it reserve?"
            ),
            answer=lambda: reservation_size("pow2", 100, 100, 4096),
            hint="prompt_len + (max_tokens rounded up to a power of two), at most max_model_len.",
            mistakes=(
                Mistake(
                    lambda: 256,
                    "only the output is rounded up; the prompt's length is known exactly.",
                ),
                Mistake(
                    lambda: reservation_size("exact", 100, 100, 4096),
                    "that is the 'exact' policy; 'pow2' rounds max_tokens up first.",
                ),
                Mistake(lambda: 4096, "that is the 'max_model_len' policy."),
            ),
            explanation="At most 2x the output is over-reserved (Orca (Pow2)).",
        ),
        Exercise(
            exercise_id="02.internal_waste",
            question=(
                f"Under the 'max_model_len' policy (max_model_len {_WASTE_MAX_MODEL_LEN}), a "
                f"request with a {_WASTE_PROMPT}-token prompt generates {_WASTE_OUTPUT} tokens. "
                "Just before it frees its range, what fraction of the slots it reserved hold "
                "none of its tokens (internal fragmentation)? (a number between 0 and 1)"
            ),
            answer=lambda: _internal_waste(_WASTE_PROMPT + _WASTE_OUTPUT - 1),
            hint=(
                "the range has max_model_len slots; the request fills prompt + output of "
                "them (less one: its last token is never fed back)."
            ),
            mistakes=(
                Mistake(
                    lambda: 1 - _internal_waste(_WASTE_PROMPT + _WASTE_OUTPUT - 1),
                    "that is the share that holds tokens; the question asks for the empty share.",
                ),
                Mistake(
                    lambda: 100 * _internal_waste(_WASTE_PROMPT + _WASTE_OUTPUT - 1),
                    "give a fraction between 0 and 1, not a percentage.",
                    abs_tol=1.0,
                ),
            ),
            abs_tol=0.01,
            explanation="Close to 90% of the reservation never holds a token.",
        ),
        Exercise(
            exercise_id="02.largest_request",
            question=(
                f"An arena of {_ARENA_SLOTS:,} slots places reservations of "
                f"{', '.join(map(str, _ARENA_RANGES))} slots first-fit, in that order. Then "
                "the first and the third requests finish. What is the largest reservation "
                "(in slots) the arena can admit now?"
            ),
            answer=lambda: _arena_after_frees().largest_hole,
            hint="a reservation must be one unbroken range: list the holes (start, length).",
            mistakes=(
                Mistake(
                    lambda: _arena_after_frees().num_free_slots,
                    "that many slots are free in total, but in three separate holes: one "
                    "range cannot span them (external fragmentation).",
                ),
                Mistake(
                    lambda: _ARENA_SLOTS - sum(_ARENA_RANGES),
                    "the freed ranges become holes too; not only the tail is free.",
                ),
                Mistake(
                    lambda: _arena_after_frees().external_fragmentation(),
                    "that is the free memory outside the largest hole: what no single "
                    "request can use.",
                ),
            ),
            explanation="Most of the arena is free, yet a request one slot larger is refused.",
        ),
    )
)


# --- Lab 03 ------------------------------------------------------------------------------

# Exercise 03.prefix_hit: A's prompt ran and is cached; B shares its first 70 tokens.
_PREFIX_BLOCK_SIZE, _PROMPT_A_LEN, _SHARED_LEN, _PROMPT_B_LEN = 16, 100, 70, 120
# Exercise 03.cow_copies: a 37-token prompt forked into 4 sequences.
_COW_BLOCK_SIZE, _COW_PROMPT_LEN, _COW_NUM_SEQS = 16, 37, 4


def _empty_slots(num_tokens: int, block_size: int) -> int:
    manager = BlockManager(-(-num_tokens // block_size), block_size, False)
    manager.allocate_slots(0, num_tokens)
    return len(manager.block_table(0)) * block_size - num_tokens


def _prefix_hit_tokens() -> int:
    """Prompt tokens of B found in the prefix cache after A ran."""
    prompt_a = list(range(_PROMPT_A_LEN))
    prompt_b = prompt_a[:_SHARED_LEN] + list(range(1000, 1000 + _PROMPT_B_LEN - _SHARED_LEN))
    manager = BlockManager(32, _PREFIX_BLOCK_SIZE, enable_prefix_caching=True)
    manager.allocate_slots(0, len(prompt_a), token_ids=prompt_a)
    manager.free(0)
    return manager.add_sequence(1, prompt_b)


def _cow_copies() -> int:
    manager = BlockManager(16, _COW_BLOCK_SIZE, enable_prefix_caching=False)
    manager.allocate_slots(0, _COW_PROMPT_LEN)
    for child in range(1, _COW_NUM_SEQS):
        manager.fork(0, child)
    return sum(len(manager.allocate_slots(seq_id, 1)) for seq_id in range(_COW_NUM_SEQS))


EXERCISES.update(
    (exercise.exercise_id, exercise)
    for exercise in (
        Exercise(
            exercise_id="03.empty_slots",
            question=(
                "A sequence of 1,000 tokens is stored in blocks of block_size 32. How many "
                "slots of its blocks are empty?"
            ),
            answer=lambda: _empty_slots(1000, 32),
            hint="it holds ceil(1000 / 32) blocks; count their slots, then subtract the tokens.",
            mistakes=(
                Mistake(
                    lambda: 1000 % 32,
                    "that is how many tokens the last block holds, not how many slots are empty.",
                ),
                Mistake(lambda: -(-1000 // 32) * 32, "that is every slot it holds."),
                Mistake(lambda: -(-1000 // 32), "that is the number of blocks."),
            ),
            explanation="Only the last block can be partly empty: under block_size slots.",
        ),
        Exercise(
            exercise_id="03.prefix_hit",
            question=(
                f"Prefix caching is on, block_size {_PREFIX_BLOCK_SIZE}. Request A's "
                f"{_PROMPT_A_LEN}-token prompt has run, and its blocks stay cached. Request "
                f"B's prompt has {_PROMPT_B_LEN} tokens; its first {_SHARED_LEN} equal A's, "
                "then they differ. How many of B's prompt tokens must its prefill compute?"
            ),
            answer=lambda: _PROMPT_B_LEN - _prefix_hit_tokens(),
            hint="a cached block serves a hit only if all of its tokens (and all before) match.",
            mistakes=(
                Mistake(
                    lambda: _PROMPT_B_LEN - _SHARED_LEN,
                    "only whole blocks are shared: the block in which the two prompts part "
                    "ways differs, so it is computed again.",
                ),
                Mistake(
                    lambda: _prefix_hit_tokens(),
                    "that is how many tokens B reuses; the question asks how many it computes.",
                ),
                Mistake(lambda: _PROMPT_B_LEN, "B's first full blocks equal A's: it adopts them."),
            ),
            explanation="B adopts the whole blocks that match, and computes the rest.",
        ),
        Exercise(
            exercise_id="03.cow_copies",
            question=(
                f"A {_COW_PROMPT_LEN}-token prompt sits in blocks of {_COW_BLOCK_SIZE} (the "
                f"last holds {_COW_PROMPT_LEN % _COW_BLOCK_SIZE} tokens). Parallel sampling "
                f"forks it into {_COW_NUM_SEQS} sequences that share every block. Then each of "
                "them, one after the other, writes its first new token. How many blocks get "
                "copied (copy-on-write)?"
            ),
            answer=_cow_copies,
            hint="a sequence copies a block only if it writes into it while someone else holds it.",
            mistakes=(
                Mistake(
                    lambda: _COW_NUM_SEQS,
                    "by the time the last sequence writes, everyone else has copied away: it "
                    "holds the block alone (ref_cnt 1) and writes in place.",
                ),
                Mistake(
                    lambda: (_COW_NUM_SEQS - 1) * -(-_COW_PROMPT_LEN // _COW_BLOCK_SIZE),
                    "the full blocks are never written again: they stay shared.",
                ),
                Mistake(lambda: 0, "a shared block is never written in place."),
            ),
            explanation="Only the partly filled last block is copied, once per extra holder.",
        ),
    )
)


# --- Lab 04 ------------------------------------------------------------------------------

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


def _watermark_free_blocks() -> int:
    """Free blocks needed to admit: the prompt's blocks plus the reserve that must stay."""
    reserve = math.ceil(_WATERMARK * _WATERMARK_NUM_BLOCKS)  # as kvlab.engine.scheduler
    return _WATERMARK_PROMPT_BLOCKS + reserve


EXERCISES.update(
    (exercise.exercise_id, exercise)
    for exercise in (
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
            "up) must still be free.",
            mistakes=(
                Mistake(lambda: _WATERMARK_PROMPT_BLOCKS, "you left out the reserve."),
                Mistake(
                    lambda: math.ceil(_WATERMARK * _WATERMARK_NUM_BLOCKS),
                    "that is the reserve alone; the prompt's blocks come on top.",
                ),
            ),
            explanation="The reserve lets running requests grow without being preempted.",
        ),
    )
)
