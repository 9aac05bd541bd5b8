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
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    x = torch.full((N,), -1.0, device="cuda")
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
