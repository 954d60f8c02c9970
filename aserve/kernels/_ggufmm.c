/* Matmuls on llama.cpp's quantized weight blocks, for aserve's CPU path.
 *
 * y[m, n] = sum_k x[m, k] * W[n, k], where each row of W is stored as GGUF blocks
 * (Q8_0, Q5_0, Q4_K, Q6_K: ggml's layouts, byte for byte) and x, y are float32.
 *
 * Why a kernel: torch's CPU weight-only matmuls take int4 with one scale and zero per group
 * (_weight_int4pack_mm_for_cpu) or int8 with one scale per output channel
 * (_weight_int8pack_mm); Q5_0, Q6_K and Q8_0 carry a scale per block of 16 or 32, which
 * neither can express, and they are most of the bytes. So each thread dequantizes one row of
 * W at a time into a buffer that stays in L1 (the block formulas of ggml-quants.c, written
 * anew here) and takes its dot product with every row of x. Activations stay float32, so the
 * result is the float32 path's up to summation order; no float32 copy of W is ever made. At a
 * few rows of x (a decode step) the AVX-512 copy skips the buffer: a block's quants become
 * float registers that meet x directly (gemv_*), read from a repacked layout of the same
 * weights (Q5_0, Q8_0, Q4_K and Q6_K; "Repacked layouts" below). The small ops of a forward pass (norms,
 * rotary, attention; _cpu_ops.h) live here too, to share the build and the thread pool.
 *
 * Portable C plus GCC vector extensions, compiled three times (AVX-512, AVX2+FMA, baseline;
 * _ggufmm_kernels.h) with the copy picked at import, so a CPU without AVX-512 runs the AVX2
 * code and any x86-64 (or other) CPU the baseline. Threads: a small pool of its own (below), not
 * OpenMP. No libtorch: tensors come in as pointers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h> /* usable inside the target pragmas below */
#endif


/* Few-row matmuls (a decode step) up to this many rows of x take the fused copies (gemv_*):
 * all 126 layer matmuls of the default model, 2 threads, fused / dequantize-then-dot: 9.3 /
 * 11.3 ms at 1 row, 12.3 / 13.7 at 4, 16.2 / 18.0 at 6, 19.9 / 18.2 at 8. */
#define GEMV_MAX_ROWS 6

/* ggml type ids (gguf.GGMLQuantizationType), and aserve's repacked forms of three of them
 * ("Repacked layouts" below; ids of our own, never in a GGUF file) */
enum { T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14, T_Q5_0R = 1006, T_Q4_KR = 1012, T_Q6_KR = 1014 };
/* Q8_0 in groups of 16 rows for the int8 head ("Q8_0 in groups of 16 rows" below); only
 * matmul_q8_0x16_i8 and dequantize read it. */
enum { T_Q8_0X16 = 1008 };

/* Byte i of q5_high_bits[b] is bit i of b moved to bit 4 (Q5_0's fifth bit, 8 at a time). */
static uint64_t q5_high_bits[256];

static void init_tables(void) {
    for (int b = 0; b < 256; b++) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++) v |= (uint64_t)(((b >> i) & 1) << 4) << (8 * i);
        q5_high_bits[b] = v;
    }
}

/* Each instruction set gets its own copy of the hot loops (GCC vector extensions compile to
 * 512-, 256- or 128-bit code); the best one the CPU runs is picked at import, and set_isa()
 * can pick a lower one (tests run every copy on one machine). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_X86_COPIES 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#define K(name) name##_avx512
#define VW 16
#include "_ggufmm_kernels.h"
#undef K
#undef VW
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define K(name) name##_avx2
#define VW 8
#include "_ggufmm_kernels.h"
#undef K
#undef VW
#pragma GCC pop_options
#endif
#define K(name) name##_base
#define VW 4
#include "_ggufmm_kernels.h"
#undef K
#undef VW

typedef void (*deq_fn)(const uint8_t *, int64_t, float *);
typedef void (*dot_fn)(const float *, int64_t, int64_t, const float *, int64_t, float *, int64_t);
/* fused dequantize-and-dot of nw weight rows with m <= GEMV_MAX_ROWS rows of x */
typedef void (*gemv_fn)(const uint8_t *, int64_t, int64_t, int64_t, const float *, int64_t, float *, int64_t);

struct isa {
    const char *name;
    deq_fn q8_0, q5_0, q4_k, q6_k, q5_0r, q4_kr, q6_kr;
    dot_fn dot;
    gemv_fn q5_0r_gemv, q4_kr_gemv, q6_kr_gemv; /* NULL: dequantize-then-dot for every m */
};

#define ISA(tag, sfx, q5, q4, q6)                                                                                  \
    {tag, deq_q8_0_##sfx, deq_q5_0_##sfx, deq_q4_k_##sfx, deq_q6_k_##sfx, deq_q5_0r_##sfx, deq_q4_kr_##sfx,       \
     deq_q6_kr_##sfx, dot_rows_##sfx, q5, q4, q6}
static const struct isa isas[] = {
#ifdef HAVE_X86_COPIES
    ISA("avx512", avx512, gemv_q5_0r_avx512, gemv_q4_kr_avx512, gemv_q6_kr_avx512),
    ISA("avx2", avx2, NULL, NULL, NULL),
#endif
    ISA("baseline", base, NULL, NULL, NULL),
};
#define NUM_ISAS ((int)(sizeof isas / sizeof isas[0]))
static int best_isa = NUM_ISAS - 1; /* set at import: the first entry the CPU supports */
static int use_gemv = 1; /* set_gemv(False): every m takes dequantize-then-dot (tests, A/B) */
static int cur_isa = NUM_ISAS - 1;
static int has_vnni; /* AVX-512 VNNI: matmul_q8_0_i8's fast copy */
static int has_bf16; /* AVX-512 BF16: torch's bfloat16 matmuls run natively (gguf_linear's prefill) */

static void detect_isa(void) {
#ifdef HAVE_X86_COPIES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        best_isa = 0;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        best_isa = 1;
    has_vnni = best_isa == 0 && __builtin_cpu_supports("avx512vnni");
    has_bf16 = best_isa == 0 && __builtin_cpu_supports("avx512bf16");
#endif
    cur_isa = best_isa;
}

static int type_info(int qtype, int64_t *block, int64_t *bytes, deq_fn *fn) {
    const struct isa *I = &isas[cur_isa];
    switch (qtype) {
    case T_Q8_0: *block = 32; *bytes = 34; *fn = I->q8_0; return 0;
    case T_Q5_0: *block = 32; *bytes = 22; *fn = I->q5_0; return 0;
    case T_Q4_K: *block = 256; *bytes = 144; *fn = I->q4_k; return 0;
    case T_Q6_K: *block = 256; *bytes = 210; *fn = I->q6_k; return 0;
    case T_Q5_0R: *block = 32; *bytes = 36; *fn = I->q5_0r; return 0;
    case T_Q4_KR: *block = 256; *bytes = 192; *fn = I->q4_kr; return 0;
    case T_Q6_KR: *block = 256; *bytes = 320; *fn = I->q6_kr; return 0;
    default: return -1;
    }
}


/* ---- Repacked layouts ---------------------------------------------------------------------
 *
 * Q5_0, Q4_K and Q6_K keep their quants as packed bits and their scales as half floats, which a
 * decode step's matmul unpacks at every call (for Q5_0, two thirds of its work on this model).
 * GGUFLinear repacks them once, at load, into layouts that hold exactly the same weights:
 *
 *   Q5_0R (32 weights, 36 bytes): float d, int8 q[32] = the 5-bit quants - 16, weight order
 *         (Q8_0 repacks into it too: its half d as a float, its quants as they are);
 *   Q4_KR (256 weights, 192 bytes): float scale[8] = d * sc_g, float min[8] = dmin * m_g (the
 *         products the Q4_K kernels form), then Q4_K's 128 bytes of nibbles as they are;
 *   Q6_KR (256 weights, 320 bytes): float scale[16] = d * sc_r, int8 q[256] = the 6-bit
 *         quants - 32, weight order.
 *
 * 1.6x (Q8_0: 1.06x), 1.33x and 1.52x the bytes (the default model's layers: 67 -> 104 MB), but a block
 * meets x after two widening loads and converts. Dequantized, every weight is the GGUF
 * layout's value bit for bit (tests/kernels/test_gguf_linear.py). */

static void put_f32(uint8_t *p, float f) { memcpy(p, &f, 4); }

static void repack_row(int qtype, const uint8_t *src, int64_t k, uint8_t *dst) {
    if (qtype == T_Q8_0) {
        for (int64_t b = 0; b < k / 32; b++, src += 34, dst += 36) {
            put_f32(dst, half_to_float_base(rd16_base(src)));
            memcpy(dst + 4, src + 2, 32);
        }
    } else if (qtype == T_Q5_0) {
        for (int64_t b = 0; b < k / 32; b++, src += 22, dst += 36) {
            uint32_t qh;
            memcpy(&qh, src + 2, 4);
            put_f32(dst, half_to_float_base(rd16_base(src)));
            for (int j = 0; j < 32; j++) {
                const int nib = j < 16 ? src[6 + j] & 0x0f : src[6 + j - 16] >> 4;
                dst[4 + j] = (uint8_t)(int8_t)((nib | (int)((qh >> j) & 1) << 4) - 16);
            }
        }
    } else if (qtype == T_Q4_K) {
        for (int64_t b = 0; b < k / 256; b++, src += 144, dst += 192) {
            const float d = half_to_float_base(rd16_base(src)), dmin = half_to_float_base(rd16_base(src + 2));
            for (int g = 0; g < 8; g++) {
                int a, m;
                q4_k_scale_min_base(src + 4, g, &a, &m);
                put_f32(dst + 4 * g, d * (float)a);
                put_f32(dst + 32 + 4 * g, dmin * (float)m);
            }
            memcpy(dst + 64, src + 16, 128);
        }
    } else { /* T_Q6_K: weight 128 h + 32 j + l (j < 4, l < 32) as in deq_q6_k */
        for (int64_t b = 0; b < k / 256; b++, src += 210, dst += 320) {
            const int8_t *sc = (const int8_t *)(src + 192);
            const float d = half_to_float_base(rd16_base(src + 208));
            for (int r = 0; r < 16; r++) put_f32(dst + 4 * r, d * (float)sc[r]);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = src + 64 * h, *qh = src + 128 + 32 * h;
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 32; l++) {
                        const int nib = (ql[l + 32 * (j & 1)] >> (4 * (j >> 1))) & 0x0f;
                        dst[64 + 128 * h + 32 * j + l] = (uint8_t)(int8_t)((nib | ((qh[l] >> (2 * j)) & 3) << 4) - 32);
                    }
            }
        }
    }
}

