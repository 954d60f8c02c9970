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
 * Portable C plus GCC vector extensions, compiled three times (AVX-512, AVX2+FMA, baseline;
 * _ggufmm_kernels.h) with the copy picked at import, so a CPU without AVX-512 runs the AVX2
 * code and any x86-64 (or other) CPU the baseline. Threads: OpenMP (torch's own libgomp when torch
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
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h> /* usable inside the target pragmas below */
#endif


/* ggml type ids (gguf.GGMLQuantizationType) */
enum { T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14 };

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

struct isa {
    const char *name;
    deq_fn q8_0, q5_0, q4_k, q6_k;
    dot_fn dot;
};

#define ISA(tag, sfx) {tag, deq_q8_0_##sfx, deq_q5_0_##sfx, deq_q4_k_##sfx, deq_q6_k_##sfx, dot_rows_##sfx}
static const struct isa isas[] = {
#ifdef HAVE_X86_COPIES
    ISA("avx512", avx512),
    ISA("avx2", avx2),
#endif
    ISA("baseline", base),
};
#define NUM_ISAS ((int)(sizeof isas / sizeof isas[0]))
static int best_isa = NUM_ISAS - 1; /* set at import: the first entry the CPU supports */
static int cur_isa = NUM_ISAS - 1;

static void detect_isa(void) {
#ifdef HAVE_X86_COPIES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        best_isa = 0;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        best_isa = 1;
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
    default: return -1;
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
    const dot_fn dot = isas[cur_isa].dot;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *buf = (float *)aligned_alloc(64, (size_t)(4 * k) * sizeof(float));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* Rows in chunks of 16 (a chunk's slice of y is one cache line per x row), four
         * weight rows dequantized at a time into buf (16 KB for k = 1024: L1). */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < (n + 15) / 16; c++) {
            if (buf == NULL) continue;
            const int64_t end = (c + 1) * 16 < n ? (c + 1) * 16 : n;
            for (int64_t r = c * 16; r < end; r += 4) {
                const int64_t nw = end - r < 4 ? end - r : 4;
                for (int64_t j = 0; j < nw; j++) fn(w + (r + j) * row_bytes, k, buf + j * k);
                dot(buf, nw, k, x, m, y + r, n);
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

static PyMethodDef methods[] = {
    {"isa", py_isa, METH_NOARGS, "the instruction set the kernel runs with"},
    {"set_isa", py_set_isa, METH_VARARGS, "run a lower instruction set's copy (tests)"},
    {"matmul", py_matmul, METH_VARARGS, "y[m, n] = x[m, k] @ W[n, k]^T on GGUF blocks (pointers)"},
    {"dequantize", py_dequantize, METH_VARARGS, "rows of W as float32 (pointers)"},
    {"row_bytes", py_row_bytes, METH_VARARGS, "bytes of one row of k weights of a GGML type"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggufmm", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggufmm(void) {
    detect_isa();
    init_tables();
    return PyModule_Create(&module);
}
