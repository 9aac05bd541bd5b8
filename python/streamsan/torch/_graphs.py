"""CUDA graphs: what `torch.cuda.graph`, `CUDAGraph.capture_begin`/`capture_end`/`replay`/`reset`
and `make_graphed_callables` do, as trace-format graph ops.

PyTorch (2.5 to 2.11) has no callback for graph capture or replay, so the recorder wraps the
methods of `torch.cuda.CUDAGraph` (`torch/cuda/graphs.py`; `aten/src/ATen/cuda/CUDAGraph.cpp`):

- `capture_begin(pool=None, …)` starts capturing on the stream current at the call (the capture
  stream: `torch.cuda.graph` makes its side stream, or `stream=`, current first) and makes the
  caching allocator hand out the blocks of allocations on streams of this capture from the
  graph's pool: a private one, or the one of `pool=` (a `graph_pool_handle()`, another graph's
  `pool()`, or a `torch.cuda.MemPool`). → `graph_begin {graph, stream, pool}`.
- `capture_end()` (and `capture_end_pre()` where it exists) ends it. → `graph_end {graph}`.
  From then on `pool()` returns the handle of the graph's pool, which another capture may pass as
  `pool=`: it is mapped to the same pool name.
- `replay()` launches the graph on the stream current at the call (`cudaGraphLaunch(exec,
  getCurrentCUDAStream())`). → `graph_launch {graph, stream}`.
- `reset()` (also run when the graph is destroyed) deletes the graph: a later capture into the
  same object is a new graph with a new name.

`make_graphed_callables` captures through `torch.cuda.graph` (with a shared pool) and replays
through `replay()` in its autograd function's forward and backward, so it is recorded by the
same wrappers. The ops issued during a capture are recorded by the backends as usual, on their
streams: the checker knows those streams are capturing, so the ops are captured, not run, and
allocations on them are pool buffers (trace format, "CUDA graphs").

This module does not import torch: `GraphOps` gets the current stream and a place to write
ops from its caller, so that its logic is tested without a GPU.
"""

from __future__ import annotations

import json
import weakref
from typing import Any, Callable, Optional


def pool_key(pool: Any) -> Optional[tuple]:
    """The identity of a pool argument: a handle (a tuple of two ints), a `torch.cuda.MemPool`
    (its `id`), or None (no pool given)."""
    if pool is None:
        return None
    if not isinstance(pool, (tuple, list)):
        pid = getattr(pool, "id", None)
        if pid is None:
            return ("object", id(pool))
        pool = pid() if callable(pid) else pid
    try:
        key = tuple(int(x) for x in pool)
    except (TypeError, ValueError):
        return ("object", id(pool))
    if not any(key):
        return None  # (0, 0): "no pool", as CUDAGraph::capture_begin reads it
    return key


class _Graph:
    __slots__ = ("name", "pool", "state", "stream")

    def __init__(self, name: str, pool: str, stream: str) -> None:
        self.name = name  # quoted
        self.pool = pool  # quoted
        self.stream = stream  # quoted, the capture stream
        self.state = "capturing"  # then "ended"


