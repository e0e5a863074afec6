/* attend: grouped-query attention on the CPU, every query row computed in ONE fixed order that
   depends on nothing but that row's query and the keys it attends.

   For query row (b, t, h), with G = H / Hkv and g = h / G its key/value head, the keys it
   attends are those s (in order) whose additive mask m[b][t][s] is not -inf: j = 0 .. n-1 over
   them.  Then, in fp32 (bf16 inputs widened exactly):
     score_j = dot(q, k_j) * scale + m_j      dot as model/rowdot.c kind 1 reduces one output:
                                              16 lanes (d = l mod 16) of FMAs, then its tree,
                                              then the tail of d in order by scalar FMAs
     mx      = the largest score_j (exact whatever the order)
     p_j     = expf16(score_j - mx)           one polynomial, the same for every lane
     den     = p summed over 16 lanes (j = l mod 16), then the tree
     o[d]    = sum over j in order of fma(p_j, v_j[d], .), from 0;  out[d] = o[d] / den
   (rounded to nearest even for bf16).  Keys a row does not attend take no part, so a row's bits
   are the same in a call of any number of rows, sequences or keys: alone, batched, restored,
   recomputed, at any thread count (threads split (sequence, key head) pairs, never a row).
   A pair's keys and values are first copied, widened to fp32, into rows of D floats: the
   arithmetic reads those, whatever the caller's layout.  Compile without
   fast-math and with -ffp-contract=off. */

#include "lanes.h"
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

AVX512 INLINE __m512 load16(const void *p, int bf16, long off) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + off))), 16));
    return _mm512_loadu_ps((const float *)p + off);
}

static inline uint16_t to_bf16(float f) { /* nearest even (no NaN here: a row attends >= 1 key) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* e^x for x <= 0, lane by lane by one sequence of operations (Cephes' expf polynomial);
   below -87.3 it is 0 */
AVX512 INLINE __m512 exp16(__m512 x) {
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 fx = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                   _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(0.693359375f)));
    x = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(-2.12194440e-4f)));
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    y = _mm512_scalef_ps(y, fx);
    return _mm512_maskz_mov_ps(~tiny, y);
}

typedef struct {
    const void *q, *k, *v, *mask;
    void *out;
    int bf16, mbf16;
    long B, T, H, Hkv, S, D;
    long qsb, qst, qsh, ksb, kss, ksh, vsb, vss, vsh, msb, mst;
    float scale;
    /* ragged (attend_ragged; NULL otherwise): sequence b's query rows qo[b] .. qo[b+1] - 1 of
       q and out, its keys the slots slots[so[b]] .. slots[so[b+1] - 1] of k and v (strides
       kss, vss a slot), its mask rows S_b wide from element mo[b] */
    const long *qo, *so, *slots, *mo;
} att_t;

/* sequence b's query rows and keys */
static inline long T_of(const att_t *a, long b) { return a->qo ? a->qo[b + 1] - a->qo[b] : a->T; }
static inline long S_of(const att_t *a, long b) { return a->so ? a->so[b + 1] - a->so[b] : a->S; }
/* element offsets: query row t of b at head h; key (value) s of b at key head g; mask row t of b;
   output row t of b at head h */
static inline long q_at(const att_t *a, long b, long t, long h) {
    return a->qo ? (a->qo[b] + t) * a->qst + h * a->qsh : b * a->qsb + t * a->qst + h * a->qsh;
}
static inline long k_at(const att_t *a, long sb, long ss, long sh, long b, long s, long g) {
    return a->so ? a->slots[a->so[b] + s] * ss + g * sh : b * sb + s * ss + g * sh;
}
static inline long m_at(const att_t *a, long b, long t) { return a->mo ? a->mo[b] + t * S_of(a, b) : b * a->msb + t * a->mst; }
static inline long o_at(const att_t *a, long b, long t, long h) { return ((a->qo ? a->qo[b] : b * a->T) + t) * a->H * a->D + h * a->D; }

/* one thread's room: a pair's keys and values (S x D fp32 each), a row's keys' indices and mask
   values, and for each of up to 2 heads its weights, its query and its output */
typedef struct {
    float *kp, *vp, *madd, *p[2], *qf[2], *o[2];
    int *idx;
} room_t;

/* What both ISAs' rows() share, outside their vector loops: the R rows' queries widened to
   fp32; a score's tail of d (scalar FMAs in order), scaled, plus its mask value; a row's
   largest score; and the output rows: o's tail of d over j in order, then o / den (bf16
   rounded to nearest even) */
