"""Helpers the allocator labs share, so that no notebook pastes library code.

    Recording()                             an ``on_step`` callback for
                                            ``kvlab.measure.serve.serve``: after every
                                            step (once the requests that finished in it
                                            freed their memory) it keeps the pool (for a
                                            StepView), the cache's fragmentation and, if
                                            asked, the block tables
    recording.last_table(seq_id)            the last step at which a sequence held
                                            blocks, and its block table then
    recording.view(title, weight_bytes)     a step slider, page map and memory gauge over
                                            the run, resting on its fullest step (each
                                            step labelled, if labels are given)
    recording.in_hindsight(final_slots)     each step's fragmentation with the held slots
                                            the sequences wrote later split off as
                                            ``reservation`` (the paper's four kinds)
    Recording(arena=True)                   also keeps a contiguous arena's holes and
                                            ranges after every step
    recording.placements()                  where each range of a contiguous arena went
    waiting_at(result, step)                the requests that had arrived but not started:
                                            after that step they wait
    block_step_labels(recording, result)    what each step of a paged run did: who started
                                            in which blocks, who took a block, who ended
    describe_fullest(history, label)        the step where a cache held the most tokens,
                                            in words, and the mean use over the steps
                                            that held memory

Not handled: the engine's widgets (lab 04's batching panel is ``kvlab.widgets``).
"""

from __future__ import annotations

from dataclasses import replace

from kvlab.cache.base import PooledKVCache
from kvlab.measure.experiments import Fragmentation, fragmentation
from kvlab.measure.serve import ServeResult
from kvlab.widgets import format_bytes
from kvlab.widgets.step_view import PoolSnapshot, StepView


class Recording:
    """An ``on_step(step, cache)`` callback that records the KV pool after every step.

    Args:
        request_size: passed to ``fragmentation`` (the slots one more request needs).
        tables: also record every sequence's block table.
        arena: also record a contiguous cache's holes and ranges (its ``arena``).

    Attributes:
        snapshots: one ``PoolSnapshot`` per step.
        fragmentation: one ``Fragmentation`` per step.
        tables: one ``{seq_id: block_table}`` per step (empty unless ``tables``).
        held: one ``{seq_id: (held slots, written slots)}`` per step.
        holes: one list of ``(start, length)`` free runs per step (empty unless ``arena``).
        ranges: one ``{seq_id: (start, num_slots)}`` per step (empty unless ``arena``).
    """

    def __init__(
        self, request_size: int | None = None, tables: bool = False, arena: bool = False
    ) -> None:
        self.request_size = request_size
        self.record_tables = tables
        self.record_arena = arena
        self.snapshots: list[PoolSnapshot] = []
        self.fragmentation: list[Fragmentation] = []
        self.tables: list[dict[int, list[int]]] = []
        self.held: list[dict[int, tuple[int, int]]] = []
        self.holes: list[list[tuple[int, int]]] = []
        self.ranges: list[dict[int, tuple[int, int]]] = []

    def __call__(self, step: int, cache: PooledKVCache) -> None:
        self.snapshots.append(PoolSnapshot.of(cache, step))
        self.fragmentation.append(fragmentation(cache, self.request_size))
        kv = cache.manager
        self.held.append({s: (kv.held_slots(s), kv.num_tokens(s)) for s in kv.seq_ids()})
        if self.record_tables:
            self.tables.append({s: cache.block_table(s) for s in cache.manager.seq_ids()})
        if self.record_arena:
            arena = cache.arena  # a ContiguousKVCache's; a paged cache has none
            self.holes.append(arena.holes())
            ranges = {s: arena.range_of(s) for s in arena.seq_ids()}
            self.ranges.append({s: (r.start, r.num_slots) for s, r in ranges.items()})

    def placements(self) -> dict[int, tuple[int, int]]:
        """Where each sequence's range went: ``seq_id -> (start, num_slots)``, in the
        order the ranges were placed (needs ``Recording(arena=True)``)."""
        if not self.record_arena:
            raise ValueError("placements() needs a Recording(arena=True)")
        placed: dict[int, tuple[int, int]] = {}
        for ranges in self.ranges:
            for seq_id, where in ranges.items():
                placed.setdefault(seq_id, where)
        return placed

    def last_table(self, seq_id: int) -> tuple[int, list[int]]:
        """The last step at which ``seq_id`` held blocks, and its block table then.

        A sequence frees its blocks in the step that finishes it, so this is its table one
        step before its end: the token it fed in its last step may have taken one block
        more.
        """
        for step in range(len(self.tables) - 1, -1, -1):
            if seq_id in self.tables[step]:
                return step, self.tables[step][seq_id]
        raise ValueError(f"seq_id={seq_id!r} holds no block in any recorded step")

    def in_hindsight(self, final_slots: dict[int, int]) -> list[Fragmentation]:
        """Each step's fragmentation, its ``internal`` split once the run is over.

        A held slot that its sequence wrote later is ``reservation`` (held for tokens
        still to come); one it never wrote stays ``internal``. ``final_slots`` gives the
        slots each sequence had written when it ended (``ServeResult.final_slots``).
        """
        split = []
        for frag, held in zip(self.fragmentation, self.held, strict=True):
            later = sum(
                max(0, min(slots, final_slots.get(seq_id, used)) - used)
                for seq_id, (slots, used) in held.items()
            )
            split.append(replace(frag, reservation=later, internal=frag.internal - later))
        return split

    def view(
        self,
        title: str,
        weight_bytes: int,
        step: int | None = None,
        labels: list[str] | None = None,
    ) -> StepView:
        """A ``StepView`` of the run, resting on ``step`` (default: the fullest), each step
        titled by ``labels`` (one per step) where given, else "after step N"."""
        snapshots = self.snapshots
        if labels is not None:
            if len(labels) != len(snapshots):
                raise ValueError(f"{len(labels)} labels for {len(snapshots)} steps: give one each")
            pairs = zip(snapshots, labels, strict=True)
            snapshots = [replace(snapshot, label=label) for snapshot, label in pairs]
        return StepView(snapshots, title=title, weight_bytes=weight_bytes, step=step)


