/* The grammar engine's tokenizer callback, in C: a thread-safe table of tokenizations.
 *
 * llguidance tokenizes the bytes a grammar forces (", " after a number, a closing bracket)
 * while it computes a mask. Through its Python tokenizer form that is a call into Python
 * under the GIL from inside the mask computation, so masks computed on several threads
 * (llguidance's executor, or Python threads) queue on the GIL, and a rayon thread with no
 * Python thread state pays for a fresh one each time. Through its llama.cpp form llguidance
 * calls a C function with llama_tokenize's signature instead. This module is that function:
 * it answers from a table of the fragments it has seen (they are few and repeat) and calls the
 * Python encoder, under the GIL, only for a fragment it has not, so a step's masks can be
 * computed in one GIL-free call over several threads (aserve/sampling/masks.py, MaskFiller).
 *
 * Python API: new(encode, limit) -> table; address(table) -> int (llguidance's vocab_ptr);
 * tokenize_fptr() -> int; stats(table) -> (hits, misses, entries); tokenize(table, bytes, max)
 * -> (n, ids) runs the C function itself (tests).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TABLE_NAME "aserve.sampling._grammar_tokens.Table"

typedef struct {
    uint64_t hash; /* 0: an empty slot */
    int32_t len, ntok;
    char *bytes;
    int32_t *ids;
} Entry;

typedef struct {
    pthread_mutex_t mu;
    Entry *slots;
    size_t cap, used, limit; /* cap: a power of two, at least twice limit */
    PyObject *encode;        /* bytes -> sequence of token ids */
    uint64_t hits, misses;
} Table;

static uint64_t fnv1a(const char *s, int32_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int32_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h ? h : 1;
}

/* The slot holding s, or the empty slot where it would go (the table is never full). */
static Entry *slot_of(Table *t, uint64_t h, const char *s, int32_t n) {
    size_t mask = t->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        Entry *e = &t->slots[i];
        if (!e->hash || (e->hash == h && e->len == n && memcmp(e->bytes, s, (size_t)n) == 0)) return e;
    }
}

/* llama_tokenize's contract: the count written, or minus the count needed when max is short. */
static int32_t copy_out(const int32_t *ids, int32_t n, int32_t *out, int32_t max) {
    if (n > max) return -n;
    if (n) memcpy(out, ids, sizeof(int32_t) * (size_t)n);
    return n;
}

/* encode(text) under the GIL, as a malloc'd array (*ids; NULL on failure, then 0 tokens: the
 * grammar engine then forces no token and computes the mask in full). A failure (the encoder
 * raised, returned something else than ids in 0..INT32_MAX, or no memory) is reported through
 * sys.unraisablehook. */
