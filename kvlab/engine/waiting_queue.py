"""The waiting queue: requests that have arrived and wait for a seat, in admission order.

First come, first served (``"fcfs"``), or by ``priority`` then arrival (``"priority"``);
a preempted request goes back to the head (in priority order, to its rank).

Not handled: fairness between users, deadlines.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from kvlab.engine.request import Request


class WaitingQueue:
    """The waiting requests, in FCFS or priority order; preempted ones go back to the head."""

    def __init__(self, scheduling_policy: str = "fcfs") -> None:
        self.scheduling_policy = scheduling_policy
        self._fcfs: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._fcfs) if self.scheduling_policy == "fcfs" else len(self._heap)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Request]:
        """Requests in the order they would be admitted (do not push or remove meanwhile)."""
        if self.scheduling_policy == "fcfs":
            return iter(self._fcfs)
        return iter([entry[-1] for entry in sorted(self._heap, key=lambda e: e[:3])])

    def push(self, request: Request) -> None:
        if self.scheduling_policy == "fcfs":
            self._fcfs.append(request)
        else:
            key = (request.priority, request.arrival_time, next(self._order), request)
            heapq.heappush(self._heap, key)

    def push_front(self, request: Request) -> None:
        """A preempted request: first in FCFS; in priority order by its priority and age."""
        if self.scheduling_policy == "fcfs":
            self._fcfs.appendleft(request)
        else:
            self.push(request)

    def remove(self, request: Request) -> None:
        if self.scheduling_policy == "fcfs":
            if self._fcfs and self._fcfs[0] is request:
                self._fcfs.popleft()
            else:
                self._fcfs.remove(request)
            return
        if self._heap and self._heap[0][-1] is request:
            heapq.heappop(self._heap)
            return
        self._heap = [entry for entry in self._heap if entry[-1] is not request]
        heapq.heapify(self._heap)

    def oldest_arrival(self) -> float:
        requests = self._fcfs if self.scheduling_policy == "fcfs" else [e[-1] for e in self._heap]
        return min(r.arrival_time for r in requests)
