/* pointwise: a transformer layer's per-row operations around its products (RMSNorm, q/k norms
   with RoPE), each row computed
   from that row alone in ONE fixed order (so a row's bits are the same alone, batched and at
   any thread count: threads split rows, never a row).  In the activations' dtype: fp32, or bf16
   (each rounding to the dtype is to nearest even; arithmetic in fp32 between them).

   RMSNorm of a row x of d elements, weight w (what model/transformer.py's RMSNorm computes):
     ss = x[p]^2 summed over 8 lanes (p = l mod 8) by FMAs, then hsum8's tree, then the tail of
          d in order by scalar FMAs;   s = 1 / sqrt(ss / d + eps)
     y[p] = dtype(w[p] * dtype(x[p] * s))
   Rotary embedding of a head n of D after its RMSNorm, at cos c, sin s (the tables' rows at the
   token's position, in the dtype), D / 2 = h (model/transformer.py's apply_rope, rounding for
   rounding):
     y[j]     = dtype(dtype(n[j] c[j]) + dtype(n[j+h] (-s[j])))
     y[j + h] = dtype(dtype(n[j+h] c[j]) + dtype(n[j] s[j]))
   Compile without fast-math and with -ffp-contract=off. */

#include "lanes.h"
#include <math.h>
#include <stdint.h>

/* 8 fp32 lanes rounded to bf16 and widened back (a NaN stays a NaN), or as they are (fp32) */
INLINE __m256 to_dtype8(__m256 v, int bf16) { return bf16 ? _mm256_castsi256_ps(bf16_rne8_hi(v)) : v; }

INLINE float to_dtype(float v, int bf16) {
    if (!bf16) return v;
    uint32_t u = (uint32_t)bf16_rne(v) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 8 elements from p + off, fp32 or bf16 widened */
INLINE __m256 load8(const void *p, int bf16, long off) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + off))), 16));
    return _mm256_loadu_ps((const float *)p + off);
}

/* 8 fp32 lanes (already of the dtype's values) stored to p + off in the dtype */
INLINE void store8(void *p, int bf16, long off, __m256 v) {
    if (bf16) _mm_storeu_si128((__m128i *)((uint16_t *)p + off), high_halves8(_mm256_castps_si256(v)));
    else _mm256_storeu_ps((float *)p + off, v);
}

INLINE void store1(void *p, int bf16, long off, float v) {
    if (bf16) {
        uint32_t u;
        memcpy(&u, &v, 4);
        ((uint16_t *)p)[off] = (uint16_t)(u >> 16);
    } else {
        ((float *)p)[off] = v;
    }
}

