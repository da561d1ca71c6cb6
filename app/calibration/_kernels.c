/* calibd's optional compiled kernels for the two hottest predictions (app/calibration/kernels.py).
 *
 * Each reads the scores straight from the JSON list orjson parsed (exact Python floats only) or
 * from a C-contiguous float64 buffer, computes the prediction into a float64 buffer the caller
 * made, and returns True; or returns False, having written nothing that counts, when the
 * scores are not plain valid floats (an int, a boolean, a NaN, a ragged row, ...). The caller
 * then takes the numpy path, which validates the scores and names the bad element.
 *
 * The kernels hold the GIL: the batches are small, and a release per call would wake the
 * server's other threads (see app/api/logs.py).
 *
 * Built with -ffp-contract=off: a * b + c stays two roundings, as numpy computes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The scores' buffer, when they came as one (a list is read element by element instead). */
typedef struct {
    Py_buffer view; /* held when the scores came as a buffer */
    int held;
} Source;

static void release(Source *source)
{
    if (source->held) {
        PyBuffer_Release(&source->view);
        source->held = 0;
    }
}

/* out: a writable C-contiguous buffer of exactly `size` doubles. */
static int writable_doubles(PyObject *object, Py_buffer *view, Py_ssize_t size)
{
    if (PyObject_GetBuffer(object, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return 0;
    if (view->format == NULL || strcmp(view->format, "d") != 0 || view->len != size * (Py_ssize_t)sizeof(double)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "out must be a float64 buffer of the answer's size");
        return 0;
    }
    return 1;
}

/* A read-only C-contiguous buffer of doubles of known length (the fitted arrays). */
static const double *doubles(PyObject *object, Py_buffer *view, Py_ssize_t *length)
{
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (view->format == NULL || strcmp(view->format, "d") != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "expected a float64 buffer");
        return NULL;
    }
    *length = view->len / (Py_ssize_t)sizeof(double);
    return (const double *)view->buf;
}

/* scores as a 1-D (columns == 0) or 2-D C-contiguous float64 buffer of `rows` rows: its doubles, or
 * NULL (no error set) when it is anything else: no buffer, not contiguous, another type or shape. */
