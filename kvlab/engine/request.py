"""One request as the scheduler sees it: its tokens, how many are computed, and its state.

A request's tokens are its prompt followed by what it has generated so far. The scheduler
only needs one number to know what to compute next, ``num_computed_tokens``, the tokens
whose K/V are in the cache (as in vLLM v1):

    token_ids:  |------------ prompt ------------|---- output ----|
                |== computed (K/V in cache) ==|.. to compute ..|
                                num_computed_tokens        num_tokens

    prefill          computes the prompt (all at once, or in chunks: chunked prefill);
    decode           computes the one token sampled last step;
    recompute        after a preemption the cache forgot everything: prompt and output are
                     computed again as one longer prompt, and no token is sampled until
                     the last one is computed, so the output goes on exactly where it was.

The life of a request:

    WAITING --admit--> RUNNING --finish--> FINISHED
       ^                 |  ^
       +--preempt--------+  | (recompute: back to WAITING, its blocks freed)
              SWAPPED <-----+ (swap: its blocks copied to CPU memory, then freed)

With ``n > 1`` samples, each sample is its own ``Request`` (same ``request_id``, its own
``sample_index``): samples 1..n-1 are forked from sample 0 once its prompt is computed.

Not handled: stop strings, streaming detokenization, multi-modal inputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from kvlab.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sequence being generated.

    Attributes:
        request_id: the caller's id; the ``n`` samples of one prompt share it.
        seq_id: this sequence's id in the KV cache (unique per sample).
        prompt_token_ids: the prompt.
        sampling_params: how to pick tokens and when to stop.
        arrival_time: when the request reached the engine (seconds of the engine's clock).
        priority: with ``scheduling_policy="priority"``, lower runs first (as in vLLM).
        sample_index: which of the ``n`` samples this is.
        eos_token_id: the model's end-of-sequence token (None: never stops on it).
        max_model_len: the longest sequence the model accepts; reaching it ends the request.
        output_token_ids: tokens generated so far.
        num_computed_tokens: leading tokens whose K/V are in the cache.
        status: waiting, running, swapped or finished.
        finish_reason: ``"stop"`` (EOS or a stop token), ``"length"`` or ``"abort"``.
        generator: this sample's own random generator (sampled requests only).
        base_seed: the request's seed; sample ``i`` draws with ``base_seed + i``.
        num_preemptions: times it lost its blocks (recompute) or was swapped out.
        num_cached_tokens: prompt tokens found in the prefix cache at its first admission.
        first_scheduled_time, first_token_time, finished_time: clock times, None until then.
        last_token_time: clock time of its newest token.
        max_token_gap: the longest wait between two of its tokens so far (a stall).
    """

    request_id: str
    seq_id: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    sample_index: int = 0
    eos_token_id: int | None = None
    max_model_len: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    base_seed: int | None = None
    num_preemptions: int = 0
    num_cached_tokens: int | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    last_token_time: float | None = None
    max_token_gap: float = 0.0
    token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Prompt and output in one list, appended to in place: the scheduler slices it
        # every step, so it must not be rebuilt by concatenation each time.
        self.token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        # What ends it, precomputed: append_token runs for every sequence every step.
        params = self.sampling_params
        stop = set(params.stop_token_ids or ())
        if self.eos_token_id is not None and not params.ignore_eos:
            stop.add(self.eos_token_id)
        self._stop_ids = frozenset(stop)
        limit = len(self.prompt_token_ids) + params.max_tokens
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len)
        self._length_limit = limit

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        """It has its last token (its memory may be released a moment later)."""
        return self.finish_reason is not None

    def append_token(self, token_id: int) -> bool:
        """Add a sampled token; return True (and set ``finish_reason``) if it ends the request.

        It ends on EOS (unless ``ignore_eos``) or a stop token (``"stop"``), or at
        ``max_tokens`` outputs or ``max_model_len`` tokens (``"length"``).
        """
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        if token_id in self._stop_ids:
            self.finish_reason = "stop"
            return True
        if len(self.token_ids) >= self._length_limit:
            self.finish_reason = "length"
            return True
        return False

    def fork(self, seq_id: int, sample_index: int, generator: torch.Generator | None) -> Request:
        """Sample ``sample_index`` of the same prompt, computed up to the same point."""
        child = Request(
            request_id=self.request_id,
            seq_id=seq_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling_params=self.sampling_params,
            arrival_time=self.arrival_time,
            priority=self.priority,
            sample_index=sample_index,
            eos_token_id=self.eos_token_id,
            max_model_len=self.max_model_len,
            generator=generator,
            base_seed=self.base_seed,
        )
        child.num_computed_tokens = self.num_computed_tokens
        child.status = self.status
        child.num_cached_tokens = self.num_cached_tokens
        child.first_scheduled_time = self.first_scheduled_time
        return child