/* The repacked id of a GGML type, or 0 where it has none. */
static int repacked_type(int qtype) {
    return qtype == T_Q5_0 || qtype == T_Q8_0 ? T_Q5_0R : qtype == T_Q4_K ? T_Q4_KR : qtype == T_Q6_K ? T_Q6_KR : 0;
}

/* ---- Threads ------------------------------------------------------------------------------
 *
 * A call is cut into chunks of rows; the calling thread and up to threads - 1 helpers claim
 * chunks from one atomic ticket, and the call returns once every claimed chunk is done. The
 * caller never waits for a helper that has not started: a helper the OS has not scheduled (a
 * loaded machine) simply claims nothing, and the caller does its share. That is the difference
 * from an OpenMP parallel region, whose closing barrier waits for every thread of the team:
 * with OpenMP's default wait policy the team's threads spin, and on a 2-core machine shared
 * with other processes a decode step of 83 ms took 1.5 s; OMP_WAIT_POLICY=PASSIVE fixed that
 * but made the quiet case ~40% slower (a futex wake-up per parallel region, ~130 per step).
 * Helpers spin for spin_ns (3 ms) after their last chunk, calling sched_yield() between checks
 * (most gaps between two matmuls of a decode step are shorter), then sleep on a condition
 * variable until the next call wakes them. Under load the spin length made no difference
 * (0 to 3 ms measured); quiet, a hot helper joins a call at once. docs/benchmarks.md, "Issue
 * 20: OpenMP waits".
 *
 * ticket: generation (24 bits) | chunks (20 bits) | next unclaimed chunk (20 bits). A helper
 * claims with a compare-and-swap on the whole word, so it claims only from the call that is
 * running; having claimed, it reads that call's description (stable until `done` counts the
 * chunk, since the caller waits for that). */

/* Helpers spin this long after their last chunk, calling sched_yield() between checks (a
 * loaded machine's other threads get the core), then sleep. ASERVE_KERNEL_SPIN_US and
 * ASERVE_KERNEL_SPIN_YIELD=0 (read at import) override, to measure other choices. */
static int64_t spin_ns = 3000000L;
static int yield_spin = 1;
#define MAX_HELPERS 63
#define CHUNK_BITS 20
#define MAX_CHUNKS ((1 << CHUNK_BITS) - 1)
#define T_NEXT(t) ((int64_t)((t) & MAX_CHUNKS))
#define T_CHUNKS(t) ((int64_t)(((t) >> CHUNK_BITS) & MAX_CHUNKS))
#define T_GEN(t) ((t) >> (2 * CHUNK_BITS))

struct job {
    int dequant; /* 0: y = x @ W^T (matmul); 1: out = rows of W (dequantize) */
    deq_fn fn;
    dot_fn dot;
    gemv_fn gemv; /* set: rows of W times x fused (few rows of x), fn and dot unused */
    const uint8_t *w;
    int64_t row_bytes, k, n; /* n: rows of W (matmul) or rows to dequantize */
    const float *x;
    int64_t m;
    float *y;
    const int64_t *rows;
    int64_t chunk_rows;
    /* A call that runs its own loop over rows start .. end (matmul_q8_0_i8, attend): */
    void (*rowfn)(const struct job *, int64_t, int64_t);
    const void *ctx; /* its arguments, where the fields below do not hold them */
    /* matmul_q8_0_i8: 8-bit activations in groups of 16 rows (see there) */
    const uint8_t *xt;
    const float *xs;
    int64_t groups;
    const int8_t *xq; /* the same x row-major [m, k], and its scales [m, k / 32] */
    const float *xd;
    const uint16_t *xb; /* set: x [m, k] in bfloat16, and the tiles multiply in bfloat16 */
};

/* Each shared word on its own cache line: a claim or a count must not evict the call's
 * description (or each other) from the other threads' caches. */
static _Alignas(64) struct job job;
static _Alignas(64) _Atomic uint64_t ticket;
static _Alignas(64) _Atomic int64_t done;
static _Alignas(64) _Atomic int allowed; /* helpers 0 .. allowed - 1 may claim chunks of the current call */
static _Alignas(64) _Atomic int sleepers;
static int num_helpers;
static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER; /* one call on the pool at a time */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond = PTHREAD_COND_INITIALIZER;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Per-helper buffers of 4 * k floats, grown by the caller before it publishes a call (no helper
 * is inside a chunk then: the previous call has finished). */
static float *helper_buf[MAX_HELPERS];
static int64_t helper_cap[MAX_HELPERS];

static int grow(float **buf, int64_t *cap, int64_t floats) {
    if (*cap >= floats) return 0;
    free(*buf);
    *buf = (float *)aligned_alloc(64, (size_t)((floats + 15) / 16 * 16) * sizeof(float));
    *cap = *buf == NULL ? 0 : floats;
    return *buf == NULL ? -1 : 0;
}

/* ---- bfloat16 tiles (AVX-512 BF16) -------------------------------------------------------
 *
 * Matmuls of more rows than the fused copies take (a batch of decode steps) are bound by the
 * tiles' float multiply-adds. With bf16 set on a CPU with AVX-512 BF16, x is rounded to
 * bfloat16 once per call and each dequantized weight row on its way through L1; vdpbf16ps
 * then does two products per lane and instruction where a float FMA does one, accumulating
 * in float32. The same rounding as gguf_linear's bfloat16 prefill, without rounding the result. */
#ifdef HAVE_X86_COPIES
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
/* n floats (a multiple of 32) -> bfloat16, round to nearest even. dst may be src: the bytes
 * written never overtake the floats still to be read. */
BF16_TARGET static void to_bf16(const float *src, int64_t n, uint16_t *dst) {
    for (int64_t i = 0; i < n; i += 32) {
        const __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        _mm512_storeu_si512((void *)(dst + i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

BF16_TARGET static inline __m512bh ld_bf16(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512((const void *)p); }

/* w: nw <= 4 rows [nw, k] and x: m rows [m, k], both bfloat16; y[r * ldy + j] = dot(w_j, x_r).
 * A register tile of 4 weight rows by 4 rows of x, as dot_rows, with the rest one pair at a time. */
BF16_TARGET static void dot_rows_bf16(const uint16_t *w, int64_t nw, int64_t k, const uint16_t *x, int64_t m,
                                      float *y, int64_t ldy) {
    int64_t r = 0;
    if (nw == 4) {
        for (; r + 4 <= m; r += 4) {
            __m512 acc[4][4];
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < 4; t++) acc[j][t] = _mm512_setzero_ps();
            for (int64_t i = 0; i < k; i += 32) {
                __m512bh wv[4], xv[4];
                for (int j = 0; j < 4; j++) wv[j] = ld_bf16(w + j * k + i);
                for (int t = 0; t < 4; t++) xv[t] = ld_bf16(x + (r + t) * k + i);
                for (int j = 0; j < 4; j++)
                    for (int t = 0; t < 4; t++) acc[j][t] = _mm512_dpbf16_ps(acc[j][t], wv[j], xv[t]);
            }
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 4; j++) y[(r + t) * ldy + j] = _mm512_reduce_add_ps(acc[j][t]);
        }
    }
    for (; r < m; r++)
        for (int64_t j = 0; j < nw; j++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < k; i += 32) acc = _mm512_dpbf16_ps(acc, ld_bf16(w + j * k + i), ld_bf16(x + r * k + i));
            y[r * ldy + j] = _mm512_reduce_add_ps(acc);
        }
}
#undef BF16_TARGET
#endif

/* Chunk c of a call: 4 weight rows at a time dequantized into buf (16 KB for k = 1024: L1),
 * then their dot products with every row of x; or rows of W dequantized straight into y. */
static void run_chunk(const struct job *j, int64_t c, float *buf) {
    const int64_t start = c * j->chunk_rows, end = start + j->chunk_rows < j->n ? start + j->chunk_rows : j->n;
    if (j->rowfn != NULL) {
        j->rowfn(j, start, end);
        return;
    }
    if (j->dequant) {
        for (int64_t i = start; i < end; i++) {
            const int64_t r = j->rows != NULL ? j->rows[i] : i;
            j->fn(j->w + r * j->row_bytes, j->k, j->y + i * j->k);
        }
        return;
    }
    if (j->gemv != NULL) {
        j->gemv(j->w + start * j->row_bytes, j->row_bytes, end - start, j->k, j->x, j->m, j->y + start, j->n);
        return;
    }
    for (int64_t r = start; r < end; r += 4) {
        const int64_t nw = end - r < 4 ? end - r : 4;
        for (int64_t i = 0; i < nw; i++) j->fn(j->w + (r + i) * j->row_bytes, j->k, buf + i * j->k);
#ifdef HAVE_X86_COPIES
        if (j->xb != NULL) {
            to_bf16(buf, nw * j->k, (uint16_t *)buf);
            dot_rows_bf16((const uint16_t *)buf, nw, j->k, j->xb, j->m, j->y + r, j->n);
            continue;
        }
#endif
        j->dot(buf, nw, j->k, j->x, j->m, j->y + r, j->n);
    }
}

/* Claim and run chunks of the running call until none is left. who: a helper's index, or -1
 * for the caller (whose buffer is `own`). */
static void claim_chunks(int who, float *own) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&ticket, memory_order_acquire);
        if (T_NEXT(t) >= T_CHUNKS(t)) return;
        if (who >= 0 && who >= atomic_load_explicit(&allowed, memory_order_relaxed)) return;
        if (!atomic_compare_exchange_weak_explicit(&ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        /* Claimed: job and helper_buf are this call's until `done` counts the chunk. */
        const struct job j = job;
        run_chunk(&j, T_NEXT(t), who >= 0 ? helper_buf[who] : own);
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
    }
}

