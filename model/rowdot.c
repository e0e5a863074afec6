/* rowdot: y = x w^T on the CPU (AVX2 + FMA), every output element reduced in ONE fixed order.

   y[i][j] for x (m, k) fp32 row-major and w (n, k) fp32 or bf16 row-major (nn.Linear's own
   layout, read in place: nothing is packed) is, for every i and j and whatever m, the tile, the
   thread count or the split:
       acc  = 8 fp32 lanes of 0;  for p = 0, 8, 16, .. while p + 8 <= k:
              acc = fma(x[i][p:p+8], w[j][p:p+8], acc)        (lane l holds k = l mod 8)
       s    = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))  (one fixed tree)
       for p in the k mod 8 tail, in order: s = fma(x[i][p], w[j][p], s)
   A bf16 weight is widened exactly (its 16 bits shifted up).  Tiles differ only in how many
   (i, j) pairs they carry at once; each pair's arithmetic is the sequence above, so a row's
   bits do not depend on the rows or threads beside it.  Threads split the outputs' columns
   (n), never k.  Compile without fast-math and with -ffp-contract=off. */

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define MAX_THREADS 64
#define SPIN 20000  /* pause loops a helper waits for the next call before it sleeps */

static inline __attribute__((always_inline)) __m256 load_w(const void *w, int bf16, long off) {
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + off));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + off);
}

static inline __attribute__((always_inline)) float w_at(const void *w, int bf16, long off) {
    if (bf16) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[off] << 16;
        float f;
        __builtin_memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)w)[off];
}

static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l, l+4 */
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                  /* +2 */
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));                        /* +1 */
}

