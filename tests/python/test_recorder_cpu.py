"""streamsan.torch's recorder on CPU tensors standing for device memory (no GPU needed).

In this mode (`_fake_device`) CPU tensors are device memory on a stream the test chooses, their
allocations are taken from the ops that return fresh storage, and synchronizations are pushed
as the _gpu_trace callbacks would. It tests what both backends make of real aten ops: regions of
views, reads and writes from the schemas, nested ops written once, sites.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import marked_line, native_ext_or_skip, torch_or_skip

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marked_line(HERE, marker)


class Fake:
    def __init__(self, run):
        self.b = run._recorder.backend

    def stream(self, raw: int, name: str | None = None):
        if name:
            self.b.name_stream(raw, name)
        if self.b.name == "native":
            self.b.ext.set_fake_stream(raw)
        else:
            self.b.fake_stream = raw

    def record(self, event: int, raw: int):
        self.b.host_op('{"op":"event_record","event":"e%d","stream":%s' % (event, self.b.stream_id(raw, 0)))

    def wait(self, raw: int, event: int):
        self.b.host_op('{"op":"event_wait","stream":%s,"event":"e%d"' % (self.b.stream_id(raw, 0), event))

    def sync(self, event: int):
        self.b.host_op('{"op":"event_sync","event":"e%d"' % event)

    def pinned(self, n: int):
        """A CPU tensor standing for pinned host memory (allocated here)."""
        import torch

        b = self.b
        if b.name == "native":
            b.ext.set_active(False)
            t = torch.ones(n)
            b.ext.set_active(True)
        else:
            b.rec.on = False
            t = torch.ones(n)
            b.rec.on = True
        b.fake_pin(t)
        return t


def checked(backend, body, trace=None):
    import streamsan.torch

    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, trace=trace, _fake_device=True)
    with run:
        body(Fake(run))
    assert run.backend == backend
    return run


def trace_ops(path):
    """The ops of the trace file at `path`, as dicts."""
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def sites(run):
    return {(h["kind"], int(h["access"]["site"].rsplit(":", 1)[1])) for h in run.report.hazards if h["access"]}



@pytest.mark.parametrize("fixed", [False, True])
def test_a_sparse_tensors_indices_and_values_are_its_regions(backend, fixed):
    """An op on a sparse tensor reads and writes its indices and values, which its kernels
    reach outside the dispatcher: a side stream multiplying a sparse tensor made on the default
    stream races with the making and with the default stream's later write of its values,
    under both recorders (the Python one records the sparse tensor as its parts); with the waits,
    nothing."""
    import torch

    def body(f):
        f.stream(0)
        d = torch.zeros(64, 64)
        d[3, 4] = 1.0
        s = d.to_sparse()
        if fixed:
            f.record(1, 0)
        f.stream(2, "side")
        if fixed:
            f.wait(2, 1)
        r = s * 2  # SPARSE READ
        if fixed:
            f.record(3, 2)
        f.stream(0)
        if fixed:
            f.wait(0, 3)
        s._values().fill_(5)  # SPARSE WRITE
        return r

    run = checked(backend, body)
    if fixed:
        assert run.report.hazards == [], run.report.to_text()
    else:
        assert sites(run) == {("data-race", line_of("SPARSE READ")), ("data-race", line_of("SPARSE WRITE"))}



@pytest.mark.parametrize("case", ["metadata", "in-place", "constructor", "replaced"])
def test_what_an_op_does_not_touch_of_a_sparse_tensor_is_no_race(backend, case):
    """Two streams on one sparse tensor, after both waited for it: reading its metadata
    (`_nnz()`) while the other stream writes its values, scaling its values in place while the
    other stream reads its indices, making
    a sparse tensor of index and value tensors while the other stream reads the values, and
    adding to it in place (`add_`: new index and value tensors; the old values only read) while
    the other stream reads its old values, touch nothing the other stream writes: no hazard
    under either recorder."""
    import torch

    def body(f):
        f.stream(0)
        d = torch.zeros(64, 64)
        d[3, 4] = 1.0
        s = d.to_sparse()
        i, v = s._indices().clone(), s._values().clone()
        f.record(1, 0)
        f.stream(2, "side")
        f.wait(2, 1)
        if case == "metadata":
            kept = s._values().add_(1)  # the side stream writes the values
        elif case == "in-place":
            kept = s._indices().sum()
        elif case == "replaced":
            kept = s._values() * 2  # the side stream reads the values s has now
        else:
            kept = v * 2
        f.stream(0)
        if case == "metadata":
            kept2 = s._nnz()
        elif case == "in-place":
            kept2 = s.mul_(2)
        elif case == "replaced":
            old = s._values()
            kept2 = s.add_(torch.eye(64).to_sparse())
            assert s._values().data_ptr() != old.data_ptr()  # new values: the old ones only read
        else:
            kept2 = torch.sparse_coo_tensor(i, v, (64, 64), check_invariants=False)
        return kept, kept2

    run = checked(backend, body)
    assert run.report.hazards == [], run.report.to_text()


def test_views_at_offsets(backend):
    import torch

    def body(f):
        f.stream(0)
        x = torch.ones(1024)
        y = x * 2
        f.stream(1, "side")
        z = y[256:512] + 1  # READ
        f.stream(0)
        y[600:700].fill_(3)  # disjoint from the side stream's read: no hazard
        y[300:310].fill_(4)  # WRITE
        del z

    run = checked(backend, body)
    assert sites(run) == {("data-race", line_of("READ")), ("data-race", line_of("WRITE"))}
    read = next(h for h in run.report.hazards if h["access"]["access"] == "read")
    assert (read["access"]["offset"], read["access"]["bytes"]) == (1024, 1024)
    assert read["access"]["participant"] == "side"
    assert read["conflicts"][-1]["participant"] == "default"


def test_a_cpu_address_freed_on_one_stream_and_used_on_another_is_no_sync(backend, tmp_path):
    """The fake device's CPU memory goes from one stream to another at the same address at once;
    the caching allocator's does so only through the driver, which synchronizes the device. The
    trace gives the CPU storages addresses of the recorder's, reused on the same stream only, so
    the stand-in implies no such sync: the race on `x` stays reported (it was missed where the
    CPU heap reused an address)."""
    import json

    import torch

    seen: dict[str, set[int]] = {"a": set(), "b": set()}

    def body(f):
        f.stream(1, "a")
        x = torch.ones(8)
        x.add_(1)
        for i in range(64):  # temporaries, one stream then the other: the heap reuses addresses
            name = "ab"[i % 2]
            f.stream(1 + i % 2, name)
            t = torch.ones(256)
            t.add_(1)
            seen[name].add(t.data_ptr())
            del t
        f.stream(2, "b")
        # a's add_ is not waited for:
        x.mul_(2)  # RACE

    path = tmp_path / "t.jsonl"
    run = checked(backend, body, trace=path)
    assert sites(run) == {("data-race", line_of("RACE"))}, run.report.to_text()
    # An address is written again on the stream that freed it only, as the caching allocator
    # gives a block back to its stream's pool: each stream's temporaries take one address.
    streams: dict[int, set[str]] = {}
    allocs = 0
    for o in map(json.loads, path.read_text().splitlines()):
        if o["op"] == "alloc":
            allocs += 1
            streams.setdefault(o["addr"], set()).add(o["stream"])
    assert all(len(s) == 1 for s in streams.values()), streams
    assert allocs >= 65 and len(streams) <= 16, (allocs, streams)  # blocks reused
    if not seen["a"] & seen["b"]:
        pytest.skip("this CPU heap gave no address to both streams (the race is checked anyway)")


_PG_LIBRARY = []


def _pg_allreduce(f, inside: int):
    """Calls `c10d::streamsan_test_pg_allreduce_` on a CPU tensor: as ProcessGroupNCCL's
    collectives, the process group's stream 3 waits for the current stream's event 10, the
    kernel writes the tensor on 3, then the work's end event 11 is recorded on 3; after it,
    `inside` 1 has the caching allocator hand out and take back a block, 2 calls an op."""
    import torch

    if not _PG_LIBRARY:
        lib = torch.library.Library("c10d", "FRAGMENT")
        lib.define("streamsan_test_pg_allreduce_(Tensor(a!) t, int inside) -> Tensor(a!)")

        def impl(t, inside):
            fake = _PG_LIBRARY[1]
            fake.record(10, 1)
            fake.wait(3, 10)
            fake.record(11, 3)  # the end event, after the kernel
            if inside == 1:
                fake.b.fake_trace(True, 1 << 44, 512, 1)
                fake.b.fake_trace(False, 1 << 44, 0, 1)
            elif inside == 2:
                torch.ops.aten.view.default(t, [-1])
            return t

        lib.impl("streamsan_test_pg_allreduce_", impl, "CPU")
        _PG_LIBRARY[:] = [lib, f]
    _PG_LIBRARY[1] = f
    return lambda t: torch.ops.c10d.streamsan_test_pg_allreduce_(t, inside)


@pytest.mark.parametrize("inside", [0, 1, 2], ids=["nothing", "allocator", "op"])
def test_a_collective_is_waited_for_through_its_end_event(backend, inside):
    """The current stream waiting on a collective's end event (`work.wait()`) is ordered after
    the collective's kernel, also when the allocator or an op ran inside the collective after
    the event (which used to write the event before the collective's launch, on the stream
    current then: a false race)."""
    import torch

    def body(f):
        f.stream(3, "pg")
        f.stream(1, "a")
        allreduce = _pg_allreduce(f, inside)
        x = torch.ones(8)
        x.add_(1)
        allreduce(x)
        f.wait(1, 11)  # work.wait()
        y = x * 2
        allreduce(x)
        z = x * 2  # RACE after the collective
        del y, z

    run = checked(backend, body)
    assert sites(run) == {("data-race", line_of("RACE after the collective"))}, run.report.to_text()
    race = run.report.hazards[0]
    assert race["conflicts"][-1]["participant"] == "pg", race


def test_event_orders_streams(backend):
    import torch

    def body(f):
        f.stream(0)
        x = torch.ones(4096)
        f.record(1, 0)
        f.wait(2, 1)
        f.stream(2, "side")
        y = x.sum()
        f.record(2, 2)
        f.stream(0)
        f.wait(0, 2)
        x.add_(1)
        del y

    assert checked(backend, body).report.errors == 0


def test_in_place_and_out_writes(backend):
    import torch

    def body(f):
        f.stream(0)
        a = torch.zeros(64)
        b = torch.zeros(64)
        f.stream(1, "side")
        torch.add(b, 1, out=a)  # OUT
        f.stream(0)
        a.mul_(2)  # INPLACE

    kinds = sites(checked(backend, body))
    assert ("data-race", line_of("OUT")) in kinds and ("data-race", line_of("INPLACE")) in kinds


def test_ops_on_a_tensors_metadata_write_no_memory(backend):
    """`unsqueeze_`, `t_`, `squeeze_`, `as_strided_`, `transpose_`, `detach_` and `set_` change
    the tensor object only (its sizes, strides, storage), though their schemas mark `self`
    written: on one stream while another reads the memory, they are no race."""
    import torch

    kept = []

    def body(f):
        f.stream(0)
        x = torch.ones(64)
        kept.append(x[:])  # x's first storage outlives set_ (its free would be unsafe: the read runs)
        f.record(1, 0)
        f.wait(1, 1)
        f.stream(1, "side")
        y = x * 2
        f.stream(0)
        x.unsqueeze_(0)
        x.t_()
        x.squeeze_()
        x.as_strided_((8, 8), (8, 1))
        x.transpose_(0, 1)
        x.detach_()
        x.set_(torch.zeros(4).untyped_storage())
        z = x + 1  # the new storage's, on the current stream
        del y, z

    run = checked(backend, body)
    assert run.report.errors == 0, run.report.to_text()


def test_set_is_recorded_only_when_it_grows_the_storage(backend, tmp_path):
    """`set_` to a storage that holds the view changes the tensor object alone: nothing is
    written. `set_` to a view past the storage's end grows the storage (a new block, the old
    bytes copied on the current stream): that call is written as an op."""

    import torch

    path = tmp_path / "t.jsonl"

    def body(f):
        f.stream(0)
        x = torch.ones(64)
        y = torch.ones(8)
        x.set_(y.untyped_storage())  # FITS: the whole storage
        x.set_(y.untyped_storage(), 2, (2, 3))  # FITS: elements 2..7
        x.set_(y, 0, (4,), (2,))  # FITS: elements 0, 2, 4, 6 of y's storage
        z = torch.ones(4)
        z.set_(z.untyped_storage(), 0, (16,))  # GROWS
        z.add_(1)

    checked(backend, body, trace=path)
    ops = trace_ops(path)
    sets = [int(o["site"].rsplit(":", 1)[1]) for o in ops if o.get("name") == "aten::set_"]
    assert sets == [line_of("GROWS")], sets


_rebind_op = None


def _rebind():
    """`streamsan_rebind::rebind(Tensor(a!) t, Tensor src)`: an op that gives `t` the storage of
    `src` (`set_` inside it), so that `t`'s own storage dies while the op runs (defined once per
    process)."""
    global _rebind_op
    if _rebind_op is None:
        import torch

        lib = torch.library.Library("streamsan_rebind", "DEF")
        lib.define("rebind(Tensor(a!) t, Tensor src) -> ()")
        def impl(t, src):
            t.set_(src.untyped_storage())

        lib.impl("rebind", impl, "CompositeExplicitAutograd")
        _rebind_op = (lib, torch.ops.streamsan_rebind.rebind)
    return _rebind_op[1]


def test_a_storage_dropped_inside_an_op_is_not_looked_at_after(backend):
    """An op may drop the storage of a tensor it was given while it runs: `rebind` below, or
    `copy.deepcopy` of a tensor (an empty tensor `set_` to the copied storage). The storage the
    recorder saw at the op's start stays valid until the op's end (the C++ recorder used to
    make a new allocation from it after it was freed, and crashed), and the check goes on."""
    import copy

    import torch

    rebind = _rebind()

    def body(f):
        f.stream(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
        twin = copy.deepcopy(m)
        for i in range(20):
            t = torch.ones(16)
            rebind(t, torch.ones(8))  # t's own storage is freed inside the op
            t.add_(1)
            u = torch.ones(16 + i)  # may take the freed block
            u.mul_(2)
        out = twin(torch.ones(4, 8))
        del out

    run = checked(backend, body)
    assert run.report.errors == 0, run.report.to_text()


def test_nested_ops_are_written_once(backend, tmp_path):
    import torch

    path = tmp_path / "t.jsonl"

    def body(f):
        f.stream(0)
        w = torch.ones(16, 8)
        x = torch.ones(4, 8)
        torch.nn.functional.linear(x, w)

    checked(backend, body, trace=path)
    ops = trace_ops(path)
    launches = [o for o in ops if o["op"] == "launch"]
    # two fills and one matrix product: linear and matmul add nothing of their own
    assert len([o for o in launches if o["name"] in ("aten::mm", "aten::addmm")]) == 1
    assert not [o for o in launches if o["name"] in ("aten::linear", "aten::matmul", "aten::t")]
    assert all(o["site"].endswith(".py:%d" % int(o["site"].rsplit(":", 1)[1])) for o in ops if o.get("site"))
    assert all("test_recorder_cpu.py" in o["site"] for o in ops if o.get("site"))


def test_copy_from_pinned_memory_runs_on_the_current_stream(backend):
    # A prefetcher: a non_blocking copy of a pinned batch into a new device tensor on the loader
    # stream (its only device tensor is its output), used on the default stream without a wait.
    import torch

    def body(f):
        f.stream(0)
        host = f.pinned(1024)
        f.stream(1, "loader")
        dev = host.to(torch.float64, non_blocking=True)
        made = torch.full((256,), 2.0)  # an op without inputs, on the loader stream too
        f.stream(0)
        dev.mul_(2)  # PREFETCH
        made.add_(1)  # MADE

    run = checked(backend, body)
    assert sites(run) == {("data-race", line_of("PREFETCH")), ("data-race", line_of("MADE"))}
    for h in run.report.hazards:
        assert h["conflicts"][-1]["participant"] == "loader"


def test_copy_from_pinned_memory_waited_for(backend):
    import torch

    def body(f):
        f.stream(0)
        host = f.pinned(1024)
        f.stream(1, "loader")
        dev = host.to(torch.float64, non_blocking=True)
        f.record(1, 1)
        f.stream(0)
        f.wait(0, 1)
        dev.mul_(2)

    assert checked(backend, body).report.errors == 0


@pytest.mark.parametrize("fixed", [False, True])
def test_pinned_staging_buffer_overwritten(backend, fixed):
    # The host refills a pinned staging buffer while the copy of its previous contents, on a
    # copy stream, may still read it; the fix waits for the copy's event first.
    import torch

    def body(f):
        f.stream(0)
        staging = f.pinned(1024)
        f.stream(1, "copier")
        dst = torch.zeros(1024)
        dst.copy_(staging, non_blocking=True)
        f.record(1, 1)
        f.stream(0)
        if fixed:
            f.sync(1)
        staging.fill_(2.0)  # REFILL

    run = checked(backend, body)
    if fixed:
        assert run.report.errors == 0, run.report.to_text()
    else:
        assert sites(run) == {("data-race", line_of("REFILL"))}
        h = run.report.hazards[0]
        assert h["access"]["participant"] == "host" and h["conflicts"][-1]["participant"] == "copier"


def test_buffer_names_are_reused_late(backend, tmp_path):
    # A long loop allocates a new buffer each step; a freed buffer's name comes back only after
    # NAME_DELAY other frees, so the checker's table of names stays bounded.
    import json

    import torch

    from streamsan.torch._recorder import _FAKE_ADDR_BASE, NAME_DELAY

    path = tmp_path / "t.jsonl"
    steps = NAME_DELAY + 600

    def body(f):
        f.stream(0)
        x = torch.ones(1024)
        base = 1 << 40  # far from the CPU tensors
        for i in range(steps):
            # the allocator's tracker: a temporary of each step, freed at the next
            f.b.fake_trace(True, base + (i % 2) * 4096, 4096, 0)
            x.mul_(x)
            if i:
                f.b.fake_trace(False, base + ((i - 1) % 2) * 4096, 0, 0)

    run = checked(backend, body, trace=path)
    assert run.report.errors == 0
    live: set[str] = set()
    freed: list[str] = []
    names = set()
    traced = set()  # the names of the tracker's allocations
    for line in path.read_text().splitlines():
        op = json.loads(line)
        if op["op"] == "alloc":
            b = op["buffer"]
            assert b not in live
            if b in names:
                # given again only after more than NAME_DELAY other frees
                assert len(freed) - 1 - freed.index(b) >= NAME_DELAY
                freed.remove(b)
            names.add(b)
            live.add(b)
            if 1 << 40 <= op.get("addr", 0) < _FAKE_ADDR_BASE:
                traced.add(b)
        elif op["op"] == "free":
            live.discard(op["buffer"])
            freed.append(op["buffer"])
    # steps - 1 frees: all but about NAME_DELAY of the allocations took a name given before
    assert len(traced) <= NAME_DELAY + 4 < steps - 500


def test_stats_during_a_check(backend):
    import torch

    import streamsan.torch

    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
    with run:
        f = Fake(run)
        f.stream(0)
        x = torch.ones(256)
        x.add_(1)
        during = run.stats()
    assert {"ops", "history", "generations", "graveyard", "participants", "hazards"} <= set(during)
    assert during["recorder_live_device_buffers"] >= 1 and during["recorder_live_pinned_buffers"] == 0
    after = run.stats()
    assert "history" not in after and "recorder_live_device_buffers" in after
    assert run.report.ops >= 2
    del x


def test_a_checks_buffers_are_let_go_of_off_the_programs_thread_when_the_next_one_starts():
    """The buffers a check knew (hundreds: a few are freed at once) are handed to the
    recorder's thread when the next check starts, which frees them (the count of those not freed
    yet goes back to none once they are destroyed), and the new check knows none of them."""
    import time

    torch_or_skip()
    native_ext_or_skip()
    import torch

    import streamsan.torch

    kept = []
    with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True) as first:
        Fake(first).stream(0)
        for _ in range(400):
            kept.append(torch.ones(64) + 1)
        stats = first.stats()
        before, handed = stats["recorder_live_device_buffers"], stats["recorder_leftovers_handed"]
    assert before >= 400
    with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True) as second:
        Fake(second).stream(0)
        stats = second.stats()
        assert stats["recorder_live_device_buffers"] == 0  # forgotten with the first check
        assert stats["recorder_leftovers_handed"] == handed + 1  # handed to the recorder's thread
        deadline = time.monotonic() + 10
        while stats["recorder_leftovers_unfreed"] and time.monotonic() < deadline:
            time.sleep(0.001)
            stats = second.stats()
        assert stats["recorder_leftovers_unfreed"] == 0
        kept[0].add_(1)  # a buffer of the first check, met again: allocated before this one
    assert second.report.errors == 0 and second.report.ops >= 1
    del kept


def test_phase_seconds_time_entering_and_leaving_by_part(backend):
    """Run.phase_seconds: each part of entering and leaving the check, once it is done; together
    they are within the time the `with` statement's entry and exit took."""
    import time

    import torch

    import streamsan.torch

    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
    t0 = time.perf_counter()
    with run:
        t1 = time.perf_counter()
        entered = dict(run.phase_seconds)
        Fake(run).stream(0)
        x = torch.ones(64)
        x.add_(1)
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    enter = ["enter_checker", "enter_recorder", "enter_start"]
    leave = ["exit_recorder", "exit_drain", "exit_report"]
    assert list(entered) == enter
    assert set(run.phase_seconds) == set(enter + leave)
    assert all(v >= 0 for v in run.phase_seconds.values())
    assert sum(run.phase_seconds[k] for k in enter) <= t1 - t0
    assert sum(run.phase_seconds[k] for k in leave) <= t3 - t2
    del x