static void *helper_main(void *arg) {
    const int who = (int)(intptr_t)arg;
    for (;;) {
        claim_chunks(who, NULL);
        const uint64_t gen = T_GEN(atomic_load_explicit(&ticket, memory_order_acquire));
        const int64_t until = now_ns() + spin_ns;
        int spins = 0;
        while (T_GEN(atomic_load_explicit(&ticket, memory_order_acquire)) == gen) {
            cpu_relax();
            if (++spins % 64 == 0) {
                if (now_ns() > until) break;
                if (yield_spin) sched_yield();
            }
        }
        if (T_GEN(atomic_load_explicit(&ticket, memory_order_acquire)) != gen) continue;
        pthread_mutex_lock(&sleep_lock);
        atomic_fetch_add(&sleepers, 1);
        while (T_GEN(atomic_load(&ticket)) == gen) pthread_cond_wait(&sleep_cond, &sleep_lock);
        atomic_fetch_sub(&sleepers, 1);
        pthread_mutex_unlock(&sleep_lock);
    }
    return NULL;
}

/* After fork() only the forking thread exists: the child starts a pool of its own. */
static void pool_after_fork_child(void) {
    num_helpers = 0;
    atomic_store(&sleepers, 0);
    pthread_mutex_init(&submit_lock, NULL);
    pthread_mutex_init(&sleep_lock, NULL);
    pthread_cond_init(&sleep_cond, NULL);
}

/* Start helpers 0 .. want - 1 where missing, each with a buffer of 4 * k floats; returns how
 * many are ready (fewer where a thread or a buffer could not be had). Holds submit_lock. */
static int ready_helpers(int want, int64_t k) {
    int n = 0;
    for (; n < want; n++) {
        if (grow(&helper_buf[n], &helper_cap[n], 4 * k) != 0) break;
        if (n < num_helpers) continue;
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&th, &attr, helper_main, (void *)(intptr_t)n);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        num_helpers++;
    }
    return n;
}

/* Run j, cut into nchunks chunks, on the caller and up to threads - 1 helpers; -1 if out of
 * memory. Called without the GIL. */
static int run_job(const struct job *j, int64_t nchunks, int threads) {
    float *own = NULL;
    int64_t cap = 0;
    if (!j->dequant && j->rowfn == NULL && j->gemv == NULL && grow(&own, &cap, 4 * j->k) != 0) return -1;
    int helpers = threads - 1 < MAX_HELPERS ? threads - 1 : MAX_HELPERS;
    if (helpers > nchunks - 1) helpers = (int)(nchunks - 1);
    if (helpers < 1 || pthread_mutex_trylock(&submit_lock) != 0) {
        /* one thread, or another Python thread's call holds the pool: all chunks here */
        for (int64_t c = 0; c < nchunks; c++) run_chunk(j, c, own);
        free(own);
        return 0;
    }
    helpers = ready_helpers(helpers, j->dequant || j->rowfn != NULL || j->gemv != NULL ? 0 : j->k);
    job = *j;
    atomic_store_explicit(&done, 0, memory_order_relaxed);
    atomic_store_explicit(&allowed, helpers, memory_order_relaxed);
    const uint64_t gen = (T_GEN(atomic_load(&ticket)) + 1) & ((1u << 24) - 1);
    atomic_store(&ticket, (gen << (2 * CHUNK_BITS)) | ((uint64_t)nchunks << CHUNK_BITS)); /* publish */
    if (helpers > 0 && atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&sleep_cond);
        pthread_mutex_unlock(&sleep_lock);
    }
    claim_chunks(-1, own);
    /* Wait for the chunks that helpers claimed and still run (never for one that claimed none). */
    for (int spins = 0; atomic_load_explicit(&done, memory_order_acquire) < nchunks; spins++) {
        cpu_relax();
        if (spins > 2000) sched_yield();
    }
    pthread_mutex_unlock(&submit_lock);
    free(own);
    return 0;
}

/* Rows per chunk: a multiple of `unit`, about 16 chunks per thread (fewer claims on the shared
 * ticket for a large weight, enough to balance when a thread runs late). */
static int64_t chunk_rows_for(int64_t n, int64_t unit, int threads) {
    const int64_t want = n / (16 * (int64_t)(threads > 1 ? threads : 1));
    int64_t rows = want > unit ? want / unit * unit : unit;
    while ((n + rows - 1) / rows > MAX_CHUNKS) rows *= 2;
    return rows;
}

#include "_cpu_ops.h"

/* ---- Python entry points ------------------------------------------------------------- */

static int check_shape(int qtype, int64_t k, int64_t *block, int64_t *bytes, deq_fn *fn) {
    if (type_info(qtype, block, bytes, fn) != 0) {
        PyErr_Format(PyExc_ValueError, "unsupported GGML type %d (supported: Q5_0, Q8_0, Q4_K, Q6_K and their repacked ids)", qtype);
        return -1;
    }
    if (k <= 0 || k % *block != 0) {
        PyErr_Format(PyExc_ValueError, "row length %lld is not a multiple of the block size %lld", (long long)k,
                     (long long)*block);
        return -1;
    }
    return 0;
}

/* y[m, n] = x[m, k] @ W[n, k]^T for a checked (qtype, k); -1 if out of memory. Runs without
 * the GIL. bf16: a call of more than GEMV_MAX_ROWS rows multiplies in bfloat16 where the CPU
 * has AVX-512 BF16 ("bfloat16 tiles" above); elsewhere, and for fewer rows, it is ignored. */
static int matmul_run(int qtype, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                      int threads, int bf16) {
    int64_t block, bytes;
    deq_fn fn;
    if (type_info(qtype, &block, &bytes, &fn) != 0) return -2;
    struct job j = {0};
    j.fn = fn;
    j.dot = isas[cur_isa].dot;
    if (m <= GEMV_MAX_ROWS && use_gemv)
        j.gemv = qtype == T_Q5_0R   ? isas[cur_isa].q5_0r_gemv
                 : qtype == T_Q4_KR ? isas[cur_isa].q4_kr_gemv
                 : qtype == T_Q6_KR ? isas[cur_isa].q6_kr_gemv
                                    : NULL;
    j.w = w;
    j.row_bytes = k / block * bytes;
    j.k = k;
    j.n = n;
    j.x = x;
    j.m = m;
    j.y = y;
    /* Chunks of a multiple of 16 rows: a chunk's slice of y is whole cache lines per row of x. */
    j.chunk_rows = chunk_rows_for(n, 16, threads);
    uint16_t *xb = NULL;
#ifdef HAVE_X86_COPIES
    if (bf16 && m > GEMV_MAX_ROWS && has_bf16 && cur_isa == 0) {
        xb = (uint16_t *)aligned_alloc(64, (size_t)((m * k * 2 + 63) / 64 * 64));
        if (xb == NULL) return -1;
        to_bf16(x, m * k, xb);
        j.xb = xb;
    }
#else
    (void)bf16;
#endif
    const int rc = run_job(&j, (n + j.chunk_rows - 1) / j.chunk_rows, threads);
    free(xb);
    return rc;
}

