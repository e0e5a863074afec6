/* rowdot: y = x w^T on the CPU, every output element reduced in ONE fixed order.

   y[i][j] for x (m, k) row-major and w (n, k) row-major (nn.Linear's own layout, read in
   place: nothing is packed) is, for every i and j and whatever m, the tile, the thread count or
   the split, one of these sequences (the caller picks one `kind` for the process: a kind is
   part of what a row's bits are; a worker's products run on packed weights, model/packed.c,
   and these two kinds serve the tests and harnesses that compare with them):
     kind 0 (AVX2+FMA; x fp32, w fp32 or bf16 widened exactly):
       acc = 8 fp32 lanes of 0;  for p = 0, 8, .. while p + 8 <= k:
             acc = fma(x[i][p:p+8], w[j][p:p+8], acc)        (lane l holds k = l mod 8)
     kind 1 (AVX-512F; x and w fp32): the same over 16 lanes (k = l mod 16), p += 16
   then s = the lanes summed by one fixed tree (16 lanes: l + l+8 first; then 8: l + l+4, then
   + 2, then + 1), then for each p of the tail, in order: s = fma(x[i][p], w[j][p], s) in fp32.
   Tiles differ only in how many (i, j) pairs they carry at once, and a long k runs in slices
   whose lanes carry over as they are; each pair's arithmetic is the sequence above, so a row's
   bits do not depend on the rows or threads beside it.  Threads split the outputs' columns
   (n), never k.  Compile without fast-math and with -ffp-contract=off. */

#include "lanes.h"
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define MAX_THREADS 64
/* kind 1 runs k in slices of at most this many bytes of a row (a row tile's slice stays in
   L1 while a block's columns pass; each output's lanes carry over from slice to slice as they
   are, so the sequence of its arithmetic is the one above) */
#define SLICE 4096



/* where outputs go: y[i][j] at p + i * ld + j, fp32, or bf16 rounded to nearest even (as
   torch rounds an fp32 tensor to bf16) */
typedef struct {
    void *p;
    long ld;
    int bf16;
} out_t;

INLINE void put(out_t o, long i, long j, float s) {
    if (o.bf16) ((uint16_t *)o.p)[i * o.ld + j] = bf16_rne(s);
    else ((float *)o.p)[i * o.ld + j] = s;
}

/* ---- kind 0: AVX2 + FMA, 8 lanes.  mr rows of x (fp32) times nr rows of w; y[i][j] at
   y + i * ldy + j; pf: the next tile's weights, fetched ahead ---- */
INLINE __m256 load_w8(const void *w, int bf16, long off) {
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + off));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + off);
}

