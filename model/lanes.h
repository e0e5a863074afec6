/* What both kernels (model/rowdot.c, model/attend.c) share: an element read as fp32, and the
   lane sums they reduce by (one fixed tree each, so an output's bits do not depend on which of
   them, or how many at once, summed it).  Included, never compiled alone. */

#ifndef SETFLOW_LANES_H
#define SETFLOW_LANES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE static inline __attribute__((always_inline))

static inline float bf16_at(const void *p, long off) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[off] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 to bf16, rounded to nearest even as torch rounds; a NaN stays a NaN (0xFFFF, as torch's
   vectorised rounding writes one) */
static inline uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0xFFFF;
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* 8 fp32 lanes rounded to bf16 as bf16_rne rounds each, the bf16 in each lane's high half (low
   half 0; a NaN lane 0xFFFF0000): a bf16 value as fp32 */
static inline __m256i bf16_rne8_hi(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb),
                                 _mm256_set1_epi32((int)0xFFFF0000u));
    return _mm256_or_si256(r, _mm256_slli_epi32(_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)), 16));
}

/* 8 lanes' high halves as 8 uint16, in order */
static inline __m128i high_halves8(__m256i r) {
    __m256i w = _mm256_srli_epi32(r, 16);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08));
}

/* element off of an fp32 or bf16 array, as fp32 (a bf16 widens exactly) */
INLINE float at(const void *p, int bf16, long off) { return bf16 ? bf16_at(p, off) : ((const float *)p)[off]; }

/* 8 lanes: l + l+4, then + 2, then + 1 */
static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l, l+4 */
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                  /* +2 */
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));                        /* +1 */
}

/* 16 lanes: l + l+8, then the 8-lane tree */
AVX512 static inline float hsum16(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi)); /* l + l+8, then the 8-lane tree */
}

/* 16 accumulators' sums at once, each by hsum16's very tree (the same adds of the same
   operands, 16 outputs a vector): out[t] = hsum16(a[t]) */
AVX512 INLINE void hsum16x16(const __m512 *a, float *out) {
    __m512 u[8], v[4], w[2];
    for (int t = 0; t < 8; t++) /* l + l+8: a[2t] in lanes 0-7, a[2t+1] in 8-15 */
        u[t] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * t], a[2 * t + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * t], a[2 * t + 1], 0xEE));
    for (int t = 0; t < 4; t++) /* + 4: chunk c holds a[4t + c] */
        v[t] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * t], u[2 * t + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * t], u[2 * t + 1], 0xDD));
    /* + 2: chunk c holds a[8t + c] (lanes 0, 1) and a[8t + 4 + c] (lanes 2, 3) */
    __m512 lo[2], hi[2];
    for (int t = 0; t < 2; t++) {
        lo[t] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(v[2 * t]), _mm512_castps_pd(v[2 * t + 1])));
        hi[t] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(v[2 * t]), _mm512_castps_pd(v[2 * t + 1])));
        w[t] = _mm512_add_ps(lo[t], hi[t]);
    }
    /* + 1: chunk c, lane t holds a[c + 4t] */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
    float tmp[16];
    _mm512_storeu_ps(tmp, r);
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 4; t++) out[c + 4 * t] = tmp[4 * c + t];
}

#endif