static int32_t encode_with_python(Table *t, const char *text, int32_t len, int32_t **ids) {
    int32_t n = 0;
    *ids = NULL;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(t->encode, "y#", text, (Py_ssize_t)len);
    PyObject *seq = r ? PySequence_Fast(r, "encode must return a sequence of token ids") : NULL;
    if (seq) {
        Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
        int32_t *buf = size <= INT32_MAX ? malloc(sizeof(int32_t) * (size_t)(size ? size : 1)) : NULL;
        bool ok = buf != NULL;
        if (!ok) PyErr_NoMemory();
        for (Py_ssize_t i = 0; ok && i < size; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            ok = !(v == -1 && PyErr_Occurred());
            if (ok && (v < 0 || v > INT32_MAX)) {
                PyErr_Format(PyExc_ValueError, "encode returned token id %lld, outside 0..2**31-1", v);
                ok = false;
            }
            if (ok) buf[i] = (int32_t)v;
        }
        if (ok) {
            *ids = buf;
            n = (int32_t)size;
        } else {
            free(buf);
        }
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(t->encode);
    Py_XDECREF(seq);
    Py_XDECREF(r);
    PyGILState_Release(gil);
    return n;
}

/* llama_tokenize's signature; vocab is a Table. Called by llguidance from any thread, with or
 * without the GIL held by the caller. */
static int32_t table_tokenize(const void *vocab, const char *text, int32_t len, int32_t *out, int32_t max,
                              bool add_special, bool parse_special) {
    (void)add_special;
    (void)parse_special;
    Table *t = (Table *)vocab;
    uint64_t h = fnv1a(text, len);
    pthread_mutex_lock(&t->mu);
    Entry *e = slot_of(t, h, text, len);
    if (e->hash) {
        t->hits++;
        int32_t r = copy_out(e->ids, e->ntok, out, max);
        pthread_mutex_unlock(&t->mu);
        return r;
    }
    t->misses++;
    pthread_mutex_unlock(&t->mu);

    int32_t *ids;
    int32_t n = encode_with_python(t, text, len, &ids);
    int32_t r = copy_out(ids, n, out, max);
    if (ids) {
        char *bytes = malloc((size_t)len + 1);
        pthread_mutex_lock(&t->mu);
        e = slot_of(t, h, text, len); /* another thread may have stored it meanwhile */
        if (bytes && !e->hash && t->used < t->limit) {
            memcpy(bytes, text, (size_t)len);
            e->bytes = bytes;
            e->len = len;
            e->ntok = n;
            e->ids = ids;
            e->hash = h;
            t->used++;
            bytes = NULL;
            ids = NULL;
        }
        pthread_mutex_unlock(&t->mu);
        free(bytes);
        free(ids);
    }
    return r;
}

static Table *table_of(PyObject *capsule) { return (Table *)PyCapsule_GetPointer(capsule, TABLE_NAME); }

static void table_free(PyObject *capsule) {
    Table *t = table_of(capsule);
    if (!t) return;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].hash) {
            free(t->slots[i].bytes);
            free(t->slots[i].ids);
        }
    }
    free(t->slots);
    Py_XDECREF(t->encode);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static PyObject *py_new(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *encode;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On", &encode, &limit)) return NULL;
    if (!PyCallable_Check(encode) || limit < 1 || limit > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "new(encode, limit): a callable and 1 <= limit <= 2**24");
        return NULL;
    }
    Table *t = calloc(1, sizeof(Table));
    if (!t) return PyErr_NoMemory();
    t->limit = (size_t)limit;
    t->cap = 16;
    while (t->cap < 2 * t->limit) t->cap <<= 1;
    t->slots = calloc(t->cap, sizeof(Entry));
    if (!t->slots) {
        free(t);
        return PyErr_NoMemory();
    }
    pthread_mutex_init(&t->mu, NULL);
    Py_INCREF(encode);
    t->encode = encode;
    PyObject *capsule = PyCapsule_New(t, TABLE_NAME, table_free);
    if (!capsule) {
        t->cap = 0;
        Py_DECREF(encode);
        free(t->slots);
        free(t);
    }
    return capsule;
}

static PyObject *py_address(PyObject *self, PyObject *capsule) {
    (void)self;
    Table *t = table_of(capsule);
    return t ? PyLong_FromVoidPtr(t) : NULL;
}

static PyObject *py_tokenize_fptr(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromVoidPtr((void *)table_tokenize);
}

static PyObject *py_stats(PyObject *self, PyObject *capsule) {
    (void)self;
    Table *t = table_of(capsule);
    if (!t) return NULL;
    pthread_mutex_lock(&t->mu);
    PyObject *r = Py_BuildValue("KKn", (unsigned long long)t->hits, (unsigned long long)t->misses, (Py_ssize_t)t->used);
    pthread_mutex_unlock(&t->mu);
    return r;
}

static PyObject *py_tokenize(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    const char *text;
    Py_ssize_t len;
    int max;
    if (!PyArg_ParseTuple(args, "Oy#i", &capsule, &text, &len, &max)) return NULL;
    Table *t = table_of(capsule);
    if (!t) return NULL;
    if (max < 0 || len > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "tokenize: max >= 0 and text under 2 GiB");
        return NULL;
    }
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(max ? max : 1));
    if (!out) return PyErr_NoMemory();
    int32_t n;
    Py_BEGIN_ALLOW_THREADS
    n = table_tokenize(t, text, (int32_t)len, out, max, false, false);
    Py_END_ALLOW_THREADS
    PyObject *ids = PyList_New(n > 0 ? n : 0);
    for (int32_t i = 0; ids && i < n; i++) {
        PyObject *v = PyLong_FromLong(out[i]);
        if (!v) Py_CLEAR(ids);
        else PyList_SET_ITEM(ids, i, v);
    }
    free(out);
    if (!ids) return NULL;
    return Py_BuildValue("iN", (int)n, ids);
}

static PyMethodDef methods[] = {
    {"new", py_new, METH_VARARGS, "new(encode, limit): a table of at most limit tokenizations"},
    {"address", py_address, METH_O, "address(table): the pointer llguidance passes back as vocab"},
    {"tokenize_fptr", py_tokenize_fptr, METH_NOARGS, "the C function's address (llama_tokenize's signature)"},
    {"stats", py_stats, METH_O, "stats(table): (hits, misses, entries)"},
    {"tokenize", py_tokenize, METH_VARARGS, "tokenize(table, text, max): (n, ids) from the C function"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_grammar_tokens", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__grammar_tokens(void) { return PyModule_Create(&module); }
