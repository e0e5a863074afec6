/* packed: y = x w^T on the CPU (the kernel's kinds 3, 5 and 6), the weights packed once into
   panels, every output element reduced in ONE fixed order.

   The orders: for y[i][j], in fp32,
     kind 3 (bf16 x and w; AVX-512 BF16), k taken in pairs (an odd k's last pair holds a 0):
       acc = 0;  for q = 0 .. ceil(k/2) - 1:  acc = dpbf16(acc, (x[i][2q], x[i][2q+1]),
                                                          (w[j][2q], w[j][2q+1]))
       one lane of one vector instruction a step (vdpbf16ps);
     kind 5 (AVX2 + FMA), fp32 x and w, and kind 6 (AVX2 + FMA), bf16 x and w widened exactly
     to fp32:
       acc = 0;  for p = 0 .. k - 1:  acc = fma(x[i][p], w[j][p], acc)
       (kind 6's bits are kind 5's over the widened operands)
   and no lanes to sum at the end.  y[i][j] depends on row i of x and row j of w and on nothing
   else: not on the rows beside it, the tile, the thread count or the split, so a row's bits are
   the same alone, batched, restored and recomputed.  Each weight element (pair) is read once per
   row tile and broadcast against a panel's columns (the broadcast order of a GEMM): a tile of 6
   rows x 64 columns (kind 3) runs 24 vector dot products for 4 vector loads and 6 broadcasts,
   one of 6 rows x 16 columns (kinds 5 and 6) 12 FMAs for 2 and 6, one of 3 rows x 32 columns
   12 for 4 and 3.

   The panels: w (n, k) row-major becomes ceil(n / C) panels of C columns (C = 64 for kind 3, 16
   for kinds 5 and 6); panel c holds, step after step, its C columns' elements of one
   step: kind 3, for q = 0 .. ceil(k/2) - 1, the pairs (w[Cc + j][2q], w[Cc + j][2q + 1]),
   j = 0 .. C-1 (an odd k's last element paired with 0); the others, for p = 0 .. k - 1,
   w[Cc + j][p] (kind 6 in the order 0, 8, 1, 9, .. 7, 15 of j).  Columns past n are 0.  Compile without fast-math and with -ffp-contract=off. */

#include "lanes.h"
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define ROWS 6 /* a tile's rows */

/* a kind's panel width (columns), its weights' element size, and whether it steps by pairs */
static long cols_of(int kind) { return kind == 3 ? 64 : 16; }
static long esize(int kind) { return kind == 5 ? 4 : 2; }
static long steps(int kind, long k) { return kind == 3 ? (k + 1) / 2 * 2 : k; } /* elements a column */

/* elements of the packed form of an (n, k) weight for `kind` (3, 5 or 6), or -1 for another kind */
long packed_size(long n, long k, int kind) {
    if (kind != 3 && kind != 5 && kind != 6) return -1;
    long c = cols_of(kind);
    return (n + c - 1) / c * c * steps(kind, k);
}

/* w (n, k) row-major, of the kind's dtype -> pw (packed_size(n, k, kind) elements), the panels
   above */
void pack(const void *w, void *pw, long n, long k, int kind) {
    long C = cols_of(kind), es = esize(kind), st = steps(kind, k), pairs = kind == 3;
    for (long c = 0; c < (n + C - 1) / C; c++)
        for (long s = 0; s < st; s += 1 + pairs) {
            char *dst = (char *)pw + (c * st + s) * C * es;
            for (long j = 0; j < C; j++)
                for (long h = 0; h <= pairs; h++) { /* kind 3: the pair's two elements, side by side */
                    long col = c * C + j, p = s + h;
                    /* kind 6: column j's element in the 32-bit word j % 8, low half for j < 8
                       and high half from 8 (one shift and one and widen the 16) */
                    long at = kind == 6 ? 2 * (j % 8) + j / 8 : j * (1 + pairs) + h;
                    char *d = dst + at * es;
                    int in = col < n && p < k;
                    if (es == 4) *(float *)d = in ? ((const float *)w)[col * k + p] : 0.0f;
                    else *(uint16_t *)d = in ? ((const uint16_t *)w)[col * k + p] : 0;
                }
        }
}

/* mr rows of accumulators to y[i][0 .. cols) at y + i * ldy, fp32 or bf16 rounded to nearest
   even; `out` holds the row's accumulators stored */
