"""Benchmarks: kvlab's engine against Hugging Face transformers, end to end.

End to end (``python -m kvlab.measure.bench``): one seeded workload of requests with ShareGPT-like
lengths (``kvlab.measure.workload``, scaled down to a small model) goes through

    hf-one-at-a-time   ``model.generate``, one request after the other (batch 1)
    hf-static-padded   ``model.generate`` on left-padded batches of max_num_seqs requests;
                       each batch runs until its longest request is done
    hf-generate-batch  transformers' own continuous batching (its paged cache and
                       scheduler, the manager behind ``model.generate_batch``), with the
                       same KV blocks, seats and token budget as kvlab
    kvlab-static, kvlab-dynamic, kvlab-continuous   ``kvlab.LLM`` with each policy, and
                       its fastest attention backend here (``kvlab.attention.fastest_backend``:
                       the C kernel on a CPU where it builds) unless --attention-backend says,
                       and its C custom ops where they build (``kvlab.model.custom_ops``)
                       unless --no-custom-ops
    kvlab-continuous-sdpa   the same with the SDPA backend, when that is not already it

with the same model, device, threads and greedy decoding (EOS ignored, so every request
generates exactly its output length); the three Hugging Face runs are
``kvlab.measure.hf_baselines``. It checks that every method produced the same tokens, and
prints tokens/s, the ratios against hf-one-at-a-time and hf-generate-batch, and how much
of the held KV memory held tokens (KV utilization).

    python -m kvlab.measure.bench --num-requests 16 --max-tokens 32   # a few minutes on a CPU
    python -m kvlab.measure.bench --threads 1 --repeat 2              # steadier when shared
    python -m kvlab.measure.bench --threads 1 --matmul-floor          # and the floor under kvlab

``--matmul-floor`` profiles one more kvlab-continuous run and sums the time inside its
matrix multiplies (``kvlab.measure.matmul_floor``): an engine that did nothing else could
not be faster than that against hf-generate-batch.

The engine's own cost per step, with no model, is ``kvlab.measure.engine_overhead``.

Not handled: sampling (greedy only), GPU timing details (CUDA steps are synchronized by
reading the sampled tokens each step, like any engine that samples on the host).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from kvlab.attention import fastest_backend
from kvlab.engine.sampling_params import SamplingParams
from kvlab.measure.hf_baselines import (
    run_hf_generate_batch,
    run_hf_one_at_a_time,
    run_hf_static_padded,
)
from kvlab.measure.matmul_floor import matmul_floor
from kvlab.measure.workload import Result, Workload, make_workload
from kvlab.model import custom_ops

# ---- kvlab's runs --------------------------------------------------------------------------


def run_kvlab(
    model, workload: Workload, scheduling: str, num_blocks: int, args, backend: str | None = None
) -> Result:
    """kvlab with one scheduling policy; ``backend`` overrides --attention-backend (and is
    then named in the result)."""
    from kvlab.engine.llm import LLM

    llm = LLM(
        model,
        scheduling=scheduling,
        block_size=args.block_size,
        num_blocks=num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        batch_timeout=args.batch_timeout,
        attention_backend=backend or args.attention_backend or fastest_backend(model.device),
        custom_ops=(
            custom_ops.benchmark_default(model.device)
            if args.custom_ops is None
            else args.custom_ops
        ),
    )
    seconds, outputs = timed_generate(llm, workload)
    summary = llm.metrics.summary()
    note = f"peak KV {summary['kv_usage_peak']:.0%}, {summary['num_preemptions']} preemptions"
    return Result(
        f"kvlab-{scheduling}" + (f"-{backend}" if backend else ""),
        seconds,
        outputs,
        summary["kv_utilization_mean"],
        note,
    )


def timed_generate(llm, workload: Workload) -> tuple[float, list[list[int]]]:
    """Seconds ``llm.generate`` takes for the workload (greedy, EOS ignored), and its tokens."""
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in workload.output_lens
    ]
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, [o.outputs[0].token_ids for o in outputs]


# ---- report --------------------------------------------------------------------------------


def mismatches(results: list[Result], reference: Result) -> list[str]:
    """Where any method's tokens differ from the reference's (request, first position)."""
    lines = []
    for result in results:
        for i, (ours, theirs) in enumerate(zip(result.outputs, reference.outputs, strict=True)):
            if ours != theirs:
                pos = next(
                    (j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                    min(len(ours), len(theirs)),
                )
                lines.append(
                    f"{result.name} differs from {reference.name} on request {i} "
                    f"from output token {pos}"
                )
    return lines


def format_table(results: list[Result], num_tokens: int) -> str:
    by_name = {r.name: r for r in results}
    base = by_name.get("hf-one-at-a-time")
    cb = by_name.get("hf-generate-batch")
    header = f"{'method':<20}{'seconds':>9}{'tokens/s':>10}{'vs 1-at-a-time':>16}"
    header += f"{'vs generate_batch':>19}{'KV util':>9}  notes"
    lines = [header, "-" * len(header)]
    for r in results:
        rate = num_tokens / r.seconds
        vs_base = f"{base.seconds / r.seconds:.2f}x" if base else "-"
        vs_cb = f"{cb.seconds / r.seconds:.2f}x" if cb else "-"
        util = f"{r.kv_utilization:.0%}" if r.kv_utilization is not None else "n/a"
        lines.append(
            f"{r.name:<20}{r.seconds:>9.2f}{rate:>10.1f}{vs_base:>16}{vs_cb:>19}{util:>9}  {r.note}"
        )
    return "\n".join(lines)


def run_end_to_end(args) -> None:
    from kvlab.model.loading import load_model

    model, tokenizer = load_model(args.model, device=args.device)
    special = tuple(getattr(tokenizer, "all_special_ids", ()) or ()) if tokenizer else ()
    workload = make_workload(
        args.num_requests,
        model.config.vocab_size,
        max_prompt_len=args.max_prompt_len,
        max_tokens=args.max_tokens,
        seed=args.seed,
        exclude_ids=special,
    )
    lens = [len(p) for p in workload.prompts]
    longest = max(p + o for p, o in zip(lens, workload.output_lens, strict=True))
    num_blocks = args.num_blocks or args.max_num_seqs * -(-longest // args.block_size)
    print(
        f"model {args.model} on {model.device}, {torch.get_num_threads()} threads; "
        f"{len(lens)} requests, prompt {min(lens)}..{max(lens)} (mean {sum(lens) / len(lens):.0f})"
        f", output {min(workload.output_lens)}..{max(workload.output_lens)} "
        f"(total {workload.num_output_tokens} tokens); KV pool {num_blocks} blocks of "
        f"{args.block_size}"
    )
    methods: dict[str, Callable[[], Result]] = {
        "hf-one-at-a-time": lambda: run_hf_one_at_a_time(model, workload),
        "hf-static-padded": lambda: run_hf_static_padded(model, workload, args.max_num_seqs),
        "hf-generate-batch": lambda: run_hf_generate_batch(
            model,
            workload,
            num_blocks=num_blocks,
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        ),
        "kvlab-static": lambda: run_kvlab(model, workload, "static", num_blocks, args),
        "kvlab-dynamic": lambda: run_kvlab(model, workload, "dynamic", num_blocks, args),
        "kvlab-continuous": lambda: run_kvlab(model, workload, "continuous", num_blocks, args),
    }
    if (args.attention_backend or fastest_backend(model.device)) != "sdpa":
        # The same run with the SDPA backend, side by side: what the attention kernel buys.
        methods["kvlab-continuous-sdpa"] = lambda: run_kvlab(
            model, workload, "continuous", num_blocks, args, backend="sdpa"
        )
    results = []
    for name, run in methods.items():
        if name in args.skip:
            continue
        print(f"running {name} ...", flush=True)
        try:
            # The fastest of --repeat runs: on a shared machine, slower runs measure the
            # neighbours' load, not the method.
            runs = [run() for _ in range(args.repeat)]
        except Exception as error:  # report and go on: one failing baseline is a finding
            print(f"  {name} FAILED: {type(error).__name__}: {error}")
        else:
            results.append(min(runs, key=lambda r: r.seconds))
            print("  " + ", ".join(f"{r.seconds:.1f} s" for r in runs))
    print()
    print(format_table(results, workload.num_output_tokens))
    if results:
        reference = results[0]
        problems = mismatches(results[1:], reference)
        print()
        if problems:
            print(f"token mismatches ({len(problems)}):")
            print("\n".join(problems[:20]))
        else:
            print(f"greedy outputs are token-identical across all {len(results)} methods")
    if args.matmul_floor:
        print(_floor_line(model, workload, num_blocks, args, results))


def _floor_line(model, workload: Workload, num_blocks: int, args, results: list[Result]) -> str:
    """One more kvlab-continuous run, profiled: the time inside its matrix multiplies, and
    the most an engine doing only those could serve against hf-generate-batch."""

    def run() -> float:
        return run_kvlab(model, workload, "continuous", num_blocks, args).seconds

    floor = matmul_floor(run)
    line = (
        f"kvlab-continuous's matrix multiplies alone: {floor.matmul_seconds:.2f} s of a "
        f"{floor.run_seconds:.2f} s run under the profiler ({floor.share:.0%})"
    )
    batch = next((r for r in results if r.name == "hf-generate-batch"), None)
    if batch is not None:
        line += (
            f"; an engine doing only them would be {batch.seconds / floor.matmul_seconds:.2f}x "
            "hf-generate-batch"
        )
    return line


# ---- command line --------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.measure.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=None)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64, help="cap on output lengths")
    parser.add_argument("--max-prompt-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--batch-timeout", type=float, default=0.05)
    parser.add_argument(
        "--attention-backend",
        default=None,
        help="kvlab's; default: 'cpu' on a CPU where its C kernel builds, else 'sdpa'",
    )
    parser.add_argument(
        "--custom-ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="kvlab's LLM(custom_ops=...); default: on where the C custom ops build",
    )
    parser.add_argument(
        "--matmul-floor",
        action="store_true",
        help="also profile one kvlab-continuous run: the time of its matrix multiplies alone",
    )
    parser.add_argument("--skip", nargs="*", default=[], help="method names to leave out")
    parser.add_argument("--repeat", type=int, default=1, help="runs per method; the fastest counts")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run_end_to_end(args)


if __name__ == "__main__":
    main()
