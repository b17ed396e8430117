/* The tar sink's packer in C: the same bytes as ustar.PyPacker, at a fraction of the CPU.
 *
 * Packer(fd, where, blank, mtime, flush_at, fatal, md5_hex, long_header)
 *   fd           the open file members are appended to (not closed here)
 *   where        its path, for messages
 *   blank        ustar.blank_header(mtime): 512 bytes, empty name, size 0, checksum spaces
 *   flush_at     bytes buffered before a write(2)
 *   fatal        the exception raised when the file cannot be written (SinkFatal)
 *   md5_hex      md5_hex(body) -> str, for members added without a digest
 *   long_header  long_header(name, size, mtime) -> bytes, for names that do not fit ustar
 *
 * One thread at a time: the GIL is released only around write(2), of our own buffer or of
 * a body whose buffer we hold.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 512
#define NAME_FIELD 100
#define SIZE_AT 124
#define CHECKSUM_AT 148
#define MAX_OCTAL_SIZE 8589934591LL /* 8**11 - 1: eleven octal digits */

typedef struct {
    PyObject_HEAD
    int fd;
    unsigned char blank[BLOCK];
    long blank_sum; /* byte sum of blank without its size digits */
    char *buf;
    Py_ssize_t len, cap, flush_at;
    long long flushed; /* bytes written; offset = flushed + len */
    long long mtime;
    PyObject *members, *where, *fatal, *md5_hex, *long_header;
} Packer;

/* A Packer made without __init__ (Packer.__new__) has no members list: refuse it. */
static int
check_ready(Packer *self)
{
    if (self->members == NULL) {
        PyErr_SetString(PyExc_ValueError, "Packer was not initialised");
        return -1;
    }
    return 0;
}

static int
reserve(Packer *self, Py_ssize_t more)
{
    if (self->len + more <= self->cap)
        return 0;
    Py_ssize_t cap = self->cap ? self->cap : BLOCK;
    while (cap < self->len + more)
        cap *= 2;
    char *grown = PyMem_Realloc(self->buf, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->buf = grown;
    self->cap = cap;
    return 0;
}

/* write(2) all of data; on failure raise `fatal` naming the file, as PyPacker does. The
 * callers count the bytes as written either way (the shard is dropped on failure). */
static int
write_all(Packer *self, const char *data, Py_ssize_t size)
{
    while (size > 0) {
        ssize_t n;
        Py_BEGIN_ALLOW_THREADS
        n = write(self->fd, data, (size_t)size);
        Py_END_ALLOW_THREADS
        if (n < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0)
                    return -1;
                continue;
            }
            PyErr_Format(self->fatal, "cannot write %U: %s", self->where, strerror(errno));
            return -1;
        }
        data += n;
        size -= n;
    }
    return 0;
}

static int
flush_buffer(Packer *self)
{
    Py_ssize_t len = self->len;
    self->len = 0;
    /* like PyPacker: what was buffered counts as written even if the write fails */
    long long target = self->flushed + len;
    int status = write_all(self, self->buf, len);
    self->flushed = target;
    return status;
}

static int
append_bytes(Packer *self, const void *data, Py_ssize_t size)
{
    if (size >= self->flush_at) { /* a large body goes straight from its own buffer */
        if (flush_buffer(self) < 0)
            return -1;
        long long target = self->flushed + size;
        int status = write_all(self, data, size);
        self->flushed = target;
        return status;
    }
    if (reserve(self, size) < 0)
        return -1;
    memcpy(self->buf + self->len, data, (size_t)size);
    self->len += size;
    return 0;
}

/* The ustar header of an ASCII name of at most 100 bytes, appended to the buffer. */
static int
append_header(Packer *self, const unsigned char *name, Py_ssize_t length, long long size)
{
    if (reserve(self, BLOCK) < 0)
        return -1;
    unsigned char *out = (unsigned char *)self->buf + self->len;
    memcpy(out, self->blank, BLOCK);
    memcpy(out, name, (size_t)length);
    long sum = self->blank_sum;
    for (Py_ssize_t i = 0; i < length; i++)
        sum += name[i];
    unsigned long long rest = (unsigned long long)size;
    for (int i = 10; i >= 0; i--) { /* "%011o\0" */
        unsigned char digit = (unsigned char)('0' + (rest & 7));
        out[SIZE_AT + i] = digit;
        sum += digit;
        rest >>= 3;
    }
    for (int i = 5; i >= 0; i--) { /* "%06o\0 ": a header's sum is below 8**6 */
        out[CHECKSUM_AT + i] = (unsigned char)('0' + (sum & 7));
        sum >>= 3;
    }
    out[CHECKSUM_AT + 6] = 0;
    out[CHECKSUM_AT + 7] = ' ';
    self->len += BLOCK;
    return 0;
}

