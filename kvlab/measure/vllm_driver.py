"""Run one workload on vLLM and print what came out; executed by the side environment.

This file is run as a script by the Python of vLLM's own environment (``make vllm-env``),
which has no kvlab: it imports nothing from kvlab. It reads a JSON job on stdin

    {"model": folder, "prompts": [[ids]], "max_tokens": [n], "rounds": 2,
     "max_num_seqs": 16, "block_size": 16, "max_num_batched_tokens": 512,
     "enable_prefix_caching": false, "max_model_len": 2048, "memory_utilization": 0.25}

and prints one line ``KVLAB_RESULT {json}`` with the generated token ids (greedy, EOS
ignored, so every request makes exactly its ``max_tokens``), the seconds of each round,
vLLM's version, and vLLM's own counters (preemptions, KV usage, prefix-cache hits).

Not handled: sampling, text prompts, GPUs other than what vLLM finds by itself.
"""

import json
import sys
import time


def _counters(llm) -> dict:
    """vLLM's own metrics, by name (counters and gauges only)."""
    found = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if isinstance(value, int | float):
            found[metric.name] = value
    return found


def main() -> None:
    job = json.loads(sys.stdin.read())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(
        model=job["model"],
        dtype="float32",
        max_model_len=job["max_model_len"],
        max_num_seqs=job["max_num_seqs"],
        max_num_batched_tokens=job["max_num_batched_tokens"],
        block_size=job["block_size"],
        enable_prefix_caching=job["enable_prefix_caching"],
        # On a CPU this is the share of the machine's memory vLLM takes (weights and KV);
        # its default, 0.92, fails on a machine where anything else runs.
        gpu_memory_utilization=job["memory_utilization"],
        seed=0,
        disable_log_stats=False,
    )
    load_seconds = time.perf_counter() - start
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in job["max_tokens"]
    ]
    seconds, tokens = [], None
    for _ in range(job["rounds"]):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
    import vllm

    result = {
        "version": vllm.__version__,
        "load_seconds": load_seconds,
        "seconds": seconds,
        "tokens": tokens,
        "counters": _counters(llm),
    }
    print("KVLAB_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":  # vLLM starts an engine-core process: guard the entry point
    main()