def test_hazard_error_and_report(backend):
    import torch

    import streamsan
    import streamsan.torch

    run = streamsan.torch.Run(backend=backend, _fake_device=True)
    with pytest.raises(streamsan.HazardError) as e:
        with run:
            f = Fake(run)
            f.stream(0)
            x = torch.ones(64)
            f.stream(1, "side")
            x.add_(1)
    assert run.report.errors == 1 and "data-race" in str(e.value) and "why:" in str(e.value)
    # An exception of the block itself wins.
    run2 = streamsan.torch.Run(backend=backend, _fake_device=True)
    with pytest.raises(KeyError):
        with run2:
            f = Fake(run2)
            f.stream(0)
            x = torch.ones(64)
            f.stream(1, "side")
            x.add_(1)
            raise KeyError("mine")
    assert run2.report.errors == 1


def test_one_check_at_a_time(backend):
    import streamsan.torch

    with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True):
        with pytest.raises(RuntimeError, match="already running"):
            with streamsan.torch.Run(backend=backend, _fake_device=True):
                pass


def test_a_check_begun_inside_a_capture_is_refused_and_sets_nothing_up(backend, monkeypatch):
    """A check entered while the current stream captures a CUDA graph (its captured work would be
    recorded as if it ran) is refused with an error that says where to begin it; it installed
    nothing, and the next check runs."""
    torch_or_skip()
    import streamsan.torch
    import streamsan.torch._recorder as R

    monkeypatch.setattr(R.Recorder, "_capturing_now", lambda self: True)
    with pytest.raises(RuntimeError, match="capturing a CUDA graph.*begin it before the capture"):
        with streamsan.torch.Run(backend=backend, _fake_device=True):
            pytest.fail("the block ran")
    assert R._active is None
    monkeypatch.undo()
    with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True) as run:
        pass
    assert run.report is not None and run.report.clean


