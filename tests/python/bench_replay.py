"""What wrapping `torch.cuda.CUDAGraph.replay` costs a replay, in place (docs/performance.md, "The
suites at 2e629e9, and where the replay wrapper's time goes (H100)"): one small CUDA graph
(`--kernels` element-wise kernels, 3 by default, on a 4 KiB tensor), captured once outside any check as cudagraph trees'
graphs are, replayed in blocks of `--replays` in the modes below, interleaved in rounds (the
order rotated each round), the collector off; prints the median microseconds per replay and the
difference to `plain`.

- `plain`: `graph.replay()` with nothing installed;
- `passthrough`: the method replaced by a Python function that only calls the original (what any
  Python wrapper costs);
- `wrapper-off`: the recorder's wrapper (`_graphs.make_wrappers`), no check on (`ops_of()` None);
- `wrapper-unknown`: the recorder's wrapper inside a stand-in check that does not know the graph
  (its id is not in `GraphOps.ids`: the wrapper's shortest path, warned once), without a
  recorder;
- `observe`: a check whose C++ recorder observes only, every patch installed (the graph was
  captured before it: its replays are warned about, not recorded);
- `observe-no-replay-patch`: the same without the `replay` patch;
- `checked-known`: a check that captured its own copy of the graph: every replay recorded.

    python tests/python/bench_replay.py [--replays 2000] [--rounds 9] [--kernels 3]

Where a replay is bound by the GPU (`plain` no faster than the graph's kernels run: every
wrapper then hides behind it), `--kernels 1` makes the host's part the larger one.

Needs a GPU. With `--stand-in` it needs none: a Python class stands for `CUDAGraph` and each
observing check of the C++ recorder on the fake device replays it `--per-check` times (12) between
two torch ops, as a decode loop does between its steps, with and without the recorder's wrappers
made for the check (`--checks` checks each way, alternating); prints the median microseconds of
a check's body each way and their difference, then the wrapper's cost per replay back to back.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import warnings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replays", type=int, default=2000, help="replays per timed block")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--kernels", type=int, default=3, help="kernels in the graph (at least 1)")
    p.add_argument("--stand-in", action="store_true", help="no GPU: a Python class for CUDAGraph (see above)")
    p.add_argument("--checks", type=int, default=1000, help="--stand-in: checks each way")
    p.add_argument("--per-check", type=int, default=12, help="--stand-in: replays in each check")
    args = p.parse_args()
    if args.stand_in:
        stand_in(args)
        return

    import torch

    kernels = max(1, args.kernels)
    if not torch.cuda.is_available():
        sys.exit("bench_replay.py needs a GPU (torch.cuda.is_available() is False)")
    import streamsan.torch
    from profile_program import install_patches_without  # beside this file
    from streamsan.torch import _graphs, _recorder

    G = torch.cuda.CUDAGraph
    orig = G.__dict__.get("replay")
    inherited = orig is None
    orig_fn = getattr(G, "replay")

    def capture():
        x = torch.zeros(1024, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(kernels):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(kernels):
                x.add_(1)
        torch.cuda.synchronize()
        return g, x

    graph, _x = capture()

    def block(g) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.replays):
            g.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.replays * 1e6

    def put_back() -> None:
        if inherited:
            if "replay" in G.__dict__:
                delattr(G, "replay")
        else:
            setattr(G, "replay", orig)

    def with_replay(fn) -> float:
        setattr(G, "replay", fn)
        try:
            return block(graph)
        finally:
            put_back()

    class Unknown:  # a GraphOps that does not know the graph: the wrapper's cheapest recorded path
        def __init__(self) -> None:
            self.ids: frozenset = frozenset()  # the graphs captured in the check: none
            self.outside_warned = False

        def outside(self) -> None:
            self.outside_warned = True

    unknown = Unknown()

    def wrapper(ops_of):
        return _graphs.make_wrappers(ops_of, lambda: (0, 0), lambda key, msg: None)["replay"](orig_fn)

    def passthrough(self, *a, **k):
        return orig_fn(self, *a, **k)

    def in_check(skip_replay: bool, known: bool) -> float:
        install = _recorder._install_patches
        if skip_replay:
            _recorder._install_patches = install_patches_without({"replay"})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with streamsan.torch.Run(raise_on_hazard=False, backend="native",
                                         _profile="0" if known else "observe"):
                    g = capture()[0] if known else graph
                    return block(g)
        finally:
            _recorder._install_patches = install

    modes = {
        "plain": lambda: block(graph),
        "passthrough": lambda: with_replay(passthrough),
        "wrapper-off": lambda: with_replay(wrapper(lambda: None)),
        "wrapper-unknown": lambda: with_replay(wrapper(lambda: unknown)),
        "observe": lambda: in_check(False, False),
        "observe-no-replay-patch": lambda: in_check(True, False),
        "checked-known": lambda: in_check(False, True),
    }
    for fn in modes.values():  # warm-up
        fn()
    samples: dict = {m: [] for m in modes}
    names = list(modes)
    gc.disable()
    try:
        for r in range(args.rounds):
            for m in names[r % len(names):] + names[: r % len(names)]:
                samples[m].append(modes[m]())
    finally:
        gc.enable()
    plain = statistics.median(samples["plain"])
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.rounds} rounds of "
          f"{args.replays} replays of a graph of {kernels} kernel{'s' if kernels != 1 else ''}")
    print(f"{'mode':26s} {'us/replay':>10s} {'- plain':>8s}")
    for m in names:
        med = statistics.median(samples[m])
        print(f"{m:26s} {med:10.2f} {med - plain:8.2f}")


def stand_in(args) -> None:
    """`--stand-in`: the recorder's replay wrapper around a Python class, in observing checks on
    the fake device (no GPU), each check's replays between torch ops."""
    import torch

    import streamsan.torch
    from streamsan.torch import _graphs, _recorder

    class Graph:  # stands for torch.cuda.CUDAGraph: a replay does nothing
        def capture_begin(self, *args, **kwargs) -> None:
            pass

        def capture_end(self, *args, **kwargs) -> None:
            pass

        def replay(self) -> None:
            pass

        def reset(self) -> None:
            pass

        def pool(self) -> tuple:
            return (0, 0)

    graph = Graph()  # made before any check, as cudagraph trees' graphs are
    x = torch.zeros(16)

    def wrap(rec) -> "_recorder._Patches":
        """The recorder's wrappers of Graph for `rec`'s check, as _install_graph_patches makes
        them on a GPU."""
        patches = _recorder._Patches()
        for attr, make in _graphs.make_wrappers(lambda: rec.graphs if rec.on else None, lambda: (0, 0),
                                                rec.warn).items():
            patches.patch_inherited(Graph, attr, make)
        return patches

    def body() -> None:
        for _ in range(args.per_check):
            x.add_(1)
            graph.replay()
            x.argmax()

    def once(wrapped: bool) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True,
                                     _profile="observe") as run:
                patches = wrap(run._recorder) if wrapped else _recorder._Patches()
                try:
                    t0 = time.perf_counter()
                    body()
                    return time.perf_counter() - t0
                finally:
                    patches.restore()

    for wrapped in (False, True):  # warm-up
        once(wrapped)
    samples: dict = {False: [], True: []}
    gc.disable()
    try:
        for r in range(args.checks):
            for wrapped in ((True, False) if r % 2 else (False, True)):
                samples[wrapped].append(once(wrapped))
    finally:
        gc.enable()
    bare, wrapped = (statistics.median(samples[w]) * 1e6 for w in (False, True))
    print(f"torch {torch.__version__}, a stand-in graph on the CPU, {args.checks} observing checks each way, "
          f"{args.per_check} replays between torch ops in each")
    print(f"check body without the wrapper {bare:8.1f} us")
    print(f"check body with the wrapper    {wrapped:8.1f} us   (+{wrapped - bare:.1f} us a check, "
          f"{(wrapped - bare) / args.per_check:.2f} us a replay)")
    # Back to back: the wrapper's own cost per replay, the check's table hot in the caches.
    n = 20000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True,
                                 _profile="observe") as run:
            costs = []
            for wrapped in (False, True, False, True):
                patches = wrap(run._recorder) if wrapped else _recorder._Patches()
                try:
                    graph.replay()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        graph.replay()
                    costs.append((wrapped, (time.perf_counter() - t0) / n * 1e6))
                finally:
                    patches.restore()
    b = min(c for w, c in costs if not w)
    w = min(c for w, c in costs if w)
    print(f"back to back: {b:.2f} us a replay without the wrapper, {w:.2f} with it (+{w - b:.2f})")


if __name__ == "__main__":
    main()
