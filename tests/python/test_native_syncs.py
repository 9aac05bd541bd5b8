"""The C++ recorder's events and synchronizations, taken from c10's GPU trace without Python, and
its per-stage profile; on the CPU (fake device: CPU tensors stand for device memory, and the GPU
trace is called as CUDA code calls it, through `fake_gpu_trace`)."""

import json
import re
import subprocess
import sys
import textwrap

import pytest


def _ext_or_skip():
    from conftest import native_ext_or_skip

    ext = native_ext_or_skip()
    if not ext.native_syncs():
        pytest.skip("this torch's GPU trace is recorded through Python's callbacks")
    return ext


def _run(**kw):
    import streamsan.torch

    return streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, **kw)


def test_gpu_trace_calls_are_recorded_in_the_order_issued_with_their_site(tmp_path):
    """Each kind of GPU trace call is written as its trace-format op, on the stream it names,
    with the user's line, in issue order between the ops around it; the trace is put back when
    the check ends (nothing is called after it)."""
    ext = _ext_or_skip()
    import torch

    path = tmp_path / "t.jsonl"
    run = _run(trace=path)
    with run:
        ext.set_fake_stream(0xA)
        x = torch.ones(8)
        x.add_(1)
        ext.fake_gpu_trace("record", 0xE1, 0xA)  # LINE record
        ext.fake_gpu_trace("wait", 0xE1, 0xB)
        ext.set_fake_stream(0xB)
        x.mul_(2)
        ext.fake_gpu_trace("event_sync", 0xE1, 0)
        ext.fake_gpu_trace("stream_sync", 0, 0xB)
        ext.fake_gpu_trace("device_sync", 0, 0)
        ext.fake_gpu_trace("alloc", 0x1000, 0)  # the allocator's own trace: not a host op
        assert run.stats()["recorder_native_syncs"] is True
        assert ext.gpu_trace_is_ours()
    # The trace that was there before the check is back (none, or torch's Python one where a
    # Python recorder's check ran earlier in this process): the recorder is called no more.
    assert not ext.gpu_trace_is_ours()
    written = path.read_text()
    ext.fake_gpu_trace("record", 0xE1, 0xA)
    assert path.read_text() == written
    ops = [json.loads(line) for line in written.splitlines() if line.strip()]
    kinds = [o.get("name", o["op"]) for o in ops if o["op"] not in ("alloc", "free") and o.get("name") != "aten::copy_"]
    assert kinds[-7:] == [
        "aten::add_", "event_record", "event_wait", "aten::mul_", "event_sync", "stream_sync", "device_sync"
    ], kinds
    rec = next(o for o in ops if o["op"] == "event_record")
    assert rec["event"] == "ev 0xe1" and rec["stream"] == "stream 0xa"
    wait = next(o for o in ops if o["op"] == "event_wait")
    assert wait["stream"] == "stream 0xb" and wait["event"] == "ev 0xe1"
    assert next(o for o in ops if o["op"] == "device_sync")["device"] == 0
    assert rec["site"].endswith(f"test_native_syncs.py:{_line_of('# LINE record')}"), rec
    # The wait orders the second launch after the first: no race.
    assert run.report.errors == 0, run.report.to_text()


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "_line_of" not in line:
                return i
    raise AssertionError(marker)


def test_without_the_wait_the_race_is_reported():
    """The same program without the wait: the two streams race (the recorder's syncs are what
    clears the program above)."""
    ext = _ext_or_skip()
    import torch

    run = _run()
    with run:
        ext.set_fake_stream(0xA)
        x = torch.ones(8)
        x.add_(1)
        ext.fake_gpu_trace("record", 0xE1, 0xA)
        ext.set_fake_stream(0xB)
        x.mul_(2)
    assert [h["kind"] for h in run.report.hazards] == ["data-race"], run.report.to_text()


