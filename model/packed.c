/* packed: y = x w^T for bf16 x and w on a CPU with AVX-512 BF16 (rowdot's kind 3), the weights
   packed once into panels, every output element reduced in ONE fixed order.

   The order: for y[i][j], with k taken in pairs (an odd k's last pair holds a 0):
       acc = 0;  for q = 0 .. ceil(k/2) - 1:  acc = dpbf16(acc, (x[i][2q], x[i][2q+1]),
                                                          (w[j][2q], w[j][2q+1]))
   in fp32, one lane of one vector instruction a step (vdpbf16ps); no lanes to sum at the end.
   y[i][j] depends on row i of x and row j of w and on nothing else: not on the rows beside it,
   the tile, the thread count or the split, so a row's bits are the same alone, batched,
   restored and recomputed.  Each weight pair is read once per row tile, broadcast against 64
   columns at a time (the broadcast order of a GEMM), so a tile of 6 rows x 64 columns runs
   24 dot products for 4 vector loads and 6 broadcasts a pair.

   The panels: w (n, k) row-major becomes ceil(n / 64) panels of 64 columns; panel c holds, for
   q = 0 .. ceil(k/2) - 1, the 64 columns' pairs (w[64c + j][2q], w[64c + j][2q + 1]), j = 0..63,
   one after another (256 bytes a pair; columns past n and the odd k's last element are 0).
   Compile without fast-math and with -ffp-contract=off. */

#include "lanes.h"
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define COLS 64 /* a panel's columns: 4 vectors of 16 */
#define ROWS 6  /* a tile's rows: 6 x 4 accumulators */

/* elements of the packed form of an (n, k) weight */
long packed_size(long n, long k) { return (n + COLS - 1) / COLS * COLS * ((k + 1) / 2 * 2); }

/* w (n, k) bf16 row-major -> pw (packed_size(n, k) elements), the panels above */
void pack(const uint16_t *w, uint16_t *pw, long n, long k) {
    long pairs = (k + 1) / 2;
    for (long c = 0; c < (n + COLS - 1) / COLS; c++)
        for (long q = 0; q < pairs; q++) {
            uint16_t *dst = pw + (c * pairs + q) * 2 * COLS;
            for (long j = 0; j < COLS; j++) {
                long col = c * COLS + j;
                dst[2 * j] = col < n ? w[col * k + 2 * q] : 0;
                dst[2 * j + 1] = col < n && 2 * q + 1 < k ? w[col * k + 2 * q + 1] : 0;
            }
        }
}

/* x row i's pair q as one 32-bit lane, broadcast (an odd k's last pair: its element, then 0) */
AVX512 INLINE __m512i pair_of(const uint16_t *xr, long q, long k) {
    uint32_t u = 2 * q + 1 < k ? (uint32_t)xr[2 * q] | (uint32_t)xr[2 * q + 1] << 16 : xr[2 * q];
    return _mm512_set1_epi32((int)u);
}

/* mr rows of x (from x, stride k) times one panel: y[i][0 .. cols) at y + i * ldy, fp32 or bf16 */
AVX512 INLINE void tile(const uint16_t *x, long k, const uint16_t *panel, void *y, long ldy, int ybf16, int cols, int mr) {
    __m512 acc[ROWS][4];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = _mm512_setzero_ps();
    long pairs = (k + 1) / 2, whole = k / 2;
    for (long q = 0; q < whole; q++) {
        const uint16_t *wp = panel + q * 2 * COLS;
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
        const uint16_t *wp = panel + q * 2 * COLS;
        for (int i = 0; i < mr; i++) {
            __m512i xv = pair_of(x + i * k, q, k);
            for (int v = 0; v < 4; v++)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)xv, (__m512bh)_mm512_loadu_si512(wp + 32 * v));
        }
    }
    for (int i = 0; i < mr; i++) {
        float out[COLS];
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(out + 16 * v, acc[i][v]);
        if (ybf16)
            for (int j = 0; j < cols; j++) ((uint16_t *)y)[i * ldy + j] = bf16_rne(out[j]);
        else
            memcpy((float *)y + i * ldy, out, cols * sizeof(float));
    }
}

AVX512 static void tile_rows(const uint16_t *x, long k, const uint16_t *panel, void *y, long ldy, int ybf16, int cols, int mr) {
    switch (mr) { /* the row count a constant: each its own loop */
    case 1: tile(x, k, panel, y, ldy, ybf16, cols, 1); break;
    case 2: tile(x, k, panel, y, ldy, ybf16, cols, 2); break;
    case 3: tile(x, k, panel, y, ldy, ybf16, cols, 3); break;
    case 4: tile(x, k, panel, y, ldy, ybf16, cols, 4); break;
    case 5: tile(x, k, panel, y, ldy, ybf16, cols, 5); break;
    default: tile(x, k, panel, y, ldy, ybf16, cols, 6); break;
    }
}

typedef struct {
    const uint16_t *x, *pw;
    void *y;
    int ybf16;
    long m, k, n;
} pjob_t;

/* panels [c0, c1): every row tile over each panel, the panel (k x 64 bf16: 128 KiB at k = 1024)
   staying in L2 while the rows pass */
static void run_panels(const pjob_t *jb, long c0, long c1) {
    long pairs = (jb->k + 1) / 2, esz = jb->ybf16 ? 2 : 4;
    for (long c = c0; c < c1; c++) {
        const uint16_t *panel = jb->pw + c * pairs * 2 * COLS;
        int cols = jb->n - c * COLS < COLS ? (int)(jb->n - c * COLS) : COLS;
        for (long i = 0; i < jb->m; i += ROWS) {
            int mr = jb->m - i < ROWS ? (int)(jb->m - i) : ROWS;
            tile_rows(jb->x + i * jb->k, jb->k, panel, (char *)jb->y + (i * jb->n + c * COLS) * esz, jb->n, jb->ybf16,
                      cols, mr);
        }
    }
}

static void run_claims(const pjob_t *jb, long n_chunks, long panels, atomic_long *next) {
    for (long c; (c = atomic_fetch_add(next, 1)) < n_chunks;) run_panels(jb, panels * c / n_chunks, panels * (c + 1) / n_chunks);
}

/* y (m, n) = x (m, k) bf16 times the packed w (pack above) transposed, in the order above,
   written fp32 or (ybf16) bf16 rounded to nearest even, over `threads` threads of an OpenMP
   team (torch's own, as rowdot's); threads take whole panels, never a part of k.  Returns 0. */
int rowdot_packed(const uint16_t *x, const uint16_t *pw, void *y, int ybf16, long m, long k, long n, int threads) {
    pjob_t jb = {x, pw, y, ybf16, m, k, n};
    long panels = (n + COLS - 1) / COLS, parts = threads < 1 ? 1 : threads > 64 ? 64 : threads;
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