INLINE void load_queries(const att_t *a, const room_t *r, long b, long t, long h, int R) {
    long esz = a->bf16 ? 2 : 4;
    for (int i = 0; i < R; i++) {
        const void *qr = (const char *)a->q + q_at(a, b, t, h + i) * esz;
        for (long d = 0; d < a->D; d++) r->qf[i][d] = at(qr, a->bf16, d);
    }
}

INLINE float score(const att_t *a, const room_t *r, int i, const float *kr, long D16, float lanes, float madd) {
    for (long d = D16; d < a->D; d++) lanes = fmaf(r->qf[i][d], kr[d], lanes);
    return lanes * a->scale + madd;
}

INLINE float largest(const float *p, long n) {
    float mx = -INFINITY;
    for (long j = 0; j < n; j++) mx = p[j] > mx ? p[j] : mx;
    return mx;
}

INLINE void write_rows(const att_t *a, const room_t *r, long b, long t, long h, long n, long D16, const float *dsum,
                       int R) {
    long D = a->D;
    for (int i = 0; i < R; i++) {
        float *o = r->o[i];
        for (long d = D16; d < D; d++) {
            float sc = 0.0f;
            for (long jj = 0; jj < n; jj++) sc = fmaf(r->p[i][jj], r->vp[r->idx[jj] * D + d], sc);
            o[d] = sc;
        }
        long off = o_at(a, b, t, h + i);
        if (a->bf16)
            for (long d = 0; d < D; d++) ((uint16_t *)a->out)[off + d] = to_bf16(o[d] / dsum[i]);
        else
            for (long d = 0; d < D; d++) ((float *)a->out)[off + d] = o[d] / dsum[i];
    }
}

/* R query rows that attend the same keys (heads of one key head, at one position), together:
   each key and value row read once for all R.  Each row's arithmetic is the sequence above:
   scores 16 at a time share one reduction (hsum16x16: each score its own tree), the rest one
   by one (hsum16) */
