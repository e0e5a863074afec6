/* packed: y = x w^T on the CPU (the kernel's kinds 3, 5, 6 and 7), the weights packed once into
   panels, every output element reduced in ONE fixed order.

   The orders: for y[i][j], in fp32,
     kind 3 (bf16 x and w; AVX-512 BF16), k taken in pairs (an odd k's last pair holds a 0):
       acc = 0;  for q = 0 .. ceil(k/2) - 1:  acc = dpbf16(acc, (x[i][2q], x[i][2q+1]),
                                                          (w[j][2q], w[j][2q+1]))
       one lane of one vector instruction a step (vdpbf16ps);
     kind 5 (AVX2 + FMA), fp32 x and w, and kind 6 (AVX2 + FMA), bf16 x and w widened exactly
     to fp32:
       acc = 0;  for p = 0 .. k - 1:  acc = fma(x[i][p], w[j][p], acc)
       (kind 6's bits are kind 5's over the widened operands; a CPU with AVX-512 runs kind 5's
       chains 16 columns a vector, the same arithmetic)
     kind 7 (bf16 x and w; AMX-BF16), k in blocks of 32 (the last padded with 0s):
       acc = 0;  for b = 0 .. ceil(k/32) - 1:  acc = tdpbf16(acc, x[i][32b .. 32b+32), w[j][..])
       the tile instruction's own sum of the block's 32 products into acc, which this CPU's
       hardware fixes (it is neither vdpbf16ps's pair order nor one rounding: so kind 7 is
       another kind, and part of its name is the CPU's model) and which reads row i of the
       tile and nothing of its other rows (checked: a row's bits alone = in a tile of 16)
   and no lanes to sum at the end.  y[i][j] depends on row i of x and row j of w and on nothing
   else: not on the rows beside it, the tile, the thread count or the split, so a row's bits are
   the same alone, batched, restored and recomputed.  Each weight element (pair) is read once per
   row tile and broadcast against a panel's columns (the broadcast order of a GEMM): a tile of 6
   rows x 64 columns (kind 3) runs 24 vector dot products for 4 vector loads and 6 broadcasts,
   one of 6 rows x 16 columns (kinds 5 and 6) 12 FMAs for 2 and 6, one of 3 rows x 32 columns
   12 for 4 and 3.

   The panels: w (n, k) row-major becomes ceil(n / C) panels of C columns (C = 64 for kind 3, 16
   for kinds 5, 6 and 7); panel c holds, step after step, its C columns' elements of one
   step: kind 3, for q = 0 .. ceil(k/2) - 1, the pairs (w[Cc + j][2q], w[Cc + j][2q + 1]),
   j = 0 .. C-1 (an odd k's last element paired with 0); kind 7, for each block b of 32, a tile
   of 16 rows q (the block's pairs) of 16 pairs (w[Cc + j][32b + 2q], w[Cc + j][32b + 2q + 1]);
   the others, for p = 0 .. k - 1, w[Cc + j][p] (kind 6 in the order 0, 8, 1, 9, .. 7, 15 of
   j).  Columns past n and elements past k are 0.  Compile without fast-math and with -ffp-contract=off. */

#include "lanes.h"
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ROWS 6 /* a tile's rows */

/* a kind's panel width (columns), its weights' element size, and whether it steps by pairs */
static long cols_of(int kind) { return kind == 3 ? 64 : 16; }
static long esize(int kind) { return kind == 5 ? 4 : 2; }
static long steps(int kind, long k) { return kind == 3 ? (k + 1) / 2 * 2 : kind == 7 ? (k + 31) / 32 * 32 : k; } /* a column's */

/* elements of the packed form of an (n, k) weight for `kind` (3, 5, 6 or 7), or -1 for another kind */
long packed_size(long n, long k, int kind) {
    if (kind != 3 && kind != 5 && kind != 6 && kind != 7) return -1;
    long c = cols_of(kind);
    return (n + c - 1) / c * c * steps(kind, k);
}

/* w (n, k) row-major, of the kind's dtype -> pw (packed_size(n, k, kind) elements), the panels
   above */