INLINE void tile8(const float *x, const void *w, int bf16, long k, out_t y, int mr, int nr) {
    __m256 acc[3][8];
    long esz = bf16 ? 2 : 4;
    const char *pf = (const char *)w + nr * k * esz;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
    long k8 = k & ~7L;
    for (long p = 0; p < k8; p += 8) {
        __m256 xv[3];
        for (int i = 0; i < mr; i++) xv[i] = _mm256_loadu_ps(x + i * k + p);
        for (int j = 0; j < nr; j++) {
            if ((p * esz & 63) == 0) _mm_prefetch(pf + (j * k + p) * esz, _MM_HINT_T0);
            __m256 wv = load_w8(w, bf16, j * k + p);
            for (int i = 0; i < mr; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = hsum8(acc[i][j]);
            for (long p = k8; p < k; p++) s = fmaf(x[i * k + p], at(w, bf16, j * k + p), s);
            put(y, i, j, s);
        }
}

#define NR_CASES(T, MR, ...)                                                     \
    switch (nr) {                                                                \
    case 1: T(__VA_ARGS__, MR, 1); break;                                        \
    case 2: T(__VA_ARGS__, MR, 2); break;                                        \
    case 3: T(__VA_ARGS__, MR, 3); break;                                        \
    case 4: T(__VA_ARGS__, MR, 4); break;                                        \
    case 5: T(__VA_ARGS__, MR, 5); break;                                        \
    case 6: T(__VA_ARGS__, MR, 6); break;                                        \
    case 7: T(__VA_ARGS__, MR, 7); break;                                        \
    default: T(__VA_ARGS__, MR, 8); break;                                       \
    }

static void tile_k0(const void *x, const void *w, int bf16, long k, out_t y, int mr, int nr) {
    const float *xf = (const float *)x;
    if (bf16) {
        if (mr == 1) { NR_CASES(tile8, 1, xf, w, 1, k, y) } else if (mr == 2) { NR_CASES(tile8, 2, xf, w, 1, k, y) }
        else { NR_CASES(tile8, 3, xf, w, 1, k, y) }
    } else {
        if (mr == 1) { NR_CASES(tile8, 1, xf, w, 0, k, y) } else if (mr == 2) { NR_CASES(tile8, 2, xf, w, 0, k, y) }
        else { NR_CASES(tile8, 3, xf, w, 0, k, y) }
    }
}

/* ---- kind 1: AVX-512, 16 lanes; up to 4 rows x 6 columns (24 accumulators of 32);
   pfon: fetch the next tile's weights ahead (the first row tile of a block: later ones find
   them in L2) ---- */
AVX512 INLINE void tile16(const float *x, const float *w, long k, long p0, long p1, out_t y,
                          float *part, int pfon, int mr, int nr) {
    __m512 acc[4][8];
    const float *pf = w + nr * k;
    long kk = k - k % 16;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = p0 ? _mm512_loadu_ps(part + (i * 8 + j) * 16) : _mm512_setzero_ps();
    for (long p = p0; p < p1; p += 16) { /* a step: one 64-byte line of each row */
        __m512 xv[4];
        for (int i = 0; i < mr; i++) xv[i] = _mm512_loadu_ps(x + i * k + p);
        for (int j = 0; j < nr; j++) {
            if (pfon) _mm_prefetch((const char *)(pf + j * k + p), _MM_HINT_T0);
            __m512 wv = _mm512_loadu_ps(w + j * k + p);
            for (int i = 0; i < mr; i++) acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    if (p1 < kk) { /* a slice of k: the lanes carry on in the next call, exactly (stored, not summed) */
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) _mm512_storeu_ps(part + (i * 8 + j) * 16, acc[i][j]);
        return;
    }
    float sums[32];
    int done = 0;
    if (mr * nr >= 16) { /* the first 16 pairs (i-major) reduced together */
        __m512 first[16];
        for (int t = 0; t < 16; t++) first[t] = acc[t / nr][t % nr];
        hsum16x16(first, sums);
        done = 16;
    }
    for (int t = done; t < mr * nr; t++) sums[t] = hsum16(acc[t / nr][t % nr]);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = sums[i * nr + j];
            for (long p = kk; p < k; p++) s = fmaf(x[i * k + p], w[j * k + p], s);
            put(y, i, j, s);
        }
}

AVX512 static void tile_k1(const float *x, const float *w, long k, long p0, long p1, out_t y,
                           float *part, int pfon, int mr, int nr) {
    /* pfon a constant: each case its own loop, with no branch inside it */
#define ROWS_CASES(P)                                                                              \
    if (mr == 1) { NR_CASES(tile16, 1, x, w, k, p0, p1, y, part, P) } else if (mr == 2) { NR_CASES(tile16, 2, x, w, k, p0, p1, y, part, P) } \
    else if (mr == 3) { NR_CASES(tile16, 3, x, w, k, p0, p1, y, part, P) } else { NR_CASES(tile16, 4, x, w, k, p0, p1, y, part, P) }
    if (pfon) { ROWS_CASES(1) } else { ROWS_CASES(0) }
#undef ROWS_CASES
}

typedef struct {
    const void *x;
    const void *w;
    void *y;
    long m, k, n;
    int ybf16; /* y is bf16 (else fp32) */
    int kind; /* 0 or 1 (above) */
    int wbf16; /* kind 0: the weights are bf16 */
} job_t;

/* the widest tile (columns) for mr rows of each kind: accumulators and operands in the registers */
static const int NR0[4] = {0, 8, 6, 4}, NR1[5] = {0, 8, 8, 6, 6};

/* columns [n0, n1) of every row: weight rows in blocks that stay in L2 while every row tile
   passes over them; a row tile's x stays in L1 across the block */
static void run_cols(const job_t *jb, long n0, long n1) {
    int wb = jb->kind == 0 && jb->wbf16;
    long k = jb->k, wsz = wb ? 2 : 4, xsz = 4;
    int most = jb->kind == 0 ? 3 : 4;
    long kk = k - k % 16; /* kind 1 steps 16 elements */
    long kc = jb->kind == 0 || k * xsz <= SLICE ? (kk > 0 ? kk : 1) : SLICE / xsz;
    long block = (256L * 1024) / ((kc < k ? kc : k) * wsz);
    block = block < 24 ? 24 : block - block % 24;
    /* a row tile's lanes between slices, 32 x 16 floats a column tile: a block of at most
       256 KiB / SLICE columns when sliced, tiles of at least 6 columns (kind 1) */
    float part[(256L * 1024 / SLICE / 6 + 2) * 32 * 16] __attribute__((aligned(64)));
    for (long b0 = n0; b0 < n1; b0 += block) {
        long b1 = b0 + block < n1 ? b0 + block : n1;
        for (long i = 0; i < jb->m;) {
            int mr = jb->m - i >= most ? most : (int)(jb->m - i);
            int nr = jb->kind == 0 ? NR0[mr] : NR1[mr];
            const void *x = (const char *)jb->x + i * k * xsz;
            for (long p0 = 0; p0 < kk || p0 == 0; p0 += kc) {
                long p1 = p0 + kc < kk ? p0 + kc : kk;
                float *pt = part;
                for (long j = b0; j < b1; j += nr, pt += 32 * 16) {
                    int cols = b1 - j < nr ? (int)(b1 - j) : nr;
                    const void *w = (const char *)jb->w + j * k * wsz;
                    out_t y = {(char *)jb->y + (i * jb->n + j) * (jb->ybf16 ? 2 : 4), jb->n, jb->ybf16};
                    if (jb->kind == 0) tile_k0(x, w, wb, k, y, mr, cols);
                    else tile_k1(x, w, k, p0, p1, y, pt, i == 0, mr, cols);
                }
                if (p1 >= kk) break;
            }
            i += mr;
        }
    }
}

/* chunk `part` of `parts`: whole 24-column units (whole tiles for every mr) */
static void run_part(const job_t *jb, long part, long parts) {
    long units = (jb->n + 23) / 24;
    long a = units * part / parts * 24, b = units * (part + 1) / parts * 24;
    if (b > jb->n) b = jb->n;
    if (a < b) run_cols(jb, a, b);
}

/* ---- threads: an OpenMP team, the very runtime torch runs its own operators on (the library
   below names the soname torch has already loaded, libgomp.so.1, so both share one pool: the
   workers that torch's last operator left spinning take this call's chunks at once, and no
   second pool competes with them for the cores).  Chunks of columns are claimed one at a time:
   a thread slowed by another process leaves its share to the others. ---- */
static void run_chunks(const job_t *jb, long n_chunks, atomic_long *next) {
    for (long c; (c = atomic_fetch_add(next, 1)) < n_chunks;) run_part(jb, c, n_chunks);
}

/* y (m, n) = x (m, k) times w (n, k) transposed, in `kind` (above; kind 0 reads bf16
   weights when wbf16), written fp32 or, when ybf16, bf16 rounded to nearest even, over `threads` threads (an OpenMP team; one runs it in the caller).  Returns 0,
   or -1 for a kind this build has not. */
int rowdot(const void *x, const void *w, int kind, int wbf16, void *y, int ybf16, long m, long k, long n, int threads) {
    job_t jb = {x, w, y, m, k, n, ybf16, kind, wbf16};
    if (kind < 0 || kind > 1) return -1;
    long units = (n + 23) / 24, parts = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (parts <= 1 || units < 2) {
        run_part(&jb, 0, 1);
        return 0;
    }
    long n_chunks = 4 * parts < units ? 4 * parts : units;
    atomic_long next = 0;
#pragma omp parallel num_threads(parts)
    run_chunks(&jb, n_chunks, &next);
    return 0;
}