/* matmul(qtype, w_ptr, n, k, x_ptr, m, y_ptr, threads[, bf16]): y[m, n] = x[m, k] @ W[n, k]^T
 * (matmul_run). */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    int qtype, threads, bf16 = 0;
    unsigned long long wp, xp, yp;
    long long n, k, m;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKLLKLKi|i", &qtype, &wp, &n, &k, &xp, &m, &yp, &threads, &bf16)) return NULL;
    int64_t block, bytes;
    deq_fn fn;
    if (check_shape(qtype, k, &block, &bytes, &fn) != 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = matmul_run(qtype, (const uint8_t *)(uintptr_t)wp, n, k, (const float *)(uintptr_t)xp, m,
                    (float *)(uintptr_t)yp, threads, bf16);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static void x16_dequant_rows(const struct job *j, int64_t start, int64_t end); /* below, with its layout */

/* dequantize(qtype, w_ptr, k, rows_ptr or 0, count, out_ptr, threads): out[i, :] = W[row_i, :]
 * for row_i = rows[i] (int64) when rows_ptr is given, else row_i = i. qtype may be Q8_0X16
 * (the int8 head's layout), whose rows are interleaved by 16. */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    int qtype, threads;
    unsigned long long wp, rp, op;
    long long k, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKLKLKi", &qtype, &wp, &k, &rp, &count, &op, &threads)) return NULL;
    int64_t block = 32, bytes = 34;
    deq_fn fn = NULL;
    if (qtype == T_Q8_0X16 ? check_shape(T_Q8_0, k, &block, &bytes, &fn) : check_shape(qtype, k, &block, &bytes, &fn))
        return NULL;
    struct job j = {0};
    if (qtype == T_Q8_0X16) j.rowfn = x16_dequant_rows;
    else {
        j.dequant = 1;
        j.fn = fn;
    }
    j.w = (const uint8_t *)(uintptr_t)wp;
    j.row_bytes = k / block * bytes;
    j.k = k;
    j.n = count;
    j.rows = (const int64_t *)(uintptr_t)rp;
    j.y = (float *)(uintptr_t)op;
    j.chunk_rows = chunk_rows_for(count, 16, threads);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_job(&j, count == 0 ? 0 : (count + j.chunk_rows - 1) / j.chunk_rows, count > 8 ? threads : 1);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* repack(qtype, src_ptr, n, k, dst_ptr): n rows of k weights of a GGML type into its repacked
 * layout (dst: n * row_bytes(repacked id, k) bytes); returns the repacked id. ValueError for a
 * type without one. */
static PyObject *py_repack(PyObject *self, PyObject *args) {
    int qtype;
    unsigned long long sp, dp;
    long long n, k;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKLLK", &qtype, &sp, &n, &k, &dp)) return NULL;
    const int to = repacked_type(qtype);
    if (to == 0) return PyErr_Format(PyExc_ValueError, "GGML type %d has no repacked layout (Q5_0, Q8_0, Q4_K, Q6_K do)", qtype);
    int64_t block, bytes, rblock, rbytes;
    deq_fn fn;
    if (check_shape(qtype, k, &block, &bytes, &fn) != 0 || check_shape(to, k, &rblock, &rbytes, &fn) != 0) return NULL;
    const uint8_t *src = (const uint8_t *)(uintptr_t)sp;
    uint8_t *dst = (uint8_t *)(uintptr_t)dp;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) repack_row(qtype, src + i * (k / block * bytes), k, dst + i * (k / rblock * rbytes));
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(to);
}

/* ---- Q8_0 weights times 8-bit activations ------------------------------------------------
 *
 * The LM head of a GGUF model is Q8_0 (int8 weights, one half-precision scale per 32) and the
 * largest matmul of a decode step; at 16 rows of x it is bound by arithmetic, not memory. Here
 * x comes quantized as llama.cpp quantizes activations (per block of 32: xd = max|x| / 127,
 * xq = round(x / xd)), and a block's dot product is exact integer arithmetic:
 *
 *   y[r, n] = sum over blocks b of float(sum_i xq[r, 32b + i] * q[n, 32b + i]) * (d[n, b] * xd[r, b])
 *
 * the float sum taken block by block in order with fused multiply-adds, identical in every
 * copy below, so a row's result does not depend on the other rows or the instruction set.
 *
 * Layout: one vector lane per row of x (16 rows a group), the weight bytes broadcast. With
 * AVX-512 VNNI, vpdpbusd multiplies 4 unsigned bytes of each lane by 4 signed weight bytes and
 * adds them to the lane's int32: 8 instructions take a 32-weight block for 16 rows, where the
 * float path spends 32 fused multiply-adds and the block's dequantization. vpdpbusd wants one
 * side unsigned, so the lanes hold xq + 128 and the block's 128 * sum(q) is taken back off.
 *
 * xt: [groups][k / 4][16 lanes][4] bytes xq + 128 (rows past m: 128, i.e. zero); xs: [groups]
 * [k / 32][16] floats xd (rows past m: 0). */
static void i8_rows_portable(const struct job *j, int64_t start, int64_t end) {
    const int64_t nb = j->k / 32;
    for (int64_t r = start; r < end; r++) {
        const uint8_t *w = j->w + r * j->row_bytes;
        for (int64_t g = 0; g < j->groups; g++) {
            const uint8_t *xt = j->xt + g * j->k * 16;
            const float *xs = j->xs + g * nb * 16;
            float acc[16] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + b * 34;
                const float d = half_to_float_base(rd16_base(blk));
                const int8_t *q = (const int8_t *)(blk + 2);
                int32_t s = 0, ai[16] = {0};
                for (int i = 0; i < 32; i++) s += q[i];
                for (int t = 0; t < 8; t++) {
                    const uint8_t *xb = xt + (b * 8 + t) * 64;
                    for (int l = 0; l < 16; l++)
                        for (int e = 0; e < 4; e++) ai[l] += (int32_t)xb[l * 4 + e] * (int32_t)q[4 * t + e];
                }
                for (int l = 0; l < 16; l++) acc[l] = fmaf((float)(ai[l] - 128 * s), d * xs[b * 16 + l], acc[l]);
            }
            const int64_t rows = j->m - 16 * g < 16 ? j->m - 16 * g : 16;
            for (int64_t l = 0; l < rows; l++) j->y[(16 * g + l) * j->n + r] = acc[l];
        }
    }
}

#ifdef HAVE_X86_COPIES
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))

/* A Q8_0 block's scale d, its 32 quants, and sum(q): the bytes q + 128 summed as unsigned
 * (vpsadbw), less 32 * 128. */
VNNI_TARGET static inline int32_t q8_block_vnni(const uint8_t *blk, float *d, __m256i *qv) {
    *d = _cvtsh_ss((unsigned short)(blk[0] | blk[1] << 8));
    *qv = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(*qv, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    return (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
}

/* One row of x against weight row w, a block at a time (32 bytes of xq + 128 against the
 * block's quants): the lanes' sums for that row, for groups too small to fill the lanes. */
VNNI_TARGET static float i8_row_vnni(const struct job *j, const uint8_t *w, int64_t row) {
    const int64_t nb = j->k / 32;
    const int8_t *xr = j->xq + row * j->k;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float d;
        __m256i qv;
        const int32_t s = q8_block_vnni(w + b * 34, &d, &qv);
        const __m256i xv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xr + 32 * b)),
                                            _mm256_set1_epi8((char)0x80)); /* xq + 128 */
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), xv, qv);
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        acc = fmaf((float)(_mm_cvtsi128_si32(h) - 128 * s), d * j->xd[row * nb + b], acc);
    }
    return acc;
}

VNNI_TARGET static void i8_rows_vnni(const struct job *j, int64_t start, int64_t end) {
    const int64_t nb = j->k / 32;
    for (int64_t r = start; r < end; r++) {
        const uint8_t *w = j->w + r * j->row_bytes;
        for (int64_t g = 0; g < j->groups; g++) {
            const int64_t rows = j->m - 16 * g < 16 ? j->m - 16 * g : 16;
            if (rows <= 3) { /* a lane per row would idle 13 of 16: one row at a time, the same sums */
                for (int64_t l = 0; l < rows; l++) j->y[(16 * g + l) * j->n + r] = i8_row_vnni(j, w, 16 * g + l);
                continue;
            }
            const uint8_t *xt = j->xt + g * j->k * 16;
            const float *xs = j->xs + g * nb * 16;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + b * 34;
                float d;
                __m256i qv;
                const int32_t s = q8_block_vnni(blk, &d, &qv);
                /* four independent sums: vpdpbusd's latency, not its throughput, bounds one chain */
                __m512i ai[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                                 _mm512_setzero_si512()};
                const uint8_t *xb = xt + b * 8 * 64;
                for (int t = 0; t < 8; t++) {
                    int32_t w4;
                    memcpy(&w4, blk + 2 + 4 * t, 4);
                    ai[t % 4] = _mm512_dpbusd_epi32(ai[t % 4], _mm512_loadu_si512((const void *)(xb + t * 64)),
                                                    _mm512_set1_epi32(w4));
                }
                const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(ai[0], ai[1]),
                                                                       _mm512_add_epi32(ai[2], ai[3])),
                                                      _mm512_set1_epi32(128 * s));
                const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_loadu_ps(xs + b * 16));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc);
            }
            float out[16];
            _mm512_storeu_ps(out, acc);
            for (int64_t l = 0; l < rows; l++) j->y[(16 * g + l) * j->n + r] = out[l];
        }
    }
}
#undef VNNI_TARGET
#endif


