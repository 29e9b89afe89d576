"""What the engine hands back: vLLM's ``RequestOutput`` with one ``CompletionOutput`` per sample.

    RequestOutput(request_id="0", prompt="What is...", prompt_token_ids=[...],
                  outputs=[CompletionOutput(index=0, text=" Paris.", token_ids=[...],
                                            finish_reason="stop")],
                  finished=True, metrics=RequestMetrics(ttft=..., e2e=...))

Not handled: logprobs, streaming text deltas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvlab.engine.metrics import RequestMetrics
from kvlab.engine.request import Request


@dataclass(slots=True)
class CompletionOutput:
    """One sample of a request.

    Attributes:
        index: which of the request's ``n`` samples.
        text: the decoded tokens; None for models without a tokenizer, and until the sample
            finishes (text is decoded once, at the end).
        token_ids: the generated token ids.
        finish_reason: ``"stop"``, ``"length"``, ``"abort"``, or None while running.
    """

    index: int
    text: str | None
    token_ids: list[int]
    finish_reason: str | None


@dataclass(slots=True)
class RequestOutput:
    """A request's prompt and its samples so far.

    Attributes:
        request_id: the id it was added with.
        prompt: the prompt text (None when it was given as token ids).
        prompt_token_ids: the prompt.
        outputs: one ``CompletionOutput`` per sample, in ``index`` order.
        finished: every sample has finished.
        metrics: latencies, once finished (else None).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None


def request_output(
    request_id: str,
    samples: list[Request],
    prompt: str | None,
    decode: Callable[[list[int]], str | None],
) -> RequestOutput | None:
    """A request's output from its samples now; None while it runs, if it asked for the
    final output only. ``metrics`` is set once every sample has finished (``finished``).

    Args:
        decode: token ids to text (None without a tokenizer); a sample's text is decoded
            once, when it finishes.
    """
    # NOTE: this runs for every request that got a token, every step: no sort for a
    # single sample, and positional arguments (keyword ones cost more per call).
    parent = samples[0]
    if len(samples) == 1:
        done = parent.finish_reason is not None and parent.sampling_params.n == 1
    else:
        samples = sorted(samples, key=lambda s: s.sample_index)
        n = parent.sampling_params.n
        done = len(samples) == n and all(s.is_finished for s in samples)
    if not done and parent.sampling_params.output_kind == "final_only":
        return None
    completions = [
        CompletionOutput(
            s.sample_index,
            decode(s.output_token_ids) if s.is_finished else None,
            s.output_token_ids.copy(),
            s.finish_reason,
        )
        for s in samples
    ]
    metrics = RequestMetrics.of(samples) if done else None
    return RequestOutput(request_id, prompt, parent.prompt_token_ids, completions, done, metrics)
