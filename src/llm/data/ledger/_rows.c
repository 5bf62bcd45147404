/* The run ledger's row kernel: each row's "wword64" checksum, in C.

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

#define KERNEL 3 /* checksums.py uses a built module only of the version its code expects */

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

static PyMethodDef methods[] = {
    {"checksum_rows", checksum_rows, METH_VARARGS,
     "checksum_rows(rows, row_bytes, weights, crcs, wide=None, itemsize=0, signed=False) -> n: each row's "
     "wword64 checksum into crcs and, given wide, its ids as int64 (see _rows.c)."},
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
