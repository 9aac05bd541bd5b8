"""A fixed recorded workload for instruction counts of the C++ recorder (docs/performance.md,
"An op's line written through a pointer"): a small MLP's training step (16→32→4, batch 8, SGD)
on CPU tensors standing for device memory, 200 steps, checked on this thread (no checker
thread: the counts do not depend on scheduling). `BENCH_THREADED=1`: checked on the checker's
thread, the recorder's records written by its own thread (with `STREAMSAN_DEFER=all`: the fake
device's ops too) or at once (`STREAMSAN_DEFER=0`): the callbacks' counts, on the program's
thread, of either way.

    valgrind --tool=callgrind --callgrind-out-file=cg.out python tests/python/bench_record_lines.py t.jsonl
    callgrind_annotate --inclusive=yes --tree=calling cg.out | grep -E "put_launch|put_region|free_buf"

`--host-ops`: instead, 2,000 event records and 2,000 waits of c10's GPU trace, called as CUDA
code calls it (`fake_gpu_trace`), under a check on the checker's thread: the instructions of
each host op on the program's thread (`traced_host_op`) and on the resolver's.

    valgrind --tool=callgrind python tests/python/bench_record_lines.py --host-ops t.jsonl

Prints the number of ops checked. Needs torch (CPU is enough) and the C++ recorder.
"""

import os
import sys

import torch

import streamsan.torch


def host_ops(path: str) -> None:
    run = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, trace=path, threaded=True)
    with run:
        fake = run._recorder.backend.ext.fake_gpu_trace
        for _ in range(2000):
            fake("record", 0xE1, 0xA)
            fake("wait", 0xE1, 0xB)
    print(run.report.ops)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--host-ops"]
    path = args[0] if args else "bench_record_lines.jsonl"
    if "--host-ops" in sys.argv[1:]:
        host_ops(path)
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    run = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, trace=path,
                              threaded=os.environ.get("BENCH_THREADED") == "1")
    with run:
        for _ in range(200):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    print(run.report.ops)


if __name__ == "__main__":
    main()
