"""What the scheduler plans for one step: ``SchedulerOutput``, the scheduler's only output.

The engine reads it to build the step's batch (``requests``, ``num_new_tokens``), to move
and copy blocks before anything writes (``blocks_to_swap_out``, ``blocks_to_copy``,
``blocks_to_swap_in``, ``blocks_to_prefetch``), to report what moved (``admitted``,
``preempted``, ``swapped_out``, ``swapped_in``), and to time the swaps the step waits for
or hides. It is vLLM's ``SchedulerOutput`` (``vllm/v1/core/sched/output.py``) cut to what
kvlab needs, with the swap lists of vLLM's V0 scheduler (``blocks_to_swap_out``,
``blocks_to_swap_in``).

Not handled: per-request sampling metadata, structured-output masks, KV connector state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.engine.request import Request


@dataclass
class SchedulerOutput:
    """One step's plan: what to compute, and what moved.

    Attributes:
        requests: the sequences to compute, in row order.
        num_new_tokens: tokens of each to compute this step (its next, uncomputed ones).
        admitted: requests that got their first blocks this step (new or recomputed).
        preempted: requests that lost their blocks this step (both modes).
        swapped_out, swapped_in: the subset that went to / came back from the CPU pool.
        blocks_to_swap_out: ``(device_block, cpu_block)`` pairs to copy to CPU memory
            first: their device blocks are free now, and may be reused by this step.
        blocks_to_copy: ``(src, dst)`` blocks whose K/V the storage must copy next
            (copy-on-write), in order.
        blocks_to_swap_in: ``(cpu_block, device_block)`` pairs to copy back, which this
            step waits for: its resumed requests read them.
        blocks_to_prefetch: ``(cpu_block, device_block)`` pairs to copy back while this
            step computes, for requests a later step resumes (``Scheduler.prefetch``).
    """

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swapped_out: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_prefetch: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_blocks_swapped(self) -> int:
        """Blocks copied between the device and CPU memory that the step waits for."""
        return len(self.blocks_to_swap_out) + len(self.blocks_to_swap_in)

    @property
    def num_blocks_prefetched(self) -> int:
        """Blocks copied back while the step computes."""
        return len(self.blocks_to_prefetch)

    def __bool__(self) -> bool:
        return bool(self.requests)

    def add(self, request: Request, num_new_tokens: int) -> None:
        """Compute ``num_new_tokens`` of ``request`` this step (its slots are allocated)."""
        self.requests.append(request)
        self.num_new_tokens.append(num_new_tokens)

    def remove(self, request: Request) -> int:
        """Take a request back out of this step; return the tokens it had."""
        index = self.requests.index(request)
        del self.requests[index]
        return self.num_new_tokens.pop(index)