AVX512 INLINE void rows(const att_t *a, const room_t *r, long b, long t, long h, long n, int R) {
    long D = a->D, D16 = D & ~15L, K = 16 / R;
    const int *idx = r->idx;
    const float *kp = r->kp, *vp = r->vp, *madd = r->madd;
    for (int i = 0; i < R; i++) { /* the queries widened to fp32, 16 at a time, then the tail */
        const void *qr = (const char *)a->q + q_at(a, b, t, h + i) * (a->bf16 ? 2 : 4);
        for (long d = 0; d < D16; d += 16) _mm512_storeu_ps(r->qf[i] + d, load16(qr, a->bf16, d));
        for (long d = D16; d < D; d++) r->qf[i][d] = at(qr, a->bf16, d);
    }
    float sums[16];
    long j = 0;
    for (; j + K <= n; j += K) { /* scores: R rows x K keys */
        __m512 acc[16];
        for (int u = 0; u < 16; u++) acc[u] = _mm512_setzero_ps();
        for (long d = 0; d < D16; d += 16) {
            __m512 qv[2];
            for (int i = 0; i < R; i++) qv[i] = _mm512_loadu_ps(r->qf[i] + d);
            for (long u = 0; u < K; u++) {
                __m512 kv = _mm512_loadu_ps(kp + idx[j + u] * D + d);
                for (int i = 0; i < R; i++) acc[i * K + u] = _mm512_fmadd_ps(qv[i], kv, acc[i * K + u]);
            }
        }
        hsum16x16(acc, sums);
        if (D16 == D) /* no tail of d: score = lanes * scale + mask, K of a row at a time */
            for (int i = 0; i < R; i++) {
                __mmask16 kk = (__mmask16)((1u << K) - 1);
                __m512 sv = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(kk, sums + i * K), _mm512_set1_ps(a->scale)),
                                          _mm512_maskz_loadu_ps(kk, madd + j));
                _mm512_mask_storeu_ps(r->p[i] + j, kk, sv);
            }
        else
            for (int i = 0; i < R; i++)
                for (long u = 0; u < K; u++)
                    r->p[i][j + u] = score(a, r, i, kp + idx[j + u] * D, D16, sums[i * K + u], madd[j + u]);
    }
    for (; j < n; j++)
        for (int i = 0; i < R; i++) {
            const float *kr = kp + idx[j] * D;
            __m512 acc = _mm512_setzero_ps();
            for (long d = 0; d < D16; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(r->qf[i] + d), _mm512_loadu_ps(kr + d), acc);
            r->p[i][j] = score(a, r, i, kr, D16, hsum16(acc), madd[j]);
        }
    float dsum[2];
    for (int i = 0; i < R; i++) { /* weights: e^(score - the row's largest), and their sum */
        float *p = r->p[i];
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (long jj = 0; jj < n; jj += 16)
            top = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),  /* (x, top): a NaN x is passed over */
                                                     n - jj >= 16 ? 0xffff : (__mmask16)((1u << (n - jj)) - 1), p + jj), top);
        float mx = _mm512_reduce_max_ps(top);
        __m512 den = _mm512_setzero_ps(), mxv = _mm512_set1_ps(mx);
        for (long jj = 0; jj < n; jj += 16) { /* lanes past n: masked, sum 0 */
            __mmask16 live = n - jj >= 16 ? 0xffff : (__mmask16)((1u << (n - jj)) - 1);
            __m512 pv = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, p + jj), mxv)));
            _mm512_mask_storeu_ps(p + jj, live, pv);
            den = _mm512_add_ps(den, pv);
        }
        dsum[i] = hsum16(den);
    }
    for (long d0 = 0; d0 < D16; d0 += 64) { /* o: 4 vectors of each row at a time, every j in order */
        int nv = D16 - d0 >= 64 ? 4 : (int)(D16 - d0) / 16;
        __m512 acc[2][4];
        for (int i = 0; i < R; i++)
            for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();
        if (nv == 4)
            for (long jj = 0; jj < n; jj++) {
                const float *vr = vp + idx[jj] * D + d0;
                __m512 pj[2];
                for (int i = 0; i < R; i++) pj[i] = _mm512_set1_ps(r->p[i][jj]);
                for (int c = 0; c < 4; c++) {
                    __m512 vv = _mm512_loadu_ps(vr + 16 * c);
                    for (int i = 0; i < R; i++) acc[i][c] = _mm512_fmadd_ps(pj[i], vv, acc[i][c]);
                }
            }
        else
            for (long jj = 0; jj < n; jj++)
                for (int c = 0; c < nv; c++)
                    for (int i = 0; i < R; i++)
                        acc[i][c] = _mm512_fmadd_ps(_mm512_set1_ps(r->p[i][jj]), _mm512_loadu_ps(vp + idx[jj] * D + d0 + 16 * c), acc[i][c]);
        for (int i = 0; i < R; i++)
            for (int c = 0; c < nv; c++) _mm512_storeu_ps(r->o[i] + d0 + 16 * c, acc[i][c]);
    }
    if (D16 < D) {
        write_rows(a, r, b, t, h, n, D16, dsum, R);
        return;
    }
    for (int i = 0; i < R; i++) { /* o / den, 16 at a time (bf16: rounded to nearest even as to_bf16) */
        long off = o_at(a, b, t, h + i);
        __m512 den = _mm512_set1_ps(dsum[i]);
        for (long d = 0; d < D; d += 16) {
            __m512 o = _mm512_div_ps(_mm512_loadu_ps(r->o[i] + d), den);
            if (a->bf16) {
                __m512i u = _mm512_castps_si512(o);
                __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
                __m512i w = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
                _mm256_storeu_si256((__m256i *)((uint16_t *)a->out + off + d), _mm512_cvtepi32_epi16(w));
            } else {
                _mm512_storeu_ps((float *)a->out + off + d, o);
            }
        }
    }
}

AVX512 static void rows1(const att_t *a, const room_t *r, long b, long t, long h, long n) { rows(a, r, b, t, h, n, 1); }
AVX512 static void rows2(const att_t *a, const room_t *r, long b, long t, long h, long n) { rows(a, r, b, t, h, n, 2); }

