"""How much of a serving run is matrix multiplies: the floor under any engine's time.

A decode step of a small model on a CPU is mostly its matrix multiplies (the projections,
the MLP, the LM head). Engines that run the same model in the same dtype call the same
kinds of kernels for those (vLLM's CPU backend and kvlab both call oneDNN), so the time
of the multiplies alone is a floor no such engine can go under, however little it spends
on everything else. This module measures it on a real run:

    one run of the workload through kvlab under torch.profiler
    -> the time spent inside matrix-multiply ops (oneDNN's linear, mm, addmm, bmm excluded:
       attention's batched products are attention, not the model's weights)

``python -m kvlab.measure.vllm_peer --matmul-floor`` prints it beside vLLM: an engine that
did nothing but these multiplies would make ``num_tokens / matmul_seconds`` tokens/s.

Not handled: GPUs (the profiler's CPU times do not see CUDA kernels). The profiler adds a
little time to every op it records; what is summed is the time inside the multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.profiler import ProfilerActivity, profile

# The ops the model's weight multiplies run as: oneDNN's packed linear (kvlab's layout on a
# CPU), or ATen's (row-major weights, HF's own modules).
MATMUL_OPS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm")


@dataclass(frozen=True)
class MatmulFloor:
    """One profiled run: its wall time and the part of it inside weight multiplies."""

    run_seconds: float
    matmul_seconds: float

    @property
    def share(self) -> float:
        return self.matmul_seconds / self.run_seconds


def matmul_floor(run) -> MatmulFloor:
    """Profile ``run()`` (it returns its own wall seconds) and sum its matmul time.

    Self time per op, so that a multiply called inside another op is counted once.
    """
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run_seconds = run()
    micros = sum(e.self_cpu_time_total for e in profiler.key_averages() if e.key in MATMUL_OPS)
    return MatmulFloor(run_seconds, micros / 1e6)
