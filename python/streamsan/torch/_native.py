"""Builds and loads the C++ recorder (csrc/recorder.cpp) for the torch in use.

A C++ extension of torch has no stable ABI: it is built once per torch version and Python, with
`torch.utils.cpp_extension` (a C++ compiler and ninja are needed), and cached. Set
STREAMSAN_TORCH_EXT to a built module (`.so`, built from this version's recorder) to load it
instead, and STREAMSAN_TORCH_EXT_DIR to choose the cache directory.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import sysconfig

_module = None
_error: str | None = None

SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "recorder.cpp")
# Headers recorder.cpp includes: torch rebuilds when a source or a flag changes, not a header,
# so the digest of the source with them is one of the flags (see source_digest).
HEADERS = [os.path.join(os.path.dirname(__file__), "csrc", "pyframes.h")]


def source_digest() -> str:
    """A digest of the recorder's source (recorder.cpp and its headers), given to the build as a
    flag: a changed header rebuilds the module, and the module carries it (its `source_digest`),
    so that one given by STREAMSAN_TORCH_EXT is known to be built from this version's recorder,
    whatever machine built it."""
    import hashlib

    h = hashlib.sha1()
    for path in [SOURCE, *HEADERS]:
        with open(path, "rb") as f:
            h.update(f.read())
    return "s" + h.hexdigest()[:16]


def _name() -> str:
    import torch

    tag = torch.__version__.replace(".", "_").replace("+", "_")
    return f"streamsan_recorder_t{tag}_py{sys.version_info[0]}{sys.version_info[1]}"


def _cuda_includes() -> list[str]:
    """Where cuda_runtime_api.h is: the CUDA toolkit, or the pip packages of the CUDA runtime."""
    out = []
    try:
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME and os.path.isdir(os.path.join(CUDA_HOME, "include")):
            out.append(os.path.join(CUDA_HOME, "include"))
    except Exception:
        pass
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    try:
        import torch

        roots.add(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))))
    except Exception:
        pass
    for root in sorted(roots):
        for h in glob.glob(os.path.join(root, "nvidia", "*", "include", "cuda_runtime_api.h")):
            out.append(os.path.dirname(h))
        for h in glob.glob(os.path.join(root, "nvidia", "cuda_runtime", "include", "cuda_runtime_api.h")):
            out.append(os.path.dirname(h))
    return list(dict.fromkeys(out))


def _cxx_standard() -> str:
    """The C++ standard torch's headers ask for: C++20 where ATen.h requires it (newer torch),
    else C++17."""
    try:
        import torch

        with open(os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ATen.h")) as f:
            if "C++20 or later" in f.read():
                return "-std=c++20"
    except OSError:
        pass
    return "-std=c++17"


def _ninja_on_path() -> None:
    """torch builds with the `ninja` on PATH: a virtual environment's own (pip install ninja)
    is there only when the environment is activated, so its scripts folder is added."""
    import shutil

    if shutil.which("ninja"):
        return
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if d and os.access(os.path.join(d, "ninja"), os.X_OK):
            os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")
            return


def build_dir() -> str:
    d = os.environ.get("STREAMSAN_TORCH_EXT_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "streamsan", "torch-ext", _name()
    )
    os.makedirs(d, exist_ok=True)
    return d


BUILD_WAIT_SECONDS = 900  # the longest a process waits for another one building the recorder


class _BuildLock:
    """One build at a time per build directory, held with `flock` (released by the kernel when
    its process dies, however it dies). torch's own lock (`lock`, a file created exclusively)
    stays behind when a build is killed, and every later load then waits for it forever: under
    this lock no other process of ours is building, so a `lock` found there is such a leftover
    and is removed. The wait is bounded (BUILD_WAIT_SECONDS)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.file = None

    def __enter__(self) -> "_BuildLock":
        import time

        try:
            import fcntl
        except ImportError:  # no flock: torch's lock alone
            return self
        self.file = open(os.path.join(self.directory, "streamsan-build.lock"), "w")
        deadline = time.monotonic() + BUILD_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.file.close()
                    self.file = None
                    raise RuntimeError(
                        f"another process has been building the C++ recorder in {self.directory} "
                        f"for over {BUILD_WAIT_SECONDS} s"
                    ) from None
                time.sleep(0.2)
        try:
            os.remove(os.path.join(self.directory, "lock"))
        except FileNotFoundError:
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()  # releases the flock
            self.file = None


# What this version's Python code calls that earlier builds of the recorder lacked: a module
# given by STREAMSAN_TORCH_EXT without them is another version's.
_ENTRY_POINTS = ("open_check", "begin_recording", "end_recording", "fast_plan_put")


def load(verbose: bool = False):
    """The extension module, built if needed; raises on failure (the message says why)."""
    global _module, _error
    if _module is not None:
        return _module
    if _error is not None:
        raise RuntimeError(_error)
    try:
        path = os.environ.get("STREAMSAN_TORCH_EXT")
        if path:
            import torch  # noqa: F401  (the module links against torch's libraries)

            spec = importlib.util.spec_from_file_location(_name(), path)
            if spec is None or spec.loader is None:
                raise RuntimeError(f"STREAMSAN_TORCH_EXT={path}: not a loadable module")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            missing = [f for f in _ENTRY_POINTS if not hasattr(mod, f)]
            if missing:
                raise RuntimeError(
                    f"STREAMSAN_TORCH_EXT={path}: built from another version of streamsan's recorder "
                    f"(it lacks {', '.join(missing)}); build this one's (unset STREAMSAN_TORCH_EXT)"
                )
            theirs, ours = getattr(mod, "source_digest", None), source_digest()
            if theirs != ours:
                raise RuntimeError(
                    f"STREAMSAN_TORCH_EXT={path}: built from another version of streamsan's recorder "
                    f"(its source digest {theirs or 'is missing'}, this version's {ours}); build this "
                    "one's (unset STREAMSAN_TORCH_EXT)"
                )
        else:
            import torch
            from torch.utils import cpp_extension

            lib = os.path.join(os.path.dirname(torch.__file__), "lib")
            _ninja_on_path()
            directory = build_dir()
            with _BuildLock(directory):
                mod = cpp_extension.load(
                    name=_name(),
                    sources=[SOURCE],
                    build_directory=directory,
                    extra_include_paths=_cuda_includes(),
                    extra_cflags=["-O2", "-DNDEBUG", _cxx_standard(), f"-DSTREAMSAN_SOURCE={source_digest()}"],
                    extra_ldflags=[f"-L{lib}", "-lc10_cuda", f"-Wl,-rpath,{lib}"],
                    with_cuda=False,
                    verbose=verbose,
                )
        _module = mod
        return mod
    except BaseException as e:  # a failed compiler run raises several kinds
        _error = f"the C++ recorder could not be built or loaded: {type(e).__name__}: {e}"
        raise RuntimeError(_error) from e
