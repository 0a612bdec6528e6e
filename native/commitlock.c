/*
 * commitlock.c -- wal._storecore.CommitLock, the Python face of the commit lock (see
 * commitlock.h for the protocol): acquire(blocking=True), release(), locked(), a context
 * manager, and _at_fork_reinit() as threading's own locks have.
 */
#include "commitlock.h"

void commitlock_wake(CommitLock *l) {
    pthread_mutex_lock(&l->mu);
    l->gen++;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void commitlock_after_fork(CommitLock *l);

/* A lock used first in a child forked past Python's hooks starts over (commitlock.h). Called by
 * every acquire of the Python face, not by commitlock_try: the C commit path holds the GIL
 * from its try to its release, so in a child a holder that took the lock by a try is never
 * found mid-hold by an acquire, and a try of a lock left held by the parent fails over to
 * the Python path, whose acquire starts it over. */
static void commitlock_check_fork(CommitLock *l) {
    if (l->epoch != forkwatch_now()) commitlock_after_fork(l);
}

/* Blocking acquire, GIL held. */
static void commitlock_acquire(CommitLock *l) {
    commitlock_check_fork(l);
    while (!commitlock_try(l)) {
        pthread_mutex_lock(&l->mu); /* held by others only for a few instructions */
        __atomic_fetch_add(&l->waiters, 1, __ATOMIC_RELAXED);
        uint64_t gen = l->gen;
        PyThreadState *ts = PyEval_SaveThread();
        while (l->gen == gen) pthread_cond_wait(&l->cv, &l->mu);
        __atomic_fetch_sub(&l->waiters, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&l->mu); /* before the GIL: never hold mu while waiting for it */
        PyEval_RestoreThread(ts);
    }
}

static int commitlock_setup(CommitLock *l) {
    l->locked = 0;
    l->waiters = 0;
    l->gen = 0;
    l->epoch = forkwatch_epoch();
    if (pthread_mutex_init(&l->mu, NULL) != 0 || pthread_cond_init(&l->cv, NULL) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "CommitLock: cannot initialise its mutex or condition variable");
        return -1;
    }
    return 0;
}

/* In a child the lock has not seen yet: an unlocked lock with no waiters. GIL held. */
static void commitlock_after_fork(CommitLock *l) {
    /* Only this thread exists in the child (any other started since found the lock started
     * over already: this runs with the GIL held, before the lock is used). A mutex or
     * condition variable that cannot be initialised again is left as it is: `locked` and the
     * count of waiters are what a try and a release read. */
    if (commitlock_setup(l) < 0) {
        PyErr_Clear();
        l->epoch = forkwatch_epoch();
    }
}

static PyObject *commitlock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "CommitLock takes no arguments");
        return NULL;
    }
    CommitLock *l = (CommitLock *)type->tp_alloc(type, 0);
    if (l != NULL && commitlock_setup(l) < 0) {
        Py_TYPE(l)->tp_free((PyObject *)l);
        return NULL;
    }
    return (PyObject *)l;
}

static void commitlock_dealloc(CommitLock *l) {
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

/* acquire(blocking=True) -> bool */
static PyObject *commitlock_py_acquire(CommitLock *l, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"blocking", NULL};
    int blocking = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:acquire", kwlist, &blocking)) return NULL;
    if (blocking) {
        commitlock_acquire(l);
        Py_RETURN_TRUE;
    }
    commitlock_check_fork(l);
    return PyBool_FromLong(commitlock_try(l));
}

static PyObject *commitlock_py_release(CommitLock *l, PyObject *unused) {
    (void)unused;
    if (!l->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    commitlock_release(l);
    Py_RETURN_NONE;
}

static PyObject *commitlock_py_enter(CommitLock *l, PyObject *unused) {
    (void)unused;
    commitlock_acquire(l);
    Py_RETURN_TRUE;
}

static PyObject *commitlock_py_exit(CommitLock *l, PyObject *const *args, Py_ssize_t nargs) {
    (void)args;
    (void)nargs;
    return commitlock_py_release(l, NULL);
}

static PyObject *commitlock_py_locked(CommitLock *l, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(l->locked);
}

/* In a forked child only the forking thread exists: any holder or waiter of the parent's
 * lock is gone, and `mu` may have been copied held. Start over, as CPython does for its
 * own locks (the store refuses use in the child anyway; this keeps the object sane). */
static PyObject *commitlock_py_at_fork_reinit(CommitLock *l, PyObject *unused) {
    (void)unused;
    if (commitlock_setup(l) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef commitlock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))commitlock_py_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True) -> bool: take the lock, waiting (GIL released) unless blocking is False."},
    {"release", (PyCFunction)commitlock_py_release, METH_NOARGS,
     "Let the lock go; RuntimeError if it is not held."},
    {"locked", (PyCFunction)commitlock_py_locked, METH_NOARGS, "Whether some thread holds the lock."},
    {"__enter__", (PyCFunction)commitlock_py_enter, METH_NOARGS, "acquire()"},
    {"__exit__", (PyCFunction)(void (*)(void))commitlock_py_exit, METH_FASTCALL, "release()"},
    {"_at_fork_reinit", (PyCFunction)commitlock_py_at_fork_reinit, METH_NOARGS,
     "In a forked child: an unlocked lock with no waiters, whatever the parent's threads were doing."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject CommitLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wal._storecore.CommitLock",
    .tp_basicsize = sizeof(CommitLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The store's commit lock: a GIL-guarded flag the C commit path tries without a call "
              "(see native/commitlock.h).",
    .tp_new = commitlock_new,
    .tp_dealloc = (destructor)commitlock_dealloc,
    .tp_methods = commitlock_methods,
};