/* every query row of sequence b whose head reads key head g */
AVX512 static void pair(const att_t *a, const room_t *r, long b, long g) {
    long D = a->D, S = S_of(a, b), G = a->H / a->Hkv, esz = a->bf16 ? 2 : 4;
    long D16 = D & ~15L;
    for (long s = 0; s < S; s++) { /* widened to fp32, D floats a row */
        const char *kr = (const char *)a->k + k_at(a, a->ksb, a->kss, a->ksh, b, s, g) * esz;
        const char *vr = (const char *)a->v + k_at(a, a->vsb, a->vss, a->vsh, b, s, g) * esz;
        for (long d = 0; d < D16; d += 16) {
            _mm512_storeu_ps(r->kp + s * D + d, load16(kr, a->bf16, d));
            _mm512_storeu_ps(r->vp + s * D + d, load16(vr, a->bf16, d));
        }
        for (long d = D16; d < D; d++) {
            r->kp[s * D + d] = at(kr, a->bf16, d);
            r->vp[s * D + d] = at(vr, a->bf16, d);
        }
    }
    for (long t = 0, T = T_of(a, b); t < T; t++) {
        const char *mr = (const char *)a->mask + m_at(a, b, t) * (a->mbf16 ? 2 : 4);
        long n = 0, s = 0;
        for (; s + 16 <= S; s += 16) { /* the attended keys' indices and mask values, in order */
            __m512 m = load16(mr, a->mbf16, s);
            __mmask16 on = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
            _mm512_mask_compressstoreu_epi32(r->idx + n, on, _mm512_add_epi32(_mm512_set1_epi32((int)s),
                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
            _mm512_mask_compressstoreu_ps(r->madd + n, on, m);
            n += __builtin_popcount(on);
        }
        for (; s < S; s++) {
            float m = at(mr, a->mbf16, s);
            if (m != -INFINITY) {
                r->idx[n] = (int)s;
                r->madd[n++] = m;
            }
        }
        long h = g * G;
        for (; h + 2 <= (g + 1) * G; h += 2) rows2(a, r, b, t, h, n);
        if (h < (g + 1) * G) rows1(a, r, b, t, h, n);
    }
}

/* ---- the same arithmetic on a CPU with AVX2 only: each 16-lane vector of the AVX-512 code is
   two 8-lane halves (lanes 0-7, 8-15) and its tree (l + l+8, then hsum8) is the halves added,
   then hsum8, so every score, weight and output is the sequence above, as the AVX-512 code
   computes it.  Fewer scores at a time (16 registers, not 32). ---- */
typedef struct {
    __m256 lo, hi;
} v16;

INLINE v16 v16_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
INLINE v16 v16_load(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
INLINE v16 v16_fma(v16 a, v16 b, v16 c) { return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
INLINE float v16_sum(v16 a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); } /* hsum16's tree */

/* exp16's sequence, 8 lanes: floor for roundscale's round-down, and scalef(y, n) as y times
   2^n built exactly (n in [-126, 0] here: a normal float), one correctly rounded product as
   scalef's */
INLINE __m256 exp8(__m256 x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(tiny, y);
}

/* rows() on AVX2: R rows x K keys of scores at a time (R * K <= 4: 8 registers) */
INLINE void rows8(const att_t *a, const room_t *r, long b, long t, long h, long n, int R) {
    long D = a->D, D16 = D & ~15L, K = 4 / R;
    const int *idx = r->idx;
    const float *kp = r->kp, *vp = r->vp, *madd = r->madd;
    load_queries(a, r, b, t, h, R);
    long j = 0;
    for (; j + K <= n; j += K) { /* scores: R rows x K keys, each its own 16 lanes and tree */
        v16 acc[4];
        for (int u = 0; u < R * K; u++) acc[u] = v16_zero();
        for (long d = 0; d < D16; d += 16) {
            v16 qv[2];
            for (int i = 0; i < R; i++) qv[i] = v16_load(r->qf[i] + d);
            for (long u = 0; u < K; u++) {
                v16 kv = v16_load(kp + idx[j + u] * D + d);
                for (int i = 0; i < R; i++) acc[i * K + u] = v16_fma(qv[i], kv, acc[i * K + u]);
            }
        }
        for (int i = 0; i < R; i++)
            for (long u = 0; u < K; u++) {
                r->p[i][j + u] = score(a, r, i, kp + idx[j + u] * D, D16, v16_sum(acc[i * K + u]), madd[j + u]);
            }
    }
    for (; j < n; j++)
        for (int i = 0; i < R; i++) {
            const float *kr = kp + idx[j] * D;
            v16 acc = v16_zero();
            for (long d = 0; d < D16; d += 16) acc = v16_fma(v16_load(r->qf[i] + d), v16_load(kr + d), acc);
            r->p[i][j] = score(a, r, i, kr, D16, v16_sum(acc), madd[j]);
        }
    float dsum[2];
    for (int i = 0; i < R; i++) { /* weights, and their sum over 16 lanes (lanes past n: 0) */
        float *p = r->p[i], mx = largest(p, n);
        __m256 mxv = _mm256_set1_ps(mx);
        v16 den = v16_zero();
        for (long jj = 0; jj < n; jj += 16) {
            long live = n - jj < 16 ? n - jj : 16;
            float in[16], e[16];
            for (int l = 0; l < 16; l++) in[l] = l < live ? p[jj + l] : mx; /* a dead lane's weight is set 0 below */
            __m256 lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(in), mxv)), hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(in + 8), mxv));
            _mm256_storeu_ps(e, lo);
            _mm256_storeu_ps(e + 8, hi);
            for (int l = 0; l < 16; l++) e[l] = l < live ? e[l] : 0.0f;
            memcpy(p + jj, e, live * sizeof(float));
            den.lo = _mm256_add_ps(den.lo, _mm256_loadu_ps(e));
            den.hi = _mm256_add_ps(den.hi, _mm256_loadu_ps(e + 8));
        }
        dsum[i] = v16_sum(den);
    }
    long D32 = D16 & ~31L;
    for (long d0 = 0; d0 < D32; d0 += 32) { /* o: 32 of each row's d at a time (8 chains), every j in order */
        v16 acc[2][2];
        for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = v16_zero();
        for (long jj = 0; jj < n; jj++) {
            const float *vr = vp + idx[jj] * D + d0;
            v16 v0 = v16_load(vr), v1 = v16_load(vr + 16);
            for (int i = 0; i < R; i++) {
                __m256 pj = _mm256_set1_ps(r->p[i][jj]);
                acc[i][0] = v16_fma((v16){pj, pj}, v0, acc[i][0]);
                acc[i][1] = v16_fma((v16){pj, pj}, v1, acc[i][1]);
            }
        }
        for (int i = 0; i < R; i++)
            for (int c = 0; c < 2; c++) {
                _mm256_storeu_ps(r->o[i] + d0 + 16 * c, acc[i][c].lo);
                _mm256_storeu_ps(r->o[i] + d0 + 16 * c + 8, acc[i][c].hi);
            }
    }
    for (long d0 = D32; d0 < D16; d0 += 16) { /* the last 16 */
        v16 acc[2];
        for (int i = 0; i < R; i++) acc[i] = v16_zero();
        for (long jj = 0; jj < n; jj++) {
            v16 vv = v16_load(vp + idx[jj] * D + d0);
            for (int i = 0; i < R; i++) {
                __m256 pj = _mm256_set1_ps(r->p[i][jj]);
                acc[i] = v16_fma((v16){pj, pj}, vv, acc[i]);
            }
        }
        for (int i = 0; i < R; i++) {
            _mm256_storeu_ps(r->o[i] + d0, acc[i].lo);
            _mm256_storeu_ps(r->o[i] + d0 + 8, acc[i].hi);
        }
    }
    write_rows(a, r, b, t, h, n, D16, dsum, R);
}

