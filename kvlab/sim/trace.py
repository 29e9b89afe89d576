"""Request traces: when requests arrive and how long their prompts and outputs are.

A trace is what a memory or serving experiment replays: arrival times from a Poisson
process, prompt and output lengths drawn from a length profile (lognormal, with the means
of the PagedAttention paper's datasets). Seeded, so every run replays the same trace.

Not handled: real datasets (no download here), multi-turn conversations, shared prefixes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthProfile:
    """Prompt and output lengths of a workload: lognormal with these means and shapes.

    A lognormal with mean ``m`` and shape ``sigma`` draws ``exp(N(log(m) - sigma**2 / 2,
    sigma))``: most requests are short, a few are very long (the long tail of real chats).
    ``sigma=None`` draws uniform integers from 1 to ``2 * mean - 1`` instead (same mean,
    no tail).
    """

    prompt_mean: float
    prompt_sigma: float | None
    output_mean: float
    output_sigma: float | None


# Means from the PagedAttention paper's datasets (Fig. 11): ShareGPT averages 161 input and
# 338 output tokens, Alpaca 19.3 and 58.5. The shapes are ours: lognormal, chosen for a long
# tail (ShareGPT) and short, tight instructions (Alpaca). They are not fitted to the data.
LENGTH_PROFILES = {
    "sharegpt": LengthProfile(161.0, 1.2, 338.0, 0.9),
    "alpaca": LengthProfile(19.3, 0.6, 58.5, 0.8),
    "uniform": LengthProfile(161.0, None, 338.0, None),
}


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order.

    Attributes:
        arrival_s: arrival time of each request, in seconds from the start.
        prompt_lens: prompt tokens of each request.
        output_lens: output tokens each request generates before it finishes.
        lengths: the length profile's name; seed: the seed that drew the trace.
    """

    arrival_s: tuple[float, ...]
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    lengths: str = ""
    seed: int = 0

    def __len__(self) -> int:
        return len(self.prompt_lens)

    @property
    def mean_prompt_len(self) -> float:
        return sum(self.prompt_lens) / len(self)

    @property
    def mean_output_len(self) -> float:
        return sum(self.output_lens) / len(self)


def make_trace(
    num_requests: int,
    lengths: str = "sharegpt",
    arrival_rate: float = 20.0,
    seed: int = 0,
    max_model_len: int = 4096,
) -> Trace:
    """Draw a seeded trace: Poisson arrivals, lengths from a ``LENGTH_PROFILES`` profile.

    Args:
        num_requests: requests in the trace.
        lengths: ``"sharegpt"``, ``"alpaca"`` or ``"uniform"``.
        arrival_rate: mean requests per second; ``math.inf`` puts every arrival at 0.
        seed: the same seed gives the same trace.
        max_model_len: pairs with prompt + output above it are drawn again.
    """
    if lengths not in LENGTH_PROFILES:
        raise ValueError(f"lengths must be one of {sorted(LENGTH_PROFILES)}, got {lengths!r}")
    if num_requests <= 0 or arrival_rate <= 0:
        raise ValueError(
            f"num_requests and arrival_rate must be > 0, got {num_requests}, {arrival_rate}"
        )
    profile = LENGTH_PROFILES[lengths]
    rng = np.random.default_rng(seed)
    prompts, outputs = [], []
    while len(prompts) < num_requests:
        prompt = _draw_lengths(rng, profile.prompt_mean, profile.prompt_sigma, num_requests)
        output = _draw_lengths(rng, profile.output_mean, profile.output_sigma, num_requests)
        keep = prompt + output <= max_model_len
        prompts.extend(prompt[keep].tolist())
        outputs.extend(output[keep].tolist())
    if math.isinf(arrival_rate):
        arrivals = [0.0] * num_requests
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / arrival_rate, num_requests)).tolist()
    return Trace(
        tuple(arrivals),
        tuple(prompts[:num_requests]),
        tuple(outputs[:num_requests]),
        lengths,
        seed,
    )


def _draw_lengths(rng, mean: float, sigma: float | None, num: int) -> np.ndarray:
    if sigma is None:
        return rng.integers(1, round(2 * mean), num)
    draws = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, num)
    return np.maximum(1, np.rint(draws)).astype(np.int64)
