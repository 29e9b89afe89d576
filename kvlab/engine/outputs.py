"""What the engine hands back: vLLM's ``RequestOutput`` with one ``CompletionOutput`` per sample.

    RequestOutput(request_id="0", prompt="What is...", prompt_token_ids=[...],
                  outputs=[CompletionOutput(index=0, text=" Paris.", token_ids=[...],
                                            finish_reason="stop")],
                  finished=True, metrics=RequestMetrics(ttft=..., e2e=...))

Not handled: logprobs, streaming text deltas.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.engine.metrics import RequestMetrics


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
