/* Paged decode attention for CPUs: kvlab's C twin of the Triton decode kernel.
 *
 * One new token per sequence attends to its whole context. The keys and values are read
 * in place, block by block, through the block table, and only as many tokens as each
 * sequence holds. (The "sdpa" backend first copies every sequence's blocks into one
 * tensor padded to the longest sequence, then masks the padding.)
 *
 *   for each (sequence, kv head), in parallel:
 *       for each block of the sequence (block_ids, in order):
 *           scores of the block's keys against the group's query heads
 *           online softmax: a new running max, rescale what was summed so far
 *           add the block's values, weighted
 *           (meanwhile, ask the memory for the next block's keys and values)
 *       out = summed values / summed weights
 *
 * Grouped-query attention: the num_heads / num_kv_heads query heads of a group share one
 * kv head, so each key and value row is loaded once for the whole group.
 *
 * Layouts (float32, contiguous; kvlab.cache.base names them):
 *   query, out     (num_seqs, num_heads, head_dim)
 *   key_cache      (num_blocks, block_size, num_kv_heads, head_dim), value_cache alike
 *   block_ids      (num_seqs, blocks_per_seq) int64: sequence i's blocks in order
 *   seq_lens       (num_seqs,) int64: tokens held, at most blocks_per_seq * block_size
 *
 * Compiled with -ffast-math (kvlab.attention.cpu_kernel): it lets the compiler call
 * glibc's vector expf and reorder the sums, as a SIMD reduction does anyway. So nothing
 * below relies on infinities or NaNs. (Linked without it: a shared library linked with
 * -ffast-math would switch the whole process to flushing tiny floats to zero.)
 *
 * Not handled: more than one query per sequence (prefill: kvlab.attention.cpu sends those
 * rows elsewhere), other dtypes, sliding windows. The caller checks shapes and dtypes;
 * seq_lens and the block ids a sequence reads are checked here, before anything is read.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#define MAX_GROUP 16   /* query heads per kv head */
#define MAX_BLOCK 256  /* slots per block */
#define MAX_HEAD_DIM 256

/* Inlined into each call below, so that where head_dim is a constant the compiler unrolls
 * the loops over it. */
static inline __attribute__((always_inline)) void attend_group(
    float *out, const float *query, const float *key_cache, const float *value_cache,
    const int64_t *block_ids, int64_t seq_len, int64_t group, int64_t head_dim,
    int64_t block_size, int64_t slot_stride, float scale) {
  float acc[MAX_GROUP][MAX_HEAD_DIM];  /* sum of weight * value, per query head */
  float score[MAX_GROUP][MAX_BLOCK];   /* this block's scores, then its weights */
  float running_max[MAX_GROUP], weight_sum[MAX_GROUP];
  for (int64_t g = 0; g < group; g++) {
    running_max[g] = -FLT_MAX;  /* finite: the kernel is built with -ffast-math */
    weight_sum[g] = 0.0f;
    for (int64_t d = 0; d < head_dim; d++) acc[g][d] = 0.0f;
  }
  const int64_t block_stride = block_size * slot_stride;
  for (int64_t b = 0; b * block_size < seq_len; b++) {
    const int64_t num_keys =
        seq_len - b * block_size < block_size ? seq_len - b * block_size : block_size;
    const float *keys = key_cache + block_ids[b] * block_stride;
    const float *values = value_cache + block_ids[b] * block_stride;
    /* The next block lies anywhere in the pool, where no hardware prefetcher guesses it:
     * while this block's row t is read, row t of the next block is asked for ahead. */
    const int64_t next = (b + 1) * block_size < seq_len ? block_ids[b + 1] : block_ids[b];
    const float *next_keys = key_cache + next * block_stride;
    const float *next_values = value_cache + next * block_stride;
    /* Scores: each key row is read once and dotted with every query head of the group. */
    for (int64_t t = 0; t < num_keys; t++) {
      const float *key = keys + t * slot_stride;
      for (int64_t d = 0; d < head_dim; d += 16)  /* a 64-byte cache line: 16 floats */
        __builtin_prefetch(next_keys + t * slot_stride + d);
      for (int64_t g = 0; g < group; g++) {
        const float *q = query + g * head_dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; d++) dot += q[d] * key[d];
        score[g][t] = dot * scale;
      }
    }
    /* Online softmax: rescale the old sums to the new max, then weight this block. */
    for (int64_t g = 0; g < group; g++) {
      float block_max = running_max[g];
      for (int64_t t = 0; t < num_keys; t++)
        block_max = score[g][t] > block_max ? score[g][t] : block_max;
      const float rescale = b == 0 ? 0.0f : expf(running_max[g] - block_max);
      running_max[g] = block_max;
      weight_sum[g] *= rescale;
      for (int64_t d = 0; d < head_dim; d++) acc[g][d] *= rescale;
      for (int64_t t = 0; t < num_keys; t++) {
        score[g][t] = expf(score[g][t] - block_max);
        weight_sum[g] += score[g][t];
      }
    }
    /* Values: each value row is read once and added to every query head's sum. */
    for (int64_t t = 0; t < num_keys; t++) {
      const float *value = values + t * slot_stride;
      for (int64_t d = 0; d < head_dim; d += 16)
        __builtin_prefetch(next_values + t * slot_stride + d);
      for (int64_t g = 0; g < group; g++) {
        const float weight = score[g][t];
#pragma omp simd
        for (int64_t d = 0; d < head_dim; d++) acc[g][d] += weight * value[d];
      }
    }
  }
  for (int64_t g = 0; g < group; g++)
    for (int64_t d = 0; d < head_dim; d++) out[g * head_dim + d] = acc[g][d] / weight_sum[g];
}