static void rows8_1(const att_t *a, const room_t *r, long b, long t, long h, long n) { rows8(a, r, b, t, h, n, 1); }
static void rows8_2(const att_t *a, const room_t *r, long b, long t, long h, long n) { rows8(a, r, b, t, h, n, 2); }

/* pair() on AVX2 */
static void pair8(const att_t *a, const room_t *r, long b, long g) {
    long D = a->D, S = S_of(a, b), G = a->H / a->Hkv, esz = a->bf16 ? 2 : 4;
    for (long s = 0; s < S; s++) { /* widened to fp32, D floats a row */
        const char *kr = (const char *)a->k + k_at(a, a->ksb, a->kss, a->ksh, b, s, g) * esz;
        const char *vr = (const char *)a->v + k_at(a, a->vsb, a->vss, a->vsh, b, s, g) * esz;
        if (!a->bf16) {
            memcpy(r->kp + s * D, kr, D * sizeof(float));
            memcpy(r->vp + s * D, vr, D * sizeof(float));
        } else {
            long d = 0;
            for (; d + 8 <= D; d += 8) { /* 8 at a time: zero-extended, shifted to the high half */
                __m256i kw = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)kr + d)));
                __m256i vw = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)vr + d)));
                _mm256_storeu_ps(r->kp + s * D + d, _mm256_castsi256_ps(_mm256_slli_epi32(kw, 16)));
                _mm256_storeu_ps(r->vp + s * D + d, _mm256_castsi256_ps(_mm256_slli_epi32(vw, 16)));
            }
            for (; d < D; d++) {
                r->kp[s * D + d] = bf16_at(kr, d);
                r->vp[s * D + d] = bf16_at(vr, d);
            }
        }
    }
    for (long t = 0, T = T_of(a, b); t < T; t++) {
        const char *mr = (const char *)a->mask + m_at(a, b, t) * (a->mbf16 ? 2 : 4);
        long n = 0;
        for (long s = 0; s < S; s++) { /* the attended keys' indices and mask values, in order */
            float m = at(mr, a->mbf16, s);
            if (m != -INFINITY) {
                r->idx[n] = (int)s;
                r->madd[n++] = m;
            }
        }
        long h = g * G;
        for (; h + 2 <= (g + 1) * G; h += 2) rows8_2(a, r, b, t, h, n);
        if (h < (g + 1) * G) rows8_1(a, r, b, t, h, n);
    }
}