class GraphOps:
    """Writes the graph ops of one check.

    `emit(partial)` writes an op given as a JSON object without its closing brace (the backend
    adds the site); `stream_id(raw, device)` is the backend's quoted stream id; `warn(key,
    message)` warns once per key; `site()` is the user's `file:line` of the capture (None when
    unknown). A graph is named after the site of its capture (`graph train.py:42`, then
    `graph train.py:42#2` for the next capture there), else `graph N` (the Nth capture).
    """

    def __init__(
        self,
        emit: Callable[[str], None],
        stream_id: Callable[[int, int], str],
        warn: Callable[[str, str], None],
        site: Callable[[], Optional[str]] = lambda: None,
        on_captures: Callable[[int], None] = lambda n: None,
        known_pool: Callable[[tuple], Optional[str]] = lambda key: None,
        on_pool: Callable[[tuple, str], None] = lambda key, name: None,
    ) -> None:
        self.emit = emit
        self.on_captures = on_captures  # told the number of captures in progress when it changes
        # The allocator's pool ids: `known_pool(key)` is the quoted name the backend already gave
        # the pool with that id (an allocation into it outside a capture came first: cudagraph
        # trees' warm-up), `on_pool(key, name)` tells the backend the name given here.
        self.known_pool = known_pool
        self.on_pool = on_pool
        self.stream_id = stream_id
        self.warn = warn
        self.site = site
        self.names: dict[str, int] = {}
        self.count = 0
        self.graphs: "weakref.WeakKeyDictionary[Any, _Graph]" = weakref.WeakKeyDictionary()
        self.by_id: dict[int, tuple[Any, _Graph]] = {}  # objects without weak references
        # The ids of the graph objects given a capture in this check: every graph `_get` finds
        # has its id here (an id stays after its object is gone, and a new object may take it:
        # `_get` decides). A replay whose graph's id is not here is a graph the check does not
        # know, told apart without a weak reference or a lookup (see `make_replay`).
        self.ids: set[int] = set()
        self.outside_warned = False
        self.pools: dict[tuple, str] = {}  # pool key -> quoted pool name
        self.pool_count = 0
        self.capturing: set[str] = set()  # names of graphs being captured

    # -- the graph of an object
    def _get(self, graph: Any) -> Optional[_Graph]:
        try:
            return self.graphs.get(graph)
        except TypeError:
            hit = self.by_id.get(id(graph))
            return hit[1] if hit is not None and hit[0] is graph else None

    def _set(self, graph: Any, g: Optional[_Graph]) -> None:
        if g is None:
            self.ids.discard(id(graph))
        else:
            self.ids.add(id(graph))
        try:
            if g is None:
                self.graphs.pop(graph, None)
            else:
                self.graphs[graph] = g
        except TypeError:
            if g is None:
                self.by_id.pop(id(graph), None)
            else:
                self.by_id[id(graph)] = (graph, g)

    def _pool_name(self, key: Optional[tuple], graph_name: str) -> str:
        if key is None:
            return json.dumps(f"pool of {json.loads(graph_name)}")
        name = self.pools.get(key)
        if name is None:
            try:
                name = self.known_pool(key) if key[0] != "object" else None
            except Exception:
                name = None
            if name is None:
                self.pool_count += 1
                name = json.dumps(f"pool {self.pool_count}")
            self.pools[key] = name
            self._told(key, name)
        return name

    def _told(self, key: tuple, name: str) -> None:
        if key and key[0] != "object":
            try:
                self.on_pool(key, name)
            except Exception as e:  # the pool's warm-up allocations stay plain ones
                self.warn("graph-error", f"could not name a CUDA graph pool: {type(e).__name__}: {e}")

    # -- events
    def capture_begin(self, graph: Any, pool: Any, stream: int, device: int) -> None:
        """`graph` began capturing on `stream` (its raw handle) into `pool` (the argument)."""
        old = self._get(graph)
        if old is not None and old.state == "capturing":
            self.capturing.discard(old.name)
        self.count += 1
        base = self.site()
        base = f"graph {base}" if base else f"graph {self.count}"
        n = self.names.get(base, 0) + 1
        self.names[base] = n
        name = json.dumps(base if n == 1 else f"{base}#{n}")
        sid = self.stream_id(stream, device)
        g = _Graph(name, self._pool_name(pool_key(pool), name), sid)
        self._set(graph, g)
        self.capturing.add(name)
        self.on_captures(len(self.capturing))
        self.emit('{"op":"graph_begin","graph":%s,"stream":%s,"pool":%s' % (name, sid, g.pool))

    def capture_end(self, graph: Any, handle: Any = None) -> None:
        """`graph`'s capture ended; `handle` is its `pool()` (None when unknown)."""
        g = self._get(graph)
        if g is None:
            self.warn(
                "graph-capture-outside",
                "a CUDA graph whose capture began before the check ended its capture during "
                "it: the graph is not recorded",
            )
            return
        if g.state == "capturing":  # (capture_end calls capture_end_pre where it exists)
            g.state = "ended"
            self.capturing.discard(g.name)
            self.on_captures(len(self.capturing))
            self.emit('{"op":"graph_end","graph":%s' % g.name)
        key = pool_key(handle)
        if key is not None and key not in self.pools:
            self.pools[key] = g.pool
            self._told(key, g.pool)

    def capture_failed(self, graph: Any) -> None:
        """`graph`'s capture_end raised: CUDA ended the capture without a graph."""
        g = self._get(graph)
        if g is not None and g.state == "capturing":
            self.capturing.discard(g.name)
            self.on_captures(len(self.capturing))
            self._set(graph, None)
            self.warn(
                "graph-capture-failed",
                "a CUDA graph capture failed: the ops issued during it stay in the check as "
                "captured ops of a capture that never ended",
            )

    def knows(self, graph: Any) -> bool:
        """Whether `graph`'s capture was recorded and has ended (its replays are recorded)."""
        if id(graph) not in self.ids:
            return False
        g = self._get(graph)
        return g is not None and g.state == "ended"

    def replay(self, graph: Any, stream: Optional[int], device: Optional[int], in_capture: bool = False) -> None:
        """`graph` was launched on `stream` (the current stream of the `replay()` call);
        `in_capture`: that stream was capturing (the launch became a node of another graph).
        `stream` and `device` are needed only for a graph `knows` (None: not asked)."""
        g = self._get(graph) if id(graph) in self.ids else None
        if g is None or g.state != "ended":
            self.outside()
            return
        if in_capture:
            self.warn(
                "graph-replay-in-capture",
                "a CUDA graph was replayed inside a capture (it became a node of the graph being "
                "captured): that replay is not recorded",
            )
            return
        self.emit('{"op":"graph_launch","graph":%s,"stream":%s' % (g.name, self.stream_id(stream, device)))

    def outside(self) -> None:
        """A graph whose capture the check did not record was replayed: said once per check."""
        if not self.outside_warned:
            self.outside_warned = True
            self.warn(
                "graph-replay-outside",
                "a CUDA graph captured before the check began was replayed: the work of its "
                "replays is not recorded",
            )

    def reset(self, graph: Any) -> None:
        """`graph` was deleted (`reset()`): a later capture into it is a new graph."""
        g = self._get(graph)
        if g is not None:
            self.capturing.discard(g.name)
            self.on_captures(len(self.capturing))
            self._set(graph, None)