/* The checks that need the values, not only the shapes: every sequence holds 1 to
 * blocks_per_seq * block_size tokens, and every block it reads is in the pool.
 * Returns 0, or a code, with the first offending sequence in *bad_seq. */
static int check_tables(const int64_t *block_ids, const int64_t *seq_lens, int64_t num_seqs,
                        int64_t block_size, int64_t blocks_per_seq, int64_t num_blocks,
                        int64_t *bad_seq) {
  for (int64_t i = 0; i < num_seqs; i++) {
    *bad_seq = i;
    if (seq_lens[i] < 1 || seq_lens[i] > blocks_per_seq * block_size) return 2;
    for (int64_t b = 0; b * block_size < seq_lens[i]; b++) {
      const int64_t id = block_ids[i * blocks_per_seq + b];
      if (id < 0 || id >= num_blocks) return 3;
    }
  }
  return 0;
}

/* Returns 0; or, with nothing written: 1 when a size is beyond the fixed buffers above,
 * 2 when a seq_len is out of range, 3 when a block id read is outside the pool. */
int paged_decode_attention(float *out, const float *query, const float *key_cache,
                           const float *value_cache, const int64_t *block_ids,
                           const int64_t *seq_lens, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                           int64_t blocks_per_seq, int64_t num_blocks, float scale,
                           int num_threads, int64_t *bad_seq) {
  const int64_t group = num_heads / num_kv_heads;
  if (group > MAX_GROUP || block_size > MAX_BLOCK || head_dim > MAX_HEAD_DIM) return 1;
  const int failed = check_tables(block_ids, seq_lens, num_seqs, block_size, blocks_per_seq,
                                  num_blocks, bad_seq);
  if (failed) return failed;
  const int64_t slot_stride = num_kv_heads * head_dim;  /* one token's K (or V) row */
  (void)num_threads;  /* read only by the pragma: unused when built without OpenMP */
  /* dynamic: sequences of different lengths are items of different sizes */
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(num_threads)
  for (int64_t i = 0; i < num_seqs; i++) {
    for (int64_t h = 0; h < num_kv_heads; h++) {
      const int64_t row = (i * num_heads + h * group) * head_dim;  /* the group's first head */
      const float *keys = key_cache + h * head_dim, *values = value_cache + h * head_dim;
      const int64_t *table = block_ids + i * blocks_per_seq;
      if (head_dim == 64)  /* SmolLM2's */
        attend_group(out + row, query + row, keys, values, table, seq_lens[i], group, 64,
                     block_size, slot_stride, scale);
      else if (head_dim == 128)  /* Llama's, Mistral's, Qwen2's */
        attend_group(out + row, query + row, keys, values, table, seq_lens[i], group, 128,
                     block_size, slot_stride, scale);
      else
        attend_group(out + row, query + row, keys, values, table, seq_lens[i], group,
                     head_dim, block_size, slot_stride, scale);
    }
  }
  return 0;
}