def test_capturing_now_asks_the_current_stream_only_where_cuda_is_initialized(monkeypatch):
    """What `_capturing_now` asks: nothing without CUDA, on the fake device, or before CUDA is
    initialized (no capture can run, and asking would initialize it); else the current
    stream."""
    torch = torch_or_skip()
    import types

    import streamsan.torch._recorder as R

    asked = []

    def capturing():
        asked.append(1)
        return state["capturing"]

    state = {"init": False, "capturing": True}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["init"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", capturing)
    rec = types.SimpleNamespace(cuda=True, backend=types.SimpleNamespace(fake_device=False))
    assert R.Recorder._capturing_now(rec) is False and not asked  # CUDA not initialized
    state["init"] = True
    assert R.Recorder._capturing_now(rec) is True and len(asked) == 1
    state["capturing"] = False
    assert R.Recorder._capturing_now(rec) is False and len(asked) == 2
    state["capturing"] = True
    for other in (types.SimpleNamespace(cuda=False, backend=rec.backend),
                  types.SimpleNamespace(cuda=True, backend=types.SimpleNamespace(fake_device=True))):
        assert R.Recorder._capturing_now(other) is False
    assert len(asked) == 2

    def refused():
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", refused)
    assert R.Recorder._capturing_now(rec) is False  # CUDA would not say: the check begins


def test_without_cuda_nothing_is_recorded():
    torch = torch_or_skip()
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import streamsan.torch

    with streamsan.torch.check() as run:
        x = torch.ones(100)
        (x * 2).sum().item()
    assert run.report.ops == 0 and run.report.clean


# A script's first lines on the fake device: `b` the running check's recorder, `setf(raw)` makes
# `raw` the current stream.
SCRIPT_HEAD = """
import torch, streamsan.torch._recorder as R
def main():
    b = R._active.backend
    setf = (lambda raw: b.ext.set_fake_stream(raw)) if b.name == "native" else (lambda raw: setattr(b, "fake_stream", raw))
"""

SCRIPT = SCRIPT_HEAD + """    setf(0)
    x = torch.ones(64)
    b.name_stream(1, "side")
    setf(1)
    x.add_(1)
main()
"""


def python_m(script, *args, backend=None, **env):
    """`python -m streamsan.torch [args] script` on the fake device, in the script's folder (the
    recorder `backend` where given, `env` added to the environment), bounded in time."""
    env = dict(os.environ, STREAMSAN_TORCH_FAKE_DEVICE="1", **env)
    if backend is not None:
        env["STREAMSAN_TORCH_BACKEND"] = backend
    return subprocess.run([sys.executable, "-m", "streamsan.torch", *args, str(script)], capture_output=True,
                          text=True, env=env, cwd=script.parent, timeout=120)


def test_python_m_streamsan_torch(backend, tmp_path):
    torch_or_skip()
    script = tmp_path / "racy.py"
    script.write_text(SCRIPT)
    out = python_m(script, backend=backend)
    assert out.returncode == 1, out.stderr
    assert "data-race" in out.stderr and "racy.py:10" in out.stderr


SYNCED_SCRIPT = SCRIPT_HEAD + """    setf(0)
    x = torch.ones(64)
    b.host_op('{"op":"event_record","event":"e1","stream":%s' % b.stream_id(0, 0))
    b.name_stream(1, "side")
    b.host_op('{"op":"event_wait","event":"e1","stream":%s' % b.stream_id(1, 0))  # needed
    b.host_op('{"op":"event_record","event":"e2","stream":%s' % b.stream_id(0, 0))
    setf(1)
    x.add_(1)
    b.host_op('{"op":"event_wait","event":"e2","stream":%s' % b.stream_id(1, 0))  # not needed
main()
"""


def test_python_m_streamsan_torch_syncs(backend, tmp_path):
    """`--syncs`: the synchronization analysis, each wait said needed or not at its line."""
    torch_or_skip()
    script = tmp_path / "synced.py"
    script.write_text(SYNCED_SCRIPT)

    def run(*args):
        return python_m(script, *args, backend=backend)

    out = run("--syncs")
    assert out.returncode == 0, out.stderr
    assert "an event wait at synced.py:10 made a stream wait 1 time; it was needed" in out.stderr, out.stderr
    assert "an event wait at synced.py:14 made a stream wait 1 time; it was not needed" in out.stderr, out.stderr
    assert out.stderr.count("it was needed") == 1, out.stderr  # said once, with the report
    assert "no hazards" in out.stderr
    plain = run()
    assert plain.returncode == 0 and "synchroniz" not in plain.stderr, plain.stderr
    # A JSON report on standard error is the whole of it: the analysis is in it.
    js = run("--syncs", "--format", "json")
    assert js.returncode == 0, js.stderr
    syncs = json.loads(js.stderr)["syncs"]
    assert syncs, js.stderr


def test_python_m_streamsan_torch_exit_statuses(tmp_path):
    """The script's own `sys.exit` status; a message given to `sys.exit` printed, status 1."""
    torch_or_skip()
    for code, status, said in (("3", 3, None), ("None", 0, None), ("'no data found'", 1, "no data found")):
        script = tmp_path / "exits.py"
        script.write_text(f"import sys\nsys.exit({code})\n")
        out = python_m(script)
        assert out.returncode == status, (code, out.stderr)
        assert said is None or said in out.stderr, (code, out.stderr)
        assert "no hazards" in out.stderr, out.stderr


FAILING_SCRIPT = SCRIPT.replace("main()\n", "main()\nraise RuntimeError('the script fails after its race')\n")


def test_python_m_streamsan_torch_reports_before_a_failing_scripts_traceback(backend, tmp_path):
    """A script that raises still gets its report (what it ran before), then its traceback and
    Python's exit status for an uncaught exception."""
    torch_or_skip()
    script = tmp_path / "failing.py"
    script.write_text(FAILING_SCRIPT)
    assert FAILING_SCRIPT != SCRIPT
    out = python_m(script, backend=backend)
    assert out.returncode == 1, out.stderr
    err = out.stderr
    assert "data-race" in err and "failing.py:10" in err, err
    assert "RuntimeError: the script fails after its race" in err, err
    assert err.index("data-race") < err.index("Traceback"), err
    # Under torchrun a rank whose script failed leaves at once (the launcher then stops the
    # others), without waiting for the other ranks of its node as a rank that ran to its end does.
    out = python_m(script, backend=backend, TORCHELASTIC_RUN_ID=f"failing-{os.getpid()}", RANK="0",
                   WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    assert out.returncode == 1, out.stderr
    assert "rank 0" in out.stderr and "RuntimeError: the script fails after its race" in out.stderr, out.stderr


PLUGIN_TEST = """
import pytest, torch, streamsan.torch._recorder as R

def race():
    b = R._active.backend
    setf = (lambda raw: b.ext.set_fake_stream(raw)) if b.name == "native" else (lambda raw: setattr(b, "fake_stream", raw))
    setf(0)
    x = torch.ones(64)
    b.name_stream(1, "side")
    setf(1)
    x.add_(1)

def test_plain():
    if R._active is not None:
        race()

@pytest.mark.streamsan
def test_marked():
    race()

def test_fixture(streamsan):
    race()

def test_triton_wrappers_kept_only_when_every_test_is_checked():
    import os
    assert R._KEEP_WRAPPERS == (os.environ["EXPECT_KEEP"] == "1")
"""


def test_pytest_plugin(backend, tmp_path):
    torch_or_skip()
    (tmp_path / "test_x.py").write_text(PLUGIN_TEST)
    env = dict(os.environ, STREAMSAN_TORCH_FAKE_DEVICE="1", STREAMSAN_TORCH_BACKEND=backend)

    def run(*args, keep="0"):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                              capture_output=True, text=True, env=dict(env, EXPECT_KEEP=keep), cwd=tmp_path)

    out = run()
    # test_plain passes (not checked), test_marked fails, test_fixture fails at teardown; Triton's
    # wrappers are put back after each check (some tests run unchecked).
    assert outcomes(out.stdout) == {"failed": 1, "passed": 3, "error": 1}, out.stdout
    assert "HazardError" in out.stdout and "data-race" in out.stdout
    out = run("--streamsan", keep="1")  # every test checked: the wrappers stay between them
    assert outcomes(out.stdout) == {"failed": 2, "passed": 2, "error": 1}, out.stdout


def outcomes(stdout: str) -> dict:
    """pytest's final counts (warnings left out)."""
    import re

    last = [line for line in stdout.splitlines() if line.strip()][-1]
    counts = {k.rstrip("s"): int(n) for n, k in re.findall(r"(\d+) (failed|passed|errors?|skipped)", last)}
    return counts


# ----------------------------------------------------------------------------------------------
# What a real program does, recorded as it does it: the order of one thread's ops, the identity
# of a pinned block handed out again, each region of an op once.

_SCOPED = {}


def _scoped_op():
    """A custom op `streamsan_test::scoped(Tensor(a!) x)` whose implementation calls the test's
    `before(x)` (host ops: an event wait) and then adds 1 to x in place, as a hook or an
    autograd node does around the ops it runs; the dispatcher records it (a FUNCTION scope)
    around the ops it calls."""
    import torch

    if "op" not in _SCOPED:
        lib = torch.library.Library("streamsan_test", "DEF")
        lib.define("scoped(Tensor(a!) x) -> ()")

        def impl(x):
            _SCOPED["before"](x)
            x.add_(1)  # SCOPED_ADD

        lib.impl("scoped", impl, "CPU")
        _SCOPED["lib"] = lib
        _SCOPED["op"] = torch.ops.streamsan_test.scoped
    return _SCOPED["op"]


@pytest.mark.parametrize("wait", [True, False])
def test_a_wait_inside_an_enclosing_op_comes_before_the_ops_it_orders(backend, wait, tmp_path):
    # The default stream zeroes g (zero_grad); the side stream waits for it inside an enclosing
    # scope (the autograd engine's wait for the gradient's producer, a hook) and then adds to g
    # (AccumulateGrad's add_). The wait must be written before the add_ it orders.
    import torch

    scoped = _scoped_op()
    path = tmp_path / "t.jsonl"

    def body(f):
        f.stream(0)
        g = torch.zeros(1024)
        f.record(1, 0)
        f.stream(1, "side")

        def before(x):
            if wait:
                f.wait(1, 1)

        _SCOPED["before"] = before
        scoped(g)  # ACCUMULATE
        f.record(2, 1)
        f.stream(0)
        f.wait(0, 2)
        g.mul_(2)

    run = checked(backend, body, trace=path)
    if wait:
        assert run.report.errors == 0, run.report.to_text()
        ops = trace_ops(path)
        side = [i for i, o in enumerate(ops) if o.get("stream") == "side"]
        # on the side stream: the wait, then the work it orders
        assert ops[side[0]]["op"] == "event_wait", ops
        assert any(ops[i]["op"] == "launch" for i in side[1:])
    else:
        # at the add_ the custom op runs (C++ recorder: it sees the nested op) or at the custom
        # op's call (Python recorder: the outermost op)
        found = sites(run)
        assert len(found) == 1 and found <= {("data-race", line_of("ACCUMULATE")), ("data-race", line_of("SCOPED_ADD"))}, found


def test_syncs_of_nested_ops_keep_the_threads_order(tmp_path):
    # Host ops interleaved with the ops a custom op calls: wait, op, record, wait, op: the trace
    # lists them in that order (C++ recorder: every nested op is seen).

    torch = torch_or_skip()
    native_ext_or_skip()
    scoped = _scoped_op()
    path = tmp_path / "t.jsonl"

    def body(f):
        f.stream(0)
        a = torch.zeros(256)
        b = torch.zeros(256)
        f.record(1, 0)
        f.stream(1, "side")

        def before(x):
            f.wait(1, 1)
            b.add_(1)
            f.record(2, 1)
            f.wait(1, 2)

        _SCOPED["before"] = before
        scoped(a)

    checked("native", body, trace=path)
    ops = trace_ops(path)
    seq = [
        (o["op"], o.get("name"), o.get("event"))
        for o in ops
        if o.get("stream") == "side" and (o["op"] != "launch" or o["name"] == "aten::add_") and o["op"] != "alloc"
    ]
    assert seq == [
        ("event_wait", None, "e1"),
        ("launch", "aten::add_", None),
        ("event_record", None, "e2"),
        ("event_wait", None, "e2"),
        ("launch", "aten::add_", None),
    ], seq


def test_an_in_place_op_on_one_region_writes_it_once(backend, tmp_path):
    import torch

    path = tmp_path / "t.jsonl"

    def body(f):
        f.stream(0)
        x = torch.ones(512)
        x.add_(x)
        y = torch.ones(512)
        x.add_(y)

    checked(backend, body, trace=path)
    ops = trace_ops(path)
    adds = [o for o in ops if o["op"] == "launch" and o["name"] == "aten::add_"]
    assert len(adds) == 2
    assert len(adds[0]["writes"]) == 1 and "reads" not in adds[0], adds[0]
    assert len(adds[1]["writes"]) == 1 and len(adds[1]["reads"]) == 1, adds[1]
    assert adds[1]["reads"][0]["buffer"] != adds[1]["writes"][0]["buffer"]


def _pin(f, t):
    """Tests: `t` (a CPU tensor) stands for a pinned block allocated now."""
    f.b.fake_pin(t)
    return t


@pytest.mark.parametrize("reuse", [True, False])
def test_a_pinned_block_handed_out_again_is_a_new_buffer(backend, reuse, tmp_path):
    # A loader pins a new batch each step: the host allocator hands the next batch the block of
    # an earlier one once the event it recorded for that batch's non_blocking copy completed.
    # The new batch's storage is a new buffer (the old one was freed, untraced): the host's fill
    # of it does not race the old copy. Writing the old batch again while its copy may still
    # read it (reuse=False: the same storage) is a race.
    import torch

    path = tmp_path / "t.jsonl"
    raw = bytearray(4 * 1024)

    def body(f):
        f.stream(0)
        batch = _pin(f, torch.frombuffer(raw, dtype=torch.float32))
        f.stream(1, "copier")
        dev = torch.zeros(1024)
        dev.copy_(batch, non_blocking=True)
        f.stream(0)
        if reuse:
            del batch
            batch = torch.frombuffer(raw, dtype=torch.float32)  # the same block, a new storage
        batch.fill_(2.0)  # FILL
        del dev

    run = checked(backend, body, trace=path)
    ops = trace_ops(path)
    pinned = [o["buffer"] for o in ops if o["op"] == "alloc" and o.get("memory") == "pinned"]
    if reuse:
        assert run.report.errors == 0, run.report.to_text()
        assert len(pinned) == 2 and pinned[0] != pinned[1], ops
        freed = [i for i, o in enumerate(ops) if o["op"] == "free" and o["buffer"] == pinned[0]]
        second = next(i for i, o in enumerate(ops) if o["op"] == "alloc" and o["buffer"] == pinned[1])
        assert freed and freed[0] < second
    else:
        assert sites(run) == {("data-race", line_of("FILL"))}
        assert len(pinned) == 1


def test_like_ops_read_nothing(backend):
    # zeros_like / ones_like / new_zeros take their tensor for its shape only: a side stream
    # making a tensor like x while the default stream writes x is not a race.
    import torch

    def body(f):
        f.stream(0)
        x = torch.ones(1024)
        f.stream(1, "side")
        a = torch.zeros_like(x)
        b = x.new_zeros(16)
        c = torch.full_like(x, 3.0)
        f.stream(0)
        x.mul_(2)
        del a, b, c

    run = checked(backend, body)
    assert run.report.errors == 0, run.report.to_text()


def test_a_free_inside_an_enclosing_op_comes_after_the_wait_before_it(backend):
    # A hook (here a custom op) makes the default stream wait for the side stream's read of t,
    # then drops t (the allocator frees it on its owning stream, the default one): the free
    # comes after the wait, as the thread issued them.
    import torch

    scoped = _scoped_op()

    def body(f):
        f.stream(0)
        t = torch.ones(1024)
        g = torch.zeros(16)
        f.record(1, 0)
        f.stream(1, "side")
        f.wait(1, 1)
        u = t * 2
        f.record(2, 1)
        f.stream(0)

        def before(x):
            f.wait(0, 2)
            f.b.fake_trace(False, t.untyped_storage().data_ptr(), 0, 0)

        _SCOPED["before"] = before
        scoped(g)
        del u

    run = checked(backend, body)
    assert run.report.errors == 0, run.report.to_text()


def copied_to_pinned(f, n: int, fixed: bool):
    """Pinned memory of `n` floats that a non_blocking copy on the stream "copier" (after stream
    0's work) writes; back on stream 0, the host waits for the copy where `fixed`."""
    import torch

    f.stream(0)
    source = torch.ones(n)
    host = f.pinned(n)
    f.record(3, 0)
    f.stream(1, "copier")
    f.wait(1, 3)
    host.copy_(source, non_blocking=True)
    f.record(1, 1)
    f.stream(0)
    if fixed:
        f.sync(1)
    return host


@pytest.mark.parametrize("fixed", [False, True])
def test_torch_save_reads_pinned_memory_on_the_host(backend, fixed):
    # A checkpoint staged with non_blocking copies into pinned memory and saved before the copy
    # is done: torch.save reads the tensors' bytes on the host, outside the dispatcher.
    import io

    import torch

    def body(f):
        staged = copied_to_pinned(f, 1024, fixed)
        torch.save({"model": {"w": staged}, "step": 3}, io.BytesIO())  # SAVE

    run = checked(backend, body)
    if fixed:
        assert run.report.errors == 0, run.report.to_text()
    else:
        assert sites(run) == {("data-race", line_of("SAVE"))}


@pytest.mark.parametrize("fixed", [False, True])
def test_tolist_reads_pinned_memory_on_the_host(backend, fixed):
    # A result copied into pinned memory with a non_blocking copy and turned into a list before
    # the copy is done: Tensor.tolist reads the bytes on the host, outside the dispatcher (it is
    # torch._C.TensorBase's, inherited by torch.Tensor).
    import torch

    def body(f):
        host = copied_to_pinned(f, 256, fixed)
        values = host.tolist()  # TOLIST
        assert len(values) == 256

    run = checked(backend, body)
    if fixed:
        assert run.report.errors == 0, run.report.to_text()
    else:
        assert sites(run) == {("data-race", line_of("TOLIST"))}
    assert "tolist" not in torch.Tensor.__dict__  # the inherited method is torch.Tensor's again


def test_tolist_is_wrapped_once_and_left_inert_where_every_check_keeps_it(backend, monkeypatch):
    # Where every part of the process is checked (`pytest --streamsan`: _KEEP_WRAPPERS),
    # torch.Tensor is not modified at every check (CPython 3.13+ stops caching the attributes of
    # a class modified 1,000 times): the first check wraps Tensor.tolist, later checks listen to
    # the same wrapper, and between checks it only calls the method it wraps.
    import torch

    from streamsan.torch import _recorder as R

    monkeypatch.setattr(R, "_KEEP_WRAPPERS", True)
    assert "tolist" not in torch.Tensor.__dict__

    def body(f):
        f.pinned(16).tolist()

    try:
        checked(backend, body)
        wrapper = torch.Tensor.__dict__["tolist"]
        assert wrapper.__wrapped__ is torch._C.TensorBase.tolist
        assert wrapper.__name__ == "tolist"
        assert torch.arange(3).tolist() == [0, 1, 2]  # between checks: the method it wraps
        assert all(k.listener is None for k in R._KEPT.values())
        for _ in range(3):
            checked(backend, body)
            assert torch.Tensor.__dict__["tolist"] is wrapper
    finally:
        R.release_kept_methods()
    assert "tolist" not in torch.Tensor.__dict__
    assert torch.arange(2).tolist() == [0, 1]


def test_a_tolist_put_back_is_put_on_again_by_the_next_check(backend):
    # Checks that do not keep the wrapper put torch's method back at their end, and the next
    # check puts the same wrapper on again (not one made anew at every check); a tolist the
    # program put on torch.Tensor between the checks is wrapped instead, and left in place.
    import torch

    seen = []

    def body(f):
        seen.append(torch.Tensor.__dict__["tolist"])
        f.pinned(16).tolist()

    for _ in range(2):
        run = checked(backend, body)
        assert run.report.errors == 0, run.report.to_text()
        assert "tolist" not in torch.Tensor.__dict__
    assert seen[0] is seen[1]
    calls = []

    def theirs(self):
        calls.append(1)
        return torch._C.TensorBase.tolist(self)

    torch.Tensor.tolist = theirs
    try:

        def racing(f):
            seen.append(torch.Tensor.__dict__["tolist"])
            host = copied_to_pinned(f, 256, False)
            host.tolist()  # TOLIST_PUT_ON

        run = checked(backend, racing)
        assert sites(run) == {("data-race", line_of("TOLIST_PUT_ON"))}
        assert seen[2] is not seen[0] and seen[2].__wrapped__ is theirs and calls == [1]
        assert torch.Tensor.__dict__["tolist"] is theirs
    finally:
        if torch.Tensor.__dict__.get("tolist") is theirs:
            del torch.Tensor.tolist
    run = checked(backend, body)
    assert seen[3].__wrapped__ is torch._C.TensorBase.tolist
    assert "tolist" not in torch.Tensor.__dict__


def test_a_tolist_replaced_between_kept_checks_is_wrapped_anew(backend, monkeypatch):
    # The program (or another tool) puts its own tolist on torch.Tensor between two checks that
    # keep the wrapper: the next check wraps that one, records its host read, and putting the
    # wrappers back leaves the program's own.
    import torch

    from streamsan.torch import _recorder as R

    monkeypatch.setattr(R, "_KEEP_WRAPPERS", True)
    calls = []
    kept = None

    def theirs(self):
        calls.append(1)
        return kept(self)

    try:
        checked(backend, lambda f: None)
        kept = torch.Tensor.__dict__["tolist"]
        torch.Tensor.tolist = theirs

        def body(f):
            host = copied_to_pinned(f, 256, False)
            host.tolist()  # TOLIST_THEIRS

        run = checked(backend, body)
        assert sites(run) == {("data-race", line_of("TOLIST_THEIRS"))}
        assert torch.Tensor.__dict__["tolist"].__wrapped__ is theirs
        assert calls == [1]
        R.release_kept_methods()
        assert torch.Tensor.__dict__["tolist"] is theirs
    finally:
        R.release_kept_methods()
        if torch.Tensor.__dict__.get("tolist") is theirs:
            del torch.Tensor.tolist
    assert "tolist" not in torch.Tensor.__dict__


def test_a_check_that_does_not_keep_puts_a_kept_tolist_back(backend, monkeypatch):
    # A check that kept the wrapper (pytest --streamsan), then one that does not (the session's
    # flag off, or a check after it): the second puts torch's method back at its end.
    import torch

    from streamsan.torch import _recorder as R

    monkeypatch.setattr(R, "_KEEP_WRAPPERS", True)
    checked(backend, lambda f: None)
    assert "tolist" in torch.Tensor.__dict__
    monkeypatch.setattr(R, "_KEEP_WRAPPERS", False)
    run = checked(backend, lambda f: f.pinned(8).tolist())
    assert run.report.errors == 0
    assert "tolist" not in torch.Tensor.__dict__ and R._KEPT == {}


def test_a_failed_stop_still_puts_the_methods_back(backend, monkeypatch):
    # The recorder's end fails: the program's methods are put back all the same, and the next
    # check runs.
    import torch
    import torch.serialization as serialization

    from streamsan.torch import _recorder as R

    before = (torch.Tensor.__dict__.get("tolist"), serialization.save, torch.save)
    cls = R.NativeBackend if backend == "native" else R.PythonBackend
    real = cls.stop

    def failing(self):
        real(self)
        raise RuntimeError("stop failed")

    monkeypatch.setattr(cls, "stop", failing)
    with pytest.raises(RuntimeError, match="stop failed"):
        checked(backend, lambda f: None)
    monkeypatch.setattr(cls, "stop", real)
    assert (torch.Tensor.__dict__.get("tolist"), serialization.save, torch.save) == before
    assert R._active is None and R._claimed is None
    run = checked(backend, lambda f: f.pinned(8).tolist())
    assert run.report.errors == 0


def test_a_failed_start_leaves_no_patch(backend, monkeypatch):
    # Making the wrappers fails midway (here: at torch.save's, after Tensor.tolist's): the ones
    # made are taken off again, and the next check runs.
    import torch
    import torch.serialization as serialization

    from streamsan.torch import _recorder as R

    before = (torch.Tensor.__dict__.get("tolist"), serialization.save, torch.save)
    real = R._Patches.patch

    def failing(self, owner, attr, make):
        if attr == "save":
            raise RuntimeError("patch failed")
        return real(self, owner, attr, make)

    monkeypatch.setattr(R._Patches, "patch", failing)
    with pytest.raises(RuntimeError, match="patch failed"):
        checked(backend, lambda f: None)
    monkeypatch.setattr(R._Patches, "patch", real)
    assert (torch.Tensor.__dict__.get("tolist"), serialization.save, torch.save) == before
    assert R._KEPT == {}
    run = checked(backend, lambda f: f.pinned(8).tolist())
    assert run.report.errors == 0


def test_tolist_of_a_tensor_subclass_is_one_host_read(backend, tmp_path):
    # A subclass with __torch_function__: TensorBase.tolist calls it with torch.Tensor.tolist (the
    # patch), whose default runs it again, torch functions disabled: one read, not two.
    import torch

    class Passthrough(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return super().__torch_function__(func, types, args, kwargs or {})

    def body(f):
        f.stream(0)
        host = f.pinned(64).as_subclass(Passthrough)
        assert len(host.tolist()) == 64
        assert len(torch.Tensor.tolist(host)) == 64

    trace = tmp_path / "t.jsonl"
    checked(backend, body, trace=str(trace))
    assert sum(op["op"] == "host_read" for op in trace_ops(trace)) == 2


def test_a_build_killed_midway_does_not_hang_later_loads():
    # torch's build lock (`lock` in the build directory, created exclusively) stays behind when a
    # build is killed (a timeout); a later load must not wait for it forever.
    native_ext_or_skip()
    from streamsan.torch import _native

    directory = _native.build_dir()
    with open(os.path.join(directory, "lock"), "w"):
        pass
    code = "from streamsan.torch import _native; print(_native.load().__name__)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the load waited for the leftover lock")
    finally:
        if os.path.exists(os.path.join(directory, "lock")):
            os.remove(os.path.join(directory, "lock"))
    assert done.returncode == 0, done.stderr


def _add_one():
    import torch

    torch.ones(4).add_(1)  # SITE-A


def _times_two():
    import torch

    torch.ones(4).mul_(2)  # SITE-B


def test_each_check_has_its_own_sites_after_others(backend, tmp_path, monkeypatch):
    """What a recorder knows of the program's code (which frames are the user's, their lines) may
    outlive a check: the checks after it still name their own lines, shown relative to the
    directory each started in."""

    cwd = os.getcwd().rstrip(os.sep) + os.sep
    rel = HERE[len(cwd):] if HERE.startswith(cwd) else HERE

    def sites_of(fn, name):
        path = tmp_path / name
        checked(backend, lambda f: (f.stream(0), fn()), trace=path)
        ops = trace_ops(path)
        return {o["site"] for o in ops if o.get("op") == "launch"}

    a, b = f"{rel}:{line_of('SITE-A')}", f"{rel}:{line_of('SITE-B')}"
    assert sites_of(_add_one, "1.jsonl") == {a}
    assert sites_of(_times_two, "2.jsonl") == {b}
    assert sites_of(_add_one, "3.jsonl") == {a}
    # This file's folder taken for Inductor's output (code that is not the user's): its lines
    # are no site any more, though the check before knew them as the user's.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.dirname(HERE))
    assert not [s for s in sites_of(_add_one, "4.jsonl") if os.path.basename(HERE) in s]
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert sites_of(_add_one, "5.jsonl") == {a}
    monkeypatch.chdir(tmp_path)  # this file is outside it now: shown whole
    assert sites_of(_add_one, "6.jsonl") == {f"{HERE}:{line_of('SITE-A')}"}


def test_a_check_refused_inside_another_leaves_it_whole(backend):
    """A check entered while another runs (a `streamsan.torch.check()` in a test that
    `pytest --streamsan` checks already) is refused, and the running one still sees the race
    after it: the refused one set nothing up."""
    torch_or_skip()
    import torch

    import streamsan.torch

    def body(f):
        f.stream(0)
        x = torch.ones(64)
        with pytest.raises(RuntimeError, match="already running"):
            with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True):
                pass
        f.stream(1, "side")
        x.add_(1)  # RACES-WITH-THE-FILL

    run = checked(backend, body)
    assert sites(run) == {("data-race", line_of("RACES-WITH-THE-FILL"))}


