"""What a step costs: a clock whose steps last as long as their work would take.

``ManualClock`` gives every engine step the same length, and on that clock a 400-token
prefill costs no more than one decode: chunked prefill, the token budget and swapping
look free. ``StepCostClock`` gives each step the time its work takes under a cost model:

    StepWork     what a step computed: prefill tokens, decode sequences, the K/V tokens
                 attention read, query-key pairs, blocks copied (copy-on-write), swapped
                 (the step waits for them) and prefetched (copied while it computes)
    LinearCost   seconds = base + a * prefill tokens + b * decode seqs + c * context tokens
                 + d * blocks copied + e * blocks swapped, fitted on the real model on this
                 machine (``kvlab.measure.step_cost.calibrate``)
    Roofline     a GPU estimate from its datasheet: the step is bound by memory (weights
                 read once, K/V read) or by arithmetic, whichever takes longer, plus the
                 swapped bytes over PCIe (``Roofline.of(spec, "h100")``)

A prefetched block is copied over PCIe while the step computes (a side CUDA stream), so it
costs the step nothing unless the copies outlast the compute:

    seconds = compute + swapped copies + max(0, prefetched copies - compute)

``Roofline`` always overlaps. ``LinearCost`` overlaps only when it was fitted on a GPU
(``overlaps_prefetch``): on a CPU the copy back is a plain copy that the step waits for.

    clock = StepCostClock(Roofline.of(preset("llama-2-7b"), "a100-40gb"))
    LLM(model, clock=clock, ...)      # a step's length now follows what it computed

Not handled: kernel launch costs, tensor parallelism, PCIe shared by swaps and prefetches
in the same step (each is timed as if it had the link alone), measured GPU timings (the
roofline is an estimate).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvlab.memory import KVSpec


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one engine step computed.

    Attributes:
        num_prefill_tokens: prompt tokens (or recomputed ones) that went through the model.
        num_decode_seqs: sequences that computed one token past their prompt.
        num_context_tokens: K/V positions attention read, summed over the step's sequences
            (each reads its whole context once).
        num_attention_pairs: query-key pairs attention scored (a prefill chunk of n tokens
            after c computed ones scores n * c + n * (n + 1) / 2).
        num_blocks_copied: blocks copied on the device (copy-on-write).
        num_blocks_swapped: blocks moved between the device and CPU memory that the step
            waits for (swapped out; swapped in without a prefetch).
        num_blocks_prefetched: blocks copied back to the device while the step computes,
            for requests a later step resumes.
    """

    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    num_context_tokens: int = 0
    num_attention_pairs: int = 0
    num_blocks_copied: int = 0
    num_blocks_swapped: int = 0
    num_blocks_prefetched: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens through the weights: prefill tokens and one per decode."""
        return self.num_prefill_tokens + self.num_decode_seqs


@dataclass(frozen=True)
class LinearCost:
    """Seconds per step as a sum of per-item costs, fitted on measured steps.

    Attributes:
        base: seconds every step pays (reading the weights once, the step's overheads).
        per_prefill_token, per_decode_seq, per_context_token, per_block_copied,
        per_block_swapped: seconds per item of ``StepWork`` (a prefetched block costs what
            a swapped one does).
        source: where the numbers come from (the machine and model they were fitted on).
        overlaps_prefetch: whether a prefetched block's copy runs beside the step's compute
            (True on a GPU, which copies on a side stream; False on a CPU, where the step
            waits for it as for a swapped block).
    """

    base: float
    per_prefill_token: float
    per_decode_seq: float
    per_context_token: float
    per_block_copied: float = 0.0
    per_block_swapped: float = 0.0
    source: str = ""
    overlaps_prefetch: bool = False

    def seconds(self, work: StepWork) -> float:
        compute = (
            self.base
            + self.per_prefill_token * work.num_prefill_tokens
            + self.per_decode_seq * work.num_decode_seqs
            + self.per_context_token * work.num_context_tokens
            + self.per_block_copied * work.num_blocks_copied
        )
        swap = self.per_block_swapped * work.num_blocks_swapped
        prefetch = self.per_block_swapped * work.num_blocks_prefetched
        if not self.overlaps_prefetch:
            return compute + swap + prefetch
        return compute + swap + max(0.0, prefetch - compute)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class GPU:
    """Datasheet figures of one GPU (dense bf16/fp16 tensor-core FLOP/s, no sparsity)."""

    name: str
    hbm_bytes_per_s: float
    peak_flops: float
    pcie_bytes_per_s: float  # one direction


GPUS = {
    "a100-40gb": GPU("A100-40GB (SXM)", 1.555e12, 312e12, 32e9),  # PCIe 4.0 x16
    "h100": GPU("H100 (SXM)", 3.35e12, 989e12, 64e9),  # PCIe 5.0 x16
    "h200": GPU("H200 (SXM)", 4.8e12, 989e12, 64e9),
}


@dataclass(frozen=True)
class Roofline:
    """A GPU step's time estimated from the datasheet: memory- or compute-bound.

    Memory: the weights once, plus every K/V token read and written. Arithmetic: 2 FLOPs
    per parameter per token, plus attention's 4 per query-key pair per layer and KV head
    dimension (one query head per KV head: exact without grouped-query attention, low
    with it). The step takes the longer of the two, plus its swapped bytes over PCIe and
    its copied bytes through memory. Prefetched blocks cross PCIe while the step computes:
    they add only what their copy takes beyond the step's compute.

    A swapped block is one PCIe transfer per layer for its keys and one for its values (the
    layout of vLLM's per-layer caches), each paying ``transfer_latency_s`` on top of its
    bytes: the fixed cost that makes small blocks slow to swap. It is an assumption, not a
    datasheet figure (a few microseconds per ``cudaMemcpyAsync`` is typical); 0 counts bytes
    only.

    Attributes:
        spec: the model (``kvlab.memory.KVSpec``: its weights, KV bytes per token).
        gpu: the datasheet figures.
        block_size: tokens per KV block (for copy and swap bytes).
        transfer_latency_s: the fixed cost of one PCIe transfer, in seconds.
    """

    spec: KVSpec
    gpu: GPU
    block_size: int = 16
    transfer_latency_s: float = 0.0

    @classmethod
    def of(
        cls, spec: KVSpec, gpu: str | GPU, block_size: int = 16, transfer_latency_s: float = 0.0
    ) -> Roofline:
        if isinstance(gpu, str):
            if gpu not in GPUS:
                raise ValueError(f"gpu={gpu!r} is not allowed: use one of {sorted(GPUS)}")
            gpu = GPUS[gpu]
        if not transfer_latency_s >= 0:
            raise ValueError(f"transfer_latency_s={transfer_latency_s!r} is not allowed: use >= 0")
        return cls(spec, gpu, block_size, transfer_latency_s)

    @property
    def source(self) -> str:
        return f"roofline estimate: {self.spec.name} on an {self.gpu.name}"

    def seconds(self, work: StepWork) -> float:
        spec, gpu = self.spec, self.gpu
        kv_token = spec.bytes_per_token
        memory = (
            spec.num_params * spec.dtype_bytes
            + (work.num_context_tokens + work.num_tokens) * kv_token
            + 2 * work.num_blocks_copied * self.block_size * kv_token
        )
        per_pair = 4 * spec.num_layers * spec.num_kv_heads * spec.head_dim
        flops = 2 * spec.num_params * work.num_tokens + per_pair * work.num_attention_pairs
        per_block = (
            self.block_size * kv_token / gpu.pcie_bytes_per_s
            + 2 * spec.num_layers * self.transfer_latency_s  # keys and values, per layer
        )
        compute = max(memory / gpu.hbm_bytes_per_s, flops / gpu.peak_flops)
        prefetch = work.num_blocks_prefetched * per_block
        return compute + work.num_blocks_swapped * per_block + max(0.0, prefetch - compute)


class StepCostClock:
    """Simulated time in which each step lasts ``cost.seconds(work)``.

    Like ``ManualClock``, idle gaps jump straight to the next arrival, so a replay is
    exact and repeatable; unlike it, a step that prefills 400 tokens lasts longer than
    one that decodes four.

    Args:
        cost: a ``LinearCost``, a ``Roofline``, or anything with ``seconds(StepWork)``.
        start: the time before the first step.
    """

    def __init__(self, cost, start: float = 0.0) -> None:
        if not callable(getattr(cost, "seconds", None)):
            raise ValueError(
                f"cost={cost!r} is not allowed: use a LinearCost, a Roofline, or an object "
                "with seconds(work)"
            )
        self.cost = cost
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        self._now = max(self._now, t)

    def tick(self, work: StepWork | None = None) -> None:
        """A step ended; it lasted what ``work`` costs."""
        if work is None:
            raise ValueError("StepCostClock.tick needs the step's StepWork (the engine gives it)")
        self._now += self.cost.seconds(work)