static int
append_member_row(Packer *self, PyObject *name, long long data_at, Py_ssize_t size,
                  PyObject *md5)
{
    PyObject *at = PyLong_FromLongLong(data_at);
    if (at == NULL)
        return -1;
    PyObject *length = PyLong_FromSsize_t(size);
    if (length == NULL) {
        Py_DECREF(at);
        return -1;
    }
    int status = -1;
    Py_ssize_t before = PyList_GET_SIZE(self->members);
    if (PyList_Append(self->members, name) == 0 && PyList_Append(self->members, at) == 0
        && PyList_Append(self->members, length) == 0
        && PyList_Append(self->members, md5) == 0)
        status = 0;
    else /* out of memory: keep the list in whole rows of four */
        PyList_SetSlice(self->members, before, PyList_GET_SIZE(self->members), NULL);
    Py_DECREF(at);
    Py_DECREF(length);
    return status;
}

static PyObject *
Packer_add(Packer *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const char zeros[BLOCK] = {0};
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(name, body, md5) takes 3 arguments");
        return NULL;
    }
    if (check_ready(self) < 0)
        return NULL;
    PyObject *name = args[0], *body = args[1], *md5 = args[2];
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "add(): name must be str");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(name) < 0)
        return NULL;
#endif
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t size = view.len;
    PyObject *digest = NULL;
    int ok = 0;
    long long data_at;
    if (md5 == Py_None) {
        digest = PyObject_CallOneArg(self->md5_hex, body);
        if (digest == NULL)
            goto done;
    }
    else {
        digest = Py_NewRef(md5);
    }
    if (PyUnicode_IS_ASCII(name) && PyUnicode_GET_LENGTH(name) <= NAME_FIELD
        && size <= MAX_OCTAL_SIZE) {
        data_at = self->flushed + self->len + BLOCK;
        if (append_header(self, PyUnicode_1BYTE_DATA(name), PyUnicode_GET_LENGTH(name),
                          size) < 0)
            goto done;
    }
    else {
        PyObject *head = PyObject_CallFunction(self->long_header, "OnL", name, size,
                                               self->mtime);
        if (head == NULL)
            goto done;
        if (!PyBytes_Check(head)) {
            Py_DECREF(head);
            PyErr_SetString(PyExc_TypeError, "long_header() must return bytes");
            goto done;
        }
        data_at = self->flushed + self->len + PyBytes_GET_SIZE(head);
        int status = append_bytes(self, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
        Py_DECREF(head);
        if (status < 0)
            goto done;
    }
    if (append_bytes(self, view.buf, size) < 0)
        goto done;
    if (append_bytes(self, zeros, (BLOCK - size % BLOCK) % BLOCK) < 0)
        goto done;
    if (append_member_row(self, name, data_at, size, digest) < 0)
        goto done;
    if (self->len >= self->flush_at && flush_buffer(self) < 0)
        goto done;
    ok = 1;
done:
    Py_XDECREF(digest);
    PyBuffer_Release(&view);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Packer_append(Packer *self, PyObject *data)
{
    if (check_ready(self) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int status = append_bytes(self, view.buf, view.len);
    PyBuffer_Release(&view);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Packer_flush(Packer *self, PyObject *Py_UNUSED(ignored))
{
    if (check_ready(self) < 0)
        return NULL;
    if (flush_buffer(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The caller wrote `n` bytes to fd itself (a spooled body copied in by the kernel), right
 * after flush(): the offset moves past them. */
static PyObject *
Packer_advance(Packer *self, PyObject *arg)
{
    if (check_ready(self) < 0)
        return NULL;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || self->len != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "advance(n): n must be >= 0 and the buffer flushed first");
        return NULL;
    }
    self->flushed += n;
    Py_RETURN_NONE;
}

static PyObject *
Packer_release(Packer *self, PyObject *Py_UNUSED(ignored))
{
    if (check_ready(self) < 0)
        return NULL;
    PyMem_Free(self->buf);
    self->buf = NULL;
    self->len = self->cap = 0;
    if (PyList_SetSlice(self->members, 0, PyList_GET_SIZE(self->members), NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Packer_get_offset(Packer *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->flushed + self->len);
}

static PyObject *
Packer_get_members(Packer *self, void *Py_UNUSED(closure))
{
    if (check_ready(self) < 0)
        return NULL;
    return Py_NewRef(self->members);
}

static int
Packer_init(Packer *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"fd", "where", "blank", "mtime", "flush_at", "fatal",
                               "md5_hex", "long_header", NULL};
    int fd;
    PyObject *where, *fatal, *md5_hex, *long_header;
    Py_buffer blank;
    long long mtime;
    Py_ssize_t flush_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iUy*LnOOO:Packer", keywords, &fd, &where,
                                     &blank, &mtime, &flush_at, &fatal, &md5_hex,
                                     &long_header))
        return -1;
    if (blank.len != BLOCK || flush_at <= 0) {
        PyBuffer_Release(&blank);
        PyErr_SetString(PyExc_ValueError,
                        "Packer: blank must be 512 bytes and flush_at positive");
        return -1;
    }
    memcpy(self->blank, blank.buf, BLOCK);
    PyBuffer_Release(&blank);
    long sum = 0;
    for (int i = 0; i < BLOCK; i++)
        sum += self->blank[i];
    for (int i = 0; i < 11; i++) /* the size digits are added back per member */
        sum -= self->blank[SIZE_AT + i];
    PyObject *members = PyList_New(0);
    if (members == NULL)
        return -1;
    self->fd = fd;
    self->blank_sum = sum;
    self->mtime = mtime;
    self->flush_at = flush_at;
    self->flushed = 0;
    self->len = 0;
    Py_XSETREF(self->members, members);
    Py_XSETREF(self->where, Py_NewRef(where));
    Py_XSETREF(self->fatal, Py_NewRef(fatal));
    Py_XSETREF(self->md5_hex, Py_NewRef(md5_hex));
    Py_XSETREF(self->long_header, Py_NewRef(long_header));
    return 0;
}

static void
Packer_dealloc(Packer *self)
{
    PyMem_Free(self->buf);
    Py_XDECREF(self->members);
    Py_XDECREF(self->where);
    Py_XDECREF(self->fatal);
    Py_XDECREF(self->md5_hex);
    Py_XDECREF(self->long_header);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Packer_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Packer_add, METH_FASTCALL,
     "add(name, body, md5): append one member (md5 None: computed)"},
    {"append", (PyCFunction)Packer_append, METH_O, "append(data): append raw bytes"},
    {"flush", (PyCFunction)Packer_flush, METH_NOARGS, "write out what is buffered"},
    {"advance", (PyCFunction)Packer_advance, METH_O,
     "advance(n): n bytes were written to fd by the caller after flush()"},
    {"release", (PyCFunction)Packer_release, METH_NOARGS,
     "drop the buffer and the members"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Packer_getset[] = {
    {"offset", (getter)Packer_get_offset, NULL, "bytes written plus buffered", NULL},
    {"members", (getter)Packer_get_members, NULL,
     "name, data offset, size, md5, name, ... of every member added", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PackerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bulkfetch.sinks._ustar.Packer",
    .tp_doc = "Members appended to one open tar file, and their index fields.",
    .tp_basicsize = sizeof(Packer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Packer_init,
    .tp_dealloc = (destructor)Packer_dealloc,
    .tp_methods = Packer_methods,
    .tp_getset = Packer_getset,
};

static struct PyModuleDef ustar_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "bulkfetch.sinks._ustar",
    .m_doc = "The tar sink's packer in C (see ustar.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__ustar(void)
{
    if (PyType_Ready(&PackerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&ustar_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Packer", (PyObject *)&PackerType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
