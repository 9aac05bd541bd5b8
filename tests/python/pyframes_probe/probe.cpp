// A test module for the C++ recorder's frame walk without the GIL (python/streamsan/torch/csrc/
// pyframes.h), built against any CPython, no torch: `walk()` releases the GIL, walks the calling
// thread's frames as the recorder does, takes the GIL back and returns (file, function, line)
// per frame, innermost first; `fast()` says whether this CPython has the walk.
#include <Python.h>

#include <utility>
#include <vector>

#include "pyframes.h"

static PyObject* walk(PyObject*, PyObject*) {
  std::vector<std::pair<PyCodeObject*, int>> frames;
  PyThreadState* tstate = PyThreadState_Get();
  Py_BEGIN_ALLOW_THREADS
  pyframes::walk(tstate, 256, [&](PyCodeObject* code, int lasti) {
    frames.emplace_back(code, lasti);
    return false;
  });
  Py_END_ALLOW_THREADS
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (auto& [code, lasti] : frames) {
    PyObject* t = Py_BuildValue("(OOi)", code->co_filename, code->co_name, PyCode_Addr2Line(code, lasti));
    if (t == nullptr || PyList_Append(out, t) < 0) {
      Py_XDECREF(t);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(t);
  }
  return out;
}

static PyObject* fast(PyObject*, PyObject*) { return PyBool_FromLong(pyframes::kFastFrames); }

static PyMethodDef methods[] = {
    {"walk", walk, METH_NOARGS, "(file, function, line) of each frame of this thread, innermost first"},
    {"fast", fast, METH_NOARGS, "whether this CPython has the frame walk without the GIL"},
    {nullptr, nullptr, 0, nullptr},
};

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyframes_probe", nullptr, -1, methods};

PyMODINIT_FUNC PyInit_pyframes_probe(void) { return PyModule_Create(&module); }