INLINE void put_row(const float *out, void *y, long i, long ldy, int ybf16, int cols) {
    if (ybf16)
        for (int j = 0; j < cols; j++) ((uint16_t *)y)[i * ldy + j] = bf16_rne(out[j]);
    else
        memcpy((float *)y + i * ldy, out, cols * sizeof(float));
}

/* ---- kind 3: x row i's pair q as one 32-bit lane, broadcast (an odd k's last pair: its
   element, then 0) ---- */
AVX512 INLINE __m512i pair_of(const uint16_t *xr, long q, long k) {
    uint32_t u = 2 * q + 1 < k ? (uint32_t)xr[2 * q] | (uint32_t)xr[2 * q + 1] << 16 : xr[2 * q];
    return _mm512_set1_epi32((int)u);
}

/* kind 3: mr rows of x (stride k) times one 64-column panel */
AVX512 INLINE void tile3(const uint16_t *x, long k, const uint16_t *panel, void *y, long ldy, int ybf16, int cols, int mr) {
    __m512 acc[ROWS][4];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = _mm512_setzero_ps();
    long pairs = (k + 1) / 2, whole = k / 2;
    for (long q = 0; q < whole; q++) {
        const uint16_t *wp = panel + q * 128;
        __m512i wv[4];
        for (int v = 0; v < 4; v++) wv[v] = _mm512_loadu_si512(wp + 32 * v);
        for (int i = 0; i < mr; i++) {
            int32_t u;
            memcpy(&u, x + i * k + 2 * q, 4); /* the pair as one 32-bit lane */
            __m512i xv = _mm512_set1_epi32(u);
            for (int v = 0; v < 4; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)xv, (__m512bh)wv[v]);
        }
    }
    for (long q = whole; q < pairs; q++) { /* an odd k's last pair */
        const uint16_t *wp = panel + q * 128;
        for (int i = 0; i < mr; i++) {
            __m512i xv = pair_of(x + i * k, q, k);
            for (int v = 0; v < 4; v++)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)xv, (__m512bh)_mm512_loadu_si512(wp + 32 * v));
        }
    }
    for (int i = 0; i < mr; i++) {
        float out[64];
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(out + 16 * v, acc[i][v]);
        put_row(out, y, i, ldy, ybf16, cols);
    }
}

/* kind 6 (AVX2): a step's 16 bf16 elements, as packed (column j in word j % 8, low half for
   j < 8), widened exactly to fp32: columns 0-7 the words shifted, 8-15 their high halves */
INLINE void widen16(const uint16_t *p, __m256 *lo, __m256 *hi) {
    __m256i u = _mm256_loadu_si256((const __m256i *)p);
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* kinds 5 (fp32 panels) and 6 (bf16 panels, widened): mr rows of x (fp32: kind 6's rows are
   widened by the caller, exactly; stride k) times np consecutive 16-column panels (panel
   elements `pstep` apart).  Each output is one FMA chain over k, so chains run side by side
   only across rows and columns: mr x 2np accumulators, 8 to 12 of AVX2's 16 registers, enough
   chains to cover the FMA's latency at every row count (1 row: 4 panels).  Every accumulator
   lives in a register: kind 6 over several panels widens each half just before its FMAs, the
   high half by two shifts, so that no mask register is held beside them (what is held: 2np x mr
   accumulators, mr broadcasts, one half). */
INLINE void tile56(const float *x, long k, const void *panel, long pstep, int wb, void *y, long ldy, int ybf16,
                   int cols, int mr, int np) {
    __m256 acc[12]; /* row i, vector v of the tile's 2np: acc[i * 2np + v]; mr x 2np <= 12 (NP56) */
#pragma GCC unroll 12
    for (int a = 0; a < mr * 2 * np; a++) acc[a] = _mm256_setzero_ps();
    long es = wb ? 2 : 4;
    for (long p = 0; p < k; p++) {
#pragma GCC unroll 4
        for (int c = 0; c < np; c++) {
            const char *wp = (const char *)panel + (c * pstep + p * 16) * es;
            _mm_prefetch(wp + 16 * 64, _MM_HINT_T0); /* 16 steps ahead in this panel's stream */
            if (wb && np > 1) { /* 12 accumulators and mr broadcasts: one register left for a half */
                __m256i u = _mm256_loadu_si256((const __m256i *)wp);
                __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
#pragma GCC unroll 3
                for (int i = 0; i < mr; i++)
                    acc[i * 2 * np + 2 * c] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * k + p), w0,
                                                              acc[i * 2 * np + 2 * c]);
                __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(u, 16), 16));
#pragma GCC unroll 3
                for (int i = 0; i < mr; i++)
                    acc[i * 2 * np + 2 * c + 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * k + p), w1,
                                                                  acc[i * 2 * np + 2 * c + 1]);
                continue;
            }
            __m256 w0, w1;
            if (wb) {
                widen16((const uint16_t *)wp, &w0, &w1);
            } else {
                w0 = _mm256_loadu_ps((const float *)wp);
                w1 = _mm256_loadu_ps((const float *)wp + 8);
            }
