/* The proxy's per-chunk path, compiled: `WholeChunkRelay.data_received` forwards a read of exactly one
 * whole chunk, between chunks, without running Python bytecode; any other read goes to the subclass's
 * `_data_received`. Most reads of a stream are such reads, and the bytecode of the same path in Python
 * was most of the proxy's own CPU per chunk (docs/live-stack.md, "Cost per chunk").
 *
 * retrybench/proxy/whole_chunks.py has the same class in Python, line for line; it is used where this
 * module is not built, and the tests run both on the same reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_WHOLE (1 << 16) /* the longest read told by its size (http1.MAX_WHOLE) */

typedef struct {
    PyObject_HEAD
    PyObject *sink;      /* the exchange's Sink, or None between exchanges */
    PyObject *direct;    /* the one client's transport, or None: see upstream._Connection */
    PyObject *client[4]; /* its methods, bound when `direct` is set (NULL while it is None) */
    PyObject *scanner;   /* the body's ChunkedScanner, or None (no chunked body) */
    PyObject *last_body; /* the latest read forwarded */
    Py_ssize_t reads;    /* reads of a streamed chunked body */
    Py_ssize_t client_buffer_limit; /* bytes queued for the client past which it is dropped */
    char want_payload;   /* the first payload has not been read yet */
    char between;        /* the body read so far ends between two chunks (the scanner's, kept by _feed) */
} Relay;

enum { IS_CLOSING, WRITE, QUEUED, CLOSE, N_METHODS };
static PyObject *str_slow, *str_on_body, *method_names[N_METHODS];

/* Whether `s` is one whole non-last chunk, as the upstream writes it: a size in lower-case hex without
 * leading zeros (at most four digits), CRLF, that many bytes, CRLF. */
static int
whole_chunk(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t size = 0, digits = 0;
    if (n < 6 || n > MAX_WHOLE || s[0] == '0') {
        return 0;
    }
    for (; digits < 5; digits++) {
        unsigned char c = s[digits];
        if (c >= '0' && c <= '9') {
            size = size * 16 + (c - '0');
        }
        else if (c >= 'a' && c <= 'f') {
            size = size * 16 + (c - 'a' + 10);
        }
        else {
            break;
        }
    }
    if (digits == 0 || digits > 4 || s[digits] != '\r' || s[digits + 1] != '\n') {
        return 0;
    }
    return n == digits + 2 + size + 2 && s[n - 2] == '\r' && s[n - 1] == '\n';
}

