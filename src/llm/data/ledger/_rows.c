/* The run ledger's C kernel: each row's "wword64" checksum (checksum_rows), and a commit's columns given chunk by
   chunk stored in their narrowest type (narrow_column, at the end of this file).

   The arithmetic of checksums.py `row_checksums`, whose NumPy code is the rule's reference and the path taken
   where this module was not built: a row's bytes, zero-padded to a multiple of 8, are little-endian uint64
   words x_j; s = sum of x_j * W_j modulo 2**64; the checksum is (s ^ s >> 32) modulo 2**32.

   Why C: NumPy has no SIMD kernel for an integer product, so there the checksum cost several times the 1% of
   the loader's time the ledger may take (bench/ledger.py); here the words are multiplied a vector at a time, and
   in the same pass over a row the ids are widened to int64, the copy the loader makes with or without a ledger:
   by the time a chunk's rows are checksummed they have left the cache, and one pass fetches them once. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KERNEL 4 /* kernel.py uses a built module only of the version its code expects (4: adds narrow_column) */

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && defined(__GLIBC__)
/* one build for every x86-64 machine: the widest vectors the CPU has are picked when the module loads */
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VECTOR_CLONES
#endif

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

VECTOR_CLONES
static uint32_t row_checksum(const unsigned char *row, Py_ssize_t row_bytes, const uint64_t *weights) {
    Py_ssize_t words = row_bytes / 8, rest = row_bytes % 8;
    uint64_t s = 0;
    for (Py_ssize_t j = 0; j < words; j++)
        s += load_le64(row + 8 * j) * weights[j];
    if (rest) { /* the last word, zero-padded */
        unsigned char tail[8] = {0};
        memcpy(tail, row + 8 * words, (size_t)rest);
        s += load_le64(tail) * weights[words];
    }
    return (uint32_t)(s ^ (s >> 32));
}

/* The ids of one row widened to int64 (the loader's dtype), from the stored unsigned 16 or 32-bit or signed 32-bit
   ids: the copy the loader makes anyway, here made while the row is in the L1 cache after its checksum. */
VECTOR_CLONES
static void widen(const unsigned char *row, Py_ssize_t count, int itemsize, int is_signed, int64_t *out) {
    if (itemsize == 2) {
        const uint16_t *ids = (const uint16_t *)row;
        for (Py_ssize_t k = 0; k < count; k++) out[k] = ids[k];
    } else if (is_signed) {
        const int32_t *ids = (const int32_t *)row;
        for (Py_ssize_t k = 0; k < count; k++) out[k] = ids[k];
    } else {
        const uint32_t *ids = (const uint32_t *)row;
        for (Py_ssize_t k = 0; k < count; k++) out[k] = ids[k];
    }
}

/* checksum_rows(rows, row_bytes, weights, crcs, wide=None, itemsize=0, signed=False) -> n.
   rows: a contiguous buffer of n = len(rows) / row_bytes rows; weights: uint64, at least ceil(row_bytes / 8);
   crcs: uint32, at least n, gets each row's checksum. `wide` (int64, n * row_bytes / itemsize of them), when
   given, gets the rows' ids as int64 too: ids of `itemsize` 2 (unsigned) or 4 (signed or not), native order.
   Why both in one call: the rows were read a while ago (a chunk is a megabyte, read by threads that share the
   cores), so they come back from memory; one pass instead of two pays that once (bench/ledger.py). */
static PyObject *checksum_rows(PyObject *self, PyObject *args) {
    Py_buffer rows, weights, crcs, wide = {0};
    PyObject *wide_obj = Py_None, *result = NULL;
    Py_ssize_t row_bytes, n = 0;
    int itemsize = 0, is_signed = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*w*|Oip", &rows, &row_bytes, &weights, &crcs, &wide_obj, &itemsize, &is_signed))
        return NULL;
    if (row_bytes <= 0 || rows.len % row_bytes) {
        PyErr_Format(PyExc_ValueError, "checksum_rows: %zd bytes are not whole rows of %zd bytes", rows.len, row_bytes);
        goto release;
    }
    n = rows.len / row_bytes;
    if (crcs.len < n * 4 || weights.len < (row_bytes + 7) / 8 * 8) {
        PyErr_SetString(PyExc_ValueError, "checksum_rows: crcs or weights too short for the rows");
        goto release;
    }
    if (wide_obj != Py_None) {
        if (PyObject_GetBuffer(wide_obj, &wide, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto release;
        if (!(itemsize == 2 || itemsize == 4) || row_bytes % itemsize || (itemsize == 2 && is_signed)) {
            PyErr_SetString(PyExc_ValueError, "checksum_rows: widens unsigned 16-bit and 32-bit ids only");
            goto release;
        }
        if (wide.len < n * (row_bytes / itemsize) * 8) {
            PyErr_SetString(PyExc_ValueError, "checksum_rows: wide is too short for the rows");
            goto release;
        }
    }
    {
        const unsigned char *src = rows.buf;
        const uint64_t *w = weights.buf;
        uint32_t *out = crcs.buf;
        int64_t *dst = wide.obj ? wide.buf : NULL;
        Py_ssize_t per_row = itemsize ? row_bytes / itemsize : 0;
        Py_BEGIN_ALLOW_THREADS /* the reader threads checksum their chunks in parallel */
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = row_checksum(src + i * row_bytes, row_bytes, w);
            if (dst) widen(src + i * row_bytes, per_row, itemsize, is_signed, dst + i * per_row);
        }
        Py_END_ALLOW_THREADS
    }
    result = PyLong_FromSsize_t(n);
release:
    if (wide.obj) PyBuffer_Release(&wide);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&weights);
    PyBuffer_Release(&crcs);
    return result;
}