#pragma GCC unroll 6
            for (int i = 0; i < mr; i++) {
                __m256 xv = _mm256_broadcast_ss(x + i * k + p);
                acc[i * 2 * np + 2 * c] = _mm256_fmadd_ps(xv, w0, acc[i * 2 * np + 2 * c]);
                acc[i * 2 * np + 2 * c + 1] = _mm256_fmadd_ps(xv, w1, acc[i * 2 * np + 2 * c + 1]);
            }
        }
    }
    float out[12 * 8]; /* the accumulators stored once, after the loop (acc stays in registers) */
#pragma GCC unroll 12
    for (int a = 0; a < mr * 2 * np; a++) _mm256_storeu_ps(out + 8 * a, acc[a]);
    for (int i = 0; i < mr; i++)
        for (int c = 0; c < np; c++)
            put_row(out + 16 * (i * np + c), (char *)y + c * 16 * (ybf16 ? 2 : 4), i, ldy, ybf16,
                    c == np - 1 ? cols : 16);
}

/* each (kind, row count) its own loop: the row count and the dtype constants inside it */
#define ROW_CASES(CALL)                                                                                            \
    switch (mr) {                                                                                                  \
    case 1: CALL(1); break;                                                                                        \
    case 2: CALL(2); break;                                                                                        \
    case 3: CALL(3); break;                                                                                        \
    case 4: CALL(4); break;                                                                                        \
    case 5: CALL(5); break;                                                                                        \
    default: CALL(6); break;                                                                                       \
    }

AVX512 static void rows3(const void *x, long k, const void *panel, void *y, long ldy, int ybf16, int cols, int mr) {
#define T3(M) tile3(x, k, panel, y, ldy, ybf16, cols, M)
    ROW_CASES(T3)
}

/* kinds 5 and 6: the panels at most this many at once for mr rows (mr x 2np accumulators) */
static const int NP56[ROWS + 1] = {0, 4, 3, 2, 1, 1, 1};

#define T56(M, NP, WB) tile56(x, k, panel, pstep, WB, y, ldy, ybf16, cols, M, NP)
#define NP_CASES(WB)                                                                                               \
    switch (mr * 8 + np) {                                                                                         \
    case 1 * 8 + 4: T56(1, 4, WB); break;                                                                          \
    case 1 * 8 + 3: T56(1, 3, WB); break;                                                                          \
    case 1 * 8 + 2: T56(1, 2, WB); break;                                                                          \
    case 1 * 8 + 1: T56(1, 1, WB); break;                                                                          \
    case 2 * 8 + 3: T56(2, 3, WB); break;                                                                          \
    case 2 * 8 + 2: T56(2, 2, WB); break;                                                                          \
    case 2 * 8 + 1: T56(2, 1, WB); break;                                                                          \
    case 3 * 8 + 2: T56(3, 2, WB); break;                                                                          \
    case 3 * 8 + 1: T56(3, 1, WB); break;                                                                          \
    case 4 * 8 + 1: T56(4, 1, WB); break;                                                                          \
    case 5 * 8 + 1: T56(5, 1, WB); break;                                                                          \
    default: T56(6, 1, WB); break;                                                                                 \
    }

/* each (rows, panels, weights' dtype) its own loop, all three constants inside it */
static void rows56(const float *x, long k, const void *panel, long pstep, int wb, void *y, long ldy, int ybf16,
                   int cols, int mr, int np) {
    if (wb) NP_CASES(1) else NP_CASES(0)
}

typedef struct {
    const void *x, *pw;
    void *y;
    int ybf16, kind;
    long m, k, n;
} pjob_t;

