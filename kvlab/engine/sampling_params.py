"""How to pick each next token: vLLM's ``SamplingParams``, validated where they are made.

    SamplingParams(temperature=0)                       greedy: always the most likely token
    SamplingParams(temperature=0.8, top_p=0.95, seed=1) sampled, reproducible
    SamplingParams(n=4, temperature=1.0)                four samples sharing one prompt's KV

A bad value fails here, with its name, the value and what is allowed, not deep inside the
engine a hundred steps later.

Not handled: beam search, logprobs, penalties (repetition, presence, frequency), stop
strings, logits processors, min_p, guided decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OUTPUT_KINDS = ("cumulative", "final_only")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, with vLLM's names and defaults.

    Attributes:
        temperature: divides the logits before softmax; 0 means greedy (argmax).
        top_k: keep only the ``top_k`` most likely tokens; ``-1``, ``0`` or ``None``: all.
        top_p: keep the smallest set of most likely tokens whose probability reaches
            ``top_p`` (nucleus sampling); 1.0: all. In (0, 1].
        max_tokens: output tokens to generate at most, >= 1.
        n: independent samples of the same prompt, >= 1; they share the prompt's KV blocks
            (copy-on-write forks after prefill).
        seed: seeds this request's own random generator, so its samples do not depend on
            which other requests share the batch. Sample ``i`` of ``n`` uses ``seed + i``.
        ignore_eos: keep generating after the end-of-sequence token (benchmarks use it).
        stop_token_ids: more token ids that end a sample (the stop token is kept).
        output_kind: when ``LLMEngine.step`` reports this request: ``"cumulative"`` after
            every token (for streaming), ``"final_only"`` once it has finished (what
            ``LLM.generate`` asks for, as vLLM's does: it saves an output object per
            running request per step).
    """

    temperature: float = 1.0
    top_k: int | None = -1
    top_p: float = 1.0
    max_tokens: int = 16
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] | None = None
    output_kind: str = "cumulative"

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature, "a number >= 0 (0 means greedy)")
        if self.temperature < 0:
            _fail("temperature", self.temperature, "a number >= 0 (0 means greedy)")
        if self.top_k is not None:
            _check_int("top_k", self.top_k, "-1, 0 or None (no limit), or an int >= 1")
            if self.top_k < -1:
                _fail("top_k", self.top_k, "-1, 0 or None (no limit), or an int >= 1")
        _check_real("top_p", self.top_p, "a number in (0, 1]")
        if not 0 < self.top_p <= 1:
            _fail("top_p", self.top_p, "a number in (0, 1]")
        _check_int("max_tokens", self.max_tokens, "an int >= 1")
        if self.max_tokens < 1:
            _fail("max_tokens", self.max_tokens, "an int >= 1")
        _check_int("n", self.n, "an int >= 1")
        if self.n < 1:
            _fail("n", self.n, "an int >= 1")
        if self.seed is not None:
            _check_int("seed", self.seed, "None or an int")
        if not isinstance(self.ignore_eos, bool):
            _fail("ignore_eos", self.ignore_eos, "True or False")
        if self.stop_token_ids is not None:
            stop = tuple(self.stop_token_ids)
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop):
                _fail("stop_token_ids", self.stop_token_ids, "None or token ids (ints >= 0)")
            object.__setattr__(self, "stop_token_ids", stop)
        if self.output_kind not in OUTPUT_KINDS:
            _fail("output_kind", self.output_kind, f"one of {OUTPUT_KINDS}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the most likely token, no randomness."""
        return self.temperature == 0

    @property
    def top_k_limit(self) -> int:
        """``top_k`` as a plain int, 0 when every token is kept."""
        return self.top_k if self.top_k is not None and self.top_k > 0 else 0


def _fail(name: str, value, allowed: str):
    raise ValueError(f"SamplingParams.{name}={value!r} is not allowed: use {allowed}")


def _check_int(name: str, value, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(name, value, allowed)


def _check_real(name: str, value, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        _fail(name, value, allowed)