def waiting_at(result: ServeResult, step: int) -> list[int]:
    """The requests that had arrived by ``step`` but not yet started: they wait after it.

    A request starts in the step that admits it, so one that arrived at step 8 and started
    at step 12 waits after steps 8 to 11. Refused requests never wait.
    """
    return [
        i
        for i, (arrival, start) in enumerate(
            zip(result.arrival_steps, result.start_steps, strict=True)
        )
        if start is not None and arrival <= step < start
    ]


def block_step_labels(recording: Recording, result: ServeResult) -> list[str]:
    """What each recorded step of a paged run did, as a ``PoolSnapshot`` label: "step 8"
    alone when requests only wrote into blocks they held, else "step 8: " and who started
    in which blocks, who took a new block, who ended and who waits.

    In that order, as the engine does it: a step first gives blocks to the requests it
    schedules, runs the model, then frees the blocks of the requests that finished (they
    serve others from the next step). Needs ``Recording(tables=True)``.
    """
    if not recording.record_tables:
        raise ValueError("block_step_labels() needs a Recording(tables=True)")
    labels = []
    before: dict[int, list[int]] = {}
    for snapshot, tables in zip(recording.snapshots, recording.tables, strict=True):
        started = [s for s in tables if s not in before]
        if before or len(started) == 1:
            events = [f"request {s} started in blocks {_ids(tables[s])}" for s in started]
        else:  # the first requests: the map shows where each went
            events = [f"requests {_ids(started)} started"] if started else []
        events += [
            f"request {s} took block {_ids(table[len(before[s]) :])}"
            for s, table in tables.items()
            if s in before and len(table) > len(before[s])
        ]
        events += [f"request {s} ended" for s in before if s not in tables]
        events += [f"request {s} waits" for s in waiting_at(result, snapshot.step)]
        step = f"step {snapshot.step}"
        labels.append(f"{step}: " + "; ".join(events) if events else step)
        before = tables
    return labels


def _ids(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))


def describe_fullest(history: list[Fragmentation], label: str) -> tuple[str, Fragmentation]:
    """The step of ``history`` where the cache held the most tokens, described in words.

    Returns:
        the text, and that step's ``Fragmentation``.
    """
    peak = max(history, key=lambda f: f.used)
    step = history.index(peak)
    holding = [f for f in history if f.reserved]  # the last step may have freed everything
    mean_use = sum(f.used / f.reserved for f in holding) / len(holding)
    text = (
        f"{label}, at its fullest (step {step}):\n"
        f"  {peak}\n"
        f"  reserved {peak.reserved:,} slots ({format_bytes(peak.reserved * peak.bytes_per_slot)})"
        f", of which {peak.used / peak.reserved:.1%} hold tokens; "
        f"mean over {len(holding)} steps: {mean_use:.1%}"
    )
    return text, peak