/* ---- Q8_0 in groups of 16 rows, for the int8 head -----------------------------------------
 *
 * matmul_q8_0_i8 puts rows of x in the lanes and broadcasts the weights; each weight row's
 * block then also pays for its sum of quants and its scale. Q8_0X16 puts 16 rows of W in the
 * lanes instead: a block's weights are loaded once for all rows of x, and a row of x costs 8
 * vpdpbusd with its bytes broadcast and five other instructions. Per group of 16 rows and
 * block of 32 (544 bytes, Q8_0's own size): the 16 rows' half-precision d (32 bytes), then for
 * t < 8 the 16 rows' quant bytes 4t .. 4t + 3, each + 128 (vpdpbusd's unsigned operand), row
 * after row. x stays signed, and 128 * sum(xq) of each of its blocks comes off the integer
 * sum, which is then sum(xq * q) exactly, scaled and added block by block as there: the same
 * bits as matmul_q8_0_i8. The weight's rows: a multiple of 16. */
/* Offset in a group's block of row l's quant i (i < 32): after the 32 bytes of d, 4 quants of
 * each of the 16 rows in turn. */
static inline int64_t x16_at(int l, int i) { return 32 + 64 * (i / 4) + 4 * l + i % 4; }

static void repack_q8_0x16(const uint8_t *src, int64_t n, int64_t k, uint8_t *dst) {
    const int64_t nb = k / 32;
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = dst + (g * nb + b) * 544;
            for (int l = 0; l < 16; l++) {
                const uint8_t *blk = src + ((16 * g + l) * nb + b) * 34;
                memcpy(o + 2 * l, blk, 2);
                for (int i = 0; i < 32; i++) o[x16_at(l, i)] = blk[2 + i] ^ 0x80;
            }
        }
}

/* A Q8_0X16 call's own arguments: the rows' 128 * sum(xq) per block; with top > 0, the call
 * keeps no logits but, per chunk and row of x, its largest logits and their indices in a
 * min-heap of hcap = min(top, chunk rows) entries (best / idx: [chunks, m, hcap], the worst at
 * the root), merged into each row's top after the job. top = 1 is the argmax: the first index
 * among equals, as torch.argmax. */
struct x16_ctx {
    const int32_t *xc;
    float *best;
    int64_t *idx;
    int64_t top, hcap;
};

/* Whether logit v takes the place of the best so far, b: larger, or the first NaN (the largest,
 * as in torch.argmax); an equal one does not (the first index among equals wins). */
static inline int x16_beats(float v, float b) { return v > b || (v != v && b == b); }

/* Logit v at index i into a min-heap of t entries (the root its worst) when it beats the root. */
static inline void x16_push(float *hv, int64_t *hi, int64_t t, float v, int64_t i) {
    if (!x16_beats(v, hv[0])) return;
    int64_t p = 0;
    for (;;) { /* sift the new entry down from the root */
        int64_t c = 2 * p + 1;
        if (c >= t) break;
        if (c + 1 < t && x16_beats(hv[c], hv[c + 1])) c++; /* the worse child */
        if (!x16_beats(v, hv[c])) break;
        hv[p] = hv[c];
        hi[p] = hi[c];
        p = c;
    }
    hv[p] = v;
    hi[p] = i;
}

/* 16 logits (weight rows 16 g .. 16 g + 15) of row r of x: stored into y, or pushed into the
 * chunk's heap of that row. */
static inline __attribute__((always_inline)) void x16_out(const struct job *j, int64_t start, int64_t g, int64_t r,
                                                          const float *v) {
    const struct x16_ctx *c = (const struct x16_ctx *)j->ctx;
    if (c->top == 0) {
        memcpy(j->y + r * j->n + 16 * g, v, 16 * sizeof(float));
        return;
    }
    const int64_t at = ((start / j->chunk_rows) * j->m + r) * c->hcap;
    float *hv = c->best + at;
    int64_t *hi = c->idx + at;
    for (int l = 0; l < 16; l++) x16_push(hv, hi, c->hcap, v[l], 16 * g + l);
}

/* Rows start .. end (multiples of 16) of y, portable: the same sums in plain loops. */
static void i8x16_rows_portable(const struct job *j, int64_t start, int64_t end) {
    const int64_t nb = j->k / 32;
    const int32_t *xc = ((const struct x16_ctx *)j->ctx)->xc;
    for (int64_t g = start / 16; g < end / 16; g++)
        for (int64_t r = 0; r < j->m; r++) {
            float acc[16] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = j->w + (g * nb + b) * 544;
                const int8_t *xr = j->xq + r * j->k + 32 * b;
                for (int l = 0; l < 16; l++) {
                    int32_t s = 0;
                    for (int i = 0; i < 32; i++) s += (int32_t)blk[x16_at(l, i)] * xr[i];
                    const float d = half_to_float_base(rd16_base(blk + 2 * l));
                    acc[l] = fmaf((float)(s - xc[r * nb + b]), d * j->xd[r * nb + b], acc[l]);
                }
            }
            x16_out(j, start, g, r, acc);
        }
}

#ifdef HAVE_X86_COPIES
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
/* Group g of W against rows r0 .. r0 + R - 1 of x (R a constant after inlining: the
 * accumulators stay in registers). */
VNNI_TARGET static inline __attribute__((always_inline)) void i8x16_tile(const struct job *j, int64_t start, int64_t g,
                                                                          int64_t r0, const int R) {
    const int64_t nb = j->k / 32;
    const int32_t *xc = ((const struct x16_ctx *)j->ctx)->xc;
    __m512 acc[8];
    for (int rr = 0; rr < R; rr++) acc[rr] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = j->w + (g * nb + b) * 544;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        __m512i wq[8];
        for (int t = 0; t < 8; t++) wq[t] = _mm512_loadu_si512((const void *)(blk + 32 + 64 * t));
        for (int rr = 0; rr < R; rr++) {
            const int64_t r = r0 + rr;
            const int8_t *xr = j->xq + r * j->k + 32 * b;
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            for (int t = 0; t < 8; t += 2) {
                int32_t x0, x1;
                memcpy(&x0, xr + 4 * t, 4);
                memcpy(&x1, xr + 4 * t + 4, 4);
                a0 = _mm512_dpbusd_epi32(a0, wq[t], _mm512_set1_epi32(x0));
                a1 = _mm512_dpbusd_epi32(a1, wq[t + 1], _mm512_set1_epi32(x1));
            }
            const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(a0, a1), _mm512_set1_epi32(xc[r * nb + b]));
            const __m512 sc = _mm512_mul_ps(dv, _mm512_set1_ps(j->xd[r * nb + b]));
            acc[rr] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc[rr]);
        }
    }
    for (int rr = 0; rr < R; rr++) {
        float v[16];
        _mm512_storeu_ps(v, acc[rr]);
        x16_out(j, start, g, r0 + rr, v);
    }
}

VNNI_TARGET static void i8x16_rows_vnni(const struct job *j, int64_t start, int64_t end) {
    for (int64_t g = start / 16; g < end / 16; g++)
        for (int64_t r0 = 0; r0 < j->m; r0 += 8) {
            switch (j->m - r0 < 8 ? j->m - r0 : 8) {
            case 1: i8x16_tile(j, start, g, r0, 1); break;
            case 2: i8x16_tile(j, start, g, r0, 2); break;
            case 3: i8x16_tile(j, start, g, r0, 3); break;
            case 4: i8x16_tile(j, start, g, r0, 4); break;
            case 5: i8x16_tile(j, start, g, r0, 5); break;
            case 6: i8x16_tile(j, start, g, r0, 6); break;
            case 7: i8x16_tile(j, start, g, r0, 7); break;
            default: i8x16_tile(j, start, g, r0, 8); break;
            }
        }
}
#undef VNNI_TARGET
#endif

/* Row i of out = row rows[i] (or i) of a Q8_0X16 weight, for i in start .. end. */
static void x16_dequant_rows(const struct job *j, int64_t start, int64_t end) {
    const int64_t nb = j->k / 32;
    for (int64_t i = start; i < end; i++) {
        const int64_t r = j->rows != NULL ? j->rows[i] : i, g = r / 16, l = r % 16;
        float *out = j->y + i * j->k;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = j->w + (g * nb + b) * 544;
            const float d = half_to_float_base(rd16_base(blk + 2 * l));
            for (int e = 0; e < 32; e++)
                out[32 * b + e] = d * (float)(int8_t)(blk[x16_at((int)l, e)] ^ 0x80);
        }
    }
}

/* The int8 path's copy for the current instruction set: VNNI where the CPU has it and the
 * AVX-512 copy is selected, else the portable loop (the same sums, slower). */
static void (*i8_rows_fn(void))(const struct job *, int64_t, int64_t) {
#ifdef HAVE_X86_COPIES
    if (has_vnni && cur_isa == 0) return i8_rows_vnni;
#endif
    return i8_rows_portable;
}

/* matmul_q8_0_i8(w_ptr, n, k, xq_ptr, xd_ptr, m, y_ptr, threads): y[m, n] = x @ W^T for Q8_0
 * rows W and x given as xq int8 [m, k] and xd float32 [m, k / 32] (x = xq * xd per block). */
