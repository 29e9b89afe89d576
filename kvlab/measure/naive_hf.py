"""Labs 00 and 01: naive KV caching in Hugging Face transformers, measured on a real model.

Hugging Face's default cache, ``DynamicCache``, keeps one key and one value tensor per layer,
shaped (batch, num_kv_heads, seq_len, head_dim), and grows them with ``torch.cat`` at every
step. This module measures what that costs, always from the real tensors:

- ``decode_with_cache``: greedy decoding step by step, timing each step and reading the
  cache's bytes after it; ``decode_without_cache``: the same greedy loop with no cache,
  running the whole text at every step; ``time_without_cache``: the time of such no-cache
  steps at chosen context lengths; ``time_weight_reads``: one token times every weight
  matrix and nothing else, the least any step can do. The timers repeat their runs and
  report medians: one run of a step on a shared machine can take several times its usual
  time.
- ``positions_computed`` and ``no_cache_seconds``: the whole run, with and without a cache,
  as work (token positions through the model) and as time, after every generated token;
  ``fit_no_cache_steps``: the straight line through the timed no-cache steps (what one
  more token adds to a step); ``step_costs``: all of it as one table.
- ``cache_bytes`` and ``cache_layer_shapes``: open a ``DynamicCache`` and count its bytes;
  ``what_grew``: which of two memories grew between two readings.
- ``memory_breakdown``: weights against KV cache against activations, for serving a batch.

A padded batch's cache, real tokens against padding, is ``kvlab.measure.padded_batch``.

Not handled: sliding-window or quantized caches, ``StaticCache``, peak activation memory
measured on the device (``activation_bytes`` is an estimate from the model's shapes).
"""

from __future__ import annotations

import inspect
import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from transformers import DynamicCache

from kvlab.memory import KVSpec

# --- Generation with and without a cache -------------------------------------------------


@dataclass(frozen=True)
class DecodeTrace:
    """One greedy generation with a ``DynamicCache``, measured step by step.

    Step 0 is the prefill (the whole prompt); step ``i > 0`` feeds one token and produces
    ``token_ids[num_prompt_tokens + i]``.

    Attributes:
        token_ids: prompt followed by every generated token.
        num_prompt_tokens: length of the prompt.
        step_seconds: wall time of each step: the median of its ``repeats`` runs.
        cache_lens: tokens held in the cache after each step.
        cache_bytes: bytes of the cache's K/V tensors after each step (all layers).
        cache: the ``DynamicCache`` itself, as the last step left it.
        repeats: how many times the whole generation ran.
    """

    token_ids: list[int]
    num_prompt_tokens: int
    step_seconds: list[float]
    cache_lens: list[int]
    cache_bytes: list[int]
    cache: DynamicCache
    repeats: int = 1

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


def decode_with_cache(
    model,
    prompt_ids: Sequence[int],
    num_new_tokens: int,
    eos_token_id: int | None = None,
    repeats: int = 3,
) -> DecodeTrace:
    """Greedily generate up to ``num_new_tokens`` tokens with a fresh ``DynamicCache``.

    Every step after the prefill feeds only the newest token; the keys and values of all
    earlier tokens come from the cache. Generation stops after ``eos_token_id`` when one is
    given (``None``: always ``num_new_tokens`` tokens, as timing runs want).

    Args:
        repeats: how many times to run the whole generation, each with a fresh cache. Greedy
            decoding gives the same tokens every time; each step's time is the median of its
            runs, so that one disturbed run does not show up as a slow step.
    """
    if num_new_tokens <= 0:
        raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs = [_decode_once(model, prompt_ids, num_new_tokens, eos_token_id) for _ in range(repeats)]
    if any(run.token_ids != runs[0].token_ids for run in runs):
        raise RuntimeError("repeated greedy runs gave different tokens")
    # Same tokens, so every run has the same steps: the median of step i over the runs.
    per_step = zip(*(run.step_seconds for run in runs), strict=True)
    medians = [statistics.median(times) for times in per_step]
    return replace(runs[-1], step_seconds=medians, repeats=repeats)


