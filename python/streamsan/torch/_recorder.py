"""The recorder: what a running PyTorch program does to memory and streams, as trace-format ops.

Two backends write the same ops:

- ``native``: the C++ extension (csrc/recorder.cpp): a RecordFunction observer on every dispatcher
  op (the autograd engine's threads included) and the CUDA caching allocator's trace tracker
  (allocations and frees with their real address, size and owning stream). Fast.
- ``python``: a TorchDispatchMode and torch.cuda._gpu_trace's allocation callbacks. Works wherever
  torch does, no compiler needed; slower (a Python call per op), and allocation sizes come from
  the storage, their stream from the current stream.

Both get synchronizations from torch.cuda._gpu_trace (event record, wait and synchronize; stream
and device synchronize) and from wrappers of what that does not report (event and stream
queries, elapsed_time). Ops go to a sink in batches: the Rust checker (online check), a trace
file, or both.
"""

from __future__ import annotations

import bisect
import collections
import functools
import json
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

# Imported here, not where a check uses them: an import inside a function costs Python calls at
# every check (neither imports torch).
from . import _graphs, _native

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A freed buffer's name is given to a new buffer only after this many other frees: reports of a
# run name distinct buffers, and the checker's table of names stays bounded (as in the C++
# recorder).
NAME_DELAY = 4096
# Tests (fake device): where the addresses written for CPU storages standing for device memory
# begin (above any address a process maps, and any a test's fake allocator trace gives).
_FAKE_ADDR_BASE = 1 << 56
_WAIT_PREFIX = '{"op":"event_wait","stream":'


def _collective_stream(pending: list, own: str) -> tuple[Optional[str], int]:
    """The stream a collective's first wait on another stream than `own` names (its process
    group's: the collective runs there after it), and the index past that wait; (None, 0) when
    no such wait was issued (as the C++ recorder's `collective_stream_of`)."""
    for i, p in enumerate(pending):
        if p.startswith(_WAIT_PREFIX):
            waiting = p[len(_WAIT_PREFIX) :].split(',"event"', 1)[0]
            if waiting != own:
                return waiting, i + 1
    return None, 0

# The recorder that is on, if any (one at a time in a process).
_active: Optional["Recorder"] = None
# The recorder being set up or on (claimed under `_lock` before it touches the C++ recorder's
# state, which is one per process): a second one is refused before it sets anything up.
_claimed: Optional["Recorder"] = None
_callbacks_registered = False
_alloc_callbacks_registered = False
_lock = threading.Lock()
# What a recorder refused because another one is claimed or on says.
_BUSY = "streamsan.torch: a check or record is already running in this process"
_IN_CAPTURE = (
    "streamsan.torch: a check or record cannot begin while the current stream is capturing a CUDA "
    "graph (what is captured would be recorded as if it ran, and the graph's replays would not be "
    "seen): begin it before the capture (outside `with torch.cuda.graph(...)`, "
    "`make_graphed_callables` or a `reduce-overhead` function's first calls); a capture begun "
    "inside a check is recorded"
)


def _q(s: str) -> str:
    return json.dumps(s)


# Host syncs, as the recorder writes them.
_HOST_SYNCS = ('{"op":"stream_sync"', '{"op":"device_sync"', '{"op":"event_sync"')
# Where values copied to the host land: managed memory, an address space the program's own
# (device and pinned) allocations never use.
_HOST_VALUES = '"streamsan host values"'
_HOST_VALUES_ALLOC = '{"op":"alloc","buffer":%s,"bytes":8,"memory":"managed","addr":4096}\n' % _HOST_VALUES


def _record_stream_line(buffer: str, stream: str, site: str) -> str:
    """A `record_stream` op (names quoted, the site as `_site` takes it)."""
    return '{"op":"record_stream","buffer":%s,"stream":%s%s' % (buffer, stream, _site(site))


def _site(quoted: str) -> str:
    """The end of an op's line: its site when known, and the closing brace."""
    return "}\n" if quoted == "null" else ',"site":' + quoted + "}\n"


class _Warned:
    """Warnings given once per key.

    `inside=True` for a check's own: those are given from inside the program's calls (a hook, a
    wrapper of PyTorch's, the dispatch mode), where an exception would change what the program
    does. Where the warnings filter turns them into errors (`python -W error`, pytest's
    `filterwarnings = error`), such a warning is written to stderr instead of raised."""

    def __init__(self, inside: bool = False) -> None:
        self.seen: set[str] = set()
        self.inside = inside

    def __call__(self, key: str, message: str) -> None:
        if key in self.seen:
            return
        self.seen.add(key)
        text = f"streamsan: {message}"
        try:
            warnings.warn(text, RuntimeWarning, stacklevel=_outside_stacklevel())
        except Exception:
            if not self.inside:
                raise
            try:
                sys.stderr.write(f"{text} (RuntimeWarning, written here: the warnings filter makes it an error)\n")
            except Exception:
                pass


# What `backend="auto"` falling back to the Python recorder said, once per process and reason.
_FALLBACKS_WARNED = _Warned()


def _warn_fallback(error: str) -> None:
    """Says that `backend="auto"` checks with the Python recorder because the C++ one could not
    be loaded: a check that sees less (the outermost ops only, compiled code run eagerly) and
    costs more must not pass for the other."""
    _FALLBACKS_WARNED(
        error,
        f"the C++ recorder could not be loaded ({error}); checking with the Python recorder, which "
        "sees only the outermost op of each call, runs compiled code eagerly and costs more "
        '(docs/pytorch.md, "Two recorders"). backend="python" chooses it without this warning; '
        'backend="native" makes this an error.',
    )


def _outside_stacklevel() -> int:
    """The `stacklevel` of the innermost frame outside streamsan, torch, Triton and Inductor's
    generated code, for a warning given by the caller: the user's `with` line (or the user's line
    that ran when a hook warned), not the check's or a library's code. The outermost frame when
    every frame is theirs (a hook on a thread that runs no user code)."""
    f = sys._getframe(2)  # the caller's caller: stacklevel 2 for the caller's warnings.warn
    level = 2
    theirs = (_PKG_DIR + os.sep, _torch_dir(), *_internal_dirs())
    while f.f_back is not None and f.f_code.co_filename.startswith(theirs):
        f = f.f_back
        level += 1
    return level


# ----------------------------------------------------------------------------------------------
# Sites: the innermost frame outside torch and streamsan


def _stdlib_dirs() -> tuple[str, list[str]]:
    """Python's standard library directory (its frames are not the user's: threading.py runs
    the DataLoader's pin-memory thread) and the package folders inside it (site-packages: a
    library's frames are sites as before); ("", []) when unknown. Looked up once per sys.path."""
    key = tuple(sys.path)
    hit = _STDLIB_DIRS.get(key)
    if hit is None:
        hit = _STDLIB_DIRS[key] = _find_stdlib_dirs()
    return hit[0], list(hit[1])


_STDLIB_DIRS: dict = {}


def _find_stdlib_dirs() -> tuple[str, list[str]]:
    import site
    import sysconfig

    try:
        paths = sysconfig.get_paths()
        std = os.path.abspath(paths["stdlib"]) + os.sep
    except Exception:
        return "", []
    libs = {paths.get("purelib"), paths.get("platlib")}
    try:
        libs.update(site.getsitepackages())
    except Exception:
        pass
    libs.update(p for p in sys.path if "site-packages" in p or "dist-packages" in p)
    inside = sorted({os.path.abspath(p) + os.sep for p in libs if p and (os.path.abspath(p) + os.sep).startswith(std)})
    return std, inside


def _internal_dirs() -> list[str]:
    """Folders of code outside torch that is not the user's: Triton's package and the files
    Inductor generates (its cache directory, `TORCHINDUCTOR_CACHE_DIR` or the default). Looked
    up once per process and cache directory (each check makes its `Sites`)."""
    return list(_internal_dirs_for(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or ""))


@functools.lru_cache(maxsize=4)
def _internal_dirs_for(cache: str) -> tuple[str, ...]:
    import importlib.util

    dirs = []
    try:
        spec = importlib.util.find_spec("triton")
        for loc in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append(os.path.abspath(loc) + os.sep)
    except (ImportError, ValueError):
        pass
    if not cache:
        # Inductor's default (torch/_inductor/runtime/cache_dir_utils.py, default_cache_dir),
        # computed here so that the check does not import Inductor.
        import getpass
        import re
        import tempfile

        try:
            user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
            cache = os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
        except Exception:
            cache = ""
    if cache:
        dirs.append(os.path.abspath(cache) + os.sep)
    return tuple(dirs)


def _rewritten_codes() -> Any:
    """Dynamo's map from the code objects it rewrote to the user's, or None while Dynamo is not
    imported (then it rewrote nothing): a rewritten frame calls the compiled code, and the
    user's line is the frame that called it."""
    return getattr(sys.modules.get("torch._dynamo.utils"), "orig_code_map", None)


@functools.lru_cache(maxsize=1)
def _torch_dir() -> str:
    """torch's package folder (looked up once: each check makes its `Sites`)."""
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


@functools.lru_cache(maxsize=8)
def _dirs(path: tuple, cache: str) -> tuple:
    """`Sites`' folders for `sys.path` (`path`) and Inductor's cache directory (`cache`, as
    `_internal_dirs` reads it): torch's, streamsan's, the standard library's, the package folders
    inside it, and the folders of code that is not the user's. One lookup at each check."""
    std, libraries = _stdlib_dirs()
    return _torch_dir(), _PKG_DIR + os.sep, std, tuple(libraries), _internal_dirs_for(cache)


class Sites:
    def __init__(self) -> None:
        self.torch_dir, self.own_dir, self.stdlib_dir, libraries, self.internal_dirs = _dirs(
            tuple(sys.path), os.environ.get("TORCHINDUCTOR_CACHE_DIR") or ""
        )
        self.libraries = list(libraries)
        self.rewritten: Any = None
        self.cwd = os.getcwd().rstrip(os.sep) + os.sep
        self.cache: dict[Any, Optional[str]] = {}

    def is_rewritten(self, code) -> bool:
        """Whether `code` is a frame Dynamo rewrote, or one of its resume functions."""
        if code.co_name.startswith("torch_dynamo_resume_in_"):
            return True
        if self.rewritten is None:
            self.rewritten = _rewritten_codes()
        try:
            return self.rewritten is not None and code in self.rewritten
        except Exception:
            return False

    def shown(self, code) -> Optional[str]:
        try:
            return self.cache[code]
        except KeyError:
            pass
        f = code.co_filename
        if (
            f.startswith(self.torch_dir)
            or f.startswith(self.own_dir)
            or (self.stdlib_dir and f.startswith(self.stdlib_dir) and not f.startswith(tuple(self.libraries)))
            or f.startswith("<frozen ")
            or f.startswith("<eval_with_key>")
            or (self.internal_dirs and f.startswith(self.internal_dirs))
            or self.is_rewritten(code)
        ):
            shown = None
        else:
            shown = f[len(self.cwd):] if f.startswith(self.cwd) else f
        self.cache[code] = shown
        return shown

    def site(self, depth: int = 2) -> Optional[str]:
        try:
            f = sys._getframe(depth)
        except ValueError:
            return None
        while f is not None:
            shown = self.shown(f.f_code)
            if shown is not None:
                return f"{shown}:{f.f_lineno}"
            f = f.f_back
        return None

    def quoted(self, depth: int = 3) -> str:
        s = self.site(depth)
        return "null" if s is None else _q(s)


# ----------------------------------------------------------------------------------------------
# The pure-Python backend