def test_a_finished_check_goes_with_its_run_and_leaves_no_file(backend, tmp_path):
    """A check keeps the ops in a temporary file for its report's explanations; the file goes
    with the report. Nothing of a finished check is kept alive by the recorder: the Run goes
    when its user lets it go (no collector needed), and a process that ends with a check in a
    global leaves no file behind."""
    import gc
    import weakref

    torch_or_skip()
    import torch

    import streamsan.torch

    enabled = gc.isenabled()
    gc.disable()
    try:
        run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
        with run:
            torch.ones(4).add_(1)
        gone = weakref.ref(run)
        del run
        assert gone() is None, "the finished Run is still held"
    finally:
        if enabled:
            gc.enable()
    code = (
        "import torch, streamsan.torch\n"
        "with streamsan.torch.Run(raise_on_hazard=False, backend=%r, _fake_device=True) as run:\n"
        "    torch.ones(4).add_(1)\n"
        "assert run.report.errors == 0\n" % backend
    )
    spool = tmp_path / "tmp"
    spool.mkdir()
    env = dict(os.environ, TMPDIR=str(spool))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert not [p.name for p in spool.iterdir() if p.name.startswith("streamsan-ops-")]


def test_a_check_set_up_elsewhere_refuses_others_until_it_is_given_up(backend):
    """The C++ recorder's state is one per process: a recorder claims it before it sets
    anything up (so a second check, from another thread, cannot empty it between the first's
    set-up and its start), and gives it back when it stops or is given up."""
    torch_or_skip()
    import torch

    import streamsan.torch
    from streamsan.torch import _recorder

    first = _recorder.Recorder(lambda data: None, backend, fake_device=True)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True).__enter__()
    finally:
        first.abandon()

    def body(f):
        f.stream(0)
        x = torch.ones(64)
        f.stream(1, "side")
        x.add_(1)  # RACES-AFTER-A-GIVEN-UP-ONE

    assert sites(checked(backend, body)) == {("data-race", line_of("RACES-AFTER-A-GIVEN-UP-ONE"))}