@torch.inference_mode()
def _decode_once(
    model, prompt_ids: Sequence[int], num_new_tokens: int, eos_token_id: int | None
) -> DecodeTrace:
    cache = DynamicCache(config=model.config)
    token_ids = list(prompt_ids)
    feed = torch.tensor([token_ids], device=model.device)  # (1, prompt_len)
    cache_arg = {_cache_kwarg(model): cache}
    seconds, lens, sizes = [], [], []
    for _ in range(num_new_tokens):
        start = time.perf_counter()
        logits = model(feed, use_cache=True, logits_to_keep=1, **cache_arg).logits
        next_token = int(logits[0, -1].argmax())
        seconds.append(time.perf_counter() - start)
        lens.append(cache.get_seq_length())
        sizes.append(cache_bytes(cache))
        token_ids.append(next_token)
        if next_token == eos_token_id:
            break
        feed = torch.tensor([[next_token]], device=model.device)  # (1, 1)
    return DecodeTrace(token_ids, len(prompt_ids), seconds, lens, sizes, cache)


@torch.inference_mode()
def decode_without_cache(
    model, prompt_ids: Sequence[int], num_new_tokens: int, eos_token_id: int | None = None
) -> list[int]:
    """Greedily generate up to ``num_new_tokens`` tokens with no cache; return them.

    The plainest loop there is: every step runs the whole text so far (prompt and every
    token generated) through the model and keeps the most likely next token. Nothing is
    kept between steps, so each step recomputes every earlier token's keys and values.
    Stops after ``eos_token_id`` when one is given.
    """
    if num_new_tokens <= 0:
        raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
    token_ids = list(prompt_ids)
    for _ in range(num_new_tokens):
        feed = torch.tensor([token_ids], device=model.device)  # (1, all tokens so far)
        logits = model(feed, use_cache=False, logits_to_keep=1).logits
        token_ids.append(int(logits[0, -1].argmax()))
        if token_ids[-1] == eos_token_id:
            break
    return token_ids[len(prompt_ids) :]


@dataclass(frozen=True)
class NoCacheStep:
    """One next-token step without a cache: the whole context went through the model.

    ``seconds`` is the median of the step's repeated runs.
    """

    context_len: int
    seconds: float
    next_token: int