class _OpInfo:
    __slots__ = ("name", "kind", "arg_write", "arg_names", "fresh", "copy", "factory", "pins", "syncs_first", "meta_inputs")

    def __init__(self, func) -> None:
        schema = func._schema
        name = schema.name
        self.name = _q(name)
        self.kind = "normal"
        self.factory = name.startswith("aten::empty") or name.startswith("aten::new_empty")
        self.pins = name in ("aten::_pin_memory", "aten::pin_memory")
        # `*_like` and `new_*` ops take a tensor for its shape, dtype and device only: no read.
        self.meta_inputs = name.startswith("aten::new_") or (
            name.startswith("aten::") and name.endswith("_like")
        )
        self.copy = name in ("aten::copy_", "aten::_to_copy", "aten::to")
        self.arg_write = [bool(a.alias_info is not None and a.alias_info.is_write) for a in schema.arguments]
        self.arg_names = [a.name for a in schema.arguments]
        returns = list(schema.returns)
        self.fresh = any(r.alias_info is None for r in returns)
        if name == "aten::record_stream":
            self.kind = "record_stream"
        elif name.startswith("c10d::"):
            self.kind = "collective"
        elif name == "aten::set_":
            self.kind = "set"
        elif name in _SKIP:
            self.kind = "skip"
        elif returns and all(r.alias_info is not None for r in returns) and not any(self.arg_write):
            self.kind = "skip"  # views
        # The host ops issued inside an op outside aten (a custom op: its implementation waits
        # before it computes) come before its own work; an aten op's own sync comes after its
        # kernel (a host read: the copy, then the sync). As in the C++ recorder.
        self.syncs_first = not name.startswith("aten::") and self.kind not in ("collective", "record_stream")


_SKIP = {
    "aten::size", "aten::stride", "aten::sym_size", "aten::sym_stride", "aten::sym_numel",
    "aten::sym_storage_offset", "aten::is_pinned", "aten::is_same_size", "aten::dim",
    "aten::numel", "aten::is_contiguous", "aten::_version", "aten::output_nr",
    "aten::requires_grad_", "aten::retain_grad", "aten::set_data", "aten::data",
    "aten::_is_zerotensor", "aten::is_conj", "aten::is_neg", "aten::result_type",
    "aten::can_cast", "aten::promote_types", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::_unsafe_view", "aten::_reshape_alias", "aten::view", "aten::resolve_conj",
    "aten::resolve_neg",
    # In place, but on the tensor object alone (its sizes, strides, storage): no memory is read
    # or written, though the schemas mark `self` written (`set_`: see _set_grows). As in the C++
    # recorder.
    "aten::as_strided_", "aten::squeeze_", "aten::unsqueeze_", "aten::t_",
    "aten::transpose_", "aten::swapaxes_", "aten::swapdims_", "aten::detach_", "aten::rename_",
    "aten::_coalesced_",
    # A sparse tensor's metadata, kept on the tensor object.
    "aten::_nnz", "aten::is_coalesced", "aten::sparse_dim", "aten::dense_dim", "aten::_dimI",
    "aten::_dimV",
}


def _set_grows(args, kwargs) -> bool:
    """Whether an `aten::set_` call needs more bytes than its source storage holds (then PyTorch
    grows the storage: a new block, the old bytes copied on the current stream, the old block
    freed, and the call is recorded as any op is; else it changes the tensor object alone). As
    the C++ recorder's set_grows."""
    kwargs = kwargs or {}
    vals = list(args) + [kwargs[k] for k in ("source", "storage_offset", "size", "stride") if k in kwargs]
    if len(vals) < 4:
        return False
    try:
        self_t, source, offset, sizes = vals[0], vals[1], int(vals[2]), [int(x) for x in vals[3]]
        strides = [int(x) for x in vals[4]] if len(vals) > 4 else []
        storage = source.untyped_storage() if hasattr(source, "untyped_storage") else source
        nbytes = storage.nbytes()
        itemsize = self_t.element_size()
    except Exception:  # noqa: BLE001 - symbolic sizes, an unexpected overload: record it
        return True
    if strides and len(strides) != len(sizes):
        return True
    if not strides:
        strides, step = [0] * len(sizes), 1
        for d in range(len(sizes) - 1, -1, -1):
            strides[d] = step
            step *= max(sizes[d], 1)
    last = offset
    for n, st in zip(sizes, strides):
        if n == 0:
            return False
        if n < 0 or st < 0:
            return True
        last += (n - 1) * st
    return (last + 1) * itemsize > nbytes


class _Access:
    __slots__ = ("base", "offset", "bytes", "write", "device", "dev_index", "storage_bytes", "name", "storage",
                 "sparse_part")

    def __init__(self) -> None:
        self.name = None
        self.storage = None
        self.sparse_part = False  # one of a sparse tensor's index or value tensors