def test_a_check_whose_start_failed_lets_the_next_one_run(backend, monkeypatch):
    torch_or_skip()
    import torch

    import streamsan.torch
    from streamsan.torch import _recorder

    def broken(rec):
        raise OSError("patching failed")

    with monkeypatch.context() as m:
        m.setattr(_recorder, "_install_patches", broken)
        with pytest.raises(OSError, match="patching failed"):
            with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True):
                pass
    run = checked(backend, lambda f: (f.stream(0), torch.ones(4).add_(1)))
    assert run.report.errors == 0 and run.report.ops > 0


def test_a_checks_warnings_point_at_the_users_line():
    """A warning a check gives at its end (here: memory allocated before it, which the Python
    recorder tells on the fake device) names the user's line, not streamsan's code."""
    import warnings

    import streamsan.torch

    torch = torch_or_skip()
    backend = "python"
    x = torch.ones(64)  # allocated before the check: its accesses are external
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True):  # WARNED
            x.add_(1)
    ours = [w for w in caught if str(w.message).startswith("streamsan")]
    assert ours, [str(w.message) for w in caught]
    assert [(w.filename, w.lineno) for w in ours] == [(HERE, line_of("WARNED"))] * len(ours)


# An older version's recorder module: its entry points only.
_OLDER_RECORDER = "def configure(*a): pass\ndef reset(): pass\ndef install(with_cuda): pass\n"
# Loads the recorder, printing why it was refused.
_LOAD_OR_SAY_WHY = (
    "from streamsan.torch import _native\n"
    "try:\n"
    "    _native.load()\n"
    "except RuntimeError as e:\n"
    "    print('REFUSED', e)\n"
)


def _python_with_another_recorder(tmp_path, code: str, module: str = _OLDER_RECORDER) -> subprocess.CompletedProcess:
    """Runs `code` in a Python whose STREAMSAN_TORCH_EXT names a module of source `module` (by
    default one with the recorder's older entry points only: built by another version, refused)."""
    other = tmp_path / "other_recorder.py"
    other.write_text(module)
    env = dict(os.environ, STREAMSAN_TORCH_EXT=str(other))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_recorder_module_of_another_version_is_refused_saying_so(tmp_path):
    """STREAMSAN_TORCH_EXT names a module built elsewhere: one without this version's entry
    points is refused with the reason, not used until a call fails inside a check."""
    torch_or_skip()
    out = _python_with_another_recorder(tmp_path, _LOAD_OR_SAY_WHY)
    assert "REFUSED" in out.stdout and "another version" in out.stdout, (out.stdout, out.stderr)
    assert "open_check" in out.stdout


def test_a_recorder_module_with_this_versions_names_but_another_source_is_refused(tmp_path):
    """A module with every entry point this version calls, built from another source (its
    `source_digest` another's, or none): refused, naming both digests; the module this version
    builds carries its own source's digest."""
    torch_or_skip()
    from streamsan.torch import _native

    module = "".join(f"def {n}(*a, **k): pass\n" for n in _native._ENTRY_POINTS) + "source_digest = 's0123'\n"
    out = _python_with_another_recorder(tmp_path, _LOAD_OR_SAY_WHY, module)
    assert "REFUSED" in out.stdout and "another version" in out.stdout, (out.stdout, out.stderr)
    assert "s0123" in out.stdout and _native.source_digest() in out.stdout, out.stdout
    ext = native_ext_or_skip()
    assert ext.source_digest == _native.source_digest()