def test_a_trace_active_before_the_check_keeps_being_called_and_is_put_back():
    """torch's own GPU trace activated before the check (CSAN, or Python callbacks): during the
    check each call is recorded and passed on to it (its callbacks still fire, once); after the
    check it is in place again. Run in a process of its own: torch's activation cannot be undone."""
    _ext_or_skip()
    code = textwrap.dedent(
        """
        import json, sys, torch
        import torch.cuda._gpu_trace as gt
        import streamsan.torch
        from streamsan.torch import _native
        ext = _native.load()
        seen = []
        torch._C._activate_gpu_trace()
        gt.register_callback_for_event_record(lambda e, s: seen.append(("record", e, s)))
        ext.fake_gpu_trace("record", 1, 2)
        run = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, trace=sys.argv[1])
        with run:
            ext.fake_gpu_trace("record", 3, 4)
        ext.fake_gpu_trace("record", 5, 6)
        ops = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
        print(json.dumps({"seen": seen, "events": [o["event"] for o in ops if o["op"] == "event_record"]}))
        """
    )
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(
            [sys.executable, "-c", code, f"{d}/t.jsonl"], capture_output=True, text=True, timeout=600
        )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["seen"] == [["record", 1, 2], ["record", 3, 4], ["record", 5, 6]]
    assert out["events"] == ["ev 0x3"]


def test_profile_counts_each_stage(monkeypatch):
    """STREAMSAN_PROFILE=1: the recorder's time per stage, and its counts, in Run.stats();
    `observe`: the callbacks return at once and nothing is recorded."""
    ext = _ext_or_skip()
    import torch

    def profiled(mode: str):
        monkeypatch.setenv("STREAMSAN_PROFILE", mode)
        run = _run()
        with run:
            ext.set_fake_stream(0xA)
            x = torch.ones(64)
            for _ in range(50):
                x.add_(1)
            ext.fake_gpu_trace("record", 0xE1, 0xA)
            # A Triton launch handed over whole (as TritonHooks' direct entry does): `kernels`
            for _ in range(20):
                assert ext.record_triton("triton_poi_fused_add_0", 0xA, bytes([3]), (x,)) == (1 if mode == "1" else 0)
            st = run.stats()
        return run, st

    run, st = profiled("1")
    assert st["recorder_profile_ops"] >= 50
    assert st["recorder_profile_callbacks"] >= st["recorder_profile_ops"]
    for k in ("regions", "site", "serialize", "syncs", "kernels", "kernels_regions", "kernels_site",
              "kernels_submit"):
        assert st[f"recorder_profile_{k}_seconds"] > 0, (k, st)
    # the parts of `kernels` are inside it
    parts = sum(st[f"recorder_profile_kernels_{k}_seconds"] for k in ("regions", "site", "submit"))
    assert parts <= st["recorder_profile_kernels_seconds"], st
    assert run.report.ops >= 71

    run, st = profiled("observe")
    assert st["recorder_profile_ops"] == 0 and st["recorder_profile_callbacks"] == 0
    assert run.report.ops == 0
    # counted afresh at each check: nothing from the profiled one, nothing timed while observing
    for k in ("kernels", "kernels_regions", "kernels_site", "kernels_submit"):
        assert st[f"recorder_profile_{k}_seconds"] == 0, (k, st)


def test_profile_is_off_by_default(monkeypatch):
    ext = _ext_or_skip()
    import torch

    monkeypatch.delenv("STREAMSAN_PROFILE", raising=False)
    run = _run()
    with run:
        ext.set_fake_stream(0xA)
        torch.ones(4).add_(1)
        st = run.stats()
    assert not any(k.startswith("recorder_profile_") for k in st)


def _many_ops_program(ext, torch):
    """Two streams, ordered by events, 3,000 ops: several batches of the recorder's (256 KiB)."""
    ext.set_fake_stream(0xA)
    x = torch.ones(64)
    y = torch.ones(64)
    for i in range(1500):
        ext.set_fake_stream(0xA)
        x.add_(1)
        ext.fake_gpu_trace("record", 0xE1, 0xA)
        ext.fake_gpu_trace("wait", 0xE1, 0xB)
        ext.set_fake_stream(0xB)
        y.add_(x)
        if i == 1000:
            ext.set_fake_stream(0xA)
            x.mul_(2)  # a race: x read on 0xB after the last wait, written on 0xA
        ext.fake_gpu_trace("record", 0xE2, 0xB)
        ext.fake_gpu_trace("wait", 0xE2, 0xA)