/* The integer types a stored column may take, narrowest first: columns.py `_NARROW`, the same order, so that a
   column gets the type the NumPy path would pick (tests/data/ledger/test_row_kernel.py compares them). */
static const struct { int64_t lo; int64_t hi; int size; char code[4]; } NARROW[] = {
    {0, UINT8_MAX, 1, "|u1"},          {INT8_MIN, INT8_MAX, 1, "|i1"},  /* (NumPy's names: no byte order) */
    {0, UINT16_MAX, 2, "<u2"},         {INT16_MIN, INT16_MAX, 2, "<i2"},
    {0, UINT32_MAX, 4, "<u4"},         {INT32_MIN, INT32_MAX, 4, "<i4"},
    {0, INT64_MAX, 8, "<u8"},          {INT64_MIN, INT64_MAX, 8, "<i8"},
};

/* One part's values: its int64 or uint32 values, or with `delta` their differences modulo 2**64 (the first from
   `prev`, the value before the part), read as int64. Each helper returns the part's last value, the next part's
   `prev`. Written per input type and as differences of neighbours, so that each is a plain loop the compiler
   vectorizes. */
#define BOUNDS(T)                                                                                      \
    VECTOR_CLONES static uint64_t bounds_##T(const T *x, Py_ssize_t n, int delta, uint64_t prev,       \
                                             int64_t *lo, int64_t *hi) {                               \
        int64_t l = *lo, h = *hi, v;                                                                   \
        if (delta) {                                                                                   \
            v = (int64_t)((uint64_t)(int64_t)x[0] - prev);                                             \
            l = v < l ? v : l, h = v > h ? v : h;                                                      \
            for (Py_ssize_t k = 1; k < n; k++) {                                                       \
                v = (int64_t)((uint64_t)(int64_t)x[k] - (uint64_t)(int64_t)x[k - 1]);                  \
                l = v < l ? v : l, h = v > h ? v : h;                                                  \
            }                                                                                          \
        } else {                                                                                       \
            for (Py_ssize_t k = 0; k < n; k++) {                                                       \
                v = (int64_t)x[k];                                                                     \
                l = v < l ? v : l, h = v > h ? v : h;                                                  \
            }                                                                                          \
        }                                                                                              \
        *lo = l, *hi = h;                                                                              \
        return (uint64_t)(int64_t)x[n - 1];                                                            \
    }
BOUNDS(int64_t)
BOUNDS(uint32_t)

/* The same values stored as U (their low bytes: the value in the type picked; kernel.py loads this module on
   little-endian machines only). */
#define STORE(T, U)                                                                                    \
    VECTOR_CLONES static uint64_t store_##T##_##U(const T *x, Py_ssize_t n, int delta, uint64_t prev, U *out) { \
        if (delta) {                                                                                   \
            out[0] = (U)((uint64_t)(int64_t)x[0] - prev);                                              \
            for (Py_ssize_t k = 1; k < n; k++)                                                         \
                out[k] = (U)((uint64_t)(int64_t)x[k] - (uint64_t)(int64_t)x[k - 1]);                   \
        } else {                                                                                       \
            for (Py_ssize_t k = 0; k < n; k++) out[k] = (U)(int64_t)x[k];                              \
        }                                                                                              \
        return (uint64_t)(int64_t)x[n - 1];                                                            \
    }
STORE(int64_t, uint8_t) STORE(int64_t, uint16_t) STORE(int64_t, uint32_t) STORE(int64_t, uint64_t)
STORE(uint32_t, uint8_t) STORE(uint32_t, uint16_t) STORE(uint32_t, uint32_t) STORE(uint32_t, uint64_t)

static uint64_t part_bounds(const Py_buffer *b, int delta, uint64_t prev, int64_t *lo, int64_t *hi) {
    Py_ssize_t n = b->shape[0];
    if (!n) return prev;
    return b->itemsize == 8 ? bounds_int64_t(b->buf, n, delta, prev, lo, hi)
                            : bounds_uint32_t(b->buf, n, delta, prev, lo, hi);
}