/* a row's RMSNorm scale, by the order above */
static float rms_scale(const void *x, int bf16, long d, float eps) {
    __m256 acc = _mm256_setzero_ps();
    long d8 = d & ~7L;
    for (long p = 0; p < d8; p += 8) {
        __m256 v = load8(x, bf16, p);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float ss = hsum8(acc);
    for (long p = d8; p < d; p++) ss = fmaf(at(x, bf16, p), at(x, bf16, p), ss);
    return 1.0f / sqrtf(ss / (float)d + eps);
}

/* a row's normed elements p .. p+7 and p: dtype(w * dtype(x * s)), as fp32 */
INLINE __m256 normed8(const void *x, const void *w, long p, __m256 s, int bf16) {
    return to_dtype8(_mm256_mul_ps(load8(w, bf16, p), to_dtype8(_mm256_mul_ps(load8(x, bf16, p), s), bf16)), bf16);
}

INLINE float normed1(const void *x, const void *w, long p, float s, int bf16) {
    return to_dtype(at(w, bf16, p) * to_dtype(at(x, bf16, p) * s, bf16), bf16);
}

/* y = the RMSNorm of one row of d */
static void norm_row(const void *x, const void *w, void *y, long d, float eps, int bf16) {
    float s = rms_scale(x, bf16, d, eps);
    long d8 = d & ~7L;
    for (long p = 0; p < d8; p += 8) store8(y, bf16, p, normed8(x, w, p, _mm256_set1_ps(s), bf16));
    for (long p = d8; p < d; p++) store1(y, bf16, p, normed1(x, w, p, s, bf16));
}

/* y (rows, d) contiguous = RMSNorm of x's rows (rs elements apart) with weight w (d), over
   `threads` threads.  Returns 0. */
int norm_rows(const void *x, long rs, long rows, long d, const void *w, void *y, float eps, int bf16, int threads) {
    long esz = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (threads > 1 && rows > 1)
    for (long r = 0; r < rows; r++) norm_row((const char *)x + r * rs * esz, w, (char *)y + r * d * esz, d, eps, bf16);
    return 0;
}

/* one head: n = its RMSNorm (weight w) into `tmp` (D floats, of the dtype's values), then its
   rotary embedding at (c, s) to y */
static void norm_rope_head(const void *x, const void *w, const void *c, const void *s, void *y, long D, float eps,
                           int bf16, float *tmp) {
    float sc = rms_scale(x, bf16, D, eps);
    long d8 = D & ~7L;
    for (long p = 0; p < d8; p += 8) _mm256_storeu_ps(tmp + p, normed8(x, w, p, _mm256_set1_ps(sc), bf16));
    for (long p = d8; p < D; p++) tmp[p] = normed1(x, w, p, sc, bf16);
    long h = D / 2, h8 = h & ~7L;
    for (long j = 0; j < h8; j += 8) {
        __m256 n1 = _mm256_loadu_ps(tmp + j), n2 = _mm256_loadu_ps(tmp + h + j);
        __m256 cv = load8(c, bf16, j), sv = load8(s, bf16, j), nsv = _mm256_xor_ps(sv, _mm256_set1_ps(-0.0f));
        __m256 lo = to_dtype8(_mm256_add_ps(to_dtype8(_mm256_mul_ps(n1, cv), bf16), to_dtype8(_mm256_mul_ps(n2, nsv), bf16)), bf16);
        __m256 hi = to_dtype8(_mm256_add_ps(to_dtype8(_mm256_mul_ps(n2, cv), bf16), to_dtype8(_mm256_mul_ps(n1, sv), bf16)), bf16);
        store8(y, bf16, j, lo);
        store8(y, bf16, h + j, hi);
    }
    for (long j = h8; j < h; j++) {
        float cj = at(c, bf16, j), sj = at(s, bf16, j);
        store1(y, bf16, j, to_dtype(to_dtype(tmp[j] * cj, bf16) + to_dtype(tmp[h + j] * -sj, bf16), bf16));
        store1(y, bf16, h + j, to_dtype(to_dtype(tmp[h + j] * cj, bf16) + to_dtype(tmp[j] * sj, bf16), bf16));
    }
}

#define MAX_HEAD 1024 /* the widest head norm_rope takes */

/* q's and k's heads after their RMSNorms and rotary embedding, row by row: q (rows, H heads of D)
   and k (rows, Hkv heads of D), each row rs elements apart; weights wq, wk (D); cos, sin (rows,
   D/2), each row's (at its token's position) cs elements apart; to yq (rows, H, D) and yk (rows,
   Hkv, D) contiguous, over `threads` threads.  Returns 0, or -1 for an odd D or one past
   MAX_HEAD. */
int norm_rope(const void *q, const void *k, long rs, long rows, long H, long Hkv, long D, const void *wq,
              const void *wk, const void *cos, const void *sin, long cs, void *yq, void *yk, float eps, int bf16,
              int threads) {
    if (D % 2 || D > MAX_HEAD) return -1;
    long esz = bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (threads > 1 && rows > 1)
    for (long r = 0; r < rows; r++) {
        float tmp[MAX_HEAD];
        const char *c = (const char *)cos + r * cs * esz, *s = (const char *)sin + r * cs * esz;
        for (long h = 0; h < H + Hkv; h++) {
            const char *x = h < H ? (const char *)q + (r * rs + h * D) * esz : (const char *)k + (r * rs + (h - H) * D) * esz;
            char *y = h < H ? (char *)yq + (r * H + h) * D * esz : (char *)yk + (r * Hkv + h - H) * D * esz;
            norm_rope_head(x, h < H ? wq : wk, c, s, y, D, eps, bf16, tmp);
        }
    }
    return 0;
}
