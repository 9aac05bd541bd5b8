// The Python frames of the calling thread, read without the GIL (CPython 3.11 to 3.13).
//
// A thread inside a C++ op called from Python has released the GIL (torch's bindings do), and
// its own Python frames cannot change until the op returns: only this thread pushes and pops
// them. Reading them needs no GIL, as a sampling profiler reads them from outside; taking the
// GIL for it costs a lock hand-off per op, and PyFrame_GetBack makes a frame object for every
// frame it passes. What is read here is the interpreter's own frame record
// (`_PyInterpreterFrame`, from CPython's internal headers, mirrored below for each version):
// its code object, its instruction, its caller.
//
// Only this thread's frames are read, and only the pointers listed; nothing is written, no
// reference is taken. Elsewhere (another CPython, free-threaded builds) `kFastFrames` is false
// and the caller takes the GIL and uses the public API. The recorder also checks, once per
// check, that this walk and the public API's agree (`frames_agree`), and uses it only then.

#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace pyframes {

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED) && \
    !defined(Py_LIMITED_API)
constexpr bool kFastFrames = true;

// A code unit of CPython's bytecode (`_Py_CODEUNIT`: 16 bits, not public in 3.13).
using CodeUnit = uint16_t;

// CPython's `_PyInterpreterFrame` (Include/internal/pycore_frame.h), the fields read here.
#if PY_VERSION_HEX < 0x030C0000
struct InterpreterFrame {  // 3.11
  PyObject* f_func;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyCodeObject* f_code;
  PyObject* frame_obj;
  InterpreterFrame* previous;
  CodeUnit* instr;  // prev_instr
  int stacktop;
  bool is_entry;
  char owner;
};
#else
struct InterpreterFrame {  // 3.12 (f_code, prev_instr) and 3.13 (f_executable, instr_ptr)
  PyObject* f_code;
  InterpreterFrame* previous;
  PyObject* f_funcobj;
  PyObject* f_globals;
  PyObject* f_builtins;
  PyObject* f_locals;
  PyObject* frame_obj;
  CodeUnit* instr;
  int stacktop;
  uint16_t return_offset;
  char owner;
};
#endif

constexpr char kOwnedByGenerator = 1;
constexpr char kOwnedByCStack = 3;  // 3.12 on: the C stack's entry frames, not Python code

// The innermost frame record of `tstate` (this thread's own state).
inline InterpreterFrame* current(PyThreadState* tstate) {
#if PY_VERSION_HEX >= 0x030D0000
  return reinterpret_cast<InterpreterFrame*>(tstate->current_frame);
#else
  return tstate->cframe == nullptr ? nullptr
                                   : reinterpret_cast<InterpreterFrame*>(tstate->cframe->current_frame);
#endif
}

// The code object a frame runs, or null where it runs none (an entry frame of the C stack).
inline PyCodeObject* code_of(const InterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030C0000
  if (f->owner == kOwnedByCStack) return nullptr;
#endif
  PyObject* c = reinterpret_cast<PyObject*>(f->f_code);
  if (c == nullptr || Py_TYPE(c) != &PyCode_Type) return nullptr;
  return reinterpret_cast<PyCodeObject*>(c);
}

// Whether the frame has not begun its first instruction yet (CPython's _PyFrame_IsIncomplete:
// such frames are skipped by PyEval_GetFrame and PyFrame_GetBack).
inline bool incomplete(const InterpreterFrame* f, PyCodeObject* code) {
  return f->owner != kOwnedByGenerator &&
         f->instr < reinterpret_cast<CodeUnit*>(code->co_code_adaptive) + code->_co_firsttraceable;
}

// The frame's instruction offset in bytes, as PyFrame_GetLasti gives it (the key of its line).
inline int lasti(const InterpreterFrame* f, PyCodeObject* code) {
  return static_cast<int>(f->instr - reinterpret_cast<CodeUnit*>(code->co_code_adaptive)) *
         static_cast<int>(sizeof(CodeUnit));
}

// Calls `visit(code, lasti)` for each complete Python frame of `tstate`, innermost first, until
// it returns true or `max_depth` frames were visited; returns whether it stopped on one.
template <typename Visit>
bool walk(PyThreadState* tstate, int max_depth, Visit&& visit) {
  int depth = 0;
  for (InterpreterFrame* f = current(tstate); f != nullptr && depth < max_depth; f = f->previous) {
    PyCodeObject* code = code_of(f);
    if (code == nullptr || incomplete(f, code)) continue;
    depth++;
    if (visit(code, lasti(f, code))) return true;
  }
  return false;
}

#else
constexpr bool kFastFrames = false;

template <typename Visit>
bool walk(PyThreadState*, int, Visit&&) {
  return false;
}
#endif

}  // namespace pyframes
