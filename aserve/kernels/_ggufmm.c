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
 * result is the float32 path's up to summation order; no float32 copy of W is ever made.
 *
 * Portable C plus GCC vector extensions; target_clones builds AVX-512, AVX2+FMA and baseline
 * versions of the hot loops and picks one at load time, so a CPU without AVX-512 runs the
 * AVX2 code and any x86-64 runs the baseline. Threads: OpenMP (torch's own libgomp when torch
 * is imported first, so there is one thread pool). No libtorch: tensors come in as pointers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#else
#define CLONES
#endif

/* ggml type ids (gguf.GGMLQuantizationType) */
enum { T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14 };

typedef float v16f __attribute__((vector_size(64)));

/* IEEE half -> float, exact for every finite value: the half's exponent and mantissa moved
 * into a float's place and scaled by 2^112 (re-biasing 15 -> 127; subnormals come out right
 * too), the sign put back; infinities and NaNs (never in weights) take the slow branch. */
static inline __attribute__((always_inline)) float half_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)(h & 0x7fff) << 13;
    float f;
    memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    if (__builtin_expect((h & 0x7c00) == 0x7c00, 0)) {
        bits = 0x7f800000u | ((uint32_t)(h & 0x3ff) << 13);
        memcpy(&f, &bits, 4);
    }
    return (h & 0x8000) ? -f : f;
}

static inline __attribute__((always_inline)) uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- one row of blocks -> k floats ---------------------------------------------------- */

/* Q8_0: 32 weights = f16 d, int8 q[32]; w = d * q */
CLONES static void deq_q8_0(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 32; b++, src += 34, out += 32) {
        const float d = half_to_float(rd16(src));
        const int8_t *q = (const int8_t *)(src + 2);
        for (int i = 0; i < 32; i++) out[i] = d * (float)q[i];
    }
}

/* Q5_0: 32 weights = f16 d, 32 high bits qh, 16 bytes of low nibbles;
 * w[j] = d * ((lo_j | hi_j << 4) - 16), low nibbles for j < 16, high ones for j >= 16 */
CLONES static void deq_q5_0(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 32; b++, src += 22, out += 32) {
        const float d = half_to_float(rd16(src));
        uint32_t qh;
        memcpy(&qh, src + 2, 4);
        const uint8_t *qs = src + 6;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            const int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            out[j] = d * (float)(lo - 16);
            out[j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q4_K: 256 weights = f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 groups of
 * 32, 128 bytes of nibbles; w = d * sc * q - dmin * m. No fused multiply-add here, so the
 * weights equal gguf-py's (two roundings) bit for bit. */
__attribute__((optimize("fp-contract=off"))) static void deq_q4_k(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 256; b++, src += 144) {
        const float d = half_to_float(rd16(src));
        const float dmin = half_to_float(rd16(src + 2));
        const uint8_t *s = src + 4;
        const uint8_t *q = src + 16;
        for (int g = 0; g < 8; g += 2, q += 32) {
            float sc[2], mn[2];
            for (int h = 0; h < 2; h++) {
                const int j = g + h;
                int a, m;
                if (j < 4) {
                    a = s[j] & 63;
                    m = s[j + 4] & 63;
                } else {
                    a = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
                    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                }
                sc[h] = d * (float)a;
                mn[h] = dmin * (float)m;
            }
            for (int l = 0; l < 32; l++) {
                float w0 = sc[0] * (float)(q[l] & 0x0f);
                float w1 = sc[1] * (float)(q[l] >> 4);
                out[l] = w0 - mn[0];
                out[l + 32] = w1 - mn[1];
            }
            out += 64;
        }
    }
}

/* Q6_K: 256 weights = 128 bytes low nibbles, 64 bytes of 2-bit highs, int8 scales[16] (one
 * per 16 weights), f16 d; w = d * scale * (q - 32) */
CLONES static void deq_q6_k(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 256; b++, src += 210) {
        const uint8_t *ql = src;
        const uint8_t *qh = src + 128;
        const int8_t *sc = (const int8_t *)(src + 192);
        const float d = half_to_float(rd16(src + 208));
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, out += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                out[l] = (d * (float)sc[is + 0]) * (float)q1;
                out[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                out[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                out[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
        }
    }
}

typedef void (*deq_fn)(const uint8_t *, int64_t, float *);

static int type_info(int qtype, int64_t *block, int64_t *bytes, deq_fn *fn) {
    switch (qtype) {
    case T_Q8_0: *block = 32; *bytes = 34; *fn = deq_q8_0; return 0;
    case T_Q5_0: *block = 32; *bytes = 22; *fn = deq_q5_0; return 0;
    case T_Q4_K: *block = 256; *bytes = 144; *fn = deq_q4_k; return 0;
    case T_Q6_K: *block = 256; *bytes = 210; *fn = deq_q6_k; return 0;
    default: return -1;
    }
}

/* ---- dot products of one dequantized row with up to four rows of x --------------------- */

static inline __attribute__((always_inline)) v16f ld(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) float hsum(v16f v) {
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += v[i];
    return s;
}

/* w: [k] (k a multiple of 32), x: rows at x, x + ldx, ...; y[r * ldy] = dot(w, x_r) */
CLONES static void dot_rows(const float *w, int64_t k, const float *x, int64_t ldx, int64_t m, float *y,
                            int64_t ldy) {
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) {
        const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t i = 0; i < k; i += 16) {
            const v16f wv = ld(w + i);
            a0 += wv * ld(x0 + i);
            a1 += wv * ld(x1 + i);
            a2 += wv * ld(x2 + i);
            a3 += wv * ld(x3 + i);
        }
        y[(r + 0) * ldy] = hsum(a0);
        y[(r + 1) * ldy] = hsum(a1);
        y[(r + 2) * ldy] = hsum(a2);
        y[(r + 3) * ldy] = hsum(a3);
    }
    for (; r < m; r++) {
        const float *x0 = x + r * ldx;
        v16f a0 = {0}, a1 = {0};
        for (int64_t i = 0; i < k; i += 32) {
            a0 += ld(w + i) * ld(x0 + i);
            a1 += ld(w + i + 16) * ld(x0 + i + 16);
        }
        y[r * ldy] = hsum(a0 + a1);
    }
}