# ----------------------------------------------------------------------------------------------
# The wrappers


def _unwrap_pool(args: tuple, kwargs: dict) -> Any:
    if "pool" in kwargs:
        return kwargs["pool"]
    return args[0] if args else None


def make_wrappers(
    ops_of: Callable[[], Optional[GraphOps]],
    current_stream: Callable[[], tuple[int, int]],
    warn: Callable[[str, str], None],
    capturing: Callable[[], bool] = lambda: False,
) -> dict[str, Callable[[Callable], Callable]]:
    """Wrappers of CUDAGraph's methods, by name: each calls the original and records what it
    did. `ops_of()` is the GraphOps of the check that is on (None: record nothing; a stand-in
    must have what `replay` reads of it before anything else, `ids` and `outside_warned`, read
    without a guard on the shortest path);
    `current_stream()` is (raw handle, device) of the calling thread's current stream;
    `capturing()` whether that stream is capturing (`torch.cuda.is_current_stream_capturing`).
    A failure of the recording is a warning, never an error of the program."""

    def guard(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # the program goes on; the check says what it missed
            warn("graph-error", f"could not record a CUDA graph {what}: {type(e).__name__}: {e}")

    def make_begin(orig):
        def capture_begin(self, *args, **kwargs):
            ops = ops_of()
            stream = None
            if ops is not None:
                try:
                    stream = current_stream()
                except Exception as e:
                    warn("graph-error", f"could not record a CUDA graph capture: {type(e).__name__}: {e}")
            out = orig(self, *args, **kwargs)
            if ops is not None and stream is not None:
                guard("capture", lambda: ops.capture_begin(self, _unwrap_pool(args, kwargs), stream[0], stream[1]))
            return out

        return capture_begin

    def make_end(orig):
        def capture_end(self, *args, **kwargs):
            ops = ops_of()
            try:
                out = orig(self, *args, **kwargs)
            except BaseException:
                if ops is not None:
                    guard("capture", lambda: ops.capture_failed(self))
                raise
            if ops is not None:

                def ended():
                    try:
                        handle = self.pool()
                    except Exception:
                        handle = None
                    ops.capture_end(self, handle)

                guard("capture", ended)
            return out

        return capture_end

    def make_replay(orig):
        def replay(self, *args, **kwargs):
            ops = ops_of()
            if ops is not None and id(self) not in ops.ids:
                # A graph the check has no capture of (cudagraph trees' graphs, captured before
                # it): replayed between a model's steps, when little of the check is in the
                # CPU's caches, so this path reads as little as it can (docs/performance.md,
                # "The suites at 2e629e9, and where the replay wrapper's time goes (H100)").
                out = orig(self, *args, **kwargs)
                if not ops.outside_warned:
                    guard("replay", ops.outside)  # warned about (once a check), not recorded
                return out
            stream = None
            in_capture = False
            known = False
            if ops is not None:
                try:
                    # The stream and whether it captures (each a CUDA call) only for a graph
                    # whose replays are recorded: one captured before the check (cudagraph
                    # trees' graphs, from one check to the next) is only warned about.
                    known = ops.knows(self)
                    if known:
                        stream = current_stream()
                        in_capture = bool(capturing())
                except Exception as e:
                    warn("graph-error", f"could not record a CUDA graph replay: {type(e).__name__}: {e}")
                    ops = None  # said once: nothing more of this replay
            out = orig(self, *args, **kwargs)
            if ops is not None and not known:
                guard("replay", lambda: ops.replay(self, None, None))  # warned about, not recorded
            elif ops is not None and stream is not None:
                guard("replay", lambda: ops.replay(self, stream[0], stream[1], in_capture))
            return out

        return replay

    def make_reset(orig):
        def reset(self, *args, **kwargs):
            ops = ops_of()
            if ops is not None:
                guard("reset", lambda: ops.reset(self))
            return orig(self, *args, **kwargs)

        return reset

    return {
        "capture_begin": make_begin,
        "capture_end_pre": make_end,
        "capture_end": make_end,
        "replay": make_replay,
        "reset": make_reset,
    }


# What must exist for graphs to be recorded; capture_end_pre only in newer versions.
REQUIRED = ("capture_begin", "capture_end", "replay")