def test_auto_says_when_it_falls_back_to_the_python_recorder(tmp_path):
    """backend="auto" whose C++ recorder cannot be loaded checks with the Python recorder and
    says so, once per process, at the user's line; backend="python" says nothing."""
    torch_or_skip()
    code = (
        "import warnings, torch, streamsan.torch\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    for backend in ('python', 'auto', 'auto'):\n"
        "        with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True) as run:  # LINE\n"
        "            torch.ones(4).add_(1)\n"
        "        print('BACKEND', backend, run.backend)\n"
        "for w in caught:\n"
        "    if 'C++ recorder' in str(w.message):\n"
        "        print('WARNED', w.lineno, w.message)\n"
    )
    out = _python_with_another_recorder(tmp_path, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("BACKEND auto python") == 2 and "BACKEND python python" in out.stdout, out.stdout
    warned = [line for line in out.stdout.splitlines() if line.startswith("WARNED")]
    assert len(warned) == 1, out.stdout
    assert warned[0].startswith("WARNED 5 ") and "another version" in warned[0], warned


def test_an_inconsistent_trace_says_what_it_is_and_keeps_the_report(backend):
    """A trace the checker cannot take (here a host op of an unknown kind, standing for a gap in
    what the recorders record) raises its TraceError when the check ends, with a note that says
    it is a gap of the recorder's, not a hazard of the program, and how to report it; the report
    of what was checked before it is the check's."""
    import streamsan
    import streamsan.torch

    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
    with pytest.raises(streamsan.TraceError) as raised:
        with run:
            Fake(run).b.host_op('{"op":"lanch"')
    assert 'unknown op "lanch"' in str(raised.value)
    if sys.version_info >= (3, 11):
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert "not a hazard of the program" in notes and "trace=PATH" in notes
    assert run.report is not None and run.report.errors == 0


def test_a_queued_record_lets_go_of_its_pinned_storage_on_the_programs_thread(tmp_path, monkeypatch):
    """A record of an op on pinned memory is queued like any other (records deferred: the fake
    device's too, `STREAMSAN_DEFER=all`) and holds the storage until the recorder's thread has
    written it; the program's thread lets go of it after that (its next record, or the check's
    end), never the recorder's own thread (a pinned block freed there would reach the GPU trace
    from it). The trace is the same as written at once."""
    import time

    torch = torch_or_skip()
    native_ext_or_skip()
    use = torch._C._storage_Use_Count
    seen = {}

    def body(f):
        f.stream(0)
        t = f.pinned(256)
        storage = t.untyped_storage()
        base = use(storage._cdata)
        t.add_(1)  # its record holds the storage
        seen["queued"] = use(storage._cdata) - base
        time.sleep(0.05)  # the recorder's thread writes it (every half millisecond)
        seen["written"] = use(storage._cdata) - base  # written or not: held until an op starts
        deadline = time.monotonic() + 10
        while True:
            x = torch.ones(4)
            x.add_(1)  # the program's next ops: the storage let go of once written
            seen["after"] = use(storage._cdata) - base
            if seen["after"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.01)

    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    deferred = tmp_path / "deferred.jsonl"
    checked("native", body, trace=deferred)
    assert seen == {"queued": 1, "written": 1, "after": 0}
    monkeypatch.setenv("STREAMSAN_DEFER", "0")
    at_once = tmp_path / "at_once.jsonl"
    checked("native", body, trace=at_once)
    assert seen == {"queued": 0, "written": 0, "after": 0}  # written, and let go of, at once
    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    monkeypatch.setenv("STREAMSAN_PINNED", "at-once")  # pinned records alone written at once
    checked("native", body)
    assert seen == {"queued": 0, "written": 0, "after": 0}
    assert [o["op"] for o in trace_ops(deferred)] == [o["op"] for o in trace_ops(at_once)]


def test_what_a_check_ending_during_a_capture_held_is_let_go_of_when_the_next_check_opens(monkeypatch):
    """A check that ends while a CUDA graph capture it saw begin is still in progress keeps the
    pinned storages its written records held (none is let go of during a capture); the next
    check lets go of them as it opens, before its first op."""
    torch = torch_or_skip()
    ext = native_ext_or_skip()
    use = torch._C._storage_Use_Count
    seen = {}

    def body(f):
        f.stream(0)
        t = f.pinned(256)
        seen["storage"] = t.untyped_storage()
        t.add_(1)  # its record holds the storage until written and let go of
        ext.set_captures(1)  # a capture begins, and outlives the check

    def nothing(f):
        seen["opened"] = use(seen["storage"]._cdata)  # no op yet in this check

    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    checked("native", body)
    after_first = use(seen["storage"]._cdata)
    checked("native", nothing)
    let_go = use(seen["storage"]._cdata)
    assert after_first == let_go + 1, (after_first, let_go)  # held across the check's end
    assert seen["opened"] == let_go  # and let go of as the next check opened


def test_the_python_recorders_buffers_found_by_address_as_a_scan_of_them_all_finds_them():
    """The Python recorder finds the live buffers an allocation meets, and the buffer an address
    falls inside, by bisection over their ordered bases (a scan of every live buffer made a long
    check quadratic: 2.8 ms an op at 117,000 ops of torchaudio's WaveRNN). Random allocations,
    frees and look-ups, overlapping, empty and nested, give the same trace and the same buffers
    as the scan."""
    torch_or_skip()
    import random

    from streamsan.torch import _recorder as R

    class Scan(R.PythonBackend):  # what the Python recorder did before: a scan of them all
        def overlapping(self, addr, size, pinned):
            bufs = self.pinned_bufs if pinned else self.device_bufs
            return [b for b, e in bufs.items() if b < addr + size and addr < b + max(e[1], 1)]

        def containing(self, addr, pinned):
            bufs = self.pinned_bufs if pinned else self.device_bufs
            return next((b for b, e in bufs.items() if b <= addr < b + e[1]), None)

    def inside(b, base, device):
        a = R._Access()
        a.base, a.offset, a.bytes, a.write, a.device = base, 0, 1, False, device
        a.dev_index, a.storage_bytes, a.storage = 0, 1, None
        return (b.resolve(a), a.name, a.offset)

    rng = random.Random(7)
    for _ in range(20):
        fast, scan = R.PythonBackend(None), Scan(None)
        looked = ([], [])
        for _ in range(400):
            roll = rng.random()
            addr = rng.randrange(0, 2048, rng.choice([1, 8, 512]))
            if roll < 0.55:
                size = rng.choice([0, 1, 7, 64, 512, 1500])
                pinned = rng.random() < 0.3
                for b in (fast, scan):
                    b.new_alloc(addr, size, pinned, '"s"', "null")
            elif roll < 0.75:
                pinned = rng.random() < 0.3
                bufs = scan.pinned_bufs if pinned else scan.device_bufs
                if bufs:
                    base = rng.choice(list(bufs))
                    for b in (fast, scan):
                        b.free_buf(base, pinned, "null")
            else:
                device = rng.random() < 0.7
                for b, out in zip((fast, scan), looked):
                    out.append((device, *inside(b, addr, device)))
            assert fast.batch == scan.batch
            assert fast.device_bufs == scan.device_bufs and fast.pinned_bufs == scan.pinned_bufs
            for pinned, bufs in ((False, fast.device_bufs), (True, fast.pinned_bufs)):
                assert fast.sorted_bases[pinned] == sorted(bufs)
        assert looked[0] == looked[1]
        hits = [(device, name, off) for device, ok, name, off in looked[0] if ok]
        assert any(name.startswith('"ext') for _, name, _ in hits)  # device misses among them
        assert any(device and off > 0 and not name.startswith('"ext') for device, name, off in hits)  # insides
        assert any(not device and off > 0 for device, name, off in hits)  # pinned insides
        assert any(not device and not ok for device, ok, _, _ in looked[0])  # pinned misses


def _marked_gradient(f, mark: bool):
    """A block made on the default stream, read on a side stream (as a backward node on another
    stream reads the gradient it is handed), then freed; `mark`: marked used on the side stream
    through c10's device guard first, as the autograd engine does (recordDataPtrOnStream)."""
    import torch

    f.stream(0)
    g = torch.ones(256)
    f.record(1, 0)
    f.stream(2, "side")  # an even id is an external stream: its handle is the id (2)
    f.wait(2, 1)  # the engine's wait for the producer's stream
    s = g * 2
    f.stream(0)
    if mark and not f.b.ext.mark_used_on_stream(g, 2):
        pytest.skip("c10's device guard is not observed with this torch (2.11 only)")
    del g
    # the fake device frees what it no longer holds at the next allocation, which takes its bytes
    h = torch.zeros(256)  # FREE
    return s, h


def test_a_block_marked_used_on_a_stream_through_the_device_guard_is_recorded(tmp_path):
    """The autograd engine hands a gradient from a node on one stream to a node on another with
    a wait and `recordDataPtrOnStream` on the consumer's stream, not the dispatcher's
    `record_stream` (torch/csrc/autograd/input_buffer.cpp): the allocator keeps the block until
    that stream's work is done. The C++ recorder sees it through c10's CUDA device guard: a
    `record_stream` op before the free, and no `unsafe-free`; unmarked, the same free is one."""
    native_ext_or_skip()
    trace = tmp_path / "marked.jsonl"
    run = checked("native", lambda f: _marked_gradient(f, True), trace)
    ops = trace_ops(trace)
    marks = [i for i, o in enumerate(ops) if o["op"] == "record_stream"]
    assert len(marks) == 1 and ops[marks[0]]["stream"] == "side", ops
    buf = ops[marks[0]]["buffer"]
    free = next(i for i, o in enumerate(ops) if o["op"] == "free" and o["buffer"] == buf)
    assert marks[0] < free
    assert run.report.hazards == []
    assert run.stats()["recorder_guard_spy"] is True

    unmarked = checked("native", lambda f: _marked_gradient(f, False))
    assert sites(unmarked) == {("unsafe-free", line_of("FREE")), ("reuse-race", line_of("FREE"))}


def _to_side(f, event):
    """Switches the fake device to the side stream (2) after it waits for the default stream's
    work so far (event `event`), as the engine does before a node on the side stream."""
    f.record(event, 0)
    f.stream(2, "side")
    f.wait(2, event)


def _python_trace(tmp_path, name, program):
    """`program(f)` checked by the Python recorder on the fake device, its trace kept in `name`:
    (the run, the trace's ops, what `program` returned)."""
    trace = tmp_path / name
    got = []
    run = checked("python", lambda f: got.append(program(f)), trace)
    return run, trace_ops(trace), got[0]


def _hazards_with_free(ops, buf, of_buf=False):
    """The kinds of the hazards of `ops` with `buf` freed at the end, where they do not free it
    already (the fake device's frees are seen only where the CPU heap gives an address again);
    `of_buf`: only those of `buf` (which other frees the fake device sees depends on the heap)."""
    import streamsan

    c = streamsan.Checker()
    for o in ops:
        c.push(o)
    if not any(o["op"] == "free" and o["buffer"] == buf for o in ops):
        c.push({"op": "free", "buffer": buf})
    return [h["kind"] for h in c.finish().hazards if not of_buf or h.get("buffer") == buf]


def _engine_handoff(f, call="method"):
    """`x * 2` whose backward node runs "on the side stream" (a hook on its input switches the
    fake device's stream, after the wait the engine issues), `(h * 3).sum()` on the default stream:
    the backward makes h's gradient on the default stream and hands it to the side stream's
    node, which reads it."""
    import torch

    f.stream(0)
    x = torch.ones(256, requires_grad=True)
    h = x * 2
    # A tensor's hook runs before the hooks of the node it is handed to (the engine sets the
    # node's stream before both).
    h.register_hook(lambda grad: _to_side(f, 1))
    loss = (h * 3).sum()
    loss.register_hook(lambda grad: f.stream(0))
    if call == "grad-by-name":  # as make_graphed_callables calls it
        (grad,) = torch.autograd.grad(outputs=(loss,), inputs=(x,), only_inputs=True)
        f.stream(0)
        return grad
    if call == "backward-by-name":
        torch.autograd.backward(tensors=[loss])
    elif call == "gradient-edge":  # a root given as its graph edge (pipelining's stage_backward)
        from torch.autograd.graph import get_gradient_edge

        torch.autograd.backward(get_gradient_edge(loss), grad_tensors=torch.ones(()))
    else:
        loss.backward()
    f.stream(0)
    return x.grad


def test_the_python_recorder_follows_the_engines_marks_of_a_gradient_handed_across_streams(tmp_path, monkeypatch):
    """The Python recorder writes the autograd engine's mark (a `record_stream` on the consumer's
    stream) of a gradient that a node on one stream hands to a node on another, from hooks on
    the graph's nodes (see _EngineMarks): the gradient's free is then no hazard. Without them
    the same free is an `unsafe-free`. (The fake device's frees are seen only where the CPU heap
    gives an address again: the gradient's free, on the default stream that made it, is added
    to each trace.)"""
    torch_or_skip()
    from streamsan.torch import _recorder

    def traced(name):
        run, ops, grad = _python_trace(tmp_path, name, _engine_handoff)
        assert grad.eq(6).all()
        return run, ops

    run, ops = traced("marked.jsonl")
    marks = [o for o in ops if o["op"] == "record_stream"]
    assert len(marks) == 1 and marks[0]["stream"] == "side", marks
    grad = marks[0]["buffer"]
    read = next(o for o in ops if o["op"] == "launch" and o["stream"] == "side")
    assert read["reads"][0]["buffer"] == grad  # the side stream's node read the gradient
    assert run.report.hazards == [], run.report.to_text()
    assert _hazards_with_free(ops, grad) == []

    monkeypatch.setattr(_recorder, "_ENGINE_MARKS", False)
    run, ops = traced("unmarked.jsonl")
    assert not any(o["op"] == "record_stream" for o in ops)
    assert _hazards_with_free(ops, grad) == ["unsafe-free"]


def _residual_sum(f, anomaly=False):
    """A residual `h + f(h)`: AddBackward0 hands one gradient to both `h`'s node and `f`'s last
    node; `f`'s last node takes it (its pre hook) while `h`'s input buffer still holds it, and
    the gradient `f`'s first node makes on the side stream (a hook on `b1` switches the fake
    device's stream there) is summed with it on the side stream: the default stream's gradient
    is marked used there first."""
    import torch

    f.stream(0)
    x = torch.ones(256, requires_grad=True)
    h = x * 1  # h's node: the consumer of the sum
    b1 = h * 2  # f's first node (on the side stream in the backward)
    b = b1 * 3  # f's last node
    b1.register_hook(lambda grad: _to_side(f, 1))
    with torch.autograd.set_detect_anomaly(anomaly):
        (h + b).sum().backward(create_graph=True)
    f.stream(0)
    return x.grad.detach()


def _root_sum(f, anomaly=False):
    """`backward([y, z], [gy, gz])` with `z` made from `y`: the engine's root hands the program's
    `gy` to `y`'s node, whose input buffer sums it with the gradient `z`'s path makes on the side
    stream (a hook on `b1` switches the fake device's stream there): `gy`, made on the default
    stream, is marked used there first."""
    import torch

    f.stream(0)
    x = torch.ones(256, requires_grad=True)
    y = x * 1  # y's node: the consumer of the sum
    b1 = y * 2  # z's path (on the side stream in the backward)
    z = b1 * 3
    b1.register_hook(lambda grad: _to_side(f, 1))
    gy, gz = torch.full((256,), 1.0), torch.full((256,), 1.0)
    with torch.autograd.set_detect_anomaly(anomaly):
        torch.autograd.backward([y, z], [gy, gz], create_graph=True)
    f.stream(0)
    return x.grad.detach()


def _implicit_root_sum(f, anomaly=False):
    """`backward([y, z])` of two scalars, `z` made from `y`, no gradients given: the ones
    `backward` makes for `y` go to `y`'s node, whose input buffer sums them with the gradient
    `z`'s path makes on the side stream."""
    import torch

    f.stream(0)
    x = torch.ones(256, requires_grad=True)
    y = (x * 1).sum()  # y's node: the consumer of the sum
    b1 = y * 2  # z's path (on the side stream in the backward)
    z = b1 * 3
    b1.register_hook(lambda grad: _to_side(f, 1))
    with torch.autograd.set_detect_anomaly(anomaly):
        torch.autograd.backward([y, z], create_graph=True)
    f.stream(0)
    return x.grad.detach()


def _passthrough_sum(f, anomaly=False):
    """`h + h.clone()`: CloneBackward0 hands back the very gradient it is given, which `h`'s
    input buffer holds already from AddBackward0, and the engine sums `g + g`. A post hook of
    the clone's node registered after the check's (from its pre hook) switches the fake device to
    the side stream, where the sum runs: `g`, made on the default stream, is marked used there."""
    import torch

    f.stream(0)
    x = torch.ones(256, requires_grad=True)
    h = x * 1  # h's node: the consumer of the sum
    c = h.clone()
    node = c.grad_fn
    node.register_prehook(lambda grads: node.register_hook(lambda gi, go: _to_side(f, 1)) and None)
    with torch.autograd.set_detect_anomaly(anomaly):
        (h + c).sum().backward(create_graph=True)
    f.stream(0)
    return x.grad.detach()


def _engine_sum(f, anomaly=False):
    """Two gradients of `x` summed by the engine on another stream than the one that made one
    of them. `x` is first used on the side stream (`b = x * 2`: x's AccumulateGrad, the consumer,
    takes that stream), then on the default one (`a = x * 3`). The backward runs `a`'s node first
    (made later) on the default stream, then `b`'s on the side stream (a hook on `b` switches the
    fake device's stream after the wait the engine issues for the first gradient): the engine
    sums the two on the side stream, the consumer's, after marking the default stream's gradient
    used there (`InputBuffer::add`, the Nth producer; torch/csrc/autograd/input_buffer.cpp), and
    drops it (`create_graph=True`: the sum is a new tensor, not the first one added to)."""
    import torch

    f.stream(0)
    x = torch.ones(256, requires_grad=True)
    _to_side(f, 3)
    b = x * 2
    f.record(4, 2)
    f.stream(0)
    f.wait(0, 4)
    a = x * 3
    b.register_hook(lambda grad: _to_side(f, 1))
    # (anomaly detection checks each gradient a node made for NaNs before the engine sums it)
    with torch.autograd.set_detect_anomaly(anomaly):
        (a + b).sum().backward(create_graph=True)
    f.stream(0)
    return x.grad.detach()


@pytest.mark.parametrize("shape", ["two-uses", "residual", "root", "implicit-root", "passthrough"])
@pytest.mark.parametrize("anomaly", [False, True])
def test_the_python_recorder_follows_the_engines_marks_of_gradients_it_sums(tmp_path, monkeypatch, anomaly, shape):
    """The Python recorder writes the autograd engine's mark of a gradient it sums with another
    on another stream (see _EngineMarks): the default stream's gradient, read by the sum on the
    side stream and then freed, is marked used on the side stream before the sum, and its free
    is no hazard. Without the marks the same free is an `unsafe-free`. (As in the test above,
    the gradient's free is added to each trace.) Two uses of `x` (`_engine_sum`), a residual
    whose gradient one node hands to two (`_residual_sum`), a gradient the program gave
    `backward` for a root another root's path reaches (`_root_sum`), the same without it (the
    ones `backward` makes, `_implicit_root_sum`), and a node that hands back the gradient it was
    given, summed with itself (`_passthrough_sum`)."""
    torch_or_skip()
    from streamsan.torch import _recorder

    program, want = {"two-uses": (_engine_sum, 5), "residual": (_residual_sum, 7), "root": (_root_sum, 7),
                     "implicit-root": (_implicit_root_sum, 7), "passthrough": (_passthrough_sum, 2)}[shape]

    def traced(name):
        run, ops, grad = _python_trace(tmp_path, name, lambda f: program(f, anomaly))
        assert grad.eq(want).all()
        return run, ops

    def summed(ops):
        """The buffer the default stream made that the side stream's sum read."""
        written = {w["buffer"] for o in ops if o["op"] == "launch" and o["stream"] == "default"
                   for w in o.get("writes", [])}
        adds = [o for o in ops if o["op"] == "launch" and o["stream"] == "side" and "add" in o["name"]]
        (buf,) = {r["buffer"] for o in adds for r in o.get("reads", [])} & written
        return buf, ops.index(adds[0])

    run, ops = traced("marked.jsonl")
    grad, add = summed(ops)
    marks = [(i, o) for i, o in enumerate(ops) if o["op"] == "record_stream" and o["buffer"] == grad]
    assert len(marks) == 1 and marks[0][1]["stream"] == "side", marks
    assert marks[0][0] < add  # written before the sum, as the engine marks it
    assert run.report.hazards == [], run.report.to_text()
    assert _hazards_with_free(ops, grad) == []

    monkeypatch.setattr(_recorder, "_ENGINE_MARKS", False)
    run, ops = traced("unmarked.jsonl")
    grad, _ = summed(ops)
    assert not any(o["op"] == "record_stream" for o in ops)
    assert _hazards_with_free(ops, grad, of_buf=True) == ["unsafe-free"]


def test_the_gradients_given_to_backward_reach_it_as_given(tmp_path):
    """The root gradients the program gives `backward` and `autograd.grad` (a tensor, a list, a
    generator, by name) are noted (from what `_make_grads` returns) without being used up: the
    call gets what it was given."""
    torch_or_skip()

    def body(f):
        import torch

        f.stream(0)
        x = torch.ones(8, requires_grad=True)
        outs = []
        for grads in (torch.full((8,), 2.0), [torch.full((8,), 2.0)], (g for g in [torch.full((8,), 2.0)])):
            x.grad = None
            torch.autograd.backward(x * 3, grads)
            outs.append(x.grad.clone())
        (g,) = torch.autograd.grad(x * 3, x, grad_outputs=(t for t in [torch.full((8,), 2.0)]))
        outs.append(g)
        return outs

    import torch

    made = torch.autograd._make_grads
    _run, _ops, outs = _python_trace(tmp_path, "given.jsonl", body)
    assert len(outs) == 4 and all(o.eq(6).all() for o in outs)
    assert torch.autograd._make_grads is made  # the check's wrapper (noting them) put back


def test_a_failure_judging_an_engine_sum_never_reaches_the_program(tmp_path, monkeypatch):
    """Judging whether an op is the engine's sum runs before every op the Python recorder
    records: where it fails, the op runs as it would, the marks stop being followed for the
    check, and a warning says so."""
    torch_or_skip()
    import warnings

    from streamsan.torch import _recorder

    def broken(self, func, args, kwargs):
        raise RuntimeError("cannot compare symbolic shapes")

    monkeypatch.setattr(_recorder._EngineMarks, "accumulating", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run, _ops, grad = _python_trace(tmp_path, "broken.jsonl", _engine_sum)
    assert grad.eq(5).all()
    assert any("following the autograd engine's marks failed" in str(w.message) and "symbolic" in str(w.message)
               for w in caught), [str(w.message) for w in caught]


def test_an_add_outside_the_engines_sums_marks_nothing(tmp_path):
    """The window in which an `add` is the engine's sum closes when the next node starts and when
    the backward call returns: the program's own `add` of a gradient made on another stream,
    after `autograd.grad` returned it, is no mark (a missing wait there stays a race)."""
    torch_or_skip()

    def body(f):
        import torch

        f.stream(0)
        x = torch.ones(256, requires_grad=True)
        (g,) = torch.autograd.grad((x * 2).sum(), x)  # the last node's own output
        f.stream(2, "side")
        g.add_(1)  # ADD AFTER BACKWARD

    trace = tmp_path / "t.jsonl"
    run = checked("python", body, trace)
    assert not any(o["op"] == "record_stream" for o in trace_ops(trace))
    # (a reuse-race beside it where the CPU heap gave `g` the address of a freed temporary)
    line = line_of("ADD AFTER BACKWARD")
    assert ("data-race", line) in sites(run) and {at for _, at in sites(run)} == {line}, run.report.to_text()


@pytest.mark.parametrize("other", ["tensor", "scalar", "itself"])
def test_a_hooks_own_add_in_the_engines_window_marks_nothing(tmp_path, other):
    """A tensor hook runs between the last node's post hook and the next node's pre hook, where
    the engine sums gradients: its own `add` of the gradient it is given and a tensor that is no
    gradient (or a number, or the gradient itself, which its node made once), on a stream of
    its own, is not the engine's sum and writes no mark (the gradient's free after that read
    stays a hazard)."""
    torch_or_skip()

    def body(f):
        import torch

        f.stream(0)
        x = torch.ones(256, requires_grad=True)
        plain = torch.ones(256)
        kept = []
        y = x * 2

        def hook(g):
            _to_side(f, 1)
            kept.append(g.add(plain) if other == "tensor" else g + 1 if other == "scalar" else g + g)
            f.stream(0)

        y.register_hook(hook)
        y.sum().backward()

    trace = tmp_path / "t.jsonl"
    checked("python", body, trace)
    assert not any(o["op"] == "record_stream" for o in trace_ops(trace))


@pytest.mark.parametrize("call", ["grad-by-name", "backward-by-name", "gradient-edge"])
def test_the_engines_marks_follow_backward_and_grad_called_by_keyword(tmp_path, call):
    """`torch.autograd.grad(outputs=…, inputs=…)` and `torch.autograd.backward(tensors=…)`, the
    roots given by name (make_graphed_callables' warm-up calls grad so), run as called, right,
    with the engine's mark written."""
    torch_or_skip()

    got = {}

    def body(f):
        got["grad"] = _engine_handoff(f, call)

    trace = tmp_path / "t.jsonl"
    run = checked("python", body, trace)
    assert got["grad"].eq(6).all()
    marks = [o for o in trace_ops(trace) if o["op"] == "record_stream"]
    assert len(marks) == 1 and marks[0]["stream"] == "side", marks
    assert run.report.hazards == [], run.report.to_text()


@pytest.mark.parametrize("by", ["position", "keyword"])
def test_the_python_recorder_sees_record_stream_under_no_dispatch(tmp_path, monkeypatch, by):
    """FSDP1 marks its flat parameters used on a stream with `record_stream` under torch's
    `no_dispatch()` (`_no_dispatch_record_stream`), which no TorchDispatchMode sees: the Python
    recorder's wrapper of `Tensor.record_stream` writes it then (and only then: elsewhere the
    mode sees the op), the stream given by position or by its name in the op's schema (`s=`),
    and passes the call on as made. torch's `record_stream` takes CUDA tensors only: a stand-in
    here."""
    torch = torch_or_skip()
    from torch.utils._mode_utils import no_dispatch

    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)

    class Side:
        cuda_stream = 2
        device_index = 0

    def mark(t):
        if by == "keyword":
            t.record_stream(s=Side())
        else:
            t.record_stream(Side())

    trace = tmp_path / "t.jsonl"

    def body(f):
        f.stream(0)
        t = torch.ones(256)
        f.stream(2, "side")
        (t * 2).sum()
        f.stream(0)
        with no_dispatch():
            mark(t)
        mark(t)  # the stand-in reaches no dispatcher: nothing seen, nothing written

    checked("python", body, trace)
    marks = [o for o in trace_ops(trace) if o["op"] == "record_stream"]
    assert len(marks) == 1 and marks[0]["stream"] == "side", marks


def test_the_python_recorders_engine_marks_keep_nothing_of_graphs_gone():
    """A long check under the Python recorder (a graph a step): what its engine marks keep — the
    gradients' streams and the hooks' handles — is that of the gradients and graphs alive, not
    of every step's."""
    torch = torch_or_skip()
    import torch.nn as nn

    state = {}

    def body(f):
        f.stream(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        marks = f.b.rec.patches.closers[0].__self__
        for step in range(80):
            opt.zero_grad()
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
            if step == 0:
                state["first"] = len(marks.handles)
        state["handles"] = len(marks.handles)
        state["made"] = len(marks.made)

    checked("python", body)
    assert state["first"] > 0
    assert state["handles"] < 80 * state["first"] / 2, state
    assert state["made"] < 20, state


def test_a_nested_tensor_is_its_whole_buffer(backend, tmp_path):
    """A nested tensor has no one shape (its sizes and strides raise): its region is the whole of
    its buffer. Made on the default stream (`nn.TransformerEncoder`'s fast path makes one from a
    padding mask), read on a side stream without a wait: a race at the read, and no op of the
    program fails or goes unrecorded."""
    torch = torch_or_skip()
    import warnings

    def body(f):
        f.stream(0)
        x = torch.ones(2, 5, 8)
        keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
        with torch.no_grad():
            n = torch._nested_tensor_from_mask(x, keep, mask_check=False)
        f.stream(1, "side")
        padded = torch.nested.to_padded_tensor(n, 0.0)  # NESTED READ
        f.stream(0)
        assert padded.shape == (2, 5, 8)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = checked(backend, body)
    assert ("data-race", line_of("NESTED READ")) in sites(run), run.report.to_text()
    assert not [w for w in caught if "could not be recorded" in str(w.message)]



def test_a_checks_warnings_from_inside_the_program_never_raise_into_it(capsys):
    """Where the warnings filter makes warnings errors (`python -W error`, pytest's
    `filterwarnings = error`), a check's warning given from inside the program's call (here the
    CUDA graph wrappers': a graph captured before the check replayed in it) is written to stderr,
    and the call returns as it would: the replay ran, nothing raised."""
    torch_or_skip()
    import warnings

    from streamsan.torch import _graphs
    from streamsan.torch._recorder import _Warned

    warn = _Warned(inside=True)
    ops = _graphs.GraphOps(lambda s: None, lambda raw, dev: '"s"', warn)
    ran = []

    class G:
        def capture_begin(self, pool=None, capture_error_mode="global"):
            pass

        def capture_end(self):
            pass

        def replay(self):
            ran.append(1)

    wrappers = _graphs.make_wrappers(lambda: ops, lambda: (0, 0), warn)
    G.replay = wrappers["replay"](G.replay)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        G().replay()  # captured before the check: warned about, not recorded
    assert ran == [1]
    assert "captured before the check" in capsys.readouterr().err
    # Outside a check's hooks (a check's start, e.g. falling back to the Python recorder), the
    # filter decides, as for any warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            _Warned()("k", "a warning at a check's start")


def test_the_python_recorders_backward_and_grad_take_any_iterable_of_roots():
    """`torch.autograd.backward(generator)` and `torch.autograd.grad(map(...), x)`: the roots of
    any iterable, walked by the engine marks without using them up, reach the original whole."""
    torch = torch_or_skip()

    def body(f):
        f.stream(0)
        x = torch.ones(3, requires_grad=True)
        outs = [x * 2, x * 3]
        torch.autograd.backward(o.sum() for o in outs)
        assert x.grad.eq(5).all(), x.grad
        y = torch.ones(3, requires_grad=True)
        (g,) = torch.autograd.grad(map(lambda o: o.sum(), [y * 2, y * 3]), y)
        assert g.eq(5).all(), g

    checked("python", body)


def test_a_function_scripted_in_a_python_check_may_call_grad():
    """TorchScript finds `torch.autograd.grad` by the function object: the Python recorder's
    wrapper of it is registered as `aten::grad` while it is in place (and only then), so a
    function scripted during the check compiles and runs as it would outside it."""
    torch = torch_or_skip()

    def g(x):
        y = (x * x).sum()
        return torch.autograd.grad([y], [x])[0]

    got = {}

    def body(f):
        f.stream(0)
        s = torch.jit.script(g)
        got["grad"] = s(torch.ones(3, requires_grad=True))

    checked("python", body)
    assert got["grad"].eq(2).all()
    from torch.jit import _builtins

    assert all(fn is not torch.autograd.grad or op == "aten::grad" for fn, op in _builtins._builtin_ops)
    assert torch.autograd.grad.__module__ == "torch.autograd"  # put back


def test_torch_save_of_an_object_whose_attributes_raise_saves(backend, tmp_path):
    """torch.save's wrapper walks the object for the host tensors it reads; an object whose
    attribute lookup raises something else than AttributeError (a `__getattr__` of a mapping)
    is saved as torch.save saves it outside a check."""
    torch = torch_or_skip()

    class Odd:
        __slots__ = ("data",)

        def __init__(self):
            self.data = {"w": 1}

        def __getattr__(self, name):
            return self.data[name]  # KeyError for `__dict__`

        def __reduce__(self):
            return (dict, ((("w", 1),),))

    out = tmp_path / "o.pt"

    def body(f):
        f.stream(0)
        torch.save({"odd": Odd(), "t": torch.ones(4)}, out)

    checked(backend, body)
    assert torch.load(out, weights_only=False)["odd"] == {"w": 1}


@pytest.mark.parametrize("knob", ["aten::sin", "aten::sin@end", "aten::addmm", "aten::addmm@end"])
def test_an_op_the_recorder_cannot_read_is_counted_and_the_rest_recorded(knob, monkeypatch):
    """An op whose arguments (start) or outputs (end) the C++ recorder cannot read goes
    unrecorded: the program's call returns as it would, the check's end warns with the count and
    the first op's message, and this thread's frames are put back as they were, so the ops after
    it are recorded as before (a race planted after it is reported at its line). The failure is
    made by the recorder's test knob, STREAMSAN_TEST_UNREADABLE_OP; `aten::addmm` fails inside
    `aten::linear`, one frame deep."""
    torch = torch_or_skip()
    import warnings

    monkeypatch.setenv("STREAMSAN_TEST_UNREADABLE_OP", knob)
    out = {}

    def body(f):
        f.stream(0)
        x = torch.ones(4, 8)
        w = torch.ones(3, 8)
        out["sin"] = torch.sin(x)
        out["linear"] = torch.nn.functional.linear(x, w, torch.zeros(3))
        f.stream(1, "side")
        y = x * 2  # UNREAD AFTER
        f.stream(0)
        out["y"] = y

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = checked("native", body)
    assert torch.equal(out["sin"], torch.sin(torch.ones(4, 8)))
    assert torch.equal(out["linear"], torch.full((4, 3), 8.0))
    unread = [str(w.message) for w in caught if "could not be recorded" in str(w.message)]
    op = knob.split("@")[0]
    assert len(unread) == 1 and unread[0].startswith("streamsan: 1 op(s) could not be recorded"), [str(w.message) for w in caught]
    assert f"the first: {op}: declared unreadable" in unread[0], unread[0]
    assert ("data-race", line_of("UNREAD AFTER")) in sites(run), run.report.to_text()
    from streamsan.torch import _native

    assert _native.load().frame_depth() == 0  # no op of the thread's is left open

    monkeypatch.delenv("STREAMSAN_TEST_UNREADABLE_OP")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked("native", body)
    assert not [w for w in caught if "could not be recorded" in str(w.message)]


def _jagged(torch):
    """A jagged nested tensor (NJT, a traceable wrapper subclass: its values and its offsets)."""
    return torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(5, 4)], layout=torch.jagged)


