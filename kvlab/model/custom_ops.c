/* The model's element-wise work between the matrix multiplies, one C call each.
 *
 * In the eager runner (kvlab/model/runner.py) each of these is several PyTorch calls (not
 * counting views), and each call is a pass over memory with Python and torch's dispatch in
 * between:
 *
 *   x = x + residual; h = RMSNorm(x) * weight     7 calls   fused_add_rms_norm
 *   act = SiLU(gate) * up                         2 calls   silu_and_mul
 *   q, k rotated by their positions               5 calls   rotary_embedding
 *
 * In a decode step these rows are small (a batch of 32 is 74 KB of hidden state) and
 * each follows a multiply that has just streamed a layer's weights through the caches, so
 * the calls cost more than their arithmetic. Here each is one pass. The names are vLLM's
 * for the same custom ops (its CPU backend calls C++ versions of them).
 *
 * Layouts: float32 rows; a row's elements side by side. The caller checks shapes and
 * dtypes (kvlab/model/custom_ops.py).
 *
 * Compiled with -ffast-math (kvlab/native.py): the sums are reordered as a SIMD reduction
 * does, so the results differ from PyTorch's in the last bits, and infinities are not
 * handled as PyTorch handles them: a row whose sum of squares overflows float32 (values
 * near 1e18, or an infinity) normalizes to NaN here, where PyTorch gives 0 for its finite
 * entries. A model's hidden states are many orders of magnitude smaller.
 */
#include <math.h>
#include <stdint.h>

/* Elements per thread below which splitting the work over threads costs more than it saves. */
#define MIN_ELEMENTS_PER_THREAD 16384

static inline int threads_for(int64_t elements, int num_threads) {
  const int64_t useful = elements / MIN_ELEMENTS_PER_THREAD;
  return useful < 1 ? 1 : (useful < num_threads ? (int)useful : num_threads);
}

/* x += residual (skipped when residual is NULL), then out = x / rms(x) * weight, per row.
 * x, residual, out: (rows, width); weight: (width,). x keeps the sum: the next residual. */
void fused_add_rms_norm(float *out, float *x, const float *residual, const float *weight,
                        int64_t rows, int64_t width, float eps, int num_threads) {
#pragma omp parallel for num_threads(threads_for(rows * width, num_threads))
  for (int64_t r = 0; r < rows; r++) {
    float *row = x + r * width;
    float squares = 0.0f;
    if (residual) {
      const float *add = residual + r * width;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; i++) {
        row[i] += add[i];
        squares += row[i] * row[i];
      }
    } else {
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < width; i++) squares += row[i] * row[i];
    }
    const float inv_rms = 1.0f / sqrtf(squares / width + eps);
    float *dst = out + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; i++) dst[i] = weight[i] * (row[i] * inv_rms);
  }
}

/* out = SiLU(gate) * up, where each row of gate_up is gate (width) then up (width), as the
 * fused gate|up multiply returns them. out: (rows, width). SiLU(g) = g * sigmoid(g), with
 * sigmoid from exp(-|g|), which cannot overflow: 1 / (1 + e) for g >= 0, e / (1 + e) below.
 * (1 / (1 + exp(-g)) overflows to infinity for g below about -88, and -ffast-math code
 * need not divide by infinity correctly.) */
void silu_and_mul(float *out, const float *gate_up, int64_t rows, int64_t width,
                  int num_threads) {
#pragma omp parallel for num_threads(threads_for(rows * width, num_threads))
  for (int64_t r = 0; r < rows; r++) {
    const float *gate = gate_up + r * 2 * width, *up = gate + width;
    float *dst = out + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; i++) {
      const float g = gate[i], e = expf(-fabsf(g));
      dst[i] = g * ((g >= 0.0f ? 1.0f : e) / (1.0f + e)) * up[i];
    }
  }
}

/* Rotates each head of each row in place by its row's position, as the eager runner's
 * apply_rotary: the pairs (i, i + head_dim/2) of a head turn by the angle whose cos and sin
 * are cos[i], sin[i] (for the first of a pair) and cos[i + half], sin[i + half].
 * x: rows of num_heads heads of head_dim, row r starting at x + r * row_stride (the q and k
 * heads at the front of the fused q|k|v output); cos, sin: (rows, head_dim). */
void rotary_embedding(float *x, const float *cos, const float *sin, int64_t rows,
                      int64_t num_heads, int64_t head_dim, int64_t row_stride,
                      int num_threads) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(threads_for(rows * num_heads * head_dim, num_threads))
  for (int64_t r = 0; r < rows; r++) {
    const float *c = cos + r * head_dim, *s = sin + r * head_dim;
    for (int64_t h = 0; h < num_heads; h++) {
      float *first = x + r * row_stride + h * head_dim, *second = first + half;
#pragma omp simd
      for (int64_t i = 0; i < half; i++) {
        const float a = first[i], b = second[i];
        first[i] = a * c[i] - b * s[i];
        second[i] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}