static PyObject *py_matmul_q8_0_i8(PyObject *self, PyObject *args) {
    int threads;
    unsigned long long wp, qp, dp, yp;
    long long n, k, m;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLLKKLKi", &wp, &n, &k, &qp, &dp, &m, &yp, &threads)) return NULL;
    if (k <= 0 || k % 32 != 0 || m <= 0) {
        PyErr_Format(PyExc_ValueError, "matmul_q8_0_i8: k = %lld must be a positive multiple of 32, m = %lld > 0",
                     (long long)k, (long long)m);
        return NULL;
    }
    const int64_t groups = (m + 15) / 16, nb = k / 32;
    uint8_t *xt = malloc((size_t)(groups * k * 16));
    float *xs = malloc((size_t)(groups * nb * 16) * sizeof(float));
    if (xt == NULL || xs == NULL) {
        free(xt);
        free(xs);
        return PyErr_NoMemory();
    }
    const int8_t *xq = (const int8_t *)(uintptr_t)qp;
    const float *xd = (const float *)(uintptr_t)dp;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t l = 0; l < 16; l++) {
            const int64_t row = 16 * g + l;
            for (int64_t i = 0; i < k; i++)
                xt[g * k * 16 + (i / 4) * 64 + l * 4 + i % 4] = (uint8_t)(row < m ? (int)xq[row * k + i] + 128 : 128);
            for (int64_t b = 0; b < nb; b++) xs[(g * nb + b) * 16 + l] = row < m ? xd[row * nb + b] : 0.0f;
        }
    struct job j = {0};
    j.rowfn = i8_rows_fn();
    j.w = (const uint8_t *)(uintptr_t)wp;
    j.row_bytes = nb * 34;
    j.k = k;
    j.n = n;
    j.m = m;
    j.y = (float *)(uintptr_t)yp;
    j.xt = xt;
    j.xs = xs;
    j.groups = groups;
    j.xq = xq;
    j.xd = xd;
    j.chunk_rows = chunk_rows_for(n, 16, threads);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_job(&j, (n + j.chunk_rows - 1) / j.chunk_rows, threads);
    Py_END_ALLOW_THREADS
    free(xt);
    free(xs);
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---- The small ops of a forward pass (_cpu_ops.h) ----------------------------------------
 * Pointers to contiguous float32 tensors; the Python side (cpu_ops.py) checks shapes. */

#define PTR(v) ((float *)(uintptr_t)(v))

/* rmsnorm(x, w, y, rows, dim, eps, gemma) */
static PyObject *py_rmsnorm(PyObject *self, PyObject *args) {
    unsigned long long xp, wp, yp;
    long long rows, dim;
    float eps;
    int gemma;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLLfp", &xp, &wp, &yp, &rows, &dim, &eps, &gemma)) return NULL;
    ops_rmsnorm(PTR(xp), PTR(wp), PTR(yp), rows, dim, eps, gemma);
    Py_RETURN_NONE;
}

/* add_rmsnorm(x, residual, w, xw or 0, h, y, rows, dim, eps, xeps, gemma) */
static PyObject *py_add_rmsnorm(PyObject *self, PyObject *args) {
    unsigned long long xp, rp, wp, xwp, hp, yp;
    long long rows, dim;
    float eps, xeps;
    int gemma;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKKKLLffp", &xp, &rp, &wp, &xwp, &hp, &yp, &rows, &dim, &eps, &xeps, &gemma))
        return NULL;
    ops_add_rmsnorm(PTR(xp), PTR(rp), PTR(wp), xwp ? PTR(xwp) : NULL, PTR(hp), PTR(yp), rows, dim, eps, xeps, gemma);
    Py_RETURN_NONE;
}

/* race_uniforms(h, n, hs, k, b, u): the sampler's uniforms [b, n] float32 for token hashes (a
 * row of n shared, hs = 0, or b rows, hs = n) and b row keys (int64 values below 2^32) */