/* AVX-512 (F, BW, VL) here?  Asked of the CPU once */
static int wide(void) {
    static int w = -1;
    if (w < 0) w = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    return w;
}

static void run_pairs(const att_t *a, atomic_long *next, atomic_int *failed) {
    long S = a->S, D = a->D, E = D + 16;
    float *f = malloc(((2 * D + 3) * S + 4 * E) * sizeof(float));
    int *idx = malloc(S * sizeof(int));
    if (!f || !idx) {
        atomic_store(failed, 1);
    } else {
        float *rest = f + (2 * D + 3) * S;
        room_t r = {f, f + D * S, f + 2 * D * S, {f + (2 * D + 1) * S, f + (2 * D + 2) * S},
                    {rest, rest + E}, {rest + 2 * E, rest + 3 * E}, idx};
        void (*one)(const att_t *, const room_t *, long, long) = wide() ? pair : pair8;
        for (long u; (u = atomic_fetch_add(next, 1)) < a->B * a->Hkv;) one(a, &r, u / a->Hkv, u % a->Hkv);
    }
    free(f);
    free(idx);
}

/* out (B, T, H, D) contiguous, in q's dtype (fp32, or bf16 when bf16) = attention of q[b][t][h]
   (strides qsb, qst, qsh in elements; d contiguous) over k, v [b][s][g] (their strides; d
   contiguous) under the additive mask [b][t][s] (fp32, or bf16 when mbf16; s contiguous; msb 0
   for one mask for all b), over `threads` threads (an OpenMP team shared with torch, as
   rowdot's).  Returns 0; -1 where H is not a multiple of Hkv; -2 where memory ran out. */
static int run(const att_t *a, int threads) {
    if (a->Hkv < 1 || a->H % a->Hkv || a->D < 1) return -1;
    atomic_long next = 0;
    atomic_int failed = 0;
    long parts = threads < 1 ? 1 : threads;
    if (parts > a->B * a->Hkv) parts = a->B * a->Hkv;
    if (parts <= 1)
        run_pairs(a, &next, &failed);
    else {
#pragma omp parallel num_threads(parts)
        run_pairs(a, &next, &failed);
    }
    return atomic_load(&failed) ? -2 : 0;
}

int attend(const void *q, const void *k, const void *v, const void *mask, void *out, int bf16, int mbf16,
           long B, long T, long H, long Hkv, long S, long D, long qsb, long qst, long qsh, long ksb, long kss,
           long ksh, long vsb, long vss, long vsh, long msb, long mst, float scale, int threads) {
    att_t a = {q, k, v, mask, out, bf16, mbf16, B, T, H, Hkv, S, D,
               qsb, qst, qsh, ksb, kss, ksh, vsb, vss, vsh, msb, mst, scale, 0, 0, 0, 0};
    return run(&a, threads);
}

/* B sequences packed in one call, each row's arithmetic the very one attend() gives it: out
   (N, H, D) contiguous; sequence b's queries are rows qo[b] .. qo[b+1] - 1 of q (strides qst,
   qsh), its keys and values the slots slots[so[b]] .. slots[so[b+1] - 1] of k and v [slot][g]
   (strides kss, ksh; vss, vsh), in that order, its additive mask (T_b x S_b, row-major) from
   element mo[b] of mask; S the largest S_b.  Returns as attend(). */
int attend_ragged(const void *q, const void *k, const void *v, const void *mask, void *out, int bf16, int mbf16,
                  long B, long H, long Hkv, long S, long D, const long *qo, const long *so, const long *slots,
                  const long *mo, long qst, long qsh, long kss, long ksh, long vss, long vsh, float scale,
                  int threads) {
    att_t a = {q, k, v, mask, out, bf16, mbf16, B, 0, H, Hkv, S, D,
               0, qst, qsh, 0, kss, ksh, 0, vss, vsh, 0, 0, scale, qo, so, slots, mo};
    return run(&a, threads);
}