@torch.inference_mode()
def time_without_cache(
    model, token_ids: Sequence[int], context_lens: Sequence[int], repeats: int = 3
) -> list[NoCacheStep]:
    """Time the step that predicts token ``L`` from ``token_ids[:L]``, for each ``L``.

    Without a cache, generating the token after a context of ``L`` tokens means running all
    ``L`` tokens through every layer again: this is what one generation step costs then.

    Args:
        token_ids: a sequence to read contexts from (e.g. a ``DecodeTrace.token_ids``).
        context_lens: the context lengths ``L`` to measure, each at most ``len(token_ids)``.
        repeats: runs per length; the median is kept (one run can be slowed by other load,
            and the fastest of a few is an outlier too).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for length in context_lens:
        if not 0 < length <= len(token_ids):
            raise ValueError(f"context length {length} outside 1..{len(token_ids)}")
    seconds = {length: [] for length in context_lens}
    next_tokens = {}
    # NOTE: one round over every length, then the next round: the runs of one length are
    # spread over the whole measurement, so a burst of other load slows one of them, not all.
    for _ in range(repeats):
        for length in context_lens:
            feed = torch.tensor([list(token_ids[:length])], device=model.device)  # (1, L)
            start = time.perf_counter()
            logits = model(feed, use_cache=False, logits_to_keep=1).logits
            next_tokens[length] = int(logits[0, -1].argmax())
            seconds[length].append(time.perf_counter() - start)
    return [
        NoCacheStep(length, statistics.median(seconds[length]), next_tokens[length])
        for length in context_lens
    ]


@torch.inference_mode()
def time_weight_reads(model, repeats: int = 3) -> float:
    """Median seconds of one token times every weight matrix of ``model``, nothing else.

    One matrix-vector product per 2-D parameter (the tied embedding is the output
    projection's matrix too): every weight read once for two floating-point operations,
    the least a step can do with its weights. A decode step that takes about this long is
    bound by reading the weights from memory, not by arithmetic.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    matrices = [param for param in model.parameters() if param.dim() == 2]
    vectors = [torch.ones(m.shape[1], dtype=m.dtype, device=m.device) for m in matrices]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for matrix, vector in zip(matrices, vectors, strict=True):
            matrix @ vector  # (rows, cols) @ (cols,)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def positions_computed(num_prompt_tokens: int, num_new_tokens: int) -> tuple[list[int], list[int]]:
    """Token positions run through the model so far, after each generated token.

    Returns ``(with_cache, without_cache)``, one running total per generated token. With a
    cache the prefill runs the prompt once and every later step one token; without one,
    the step that produces token ``k`` runs all ``num_prompt_tokens + k`` tokens before it.
    """
    if num_prompt_tokens <= 0 or num_new_tokens <= 0:
        raise ValueError(f"need a prompt and new tokens, got {num_prompt_tokens}, {num_new_tokens}")
    with_cache = [num_prompt_tokens + k for k in range(num_new_tokens)]
    without_cache = list(itertools.accumulate(num_prompt_tokens + k for k in range(num_new_tokens)))
    return with_cache, without_cache


def no_cache_seconds(steps: Sequence[NoCacheStep], context_lens: Sequence[int]) -> list[float]:
    """Seconds of a no-cache step at each of ``context_lens``, from the timed ``steps``.

    A no-cache step's time grows about linearly with its context, so the lengths that were
    not timed are interpolated along a straight line between the nearest timed ones.
    """
    timed = sorted(steps, key=lambda step: step.context_len)
    lens = [step.context_len for step in timed]
    for length in context_lens:
        if not lens[0] <= length <= lens[-1]:
            raise ValueError(f"context length {length} outside the timed {lens[0]}..{lens[-1]}")
    return [float(s) for s in np.interp(context_lens, lens, [step.seconds for step in timed])]


@dataclass(frozen=True)
class LineFit:
    """A straight line through the timed no-cache steps: ``seconds = at_zero + slope x L``.

    Attributes:
        seconds_per_token: the slope: what one more token of context adds to a step.
        seconds_at_zero: where the line meets zero tokens: what a step pays whatever it
            computes.
        num_points: how many timed steps the line was fitted to.
    """

    seconds_per_token: float
    seconds_at_zero: float
    num_points: int

    def seconds_at(self, context_len: float) -> float:
        return self.seconds_at_zero + self.seconds_per_token * context_len


def fit_no_cache_steps(steps: Sequence[NoCacheStep]) -> LineFit:
    """The least-squares line through every timed step (time against context length).

    Two end points alone would let one disturbed run set the slope; a line through all of
    them averages the disturbances out.
    """
    if len({step.context_len for step in steps}) < 2:
        raise ValueError("fit_no_cache_steps needs steps at two or more context lengths")
    slope, at_zero = np.polyfit(
        [step.context_len for step in steps], [step.seconds for step in steps], deg=1
    )
    return LineFit(float(slope), float(at_zero), len(steps))


@dataclass(frozen=True)
class StepCosts:
    """One run with and without a cache, as work and time, and what a step costs.

    Attributes:
        positions_with, positions_without: token positions run through the model.
        seconds_with: the cached run's measured time (every step timed).
        seconds_without: the no-cache run's time, estimated from its timed steps.
        cached_step_seconds: the median of the cached run's decode steps (one token each).
        shortest: the timed no-cache step with the least context (many tokens at once).
        fit: the line through every timed no-cache step.
        weight_read_seconds: one token times every weight matrix (``time_weight_reads``).
    """

    positions_with: int
    positions_without: int
    seconds_with: float
    seconds_without: float
    cached_step_seconds: float
    shortest: NoCacheStep
    fit: LineFit
    weight_read_seconds: float

    @property
    def time_ratio(self) -> float:
        """Time without a cache over time with one (the former estimated)."""
        return self.seconds_without / self.seconds_with

    def __str__(self) -> str:
        rows = [
            ("", "with a cache", "without"),
            ("token positions computed", f"{self.positions_with:,}", f"{self.positions_without:,}"),
            (
                "whole run",
                f"{self.seconds_with:.1f} s",
                f"{self.seconds_without:.1f} s (estimated)",
            ),
        ]
        ms = {
            "a cached decode step, one token (median)": self.cached_step_seconds,
            f"a no-cache step of {self.shortest.context_len} tokens": self.shortest.seconds,
            f"each extra token (line through {self.fit.num_points} steps)": (
                self.fit.seconds_per_token
            ),
            "one token times every weight matrix": self.weight_read_seconds,
        }
        lines = [f"{a:28} {b:>12}  {c}" for a, b, c in rows]
        lines += ["", "one step costs"] + [f"  {k:50} {1000 * v:6.1f} ms" for k, v in ms.items()]
        return "\n".join(lines)


def step_costs(
    trace: DecodeTrace,
    no_cache: Sequence[NoCacheStep],
    seconds_without: Sequence[float],
    weight_read_seconds: float,
) -> StepCosts:
    """Sum up a cached run (``trace``) and the no-cache steps timed on its tokens.

    Args:
        seconds_without: the no-cache run's time per generated token, one per step of
            ``trace`` (``no_cache_seconds``).
        weight_read_seconds: from ``time_weight_reads``.
    """
    num_steps = len(trace.step_seconds)
    if len(seconds_without) != num_steps or num_steps < 2:
        raise ValueError("step_costs needs one no-cache time per step of a run of 2+ steps")
    with_cache, without_cache = positions_computed(trace.num_prompt_tokens, num_steps)
    return StepCosts(
        positions_with=with_cache[-1],
        positions_without=without_cache[-1],
        seconds_with=sum(trace.step_seconds),
        seconds_without=sum(seconds_without),
        cached_step_seconds=statistics.median(trace.step_seconds[1:]),
        shortest=min(no_cache, key=lambda step: step.context_len),
        fit=fit_no_cache_steps(no_cache),
        weight_read_seconds=weight_read_seconds,
    )


# --- Inside a DynamicCache ---------------------------------------------------------------


def cache_layer_shapes(cache) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(key shape, value shape) of each layer, each (batch, num_kv_heads, seq_len, head_dim)."""
    return [
        (tuple(layer.keys.shape), tuple(layer.values.shape))
        for layer in cache.layers
        if layer.keys is not None
    ]


def cache_bytes(cache) -> int:
    """Bytes held by the key and value tensors of every layer of a transformers cache."""
    return sum(
        tensor.numel() * tensor.element_size()
        for layer in cache.layers
        for tensor in (layer.keys, layer.values)
        if tensor is not None
    )


def what_grew(weights: tuple[int, int], kv_cache: tuple[int, int]) -> str:
    """``"weights"``, ``"KV cache"``, ``"both"`` or ``"neither"``: which grew between two
    readings, each given as (bytes before, bytes after)."""
    readings = {"weights": weights, "KV cache": kv_cache}
    grew = [name for name, (before, after) in readings.items() if after > before]
    if len(grew) == 2:
        return "both"
    return grew[0] if grew else "neither"


def _cache_kwarg(model) -> str:
    # NOTE: transformers 5.x renamed the forward argument ``past_key_values`` to ``cache``
    # (the old name is deprecated); use whichever name the installed version takes.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# --- Weights vs KV vs activations --------------------------------------------------------


@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory to serve ``batch_size`` requests of ``seq_len`` tokens each, in bytes."""

    batch_size: int
    seq_len: int
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (a tied embedding is one parameter, counted once)."""
    return sum(param.numel() * param.element_size() for param in model.parameters())


def activation_bytes(
    config, batch_size: int, context_len: int, dtype_bytes: int, num_new_tokens: int = 1
) -> int:
    """Estimated peak of the temporaries of one forward step, in bytes.

    Activations live only while a step runs, and a layer's temporaries are freed before
    the next layer starts, so the peak is about one layer's worth (plus the logits):

        per new token: hidden states (2 x hidden), q, k, v and the attention output,
                       the MLP's gate, up and product (3 x intermediate)
        attention scores: num_heads x new tokens x context (if materialized)
        logits: vocab_size per request (only the last position is projected)

    Args:
        batch_size: requests in the step.
        context_len: tokens each request attends to (cached + new).
        num_new_tokens: new tokens per request: 1 in a decode step, the prompt in prefill.
    """
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    new_tokens = batch_size * num_new_tokens
    per_token = (
        2 * config.hidden_size
        + (2 * num_heads + 2 * num_kv_heads) * head_dim
        + 3 * config.intermediate_size
    )
    scores = num_heads * new_tokens * context_len
    logits = batch_size * config.vocab_size
    return (new_tokens * per_token + scores + logits) * dtype_bytes


def memory_breakdown(model, batch_size: int, seq_len: int) -> MemoryBreakdown:
    """Weights (measured), KV cache (formula) and one decode step's activations (estimate)."""
    spec = KVSpec.from_config(model.config, dtype=model.dtype)
    return MemoryBreakdown(
        batch_size=batch_size,
        seq_len=seq_len,
        weight_bytes=weight_bytes(model),
        kv_bytes=spec.bytes_for(batch_size * seq_len),
        activation_bytes=activation_bytes(model.config, batch_size, seq_len, spec.dtype_bytes),
    )