void pack(const void *w, void *pw, long n, long k, int kind) {
    long C = cols_of(kind), es = esize(kind), st = steps(kind, k), pairs = kind == 3;
    if (kind == 7) { /* panel c, block b: element (q, 2j + h) = w[16c + j][32b + 2q + h] */
        uint16_t *d = (uint16_t *)pw;
        for (long c = 0; c < (n + 15) / 16; c++)
            for (long b = 0; b < st / 32; b++)
                for (long q = 0; q < 16; q++)
                    for (long j = 0; j < 16; j++)
                        for (long h = 0; h < 2; h++, d++) {
                            long col = 16 * c + j, p = 32 * b + 2 * q + h;
                            *d = col < n && p < k ? ((const uint16_t *)w)[col * k + p] : 0;
                        }
        return;
    }
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

/* a row of accumulators to y[i][0 .. cols) at y + i * ldy, fp32 or bf16 rounded to nearest
   even; `out` holds the row's accumulators stored */
INLINE void put_row(const float *out, void *y, long i, long ldy, int ybf16, int cols) {
    if (ybf16) {
        uint16_t *yr = (uint16_t *)y + i * ldy;
        int j = 0;
        for (; j + 8 <= cols; j += 8) _mm_storeu_si128((__m128i *)(yr + j), high_halves8(bf16_rne8_hi(_mm256_loadu_ps(out + j))));
        for (; j < cols; j++) yr[j] = bf16_rne(out[j]);
    } else {
        memcpy((float *)y + i * ldy, out, cols * sizeof(float));
    }
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

/* kind 5 on AVX-512: mr rows of x (fp32, stride k) times np consecutive 16-column panels
   (panel elements `pstep` apart), a panel's step one vector: the very FMA chains of tile56,
   mr x np accumulators (at most 24 of the 32 registers) */
AVX512 INLINE void tile5z(const float *x, long k, const float *panel, long pstep, void *y, long ldy, int ybf16,
                          int cols, int mr, int np) {
    __m512 acc[24]; /* row i, panel c: acc[i * np + c] */
#pragma GCC unroll 24
    for (int a = 0; a < mr * np; a++) acc[a] = _mm512_setzero_ps();
    for (long p = 0; p < k; p++) {
        __m512 w[8];
#pragma GCC unroll 8
        for (int c = 0; c < np; c++) {
            const float *wp = panel + c * pstep + p * 16;
            _mm_prefetch((const char *)(wp + 16 * 16), _MM_HINT_T0); /* 16 steps ahead in this panel */
            w[c] = _mm512_loadu_ps(wp);
        }
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 xv = _mm512_set1_ps(x[i * k + p]);
#pragma GCC unroll 8
            for (int c = 0; c < np; c++) acc[i * np + c] = _mm512_fmadd_ps(xv, w[c], acc[i * np + c]);
        }
    }
    float out[24 * 16];
#pragma GCC unroll 24
    for (int a = 0; a < mr * np; a++) _mm512_storeu_ps(out + 16 * a, acc[a]);
    for (int i = 0; i < mr; i++)
        for (int c = 0; c < np; c++)
            put_row(out + 16 * (i * np + c), (char *)y + c * 16 * (ybf16 ? 2 : 4), i, ldy, ybf16,
                    c == np - 1 ? cols : 16);
}

#define ROWSZ 8 /* kind 5 on AVX-512: a tile's rows */
/* the panels at most this many at once for mr rows (mr x np accumulators, at least 8 chains) */
static const int NPZ[ROWSZ + 1] = {0, 8, 6, 4, 4, 4, 4, 3, 3};

#define TZ(M, NP) tile5z(x, k, panel, pstep, y, ldy, ybf16, cols, M, NP)
#define NPZ_UPTO3(M) case M * 16 + 1: TZ(M, 1); break; case M * 16 + 2: TZ(M, 2); break; case M * 16 + 3: TZ(M, 3); break;
#define NPZ_UPTO4(M) NPZ_UPTO3(M) case M * 16 + 4: TZ(M, 4); break;
#define NPZ_UPTO6(M) NPZ_UPTO4(M) case M * 16 + 5: TZ(M, 5); break; case M * 16 + 6: TZ(M, 6); break;

/* each (rows, panels) its own loop */
AVX512 static void rows5z(const float *x, long k, const float *panel, long pstep, void *y, long ldy, int ybf16,
                          int cols, int mr, int np) {
    switch (mr * 16 + np) {
    NPZ_UPTO6(1) case 1 * 16 + 7: TZ(1, 7); break; case 1 * 16 + 8: TZ(1, 8); break;
    NPZ_UPTO6(2) NPZ_UPTO4(3) NPZ_UPTO4(4) NPZ_UPTO4(5) NPZ_UPTO4(6) NPZ_UPTO3(7) NPZ_UPTO3(8)
    default: __builtin_unreachable(); /* mr <= ROWSZ, np <= NPZ[mr] */
    }
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
    const uint16_t *xp; /* kind 7: x's rows as tiles read them, ldx elements apart */
    long ldx;
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

/* kind 5 on AVX-512, panels [c0, c1): as run_panels56, with tiles of at most ROWSZ rows (the
   rows split as evenly as may be) and groups of NPZ[the largest tile's rows] panels */
static void run_panels5z(const pjob_t *jb, long c0, long c1) {
    long k = jb->k, pstep = 16 * k, ys = jb->ybf16 ? 2 : 4;
    long tiles = (jb->m + ROWSZ - 1) / ROWSZ;
    int most = (int)((jb->m + tiles - 1) / tiles);
    long full = c1 * 16 <= jb->n ? c1 : c1 - 1;
    for (long c = c0; c < c1;) {
        int np = c < full ? (int)(full - c < NPZ[most] ? full - c : NPZ[most]) : 1;
        int cols = jb->n - (c + np - 1) * 16 < 16 ? (int)(jb->n - (c + np - 1) * 16) : 16;
        for (long t = 0, i = 0; t < tiles; t++) {
            int mr = (int)(jb->m / tiles + (t < jb->m % tiles));
            rows5z((const float *)jb->x + i * k, k, (const float *)jb->pw + c * pstep, pstep,
                   (char *)jb->y + (i * jb->n + c * 16) * ys, jb->n, jb->ybf16, cols, mr, np);
            i += mr;
        }
        c += np;
    }
}

/* ---- kind 7: AMX tiles of 16 rows x 64 bytes; x's rows as tiles read them (16-row blocks,
   k padded to 32: `ldx` elements apart), C tiles stored to y ---- */
#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg_t;

/* 1 where this process may use AMX tiles (Linux grants it on request, once per process) */
int amx_ready(void) {
    static int ready = -1;
    if (ready < 0) ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ready;
}

/* a C tile's 16 x 16 fp32 to y's rows [0, mr) and columns [0, cols) */
AMX INLINE void put_tile(const float *buf, void *y, long ldy, int ybf16, int mr, int cols) {
    for (int i = 0; i < mr; i++) put_row(buf + 16 * i, y, i, ldy, ybf16, cols);
}

/* rb (1-2) row tiles x cb (1-3) panels, rb x cb C tiles over all of k's blocks in order, then
   stored: C tiles 0-3, A 4-5, B 5-7 (rb + cb + rb cb <= 8) */
AMX INLINE void block7(const uint16_t *x, long ldx, const uint16_t *pw, long pstep, long kb, void *y, long ldy,
                       int ybf16, int mr0, int mr1, int cols, int rb, int cb) {
    _tile_zero(0);
    if (cb > 1) _tile_zero(1);
    if (cb > 2) _tile_zero(2);
    if (rb > 1) _tile_zero(2);
    if (rb > 1 && cb > 1) _tile_zero(3);
    for (long b = 0; b < kb; b++) {
        const uint16_t *xb = x + 32 * b, *wb = pw + 512 * b;
        _tile_loadd(4, xb, ldx * 2);
        if (rb > 1) _tile_loadd(5, xb + 16 * ldx, ldx * 2);
        _tile_loadd(6, wb, 64);
        if (cb > 1 && rb > 1) _tile_loadd(7, wb + pstep, 64);
        if (rb == 1 && cb > 1) _tile_loadd(5, wb + pstep, 64);
        if (cb > 2) _tile_loadd(7, wb + 2 * pstep, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (rb == 1 && cb > 1) _tile_dpbf16ps(1, 4, 5);
        if (rb == 1 && cb > 2) _tile_dpbf16ps(2, 4, 7);
        if (rb > 1) _tile_dpbf16ps(2, 5, 6);
        if (rb > 1 && cb > 1) _tile_dpbf16ps(1, 4, 7);
        if (rb > 1 && cb > 1) _tile_dpbf16ps(3, 5, 7);
    }
    float buf[256] __attribute__((aligned(64)));
    long ys = ybf16 ? 2 : 4;
    char *y0 = (char *)y, *y1 = (char *)y + 16 * ldy * ys;
    /* tile t's (row tile, panel): rb 1: 0 (0,0), 1 (0,1), 2 (0,2); rb 2: 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1) */
#define PUT7(T, R, C)                                                                                              \
    do {                                                                                                           \
        _tile_stored(T, buf, 64);                                                                                  \
        put_tile(buf, ((R) ? y1 : y0) + (C) * 16 * ys, ldy, ybf16, (R) ? mr1 : mr0, (C) == cb - 1 ? cols : 16); \
    } while (0)
    PUT7(0, 0, 0);
    if (cb > 1) PUT7(1, 0, 1);
    if (rb == 1 && cb > 2) PUT7(2, 0, 2);
    if (rb > 1) PUT7(2, 1, 0);
    if (rb > 1 && cb > 1) PUT7(3, 1, 1);
#undef PUT7
}

/* kind 7, panels [c0, c1) over x's padded rows (xp: ceil(m/16) blocks of 16 rows, ldx apart):
   2 row tiles x 2 panels at a time while there are 2 row tiles, else 1 x 3; the panels' group
   stays in L2 while the row tiles pass */
AMX static void run_panels7(const pjob_t *jb, long c0, long c1) {
    tilecfg_t cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    const uint16_t *xp = jb->xp;
    long ldx = jb->ldx, kb = ldx / 32, pstep = 16 * ldx, ys = jb->ybf16 ? 2 : 4, mt = (jb->m + 15) / 16;
    int most = mt > 1 ? 2 : 3; /* panels a group */
    for (long c = c0; c < c1;) {
        int cb = (int)(c1 - c < most ? c1 - c : most);
        int cols = jb->n - (c + cb - 1) * 16 < 16 ? (int)(jb->n - (c + cb - 1) * 16) : 16;
        for (long t = 0; t < mt;) {
            int rb = mt - t >= 2 && cb <= 2 ? 2 : 1;
            long r0 = 16 * t;
            int mr0 = (int)(jb->m - r0 < 16 ? jb->m - r0 : 16);
            int mr1 = rb > 1 ? (int)(jb->m - r0 - 16 < 16 ? jb->m - r0 - 16 : 16) : 0;
            const uint16_t *xb = xp + r0 * ldx, *pw = (const uint16_t *)jb->pw + c * pstep;
            void *yb = (char *)jb->y + (r0 * jb->n + c * 16) * ys;
#define B7(RB, CB) block7(xb, ldx, pw, pstep, kb, yb, jb->n, jb->ybf16, mr0, mr1, cols, RB, CB) /* each its own loop */
            if (rb == 2 && cb == 2) B7(2, 2);
            else if (rb == 2) B7(2, 1);
            else if (cb == 3) B7(1, 3);
            else if (cb == 2) B7(1, 2);
            else B7(1, 1);
#undef B7
            t += rb;
        }
        c += cb;
    }
    _tile_release();
}

/* kind 5 by AVX-512 (16 columns a vector) where the CPU has it (-1: not yet asked); the tests
   set 0 to compare with AVX2's 8 */
static int zmm5 = -1;
void packed_avx512(int on) { zmm5 = on && __builtin_cpu_supports("avx512f"); }

/* panels [c0, c1): every row tile over each panel, the panel staying in L2 while the rows pass */
static void run_panels(const pjob_t *jb, long c0, long c1) {
    if (zmm5 < 0) packed_avx512(1);
    if (jb->kind == 7) {
        run_panels7(jb, c0, c1);
        return;
    }
    if (jb->kind == 5 && zmm5) {
        run_panels5z(jb, c0, c1);
        return;
    }
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
   Returns 0, -1 for a kind this file has not (or kind 7 where AMX is refused), -2 without memory. */
int rowdot_packed(const void *x, const void *pw, void *y, int ybf16, int kind, long m, long k, long n, int threads) {
    if (packed_size(1, 1, kind) < 0 || kind == 7 && !amx_ready()) return -1;
    pjob_t jb = {x, pw, y, ybf16, kind, m, k, n, x, k};
    uint16_t *xp = NULL;
    if (kind == 7 && (k % 32 || m % 16)) { /* the rows in whole blocks of 16, k padded to 32, with 0s */
        long ldx = (k + 31) / 32 * 32, rows = (m + 15) / 16 * 16;
        xp = aligned_alloc(64, rows * ldx * 2);
        if (xp == NULL) return -2;
        memset(xp, 0, rows * ldx * 2);
        for (long i = 0; i < m; i++) memcpy(xp + i * ldx, (const uint16_t *)x + i * k, k * 2);
        jb.xp = xp, jb.ldx = ldx;
    }
    long C = cols_of(kind), panels = (n + C - 1) / C, parts = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    if (parts <= 1 || panels < 2) {
        run_panels(&jb, 0, panels);
    } else {
        long n_chunks = 4 * parts < panels ? 4 * parts : panels;
        atomic_long next = 0;
#pragma omp parallel num_threads(parts)
        run_claims(&jb, n_chunks, panels, &next);
    }
    free(xp);
    return 0;
}
