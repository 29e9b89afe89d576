"""What one step feeds the model: the scheduler's plan packed into one flat batch.

Step 4 of the serving loop computes every scheduled sequence at once, varlen style: the
new tokens of all sequences, one after another, in one ``input_ids`` row, and a
``ForwardBatch`` that says where each sequence's tokens start and how much context it
already has (the cache turns that into the block table and slot mapping). A 300-token
prefill chunk and 60 decodes share the same matmuls:

    out.requests      r0 (prefill chunk of 3)    r1 (decode)    r2 (decode)
    input_ids         [t0, t1, t2,               t7,            t4]
    query_start_loc   [0,                        3,             4,           5]

The same walk counts what the step computes (``StepWork``), for the step-cost clock.

Not handled: padding (there is none), sampling (the engine samples the last row of each
sequence that has all its tokens computed).
"""

from __future__ import annotations

import torch

from kvlab.cache.step import ForwardBatch
from kvlab.engine.scheduler_output import SchedulerOutput
from kvlab.engine.step_cost import StepWork


def pack_step(out: SchedulerOutput, device) -> tuple[torch.Tensor, ForwardBatch, StepWork]:
    """The flat ``input_ids`` (num_tokens,), the ``ForwardBatch``, and what the step computes."""
    seq_ids, num_computed, input_ids = [], [], []
    num_decode = context = pairs = 0
    for request, num_new in zip(out.requests, out.num_new_tokens, strict=True):
        start = request.num_computed_tokens
        seq_ids.append(request.seq_id)
        num_computed.append(start)
        context += start + num_new
        if num_new == 1:
            input_ids.append(request.token_ids[start])
            pairs += start + 1
            # A decode computes the token sampled last step: it is past the prompt.
            num_decode += start >= len(request.prompt_token_ids)
        else:
            input_ids.extend(request.token_ids[start : start + num_new])
            pairs += num_new * start + num_new * (num_new + 1) // 2
    batch = ForwardBatch.build(seq_ids, num_computed, out.num_new_tokens, device)
    ids = torch.tensor(input_ids, dtype=torch.long, device=device)
    work = StepWork(
        num_prefill_tokens=out.num_tokens - num_decode,
        num_decode_seqs=num_decode,
        num_context_tokens=context,
        num_attention_pairs=pairs,
        num_blocks_copied=len(out.blocks_to_copy),
        num_blocks_swapped=out.num_blocks_swapped,
        num_blocks_prefetched=out.num_blocks_prefetched,
    )
    return ids, batch, work