static PyObject *py_race_uniforms(PyObject *self, PyObject *args) {
    unsigned long long hp, kp, up;
    long long n, hs, b;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLLKLK", &hp, &n, &hs, &kp, &b, &up)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    ops_race_uniforms((const int64_t *)(uintptr_t)hp, n, hs, (const int64_t *)(uintptr_t)kp, b, PTR(up));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* apply_bitmask(logits, stride, rows, r, bits, words, vocab): -inf where r rows' grammar
 * masks (int32 words, bit t % 32 of word t / 32) disallow a token; float32 logits */
static PyObject *py_apply_bitmask(PyObject *self, PyObject *args) {
    unsigned long long lp, rp, bp;
    long long stride, r, words, vocab;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLKLKLL", &lp, &stride, &rp, &r, &bp, &words, &vocab)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    ops_apply_bitmask(PTR(lp), stride, (const int64_t *)(uintptr_t)rp, r, (const int32_t *)(uintptr_t)bp, words, vocab);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* gated(g, u, y, n, act): y = act(g) * u, act 1 GELU (tanh), 0 SiLU; n a multiple of 16 */
static PyObject *py_gated(PyObject *self, PyObject *args) {
    unsigned long long gp, up, yp;
    long long n;
    int act;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKLi", &gp, &up, &yp, &n, &act)) return NULL;
    if (n % 16 != 0) return PyErr_Format(PyExc_ValueError, "gated: %lld floats, want a multiple of 16", n);
    ops_gated(PTR(gp), PTR(up), PTR(yp), n, act);
    Py_RETURN_NONE;
}
/* rotary(x, y, cos, sin, t, heads, d) */
static PyObject *py_rotary(PyObject *self, PyObject *args) {
    unsigned long long xp, yp, cp, sp;
    long long t, heads, d;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKLLL", &xp, &yp, &cp, &sp, &t, &heads, &d)) return NULL;
    ops_rotary(PTR(xp), PTR(yp), PTR(cp), PTR(sp), t, heads, d);
    Py_RETURN_NONE;
}

/* store_kv(k, v, k_cache, v_cache, loc, t, row): k_cache[loc[i]] = k[i] (row floats each), same for v */
static PyObject *py_store_kv(PyObject *self, PyObject *args) {
    unsigned long long kp, vp, kcp, vcp, lp;
    long long t, row;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKKLL", &kp, &vp, &kcp, &vcp, &lp, &t, &row)) return NULL;
    ops_store_kv(PTR(kp), PTR(vp), PTR(kcp), PTR(vcp), (const int64_t *)(uintptr_t)lp, t, row);
    Py_RETURN_NONE;
}

/* Tokens start .. end of an attend call, each with its own slice of the call's score buffer
 * (allocated by the caller, where running out of memory can still be reported). */
static void attend_rows(const struct job *j, int64_t start, int64_t end) {
    const struct attn_args *a = (const struct attn_args *)j->ctx;
    for (int64_t i = start; i < end; i++) ops_attend_token(a, i, a->scores + i * a->scores_stride);
}

/* Attention of t new tokens (ops_attend_token) on the pool; -1 if out of memory. No GIL. */
static int attend_run(const float *q, const float *kc, const float *vc, const int64_t *table, int64_t stride,
                      const int64_t *rows, const int64_t *pos, int64_t t, int64_t heads, int64_t kv_heads, int64_t d,
                      int64_t window, float scale, float softcap, float *out, int threads) {
    int64_t most = 1; /* scores per query head: the longest key run of any token */
    for (int64_t i = 0; i < t; i++) most = pos[i] + 1 > most ? pos[i] + 1 : most;
    const int64_t per_token = most * (heads / kv_heads);
    float *scores = malloc((size_t)(t > 0 ? t * per_token : 1) * sizeof(float));
    if (scores == NULL) return -1;
    const struct attn_args a = {q, kc, vc, table, stride, rows, pos, heads, kv_heads, d, window, scale, softcap,
                                out, scores, per_token};
    struct job j = {0};
    j.rowfn = attend_rows;
    j.ctx = &a;
    j.n = t;
    j.chunk_rows = 1;
    const int rc = run_job(&j, t, t > 1 ? threads : 1);
    free(scores);
    return rc;
}

/* attend(q, k_cache, v_cache, table, table_stride, seq_row, pos, t, heads, kv_heads, d, window,
 *        scale, softcap, out, threads): see ops_attend_token */
static PyObject *py_attend(PyObject *self, PyObject *args) {
    unsigned long long qp, kp, vp, tp, rp, pp, op;
    long long stride, t, heads, kv_heads, d, window;
    float scale, softcap;
    int threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKKKLKKLLLLLffKi", &qp, &kp, &vp, &tp, &stride, &rp, &pp, &t, &heads, &kv_heads,
                          &d, &window, &scale, &softcap, &op, &threads))
        return NULL;
    if (kv_heads <= 0 || heads % kv_heads != 0) {
        PyErr_Format(PyExc_ValueError, "attend: %lld query heads over %lld KV heads", heads, kv_heads);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = attend_run(PTR(qp), PTR(kp), PTR(vp), (const int64_t *)(uintptr_t)tp, stride, (const int64_t *)(uintptr_t)rp,
                    (const int64_t *)(uintptr_t)pp, t, heads, kv_heads, d, window, scale, softcap, PTR(op), threads);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
/* ---- A decoder stack's step in one call --------------------------------------------------
 *
 * A decode step of the default model is 18 layers of ~15 calls each (matmuls, norms, rotary,
 * attention), each a few microseconds of Python and torch dispatch around a few microseconds
 * of work: ~4 ms of a ~16 ms step at one stream. decoder_layers runs the same calls, in the
 * same order on the same buffers' values, from C: the result is the Python path's bit for bit
 * (tests/kernels/test_cpu_layers.py). cpu_ops.decoder_stack builds the plan (one record per
 * layer, all 8-byte fields, packed by Python) and decides when a step may take this path. */
struct lin_rec {
    int64_t qtype, w, bias, n, k, bf16; /* a GGUF projection: blocks, bias (0: none), rows, row length */
};
struct layer_rec {
    struct lin_rec q, k, v, o, gate, up, down;
    /* RMSNorm weights (0: none): q / k per head; the attention output's (Gemma's sandwich);
     * the MLP input's; the MLP output's (sandwich); the next layer's input (or the final) norm */
    int64_t q_norm, k_norm, attn_out_norm, mlp_in_norm, mlp_out_norm, next_norm;
    int64_t k_cache, v_cache, heads, kv_heads, d, window, gemma, act;
    double eps, qk_eps, scale, softcap;
};

/* y[m, n] = x @ W^T (+ bias) for a plan's projection, in bfloat16 where both the projection
 * (its gemm_bf16) and the step (bf16: a decode step) allow it; -1 if out of memory. */
static int lin_run(const struct lin_rec *L, const float *x, int64_t m, float *y, int threads, int bf16) {
    const int rc = matmul_run((int)L->qtype, (const uint8_t *)(uintptr_t)L->w, L->n, L->k, x, m, y, threads,
                              (int)L->bf16 && bf16);
    if (rc == 0 && L->bias != 0) {
        const float *b = (const float *)(uintptr_t)L->bias;
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < L->n; i++) y[r * L->n + i] += b[i];
    }
    return rc;
}

/* The layers of plan Ls on t tokens: h [t, hidden] the residual stream, x = the first layer's
 * input norm of h. On return h is the last layer's residual stream and x its final norm.
 * rope: per layer, the cos and sin [t, d] pointers; loc, table, rows, pos as attend / store_kv. */
static int decoder_run(const struct layer_rec *Ls, int64_t nl, float *h, float *x, int64_t t, int64_t hidden,
                       const int64_t *rope, const int64_t *loc, const int64_t *table, int64_t stride,
                       const int64_t *rows, const int64_t *pos, int threads, int bf16) {
    int64_t qn = 0, kvn = 0, inter = 0;
    for (int64_t l = 0; l < nl; l++) {
        const struct layer_rec *L = &Ls[l];
        qn = L->heads * L->d > qn ? L->heads * L->d : qn;
        kvn = L->kv_heads * L->d > kvn ? L->kv_heads * L->d : kvn;
        inter = L->gate.n > inter ? L->gate.n : inter;
    }
    float *buf = malloc((size_t)(t * (2 * qn + 2 * kvn + 3 * hidden + 2 * inter)) * sizeof(float));
    if (buf == NULL) return -1;
    float *q = buf, *kk = q + t * qn, *vv = kk + t * kvn, *att = vv + t * kvn, *o = att + t * qn;
    float *h2 = o + t * hidden, *g = h2 + t * hidden, *u = g + t * inter, *dn = u + t * inter;
    int rc = 0;
    for (int64_t l = 0; l < nl && rc == 0; l++) {
        const struct layer_rec *L = &Ls[l];
        const int64_t kvr = L->kv_heads * L->d;
        float *kc = (float *)(uintptr_t)L->k_cache, *vc = (float *)(uintptr_t)L->v_cache;
        const float *cs = (const float *)(uintptr_t)rope[2 * l], *sn = (const float *)(uintptr_t)rope[2 * l + 1];
        const float eps = (float)L->eps;
        if ((rc = lin_run(&L->q, x, t, q, threads, bf16)) != 0 || (rc = lin_run(&L->k, x, t, kk, threads, bf16)) != 0 ||
            (rc = lin_run(&L->v, x, t, vv, threads, bf16)) != 0)
            break;
        if (L->q_norm) ops_rmsnorm(q, PTR(L->q_norm), q, t * L->heads, L->d, (float)L->qk_eps, 1);
        if (L->k_norm) ops_rmsnorm(kk, PTR(L->k_norm), kk, t * L->kv_heads, L->d, (float)L->qk_eps, 1);
        ops_rotary(q, q, cs, sn, t, L->heads, L->d);
        ops_rotary(kk, kk, cs, sn, t, L->kv_heads, L->d);
        ops_store_kv(kk, vv, kc, vc, loc, t, kvr);
        if ((rc = attend_run(q, kc, vc, table, stride, rows, pos, t, L->heads, L->kv_heads, L->d, L->window,
                             (float)L->scale, (float)L->softcap, att, threads)) != 0 ||
            (rc = lin_run(&L->o, att, t, o, threads, bf16)) != 0)
            break;
        /* h2 = h + norm(o); x = mlp_in_norm(h2); then h = h2 + norm(mlp(x)); x = next_norm(h) */
        ops_add_rmsnorm(o, h, PTR(L->mlp_in_norm), L->attn_out_norm ? PTR(L->attn_out_norm) : NULL, h2, x, t, hidden,
                        eps, eps, (int)L->gemma);
        if ((rc = lin_run(&L->gate, x, t, g, threads, bf16)) != 0 || (rc = lin_run(&L->up, x, t, u, threads, bf16)) != 0) break;
        ops_gated(g, u, g, t * L->gate.n, (int)L->act);
        if ((rc = lin_run(&L->down, g, t, dn, threads, bf16)) != 0) break;
        ops_add_rmsnorm(dn, h2, PTR(L->next_norm), L->mlp_out_norm ? PTR(L->mlp_out_norm) : NULL, h, x, t, hidden,
                        eps, eps, (int)L->gemma);
    }
    free(buf);
    return rc;
}

/* decoder_layers(plan_ptr, nlayers, h_ptr, x_ptr, t, hidden, rope_ptr, loc_ptr, table_ptr,
 *                table_stride, rows_ptr, pos_ptr, threads, bf16): decoder_run, h and x updated in
 * place; bf16: the projections whose gemm_bf16 is set may multiply in bfloat16 (matmul_run's
 * rule: more than GEMV_MAX_ROWS rows, AVX-512 BF16) */
static PyObject *py_decoder_layers(PyObject *self, PyObject *args) {
    unsigned long long pp, hp, xp, rp, lp, tp, sp, op;
    long long nl, t, hidden, stride;
    int threads, bf16;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLKKLLKKKLKKip", &pp, &nl, &hp, &xp, &t, &hidden, &rp, &lp, &tp, &stride, &sp, &op,
                          &threads, &bf16))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = decoder_run((const struct layer_rec *)(uintptr_t)pp, nl, PTR(hp), PTR(xp), t, hidden,
                     (const int64_t *)(uintptr_t)rp, (const int64_t *)(uintptr_t)lp, (const int64_t *)(uintptr_t)tp,
                     stride, (const int64_t *)(uintptr_t)sp, (const int64_t *)(uintptr_t)op, threads, bf16);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* layer_record_size(): bytes of one plan record (Python packs them) */
static PyObject *py_layer_record_size(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromSize_t(sizeof(struct layer_rec));
}
#undef PTR

/* repack_q8_0x16(src_ptr, n, k, dst_ptr): n rows (a multiple of 16) of Q8_0 blocks into Q8_0X16 */
static PyObject *py_repack_q8_0x16(PyObject *self, PyObject *args) {
    unsigned long long sp, dp;
    long long n, k;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLLK", &sp, &n, &k, &dp)) return NULL;
    if (k <= 0 || k % 32 != 0 || n % 16 != 0)
        return PyErr_Format(PyExc_ValueError, "repack_q8_0x16: k = %lld must be a multiple of 32 and n = %lld a multiple of 16", k, n);
    Py_BEGIN_ALLOW_THREADS
    repack_q8_0x16((const uint8_t *)(uintptr_t)sp, n, k, (uint8_t *)(uintptr_t)dp);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* matmul_q8_0x16_i8(w_ptr, n, k, xq_ptr, xd_ptr, m, y_ptr, threads[, top, idx_ptr]):
 * matmul_q8_0_i8 on a Q8_0X16 weight (n a multiple of 16), the same bits. With top > 0 the
 * logits are not kept: y_ptr is float32 [m, top], each row's top largest logits (in no order)
 * and idx_ptr int64 [m, top] their indices; a logit of -inf may be left out (its slot: -inf at
 * index -1). top = 1 gives torch.argmax's answer on them (the first index among equal
 * maxima). */