def _checked_quietly(backend, body, trace=None):
    """`checked`, with the warnings the check gives kept from pytest (torch makes an NJT's lengths
    in C++, before a dispatcher op sees them: memory allocated before the check began)."""
    import warnings

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        return checked(backend, body, trace)


def test_ops_of_two_streams_on_one_jagged_nested_tensor_are_no_race(backend, tmp_path):
    """An NJT's op is recorded as the ops its `__torch_dispatch__` issues on its values and
    offsets (the C++ recorder sees those; the Python recorder hands the op to the subclass and
    sees them come back): `nt * 2` is a `mul` of the values, and its result shares `nt`'s offsets
    without writing them. Two streams each computing on `nt` after waiting for it: no race (the
    Python recorder used to write the wrapper's every inner tensor for the op's result: a
    write/write race on the offsets), and each op is written once."""
    torch = torch_or_skip()

    def body(f):
        f.stream(0)
        nt = _jagged(torch)
        f.record(1, 0)
        f.stream(1, "s1")
        f.wait(1, 1)
        y = nt * 2  # NJT MUL
        f.stream(2, "s2")
        f.wait(2, 1)
        z = nt + 1
        f.stream(0)
        assert y.offsets() is nt.offsets() and z.offsets() is nt.offsets()

    trace = tmp_path / "ops.jsonl"
    run = _checked_quietly(backend, body, trace=str(trace))
    assert sites(run) == set(), run.report.to_text()
    at = f"{os.path.basename(HERE)}:{line_of('NJT MUL')}"
    ops = trace_ops(trace)
    muls = [o for o in ops if o["op"] == "launch" and o["name"] == "aten::mul" and o.get("site", "").endswith(at)]
    assert len(muls) == 1, muls
    assert len(muls[0]["writes"]) == 1 and muls[0]["writes"][0]["bytes"] == 8 * 4 * 4, muls  # the new values