static const double *score_buffer(PyObject *scores, Source *source, Py_ssize_t *rows, Py_ssize_t columns)
{
    if (PyObject_GetBuffer(scores, &source->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        return NULL;
    }
    source->held = 1;
    Py_buffer *view = &source->view;
    int ndim = columns ? 2 : 1;
    if (view->format == NULL || strcmp(view->format, "d") != 0 || view->ndim != ndim || view->shape[0] == 0
        || (columns && view->shape[1] != columns)) {
        release(source);
        return NULL;
    }
    *rows = view->shape[0];
    return (const double *)view->buf;
}

/* numpy's pairwise sum of n doubles (numpy/_core/src/umath/loops_utils.h.src, pairwise_sum), the order
 * np.add.reduce sums a contiguous row in: rows sum to the same bits as in numpy's softmax. */
static double pairwise_sum(const double *a, Py_ssize_t n)
{
    if (n < 8) {
        double res = 0.;
        for (Py_ssize_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++)
            r[j] = a[j];
        Py_ssize_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* |logit / T| below this: exp neither overflows nor leaves the normal floats (temperature.py). */
#define UNSHIFTED_RANGE 600.0

/* One row of softmax(z / t) into out (k doubles), as temperature.py's numpy path computes it: rows
 * within range unshifted, others shifted by their maximum. False if a logit is not finite. */
static int softmax_row(const double *z, double *out, Py_ssize_t k, double t)
{
    int within = 1;
    double high = -INFINITY;
    for (Py_ssize_t j = 0; j < k; j++) {
        if (!isfinite(z[j]))
            return 0;
        double w = z[j] / t;
        out[j] = w;
        if (!(fabs(w) < UNSHIFTED_RANGE))
            within = 0;
        if (w > high)
            high = w;
    }
    if (within) {
        for (Py_ssize_t j = 0; j < k; j++)
            out[j] = exp(out[j]);
    }
    else {
        for (Py_ssize_t j = 0; j < k; j++)
            out[j] = exp(out[j] - high);
    }
    double total = pairwise_sum(out, k);
    for (Py_ssize_t j = 0; j < k; j++)
        out[j] /= total;
    return 1;
}

/* softmax(scores, t, k, out) -> bool: softmax(z / t) of every row of k logits. */
static PyObject *softmax(PyObject *self, PyObject *args)
{
    PyObject *scores, *out_object;
    double t;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OdnO:softmax", &scores, &t, &k, &out_object))
        return NULL;
    if (k < 2 || !(t > 0.0) || !isfinite(t)) {
        PyErr_SetString(PyExc_ValueError, "k must be at least 2 and t positive and finite");
        return NULL;
    }
    int done = 1;
    Py_buffer out_view;
    if (PyList_CheckExact(scores)) {
        Py_ssize_t n = PyList_GET_SIZE(scores);
        if (n == 0)
            Py_RETURN_FALSE;
        if (!writable_doubles(out_object, &out_view, n * k))
            return NULL;
        double *out = (double *)out_view.buf;
        double row_values[64];
        double *row = k <= 64 ? row_values : PyMem_Malloc(k * sizeof(double));
        if (row == NULL) {
            PyBuffer_Release(&out_view);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n && done; i++) {
            PyObject *item = PyList_GET_ITEM(scores, i);
            if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != k) {
                done = 0;
                break;
            }
            for (Py_ssize_t j = 0; j < k; j++) {
                PyObject *value = PyList_GET_ITEM(item, j);
                if (!PyFloat_CheckExact(value)) {
                    done = 0;
                    break;
                }
                row[j] = PyFloat_AS_DOUBLE(value);
            }
            if (done)
                done = softmax_row(row, out + i * k, k, t);
        }
        if (row != row_values)
            PyMem_Free(row);
        PyBuffer_Release(&out_view);
    }
    else {
        Source source = {.held = 0};
        Py_ssize_t n;
        const double *z = score_buffer(scores, &source, &n, k);
        if (z == NULL)
            Py_RETURN_FALSE;
        if (!writable_doubles(out_object, &out_view, n * k)) {
            release(&source);
            return NULL;
        }
        double *out = (double *)out_view.buf;
        for (Py_ssize_t i = 0; i < n && done; i++)
            done = softmax_row(z + i * k, out + i * k, k, t);
        PyBuffer_Release(&out_view);
        release(&source);
    }
    return PyBool_FromLong(done);
}

/* The fitted lookup: thresholds x (k, increasing), values y, slopes (last 0), and the grid of
 * isotonic.py's _GridLookup: cell(v) = (intp)((v - x[0]) * scale), base[cell] the index of the
 * last threshold before the cell (-1 for none). */
typedef struct {
    const double *x, *y, *slopes;
    const int64_t *base;
    Py_ssize_t k, cells;
    double scale, low, high;
} Lookup;

/* np.interp(s, x, y) with the ends held, in its arithmetic: the segment j, the last threshold
 * <= s, then (s - x_j) * slope_j + y_j. Cells are monotone in s, so j lies between the last
 * threshold before s's cell and the last one in it: usually a step or two apart, binary-searched
 * where thresholds crowd into one cell. */
static inline double lookup_one(const Lookup *f, double s)
{
    if (s < f->x[0])
        s = f->x[0];
    else if (s > f->x[f->k - 1])
        s = f->x[f->k - 1];
    Py_ssize_t cell = (Py_ssize_t)((s - f->x[0]) * f->scale);
    if (cell >= f->cells)
        cell = f->cells - 1;
    Py_ssize_t lo = (Py_ssize_t)f->base[cell]; /* x[lo] <= s, or lo == -1 */
    Py_ssize_t hi = cell + 1 < f->cells ? (Py_ssize_t)f->base[cell + 1] : f->k - 1; /* x[hi + 1] > s */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo + 1) / 2;
        if (f->x[mid] <= s)
            lo = mid;
        else
            hi = mid - 1;
    }
    return (s - f->x[lo]) * f->slopes[lo] + f->y[lo];
}

