"""The exercises of lab 01."""

from __future__ import annotations

import math

from kvlab.exercises.base import Exercise, Mistake, register
from kvlab.measure.padded_batch import padded_cache_slots
from kvlab.memory import GIB, preset


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


register(
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
                lambda: _llama3(heads=32),  # num_attention_heads in Llama-3-8B's config.json
                "only the KV heads store keys and values: with grouped-query attention "
                "several query heads share one KV head, so use 8, not 32.",
            ),
            Mistake(lambda: _llama3(kv=1), "every token stores a key AND a value."),
            Mistake(lambda: _llama3(dtype_bytes=4), "float16 takes 2 bytes, not 4."),
            Mistake(lambda: _llama3() / 1024, "that is the answer in KiB; give it in bytes."),
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
