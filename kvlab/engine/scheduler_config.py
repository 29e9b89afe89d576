"""How the scheduler forms batches: ``SchedulerConfig``, every field checked where it is made.

The knobs carry vLLM's names (``max_num_seqs``, ``max_num_batched_tokens``,
``preemption_mode``, ``scheduling_policy``, ``watermark``); ``batch_timeout`` is the seed
article's dynamic-batching timeout, and ``scheduling`` picks static, dynamic or continuous
batching (see ``kvlab.engine.scheduler``).

Not handled: anything that needs more than one engine (pipeline or tensor parallelism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULING_MODES = ("static", "dynamic", "continuous")
PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler forms batches; every field is checked when the config is made.

    Attributes:
        scheduling: ``"static"``, ``"dynamic"`` or ``"continuous"`` (see the module docstring).
        max_num_seqs: sequences that may run at once (the seed article's max_batch_size).
            A request with ``n`` samples takes ``n`` seats.
        max_num_batched_tokens: the token budget of one step (continuous only). Static and
            dynamic batches compute each prompt whole in its first step, as a padded batch
            does, and have no budget.
        batch_timeout: dynamic only: seconds the oldest waiting request may wait for a
            batch to fill before the batch starts anyway.
        watermark: the admission watermark (the seed article's ``page_reuse_threshold``),
            a fraction of the KV pool in [0, 1).
            A waiting request is admitted only if, after its prompt's blocks are taken, at
            least this share of all blocks is still reusable (free, or cached and
            evictable). The reserve lets running requests grow block by block without
            being preempted; 0 admits while anything fits (more concurrency, more
            preemptions). It is the ``watermark`` of vLLM's V0 block manager (0.01
            there). It does not apply when nothing is running, so a request that fits
            alone is never starved.
        preemption_mode: ``"recompute"`` or ``"swap"`` (needs a paged cache and a swap space).
        scheduling_policy: order of the waiting queue: ``"fcfs"`` (arrival) or
            ``"priority"`` (lower ``priority`` first, then arrival; preemption then takes
            the lowest-priority running request).
        prefetch: swap only: start copying a swapped request's blocks back one step before
            it resumes, when memory allows (the seed article's Prefetch Engine), so the copy
            runs while that step computes; False copies them back in the step that resumes
            it, which waits for the copy.
    """

    scheduling: str = "continuous"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    batch_timeout: float = 0.02
    watermark: float = 0.0
    preemption_mode: str = "recompute"
    scheduling_policy: str = "fcfs"
    prefetch: bool = True

    def __post_init__(self) -> None:
        _check_choice("scheduling", self.scheduling, SCHEDULING_MODES)
        _check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is not allowed: use an int >= 1")
        if self.scheduling == "continuous" and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is not allowed with "
                f"max_num_seqs={self.max_num_seqs}: use at least max_num_seqs, so every "
                "running sequence can decode one token per step"
            )
        if not isinstance(self.prefetch, bool):
            raise ValueError(f"prefetch={self.prefetch!r} is not allowed: use True or False")
        timeout = self.batch_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
            raise ValueError(f"batch_timeout={timeout!r} is not allowed: use seconds >= 0 (finite)")
        if math.isinf(timeout):
            raise ValueError(f"batch_timeout={timeout!r} is not allowed: use a finite number")
        watermark = self.watermark
        if isinstance(watermark, bool) or not isinstance(watermark, int | float):
            raise ValueError(f"watermark={watermark!r} is not allowed: use [0, 1)")
        if not 0 <= watermark < 1:
            raise ValueError(
                f"watermark={watermark!r} is not allowed: use a fraction of the "
                "KV pool in [0, 1) (0: no reserve)"
            )


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not allowed: use one of {choices}")