def test_batches_go_straight_to_the_checker_thread_with_the_same_report(tmp_path, monkeypatch):
    """With the checker on its own thread, the C++ recorder hands its batches to the checker's
    queue through the checker's raw sink (no Python); the report and the kept trace are those of
    the synchronous check, which gets its batches through Python."""
    # With STREAMSAN_DEFER=all the fake device's records are queued too, each holding its CPU
    # storages until written: a buffer's free is then recorded when the writer lets go of it,
    # which depends on the thread that writes (as a pinned block's does on a GPU). The two
    # traces compared here are the same only where the fake device's records are written at once.
    monkeypatch.delenv("STREAMSAN_DEFER", raising=False)
    ext = _ext_or_skip()
    import torch

    out = {}
    for threaded in (True, False):
        path = tmp_path / f"t{threaded}.jsonl"
        run = _run(trace=path, threaded=threaded)
        with run:
            _many_ops_program(ext, torch)
            st = run.stats()
        assert st["recorder_raw_sink"] is threaded, st
        assert st["recorder_raw_refused_bytes"] == 0
        # The CPU tensors' addresses differ from run to run: the traces without them.
        out[threaded] = tuple(re.sub(r'"addr":\d+', '"addr":0', t) for t in (run.report.to_json(), path.read_text()))
    assert len(out[True][1]) > 2 << 18  # batches were handed over during the run, not only at its end
    assert out[True][1] == out[False][1]
    assert out[True][0] == out[False][0]
    assert run.report.errors >= 1 and {h["kind"] for h in run.report.hazards} == {"data-race"}


def test_raw_sink_capsule_is_checked():
    """A capsule that is not a Checker's raw sink is refused (batches keep going through
    Python); a synchronous Checker has none."""
    ext = _ext_or_skip()
    from streamsan import Checker

    assert Checker(threaded=False)._raw_sink() is None
    c = Checker(threaded=True)
    cap = c._raw_sink()
    assert type(cap).__name__ == "PyCapsule"
    assert ext.set_raw_sink(cap) is True
    assert ext.set_raw_sink(None) is True
    import datetime

    assert ext.set_raw_sink(datetime.datetime.now) is False
    c.finish()


def test_composite_only_ops_are_not_looked_at_and_the_trace_is_the_same(tmp_path, monkeypatch):
    """aten::linear and aten::cross_entropy_loss run on the CPU (the fake device) through their
    CompositeImplicitAutograd kernels: the recorder records the ops they call (addmm,
    _log_softmax, nll_loss_forward …) and not them, and counts none of them among the ops looked
    at in full that wrote nothing."""
    from conftest import native_ext_or_skip

    native_ext_or_skip()
    import torch
    import torch.nn.functional as F

    monkeypatch.setenv("STREAMSAN_PROFILE", "1")
    path = tmp_path / "t.jsonl"
    run = _run(trace=path)
    with run:
        run._recorder.backend.ext.set_fake_stream(0xA)
        w = torch.randn(4, 8)
        x = torch.randn(2, 8)
        y = torch.tensor([1, 3])
        loss = F.cross_entropy(F.linear(x, w), y)
        st = run.stats()
    names = [json.loads(line).get("name") for line in path.read_text().splitlines() if line.strip()]
    assert "aten::addmm" in names or "aten::mm" in names, names
    assert "aten::_log_softmax" in names and "aten::nll_loss_forward" in names, names
    assert not {"aten::linear", "aten::cross_entropy_loss", "aten::log_softmax"} & set(names)
    unwritten = {n for n, _ in st["recorder_profile_unwritten_ops"]}
    assert not {"aten::linear", "aten::cross_entropy_loss", "aten::log_softmax"} & unwritten, unwritten
    assert float(loss) > 0


def test_run_profile_argument_wins_over_the_environment(monkeypatch):
    """Run(_profile=…) sets the profile for that check whatever STREAMSAN_PROFILE says (the
    benchmarks' profiling modes)."""
    ext = _ext_or_skip()
    import torch

    monkeypatch.setenv("STREAMSAN_PROFILE", "observe")
    for profile, recorded in (("1", True), ("0", True), ("observe", False)):
        run = _run(_profile=profile)
        with run:
            ext.set_fake_stream(0xA)
            torch.ones(4).add_(1)
            st = run.stats()
        assert (run.report.ops > 0) == recorded, profile
        assert any(k.startswith("recorder_profile_") for k in st) == (profile != "0"), (profile, st)


