"""How fast is paged decode attention? ``python -m kvlab.kernels.bench``

Decode is memory-bound: each step reads every cached key and value once and does little
math per byte. So the number that matters is achieved bandwidth, KV bytes read / time,
compared with the device's peak memory bandwidth. The benchmark times, on CUDA:

- the Triton kernel reading through a shuffled block table (with and without split-K),
- the torch reference (gathers each sequence's blocks into a contiguous copy first),
- torch's ``scaled_dot_product_attention`` on contiguous KV, the "no paging" baseline.

A paged kernel close to SDPA shows that indirection through the block table costs little.
On a CPU the kernels run in Triton's interpreter, whose timings say nothing about
performance, so there the script only checks the kernel against the reference.

Not handled: CUDA graphs, autotuning, and comparisons with vLLM or FlashInfer kernels.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kvlab.kernels import paged_decode_attention, paged_decode_attention_ref

# Peak memory bandwidth in GB/s by (a substring of) the device name, from vendor data sheets.
PEAK_BANDWIDTH_GBPS = {
    "H200": 4800,
    "H100 SXM": 3350,
    "H100 NVL": 3900,
    "H100 PCIe": 2000,
    "H100": 3350,
    "H20": 4000,
    "GH200": 4000,
    "B200": 8000,
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100": 1555,
    "A10G": 600,
    "A10": 600,
    "L40S": 864,
    "L40": 864,
    "L4": 300,
    "T4": 320,
    "V100": 900,
    "RTX 4090": 1008,
    "RTX 3090": 936,
}


@dataclass(frozen=True)
class Case:
    """One decode step: num_seqs sequences of context_len tokens each."""

    num_seqs: int
    context_len: int
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.float16

    def kv_bytes(self) -> int:
        """Bytes of keys and values attention must read."""
        element = torch.finfo(self.dtype).bits // 8
        return 2 * self.num_seqs * self.context_len * self.num_kv_heads * self.head_dim * element


def make_inputs(case: Case, device: torch.device, seed: int = 0):
    """Random query, a paged cache with a shuffled block table, and seq_lens."""
    torch.manual_seed(seed)
    blocks_per_seq = -(-case.context_len // case.block_size)
    num_blocks = case.num_seqs * blocks_per_seq
    kv_shape = (2, num_blocks, case.block_size, case.num_kv_heads, case.head_dim)
    kv_cache = torch.randn(kv_shape, device=device, dtype=case.dtype)
    block_table = torch.randperm(num_blocks).view(case.num_seqs, blocks_per_seq)
    query = torch.randn(
        (case.num_seqs, case.num_heads, case.head_dim), device=device, dtype=case.dtype
    )
    seq_lens = torch.full((case.num_seqs,), case.context_len, dtype=torch.int32, device=device)
    return query, kv_cache, block_table.to(device, torch.int32), seq_lens


def contiguous_kv(kv_cache, block_table, context_len):
    """The same keys and values laid out contiguously: two (num_seqs, kvh, ctx, head_dim)."""
    keys = kv_cache[0, block_table.long()].flatten(1, 2)[:, :context_len]  # (seqs, ctx, kvh, d)
    values = kv_cache[1, block_table.long()].flatten(1, 2)[:, :context_len]
    return keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()


def peak_bandwidth_gbps(device_name: str) -> float | None:
    for name, peak in PEAK_BANDWIDTH_GBPS.items():
        if name.lower() in device_name.lower():
            return peak
    return None


@dataclass(frozen=True)
class Row:
    """One way of computing a decode step, timed: ms, GB/s, share of peak, error vs SDPA."""

    label: str
    ms: float
    gbps: float
    share: float | None
    error: float

    def __str__(self) -> str:
        share = f"{self.share:6.1%} of peak" if self.share is not None else "peak unknown"
        return (
            f"{self.label:<26} {self.ms:8.3f} ms  {self.gbps:7.0f} GB/s  {share}  "
            f"max|err| {self.error:.1e}"
        )


def tolerance(dtype: torch.dtype) -> float:
    """How far from SDPA a kernel's output may be (the order of the sums differs)."""
    return {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]