class PythonBackend:
    """Records ops with a TorchDispatchMode (the same ops as the C++ recorder writes)."""

    name = "python"
    native_syncs = False  # syncs come from torch.cuda._gpu_trace's Python callbacks

    def __init__(self, rec: "Recorder", fake_device: bool = False) -> None:
        import torch

        self.torch = torch
        self.rec = rec
        self.sites = Sites()
        self.fake_device = fake_device
        self.fake_stream = 0
        self.mu = threading.RLock()
        self.batch: list[str] = []
        self.host_values_allocated = False
        self.size = 0
        self.threshold = 4096  # lines
        self.infos: dict[Any, _OpInfo] = {}
        # base -> (quoted name, size, the storage holding the block: a weak reference, or None).
        # A pinned block is a buffer as long as one storage holds it: the host allocator hands
        # it out again without tracing the free, so another storage at a known address is a new
        # allocation (see `same_storage`).
        self.device_bufs: dict[int, tuple[str, int, Any]] = {}
        self.pinned_bufs: dict[int, tuple[str, int, Any]] = {}
        # Their bases in order, by pinned (see `overlapping`): the live buffers of a kind are
        # disjoint, so the ones an address range meets are found without a scan of them all.
        self.sorted_bases: dict[bool, list[int]] = {False: [], True: []}
        self.pending_allocs: dict[int, tuple[int, int, Optional[str]]] = {}  # ptr -> (stream, dev, site)
        self.streams: dict[int, str] = {}
        self.next_buf = 0
        self.fake_next_addr = _FAKE_ADDR_BASE
        self.fake_written: dict[int, tuple[int, str, int]] = {}  # tests: key -> (written, stream, size)
        self.fake_free: dict[tuple[str, int], list[int]] = {}  # tests: (stream, size) -> written, freed
        self.spare_names = {False: collections.deque(), True: collections.deque()}  # by pinned
        self.fake_pinned: set[int] = set()  # tests: CPU storages standing for pinned memory
        self.local = threading.local()
        self.counts = {"external_accesses": 0, "bad_regions": 0, "triton_launches": 0}
        self.mode = None
        # Whether a type is a traceable wrapper subclass (see `wraps`), and how many of their ops
        # are running now on all threads (see `call_subclass`).
        self.wrapper_types: dict[type, bool] = {}
        self.in_subclass = 0

    @property
    def counters(self) -> dict:
        return dict(
            self.counts,
            live_device_buffers=len(self.device_bufs),
            live_pinned_buffers=len(self.pinned_bufs),
        )

    # -- plumbing shared with the native backend's interface
    def frames(self) -> list:
        f = getattr(self.local, "frames", None)
        if f is None:
            f = self.local.frames = []
        return f

    def emit(self, line: str) -> None:
        with self.mu:
            self.batch.append(line)
            if len(self.batch) >= self.threshold:
                self.flush()

    def flush(self) -> None:
        with self.mu:
            if not self.batch:
                return
            data = "".join(self.batch).encode()
            self.batch = []
        self.rec._sink(data)

    def drain(self) -> bytes:
        with self.mu:
            data = "".join(self.batch).encode()
            self.batch = []
        return data

    def stream_id(self, raw: int, device: int = 0) -> str:
        s = self.streams.get(raw)
        if s is None:
            if raw == 0:
                s = _q("default" if device == 0 else f"default@cuda:{device}")
            else:
                s = _q(f"stream {raw:#x}")
            self.streams[raw] = s
        return s

    def name_stream(self, raw: int, name: str) -> None:
        self.streams.setdefault(raw, _q(name))

    def host_op(self, partial: str) -> None:
        line = partial + _site(self.sites.quoted(3))
        frames = self.frames()
        if frames:
            frames[-1][1].append(line)
        else:
            self.emit(line)

    def host_access(self, t, write: bool) -> bool:
        a = self.region(t, write)
        if a is None or a.device:
            return False
        with self.mu:
            if not self.resolve(a, self.sites.quoted(3)):
                return False
        line = ('{"op":"host_write","buffer":' if write else '{"op":"host_read","buffer":') + self.put(a)
        self._put_outside_ops(line + _site(self.sites.quoted(3)))
        return True

    def _put_outside_ops(self, line: str) -> None:
        """A line of what the program did outside the dispatcher: in the enclosing op's order, if
        one is running on this thread, else at once."""
        frames = self.frames()
        if frames:
            frames[-1][1].append(line)
        else:
            self.emit(line)

    def mark_used(self, t, stream: int, device: int) -> bool:
        """A device tensor's block marked used on `stream` outside the dispatcher (the autograd
        engine's `recordDataPtrOnStream`, see _EngineMarks): a `record_stream` of its buffer (of
        each of a sparse tensor's parts, as the engine marks them)."""
        if t.layout is not self.torch.strided:
            parts = self.sparse_parts(t)
            if parts is not None:
                return any([self.mark_used(p, stream, device) for p in parts])
        a = self.region(t, False)
        if a is None or not a.device:
            return False
        site = self.sites.quoted(3)
        with self.mu:
            if not self.resolve(a, site) or a.name.startswith('"ext '):
                return False
        self._put_outside_ops(_record_stream_line(a.name, self.stream_id(stream, device), site))
        return True

    # -- memory
    def is_pinned(self, t) -> bool:
        try:
            return t.is_pinned()
        except Exception:
            return False

    def region(self, t, write: bool) -> Optional[_Access]:
        torch = self.torch
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return None
        if t.is_cuda:
            device = True
        elif t.device.type == "cpu":
            if self.fake_device:
                device = True
            elif self.is_pinned(t):
                device = False
            else:
                return None
        else:
            return None
        try:
            st = t.untyped_storage()
            base = st.data_ptr()
        except Exception:
            return None
        if base == 0:
            return None
        if self.fake_device and base in self.fake_pinned:
            device = False
        try:
            if t.is_nested:
                # A nested tensor has no one shape (its components' sizes differ): the whole of
                # its buffer, which holds them all.
                offset, nbytes = 0, st.nbytes()
            else:
                extent = 1
                for n, s in zip(t.shape, t.stride()):
                    if s < 0:
                        return None
                    extent += (n - 1) * s
                offset, nbytes = t.storage_offset() * t.element_size(), extent * t.element_size()
        except Exception:
            return None
        a = _Access()
        a.base = base
        a.offset = offset
        a.bytes = nbytes
        a.write = write
        a.device = device
        a.dev_index = t.device.index or 0 if t.is_cuda else 0
        a.storage_bytes = st.nbytes()
        a.storage = st
        return a

    def free_buf(self, base: int, pinned: bool, site: str) -> None:
        """Writes the free of a live buffer and forgets it; its name waits to be given again."""
        name = (self.pinned_bufs if pinned else self.device_bufs).pop(base)[0]
        bases = self.sorted_bases[pinned]
        i = bisect.bisect_left(bases, base)
        if i == len(bases) or bases[i] != base:  # (both change together, here and in new_alloc)
            raise RuntimeError(f"streamsan: the Python recorder's index of live buffers lacks {base:#x}")
        del bases[i]
        self.batch.append('{"op":"free","buffer":%s%s' % (name, _site(site)))
        self.spare_names[pinned].append(name)
        if not pinned and base in self.fake_written:
            written, stream, size = self.fake_written.pop(base)
            self.fake_free.setdefault((stream, size), []).append(written)

    def host_values(self) -> str:
        """The host memory that values copied from the device land in (allocated once)."""
        if not self.host_values_allocated:
            self.host_values_allocated = True
            self.batch.append(_HOST_VALUES_ALLOC)
        return _HOST_VALUES

    def new_name(self, pinned: bool) -> str:
        """A fresh name, or one freed more than NAME_DELAY frees ago."""
        spare = self.spare_names[pinned]
        if len(spare) > NAME_DELAY:
            return spare.popleft()
        self.next_buf += 1
        return _q(("h" if pinned else "d") + str(self.next_buf))

    @staticmethod
    def same_storage(entry: tuple, storage) -> bool:
        """Whether a live buffer is still held by `storage` (always, when its owner is unknown)."""
        owner = entry[2]
        return owner is None or storage is None or owner() is storage

    def overlapping(self, addr: int, size: int, pinned: bool) -> list[int]:
        """The bases of the live buffers of a kind whose bytes (at least one, for an empty
        buffer) meet [addr, addr + size), in the order they were allocated. Live buffers of a kind
        never meet (`new_alloc` frees those a new one meets), so walking down from the last base
        below the range's end, the first buffer that ends at or before `addr` is the last one to
        look at: O(log n) a call where a scan of every live buffer made a long check quadratic."""
        bufs = self.pinned_bufs if pinned else self.device_bufs
        bases = self.sorted_bases[pinned]
        found = []
        j = bisect.bisect_left(bases, addr + size) - 1
        while j >= 0:
            base = bases[j]
            if base + max(bufs[base][1], 1) <= addr:
                break
            found.append(base)
            j -= 1
        if len(found) > 1:
            meets = set(found)
            found = [b for b in bufs if b in meets]  # the order of allocation (rare: a scan)
        return found

    def containing(self, addr: int, pinned: bool) -> Optional[int]:
        """The base of the live buffer of a kind whose bytes hold `addr`, or None: the one with
        the last base at or below it (live buffers never meet)."""
        bases = self.sorted_bases[pinned]
        j = bisect.bisect_right(bases, addr) - 1
        if j >= 0:
            bufs = self.pinned_bufs if pinned else self.device_bufs
            if addr < bases[j] + bufs[bases[j]][1]:
                return bases[j]
        return None

    def new_alloc(self, addr: int, size: int, pinned: bool, stream: str, site: str, storage=None) -> str:
        bufs = self.pinned_bufs if pinned else self.device_bufs
        for base in self.overlapping(addr, size, pinned):
            self.free_buf(base, pinned, site)
        name = self.new_name(pinned)
        mem = ',"memory":"pinned"' if pinned else ',"stream":' + stream
        written = addr
        if self.fake_device and storage is not None and not pinned:
            # Tests (fake device): a CPU storage standing for device memory is written with an
            # address of the recorder's (its own stays the key here). The CPU allocator hands an
            # address freed on one stream to another stream at once, where the caching allocator
            # gives a block back to the stream that allocated it, and to another stream only
            # through the driver, which synchronizes the device (the spec's rule for device
            # memory seen again on another stream). So an address freed is written again for the
            # same size on the same stream only, as the caching allocator reuses its blocks.
            spare = self.fake_free.get((stream, size))
            if spare:
                written = spare.pop()
            else:
                written = self.fake_next_addr
                self.fake_next_addr += (max(size, 1) + 511) // 512 * 512
            self.fake_written[addr] = (written, stream, size)
        self.batch.append(
            '{"op":"alloc","buffer":%s,"bytes":%d%s,"addr":%d%s' % (name, size, mem, written, _site(site))
        )
        owner = None
        if storage is not None and (pinned or self.fake_device):
            try:
                owner = weakref.ref(storage)
            except TypeError:
                owner = None
        if addr not in bufs:  # (an empty buffer's base may be a live one's: the entry is replaced)
            bisect.insort(self.sorted_bases[pinned], addr)
        bufs[addr] = (name, size, owner)
        return name

    def resolve(self, a: _Access, site: str = "null") -> bool:
        """Finds an access's buffer (sets `a.name`); False when it cannot be written. Pinned
        memory that no known buffer holds (a block handed out again to another storage, memory
        pinned on another thread or before the check) is allocated here, at its first use."""
        bufs = self.device_bufs if a.device else self.pinned_bufs
        hit = bufs.get(a.base)
        if hit is None and a.device and a.base in self.pending_allocs:
            stream, dev, alloc_site = self.pending_allocs.pop(a.base)
            self.new_alloc(a.base, a.storage_bytes, False, self.stream_id(stream, dev), alloc_site or "null")
            hit = bufs.get(a.base)
        if not a.device and a.storage is not None and (hit is None or not self.same_storage(hit, a.storage)):
            self.new_alloc(a.base, a.storage_bytes, True, "null", site, a.storage)
            hit = bufs.get(a.base)
        if hit is None:
            inside = self.containing(a.base, not a.device)
            if inside is not None:
                a.offset += a.base - inside
                hit = bufs[inside]
        if hit is None:
            if not a.device:
                return False
            a.name = _q(f"ext {a.base:#x}")
            self.counts["external_accesses"] += 1
            return True
        name, n = hit[0], hit[1]
        if a.offset + a.bytes > n:
            self.counts["bad_regions"] += 1
            if a.offset >= n:
                return False
            a.bytes = n - a.offset
        a.name = name
        return True

    @staticmethod
    def put(a: _Access) -> str:
        return '{"buffer":%s,"offset":%d,"bytes":%d}' % (a.name, a.offset, a.bytes)

    @staticmethod
    def merge_region(used: list, a: _Access) -> None:
        """Adds `a` unless its region is listed already (then written when either writes): each
        region of an op once."""
        dup = next((u for u in used if u.base == a.base and u.offset == a.offset and u.bytes == a.bytes), None)
        if dup is not None:
            dup.write = dup.write or a.write
        else:
            used.append(a)

    def launch_line(self, sid: str, name: str, used: list, site: str) -> str:
        """A kernel's `launch` on `sid` named `name` (both quoted) with the regions of `used`
        (resolved)."""
        reads = ",".join(self.put(a) for a in used if not a.write)
        writes = ",".join(self.put(a) for a in used if a.write)
        line = '{"op":"launch","stream":%s,"name":%s' % (sid, name)
        if reads:
            line += ',"reads":[' + reads + "]"
        if writes:
            line += ',"writes":[' + writes + "]"
        return line + _site(site)

    def on_alloc(self, ptr: int) -> None:
        torch = self.torch
        try:
            dev = torch.cuda.current_device()
            stream = torch._C._cuda_getCurrentRawStream(dev)
        except Exception:
            dev, stream = 0, 0
        self.pending_allocs[ptr] = (stream, dev, self.sites.quoted(3))

    def issued_before(self) -> None:
        """What this thread issued inside the op it is running (an event wait) comes before
        what the allocator does now (a free): written first. A collective keeps what it issued
        after the wait that hands its work to the process group's stream (the events standing
        for its kernel's end) for after its own launch, and remembers that stream (as the C++
        recorder's `flush_pending_locked`). `mu` held."""
        frames = self.frames()
        if not frames or not frames[-1][1]:
            return
        entry = frames[-1]
        if entry[4]:
            self.flush_subclass_frames()
            return
        pending = entry[1]
        n = len(pending)
        if entry[2] is not None:
            if entry[3] is None:
                waiting, past = _collective_stream(pending, self.stream_id(entry[2][0], entry[2][1]))
                if waiting is not None:
                    entry[3], n = waiting, past
            else:
                n = 0
        self.batch.extend(pending[:n])
        del pending[:n]

    def on_free(self, ptr: int) -> None:
        with self.mu:
            self.pending_allocs.pop(ptr, None)
            if ptr in self.device_bufs:
                self.issued_before()
                self.free_buf(ptr, False, self.sites.quoted(3))

    def fake_trace(self, alloc: bool, addr: int, size: int, stream: int, pool: bool = False) -> None:
        """Tests: an allocation or a free of the caching allocator (its exact size and stream;
        `pool` is what the C++ recorder's tracker knows, not this backend)."""
        if not self.fake_device:
            return
        with self.mu:
            self.issued_before()
            if alloc:
                self.new_alloc(addr, size, False, self.stream_id(stream, 0), "null")
            elif addr in self.device_bufs:
                self.free_buf(addr, False, "null")

    def fake_pin(self, t) -> None:
        """Tests: the CPU tensor `t` (allocated while the recorder was off) stands for a pinned
        block allocated now."""
        base = t.untyped_storage().data_ptr()
        with self.mu:
            self.fake_pinned.add(base)
            st = t.untyped_storage()
            known = self.pinned_bufs.get(base)
            if known is None or not self.same_storage(known, st):
                self.new_alloc(base, st.nbytes(), True, "null", self.sites.quoted(3), st)

    # -- ops
    def info(self, func) -> _OpInfo:
        i = self.infos.get(func)
        if i is None:
            i = self.infos[func] = _OpInfo(func)
        return i

    def collect(self, v, write: bool, out: list, frame: dict) -> None:
        torch = self.torch
        if isinstance(v, torch.Tensor):
            inner = self.inner_tensors(v)
            if inner is not None:
                # A wrapper subclass (DTensor, …): the op touches the tensors it wraps.
                for t in inner:
                    self.collect(t, write, out, frame)
                return
            if v.layout is not torch.strided:
                parts = self.sparse_parts(v)
                if parts is not None:
                    # A sparse tensor: the op touches its indices and values, which its kernels
                    # read and write outside the dispatcher (no mode sees them). Written, it is
                    # its values that are (an op that gives it new indices gives it new tensors,
                    # which the op's output shows).
                    n = len(out)
                    for i, t in enumerate(parts):
                        self.collect(t, write and i == len(parts) - 1, out, frame)
                    for a in out[n:]:
                        a.sparse_part = True
                    return
            a = self.region(v, write)
            if a is not None:
                if a.device and not frame["any_device"]:
                    frame["any_device"] = True
                    frame["device"] = a.dev_index
                out.append(a)
        elif isinstance(v, (list, tuple)):
            for x in v:
                self.collect(x, write, out, frame)

    def sparse_parts(self, t) -> Optional[list]:
        """The dense tensors a sparse tensor is made of (COO: indices and values; compressed
        layouts: their two index tensors and values), or None for another layout."""
        torch = self.torch
        try:
            layout = t.layout
            if layout is torch.sparse_coo:
                return [t._indices(), t._values()]
            if layout in (torch.sparse_csr, torch.sparse_bsr):
                return [t.crow_indices(), t.col_indices(), t.values()]
            if layout in (torch.sparse_csc, torch.sparse_bsc):
                return [t.ccol_indices(), t.row_indices(), t.values()]
        except Exception:  # noqa: BLE001 - a tensor whose parts cannot be read: none recorded
            return []
        return None

    def inner_tensors(self, t) -> Optional[list]:
        """The tensors a traceable wrapper subclass (DTensor's local shard, …) holds, or None
        for a tensor with storage of its own."""
        if type(t) is self.torch.Tensor or type(t) is self.torch.nn.Parameter:
            return None
        flatten = getattr(t, "__tensor_flatten__", None)
        if flatten is None:
            return None
        try:
            attrs, _ = flatten()
            return [getattr(t, a) for a in attrs]
        except Exception:
            return None

    def wraps(self, types) -> bool:
        """Whether an op's overloaded types (those with a `__torch_dispatch__` of their own) include
        a traceable wrapper subclass (torch's `is_traceable_wrapper_subclass_type`: NJT, DTensor,
        AsyncCollectiveTensor, …; none where this torch lacks it)."""
        known = self.wrapper_types
        for t in types:
            w = known.get(t)
            if w is None:
                try:
                    from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type
                except ImportError:
                    w = False
                else:
                    w = bool(is_traceable_wrapper_subclass_type(t))
                known[t] = w
            if w:
                return True
        return False

    def in_subclass_op(self, func, types) -> bool:
        """While this thread runs an op of a wrapper subclass (`call_subclass`): True for that op
        come back to the mode (the mode then returns NotImplemented, and torch hands the op to the
        subclass); else the op is one the subclass issued, counted as seen."""
        local = self.local
        handed = getattr(local, "handing", None)
        if handed is not None:
            local.handing = None  # only the first op the mode sees is the op itself
            if handed is func:
                return True
        if getattr(local, "subclass_depth", 0) and not (types and self.wraps(types)):
            local.seen = getattr(local, "seen", 0) + 1
        return False

    def call_subclass(self, func, args, kwargs) -> tuple:
        """Runs an op on a traceable wrapper subclass with the mode pushed again (torch pops a mode
        while its `__torch_dispatch__` runs): the op comes back to the mode, which returns
        NotImplemented for it (`in_subclass_op`); torch's dispatch then calls the subclass's
        `__torch_dispatch__` (or DTensor's dispatcher) with the mode on the stack, so the ops it
        issues on the plain tensors it holds come to the mode and are recorded as any op is.
        Returns the op's value and how many of those ops the mode saw (0: the subclass ran them
        where no mode sees them, `no_dispatch()`: the caller records the op itself)."""
        local = self.local
        before = getattr(local, "seen", 0)
        local.subclass_depth = getattr(local, "subclass_depth", 0) + 1
        with self.mu:
            self.in_subclass += 1
        local.handing = func
        try:
            with self.mode:
                out = func(*args, **kwargs)
        finally:
            local.handing = None
            local.subclass_depth -= 1
            with self.mu:
                self.in_subclass -= 1
        return out, getattr(local, "seen", 0) - before

    def flush_subclass_frames(self) -> None:
        """What this thread issued inside the wrapper subclass ops it is running, outside the ops
        they issued (the frames of `call_subclass`), written now: before the op about to be
        written, which came after them. `mu` held."""
        for entry in self.frames():
            if entry[4] and entry[1]:
                self.batch.extend(entry[1])
                del entry[1][:]

    def dispatch(self, func, types, args, kwargs):
        if self.in_subclass and self.in_subclass_op(func, types):
            return NotImplemented
        info = self.info(func)
        if info.kind == "skip" or not self.rec.on or (info.kind == "set" and not _set_grows(args, kwargs)):
            return func(*args, **(kwargs or {}))
        marks = self.rec.engine_marks
        # The autograd engine summing gradients: its marks first (see _EngineMarks).
        engine_sum = marks is not None and marks.accumulating_guarded(func, args, kwargs)
        frame = {"any_device": False, "device": 0}
        ins: list[_Access] = []
        non_blocking = False
        kwargs = kwargs or {}
        for i, v in enumerate(args):
            if info.meta_inputs:
                break
            w = info.arg_write[i] if i < len(info.arg_write) and info.kind != "record_stream" else False
            self.collect(v, w, ins, frame)
        for k, v in kwargs.items():
            if k == "non_blocking":
                non_blocking = bool(v)
                continue
            if info.meta_inputs:
                continue
            try:
                w = info.arg_write[info.arg_names.index(k)] and info.kind != "record_stream"
            except ValueError:
                w = False
            self.collect(v, w, ins, frame)
        if info.copy and "non_blocking" in info.arg_names:
            i = info.arg_names.index("non_blocking")
            if i < len(args):
                non_blocking = bool(args[i])
        torch = self.torch
        stream = None  # the op's stream, once known
        if info.kind == "record_stream":
            stream = _raw_stream(torch, args[1] if len(args) > 1 else kwargs.get("s"))[0] or 0
        elif frame["any_device"]:
            stream = self.current_stream(frame["device"])
        site = self.sites.quoted(4)
        frames = self.frames()
        pending: list[str] = []
        # An op on a traceable wrapper subclass (NJT, DTensor, …) is recorded as the ops its
        # `__torch_dispatch__` issues on the tensors it holds, as the C++ recorder sees them (an
        # NJT's `nt * 2` is `mul` of its values: its offsets, shared by the result, are not
        # written). Record streams and collectives keep their own handling.
        subclass = bool(types) and info.kind == "normal" and self.wraps(types)
        # [site, host ops issued inside, a collective's (raw stream, device), the stream its
        # wait named once written (see issued_before), a wrapper subclass's op (call_subclass)]
        entry = [site, pending, (stream or 0, frame["device"]) if info.kind == "collective" else None, None, subclass]
        frames.append(entry)
        try:
            if subclass:
                out, seen = self.call_subclass(func, args, kwargs)
            else:
                out = func(*args, **kwargs)
        finally:
            frames.pop()
        if engine_sum:
            marks.summed(out)
        if subclass:
            if seen:
                with self.mu:
                    self.flush_subclass_frames()
                    self.batch.extend(pending)
                    self._maybe_flush()
                return out
            # The subclass's ops were not seen: the op is recorded as touching the tensors the
            # wrappers hold (`collect`), and counts as seen for a wrapper op around it.
            local = self.local
            local.seen = getattr(local, "seen", 0) + 1
        outs: list[_Access] = []
        if info.kind != "record_stream":
            self.collect(out, True, outs, frame)
            if any(o.sparse_part for o in outs):
                # A sparse tensor the op writes and returns with new values (`s.add_(t)`,
                # `zero_`, `copy_` of COO tensors: new index and value tensors) had its old
                # values read, not written: the program may still hold them (`_values()`, the
                # `v` it was made of).
                kept = {o.base for o in outs if o.sparse_part}
                for a in ins:
                    if a.sparse_part and a.write and a.base not in kept:
                        a.write = False
                # A new sparse tensor made of tensors the op was given (`sparse_coo_tensor(i,
                # v)`) does not write them.
                read = {a.base for a in ins if not a.write}
                outs = [o for o in outs if not (o.sparse_part and o.base in read)]
        if stream is None:
            # Device memory only among the outputs (a factory, a copy from pinned memory to a new
            # device tensor): the op ran on the stream current now.
            stream = self.current_stream(frame["device"]) if frame["any_device"] else 0
        with self.mu:
            if self.in_subclass and frames:  # (a wrapper subclass's frame: only while one runs)
                self.flush_subclass_frames()
            lines = self.batch
            sid = self.stream_id(stream, frame["device"])
            if info.fresh or info.factory:
                for o in outs:
                    if o.device and not self.fake_device:
                        continue
                    if any(a.base == o.base for a in ins):
                        continue
                    bufs = self.device_bufs if o.device else self.pinned_bufs
                    known = bufs.get(o.base)
                    # The same storage seen again, or (pinned) a block handed out again.
                    if known is not None and self.same_storage(known, o.storage):
                        continue
                    self.new_alloc(o.base, o.storage_bytes, not o.device, sid, site, o.storage)
            if info.factory:
                if self.rec.graphs.capturing:
                    # During a capture the allocation is a pool buffer of the capture: written
                    # now, before the capture ends, not at the buffer's first use.
                    for o in outs:
                        if o.device and o.base in self.pending_allocs:
                            self.resolve(o, site)
                lines.extend(pending)
                self._maybe_flush()
                return out
            used: list[_Access] = []
            for a in ins + outs:
                self.merge_region(used, a)
            used = [a for a in used if self.resolve(a, site)]
            if info.kind == "record_stream":
                for a in used:
                    if a.name.startswith('"ext '):
                        continue
                    lines.append(_record_stream_line(a.name, sid, site))
                lines.extend(pending)
            else:
                split = 0
                if info.kind == "collective" and entry[3] is not None:
                    sid = entry[3]
                elif info.kind == "collective":
                    waiting, split = _collective_stream(pending, sid)
                    if waiting is not None:
                        sid = waiting
                    lines.extend(pending[:split])
                host_value = False
                if info.syncs_first:
                    lines.extend(pending[split:])
                    split = len(pending)
                if used and frame["any_device"]:
                    lines.append(self.launch_line(sid, info.name, used, site))
                    # A value the host takes from device memory and waits for (`.item()`,
                    # `.cpu()`, `print(t)`): a copy into host memory, the synchronization, and
                    # the host's read of what was copied — the sync is what makes the value
                    # there, needed by construction.
                    host_value = not any(a.write for a in used) and any(p.startswith(_HOST_SYNCS) for p in pending[split:])
                    if host_value:
                        lines.append(
                            '{"op":"launch","stream":%s,"name":%s,"writes":[%s]%s'
                            % (sid, info.name, self.host_values(), _site(site))
                        )
                    if info.copy and non_blocking:
                        for a in used:
                            if not a.device:
                                lines.append(_record_stream_line(a.name, sid, site))
                else:
                    for a in used:
                        op = "host_write" if a.write else "host_read"
                        lines.append('{"op":"%s","buffer":%s%s' % (op, self.put(a), _site(site)))
                lines.extend(pending[split:])
                if host_value:
                    lines.append('{"op":"host_read","buffer":%s%s' % (_HOST_VALUES, _site(site)))
            self._maybe_flush()
        return out

    def record_kernel(self, name: str, stream: int, device: int, accesses: list) -> bool:
        """A kernel launched outside the dispatcher (a Triton kernel) on the raw stream `stream`,
        with `accesses` = [(tensor, read, write)]: a `launch` of its regions, after the host ops
        the op around it issued before it."""
        used: list[_Access] = []
        for t, read, write in accesses:
            a = self.region(t, bool(write)) if (read or write) else None
            if a is not None:
                self.merge_region(used, a)
        site = self.sites.quoted(3)
        with self.mu:
            self.issued_before()
            self.counts["triton_launches"] += 1
            used = [a for a in used if self.resolve(a, site)]
            self.batch.append(self.launch_line(self.stream_id(stream, device), _q(name), used, site))
            self._maybe_flush()
        return True

    def current_stream(self, device: int) -> int:
        if self.fake_device:
            return self.fake_stream
        return self.torch._C._cuda_getCurrentRawStream(device)

    def _maybe_flush(self) -> None:
        if len(self.batch) >= self.threshold:
            self.flush()

    def start(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        backend = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return backend.dispatch(func, types, args, kwargs)

        self.mode = _Mode()
        self.mode.__enter__()

    def stop(self) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None


# ----------------------------------------------------------------------------------------------
# The native backend


# A pinned tensor, made once per process: the C++ recorder tells pinned memory by its deleter.
_PINNED_EXAMPLE: Any = None

# Bytes of JSON Lines (about a hundred ops) after which the C++ recorder hands its batch to the
# checker's queue: small enough that the checker works beside the program rather than after it
# (what is left to check when the program ends is at most one batch), large enough that the
# hand-overs cost nothing measurable (one copy into the queue; the checker's thread is not woken
# for each, docs/performance.md, "The checker beside the program").
BATCH_BYTES = 16 << 10


class NativeBackend:
    """Records ops with the C++ recorder (RecordFunction observer + allocator trace tracker)."""

    name = "native"

    def __init__(self, rec: "Recorder", fake_device: bool = False, profile: Optional[str] = None) -> None:
        import torch

        self.ext = _native.load()
        self.rec = rec
        self.sites = rec.sites  # one per check: the Python-level sites share its cache
        self.fake_device = fake_device
        global _PINNED_EXAMPLE
        cuda = rec.cuda
        if cuda and _PINNED_EXAMPLE is None:
            _PINNED_EXAMPLE = torch.empty(1, pin_memory=True)  # its deleter is the host allocator's
        pinned = _PINNED_EXAMPLE if cuda else None
        sites = self.sites
        # In one call: where the user's code is (what is known of code objects holds from one
        # check to the next while these are the same), the sink, and every buffer, name and
        # counter of the previous check forgotten.
        self.ext.open_check(
            sites.torch_dir, sites.own_dir, sites.cwd, BATCH_BYTES, rec._sink, fake_device, pinned,
            sites.stdlib_dir, sites.libraries, list(sites.internal_dirs), sites.rewritten,
        )
        self.cuda = cuda
        self.host_op = self.ext.host_op
        self.host_access = self.ext.host_access
        self.name_stream = self.ext.name_stream
        self.stream_id = self.ext.stream_id
        self.drain = self.ext.drain
        self.fake_pin = self.ext.fake_pin
        self.fake_trace = self.ext.fake_trace
        self.record_kernel = self.ext.record_kernel
        self.record_triton = self.ext.record_triton
        self.on_alloc = None
        self.on_free = None
        # Events, waits and syncs straight from c10's GPU trace, in C++ (where this torch's
        # interface is supported), else from torch.cuda._gpu_trace's Python callbacks.
        self.native_syncs = bool(self.ext.native_syncs())
        self.gpu_trace_replaced = False
        self.profiling = _profile_mode(profile)

    @property
    def counters(self) -> dict:
        c = dict(self.ext.counters())
        c["native_syncs"] = self.native_syncs
        if self.profiling is not None and hasattr(self.ext, "profile"):
            c.update({f"profile_{k}": v for k, v in self.ext.profile().items()})
        return c

    def start(self) -> None:
        # Records written off the program's thread (the default), or on it (STREAMSAN_DEFER=0:
        # for benchmarks); `all`: the fake device's ops too (tests and CPU benchmarks whose
        # tensors outlive the check: see State::defer_fake in the recorder). STREAMSAN_CALLEES:
        # every op observed, the ops other ops call included (the default, `all`); `learn`: an op
        # learned to need nothing of its callees hides them (see "Quiet callees" in the recorder
        # and docs/pytorch.md).
        env = os.environ
        defer = env.get("STREAMSAN_DEFER", "1").strip().lower()
        quiet = env.get("STREAMSAN_CALLEES", "").strip().lower() == "learn"
        profile = 0 if self.profiling is None else (2 if self.profiling == "observe" else 1)
        # STREAMSAN_PINNED=at-once: records of ops on pinned memory written on the program's
        # thread (as before they were queued; for comparison and debugging).
        at_once = env.get("STREAMSAN_PINNED", "").strip().lower() == "at-once"
        # In one call: the frame walk checked (sites without the GIL where this interpreter's
        # walk agrees with its API here), the observer and the tracker installed, c10's GPU
        # trace taken, the checker's queue given (the raw sink), recording on.
        self.ext.begin_recording(
            self.cuda, profile, self.native_syncs, defer != "0", defer == "all", quiet, self.rec.raw_sink,
            pinned_at_once=at_once,
        )

    def stop(self) -> dict:
        """Ends the recording; returns the counts the check's end warns about."""
        # In one call: recording off; what is queued written and handed to the checker batch by
        # batch (it checks the first while the rest are written) where it takes them, else left
        # for `drain`; the raw sink let go of (after a hand-over in progress); c10's GPU trace
        # put back; the observer taken off the dispatcher (no RecordFunction cost once the check
        # is over); and nothing of this check kept alive by the extension (the Run holding its
        # sink goes when its user lets it go, and its report's temporary copy of the ops with it).
        ours, errors, external, unread, first = self.ext.end_recording(
            self.rec.raw_sink is not None, self.native_syncs
        )
        if not ours:
            self.gpu_trace_replaced = True
        return {
            "resolver_errors": errors,
            "external_accesses": external,
            "unread_ops": unread,
            "first_unread": first,
        }


def _profile_mode(value: Optional[str] = None) -> str | None:
    """`value`, else STREAMSAN_PROFILE: `1` counts the C++ recorder's time per stage
    (Run.stats(): `recorder_profile_*`); `observe` also makes its callbacks return at once,
    recording nothing (the cost of being called at all: nothing is checked)."""
    v = (os.environ.get("STREAMSAN_PROFILE", "") if value is None else value).strip().lower()
    if v in ("", "0", "no", "off", "false"):
        return None
    return "observe" if v == "observe" else "stages"


# ----------------------------------------------------------------------------------------------
# Synchronizations: torch.cuda._gpu_trace callbacks (registered once; they cannot be removed)


def _ev(e: int) -> str:
    return '"ev %#x"' % e


def _syncs_recorder() -> Optional["Recorder"]:
    """The recorder Python's sync callbacks feed now: the one recording, unless its backend
    takes the syncs from the GPU trace itself (the C++ recorder's)."""
    r = _active
    if r is not None and r.on and not r.backend.native_syncs:
        return r
    return None


def _cb_record(event: int, stream: int) -> None:
    r = _syncs_recorder()
    if r is not None:
        b = r.backend
        b.host_op('{"op":"event_record","event":%s,"stream":%s' % (_ev(event), b.stream_id(stream, r.device())))


def _cb_wait(event: int, stream: int) -> None:
    r = _syncs_recorder()
    if r is not None:
        b = r.backend
        b.host_op('{"op":"event_wait","stream":%s,"event":%s' % (b.stream_id(stream, r.device()), _ev(event)))


def _cb_event_sync(event: int) -> None:
    r = _syncs_recorder()
    if r is not None:
        r.backend.host_op('{"op":"event_sync","event":%s' % _ev(event))


def _cb_stream_sync(stream: int) -> None:
    r = _syncs_recorder()
    if r is not None:
        b = r.backend
        b.host_op('{"op":"stream_sync","stream":%s' % b.stream_id(stream, r.device()))


def _cb_device_sync() -> None:
    r = _syncs_recorder()
    if r is not None:
        r.backend.host_op('{"op":"device_sync","device":%d' % r.device())


def _cb_alloc(ptr: int) -> None:
    r = _active
    if r is not None and r.on and r.backend.on_alloc is not None:
        r.backend.on_alloc(ptr)


def _cb_free(ptr: int) -> None:
    r = _active
    if r is not None and r.on and r.backend.on_free is not None:
        r.backend.on_free(ptr)


def _register_callbacks(allocations: bool) -> None:
    global _callbacks_registered, _alloc_callbacks_registered
    import torch

    if not torch.cuda.is_available():
        return
    import torch.cuda._gpu_trace as gt
    if not _callbacks_registered:
        torch._C._activate_gpu_trace()
        gt.register_callback_for_event_record(_cb_record)
        gt.register_callback_for_event_wait(_cb_wait)
        gt.register_callback_for_event_synchronization(_cb_event_sync)
        gt.register_callback_for_stream_synchronization(_cb_stream_sync)
        gt.register_callback_for_device_synchronization(_cb_device_sync)
        _callbacks_registered = True
    if allocations and not _alloc_callbacks_registered:
        gt.register_callback_for_memory_allocation(_cb_alloc)
        gt.register_callback_for_memory_deallocation(_cb_free)
        _alloc_callbacks_registered = True


# ----------------------------------------------------------------------------------------------
# Wrappers of what the callbacks do not report


class _Kept:
    """A method of a class wrapped by a check and, where every part of the process is checked
    (`_KEEP_WRAPPERS`: `pytest --streamsan`), left in place between checks: calls go straight
    to the method it replaced unless a check listens (`listener`: the wrapper that check made of
    it). Patching a class and putting it back at every check modifies it twice a check, and
    CPython (3.13 and later) gives a class no new version tag after 1,000 (a modification
    followed by an attribute lookup takes one): its attributes are looked up the slow way for the
    rest of the process. For torch.Tensor that is every attribute read of every tensor, after
    some 500 checks (docs/pytorch.md, "What a check leaves in the process")."""

    def __init__(self, owner: Any, attr: str) -> None:
        self.owner = owner
        self.attr = attr
        self.saved = owner.__dict__.get(attr, _INHERITED)  # what put_back restores
        orig = getattr(owner, attr)
        self.orig = orig
        self.listener: Optional[Callable] = None
        # The listener made of `orig` for a check, and its maker: the next check whose maker is
        # the same listens with it again (see _Patches.keep_inherited).
        self.made: Optional[Callable] = None
        self.made_by: Optional[Callable] = None
        kept = self

        @functools.wraps(orig)
        def method(self, *args, **kwargs):
            f = kept.listener
            return orig(self, *args, **kwargs) if f is None else f(self, *args, **kwargs)

        self.method = method

    def put_back(self) -> None:
        """The class as it was, where the wrapper is still in place; no longer kept."""
        self.listener = None
        key = (self.owner, self.attr)
        if self.owner.__dict__.get(self.attr) is self.method:
            _put_back(self.owner, self.attr, self.saved)
            _PUT_BACK[key] = self
        if _KEPT.get(key) is self:
            del _KEPT[key]


# (owner, attribute) -> the _Kept wrapper made for it (see _Patches.keep_inherited).
_KEPT: dict[tuple[Any, str], _Kept] = {}
# (owner, attribute) -> the _Kept wrapper last put back: the next check that wraps the method
# puts it on again where it still fits, rather than make a wrapper at every check.
_PUT_BACK: dict[tuple[Any, str], _Kept] = {}


def release_kept_methods() -> None:
    """Puts back the methods checks left wrapped (`_Kept`) where their wrappers are still in
    place, but not one a running check listens to: the classes are as they were."""
    for kept in list(_KEPT.values()):
        if kept.listener is None:
            kept.put_back()


class _Patches:
    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []
        self.listening: list[_Kept] = []
        self.closers: list[Callable[[], None]] = []  # run first at restore (hooks to remove)

    def patch(self, owner, attr: str, make: Callable[[Any], Any]) -> None:
        orig = owner.__dict__.get(attr)
        if orig is None:
            return
        self.saved.append((owner, attr, orig))
        setattr(owner, attr, make(orig))

    def patch_inherited(self, owner, attr: str, make: Callable[[Any], Any]) -> bool:
        """Like `patch`, for a method `owner` may inherit (set on `owner`, removed at restore
        when it was not its own); False when there is no such method."""
        own = attr in owner.__dict__
        orig = getattr(owner, attr, None)
        if orig is None or not callable(orig):
            return False
        self.saved.append((owner, attr, owner.__dict__[attr] if own else _INHERITED))
        setattr(owner, attr, make(orig))
        return True

    def keep_inherited(self, owner, attr: str, make: Callable[[Any], Any]) -> bool:
        """Like `patch_inherited`, for a method read so often that its class should not change at
        every check (see `_Kept`): this check's wrapper, `make(orig)`, listens to a wrapper
        made once; `restore` stops it listening, and puts the method back unless every part of
        the process is checked (`_KEEP_WRAPPERS`). False when there is no such method. The
        listener is made again only when `make` is another than the last check's."""
        key = (owner, attr)
        kept = _KEPT.get(key)
        if kept is None or owner.__dict__.get(attr) is not kept.method:
            # The first check, or the method replaced since (by the program): the wrapper
            # wraps what is there now (the one last put back, where that is what it wraps).
            kept = _PUT_BACK.get(key)
            if (
                kept is None
                or owner.__dict__.get(attr, _INHERITED) is not kept.saved
                or getattr(owner, attr, None) is not kept.orig
            ):
                if not callable(getattr(owner, attr, None)):
                    return False
                kept = _Kept(owner, attr)
            _KEPT[key] = kept
            setattr(owner, attr, kept.method)
        if kept.made_by is not make:
            kept.made, kept.made_by = make(kept.orig), make
        kept.listener = kept.made
        self.listening.append(kept)
        return True

    def restore(self) -> None:
        """Every wrapper off (or, kept, no longer listening), each on its own: one that cannot be
        put back does not keep the others on; the first failure is raised at the end."""
        failed: Optional[BaseException] = None
        closers, self.closers = self.closers, []
        for close in closers:
            try:
                close()
            except BaseException as e:  # noqa: BLE001 - raised below, after the others
                failed = failed or e
        listening, self.listening = self.listening, []
        for kept in listening:
            kept.listener = None
            if not _KEEP_WRAPPERS and _KEPT.get((kept.owner, kept.attr)) is kept:
                try:
                    kept.put_back()
                except BaseException as e:  # noqa: BLE001 - raised below, after the others
                    failed = failed or e
        saved, self.saved = self.saved, []
        for owner, attr, orig in reversed(saved):
            try:
                _put_back(owner, attr, orig)
            except BaseException as e:  # noqa: BLE001 - raised below, after the others
                failed = failed or e
        if failed is not None:
            raise failed


_INHERITED = object()  # a patched method that was inherited: restored by deleting the patch


def _put_back(owner: Any, attr: str, saved: Any) -> None:
    """`owner.attr` as it was: `saved`, or none of its own where it inherited it (`_INHERITED`)."""
    if saved is not _INHERITED:
        setattr(owner, attr, saved)
    elif attr in owner.__dict__:
        delattr(owner, attr)


def _current_stream_capturing(torch) -> bool:
    """Whether the current CUDA stream is capturing a graph (False with a torch that cannot say)."""
    f = getattr(torch.cuda, "is_current_stream_capturing", None)
    return bool(f()) if f is not None else False


def _install_graph_patches(rec: "Recorder", p: _Patches, torch) -> None:
    """Records CUDA graphs: wraps torch.cuda.CUDAGraph's capture_begin, capture_end(_pre),
    replay and reset (see _graphs). Where they are missing, a warning says graphs are not
    recorded."""
    G = getattr(torch.cuda, "CUDAGraph", None)
    missing = [m for m in _graphs.REQUIRED if G is None or not callable(getattr(G, m, None))]
    if missing:
        rec.graph_hooks_missing = missing
        return

    def ops_of():
        return rec.graphs if rec.on and _active is rec else None

    def current_stream():
        dev = rec.device()
        b = rec.backend
        if getattr(b, "fake_device", False) and hasattr(b, "current_stream"):
            return b.current_stream(dev), dev
        return torch._C._cuda_getCurrentRawStream(dev), dev

    def capturing():
        if getattr(rec.backend, "fake_device", False):
            return False
        return _current_stream_capturing(torch)

    for attr, make in _graphs.make_wrappers(ops_of, current_stream, rec.warn, capturing).items():
        p.patch_inherited(G, attr, make)


# Whether the Python recorder follows the autograd engine's marks (tests turn it off to show what
# the marks change).
_ENGINE_MARKS = True


class _EngineMarks:
    """The autograd engine's marks of a gradient handed across streams, for the Python recorder.

    When a backward node on one stream hands a gradient to a node on another, the engine makes
    the consumer's stream wait for the producer's (an event: seen) and marks the gradient used on
    the consumer's stream with `recordDataPtrOnStream` (torch/csrc/autograd/input_buffer.cpp: no
    dispatcher op, so no TorchDispatchMode sees it); the allocator then keeps its block until
    that stream's work is done. The C++ recorder sees the mark itself; here it is followed from
    the nodes: at each `backward()` / `autograd.grad()` every node of the graph gets a hook after
    it runs, which notes the stream each gradient it made was made on (the stream current then:
    the engine runs a node on its own stream), and a hook before it runs, which writes the mark
    for each gradient it is handed from a node on another stream — the engine's rule.

    The engine's other case: a gradient summed into another one for the same input of a node
    (`InputBuffer::add`, the "Nth producer") is added on the accumulating stream (the consumer's),
    and each gradient of the sum made on another stream is marked used there first; the one
    given up by the sum is freed at once, before the consumer runs. The engine does this right
    after the producer's post hooks, on the producer's thread, in the same graph task, before
    that thread runs any other op (but anomaly detection's checks of the node's gradients): the
    ops seen there that are the engine's sums (`add`/`add_` of one of the node's gradients and
    one an input buffer may still hold — made by a node, an earlier sum or the call's roots, and
    handed to fewer nodes than it was made for — alike in shape and device, no `alpha`) get the
    marks of their gradients made on another stream, written before them
    (`accumulating`); any other op ends the window. A hook of the program's that runs there (a
    post hook of the node registered after the check's, a tensor hook of the next node) and
    whose first op adds two such gradients is taken for the engine's sum: its gradients made on
    another stream are marked used, a mark the program did not make (the C++ recorder sees the
    engine's marks themselves)."""

    KEY = "streamsan.engine_marks"

    def __init__(self, rec: "Recorder", torch) -> None:
        self.rec = rec
        self.torch = torch
        self.token = object()  # this check's: a node hooked by an earlier check is hooked again
        self.handles: list = []  # those of nodes still alive (pruned as the graphs go)
        self.pruned_at = 0
        # id(gradient) -> (weak ref, stream, device), while the gradient lives. Plain dict
        # operations (atomic under the GIL): a weak reference's callback may run anywhere.
        self.made: dict[int, tuple[Any, int, int]] = {}
        self.failed = False
        # The engine's window for summing a node's gradients (see the class's note), per thread:
        # (the engine's graph task, the ids of the node's gradients not summed yet), from the
        # node's post hook to the first op that is not one of its sums, or its thread's next
        # node. Where torch cannot say the graph task, a backward call's end closes every
        # thread's window (`epoch`).
        self.local = threading.local()
        self.epoch = 0
        self.task_id = getattr(getattr(torch, "_C", None), "_current_graph_task_id", None)
        ops = getattr(getattr(torch, "ops", None), "aten", None)
        add = getattr(ops, "add", None)
        add_ = getattr(ops, "add_", None)
        self.sums = frozenset(
            f for f in (getattr(add, "Tensor", None), getattr(add_, "Tensor", None)) if f is not None
        )
        # The ops anomaly detection runs on each gradient a node made, before the engine sums it
        # (`isnan(g)._is_any_true().item()`): they leave the window open.
        self.nan_checks = frozenset(
            getattr(getattr(ops, n, None), "default", None) for n in ("isnan", "_is_any_true", "_local_scalar_dense")
        ) - {None}
        self.anomaly = getattr(torch, "is_anomaly_enabled", lambda: False)
        # The gradients made by a node or a sum and not handed to a node yet: id -> the number of
        # input-buffer slots it may be in (a node hands one gradient to several: AddBackward0's
        # to both sides of a residual `h + f(h)`, where f's node takes it while h's buffer still
        # holds it), the only ones the engine sums. Counted under `waiting_mu` (engine threads);
        # re-entrant: a weak reference's callback may run on a thread that holds it.
        self.waiting: dict[int, int] = {}
        self.waiting_mu = threading.RLock()

    def _on(self) -> bool:
        return self.rec.on and _active is self.rec and not self.failed

    def _failed(self, where: str, e: BaseException) -> None:
        """A hook that failed stops following the marks for this check, and says why once: it
        runs inside the autograd engine (often on its device thread), where an exception it let
        out would end the user's backward."""
        self.failed = True
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        at = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}" if tb is not None else ""
        # (the check's warnings never raise: see _Warned's `inside`)
        self.rec.warn(
            "engine-marks",
            f"following the autograd engine's marks failed in its hook {where} a node "
            f"({type(e).__name__}: {e}{at}); gradients handed across streams from here on are "
            "not marked, and a free of one may be reported",
        )

    def _stream(self, t) -> tuple[int, int]:
        b = self.rec.backend
        dev = t.device.index or 0 if t.is_cuda else 0
        return b.current_stream(dev), dev

    def _tracked(self, t) -> bool:
        torch = self.torch
        return isinstance(t, torch.Tensor) and (t.is_cuda or (self.rec.backend.fake_device and t.device.type == "cpu"))

    def roots(self, grads) -> None:
        """Notes a backward call's root gradients (`_make_grads`' tuple: made on the stream
        current now, each handed by the engine's root to its root's node)."""
        for g in grads if isinstance(grads, (list, tuple)) else ():
            if self._tracked(g):
                self._note(g)

    def prepare(self, roots) -> None:
        """Hooks every node of the graph behind `roots` (tensors) not hooked by this check yet."""
        torch = self.torch
        edge = getattr(getattr(torch.autograd, "graph", None), "GradientEdge", ())
        if isinstance(roots, torch.Tensor) or (edge and isinstance(roots, edge)):
            roots = (roots,)  # (a GradientEdge is a tuple: one root, not its fields)
        try:
            stack = []
            for r in roots:
                if isinstance(r, torch.Tensor):
                    if r.grad_fn is not None:
                        stack.append(r.grad_fn)
                elif edge and isinstance(r, edge):
                    stack.append(r.node)  # torch.autograd.graph.get_gradient_edge(t)
        except TypeError:
            return
        if len(self.handles) > 2 * self.pruned_at + 1024:  # a long check: the old graphs are gone
            self.handles = [h for h in self.handles if getattr(h, "hooks_dict_ref", lambda: True)() is not None]
            self.pruned_at = len(self.handles)
        seen: dict[int, Any] = {}  # the nodes kept alive: a wrapper made again may take a freed one's id
        while stack:
            n = stack.pop()
            if n is None or id(n) in seen:
                continue
            seen[id(n)] = n
            try:
                md = n.metadata
                if md.get(self.KEY) is not self.token:
                    md[self.KEY] = self.token
                    self.handles.append(n.register_prehook(self.before))
                    self.handles.append(n.register_hook(self.after))
                stack.extend(f for f, _ in n.next_functions if f is not None)
            except (AttributeError, RuntimeError, TypeError):
                continue  # a node that takes no hooks: its gradients are not followed

    def _guarded(self, where: str, body: Callable[[Any], Any], grads) -> Any:
        """A hook's body (what it returns), while the marks are followed, never raising out of the
        engine or into the program's call (None when it did not run or failed)."""
        if not self._on():
            return None
        try:
            return body(grads)
        except Exception as e:  # noqa: BLE001 - never out of the engine (see _failed)
            self._failed(where, e)
            return None

    def after(self, grad_inputs, grad_outputs) -> None:
        self._guarded("after", self._after, grad_inputs)

    def _after(self, grad_inputs) -> None:
        outs = [self._note(g) for g in grad_inputs if self._tracked(g)]
        self.local.window = (self._task(), outs) if outs else None

    def _note(self, g) -> int:
        """Notes the gradient `g` as made on the stream current now; returns its key."""
        made = self.made
        stream, dev = self._stream(g)
        key = id(g)

        waiting, mu = self.waiting, self.waiting_mu

        def gone(ref, key=key, made=made) -> None:
            if made.get(key, (None,))[0] is ref:
                made.pop(key, None)
                with mu:
                    waiting.pop(key, None)

        with mu:
            if key in made and made[key][0]() is not g:
                waiting.pop(key, None)  # an older gradient's id, taken again
            made[key] = (weakref.ref(g, gone), stream, dev)
            waiting[key] = waiting.get(key, 0) + 1
        return key

    def _leaves(self, key: int) -> None:
        """A gradient left one input-buffer slot (handed to its node, or summed away)."""
        with self.waiting_mu:
            n = self.waiting.get(key, 0) - 1
            if n > 0:
                self.waiting[key] = n
            else:
                self.waiting.pop(key, None)

    def before(self, grad_outputs) -> None:
        self._guarded("before", self._before, grad_outputs)

    def _before(self, grad_outputs) -> None:
        self.local.window = None
        self._mark_handed(grad_outputs)
        for g in grad_outputs:
            self._leaves(id(g))

    def _task(self):
        """The engine's graph task running on this thread (-1 outside the engine), or, where
        torch cannot say, the backward calls' epoch."""
        return self.task_id() if self.task_id is not None else ("epoch", self.epoch)

    def accumulating_guarded(self, func, args, kwargs) -> bool:
        """`accumulating`, never raising into the program's op (see _guarded)."""
        return self._guarded("summing gradients before", lambda _: self.accumulating(func, args, kwargs), None) is True

    def accumulating(self, func, args, kwargs) -> bool:
        """Called by the Python recorder before each op it records on this thread (`func`,
        `args`, `kwargs`): True for the engine's sum of two gradients in the window after a
        node's post hook (see the class's note), whose gradients made on another stream than the
        current one are marked used on it here, before the sum (its result goes to `summed`).
        The engine's sum is `add` (or `add_`) of two gradients alike in shape and device, one of
        them the node's not summed yet, the other one an input buffer may still hold
        (`waiting`; the same gradient twice only where it is in two slots, or in one and among
        the node's), no `alpha`; any other op closes the window (but anomaly detection's checks of the node's
        gradients), as does the node's thread's next node."""
        window = getattr(self.local, "window", None)
        if window is None:
            return False
        if func in self.nan_checks and self.anomaly():
            return False
        self.local.window = None
        if func not in self.sums or kwargs or len(args) != 2 or window[0] != self._task():
            return False
        a, b = args
        if not (self._tracked(a) and self._tracked(b)) or a.shape != b.shape or a.device != b.device:
            return False
        outs = window[1]
        if a is b:
            # The node made it twice, or made it again after a slot took it (a node that hands
            # back the gradient it was given: `h + h.clone()`, `h + h.expand_as(h)`): in two
            # slots, or in one and among the node's outputs.
            mine = id(a) if id(a) in outs and self.waiting.get(id(a), 0) >= 2 else None
            other = a
        else:
            mine = next((i for i in (id(a), id(b)) if i in outs), None)
            other = b if mine == id(a) else a
        if mine is None or not self._made(other) or self.waiting.get(id(other), 0) < 1:
            return False
        outs.remove(mine)
        if outs:
            self.local.window = window
        # Both leave their slots (the sum's result takes one: `summed`).
        self._leaves(mine)
        self._leaves(id(other))
        self._guarded("summing gradients after", self._mark_handed, args)
        return True

    def summed(self, out) -> None:
        """The engine's sum `out` (see `accumulating`): a gradient made on the stream current now,
        in the slot the sum took (an in-place sum's, `old.add_(new)`, again), which a later sum
        may add to."""
        if self._tracked(out):
            self._guarded("summing gradients after", self._note, out)

    def _made(self, g) -> bool:
        made = self.made.get(id(g))
        return made is not None and made[0]() is g

    def end_backward(self) -> None:
        """A backward call returned: where torch cannot say the graph task, the windows its nodes
        left open are closed."""
        if self.task_id is None:
            self.epoch += 1

    def _mark_handed(self, grad_outputs) -> None:
        for g in grad_outputs:
            if not self._tracked(g):
                continue
            made = self.made.get(id(g))
            if made is None or made[0]() is not g:
                continue
            stream, dev = self._stream(g)
            if (stream, dev) != (made[1], made[2]):
                self.rec.backend.mark_used(g, stream, dev)
                self.made[id(g)] = (made[0], stream, dev)

    def close(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()
        self.made.clear()
        self.waiting.clear()
        if self.rec.engine_marks is self:
            self.rec.engine_marks = None


def _script_as_builtin(torch, fn, op: str, closers: list) -> None:
    """TorchScript finds the builtins a scripted function calls by the function object (its
    `_builtin_ops`, made into a table by id the first time it compiles): a wrapper of one
    (`torch.autograd.grad`) is registered as the same op while it is in place, so that a
    function scripted during the check compiles as it would outside it."""
    try:
        b = torch.jit._builtins
        entry = (fn, op)
        b._builtin_ops.append(entry)
        if b._builtin_table is not None:
            b._builtin_table[id(fn)] = op
    except Exception:  # noqa: BLE001 - a torch without them: scripting such a function fails in a check
        return

    def undo() -> None:
        try:
            b._builtin_ops[:] = [e for e in b._builtin_ops if e is not entry]
            if b._builtin_table is not None and b._builtin_table.get(id(fn)) == op:
                del b._builtin_table[id(fn)]
        except Exception:  # noqa: BLE001
            pass

    closers.append(undo)


def _install_engine_marks(rec: "Recorder", p: _Patches, torch) -> None:
    """The Python recorder's `torch.autograd.backward` and `torch.autograd.grad` hook the graph
    they run first (see _EngineMarks); the hooks go when the check ends."""
    marks = _EngineMarks(rec, torch)
    rec.engine_marks = marks
    p.closers.append(marks.close)
    autograd = torch.autograd

    def maker(key: str):
        def make(orig):
            # backward(tensors, …), grad(outputs, …): the roots given by position or by name
            # (`make_graphed_callables` calls grad(outputs=…, inputs=…, …)); the call itself
            # exactly as made.
            # Roots of any other iterable (a generator, a `map`) are made a tuple first, and the
            # tuple passed on: walking them must not use them up.
            @functools.wraps(orig)
            def run_hooked(*args, **kwargs):
                if marks._on():
                    roots = args[0] if args else kwargs.get(key)
                    if roots is not None and not isinstance(roots, (torch.Tensor, list, tuple)):
                        try:
                            roots = tuple(roots)
                        except TypeError:
                            roots = None  # not iterable: the original says what is wrong
                        else:
                            if args:
                                args = (roots,) + args[1:]
                            else:
                                kwargs[key] = roots
                    if roots is not None:
                        try:
                            marks.prepare(roots)
                        except Exception as e:  # noqa: BLE001 - never into the program's call
                            marks._failed("prepare", e)
                try:
                    return orig(*args, **kwargs)
                finally:
                    marks.end_backward()

            _script_as_builtin(torch, run_hooked, f"aten::{orig.__name__}", p.closers)
            return run_hooked

        return make

    p.patch(autograd, "backward", maker("tensors"))
    p.patch(autograd, "grad", maker("outputs"))

    def make_grads(orig):
        # The root gradients of a `backward` / `autograd.grad` call, those the program gave
        # (`grad_tensors`, `grad_outputs`, `grad_variables`) and the ones made for it: the
        # engine's root hands each to its root's node, where a sum may take it.
        @functools.wraps(orig)
        def _make_grads(*args, **kwargs):
            grads = orig(*args, **kwargs)
            marks._guarded("prepare", marks.roots, grads)
            return grads

        return _make_grads

    if callable(getattr(autograd, "_make_grads", None)):
        p.patch(autograd, "_make_grads", make_grads)


def _install_patches(rec: "Recorder") -> _Patches:
    """The wrappers of what the callbacks do not report, for `rec`'s check; none left behind
    when making them fails."""
    p = _Patches()
    try:
        _make_patches(rec, p)
    except BaseException:
        p.restore()
        raise
    return p


def _make_patches(rec: "Recorder", p: _Patches) -> None:
    import torch

    b = rec.backend

    def on() -> bool:
        return rec.on and _active is rec

    if rec.cuda:
        Event = torch.cuda.Event
        Stream = torch.cuda.Stream

        def make_query(orig):
            def query(self):
                done = orig(self)
                h = getattr(self, "cuda_event", 0)
                if on() and h:
                    b.host_op('{"op":"event_query","event":%s,"complete":%s' % (_ev(h), "true" if done else "false"))
                return done

            return query

        def make_elapsed(orig):
            def elapsed_time(self, end_event):
                t = orig(self, end_event)
                # It succeeds only when both events are complete: the host knows it.
                if on():
                    for e in (self, end_event):
                        h = getattr(e, "cuda_event", 0)
                        if h:
                            b.host_op('{"op":"event_query","event":%s,"complete":true' % _ev(h))
                return t

            return elapsed_time

        def make_squery(orig):
            def query(self):
                done = orig(self)
                if on():
                    b.host_op(
                        '{"op":"stream_query","stream":%s,"complete":%s'
                        % (b.stream_id(self.cuda_stream, self.device_index or 0), "true" if done else "false")
                    )
                return done

            return query

        def make_new(orig):
            def __new__(cls, *args, **kwargs):
                s = orig(cls, *args, **kwargs)
                if on() and "stream_id" not in kwargs:  # not a wrapper of an existing stream
                    site = rec.sites.site(2) or "stream"
                    name = rec.unique_stream_name(site)
                    b.name_stream(s.cuda_stream, name)
                return s

            return staticmethod(__new__) if isinstance(Stream.__dict__.get("__new__"), staticmethod) else __new__

        p.patch(Event, "query", make_query)
        p.patch(Event, "elapsed_time", make_elapsed)
        p.patch(Stream, "query", make_squery)
        p.patch(Stream, "__new__", make_new)

        _install_graph_patches(rec, p, torch)

    if isinstance(b, PythonBackend) and (rec.cuda or b.fake_device):
        if _ENGINE_MARKS:
            _install_engine_marks(rec, p, torch)
        python_key = torch._C.DispatchKey.Python
        excluded = torch._C._dispatch_tls_is_dispatch_key_excluded

        def make_record_stream(orig):
            # Tensor.record_stream(s): the stream by position or by its name `s`, as the
            # original takes it.
            @functools.wraps(orig)
            def record_stream(self, *args, **kwargs):
                r = orig(self, *args, **kwargs)
                # Under torch's no_dispatch() no TorchDispatchMode sees the op (FSDP1's
                # `_no_dispatch_record_stream` marks its flat parameters so): written here.
                # Elsewhere the mode writes it.
                if on() and excluded(python_key):
                    try:
                        stream = args[0] if args else kwargs.get("s")
                        raw, dev = _raw_stream(torch, stream)
                        if raw is not None:
                            b.mark_used(self, raw, dev)
                    except Exception as e:  # noqa: BLE001 - never into the program's call
                        rec.warn("record-stream", f"could not record a record_stream: {type(e).__name__}: {e}")
                return r

            return record_stream

        p.patch_inherited(torch.Tensor, "record_stream", make_record_stream)

    # torch._C.TensorBase's (a type that cannot be patched), inherited by torch.Tensor: left in
    # place, inert, between the checks of a process where every part is checked (see _Kept).
    p.keep_inherited(torch.Tensor, "tolist", _make_tolist)

    def make_save(orig):
        def save(obj, *args, **kwargs):
            # torch.save reads the bytes of every CPU tensor it writes on the host, outside the
            # dispatcher: pinned memory a non_blocking copy may still be writing is a race.
            if on():
                try:
                    for t in _tensors_in(obj, torch):
                        if not t.is_cuda:
                            b.host_access(t, False)
                except Exception as e:  # noqa: BLE001 - never into the program's call
                    rec.warn("save", f"could not record what torch.save read: {type(e).__name__}: {e}")
            return orig(obj, *args, **kwargs)

        return save

    import torch.serialization as serialization

    if callable(getattr(serialization, "save", None)):
        saved = serialization.save
        p.patch(serialization, "save", make_save)
        if torch.__dict__.get("save") is saved:
            p.patch(torch, "save", lambda _orig: serialization.save)


def _raw_stream(torch, s) -> tuple[Optional[int], int]:
    """A stream argument's CUDA handle and device: a `torch.cuda.Stream`, or a `torch.Stream` of
    a CUDA device; (None, 0) for anything else."""
    if s is None:
        return None, 0
    raw = getattr(s, "cuda_stream", None)
    if raw is None:  # a torch.Stream: its CUDA handle
        if getattr(getattr(s, "device", None), "type", None) != "cuda":
            return None, 0
        raw = torch.cuda.Stream(
            stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type
        ).cuda_stream
    return raw, getattr(s, "device_index", None) or 0


def _make_tolist(orig):
    """The wrapper of `Tensor.tolist` (`orig`) that the checks listen with: a CPU tensor's bytes
    read on the host. Made once (it reads the recorder that is on, as the sync callbacks do): a
    check that wraps the same method listens with it again."""
    import torch

    has_torch_function = torch.overrides.has_torch_function_unary

    def tolist(self):
        # A subclass with __torch_function__ comes back here from it, torch functions
        # disabled: its read is written then, once.
        r = _active
        if r is not None and r.on and not has_torch_function(self) and not self.is_cuda:
            try:
                r.backend.host_access(self, False)
            except Exception as e:  # noqa: BLE001 - never into the program's call
                r.warn("tolist", f"could not record a tolist: {type(e).__name__}: {e}")
        return orig(self)

    return tolist


def _tensors_in(obj, torch, depth: int = 8, seen: Optional[set] = None) -> list:
    """The tensors an object passed to torch.save holds: in mappings, sequences, sets and the
    attributes of objects (a module, an optimizer's state), `depth` levels deep."""
    if seen is None:
        seen = set()
    if depth < 0 or id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return []
    out: list = []
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)
    else:
        try:
            d = getattr(obj, "__dict__", None)
        except Exception:  # noqa: BLE001 - an object whose attributes raise: nothing seen in it
            d = None
        items = list(d.values()) if isinstance(d, dict) else []
    for x in items:
        out.extend(_tensors_in(x, torch, depth - 1, seen))
    return out


