"""The batching panel's knobs: their values, each checked against its range, and their sliders.

    PanelSettings   the values of the panel's controls (a frozen dataclass): scheduling,
                    max_num_seqs, batch_timeout, block_size, num_blocks,
                    max_num_batched_tokens, arrival_rate
    sliders         one ipywidgets slider per number among them, over the same ranges
                    (``scheduling`` is the panel's toggle)

A value outside its range raises ``ValueError`` that says what is allowed, whether it
comes from ``BatchingPanel(**settings)`` or from ``BatchingPanel.set``.

Not handled: the knobs of ``kvlab.LLM`` the panel has no control for (``preemption_mode``,
``watermark`` and ``enable_prefix_caching`` are its arguments; the attention backend and
the rest keep ``LLM``'s defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets

from kvlab.engine.scheduler_config import SCHEDULING_MODES

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
NUM_BLOCKS = (4, 512, 4)  # the num_blocks slider: lowest, highest, step
SLIDER_WIDTH = "305px"


@dataclass(frozen=True)
class PanelSettings:
    """The values of the panel's controls, each checked against its slider's range.

    Attributes:
        scheduling: ``"static"``, ``"dynamic"`` or ``"continuous"`` (the timeline's policy).
        max_num_seqs: sequences that run at once (the seed article's max_batch_size), 1-16.
        batch_timeout: dynamic only: seconds a batch waits to fill, 0-2.
        block_size: tokens per KV block, a power of two from 1 to 64.
        num_blocks: KV blocks in the pool, 4-512.
        max_num_batched_tokens: the token budget of one continuous step, 16-512.
        arrival_rate: mean requests per second of the trace, 0.5-50.
    """

    scheduling: str = "continuous"
    max_num_seqs: int = 4
    batch_timeout: float = 0.1
    block_size: int = 8
    num_blocks: int = 64
    max_num_batched_tokens: int = 32
    arrival_rate: float = 8.0

    def __post_init__(self) -> None:
        if self.scheduling not in SCHEDULING_MODES:
            refuse("scheduling", self.scheduling, f"one of {SCHEDULING_MODES}")
        check_number("max_num_seqs", self.max_num_seqs, 1, 16, integer=True)
        check_number("batch_timeout", self.batch_timeout, 0, 2)
        if self.block_size not in BLOCK_SIZES or isinstance(self.block_size, bool):
            refuse("block_size", self.block_size, f"one of {BLOCK_SIZES}")
        check_number("num_blocks", self.num_blocks, *NUM_BLOCKS[:2], integer=True)
        check_number("max_num_batched_tokens", self.max_num_batched_tokens, 16, 512, integer=True)
        check_number("arrival_rate", self.arrival_rate, 0.5, 50)

    def describe(self) -> str:
        return (
            f"max_num_seqs={self.max_num_seqs}, batch_timeout={self.batch_timeout:.2f} s, "
            f"block_size={self.block_size}, num_blocks={self.num_blocks}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, "
            f"{self.arrival_rate:g} requests/s"
        )


def refuse(name: str, value, allowed: str):
    raise ValueError(f"{name}={value!r} is not allowed: use {allowed}")


def check_number(name: str, value, low, high, integer: bool = False) -> None:
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        refuse(name, value, f"{'an int' if integer else 'a number'} from {low} to {high}")


def sliders(settings: PanelSettings) -> dict[str, widgets.Widget]:
    """One slider per knob, at the values of ``settings``; none replays while dragged."""
    # Three columns of 305 px fit JupyterLab's output area beside its file browser on a
    # 1366 px laptop (about 930 px); the panel's grid wraps them in a narrower area.
    # Each name as wide as it needs ("initial"), so that short names leave a longer track.
    style = {"description_width": "initial"}
    common = dict(continuous_update=False, style=style, layout=widgets.Layout(width=SLIDER_WIDTH))
    return {
        "max_num_seqs": widgets.IntSlider(
            value=settings.max_num_seqs, min=1, max=16, description="max_num_seqs", **common
        ),
        "batch_timeout": widgets.FloatSlider(
            value=settings.batch_timeout,
            min=0,
            max=2,
            step=0.05,
            readout_format=".2f",
            description="batch_timeout (s)",
            **common,
        ),
        "block_size": widgets.SelectionSlider(
            value=settings.block_size, options=BLOCK_SIZES, description="block_size", **common
        ),
        "num_blocks": widgets.IntSlider(
            value=settings.num_blocks,
            min=NUM_BLOCKS[0],
            max=NUM_BLOCKS[1],
            step=NUM_BLOCKS[2],
            description="num_blocks",
            **common,
        ),
        "max_num_batched_tokens": widgets.IntSlider(
            value=settings.max_num_batched_tokens,
            min=16,
            max=512,
            step=16,
            description="max_num_batched_tokens",
            **common,
        ),
        "arrival_rate": widgets.FloatSlider(
            value=settings.arrival_rate,
            min=0.5,
            max=50,
            step=0.5,
            readout_format=".1f",
            description="arrival_rate (req/s)",
            **common,
        ),
    }
