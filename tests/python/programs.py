"""Real PyTorch programs with the synchronization bugs users hit, each in a buggy and a fixed
variant.

`run(fixed, widen)` runs one once and returns whether its result is correct. With `widen`, the
racing stream first spins (`torch.cuda._sleep`, which bypasses the dispatcher and so is not part
of what is checked), so that the buggy variant's race actually happens: its data is then
corrupted, and the fixed variant's never is. The lines marked `# RACE` are where the hazard is;
a checker must report the buggy variant at one of them and nothing for the fixed one.
"""

from __future__ import annotations

import torch

N = 1 << 20  # floats per buffer (4 MiB)
SLEEP = 50_000_000  # cycles: tens of milliseconds, far longer than any copy or kernel here


def side_stream_without_wait(fixed: bool, widen: bool) -> bool:
    """A side stream reads what the default stream writes, without waiting for it."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((N,), -1.0, device="cuda")
    side.wait_stream(main)  # x's first values (else the read may see an earlier run's 1.0s)
    if widen:
        torch.cuda._sleep(SLEEP)
    x.fill_(1.0)
    if fixed:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        y = x * 2  # RACE
    main.wait_stream(side)
    ok = bool((y == 2).all())
    torch.cuda.synchronize()
    return ok


def free_without_record_stream(fixed: bool, widen: bool) -> bool:
    """A tensor of the default stream, read by a side stream, freed without record_stream: the
    allocator hands its memory to the next allocation while the side stream still reads it."""
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.full((N,), 1.0, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        y = x * 2
    if fixed:
        x.record_stream(side)
    del x  # RACE
    z = torch.full((N,), 5.0, device="cuda")  # RACE
    main.wait_stream(side)
    ok = bool((y == 2).all())
    torch.cuda.synchronize()
    del z
    return ok


def nonblocking_d2h_read_before_sync(fixed: bool, widen: bool) -> bool:
    """A non_blocking copy to pinned memory, read by the host before the copy is done."""
    host = torch.empty(N, pin_memory=True)
    host.fill_(-1.0)
    x = torch.full((N,), 3.0, device="cuda")
    if widen:
        torch.cuda._sleep(SLEEP)
    x.add_(1.0)
    host.copy_(x, non_blocking=True)
    if fixed:
        torch.cuda.current_stream().synchronize()
    total = float(host.sum())  # RACE
    torch.cuda.synchronize()
    return total == 4.0 * N


def pinned_staging_overwritten(fixed: bool, widen: bool) -> bool:
    """A pinned staging buffer refilled by the host while the copy of its previous contents may
    still be reading it."""
    main = torch.cuda.current_stream()
    copier = torch.cuda.Stream()
    staging = torch.empty(N, pin_memory=True)
    dst = [torch.empty(N, device="cuda") for _ in range(2)]
    copier.wait_stream(main)
    done = torch.cuda.Event()
    for i in range(2):
        if fixed and i > 0:
            done.synchronize()
        staging.fill_(float(i + 1))  # RACE
        with torch.cuda.stream(copier):
            if widen:
                torch.cuda._sleep(SLEEP)
            dst[i].copy_(staging, non_blocking=True)
            done.record(copier)
    main.wait_stream(copier)
    torch.cuda.synchronize()
    return bool((dst[0] == 1).all()) and bool((dst[1] == 2).all())


_group = None


def _one_rank_group() -> bool:
    """A one-rank NCCL process group, once; False where there is none."""
    global _group
    if _group is not None:
        return _group
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            _group = False
            return False
        if not dist.is_initialized():
            store = dist.HashStore()
            dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        _group = True
    except Exception:
        _group = False
    return _group


def ddp_bucket_reused(fixed: bool, widen: bool) -> bool:
    """A gradient bucket refilled for the next step while the collective of the previous step
    (on the process group's own stream) may still be reading it. One-rank NCCL group where
    there is one, else the collective is a copy on a side stream."""
    main = torch.cuda.current_stream()
    comm = torch.cuda.Stream()
    bucket = torch.empty(N, device="cuda")
    outs = [torch.empty(N, device="cuda") for _ in range(2)]
    nccl = _one_rank_group()
    pending = None
    for step in range(2):
        if fixed and pending is not None:
            pending()
        bucket.fill_(float(step + 1))  # RACE
        comm.wait_stream(main)
        with torch.cuda.stream(comm):
            if widen:
                torch.cuda._sleep(SLEEP)
            if nccl:
                import torch.distributed as dist

                work = dist.all_gather_into_tensor(outs[step], bucket, async_op=True)
                pending = work.wait
            else:
                outs[step].copy_(bucket)
                pending = lambda: main.wait_stream(comm)  # noqa: E731
    if pending is not None:
        pending()
    main.wait_stream(comm)
    torch.cuda.synchronize()
    return bool((outs[0] == 1).all()) and bool((outs[1] == 2).all())


def prefetch_pipeline(fixed: bool, widen: bool) -> bool:
    """A data prefetcher copying the next batch on its own stream; the consumer uses a batch
    without waiting for its copy (and frees it without record_stream)."""
    main = torch.cuda.current_stream()
    loader = torch.cuda.Stream()
    batches = [torch.full((N,), float(i + 1), pin_memory=True) for i in range(3)]

    def load(i):
        with torch.cuda.stream(loader):
            if widen:
                torch.cuda._sleep(SLEEP)
            return batches[i].to("cuda", non_blocking=True)

    nxt = load(0)
    sums = []
    for i in range(3):
        if fixed:
            main.wait_stream(loader)
        cur = nxt
        if fixed:
            cur.record_stream(main)
        if i + 1 < 3:
            nxt = load(i + 1)
        sums.append(cur * 1)  # RACE
    del cur, nxt
    torch.cuda.synchronize()
    return all(bool((s == i + 1).all()) for i, s in enumerate(sums))


def view_at_offset(fixed: bool, widen: bool) -> bool:
    """A side stream writes a view at an offset of a buffer; the default stream reads another,
    overlapping view of it (different data_ptr, same bytes)."""
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    buf = torch.zeros(2 * N, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        buf[N // 2 : N + N // 2].fill_(7.0)
    if fixed:
        main.wait_stream(side)
    tail = buf[N:].clone()  # RACE
    main.wait_stream(side)
    torch.cuda.synchronize()
    return bool((tail[: N // 2] == 7).all())


def disjoint_views(fixed: bool, widen: bool) -> bool:
    """Two streams write disjoint halves of one buffer concurrently: correct as it is (both
    variants are the same program; no hazard must be reported)."""
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    buf = torch.zeros(2 * N, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        buf[:N].fill_(1.0)
    buf[N:].fill_(2.0)
    main.wait_stream(side)
    torch.cuda.synchronize()
    return bool((buf[:N] == 1).all()) and bool((buf[N:] == 2).all())


PROGRAMS = {
    "side stream without wait": side_stream_without_wait,
    "free without record_stream, then reuse": free_without_record_stream,
    "non_blocking D2H read before sync": nonblocking_d2h_read_before_sync,
    "pinned staging buffer overwritten": pinned_staging_overwritten,
    "DDP-style bucket reused": ddp_bucket_reused,
    "prefetch pipeline": prefetch_pipeline,
    "view at an offset": view_at_offset,
}

# Correct as written: both variants must check clean and never corrupt.
CLEAN = {"disjoint views of one buffer": disjoint_views}


def race_lines(fn) -> set[int]:
    """The lines of `fn` marked `# RACE`."""
    import inspect

    src, first = inspect.getsourcelines(fn)
    return {first + i for i, line in enumerate(src) if line.rstrip().endswith("# RACE")}


# ----------------------------------------------------------------------------------------------
# CUDA graphs: the bugs of graph pools, static inputs and outputs, and captures with forked
# streams. A replay runs on the stream current at `replay()`; with `widen`, the graph itself
# spins (`torch.cuda._sleep` issued during the capture is captured), so the racing work runs
# while the replay is inside its window. A hazard found in a replay is reported at the
# `replay()` (its text names the captured op): that line is the one marked `# RACE`.


_warm = False


def _warmup() -> None:
    """Runs the kernels the captures use once, outside any capture (as PyTorch advises before
    capturing: lazy initialization must not happen inside a capture). Once per process."""
    global _warm
    if _warm:
        return
    a = torch.full((N,), 1.0, device="cuda")
    b = torch.empty(N, device="cuda")
    torch.mul(a * 10, 2, out=b)
    c = torch.full_like(b + 1, 9.0)
    c.copy_(a)
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    del a, b, c
    _warm = True


def graphs_share_a_pool_replayed_concurrently(fixed: bool, widen: bool) -> bool:
    """Two graphs captured into one pool (`graph_pool_handle()`): g1's temporary, freed in its
    capture, is the block g2's temporary gets. Replayed at the same time on two streams, g2
    overwrites g1's temporary while g1 still reads it (PyTorch allows sharing a pool only
    between graphs that never run concurrently)."""
    _warmup()
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x1 = torch.full((N,), 1.0, device="cuda")
    x2 = torch.full((N,), 2.0, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool):
        t1 = x1 * 10
        if widen:
            torch.cuda._sleep(SLEEP)
        o1 = t1 + 1
        del t1
    with torch.cuda.graph(g2, pool=pool):
        t2 = x2 * 10
        o2 = t2 + 1
        del t2
    side.wait_stream(main)  # the inputs are ready on both streams
    g1.replay()
    if fixed:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        g2.replay()  # RACE
    main.wait_stream(side)
    torch.cuda.synchronize()
    return bool((o1 == 11).all()) and bool((o2 == 21).all())


def static_input_copied_during_replay(fixed: bool, widen: bool) -> bool:
    """The next input is copied into the graph's static input on a side stream (a loader
    stream) while the previous replay may still read it."""
    _warmup()
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.full((N,), 1.0, device="cuda")  # the static input
    nxt = torch.full((N,), 5.0, device="cuda")  # the next batch
    side.wait_stream(main)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        if widen:
            torch.cuda._sleep(SLEEP)
        y = x * 2
    g.replay()
    first = y.clone()
    if fixed:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        x.copy_(nxt)  # RACE
    main.wait_stream(side)
    g.replay()
    second = y.clone()
    torch.cuda.synchronize()
    return bool((first == 2).all()) and bool((second == 10).all())


def static_output_read_before_replay_done(fixed: bool, widen: bool) -> bool:
    """A consumer on another stream reads the graph's static output without waiting for the
    replay that writes it."""
    _warmup()
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.full((N,), 3.0, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        if widen:
            torch.cuda._sleep(SLEEP)
        y = x * 2
    y.fill_(-1.0)
    g.replay()
    if fixed:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        z = y * 1  # RACE
    main.wait_stream(side)
    torch.cuda.synchronize()
    return bool((z == 6).all())


def fork_read_before_join_in_capture(fixed: bool, widen: bool) -> bool:
    """Inside the capture a forked stream computes y; the capture stream reads y before it
    joins the forked stream (the join comes later, before the capture ends, as CUDA requires):
    every replay races inside the graph."""
    _warmup()
    side = torch.cuda.Stream()
    x = torch.full((N,), 3.0, device="cuda")
    y = torch.empty(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap = torch.cuda.current_stream()
        side.wait_stream(cap)
        with torch.cuda.stream(side):
            if widen:
                torch.cuda._sleep(SLEEP)
            torch.mul(x, 2, out=y)
        if fixed:
            cap.wait_stream(side)
        out = y + 1
        if not fixed:
            cap.wait_stream(side)
    y.fill_(-1.0)
    g.replay()  # RACE
    torch.cuda.synchronize()
    return bool((out == 7).all())


def temp_freed_in_capture_without_record_stream(fixed: bool, widen: bool) -> bool:
    """A temporary of the capture stream, read by a forked stream, is freed inside the capture
    without record_stream: the pool hands its block to the next allocation of the same capture,
    which the replay writes while the forked stream may still read the temporary."""
    _warmup()
    side = torch.cuda.Stream()
    x = torch.full((N,), 3.0, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap = torch.cuda.current_stream()
        t = x * 2
        side.wait_stream(cap)
        with torch.cuda.stream(side):
            if widen:
                torch.cuda._sleep(SLEEP)
            y = t + 1
        if fixed:
            t.record_stream(side)
        del t
        u = torch.full_like(x, 9.0)
        cap.wait_stream(side)
    g.replay()  # RACE
    torch.cuda.synchronize()
    return bool((y == 7).all()) and bool((u == 9).all())


def one_graph_back_to_back_on_two_streams(fixed: bool, widen: bool) -> bool:
    """One graph replayed on one stream, then at once on another, without an event between:
    CUDA runs the launches of one graph one after the other, so this is correct (both variants
    are the same program; no hazard must be reported). The graph reads and writes `acc` in two
    kernels: overlapping replays would lose an increment."""
    _warmup()
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    acc = torch.zeros(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = acc + 1
        if widen:
            torch.cuda._sleep(SLEEP)
        acc.copy_(tmp)
        del tmp
    side.wait_stream(main)
    g.replay()
    with torch.cuda.stream(side):
        g.replay()
    main.wait_stream(side)
    torch.cuda.synchronize()
    return bool((acc == 2).all())


GRAPH_PROGRAMS = {
    "graphs sharing a pool replayed concurrently": graphs_share_a_pool_replayed_concurrently,
    "graph static input copied during a replay": static_input_copied_during_replay,
    "graph static output read before the replay is done": static_output_read_before_replay_done,
    "forked stream read before the join in a capture": fork_read_before_join_in_capture,
    "temporary freed in a capture without record_stream": temp_freed_in_capture_without_record_stream,
}

GRAPH_CLEAN = {"one graph replayed back to back on two streams": one_graph_back_to_back_on_two_streams}


def program_sets(which: str = "suite") -> tuple[dict, dict]:
    """(buggy-and-fixed programs, clean programs) of a set: "suite" (the programs above the
    graphs), "graphs", or "all"."""
    if which == "suite":
        return PROGRAMS, CLEAN
    if which == "graphs":
        return GRAPH_PROGRAMS, GRAPH_CLEAN
    if which == "all":
        return {**PROGRAMS, **GRAPH_PROGRAMS}, {**CLEAN, **GRAPH_CLEAN}
    raise ValueError(f"unknown program set {which!r}: expected suite, graphs or all")
