"""The replays behind the batching panel: one seeded trace through ``kvlab.LLM``, no widgets.

``BatchingReplays`` holds what stays fixed while the panel's knobs move: the model, the
trace (``kvlab.sim.trace.make_trace``: its size, length profile and seed), the cap on
output lengths, the clock, the preemption options and prefix caching. For each replay it makes the
trace's requests at the knobs' arrival rate (``requests``) and a fresh ``LLM`` set by the
knobs (``llm``); the panel runs them (``kvlab.measure.replay.replay``) and draws what
they did, or says why the knobs cannot replay the trace (``refusal``).

Every replay runs on a simulated clock, so its numbers are exact and repeatable: a
``ManualClock`` whose steps last ``step_seconds``, or with ``step_cost`` (a ``Roofline``,
or a calibration of lab 04) a ``StepCostClock`` whose steps last what they compute.

Not handled: sampled requests (greedy only), ``n > 1``, real (wall-clock) timing.
"""

from __future__ import annotations

import math
from dataclasses import fields

from kvlab.engine.llm import LLM
from kvlab.engine.metrics import ManualClock
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.step_cost import StepCostClock
from kvlab.measure.replay import TraceRequests, on_time_grid
from kvlab.model.loading import load_model
from kvlab.sim.trace import LENGTH_PROFILES, make_trace
from kvlab.widgets.batching_knobs import NUM_BLOCKS, PanelSettings, check_number, refuse


class BatchingReplays:
    """A model and a seeded trace, replayed through ``kvlab.LLM`` as the panel's knobs say.

    Args:
        model, num_requests, lengths, seed, max_output_len, step_seconds, step_cost,
            preemption_mode, watermark, enable_prefix_caching: as ``BatchingPanel``'s,
            each checked here.
        **settings: the knobs' starting values (``PanelSettings`` fields).

    Attributes:
        settings: those starting values, checked (``PanelSettings``).
        model, tokenizer: what is replayed (no tokenizer with a loaded model).
        weight_bytes: the model's weights, for the memory gauge.
    """

    def __init__(
        self,
        model,
        *,
        num_requests: int,
        lengths: str,
        seed: int,
        max_output_len: int,
        step_seconds: float,
        step_cost,
        preemption_mode: str,
        watermark: float,
        enable_prefix_caching: bool,
        **settings,
    ) -> None:
        check_number("num_requests", num_requests, 1, 256, integer=True)
        check_number("max_output_len", max_output_len, 1, 4096, integer=True)
        if lengths not in LENGTH_PROFILES:
            refuse("lengths", lengths, f"one of {sorted(LENGTH_PROFILES)}")
        if isinstance(step_seconds, bool) or not isinstance(step_seconds, int | float):
            refuse("step_seconds", step_seconds, "seconds > 0")
        if not 0 < step_seconds < math.inf:
            refuse("step_seconds", step_seconds, "seconds > 0")
        unknown = set(settings) - {f.name for f in fields(PanelSettings)}
        if unknown:
            raise TypeError(f"BatchingPanel got unknown settings {sorted(unknown)}")
        self.settings = PanelSettings(**settings)
        self.options = dict(preemption_mode=preemption_mode, watermark=watermark)
        SchedulerConfig(**self.options)  # checks both now, not at the first replay
        if not isinstance(enable_prefix_caching, bool):
            refuse("enable_prefix_caching", enable_prefix_caching, "True or False")
        self.enable_prefix_caching = enable_prefix_caching
        self.model, self.tokenizer = _model_of(model)
        self.trace_args = dict(num_requests=num_requests, lengths=lengths, seed=seed)
        self.max_output_len = max_output_len
        self.step_seconds = step_seconds
        if step_cost is not None:
            StepCostClock(step_cost)  # checks it now, not at the first replay
        self.step_cost = step_cost
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    def requests(self, arrival_rate: float) -> TraceRequests:
        """The trace's requests, arriving at ``arrival_rate`` per second on average."""
        trace = make_trace(
            arrival_rate=arrival_rate,
            max_model_len=self.model.config.max_position_embeddings,
            **self.trace_args,
        )
        vocab_size = self.model.config.vocab_size
        seed = self.trace_args["seed"]
        return TraceRequests.from_trace(trace, vocab_size, self.max_output_len, seed)

    def llm(self, settings: PanelSettings, policy: str) -> LLM:
        """A fresh ``kvlab.LLM`` set by the knobs, scheduling by ``policy``, on its own clock."""
        return LLM(
            self.model,
            tokenizer=self.tokenizer,
            scheduling=policy,
            max_num_seqs=settings.max_num_seqs,
            batch_timeout=on_time_grid(settings.batch_timeout),
            block_size=settings.block_size,
            num_blocks=settings.num_blocks,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            clock=self.clock(),
            enable_prefix_caching=self.enable_prefix_caching,
            **self.options,
        )

    def refusal(self, llm: LLM, requests: TraceRequests) -> str | None:
        """Why ``llm`` cannot replay ``requests``, in the panel's words; None when it can.

        The engine's own check (``check_request``) decides which requests can never run,
        even alone; its advice ("lower max_tokens") names a knob the panel has no slider
        for, so this names the sliders that would let the largest of them fit.
        """
        kv, max_model_len = llm.engine.kv, llm.engine.max_model_len
        sizes = zip(requests.prompts, requests.max_tokens, strict=True)
        refused = [
            (i, len(prompt), max_tokens)
            for i, (prompt, max_tokens) in enumerate(sizes)
            if kv.check_request(len(prompt), max_tokens, max_model_len) is not None
        ]
        if not refused:
            return None
        i, prompt_len, max_tokens = max(refused, key=lambda r: min(r[1] + r[2], max_model_len))
        need = kv.blocks_for(min(prompt_len + max_tokens, max_model_len))
        lowest, highest, step = NUM_BLOCKS
        enough = max(lowest, -(-need // step) * step)
        fixes = [f"num_blocks to {enough} or more"] if enough <= highest else []
        fixes.append("block_size up (a block holds block_size tokens)")
        return (
            f"r{i} needs {need} KV blocks ({prompt_len} prompt + {max_tokens} output tokens "
            f"at block_size={kv.block_size}) but the pool has num_blocks={kv.num_blocks}: "
            f"move {', or '.join(fixes)}"
        )

    def clock(self):
        """A new simulated clock: steps of ``step_seconds``, or of what they cost."""
        if self.step_cost is None:
            return ManualClock(self.step_seconds)
        return StepCostClock(self.step_cost)


def _model_of(model):
    """(model, tokenizer) from a name, or a loaded model (no tokenizer needed)."""
    if isinstance(model, str):
        return load_model(model, device="cpu")
    if hasattr(model, "config") and hasattr(model, "parameters"):
        return model, None
    raise ValueError(
        f"model={model!r} is not allowed: use 'tiny', 'smollm2-135m' or a loaded model"
    )
