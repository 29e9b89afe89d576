"""Lab 04's build-it, solved as a learner would: the body of the notebook's MyScheduler cell.

The names it uses (StepScheduler, CacheFullError, RequestStatus) are the lab's imports.
"""

from kvlab.cache.manager import CacheFullError
from kvlab.engine.request import RequestStatus
from kvlab.exercises.build_scheduler import StepScheduler


class MyScheduler(StepScheduler):
    """Continuous batching, FCFS, preemption by recompute: one step's plan."""

    def schedule_running(self, out, budget):
        """The running requests' next tokens, oldest first; return the budget left."""
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted a moment ago, to make room for an older one
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            while request.status is RequestStatus.RUNNING:
                try:
                    self.allocate(request, n, out)
                except CacheFullError:
                    self.preempt(self.running[-1], out)
                    continue
                out.add(request, n)
                budget -= n
                break
        return budget

    def preempt(self, victim, out):
        """Recompute: free victim's blocks and send it back to the head of the queue."""
        self.running.remove(victim)
        self.kv.free(victim.seq_id)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.push_front(victim)
        out.preempted.append(victim)

    def admit_waiting(self, out, budget):
        """Start waiting requests in queue order while a seat, budget and blocks last."""
        started = []
        for request in self.waiting:
            if budget == 0 or len(self.running) == self.config.max_num_seqs:
                break
            n = self.kv_admit(request, budget)
            if n is None:
                break
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.add(request, n)
            out.admitted.append(request)
            budget -= n
            started.append(request)
        for request in started:
            self.waiting.remove(request)