def test_floor_benchmark_times_each_layer_and_leaves_no_observer():
    """bench_overhead.py floor: the workload plain, under an observer that does nothing (with and
    without the op's inputs and outputs), observing only and checked; the do-nothing observer is
    off the dispatcher afterwards (a check after it records the same ops)."""
    ext = _ext_or_skip()
    import torch

    import bench_overhead

    res = bench_overhead.floor("tiny", 3, rounds=1, device="cpu")
    assert not ext.bench_floor_on()
    assert set(res["us"]) == set(bench_overhead.FLOOR_MODES)
    assert all(v > 0 for v in res["us"].values())
    assert set(res["ratio"]) == set(bench_overhead.FLOOR_MODES) - {"plain"}

    # The observer on: a check still records each op once (the two observers are independent).
    ext.bench_floor(True, True)
    try:
        assert ext.bench_floor_on()
        with _run() as on:
            torch.ones(4).add_(1)
    finally:
        ext.bench_floor(False)
    assert not ext.bench_floor_on()
    with _run() as off:
        torch.ones(4).add_(1)
    assert on.report.ops == off.report.ops > 0


def test_autograd_labels_are_known_by_their_text_not_their_address():
    """The autograd engine names each node's record with a string made for that call
    ("autograd::engine::evaluate_function: AddmmBackward0"): the recorder knows each such label
    once, by its text, so its table of op kinds stops growing once the step's ops are known,
    however many steps run (it kept one entry per address the strings took before)."""
    _ext_or_skip()
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)

    def steps(n):
        for _ in range(n):
            model(x).sum().backward()
            # Strings of other sizes in between move the labels' strings to other addresses.
            junk = ["x" * (i * 37 % 200) for i in range(50)]
            del junk

    with _run() as run:
        steps(3)
        known = run.stats()["recorder_op_kinds"]
        steps(200)
        assert run.stats()["recorder_op_kinds"] == known
    assert run.report.errors == 0, run.report.to_text()


def test_an_operator_taken_off_the_dispatcher_leaves_the_table_of_kinds(tmp_path):
    """An operator's kind is known by its name's address, which is its schema's for as long as
    the operator is registered. When a torch.library.Library is destroyed, its operators' kinds
    leave that table (another operator's name may take the address), and an operator defined
    after it is recorded with its own argument roles."""
    _ext_or_skip()
    import torch

    def define(name, schema, impl):
        lib = torch.library.Library(name, "DEF")
        lib.define(schema)
        lib.impl(schema.split("(")[0], impl, "CPU")
        return lib

    path = tmp_path / "t.jsonl"
    with _run(trace=path) as run:
        x = torch.zeros(4)
        first = define("streamsan_retire_a", "bump_(Tensor(a!) x) -> ()", lambda x: None)
        torch.ops.streamsan_retire_a.bump_(x)
        assert run.stats()["recorder_op_kinds_retired"] == 0
        first._destroy()
        assert run.stats()["recorder_op_kinds_retired"] == 1
        second = define("streamsan_retire_b", "peek(Tensor x) -> ()", lambda x: None)
        torch.ops.streamsan_retire_b.peek(x)
        second._destroy()
        assert run.stats()["recorder_op_kinds_retired"] == 2
    assert run.report.errors == 0, run.report.to_text()
    ops = {o["name"]: o for o in map(json.loads, path.read_text().splitlines()) if o.get("op") == "launch"}
    bump, peek = ops["streamsan_retire_a::bump_"], ops["streamsan_retire_b::peek"]
    assert len(bump.get("writes", [])) == 1 and not bump.get("reads")
    assert len(peek.get("reads", [])) == 1 and not peek.get("writes")


def _collective_library():
    """A process-group collective on the fake device: `c10d::streamsan_test_allreduce_` writes its
    tensor in place on the "process group's stream" 0xC, as ProcessGroupNCCL's collectives do:
    the stream waits for the current one's event, the kernel, then the work's end event recorded
    on 0xC. After the end event, `inside` 1 has the caching allocator hand out and take back a
    block, 2 calls an op (ProcessGroupNCCL's bookkeeping does either inside a collective at
    times, or frees there memory allocated before the check)."""
    import torch

    global _COLLECTIVE_LIB
    if "_COLLECTIVE_LIB" in globals():
        return _COLLECTIVE_LIB
    ext = _ext_or_skip()
    lib = torch.library.Library("c10d", "FRAGMENT")
    lib.define("streamsan_test_allreduce_(Tensor(a!) t, int inside) -> Tensor(a!)")

    def impl(t, inside):
        ext.fake_gpu_trace("record", 0xE0, 0xA)  # the current stream's work so far
        ext.fake_gpu_trace("wait", 0xE0, 0xC)  # the process group's stream waits for it
        # (the kernel: on 0xC)
        ext.fake_gpu_trace("record", 0xE2, 0xC)  # the work's end event
        if inside == 1:
            ext.fake_trace(True, 1 << 44, 512, 0xA)
            ext.fake_trace(False, 1 << 44, 0, 0xA)
        elif inside == 2:
            torch.ops.aten.view.default(t, [-1])
        return t

    lib.impl("streamsan_test_allreduce_", impl, "CPU")
    _COLLECTIVE_LIB = lib
    return lib