# ----------------------------------------------------------------------------------------------
# The recorder


# The Triton launch hooks of this process's checks (Recorder._install_triton).
_TRITON_HOOKS: Any = None
# Whether a check's end leaves Triton's wrappers and torch.Tensor.tolist's (see _Kept) in place,
# inert, for the next check (it saves patching them at each start and putting them back at each
# end, about 0.01 ms a check, and keeps torch.Tensor's attribute cache on Python 3.13+; the
# cost is a Python call around each Inductor launch and each tolist made between checks, about
# 0.3 and 0.15 µs). On where every part of the process is checked: `pytest --streamsan` (its
# plugin turns it on for the session and calls `release_triton_hooks` and
# `release_kept_methods` at the end).
_KEEP_WRAPPERS = False


def release_triton_hooks() -> None:
    """Puts back the methods Triton's wrappers replaced, where checks left them in place."""
    hooks = _TRITON_HOOKS
    if hooks is not None:
        hooks.uninstall()


class Recorder:
    """Feeds a running program's ops to `sink(bytes)` (JSON Lines of the trace format)."""

    def __init__(
        self,
        sink: Callable[[bytes], None],
        backend: str = "auto",
        fake_device: bool = False,
        profile: Optional[str] = None,
    ) -> None:
        import torch

        global _claimed
        with _lock:
            if _claimed is not None or _active is not None:
                # Before anything is set up: the C++ recorder's state is the running check's.
                raise RuntimeError(_BUSY)
            _claimed = self
        try:
            self._setup(torch, sink, backend, fake_device, profile)
        except BaseException:
            self._unclaim()
            raise

    def _setup(self, torch, sink, backend: str, fake_device: bool, profile: Optional[str]) -> None:
        self.torch = torch
        self.on = False
        self.sink = sink
        # A Checker's `_raw_sink()` capsule: the C++ recorder hands batches to it directly (no
        # Python, no GIL); the rest (the last batch at stop) goes through `sink`.
        self.raw_sink = None
        self.engine_marks = None  # the Python recorder's _EngineMarks while a check follows them
        self.warn = _Warned(inside=True)
        self.sites = Sites()
        # Asked once per check (each time is a device count and an environment read).
        self.cuda = bool(torch.cuda.is_available())
        self.stream_names: dict[str, int] = {}
        self.error: Optional[BaseException] = None
        self.backend_error: Optional[str] = None
        choice = os.environ.get("STREAMSAN_TORCH_BACKEND", backend)
        if choice not in ("auto", "native", "python"):
            raise ValueError(f"backend={choice!r}: expected 'auto', 'native' or 'python'")
        self.backend: Any = None
        if choice in ("auto", "native"):
            try:
                self.backend = NativeBackend(self, fake_device, profile)
            except Exception as e:
                if choice == "native":
                    raise
                self.backend_error = str(e)
                _warn_fallback(self.backend_error)
        if self.backend is None:
            self.backend = PythonBackend(self, fake_device)
        self.patches: Optional[_Patches] = None
        self._compiled_before = self._compiled_frames()
        # `graphs`, the check's GraphOps, is made when first read (see __getattr__).
        self.graph_hooks_missing: list[str] = []
        self.triton: Any = None  # the Triton launch hooks while the check runs

    def __getattr__(self, name: str) -> Any:
        # Called only for an attribute the recorder lacks: `graphs`, the check's GraphOps, is made
        # when first read (a CUDA graph's capture or replay, a factory op under the Python
        # recorder), not at every check's start: most checks have no graph ops.
        if name != "graphs":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with _lock:  # one GraphOps, whichever thread reads it first
            graphs = self.__dict__.get("graphs")
            if graphs is None:
                graphs = self.graphs = self._make_graph_ops()
        return graphs

    def _make_graph_ops(self) -> "_graphs.GraphOps":
        ext = getattr(self.backend, "ext", None)
        captures = getattr(ext, "set_captures", None)
        pool_name = getattr(ext, "pool_name", None)
        set_pool_name = getattr(ext, "set_pool_name", None)
        return _graphs.GraphOps(
            self._graph_op,
            self.backend.stream_id,
            self.warn,
            lambda: self.sites.site(1),
            captures if captures is not None else (lambda n: None),
            (lambda key: pool_name(int(key[0]), int(key[1]))) if pool_name is not None else (lambda key: None),
            (lambda key, name: set_pool_name(int(key[0]), int(key[1]), name))
            if set_pool_name is not None
            else (lambda key, name: None),
        )

    def _graph_op(self, partial: str) -> None:
        self.backend.host_op(partial)

    def _on_kernel(self, name: str, stream: int, accesses: list, kind: str) -> None:
        """A Triton kernel launch (Inductor's or the user's) that the hooks saw: a `launch` on
        its stream with each tensor argument's regions read and/or written."""
        if not self.on or _active is not self:
            return
        device = None
        for t, _, _ in accesses:
            if getattr(t, "is_cuda", False):
                device = t.get_device()
                break
        self.backend.record_kernel(name, int(stream), self.device() if device is None else device, accesses)

    def _on_kernel_fast(self, name: str, stream: int, roles: bytes, args: tuple) -> bool:
        """A Triton kernel launch handed to the C++ recorder whole (see TritonHooks.install):
        False when it cannot take it (an argument is a tuple or a descriptor)."""
        if not self.on or _active is not self:
            return True
        return self.backend.record_triton(name, stream, roles, args) >= 0

    def device(self) -> int:
        try:
            return self.torch.cuda.current_device()
        except Exception:
            return 0

    def unique_stream_name(self, base: str) -> str:
        n = self.stream_names.get(base, 0) + 1
        self.stream_names[base] = n
        return base if n == 1 else f"{base}#{n}"

    def _compiled_frames(self) -> int:
        dyn = sys.modules.get("torch._dynamo.utils")
        try:
            return int(dyn.counters["frames"]["ok"]) if dyn is not None else 0
        except Exception:
            return 0

    def _sink(self, data: bytes) -> None:
        try:
            self.sink(data)
        except BaseException as e:  # kept and raised at stop: never inside the program's ops
            if self.error is None:
                self.error = e

    def _unclaim(self) -> None:
        global _claimed, _active
        with _lock:
            if _claimed is self:
                _claimed = None
            if _active is self:
                _active = None

    def abandon(self) -> None:
        """Gives up a recorder whose start failed or never came: what it installed is taken
        off, and the next check may run."""
        try:
            if _active is self:
                self.stop()
        except Exception:  # noqa: BLE001 - taking off what a failed start left; its error is raised
            pass
        finally:
            self._unclaim()

    def detach(self) -> None:
        """Lets go of the sink (the Run's) once the Run has its report: a finished recorder
        holds nothing that holds its Run. Ops that reach it later raise in the sink, as they
        would in a finished checker."""
        self.sink = _finished_sink

    def start(self) -> None:
        global _active
        if self._capturing_now():
            raise RuntimeError(_IN_CAPTURE)
        with _lock:
            if _active is not None or _claimed is not self:
                raise RuntimeError(_BUSY)
            _active = self
        if not getattr(self.backend, "native_syncs", False):
            _register_callbacks(allocations=isinstance(self.backend, PythonBackend))
        self.patches = _install_patches(self)
        self._install_triton()
        if self.graph_hooks_missing:
            self.warn(
                "graph-hooks",
                "this torch has no torch.cuda.CUDAGraph." + "/".join(self.graph_hooks_missing)
                + ": CUDA graph captures and replays are not recorded (the work of a replay is "
                "invisible to this check)",
            )
        try:
            if self.cuda:
                self.backend.name_stream(0, "default")
        except Exception:
            pass
        self.on = True
        self.backend.start()

    def _capturing_now(self) -> bool:
        """Whether the current stream is capturing a CUDA graph as the recording begins (CUDA
        not initialized yet, or the fake device: no capture can be running)."""
        if not self.cuda or getattr(self.backend, "fake_device", False):
            return False
        import torch

        if not torch.cuda.is_initialized():
            return False
        try:
            return _current_stream_capturing(torch)
        except Exception:  # noqa: BLE001 - CUDA refused the question (the legacy stream during
            return False  # another stream's global capture): the check begins as it did before

    def _install_triton(self) -> None:
        """Hooks Triton's launches (see _triton) where Triton is installed: the hooks of the
        process's checks (one check runs at a time), made at the first."""
        global _TRITON_HOOKS
        if not self.cuda and not getattr(self.backend, "fake_device", False):
            return
        try:
            hooks = _TRITON_HOOKS
            if hooks is None:
                from ._triton import TritonHooks

                hooks = _TRITON_HOOKS = TritonHooks()
            hooks.renew(on_error=lambda message: self.warn("triton-error", message))
            fast = self._on_kernel_fast if hasattr(self.backend, "record_triton") else None
            # The C++ recorder's own entry, for a tuned Inductor kernel's launches: it records
            # nothing once the recording ends (before the hooks are stopped).
            direct = getattr(self.backend, "record_triton", None)
            ext = getattr(self.backend, "ext", None)
            # STREAMSAN_TRITON_FASTRUN=0: Inductor's launches through the Python wrapper alone.
            fastrun = os.environ.get("STREAMSAN_TRITON_FASTRUN", "1").strip() != "0"
            if direct is not None and getattr(ext, "FastRun", None) is not None:
                from ._triton import use_native

                use_native(ext if fastrun else None)  # its wrapper of Inductor's launches, no Python frame
            if hooks.install(self._on_kernel, fast, direct):
                self.triton = hooks
        except Exception as e:  # the check goes on without Triton's launches, and says so
            self.warn("triton-error", f"could not hook Triton's kernel launches: {type(e).__name__}: {e}")

    def stop(self) -> None:
        counts = None
        try:
            counts = self.backend.stop()  # the C++ recorder's: what the end warns about
            self.on = False
            data = self.backend.drain()
            if data:
                self._sink(data)
        finally:
            self.on = False
            # Whatever failed above: the program's methods back, and the next check may run.
            try:
                if self.triton is not None:
                    self.triton.uninstall(keep=_KEEP_WRAPPERS)
            finally:
                try:
                    if self.patches is not None:
                        patches, self.patches = self.patches, None
                        patches.restore()
                finally:
                    self._unclaim()
        c = counts or self.backend.counters
        if getattr(self.backend, "gpu_trace_replaced", False):
            self.warn(
                "gpu-trace",
                "torch's GPU trace was activated during the check (torch.cuda._sanitizer, or "
                "torch._C._activate_gpu_trace()): the events, waits and synchronizations issued "
                "after that were not recorded",
            )
        if c.get("resolver_errors"):
            self.warn(
                "recorder",
                "the C++ recorder ran out of memory writing some ops: the trace is incomplete "
                "and the check may miss hazards",
            )
        if c.get("unread_ops"):
            self.warn(
                "unread-ops",
                f"{c['unread_ops']} op(s) could not be recorded: their arguments or outputs could not be "
                f"read (the first: {c.get('first_unread') or '?'}); the check may miss hazards on them",
            )
        if c.get("external_accesses"):
            self.warn(
                "external",
                "some accesses touched device memory allocated before the check began: they are "
                "checked for races, not for allocator reuse",
            )
        if self.triton is None and self._compiled_frames() > self._compiled_before:
            self.warn(
                "compile",
                "torch.compile'd code ran but Triton's launches could not be hooked: the Triton "
                "kernels it generates are not recorded (only its calls into aten are)",
            )
        self.triton = None
        if self.error is not None:
            e, self.error = self.error, None
            raise e


def _finished_sink(data: bytes) -> None:
    raise RuntimeError("streamsan.torch: ops recorded after the check ended")


def note_host_access(t, write: bool) -> bool:
    r = _active
    if r is None or not r.on:
        return False
    return bool(r.backend.host_access(t, write))


def _after_fork_in_child() -> None:
    """A process forked while a recorder is on: the check is the parent's (`Run` ends it there
    without a report). The child records nothing (the Python recorder passes every op straight
    through, the hooks do nothing; the C++ recorder's own handler turns it off), and the locks a
    parent thread may have held at the fork are made anew."""
    global _lock
    _lock = threading.Lock()
    r = _active
    if r is None:
        return
    r.on = False
    b = r.backend
    if isinstance(b, PythonBackend):
        b.mu = threading.RLock()
        b.batch = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