/* isotonic(scores, x, y, slopes, base, scale, low, high, out) -> bool: every score looked up, if
 * each is a float within [low, high]. */
static PyObject *isotonic(PyObject *self, PyObject *args)
{
    PyObject *scores, *x_object, *y_object, *slopes_object, *base_object, *out_object;
    Lookup f;
    if (!PyArg_ParseTuple(args, "OOOOOdddO:isotonic", &scores, &x_object, &y_object, &slopes_object, &base_object,
                          &f.scale, &f.low, &f.high, &out_object))
        return NULL;
    Py_buffer xv, yv, sv, bv, out_view;
    Py_ssize_t ky, ks;
    if ((f.x = doubles(x_object, &xv, &f.k)) == NULL)
        return NULL;
    if ((f.y = doubles(y_object, &yv, &ky)) == NULL) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    if ((f.slopes = doubles(slopes_object, &sv, &ks)) == NULL) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&yv);
        return NULL;
    }
    PyObject *result = NULL;
    if (PyObject_GetBuffer(base_object, &bv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto fitted;
    f.base = (const int64_t *)bv.buf;
    f.cells = bv.len / (Py_ssize_t)sizeof(int64_t);
    if (bv.itemsize != 8 || bv.format == NULL || (strcmp(bv.format, "q") && strcmp(bv.format, "l"))
        || ky != f.k || ks != f.k || f.k < 2 || f.cells < 1) {
        PyErr_SetString(PyExc_ValueError, "x, y and slopes must be float64 of one length, base int64");
        goto grid;
    }
    int done = 1;
    if (PyList_CheckExact(scores)) {
        Py_ssize_t n = PyList_GET_SIZE(scores);
        if (n == 0) {
            result = Py_NewRef(Py_False);
            goto grid;
        }
        if (!writable_doubles(out_object, &out_view, n))
            goto grid;
        double *out = (double *)out_view.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *value = PyList_GET_ITEM(scores, i);
            if (!PyFloat_CheckExact(value)) {
                done = 0;
                break;
            }
            double s = PyFloat_AS_DOUBLE(value);
            if (!(s >= f.low && s <= f.high)) { /* also NaN */
                done = 0;
                break;
            }
            out[i] = lookup_one(&f, s);
        }
        PyBuffer_Release(&out_view);
    }
    else {
        Source source = {.held = 0};
        Py_ssize_t n;
        const double *s = score_buffer(scores, &source, &n, 0);
        if (s == NULL) {
            result = Py_NewRef(Py_False);
            goto grid;
        }
        if (!writable_doubles(out_object, &out_view, n)) {
            release(&source);
            goto grid;
        }
        double *out = (double *)out_view.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!(s[i] >= f.low && s[i] <= f.high)) {
                done = 0;
                break;
            }
            out[i] = lookup_one(&f, s[i]);
        }
        PyBuffer_Release(&out_view);
        release(&source);
    }
    result = PyBool_FromLong(done);
grid:
    PyBuffer_Release(&bv);
fitted:
    PyBuffer_Release(&xv);
    PyBuffer_Release(&yv);
    PyBuffer_Release(&sv);
    return result;
}

static PyMethodDef methods[] = {
    {"softmax", softmax, METH_VARARGS, "softmax(scores, t, k, out) -> bool: softmax(z / t) by rows into out."},
    {"isotonic", isotonic, METH_VARARGS,
     "isotonic(scores, x, y, slopes, base, scale, low, high, out) -> bool: the isotonic lookup into out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, 0, methods};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&module);
}
