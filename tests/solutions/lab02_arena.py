"""Lab 02's build-it, solved as a learner would: the body of the notebook's MyArena cell.

The names it uses are the lab's imports. The tests of the build-it grade it (it must
pass every criterion) and plant one defect at a time in subclasses of it.
"""

from kvlab.cache.manager import CacheFullError


class MyArena:
    """Lab 02's build-it, solved."""

    def __init__(self, num_slots):
        self.num_slots = num_slots
        self.ranges = {}  # seq_id -> (start, length)

    def holes(self):
        out, cursor = [], 0
        for start, length in sorted(self.ranges.values()):
            if start > cursor:
                out.append((cursor, start - cursor))
            cursor = start + length
        if cursor < self.num_slots:
            out.append((cursor, self.num_slots - cursor))
        return out

    def reserve(self, seq_id, num_slots):
        for start, length in self.holes():
            if length >= num_slots:
                self.ranges[seq_id] = (start, num_slots)
                return start
        raise CacheFullError(f"seq {seq_id}: no hole of {num_slots} slots")

    def free(self, seq_id):
        del self.ranges[seq_id]
