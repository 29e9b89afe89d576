"""Step 5 of the serving loop: sample a token for every sequence that is complete, fork.

After the forward pass, ``LLMEngine.step`` walks the step's sequences in row order:

    num_computed_tokens += the tokens just computed
    all of its tokens computed?   no: a prefill chunk that is not its last; nothing sampled
                                  yes: one token sampled from its row of the logits
    n > 1 and its first token?    its samples 1..n-1 start here (fork): each shares the
                                  prompt's blocks (copy-on-write) and draws its own token
    the token ends it?            EOS (unless ignore_eos), max_tokens, or max_model_len

and records when each token came (TTFT, the gaps between tokens). ``SampleStep`` is a part
of ``kvlab.engine.llm_engine.LLMEngine``, split out so that the loop reads on its own; it
uses the engine's cache, scheduler and samples and is not meant to be used alone.

Not handled: beam search, logprobs, stop strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvlab.cache.manager import CacheFullError
from kvlab.engine.request import Request
from kvlab.engine.sampler import make_generator, sample
from kvlab.engine.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    import itertools

    from kvlab.cache.base import PooledKVCache
    from kvlab.engine.scheduler import Scheduler


class SampleStep:
    """Sampling and forking, for the ``LLMEngine`` that inherits them."""

    # Set by LLMEngine.__init__.
    cache: PooledKVCache
    scheduler: Scheduler
    runner: object
    _samples: dict[str, list[Request]]
    _seq_ids: itertools.count

    def _update(self, out: SchedulerOutput, logits: torch.Tensor, now: float):
        """Count computed tokens, sample where a sequence is complete, fork, spot the finished.

        Returns:
            the finished samples, and the ids of the requests to report (those that got a
            token: all, for "cumulative" output; only finished ones for "final_only").
        """
        # NOTE: both loops run over every running sequence every step: lengths are read
        # with len() rather than through the Request's properties.
        rows = []
        for i, (request, num_new) in enumerate(zip(out.requests, out.num_new_tokens, strict=True)):
            request.num_computed_tokens += num_new
            if request.num_computed_tokens == len(request.token_ids):
                rows.append(i)  # a prefill chunk that is not the last one samples nothing
        if len(rows) == len(out.requests):  # every row samples (any step without a chunk)
            sampled, tokens = out.requests, sample(logits, out.requests)
        else:
            sampled = [out.requests[i] for i in rows]
            tokens = sample(logits[rows], sampled) if rows else []
        finished, touched = [], {}
        for i, request, token in zip(rows, sampled, tokens, strict=True):
            if request.first_token_time is None:
                request.first_token_time = now
            elif now - request.last_token_time > request.max_token_gap:
                request.max_token_gap = now - request.last_token_time
            request.last_token_time = now
            if request.sampling_params.n > 1 and not request.output_token_ids:
                finished.extend(self._fork(request, logits[i], now))
            if request.append_token(token):
                request.finished_time = now
                finished.append(request)
                touched[request.request_id] = None
            elif request.sampling_params.output_kind == "cumulative":
                touched[request.request_id] = None  # a running request reports every token
        return finished, list(touched)

    def _fork(self, parent: Request, logits_row: torch.Tensor, now: float) -> list[Request]:
        """Start samples 1..n-1 of ``parent``, sharing its prompt's blocks; return finished."""
        children = []
        for index in range(1, parent.sampling_params.n):
            generator = None
            if parent.base_seed is not None:
                generator = make_generator(parent.base_seed + index, self.runner.device)
            child = parent.fork(next(self._seq_ids), index, generator)
            child.first_token_time = child.last_token_time = now
            children.append(child)
        tokens = sample(logits_row.expand(len(children), -1), children)
        finished = []
        for child, token in zip(children, tokens, strict=True):
            self._samples[parent.request_id].append(child)
            done = child.append_token(token)
            if done:
                child.finished_time = now
            try:
                self.cache.fork(parent.seq_id, child.seq_id)
            except CacheFullError:
                self.scheduler.fork_failed(child)  # it waits, or finishes if it is done
                continue
            self.scheduler.add_forked(child)
            if done:
                finished.append(child)
        return finished
