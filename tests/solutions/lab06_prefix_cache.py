"""Lab 06's build-it, solved as a learner would: the body of the notebook's MyBlockPool cell.

The names it uses are the lab's imports. The tests of the build-it grade it (it must
pass every criterion) and plant one defect at a time in subclasses of it.
"""

from collections import OrderedDict

from kvlab.cache.manager import CacheFullError
from kvlab.cache.prefix_cache import ROOT_HASH, hash_block_tokens


class MyBlockPool:
    """Lab 06's build-it, solved."""

    def __init__(self, num_blocks):
        self.ref_cnt = [0] * num_blocks
        self.block_hash = [None] * num_blocks
        self.free_queue = OrderedDict.fromkeys(range(num_blocks))
        self.cached = {}

    def allocate(self, num):
        if num > len(self.free_queue):
            raise CacheFullError(f"{num} blocks wanted, {len(self.free_queue)} free")
        taken = []
        for _ in range(num):
            block, _ = self.free_queue.popitem(last=False)
            self._forget(block)
            self.ref_cnt[block] = 1
            taken.append(block)
        return taken

    def _forget(self, block):
        block_hash = self.block_hash[block]
        if block_hash is not None:
            self.cached[block_hash].remove(block)
            if not self.cached[block_hash]:
                del self.cached[block_hash]
            self.block_hash[block] = None

    def free(self, block_ids):
        plain = []
        for block in block_ids:
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                if self.block_hash[block] is None:
                    plain.append(block)
                else:
                    self.free_queue[block] = None  # cached: to the back
        for block in reversed(plain):  # plain: to the front, the first freed first
            self.free_queue[block] = None
            self.free_queue.move_to_end(block, last=False)

    def cache(self, block_id, block_hash):
        if self.block_hash[block_id] is None:
            self.cached.setdefault(block_hash, []).append(block_id)
            self.block_hash[block_id] = block_hash

    def take_cached(self, block_id):
        if self.ref_cnt[block_id] == 0:
            del self.free_queue[block_id]
        self.ref_cnt[block_id] += 1

    def match_prefix(self, block_size, token_ids):
        blocks, hashes, parent = [], [], ROOT_HASH
        full = (len(token_ids) - 1) // block_size  # never the block of the last token
        for index in range(full):
            parent = hash_block_tokens(
                parent, token_ids[index * block_size : (index + 1) * block_size]
            )
            if parent not in self.cached:
                break
            blocks.append(self.cached[parent][0])
            hashes.append(parent)
        return blocks, hashes