static PyObject *py_matmul_q8_0x16_i8(PyObject *self, PyObject *args) {
    int threads;
    unsigned long long wp, qp, dp, yp, ip = 0;
    long long n, k, m, top = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "KLLKKLKi|LK", &wp, &n, &k, &qp, &dp, &m, &yp, &threads, &top, &ip)) return NULL;
    if (k <= 0 || k % 32 != 0 || m <= 0 || n % 16 != 0 || n <= 0)
        return PyErr_Format(PyExc_ValueError, "matmul_q8_0x16_i8: k = %lld (a multiple of 32), m = %lld > 0, n = %lld "
                            "(a positive multiple of 16)", k, m, n);
    if (top < 0 || top > n || (top > 0) != (ip != 0))
        return PyErr_Format(PyExc_ValueError, "matmul_q8_0x16_i8: top = %lld must lie in 0 .. n = %lld, with an index "
                            "buffer exactly when positive", top, n);
    /* A top of several keeps a heap per chunk and row, and each chunk's heap starts empty: of a
     * chunk of R logits about top (1 + ln(R / top)) enter it, each a sift of log2(top) steps.
     * So such a call takes 2 chunks a thread instead of ~16 (at 64 a row over 262,144 logits on
     * 2 threads: ~2k entries a row instead of ~12k); the argmax (top 1) keeps the finer split. */
    const int64_t per = 2 * (int64_t)(threads > 1 ? threads : 1), coarse = ((n + per - 1) / per + 15) / 16 * 16;
    const int64_t chunk_rows = top > 1 ? coarse : chunk_rows_for(n, 16, threads);
    const int64_t nb = k / 32, chunks = (n + chunk_rows - 1) / chunk_rows;
    const int64_t hcap = top < chunk_rows ? top : chunk_rows;
    struct x16_ctx c = {NULL, NULL, NULL, top, hcap};
    int32_t *xc = malloc((size_t)(m * nb) * sizeof(int32_t));
    if (top) {
        c.best = malloc((size_t)(chunks * m * hcap) * sizeof(float));
        c.idx = malloc((size_t)(chunks * m * hcap) * sizeof(int64_t));
    }
    if (xc == NULL || (top && (c.best == NULL || c.idx == NULL))) {
        free(xc);
        free(c.best);
        free(c.idx);
        return PyErr_NoMemory();
    }
    const int8_t *xq = (const int8_t *)(uintptr_t)qp;
    for (int64_t i = 0; i < m * nb; i++) {
        int32_t s = 0;
        for (int e = 0; e < 32; e++) s += xq[32 * i + e];
        xc[i] = 128 * s;
    }
    for (int64_t e = 0; e < chunks * m * hcap; e++) { /* empty slots: -inf at no index */
        c.best[e] = -INFINITY;
        c.idx[e] = -1;
    }
    c.xc = xc;
    struct job j = {0};
    j.rowfn = i8x16_rows_portable;
#ifdef HAVE_X86_COPIES
    if (has_vnni && cur_isa == 0) j.rowfn = i8x16_rows_vnni;
#endif
    j.ctx = &c;
    j.w = (const uint8_t *)(uintptr_t)wp;
    j.k = k;
    j.n = n;
    j.m = m;
    j.y = top ? NULL : (float *)(uintptr_t)yp;
    j.xq = xq;
    j.xd = (const float *)(uintptr_t)dp;
    j.chunk_rows = chunk_rows;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_job(&j, chunks, threads);
    Py_END_ALLOW_THREADS
    if (rc == 0 && top) { /* the chunks' heaps merged in chunk order: the first of equal maxima wins */
        float *ov = (float *)(uintptr_t)yp;
        int64_t *oi = (int64_t *)(uintptr_t)ip;
        for (int64_t r = 0; r < m; r++) {
            float *hv = ov + r * top;
            int64_t *hi = oi + r * top;
            for (int64_t e = 0; e < top; e++) {
                hv[e] = -INFINITY;
                hi[e] = -1;
            }
            for (int64_t ch = 0; ch < chunks; ch++)
                for (int64_t e = 0; e < hcap; e++) {
                    const int64_t at = (ch * m + r) * hcap + e;
                    if (c.idx[at] >= 0) x16_push(hv, hi, top, c.best[at], c.idx[at]);
                }
            /* Slots no logit beat (logits of -inf): as torch.argmax's first index of such a row, 0,
             * for the argmax; -1 (no index) beside a top's real entries. */
            if (top == 1 && hi[0] < 0) hi[0] = 0;
        }
    }
    free(xc);
    free(c.best);
    free(c.idx);
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* i8_isa(): which copy matmul_q8_0_i8 runs ("vnni" or "portable") */
static PyObject *py_i8_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#ifdef HAVE_X86_COPIES
    if (i8_rows_fn() == i8_rows_vnni) return PyUnicode_FromString("vnni");
#endif
    return PyUnicode_FromString("portable");
}

/* has_bf16(): whether the CPU has AVX-512 BF16 (bfloat16 dot products in hardware) */
static PyObject *py_has_bf16(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(has_bf16);
}

/* row_bytes(qtype, k): bytes of one row of k weights */
static PyObject *py_row_bytes(PyObject *self, PyObject *args) {
    int qtype;
    long long k;
    (void)self;
    if (!PyArg_ParseTuple(args, "iL", &qtype, &k)) return NULL;
    int64_t block, bytes;
    deq_fn fn;
    if (check_shape(qtype, k, &block, &bytes, &fn) != 0) return NULL;
    return PyLong_FromLongLong(k / block * bytes);
}

/* isa(): the instruction set the hot loops run with */
static PyObject *py_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(isas[cur_isa].name);
}

/* set_isa(name): run the copy for a lower instruction set than the CPU's best (tests);
 * returns the previous name. Not thread-safe: call it while no matmul runs. */
static PyObject *py_set_isa(PyObject *self, PyObject *args) {
    const char *name;
    (void)self;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int i = best_isa; i < NUM_ISAS; i++) {
        if (strcmp(isas[i].name, name) == 0) {
            const char *prev = isas[cur_isa].name;
            cur_isa = i;
            return PyUnicode_FromString(prev);
        }
    }
    PyErr_Format(PyExc_ValueError, "instruction set %s is not one this CPU runs (best: %s)", name, isas[best_isa].name);
    return NULL;
}

/* set_gemv(on): whether few-row matmuls take the fused copies (where the ISA has them); returns
 * the previous setting. For tests and A/B timings; call it while no matmul runs. */
static PyObject *py_set_gemv(PyObject *self, PyObject *args) {
    int on;
    (void)self;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    const int prev = use_gemv;
    use_gemv = on;
    return PyBool_FromLong(prev);
}

static PyMethodDef methods[] = {
    {"set_gemv", py_set_gemv, METH_VARARGS, "few-row matmuls fused (True) or dequantize-then-dot (False)"},
    {"isa", py_isa, METH_NOARGS, "the instruction set the kernel runs with"},
    {"set_isa", py_set_isa, METH_VARARGS, "run a lower instruction set's copy (tests)"},
    {"matmul", py_matmul, METH_VARARGS, "y[m, n] = x[m, k] @ W[n, k]^T on GGUF blocks (pointers)"},
    {"dequantize", py_dequantize, METH_VARARGS, "rows of W as float32 (pointers)"},
    {"row_bytes", py_row_bytes, METH_VARARGS, "bytes of one row of k weights of a GGML type"},
    {"repack", py_repack, METH_VARARGS, "rows of Q5_0 / Q8_0 / Q4_K / Q6_K blocks into their repacked layout (pointers)"},
    {"matmul_q8_0_i8", py_matmul_q8_0_i8, METH_VARARGS, "y = x @ W^T, Q8_0 W, x as int8 blocks + scales (pointers)"},
    {"repack_q8_0x16", py_repack_q8_0x16, METH_VARARGS, "Q8_0 rows into groups of 16 (the int8 head's layout)"},
    {"matmul_q8_0x16_i8", py_matmul_q8_0x16_i8, METH_VARARGS, "matmul_q8_0_i8 on a Q8_0X16 weight (pointers)"},
    {"i8_isa", py_i8_isa, METH_NOARGS, "the copy matmul_q8_0_i8 runs: vnni or portable"},
    {"has_bf16", py_has_bf16, METH_NOARGS, "whether the CPU has AVX-512 BF16"},
    {"rmsnorm", py_rmsnorm, METH_VARARGS, "RMSNorm of float32 rows (pointers)"},
    {"add_rmsnorm", py_add_rmsnorm, METH_VARARGS, "residual add (optionally of a normed x), then RMSNorm"},
    {"decoder_layers", py_decoder_layers, METH_VARARGS, "a decoder stack's step on a packed plan (pointers)"},
    {"layer_record_size", py_layer_record_size, METH_NOARGS, "bytes of one decoder_layers plan record"},
    {"race_uniforms", py_race_uniforms, METH_VARARGS, "the sampler's uniforms for token hashes x row keys"},
    {"apply_bitmask", py_apply_bitmask, METH_VARARGS, "-inf where grammar masks disallow a token (float32 rows)"},
    {"gated", py_gated, METH_VARARGS, "act(g) * u, GELU (tanh) or SiLU (pointers)"},
    {"rotary", py_rotary, METH_VARARGS, "NeoX rotary embedding (pointers)"},
    {"store_kv", py_store_kv, METH_VARARGS, "write K/V rows into their cache slots"},
    {"attend", py_attend, METH_VARARGS, "attention of new tokens over their cached keys"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggufmm", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggufmm(void) {
    detect_isa();
    init_tables();
    pthread_atfork(NULL, NULL, pool_after_fork_child);
    const char *spin = getenv("ASERVE_KERNEL_SPIN_US");
    if (spin != NULL && *spin != '\0') spin_ns = strtoll(spin, NULL, 10) * 1000;
    const char *yld = getenv("ASERVE_KERNEL_SPIN_YIELD");
    if (yld != NULL && *yld != '\0') yield_spin = atoi(yld);
    return PyModule_Create(&module);
}