def describe(case: Case) -> str:
    return (
        f"{case.num_seqs} seqs x {case.context_len} tokens, {case.num_heads} heads / "
        f"{case.num_kv_heads} KV heads, head_dim {case.head_dim}, block_size "
        f"{case.block_size}, {case.dtype}: {case.kv_bytes() / 2**20:.0f} MiB of KV"
    )


def measure(case: Case, peak: float | None) -> list[Row]:
    """Each candidate of ``case`` on CUDA, timed by ``triton.testing.do_bench``."""
    import triton.testing

    candidates = _candidates(case, torch.device("cuda"))
    expected = candidates["torch SDPA, contiguous"]().squeeze(2)
    rows = []
    for label, fn in candidates.items():
        error = (fn().reshape(expected.shape).float() - expected.float()).abs().max().item()
        ms = triton.testing.do_bench(fn, warmup=10, rep=50)
        gbps = case.kv_bytes() / (ms * 1e-3) / 1e9
        rows.append(Row(label, ms, gbps, gbps / peak if peak else None, error))
    return rows


def bench_cuda(cases: list[Case]) -> None:
    name = torch.cuda.get_device_name(torch.device("cuda"))
    peak = peak_bandwidth_gbps(name)
    peak_text = f"{peak:.0f} GB/s" if peak else "unknown (not in PEAK_BANDWIDTH_GBPS)"
    print(f"device: {name}, peak memory bandwidth {peak_text}")
    for case in cases:
        print(f"\n{describe(case)}")
        for row in measure(case, peak):
            print(f"  {row}")


def _candidates(case: Case, device: torch.device) -> dict:
    """The four ways to compute one decode step, each a no-argument function."""
    query, kv_cache, block_table, seq_lens = make_inputs(case, device)
    keys, values = contiguous_kv(kv_cache, block_table, case.context_len)
    q4 = query.unsqueeze(2)  # (num_seqs, num_heads, 1, head_dim)
    return {
        # check_values=False: the value checks wait for the GPU, which would be timed too.
        "triton paged": lambda: paged_decode_attention(
            query, kv_cache, block_table, seq_lens, check_values=False
        ),
        "triton paged, 4 splits": lambda: paged_decode_attention(
            query, kv_cache, block_table, seq_lens, num_splits=4, check_values=False
        ),
        "torch SDPA, contiguous": lambda: F.scaled_dot_product_attention(
            q4, keys, values, enable_gqa=True
        ),
        "torch reference (gather)": lambda: paged_decode_attention_ref(
            query, kv_cache, block_table, seq_lens
        ),
    }


def cpu_errors() -> list[tuple[int, float]]:
    """(num_splits, max |kernel - reference|) of a small case in Triton's interpreter."""
    case = Case(2, 100, num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float32)
    query, kv_cache, block_table, seq_lens = make_inputs(case, torch.device("cpu"))
    expected = paged_decode_attention_ref(query, kv_cache, block_table, seq_lens)
    errors = []
    for num_splits in (1, 3):
        out = paged_decode_attention(query, kv_cache, block_table, seq_lens, num_splits=num_splits)
        errors.append((num_splits, (out - expected).abs().max().item()))
    return errors


def check_cpu() -> None:
    print(
        "No CUDA device: Triton runs the kernel in its interpreter (numpy on the CPU).\n"
        "Interpreter timings are not performance, so this only checks correctness."
    )
    for num_splits, error in cpu_errors():
        verdict = "OK" if error < 1e-4 else "MISMATCH"
        print(f"num_splits={num_splits}: max |kernel - reference| = {error:.1e}  {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=64)
    parser.add_argument("--context-len", type=int, default=4096)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        check_cpu()
        return
    bench_cuda([Case(8, 1024), Case(args.num_seqs, args.context_len)])


if __name__ == "__main__":
    main()
