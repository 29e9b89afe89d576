"""Build it (lab 06): a block pool with a prefix cache of your own, checked, then run inside
the engine.

The learner writes five methods of a block pool (the stub, with its state, is in lab 06),
``allocate``, ``free``, ``cache``, ``take_cached`` and ``match_prefix``, to vLLM 0.32.0's rules
(``vllm/v1/core/block_pool.py``, as ``kvlab.cache.block_pool``): ``CRITERIA`` says what each
must do, the third hint how, step by step.

``check_prefix_cache(MyBlockPool)`` grades it (``grading.BuildIt``): seeded requests whose
prompts share prefixes through a ``BlockManager`` on the learner's pool and one on kvlab's
``BlockPool``, side by side, and fixed probes (``prefix_cache_grader``); then SmolLM2
serves requests with one system prompt from the learner's pool (``prefix_cache_engine``):
every step's K/V, every token and the prompt tokens the cache served must equal kvlab's.

    hint_prefix_cache(1), (2), (3)    help in steps
    reveal_prefix_cache()             kvlab's own methods

Not handled: hash collisions, partial-block hits, partial credit within a criterion.
"""

from __future__ import annotations

from kvlab.cache.block_pool import BlockPool, LRUEviction
from kvlab.cache.prefix_cache import PrefixCache
from kvlab.exercises import prefix_cache_grader as grader
from kvlab.exercises.grading import BuildIt, Replay, Report, Search, check_calls
from kvlab.exercises.prefix_cache_engine import check_generation

CRITERIA = {
    "written": "allocate, free, cache, take_cached and match_prefix run (none raises "
    "NotImplementedError)",
    "ref_cnt": "ref_cnt counts holders: allocate 1, a prefix hit + 1, free - 1",
    "lru": "free_queue: plain blocks at the front, reused first; cached blocks at the back, "
    "evicted least recently used first",
    "cache": "a freed block keeps its hash until allocate evicts it (a hash with no block left "
    "leaves cached); a second block with a hash already in cached joins the end of its list; "
    "a block that has a hash keeps it as it is",
    "match_prefix": "match_prefix finds the longest chained-hash prefix, short of the last token",
    "refuses": "allocate raises CacheFullError only when fewer than num blocks are free "
    "(exactly num is enough), changing nothing",
    "generation": "requests sharing a system prompt, through the engine, hit as kvlab's do",
}
HINTS = (
    "free_queue is an OrderedDict used as a queue: popitem(last=False) takes the front, "
    "free_queue[b] = None puts b at the back, move_to_end(b, last=False) moves it to the "
    "front, del free_queue[b] takes b out of the middle. cached maps block_hash -> "
    "[block_id, ...], the oldest copy first; block_hash[b] is the other direction, and the "
    "two always agree.",
    """What each method changes:
- allocate: blocks from the front; a hashed one is evicted (loses its hash);
  ref_cnt 1 each
- free: ref_cnt - 1; at 0 a plain block to the front (the first freed first),
  a hashed one to the back
- cache: only a block with no hash yet, at the end of cached[hash]
- take_cached: out of free_queue if it is free, then ref_cnt + 1
- match_prefix: the prompt in blocks of its block_size argument (not the
  notebook's BLOCK_SIZE), each hash chained to the one before, from ROOT_HASH""",
    """allocate(num):
  1. if num > len(free_queue): raise CacheFullError (nothing changed yet)
  2. num times: b = free_queue.popitem(last=False)[0]
  3. if block_hash[b] is not None: remove b from cached[block_hash[b]],
     delete that entry once empty, set block_hash[b] = None
  4. ref_cnt[b] = 1; return the blocks taken
free(block_ids):
  1. for each b: ref_cnt[b] -= 1; at 0, if hashed: free_queue[b] = None (the back)
  2. the plain ones reaching 0, collected: each to the front in reverse order
     (free_queue[b] = None, then move_to_end(b, last=False)): the first freed is
     first. Do not reverse block_ids: callers pass them last first already.
cache(block_id, block_hash):
  1. if block_hash[block_id] is not None: return (it keeps its hash)
  2. cached.setdefault(block_hash, []).append(block_id)
  3. block_hash[block_id] = block_hash
take_cached(block_id):
  1. if ref_cnt[block_id] == 0: del free_queue[block_id]
  2. ref_cnt[block_id] += 1
match_prefix(block_size, token_ids):
  1. parent = ROOT_HASH; blocks, hashes = [], []
  2. for start in range(0, len(token_ids) - block_size, block_size):
     (the range stops before the block of the last token)
  3.   parent = hash_block_tokens(parent, token_ids[start:start + block_size])
  4.   if parent not in cached: stop
  5.   keep cached[parent][0] in blocks and parent in hashes
  6. return blocks, hashes; change nothing (the manager calls take_cached)""",
)

WRITTEN_CALLS = (
    ("allocate", (2,)),
    ("cache", (0, 123)),
    ("free", ([1, 0],)),
    ("match_prefix", (2, [1, 2, 3])),
    ("take_cached", (0,)),
)
PREFIX_CACHE = BuildIt(
    CRITERIA,
    HINTS,
    stuck="Stuck? hint_prefix_cache(1), then 2 and 3; reveal_prefix_cache() shows kvlab's own.",
    written=lambda cls: check_calls(lambda: cls(8), WRITTEN_CALLS, "pool of 8 blocks"),
    search=Search(
        grader.first_difference,
        grader.candidates,
        grader.random_ops,
        grader.show_op,
        probes=grader.PROBES,
    ),
    reveal_sources=lambda: (
        BlockPool.allocate,
        BlockPool.free,
        LRUEviction.push,
        BlockPool.cache,
        BlockPool.take_cached,
        BlockPool._evict,
        PrefixCache.match_prefix,
    ),
    replay=Replay(
        "match_prefix",
        "your block pool, in kvlab's block manager",
        lambda pool_class: grader.managers(pool_class)[0],
        grader.apply_op,
        grader.view,
    ),
)
hint_prefix_cache, reveal_prefix_cache = PREFIX_CACHE.hint, PREFIX_CACHE.reveal


def check_prefix_cache(
    pool_class, model=None, num_sequences: int = 300, seed: int = 0, tokenizer=None
) -> Report:
    """``PREFIX_CACHE.check`` of ``pool_class(num_blocks)`` on ``num_sequences`` seeded
    random request sequences and the probes; the last criterion serves chat requests on
    ``model`` and its ``tokenizer`` (default: SmolLM2-135M's)."""
    return PREFIX_CACHE.check(
        pool_class, lambda: check_generation(pool_class, model, tokenizer), num_sequences, seed
    )