def test_a_jagged_nested_tensor_read_on_a_side_stream_without_a_wait_is_a_race(backend):
    """An NJT made on the default stream, read by an op on a side stream that did not wait: a
    read-after-write race at the read, and the op only reads `nt`'s buffers (its result's offsets
    are `nt`'s, not written)."""
    torch = torch_or_skip()

    def body(f):
        f.stream(0)
        nt = _jagged(torch)
        f.stream(1, "side")
        y = nt * 2  # NJT UNWAITED READ
        f.stream(0)
        del y

    run = _checked_quietly(backend, body)
    assert sites(run) == {("data-race", line_of("NJT UNWAITED READ"))}, run.report.to_text()
    for h in run.report.hazards:
        assert h["access"]["access"] == "read" and h["pattern"] == "read-after-write", h


def test_an_in_place_op_on_a_jagged_nested_tensor_writes_its_values_only(backend):
    """`nt.mul_(2)` is `mul_` of the NJT's values: the offsets are not written, so another stream
    reading only the offsets (both streams waiting for `nt`) is no race (the Python recorder used
    to write every inner tensor of a wrapper an in-place op mutates)."""
    torch = torch_or_skip()

    def body(f):
        f.stream(0)
        nt = _jagged(torch)
        f.record(1, 0)
        f.stream(1, "s1")
        f.wait(1, 1)
        nt.mul_(2)
        f.stream(2, "s2")
        f.wait(2, 1)
        o = nt.offsets() + 0
        f.stream(0)
        assert o.tolist() == [0, 3, 8]

    run = _checked_quietly(backend, body)
    assert sites(run) == set(), run.report.to_text()


def test_a_dtensors_ops_are_recorded_on_its_local_tensor(backend, tmp_path):
    """A DTensor (one rank, gloo, on CPU) made on the default stream from a local tensor: an op
    on a side stream that did not wait reads the local tensor (a race there), a stream that
    waited does not, and an in-place op writes the local tensor (the ops torch's DTensor
    dispatcher issues on it)."""
    torch = torch_or_skip()
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard
    except Exception:
        pytest.skip("torch.distributed's DTensor is not available")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=(tmp_path / "pg").as_uri())
    try:
        mesh = DeviceMesh("cpu", [0])
        state = {}

        def body(f):
            f.stream(0)
            local = torch.ones(4, 4)
            d = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            f.record(1, 0)
            f.stream(1, "s1")
            f.wait(1, 1)
            y = d * 2
            f.stream(2, "s2")
            z = d + 1  # DTENSOR UNWAITED READ
            f.stream(1)
            d.add_(1)  # DTENSOR IN PLACE
            f.stream(0)
            state["local"] = d.to_local()
            state["out"] = (y.to_local(), z.to_local())

        run = _checked_quietly(backend, body)
    finally:
        dist.destroy_process_group()
    races = {("data-race", line_of("DTENSOR UNWAITED READ")), ("data-race", line_of("DTENSOR IN PLACE"))}
    assert sites(run) == races, run.report.to_text()
    by_line = {int(h["access"]["site"].rsplit(":", 1)[1]): h for h in run.report.hazards}
    assert by_line[line_of("DTENSOR UNWAITED READ")]["pattern"] == "read-after-write"
    assert by_line[line_of("DTENSOR IN PLACE")]["access"]["access"] == "write"
    assert torch.equal(state["local"], torch.full((4, 4), 2.0))


def _holding(torch, dispatch):
    """A traceable wrapper subclass holding one plain tensor (`.a`), whose `__torch_dispatch__` is
    `dispatch(cls, func, args, kwargs)`."""

    class Holding(torch.Tensor):
        @staticmethod
        def __new__(cls, a):
            return torch.Tensor._make_wrapper_subclass(cls, a.shape, dtype=a.dtype, device=a.device)

        def __init__(self, a):
            self.a = a

        def __tensor_flatten__(self):
            return ["a"], None

        @staticmethod
        def __tensor_unflatten__(inner, meta, size, stride):
            return Holding(inner["a"])

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return dispatch(cls, func, args, kwargs or {})

    return Holding


def test_the_python_recorder_records_a_wrapper_op_whose_own_ops_it_cannot_see(tmp_path):
    """A traceable wrapper subclass whose `__torch_dispatch__` runs its ops under `no_dispatch()`
    (no mode sees them): the Python recorder records the op itself, as touching the tensor the
    wrapper holds; a read of it on a side stream without a wait is a race at the op's line."""
    torch = torch_or_skip()
    from torch.utils._mode_utils import no_dispatch
    from torch.utils._pytree import tree_map_only

    def dispatch(cls, func, args, kwargs):
        plain = tree_map_only(cls, lambda x: x.a, args)
        with no_dispatch():
            out = func(*plain, **kwargs)
        return tree_map_only(torch.Tensor, lambda x: cls(x) if type(x) is torch.Tensor else x, out)

    Hidden = _holding(torch, dispatch)

    def body(f):
        f.stream(0)
        h = Hidden(torch.ones(4))
        f.stream(1, "side")
        y = h + 1  # HIDDEN READ
        h.mul_(2)  # HIDDEN WRITE
        f.stream(0)
        del y

    trace = tmp_path / "ops.jsonl"
    run = _checked_quietly("python", body, trace=str(trace))
    races = {("data-race", line_of("HIDDEN READ")), ("data-race", line_of("HIDDEN WRITE"))}
    assert sites(run) == races, run.report.to_text()
    names = [o["name"] for o in trace_ops(trace) if o["op"] == "launch"]
    assert names == ["aten::ones", "aten::add", "aten::mul_"], names


def test_a_wait_a_wrapper_subclass_issues_before_its_ops_orders_them(backend):
    """A traceable wrapper subclass whose `__torch_dispatch__` first makes the current stream wait
    (as `AsyncCollectiveTensor` waits for its collective) and then runs the op on the tensor it
    holds: the wait is written before that op, so the side stream's read after it is no race (the
    Python recorder used to write it after the wrapper's op, as a sync inside an aten op)."""
    torch = torch_or_skip()
    from torch.utils._pytree import tree_map_only

    fake = []

    def dispatch(cls, func, args, kwargs):
        fake[0].wait(1, 1)
        return func(*tree_map_only(cls, lambda x: x.a, args), **kwargs)

    Waits = _holding(torch, dispatch)

    out = {}

    def body(f):
        fake[:] = [f]
        f.stream(0)
        w = Waits(torch.ones(4))
        f.record(1, 0)
        f.stream(1, "side")
        out["y"] = w * 2
        f.stream(0)

    run = _checked_quietly(backend, body)
    assert sites(run) == set(), run.report.to_text()
    assert torch.equal(out["y"], torch.full((4,), 2.0))
