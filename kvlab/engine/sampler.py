"""Turn each sequence's last-token logits into its next token.

Greedy rows take the argmax, all at once. Sampled rows go through the usual chain

    logits / temperature -> keep top_k -> keep top_p (nucleus) -> softmax -> draw

and the draw uses each request's *own* ``torch.Generator``. That is what makes a seeded
request reproducible whatever else shares its batch, and after a preemption: its
generator advances only when one of its tokens is drawn, never for another request's.

The draw is vLLM's: ``argmax(probs / q)`` with ``q ~ Exponential(1)`` drawn from the
request's generator. It picks token ``i`` with probability ``probs[i]`` (the "exponential
race"; the same trick as Gumbel-max) and needs no cumulative sum.

Not handled: penalties, logprobs, min_p, logits processors, beam search.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvlab.engine.request import Request


def sample(logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
    """The next token of each request.

    Args:
        logits: (num_seqs, vocab_size) last-token logits, row ``i`` for ``requests[i]``.
        requests: whose ``sampling_params`` and ``generator`` decide each row.

    Returns:
        One token id per row.
    """
    tokens = logits.argmax(dim=-1).tolist()  # greedy for every row; sampled rows overwrite
    sampled = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
    if not sampled:
        return tokens
    probs = sampling_probs(logits[sampled].float(), [requests[i] for i in sampled])
    for row, i in enumerate(sampled):
        generator = requests[i].generator
        q = torch.empty_like(probs[row]).exponential_(generator=generator)
        tokens[i] = int((probs[row] / q).argmax())
    return tokens


def sampling_probs(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p, each row its request's settings.

    Args:
        logits: (num_rows, vocab_size) float32.

    Returns:
        (num_rows, vocab_size) probabilities; filtered-out tokens have probability 0.
    """
    params = [r.sampling_params for r in requests]
    temperature = torch.tensor([p.temperature for p in params], device=logits.device)
    logits = logits / temperature[:, None]
    top_k = [p.top_k_limit for p in params]
    top_p = [p.top_p for p in params]
    if any(top_k) or any(p < 1.0 for p in top_p):
        logits = _top_k_top_p(logits, top_k, top_p)
    return logits.softmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask (to -inf) the tokens outside each row's top-k and top-p sets."""
    vocab_size = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (rows, vocab)
    ranks = torch.arange(vocab_size, device=logits.device)
    k = torch.tensor([kk or vocab_size for kk in top_k], device=logits.device)
    drop = ranks[None, :] >= k[:, None]  # beyond the k most likely
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Keep a token if the tokens more likely than it have not yet reached top_p: the most
    # likely token is always kept, and the set is the smallest that reaches top_p.
    mass_before = probs.cumsum(dim=-1) - probs
    p = torch.tensor(top_p, device=logits.device)
    drop |= mass_before >= p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one sample, seeded so that the same seed draws the same tokens."""
    return torch.Generator(device=device).manual_seed(seed)
