"""The Hugging Face baselines kvlab is measured against: three ways to serve a workload with
transformers alone.

    hf-one-at-a-time   ``model.generate``, one request after the other (batch 1)
    hf-static-padded   ``model.generate`` on left-padded batches of ``batch_size``
                       requests; each batch runs until its longest request is done
    hf-generate-batch  transformers' own continuous batching (its paged cache and
                       scheduler, the manager behind ``model.generate_batch``), sized
                       like kvlab: the same KV blocks, seats and token budget

Each decodes greedily and ignores EOS as vLLM's ``ignore_eos`` does (EOS may be generated,
and generation goes on), so every request generates exactly its output length and all
methods must produce the same tokens. KV utilization: one at a time holds exactly its
tokens (1.0); the padded run counts what its ``DynamicCache`` held against what its rows
used; ``generate_batch``'s is left unmeasured (n/a).

Not handled: sampling (greedy only), transformers' other cache classes (static,
offloaded, quantized).
"""

from __future__ import annotations

import contextlib
import logging
import time
from inspect import signature

import torch

from kvlab.measure.workload import Result, Workload


def run_hf_one_at_a_time(model, workload: Workload) -> Result:
    from transformers import GenerationConfig

    outputs = []
    start = time.perf_counter()
    for prompt, num_new in zip(workload.prompts, workload.output_lens, strict=True):
        config = _hf_config(GenerationConfig, num_new)
        ids = torch.tensor([prompt], device=model.device)
        # An explicit mask: without one, generate masks every token equal to pad_token_id.
        mask = torch.ones_like(ids)
        with _eos_never_ends():
            out = model.generate(ids, attention_mask=mask, generation_config=config)
        outputs.append(out[0, len(prompt) :].tolist())
    return Result("hf-one-at-a-time", time.perf_counter() - start, outputs, 1.0)


def run_hf_static_padded(model, workload: Workload, batch_size: int) -> Result:
    from transformers import GenerationConfig

    from kvlab.measure.padded_batch import left_pad

    outputs, held, used = [], 0, 0
    start = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first : first + batch_size]
        lens = workload.output_lens[first : first + batch_size]
        width, steps = max(map(len, prompts)), max(lens)
        ids, mask = left_pad(prompts, device=model.device)
        config = _hf_config(GenerationConfig, steps)
        with _eos_never_ends():
            out = model.generate(ids, attention_mask=mask, generation_config=config)
        outputs += [row[:n] for row, n in zip(out[:, width:].tolist(), lens, strict=True)]
        # DynamicCache holds batch x (width + t) slots at step t; a row's useful tokens are
        # its prompt and its own outputs (padding and tokens past its length are waste).
        for t in range(steps):
            held += len(prompts) * (width + t)
            used += sum(len(p) + min(t, n) for p, n in zip(prompts, lens, strict=True))
    return Result("hf-static-padded", time.perf_counter() - start, outputs, used / held)


def run_hf_generate_batch(
    model,
    workload: Workload,
    *,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> Result:
    """transformers' continuous batching (``generate_batch``'s manager), sized like kvlab:
    the same KV blocks of ``block_size`` tokens, seats and token budget per step."""
    seconds, finished = generate_batch(
        model,
        workload,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return Result("hf-generate-batch", seconds, [list(o.generated_tokens) for o in finished])


def generate_batch(
    model,
    workload: Workload,
    *,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    record_timestamps: bool = False,
) -> tuple[float, list]:
    """Run the workload through transformers' continuous batching, sized like kvlab.

    Returns:
        the seconds it took, and each request's finished output as transformers gives it
        (``generated_tokens``; ``timestamps`` of every token with ``record_timestamps``),
        in the workload's order.
    """
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = _hf_config(GenerationConfig, max(workload.output_lens))
    # transformers renamed block_size to page_size (5.2x); 5.17, on kvlab's GPU machines,
    # knows only block_size.
    size = (
        "page_size"
        if "page_size" in signature(ContinuousBatchingConfig).parameters
        else "block_size"
    )
    cb_config = ContinuousBatchingConfig(
        **{size: block_size},
        num_blocks=num_blocks,
        max_batch_tokens=max_num_batched_tokens,
        max_requests_per_batch=max_num_seqs,
    )
    options = {"record_timestamps": True} if record_timestamps else {}
    finished = {}
    start = time.perf_counter()
    with model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cb_config, warmup=False
    ) as manager:
        for i, (prompt, num_new) in enumerate(
            zip(workload.prompts, workload.output_lens, strict=True)
        ):
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=num_new, **options)
        while len(finished) < len(workload.prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                finished[result.request_id] = result
            elif result is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped")
        seconds = time.perf_counter() - start  # before the manager's shutdown
    return seconds, [finished[f"r{i}"] for i in range(len(workload.prompts))]


def _hf_config(generation_config_cls, max_new_tokens: int):
    # EOS ignored as vLLM's ignore_eos does it: an EOS token may be generated, and generation
    # goes on after it. (min_new_tokens would instead forbid EOS, a different greedy choice
    # wherever EOS is the most likely token.) No token has id -1, so none ends a row.
    return generation_config_cls(
        max_new_tokens=max_new_tokens,
        eos_token_id=-1,
        do_sample=False,
        pad_token_id=0,
    )


@contextlib.contextmanager
def _eos_never_ends():
    """Silence transformers' warning, on every call, that EOS id -1 never ends a row: the
    point of ``_hf_config``."""
    logger = logging.getLogger("transformers.generation.utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