/* kinds 5 and 6, panels [c0, c1): the rows in tiles as even as may be, of at most 3 rows below
   4 (1 row x 4 panels, 2 x 3, 3 x 2: 8 to 12 FMA chains, enough to cover the FMA's latency)
   and of at most 6 from 4 (6 x 1 panel: 12 FMAs for 8 loads, the panel's loads and widening
   shared by 6 rows: at 4-11 rows 1.3-1.8x the 3-row tiles in bf16, no slower in fp32), and the
   panels in groups of the most panels the largest tile takes at once (NP56), each group
   staying in L2 while the row tiles pass; a group ends before the last, partial panel */
static void run_panels56(const pjob_t *jb, long c0, long c1) {
    long k = jb->k, pstep = 16 * k, ys = jb->ybf16 ? 2 : 4, es = jb->kind == 6 ? 2 : 4;
    long tiles = jb->m >= 4 ? (jb->m + ROWS - 1) / ROWS : (jb->m + 2) / 3;
    int most = (int)((jb->m + tiles - 1) / tiles); /* the largest tile's rows */
    long full = c1 * 16 <= jb->n ? c1 : c1 - 1; /* panels before `full` have 16 columns each */
    for (long c = c0; c < c1;) {
        int np = c < full ? (int)(full - c < NP56[most] ? full - c : NP56[most]) : 1;
        int cols = jb->n - (c + np - 1) * 16 < 16 ? (int)(jb->n - (c + np - 1) * 16) : 16;
        for (long t = 0, i = 0; t < tiles; t++) {
            int mr = (int)(jb->m / tiles + (t < jb->m % tiles));
            rows56((const float *)jb->x + i * k, k, (const char *)jb->pw + c * pstep * es, pstep, jb->kind == 6,
                   (char *)jb->y + (i * jb->n + c * 16) * ys, jb->n, jb->ybf16, cols, mr, np);
            i += mr;
        }
        c += np;
    }
}

/* panels [c0, c1): every row tile over each panel, the panel staying in L2 while the rows pass */
static void run_panels(const pjob_t *jb, long c0, long c1) {
    if (jb->kind != 3) {
        run_panels56(jb, c0, c1);
        return;
    }
    long C = cols_of(jb->kind), xs = 2, ys = jb->ybf16 ? 2 : 4; /* kind 3 */
    long panel_bytes = C * steps(jb->kind, jb->k) * esize(jb->kind);
    for (long c = c0; c < c1; c++) {
        int cols = jb->n - c * C < C ? (int)(jb->n - c * C) : (int)C;
        for (long i = 0; i < jb->m; i += ROWS) {
            int mr = jb->m - i < ROWS ? (int)(jb->m - i) : ROWS;
            rows3((const char *)jb->x + i * jb->k * xs, jb->k, (const char *)jb->pw + c * panel_bytes,
                           (char *)jb->y + (i * jb->n + c * C) * ys, jb->n, jb->ybf16, cols, mr);
        }
    }
}

static void run_claims(const pjob_t *jb, long n_chunks, long panels, atomic_long *next) {
    for (long c; (c = atomic_fetch_add(next, 1)) < n_chunks;) run_panels(jb, panels * c / n_chunks, panels * (c + 1) / n_chunks);
}

/* y (m, n) = x (m, k) times the packed w (pack above, for `kind`) transposed, in the kind's
   order above, written fp32 or (ybf16) bf16 rounded to nearest even, over `threads` threads of
   an OpenMP team (torch's own, as rowdot's); threads take whole panels, never a part of k.
   Returns 0, or -1 for a kind this file has not. */
int rowdot_packed(const void *x, const void *pw, void *y, int ybf16, int kind, long m, long k, long n, int threads) {
    if (packed_size(1, 1, kind) < 0) return -1;
    pjob_t jb = {x, pw, y, ybf16, kind, m, k, n};
    long C = cols_of(kind), panels = (n + C - 1) / C, parts = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    if (parts <= 1 || panels < 2) {
        run_panels(&jb, 0, panels);
        return 0;
    }
    long n_chunks = 4 * parts < panels ? 4 * parts : panels;
    atomic_long next = 0;
#pragma omp parallel num_threads(parts)
    run_claims(&jb, n_chunks, panels, &next);
    return 0;
}
