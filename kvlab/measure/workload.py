"""The benchmarks' workload: requests with chat traffic's lengths, scaled for a CPU, and
what one method's run of them returns.

``make_workload`` draws a seeded trace of ShareGPT-like lengths (``kvlab.sim.trace``) and
scales it down for a small model: prompts of random token ids, and for each request the
exact number of tokens it generates (every method ignores EOS, so all of them generate the
same number). ``Result`` is what each method reports: wall time, tokens, KV utilization.
The end-to-end benchmark (``kvlab.measure.bench``), lab 07's capstone
(``kvlab.measure.capstone``) and the comparison with vLLM (``kvlab.measure.vllm_peer``)
all run this workload.

Not handled: real prompt text (random token ids: with EOS ignored, only the lengths shape
the work), arrival times (every request is there at the start; ``kvlab.measure.replay``
replays arrivals).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlab.sim.trace import make_trace


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) and how many tokens each request generates."""

    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(
    num_requests: int,
    vocab_size: int,
    max_prompt_len: int = 256,
    max_tokens: int = 64,
    prompt_scale: float = 0.25,
    output_scale: float = 0.1,
    seed: int = 0,
    exclude_ids: tuple[int, ...] = (),
) -> Workload:
    """ShareGPT-like lengths (161 prompt, 338 output tokens on average) scaled for a CPU.

    Prompt lengths are ``prompt_scale`` x the trace's (at most ``max_prompt_len``), output
    lengths ``output_scale`` x (at most ``max_tokens``); token ids are drawn at random.
    """
    trace = make_trace(num_requests, "sharegpt", arrival_rate=math.inf, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    prompts, outputs = [], []
    for prompt_len, output_len in zip(trace.prompt_lens, trace.output_lens, strict=True):
        n = min(max(round(prompt_len * prompt_scale), 4), max_prompt_len)
        # Ids from 3 up: 0-2 are the pad/bos/eos ids of Llama-style vocabularies.
        ids = torch.randint(3, vocab_size, (n,), generator=generator).tolist()
        prompts.append([t if t not in exclude_ids else (t + 1) % vocab_size for t in ids])
        outputs.append(min(max(round(output_len * output_scale), 1), max_tokens))
    return Workload(prompts, outputs)


@dataclass
class Result:
    """One method's run: wall time, tokens, and (where it can be known) KV utilization."""

    name: str
    seconds: float
    outputs: list[list[int]]
    kv_utilization: float | None = None
    note: str = ""