static uint64_t part_store(const Py_buffer *b, int delta, uint64_t prev, int size, unsigned char *out) {
    Py_ssize_t n = b->shape[0];
    if (!n) return prev;
    if (b->itemsize == 8) {
        switch (size) {
        case 1: return store_int64_t_uint8_t(b->buf, n, delta, prev, (uint8_t *)out);
        case 2: return store_int64_t_uint16_t(b->buf, n, delta, prev, (uint16_t *)out);
        case 4: return store_int64_t_uint32_t(b->buf, n, delta, prev, (uint32_t *)out);
        default: return store_int64_t_uint64_t(b->buf, n, delta, prev, (uint64_t *)out);
        }
    }
    switch (size) {
    case 1: return store_uint32_t_uint8_t(b->buf, n, delta, prev, (uint8_t *)out);
    case 2: return store_uint32_t_uint16_t(b->buf, n, delta, prev, (uint16_t *)out);
    case 4: return store_uint32_t_uint32_t(b->buf, n, delta, prev, (uint32_t *)out);
    default: return store_uint32_t_uint64_t(b->buf, n, delta, prev, (uint64_t *)out);
    }
}

/* narrow_column(parts, delta) -> (lo, hi, code, data): the column that is `parts` (1-D int64 or uint32 buffers, one
   after another) joined, stored as columns.py `_encode_column` stores an array: with `delta`, as differences from the
   previous value modulo 2**64 (the first from 0) read as int64; lo and hi their least and greatest; when they
   differ, `data` the values in the narrowest type of NARROW that holds them (`code` its NumPy dtype), little-endian;
   code and data None when every value is one. Why: the loader's ids and checksums arrive as one array per chunk;
   joining them, then taking differences, bounds and a narrowing copy took five NumPy passes over them at every
   commit, on the training path; here it is two, and nothing is joined (32,768 shuffled ids in 16 chunks: 9 us
   against NumPy's 31; their checksums 6 against 11, on this project's 2-core machine). */
static PyObject *narrow_column(PyObject *self, PyObject *args) {
    PyObject *seq, *fast = NULL, *result = NULL;
    int delta;
    Py_buffer *bufs = NULL;
    Py_ssize_t nparts = 0, got = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "Op", &seq, &delta))
        return NULL;
    if (!(fast = PySequence_Fast(seq, "narrow_column: parts must be a sequence of arrays")))
        return NULL;
    nparts = PySequence_Fast_GET_SIZE(fast);
    if (!(bufs = PyMem_Calloc(nparts ? nparts : 1, sizeof(Py_buffer)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < nparts; got++) {
        Py_buffer *b = &bufs[got];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        const char *f = b->format ? b->format : "B";
        if (*f == '<' || *f == '=') f++;
        int wide = b->itemsize == 8 && (*f == 'q' || *f == 'l') && !f[1];
        int narrow = b->itemsize == 4 && (*f == 'I' || (*f == 'L' && sizeof(long) == 4)) && !f[1];
        if (b->ndim != 1 || !(wide || narrow)) {
            PyErr_Format(PyExc_TypeError, "narrow_column: part %zd is not a 1-D int64 or uint32 array", got);
            got++;
            goto done;
        }
    }
    {
        Py_ssize_t n = 0;
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        uint64_t prev = 0;
        for (Py_ssize_t p = 0; p < nparts; p++) n += bufs[p].shape[0];
        if (n == 0) {
            PyErr_SetString(PyExc_ValueError, "narrow_column: no values");
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < nparts; p++)
            prev = part_bounds(&bufs[p], delta, prev, &lo, &hi);
        Py_END_ALLOW_THREADS
        if (lo == hi) {
            result = Py_BuildValue("LLOO", (long long)lo, (long long)hi, Py_None, Py_None);
            goto done;
        }
        int t = 0;
        while (!(NARROW[t].lo <= lo && hi <= NARROW[t].hi)) t++;  /* int64 always fits: the last entry */
        PyObject *data = PyBytes_FromStringAndSize(NULL, n * NARROW[t].size);
        if (!data) goto done;
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(data);
        int size = NARROW[t].size;
        prev = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < nparts; p++) {
            prev = part_store(&bufs[p], delta, prev, size, out);
            out += bufs[p].shape[0] * size;
        }
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("LLsN", (long long)lo, (long long)hi, NARROW[t].code, data);
    }
done:
    for (Py_ssize_t p = 0; p < got; p++)
        if (bufs[p].obj) PyBuffer_Release(&bufs[p]);
    PyMem_Free(bufs);
    Py_DECREF(fast);
    return result;
}

static PyMethodDef methods[] = {
    {"checksum_rows", checksum_rows, METH_VARARGS,
     "checksum_rows(rows, row_bytes, weights, crcs, wide=None, itemsize=0, signed=False) -> n: each row's "
     "wword64 checksum into crcs and, given wide, its ids as int64 (see _rows.c)."},
    {"narrow_column", narrow_column, METH_VARARGS,
     "narrow_column(parts, delta) -> (lo, hi, code, data): int64 or uint32 arrays joined, as differences with delta, "
     "their bounds and, unless all are one value, their bytes in the narrowest integer type (see _rows.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", "The run ledger's row kernel (C).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rows(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "KERNEL", KERNEL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