@pytest.mark.parametrize("inside", [0, 1, 2], ids=["nothing", "allocator", "op"])
def test_a_collective_s_end_event_comes_after_its_kernel_whatever_happens_inside(inside, tmp_path):
    """`work.wait()` makes the current stream wait on the collective's end event: the reads
    after it are ordered after the collective's kernel, also when the allocator allocated or
    freed or an op was called inside the collective after the event (that used to write the
    event before the collective's launch: a false race, seen with DDP's broadcasts on one NCCL
    rank)."""
    import json

    ext = _ext_or_skip()
    import torch

    _collective_library()
    path = tmp_path / "t.jsonl"
    run = _run(trace=path)
    with run:
        ext.set_fake_stream(0xA)
        x = torch.ones(8)
        x.add_(1)
        torch.ops.c10d.streamsan_test_allreduce_(x, inside)
        ext.fake_gpu_trace("wait", 0xE2, 0xA)  # work.wait()
        y = x * 2
        # Without the wait, the same read races with the collective's write.
        torch.ops.c10d.streamsan_test_allreduce_(x, inside)
        z = x * 2  # RACE
    del y, z
    assert [(h["kind"], int(h["access"]["site"].rsplit(":", 1)[1])) for h in run.report.hazards] == [
        ("data-race", _line_of("z = x * 2  # RACE"))
    ], run.report.to_text()
    ops = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    order = [o.get("name", o["op"]) for o in ops if o["op"] in ("launch", "event_record", "event_wait")]
    first = order.index("c10d::streamsan_test_allreduce_")
    assert order[first - 2 : first + 2] == ["event_record", "event_wait", "c10d::streamsan_test_allreduce_", "event_record"], order
    launch = ops[[i for i, o in enumerate(ops) if o.get("name") == "c10d::streamsan_test_allreduce_"][0]]
    assert launch["stream"] == "stream 0xc" and launch["writes"][0]["bytes"] == 32, launch


def test_what_the_end_of_an_op_meets_belongs_to_its_caller():
    """An op's end may run Python on its thread: written at once (no checker's raw sink), the
    batch goes to Python's sink when it is large enough, from the end of the op whose line
    filled it. What that Python does there (a host op of the GPU trace, an op of its own) comes
    after the ending op, as if issued once it has ended: nothing of it is lost or taken for the
    ending op's."""
    ext = _ext_or_skip()
    import torch

    from streamsan.torch import _recorder

    got: list = []
    issued = []
    y = torch.ones(4)

    def sink(data: bytes) -> None:
        got.append(data)
        if len(issued) < 3:
            issued.append(len(issued))
            y.add_(1)  # an op begun and ended inside another op's end
            ext.fake_gpu_trace("record", 0xE7, 0xA)  # the last thing: no op of the sink's after it

    rec = _recorder.Recorder(sink, "native", fake_device=True)
    try:
        rec.start()
        ext.set_fake_stream(0xA)
        x = torch.ones(64)
        for _ in range(400):  # each line about 200 bytes: the 16 KiB batch fills several times
            x.mul_(1.0)
    finally:
        rec.stop()
    assert len(issued) == 3, "the batch never reached Python's sink from an op's end"
    lines = [json.loads(line) for line in b"".join(got).decode().splitlines() if line.strip()]
    records = [i for i, o in enumerate(lines) if o["op"] == "event_record" and o["event"] == "ev 0xe7"]
    adds = [i for i, o in enumerate(lines) if o.get("name") == "aten::add_"]
    assert len(records) == 3 and len(adds) == 3, (records, adds)
    for a, r in zip(adds, records):
        # After the sink's op, before the next op of the loop.
        assert a < r and not any(o.get("name") == "aten::mul_" for o in lines[a:r]), lines[a : r + 1]