/* 1 when the client took the bytes (it is not closing), 0 when it is closing, -1 on an error. */
static int
write_to_client(Relay *self, PyObject *const *methods, PyObject *data)
{
    PyObject *r = PyObject_CallNoArgs(methods[IS_CLOSING]);
    if (r == NULL) {
        return -1;
    }
    int closing = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (closing != 0) {
        return closing < 0 ? -1 : 0;
    }
    r = PyObject_CallOneArg(methods[WRITE], data);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    r = PyObject_CallNoArgs(methods[QUEUED]);
    if (r == NULL) {
        return -1;
    }
    Py_ssize_t queued = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (queued == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (queued > self->client_buffer_limit) { /* a client that stopped reading must not hold our memory */
        r = PyObject_CallNoArgs(methods[CLOSE]);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    return 1;
}

/* A whole chunk between chunks: the scanner's state does not change, and the stream cannot end here. */
static PyObject *
forward(Relay *self, PyObject *sink, PyObject *data)
{
    Py_INCREF(data);
    Py_XSETREF(self->last_body, data);
    self->reads += 1;
    PyObject *client = self->direct;
    if (client != NULL && client != Py_None) {
        /* The calls below may set `direct` again: its bound methods (and so the client) are held until
         * they return. */
        PyObject *methods[N_METHODS];
        for (int i = 0; i < N_METHODS; i++) {
            methods[i] = Py_NewRef(self->client[i]);
        }
        int written = write_to_client(self, methods, data);
        for (int i = 0; i < N_METHODS; i++) {
            Py_DECREF(methods[i]);
        }
        if (written < 0) {
            return NULL;
        }
        if (written) {
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallMethodOneArg(sink, str_on_body, data);
}

static PyObject *
Relay_data_received(Relay *self, PyObject *data)
{
    PyObject *sink = self->sink;
    if (sink != NULL && sink != Py_None && self->scanner != NULL && self->scanner != Py_None
            && !self->want_payload && self->between
            && PyBytes_CheckExact(data)
            && whole_chunk((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))) {
        Py_INCREF(sink);
        PyObject *r = forward(self, sink, data);
        Py_DECREF(sink);
        return r;
    }
    return PyObject_CallMethodOneArg((PyObject *)self, str_slow, data);
}

static int
Relay_traverse(Relay *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->sink);
    Py_VISIT(self->direct);
    for (int i = 0; i < N_METHODS; i++) {
        Py_VISIT(self->client[i]);
    }
    Py_VISIT(self->scanner);
    Py_VISIT(self->last_body);
    return 0;
}

static int
Relay_clear(Relay *self)
{
    Py_CLEAR(self->sink);
    Py_CLEAR(self->direct);
    for (int i = 0; i < N_METHODS; i++) {
        Py_CLEAR(self->client[i]);
    }
    Py_CLEAR(self->scanner);
    Py_CLEAR(self->last_body);
    return 0;
}

static void
Relay_dealloc(Relay *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Relay_clear(self);
    type->tp_free((PyObject *)self);
    if (type->tp_flags & Py_TPFLAGS_HEAPTYPE) {
        Py_DECREF(type);
    }
}

static PyObject *
Relay_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs; /* the subclass's __init__ takes them */
    Relay *self = (Relay *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->sink = Py_NewRef(Py_None);
    self->direct = Py_NewRef(Py_None);
    self->scanner = Py_NewRef(Py_None);
    self->last_body = PyBytes_FromStringAndSize(NULL, 0);
    self->want_payload = 1;
    self->between = 1;
    self->client_buffer_limit = PY_SSIZE_T_MAX;
    if (self->last_body == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
Relay_get_direct(Relay *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->direct);
}

/* `direct` is set once per stream (and per change of who wants its bytes): its methods are bound then,
 * not looked up on every chunk. */
static int
Relay_set_direct(Relay *self, PyObject *value, void *closure)
{
    (void)closure;
    PyObject *bound[N_METHODS] = {NULL};
    if (value == NULL) {
        value = Py_None;
    }
    if (value != Py_None) {
        for (int i = 0; i < N_METHODS; i++) {
            bound[i] = PyObject_GetAttr(value, method_names[i]);
            if (bound[i] == NULL) {
                for (int j = 0; j < i; j++) {
                    Py_DECREF(bound[j]);
                }
                return -1;
            }
        }
    }
    for (int i = 0; i < N_METHODS; i++) {
        Py_XSETREF(self->client[i], bound[i]);
    }
    Py_SETREF(self->direct, Py_NewRef(value));
    return 0;
}

static PyGetSetDef Relay_getset[] = {
    {"direct", (getter)Relay_get_direct, (setter)Relay_set_direct,
     "The one client's transport while it alone wants the body's bytes, else None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Relay_methods[] = {
    {"data_received", (PyCFunction)Relay_data_received, METH_O,
     "Forward a whole chunk read between chunks; hand any other read to `_data_received`."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Relay_members[] = {
    {"sink", T_OBJECT, offsetof(Relay, sink), 0, NULL},
    {"_scanner", T_OBJECT, offsetof(Relay, scanner), 0, NULL},
    {"last_body", T_OBJECT, offsetof(Relay, last_body), 0, NULL},
    {"reads", T_PYSSIZET, offsetof(Relay, reads), 0, NULL},
    {"client_buffer_limit", T_PYSSIZET, offsetof(Relay, client_buffer_limit), 0, NULL},
    {"_want_payload", T_BOOL, offsetof(Relay, want_payload), 0, NULL},
    {"_between", T_BOOL, offsetof(Relay, between), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Relay_slots[] = {
    {Py_tp_doc, "The per-chunk fast path of an upstream connection (compiled)."},
    {Py_tp_new, Relay_new},
    {Py_tp_dealloc, Relay_dealloc},
    {Py_tp_traverse, Relay_traverse},
    {Py_tp_clear, Relay_clear},
    {Py_tp_methods, Relay_methods},
    {Py_tp_members, Relay_members},
    {Py_tp_getset, Relay_getset},
    {0, NULL},
};

static PyType_Spec Relay_spec = {
    .name = "retrybench.proxy._whole_chunks.WholeChunkRelay",
    .basicsize = sizeof(Relay),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Relay_slots,
};

static int
intern(PyObject **into, const char *name)
{
    *into = PyUnicode_InternFromString(name);
    return *into == NULL ? -1 : 0;
}

static int
module_exec(PyObject *module)
{
    if (intern(&str_slow, "_data_received")
            || intern(&method_names[IS_CLOSING], "is_closing") || intern(&method_names[WRITE], "write")
            || intern(&method_names[QUEUED], "get_write_buffer_size") || intern(&method_names[CLOSE], "close")
            || intern(&str_on_body, "on_body")) {
        return -1;
    }
    PyObject *type = PyType_FromModuleAndSpec(module, &Relay_spec, NULL);
    if (type == NULL) {
        return -1;
    }
    int added = PyModule_AddObjectRef(module, "WholeChunkRelay", type);
    Py_DECREF(type);
    return added;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "retrybench.proxy._whole_chunks",
    .m_doc = "The proxy's per-chunk path, compiled (retrybench/proxy/whole_chunks.py in Python).",
    .m_size = 0,
    .m_slots = module_slots,
};

PyMODINIT_FUNC
PyInit__whole_chunks(void)
{
    return PyModuleDef_Init(&module_def);
}