/* ---- Python entry points ------------------------------------------------------------- */

static int check_shape(int qtype, int64_t k, int64_t *block, int64_t *bytes, deq_fn *fn) {
    if (type_info(qtype, block, bytes, fn) != 0) {
        PyErr_Format(PyExc_ValueError, "unsupported GGML type %d (supported: Q5_0, Q8_0, Q4_K, Q6_K)", qtype);
        return -1;
    }
    if (k <= 0 || k % *block != 0) {
        PyErr_Format(PyExc_ValueError, "row length %lld is not a multiple of the block size %lld", (long long)k,
                     (long long)*block);
        return -1;
    }
    return 0;
}

/* matmul(qtype, w_ptr, n, k, x_ptr, m, y_ptr, threads): y[m, n] = x[m, k] @ W[n, k]^T */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    int qtype, threads;
    unsigned long long wp, xp, yp;
    long long n, k, m;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKLLKLKi", &qtype, &wp, &n, &k, &xp, &m, &yp, &threads)) return NULL;
    int64_t block, bytes;
    deq_fn fn;
    if (check_shape(qtype, k, &block, &bytes, &fn) != 0) return NULL;
    const uint8_t *w = (const uint8_t *)(uintptr_t)wp;
    const float *x = (const float *)(uintptr_t)xp;
    float *y = (float *)(uintptr_t)yp;
    const int64_t row_bytes = k / block * bytes;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *buf = (float *)aligned_alloc(64, (size_t)k * sizeof(float));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* Rows in chunks of 16: a chunk's slice of y is one cache line per x row. */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < (n + 15) / 16; c++) {
            if (buf == NULL) continue;
            const int64_t end = (c + 1) * 16 < n ? (c + 1) * 16 : n;
            for (int64_t r = c * 16; r < end; r++) {
                fn(w + r * row_bytes, k, buf);
                dot_rows(buf, k, x, k, m, y + r, n);
            }
        }
        free(buf);
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* dequantize(qtype, w_ptr, k, rows_ptr or 0, count, out_ptr, threads): out[i, :] = W[row_i, :]
 * for row_i = rows[i] (int64) when rows_ptr is given, else row_i = i. */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    int qtype, threads;
    unsigned long long wp, rp, op;
    long long k, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKLKLKi", &qtype, &wp, &k, &rp, &count, &op, &threads)) return NULL;
    int64_t block, bytes;
    deq_fn fn;
    if (check_shape(qtype, k, &block, &bytes, &fn) != 0) return NULL;
    const uint8_t *w = (const uint8_t *)(uintptr_t)wp;
    const int64_t *rows = (const int64_t *)(uintptr_t)rp;
    float *out = (float *)(uintptr_t)op;
    const int64_t row_bytes = k / block * bytes;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) if (count > 8)
    for (int64_t i = 0; i < count; i++) {
        const int64_t r = rows != NULL ? rows[i] : i;
        fn(w + r * row_bytes, k, out + i * k);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
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

/* isa(): the instruction set the hot loops run with (what target_clones' resolver picks) */
static PyObject *py_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return PyUnicode_FromString("avx512f");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return PyUnicode_FromString("avx2");
#endif
    return PyUnicode_FromString("baseline");
}

static PyMethodDef methods[] = {
    {"isa", py_isa, METH_NOARGS, "the instruction set the kernel runs with"},
    {"matmul", py_matmul, METH_VARARGS, "y[m, n] = x[m, k] @ W[n, k]^T on GGUF blocks (pointers)"},
    {"dequantize", py_dequantize, METH_VARARGS, "rows of W as float32 (pointers)"},
    {"row_bytes", py_row_bytes, METH_VARARGS, "bytes of one row of k weights of a GGML type"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggufmm", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggufmm(void) { return PyModule_Create(&module); }
