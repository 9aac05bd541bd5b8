"""What observing every op costs, by the mechanism that observes it (docs/performance.md, "Two
ways to see every op"): a RecordFunction callback (as the C++ recorder uses), with and without the
ops' inputs and outputs (and with either alone), against a boxed fallback kernel on a dispatch key put in the thread's
included set (`TESTING_ONLY_GenericMode`), which sees the same aten ops with their arguments on
the stack. The observers given inputs and outputs, and the fallback, read every tensor
argument's storage pointer and nothing more; the plain RecordFunction observer counts its calls.

    python tests/python/bench_observer_floor.py [--workload tiny] [--device cpu] [--rounds 21]
        [--steps 300] [--threads 1] [--check]

The workloads are bench_overhead.py's (`tiny`: an MLP 16-32-32-4, batch 8, SGD, the CPU proxy of
a launch-bound step; `mlp`, `streams`, `resnet` on a GPU), plain and under each observer,
interleaved in rounds (the order rotated each round), the collector off; prints the median
microseconds per step, the ratio to plain and the observer's calls per step. With `--check`, the
C++ recorder observing only and checking in full join the rounds (the recorder installed), and
so do the recorder's RecordFunction observer alone and with c10's GPU trace, observing only
outside any check: what observing costs, split between the observer, the trace and the rest of
a check. On a
GPU each block of steps ends with a device synchronization. Needs torch and a C++ compiler (the
observers are built once, under $STREAMSAN_BENCH_EXT_DIR or a temporary directory).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

SOURCE = r'''#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace {
constexpr c10::DispatchKey kKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
uint64_t calls = 0;
uintptr_t sink = 0;  // what the storage reads add up to (kept, so they are not optimized out)
at::CallbackHandle handle = 0;
bool rf_on = false;
int io_mode = 0;  // what the RecordFunction observer asked for (rf's io)
bool fb_top = false;

void read_ivalue(const c10::IValue& v) {
  auto read = [](const at::Tensor& t) {
    if (!t.defined() || !t.unsafeGetTensorImpl()->has_storage()) return;
    sink += reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl()->data_ptr().get());
  };
  if (v.isTensor()) {
    read(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) read(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) if (e.isTensor()) read(e.toTensor());
  }
}

std::unique_ptr<at::ObserverContext> start_plain(const at::RecordFunction&) { ++calls; return nullptr; }
void end_plain(const at::RecordFunction&, at::ObserverContext*) {}
std::unique_ptr<at::ObserverContext> start_io(const at::RecordFunction& fn) {
  ++calls;
  if (io_mode & 1) for (const auto& v : fn.inputs()) read_ivalue(v);
  return nullptr;
}
void end_io(const at::RecordFunction& fn, at::ObserverContext*) {
  if (io_mode & 2) for (const auto& v : fn.outputs()) read_ivalue(v);
}

// io: 0 neither the inputs nor the outputs, 1 the inputs, 2 the outputs, 3 both.
void rf(bool on, int io) {
  if (on && !rf_on) {
    io_mode = io;
    auto cb = io ? at::RecordFunctionCallback(start_io, end_io).needsInputs(io & 1).needsOutputs(io & 2)
                 : at::RecordFunctionCallback(start_plain, end_plain);
    cb.scopes({at::RecordScope::FUNCTION});
    handle = at::addGlobalCallback(std::move(cb));
    rf_on = true;
  } else if (!on && rf_on) {
    at::removeCallback(handle);
    rf_on = false;
  }
}

// Every op dispatched while the key is in this thread's included set (the autograd engine carries
// the set to the ops it runs) comes here boxed: its arguments read, the op run below the key,
// its returns read.
void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  ++calls;
  const auto n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) read_ivalue((*stack)[i]);
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);
  if (fb_top) {
    c10::impl::ExcludeDispatchKeyGuard g(kKey);  // the ops it calls are not seen
    op.redispatchBoxed(below, stack);
  } else {
    op.redispatchBoxed(below, stack);
  }
  const auto r = op.schema().returns().size();
  for (size_t i = stack->size() - r; i < stack->size(); ++i) read_ivalue((*stack)[i]);
}

void fb(bool on, bool top) {
  fb_top = top;
  c10::impl::tls_set_dispatch_key_included(kKey, on);
}

uint64_t take_calls() { uint64_t c = calls; calls = 0; return c; }
}  // namespace

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rf", &rf);
  m.def("fb", &fb);
  m.def("take_calls", &take_calls);
  m.def("sink", []() { return static_cast<uint64_t>(sink); });
}
'''


def build():
    import shutil
    import sys

    from torch.utils.cpp_extension import load_inline

    if shutil.which("ninja") is None:  # a virtual environment's ninja, run without activating it
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    where = os.environ.get("STREAMSAN_BENCH_EXT_DIR") or os.path.join(tempfile.gettempdir(), "streamsan-observer-floor")
    os.makedirs(where, exist_ok=True)
    return load_inline(name="streamsan_observer_floor", cpp_sources=[SOURCE], functions=None,
                       build_directory=where, extra_cflags=["-O2", "-DNDEBUG"], verbose=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="tiny", choices=["tiny", "mlp", "streams", "resnet"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (1: the steadiest)")
    p.add_argument("--check", action="store_true", help="also the C++ recorder: observing only, and checking")
    p.add_argument("--json", help="also write the medians to this file")
    a = p.parse_args()

    import sys

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_overhead as bo

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_observer_floor: --device cuda needs a GPU")
    if a.device == "cpu" and a.workload == "streams":
        raise SystemExit("bench_observer_floor: the streams workload needs a GPU")
    torch.set_num_threads(a.threads)
    ext = build()
    make = bo.WORKLOADS[a.workload]
    step = make(a.device) if a.device == "cpu" or a.workload != "streams" else make()

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    modes = {
        "plain": (lambda: None, lambda: None),
        "RecordFunction": (lambda: ext.rf(True, 0), lambda: ext.rf(False, 0)),
        "RecordFunction, inputs": (lambda: ext.rf(True, 1), lambda: ext.rf(False, 1)),
        "RecordFunction, outputs": (lambda: ext.rf(True, 2), lambda: ext.rf(False, 2)),
        "RecordFunction, inputs and outputs": (lambda: ext.rf(True, 3), lambda: ext.rf(False, 3)),
        "boxed fallback": (lambda: ext.fb(True, False), lambda: ext.fb(False, False)),
        "boxed fallback, outermost ops only": (lambda: ext.fb(True, True), lambda: ext.fb(False, True)),
    }
    if a.check:
        import streamsan.torch

        class Checked:
            """A check entered before the block and left after it (its own cost not timed: the
            block's clock stops before `off`)."""

            def __init__(self, profile):
                self.profile, self.run = profile, None

            def on(self):
                self.run = streamsan.torch.Run(raise_on_hazard=False, backend="native",
                                               _fake_device=a.device == "cpu", _profile=self.profile)
                self.run.__enter__()

            def off(self):
                self.run.__exit__(None, None, None)
                if self.run.report.errors:
                    raise SystemExit(f"bench_observer_floor: the check reported {self.run.report.errors} error(s)")

        from streamsan.torch import _native

        rec = _native.load()

        def parts(gpu_trace: bool):
            """The recorder's observer alone, observing only (its callbacks return at once; no
            check, no patches, no Triton hooks, no checker), with c10's GPU trace or without: what
            a check observing only costs beyond them is the rest of the check."""

            def on():
                rec.install(a.device == "cuda")
                rec.set_profile(True, True)
                if gpu_trace:
                    rec.install_gpu_trace()
                rec.set_active(True)

            def off():
                rec.set_active(False)
                if gpu_trace:
                    rec.uninstall_gpu_trace()
                rec.set_profile(False, False)
                rec.uninstall()

            return on, off

        modes["recorder's observer, observing only"] = parts(False)
        if getattr(rec, "native_syncs", lambda: False)():  # this torch's GPU trace is the recorder's to take
            modes["recorder's observer and GPU trace, observing only"] = parts(True)
        for label, prof in (("recorder, observing only", "observe"), ("recorder, checking", "0")):
            c = Checked(prof)
            modes[label] = (c.on, c.off)
    names = list(modes)
    calls = {}
    for n in names:  # warm-up, and each observer's calls per step
        on, off = modes[n]
        on()
        ext.take_calls()
        for _ in range(50):
            step()
        sync()
        calls[n] = ext.take_calls() / 50
        off()
    times = {n: [] for n in names}
    gc.disable()
    try:
        for r in range(a.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                on, off = modes[n]
                on()
                t0 = time.perf_counter_ns()
                for _ in range(a.steps):
                    step()
                sync()
                t1 = time.perf_counter_ns()
                off()
                times[n].append((t1 - t0) / a.steps / 1000)
    finally:
        gc.enable()
    base = statistics.median(times["plain"])
    print(f"torch {torch.__version__}, {a.workload} on {a.device}, {a.threads} thread(s), "
          f"{a.rounds} rounds of {a.steps} steps")
    print(f"{'observer':50s} {'us/step':>9s} {'x plain':>8s} {'calls/step':>11s}")
    for n in names:
        m = statistics.median(times[n])
        print(f"{n:50s} {m:9.1f} {m / base:8.2f} {calls[n]:11.0f}")
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"workload": a.workload, "device": a.device, "rounds": a.rounds, "steps": a.steps,
                       "torch": torch.__version__, "calls": calls,
                       "us": {n: statistics.median(times[n]) for n in names},
                       "samples": times}, f, indent=1)


if __name__ == "__main__":
    main()