/* mr rows of x (stride ldx) times nr rows of w (stride k): y[i][j] at y + i * ldy + j */
static inline __attribute__((always_inline)) void tile(const float *x, long ldx, const void *w, int bf16,
                                                       long k, float *y, long ldy, int mr, int nr) {
    __m256 acc[3][8];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
    long k8 = k & ~7L;
    for (long p = 0; p < k8; p += 8) {
        __m256 xv[3];
        for (int i = 0; i < mr; i++) xv[i] = _mm256_loadu_ps(x + i * ldx + p);
        for (int j = 0; j < nr; j++) {
            __m256 wv = load_w(w, bf16, j * k + p);
            for (int i = 0; i < mr; i++) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = hsum8(acc[i][j]);
            for (long p = k8; p < k; p++) s = fmaf(x[i * ldx + p], w_at(w, bf16, j * k + p), s);
            y[i * ldy + j] = s;
        }
}

/* the widest tile for mr rows: mr * nr accumulators + mr + 1 registers within 16 */
#define NR1 8
#define NR2 6
#define NR3 4

#define CASES(MR, BF)                                                            \
    switch (nr) {                                                                \
    case 1: tile(x, k, w, BF, k, y, ldy, MR, 1); break;                          \
    case 2: tile(x, k, w, BF, k, y, ldy, MR, 2); break;                          \
    case 3: tile(x, k, w, BF, k, y, ldy, MR, 3); break;                          \
    case 4: tile(x, k, w, BF, k, y, ldy, MR, 4); break;                          \
    case 5: tile(x, k, w, BF, k, y, ldy, MR, 5); break;                          \
    case 6: tile(x, k, w, BF, k, y, ldy, MR, 6); break;                          \
    case 7: tile(x, k, w, BF, k, y, ldy, MR, 7); break;                          \
    default: tile(x, k, w, BF, k, y, ldy, MR, 8); break;                         \
    }

static void tile_any(const float *x, const void *w, int bf16, long k, float *y, long ldy, int mr, int nr) {
    if (bf16) {
        if (mr == 1) { CASES(1, 1) } else if (mr == 2) { CASES(2, 1) } else { CASES(3, 1) }
    } else {
        if (mr == 1) { CASES(1, 0) } else if (mr == 2) { CASES(2, 0) } else { CASES(3, 0) }
    }
}

typedef struct {
    const float *x;
    const void *w;
    float *y;
    long m, k, n;
    int bf16;
} job_t;

/* columns [n0, n1) of every row: weight rows in blocks that stay in L2 while every row tile
   passes over them; a block of 3 rows of x stays in L1 across the block */
static void run_cols(const job_t *jb, long n0, long n1) {
    long k = jb->k, esz = jb->bf16 ? 2 : 4;
    long block = (256L * 1024) / (k * esz);
    block = block < 24 ? 24 : block - block % 24;
    for (long b0 = n0; b0 < n1; b0 += block) {
        long b1 = b0 + block < n1 ? b0 + block : n1;
        for (long i = 0; i < jb->m;) {
            int mr = jb->m - i >= 3 ? 3 : (int)(jb->m - i);
            int nr = mr == 3 ? NR3 : mr == 2 ? NR2 : NR1;
            for (long j = b0; j < b1; j += nr) {
                int cols = b1 - j < nr ? (int)(b1 - j) : nr;
                tile_any(jb->x + i * k, (const char *)jb->w + j * k * esz, jb->bf16, k, jb->y + i * jb->n + j,
                         jb->n, mr, cols);
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

/* ---- a small persistent pool.  Every call is cut into chunks of columns, claimed one at a
   time by the caller and its helpers alike: a helper that wakes late (a busy machine) finds
   them done, and the caller never waits for one that does not come.  A claim is a CAS on
   (call << 32 | next chunk), so a late helper cannot claim into a later call. ---- */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER; /* one parallel call at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static atomic_long gen;       /* the call count */
static atomic_long claim;     /* call << 32 | the next chunk */
static atomic_long done;      /* chunks finished in this call */
static atomic_long chunks;
static int helpers;
static job_t job;
static long born[MAX_THREADS]; /* the call count when each helper was made: it waits for the next */

static void work(long call) {
    long n = chunks;
    for (;;) {
        long c = atomic_load(&claim);
        if ((c >> 32) != call || (c & 0xffffffffL) >= n) return;
        if (!atomic_compare_exchange_weak(&claim, &c, c + 1)) continue;
        run_part(&job, c & 0xffffffffL, n);
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
    }
}

static void *helper(void *arg) {
    long seen = born[(intptr_t)arg];
    for (;;) {
        for (int s = 0; atomic_load_explicit(&gen, memory_order_acquire) == seen; s++) {
            if (s < SPIN) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&mu);
            while (atomic_load(&gen) == seen) pthread_cond_wait(&cv, &mu);
            pthread_mutex_unlock(&mu);
        }
        seen = atomic_load(&gen);
        work(seen);
    }
    return 0;
}

static void forget_helpers(void) { helpers = 0; } /* a forked child has none of them */

static void grow(int want) {
    static int registered;
    if (!registered) {
        pthread_atfork(0, 0, forget_helpers);
        registered = 1;
    }
    while (helpers < want && helpers + 1 < MAX_THREADS) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        born[helpers + 1] = atomic_load(&gen);
        int bad = pthread_create(&t, &at, helper, (void *)(intptr_t)(helpers + 1));
        pthread_attr_destroy(&at);
        if (bad) break;
        helpers++;
    }
}

/* y (m, n) fp32 = x (m, k) fp32 times w (n, k) (fp32, or bf16 when bf16 != 0) transposed, over
   `threads` threads (the caller and threads - 1 helpers).  Returns 0. */
int rowdot(const float *x, const void *w, int bf16, float *y, long m, long k, long n, int threads) {
    job_t jb = {x, w, y, m, k, n, bf16};
    long units = (n + 23) / 24, parts = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (parts <= 1 || units < 2) {
        run_part(&jb, 0, 1);
        return 0;
    }
    pthread_mutex_lock(&call_mu);
    grow((int)parts - 1);
    long n_chunks = 4 * parts < units ? 4 * parts : units;
    long call = atomic_load(&gen) + 1;
    job = jb;
    chunks = n_chunks;
    atomic_store(&done, 0);
    atomic_store(&claim, call << 32);
    pthread_mutex_lock(&mu);
    atomic_store_explicit(&gen, call, memory_order_release);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    work(call);
    while (atomic_load_explicit(&done, memory_order_acquire) < n_chunks) _mm_pause();
    pthread_mutex_unlock(&call_mu);
    return 0;
}
