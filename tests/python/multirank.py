"""Programs of several ranks — one GPU a rank, NCCL, under torchrun — checked the way a user
checks a distributed script: `torchrun --nproc-per-node=N -m streamsan.torch … multirank.py run
PROGRAM`, one check and one report per rank (docs/pytorch.md, "Distributed runs").

The real-code suite (realcode.py) runs DDP and FSDP2 on a one-rank group, where a collective
moves nothing. Here the collectives move data between GPUs, the ranks run out of step, and
PyTorch's distributed wrappers run as they do in training: DistributedDataParallel over
torchvision's ResNet-18 and over an MLP cut into many buckets, DDP with the fp16 compression
hook and gradients as bucket views, FSDP2 (`fully_shard`) and FSDP1
(`FullyShardedDataParallel`) over a nanoGPT. Each is right when its result is: the ranks'
parameters equal, or equal to the same model trained in one process on the global batch.

Two planted bugs, each buggy and fixed, both of a collective issued with `async_op=True` whose
`work.wait()` is missing (the fixed variant waits): the all-reduced tensor read before the
collective is done, and a broadcast's tensor changed while the collective may still send or
receive it. Their `# RACE` lines are where every rank must report them. Widened (`--widen`, no
check), one rank issues each step late (the host sleeps), so the other ranks' collectives wait
inside their kernels while their own streams run on: a buggy variant then computes a wrong
result, its fixed variant and every correct program never do.

    torchrun --standalone --nproc-per-node=2 tests/python/multirank.py run PROGRAM [--fixed]
        [--widen] [--runs N] [--result FILE]    # one program; each rank writes FILE.rankR (JSON)
    python tests/python/multirank.py report --out DIR [--nproc 2] [--runs 5] [--seconds 540]
        # every program checked under both recorders, then widened; a PASS/FAIL line per
        # criterion, DIR/multirank.json; exit 1 on a failed criterion (needs N GPUs)

MULTIRANK_DEVICE=cpu runs the programs on the CPU over gloo (their logic only: no streams).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
N = 1 << 24  # floats a planted bug's collective moves (64 MiB): a collective long enough to race
LATE = 0.05  # seconds the late rank sleeps before each step's collectives, widened


def _setup():
    import torch
    import torch.distributed as dist

    cpu = os.environ.get("MULTIRANK_DEVICE", "").strip().lower() == "cpu"
    if not dist.is_initialized():
        if cpu:
            dist.init_process_group("gloo")
        else:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    return torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())


def _n(dev) -> int:
    return N if dev.type == "cuda" else 1 << 12  # gloo on the CPU: the logic only


def _late(widen: bool, rank: int = -1) -> None:
    """Widened, one rank (default the last) issues its step late: the others' collectives wait
    in their kernels for it while their streams run on."""
    import torch.distributed as dist

    if widen and dist.get_rank() == rank % dist.get_world_size():
        time.sleep(LATE)


def _same_on_every_rank(params) -> bool:
    import torch
    import torch.distributed as dist

    v = torch.cat([p.detach().reshape(-1).float() for p in params])
    got = [torch.empty_like(v) for _ in range(dist.get_world_size())]
    dist.all_gather(got, v)
    return all(torch.equal(g, v) for g in got)


def _close(xs, ys, rel: float) -> bool:
    import torch

    for x, y in zip(xs, ys):
        x, y = x.detach().float().cpu(), y.detach().float().cpu()
        if not torch.isfinite(x).all() or (x - y).abs().max() > rel * (y.abs().max() + 1e-6):
            return False
    return True


def _realcode():
    sys.path.insert(0, str(HERE))
    import realcode

    return realcode


# ----------------------------------------------------------------------------------------------
# Correct programs


def ddp_resnet(fixed: bool, widen: bool) -> bool:
    """torchvision's ResNet-18 under DDP (BatchNorm buffers broadcast from rank 0 at each
    forward), a batch of its own per rank, 3 SGD steps with momentum; right when every rank
    ends with the same parameters."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    try:
        import torchvision
    except ImportError as e:
        raise RuntimeError(f"needs torchvision ({e})") from e
    dev = _setup()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(3):
        _late(widen)
        x = torch.randn(8, 3, 64, 64, generator=g).to(dev, non_blocking=True)
        y = torch.randint(0, 10, (8,), generator=g).to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return _same_on_every_rank(model.parameters())


def _train_against_one_process(dev, hook: bool, widen: bool) -> bool:
    """An MLP under DDP, each rank its own batch, against the same MLP trained in one process on
    all ranks' batches at once (the mean loss over the global batch: DDP's averaged gradient)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rc = _realcode()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = rc._mlp().to(dev)
    ref = copy.deepcopy(model)
    ids = [dev.index] if dev.type == "cuda" else None
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=0.05)  # a bucket or two a layer
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(world)]
    for _ in range(3):
        _late(widen)
        batches = [(torch.randn(32, 64, generator=gn), torch.randint(0, 10, (32,), generator=gn)) for gn in gens]
        x, y = (t.to(dev) for t in batches[rank])
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        gx = torch.cat([b[0] for b in batches]).to(dev)
        gy = torch.cat([b[1] for b in batches]).to(dev)
        ropt.zero_grad(set_to_none=True)
        F.cross_entropy(ref(gx), gy).backward()
        ropt.step()
    return _close(model.parameters(), ref.parameters(), 2e-2 if hook else 1e-4)


def ddp_mlp_buckets(fixed: bool, widen: bool) -> bool:
    """An MLP under DDP with 50 KB buckets (several all-reduces a step, overlapping the
    backward), 3 SGD steps; right when it matches one process trained on the global batch."""
    return _train_against_one_process(_setup(), hook=False, widen=widen)


def ddp_fp16_hook(fixed: bool, widen: bool) -> bool:
    """DDP with the fp16 compression comm hook and gradients as views of the buckets; right
    when it matches one process trained on the global batch (within fp16's precision)."""
    return _train_against_one_process(_setup(), hook=True, widen=widen)


def _gpt_against_one_process(wrap, widen: bool) -> bool:
    """nanoGPT sharded by `wrap(model)`, every rank the same batches (so the averaged gradient is
    one process's), AdamW, 3 steps; right when the losses are the unsharded model's."""
    import torch

    dev = _setup()
    rc = _realcode()
    torch.manual_seed(0)
    model = rc.TinyGPT().to(dev)
    ref = copy.deepcopy(model)
    sharded = wrap(model, dev)
    losses, rlosses = rc._sharded_gpt_losses(sharded, ref, torch.Generator().manual_seed(0), dev,
                                             lambda: _late(widen))
    return _close([losses], [rlosses], 1e-3)


def fsdp2(fixed: bool, widen: bool) -> bool:
    """FSDP2: `fully_shard` on each nanoGPT block and on the model."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        raise RuntimeError(f"needs FSDP2 (torch.distributed.fsdp.fully_shard: {e})") from e

    def wrap(model, dev):
        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
        return model

    return _gpt_against_one_process(wrap, widen)


def fsdp1(fixed: bool, widen: bool) -> bool:
    """FSDP1: `FullyShardedDataParallel` around each nanoGPT block and the model
    (`use_orig_params=True`, forward prefetch, the default backward prefetch)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    rc = _realcode()

    def wrap(model, dev):
        if dev.type != "cuda":
            raise RuntimeError("needs a GPU (FSDP1 runs on an accelerator only)")
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({rc._Block}), use_orig_params=True,
                    forward_prefetch=True, device_id=dev if dev.type == "cuda" else None)

    return _gpt_against_one_process(wrap, widen)


# ----------------------------------------------------------------------------------------------
# Planted bugs


def allreduce_read_early(fixed: bool, widen: bool) -> bool:
    """A gradient-like tensor all-reduced with `async_op=True`, then read (scaled into another
    tensor) without `work.wait()`: the read may see the values before the reduction."""
    import torch
    import torch.distributed as dist

    dev = _setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = True
    for step in range(2):
        t = torch.full((_n(dev),), float(rank + 1 + step), device=dev)
        _late(widen)
        work = dist.all_reduce(t, async_op=True)
        if fixed:
            work.wait()
        avg = t / world  # RACE
        if not fixed:
            work.wait()
        want = sum(r + 1 + step for r in range(world)) / world
        ok &= bool((avg == want).all())
    return ok


def broadcast_changed_early(fixed: bool, widen: bool) -> bool:
    """Rank 0's weights broadcast with `async_op=True`, then offset in place by each rank's
    number without `work.wait()`: a receiving rank's offset may land before the broadcast
    overwrites it (widened, rank 0 is the late one: its peers' receives wait for it)."""
    import torch
    import torch.distributed as dist

    dev = _setup()
    rank = dist.get_rank()
    ok = True
    for step in range(2):
        w = torch.full((_n(dev),), float(10 * rank + 2 + step), device=dev)
        _late(widen, 0)
        work = dist.broadcast(w, src=0, async_op=True)
        if fixed:
            work.wait()
        w.add_(rank)  # RACE
        work.wait()
        ok &= bool((w == 2 + step + rank).all())
    return ok


PROGRAMS = {  # name: (function, has a buggy variant)
    "ddp-resnet18": (ddp_resnet, False),
    "ddp-mlp-buckets": (ddp_mlp_buckets, False),
    "ddp-fp16-hook": (ddp_fp16_hook, False),
    "fsdp2": (fsdp2, False),
    "fsdp1": (fsdp1, False),
    "allreduce-read-early": (allreduce_read_early, True),
    "broadcast-changed-early": (broadcast_changed_early, True),
}

# What a correct program is known to be reported for (kinds), with why: docs/pytorch.md
# ("The real-code suite": FSDP2's reduce-scatter outputs freed by `zero_grad()` on the
# reduce-scatter stream without record_stream, true under the trace format's free rule; its
# source relies on the stream's next work coming after a wait for the current stream).
KNOWN = {"fsdp2": {"unsafe-free"}}


def race_lines() -> set[int]:
    return {i + 1 for i, line in enumerate(Path(__file__).read_text().splitlines()) if line.rstrip().endswith("# RACE")}


# ----------------------------------------------------------------------------------------------
# One program, one rank (run by torchrun)


def run_main(args) -> int:
    import torch.distributed as dist

    fn, _ = PROGRAMS[args.program]
    rank = int(os.environ.get("RANK", "0"))
    out = {"program": args.program, "fixed": args.fixed, "widen": args.widen, "rank": rank}
    t0 = time.perf_counter()
    try:
        results = [fn(args.fixed, args.widen) for _ in range(args.runs)]
        out.update(right=sum(results), runs=len(results))
    except RuntimeError as e:
        if str(e).startswith("needs "):
            out["skipped"] = str(e)
        else:
            raise
    finally:
        out["seconds"] = round(time.perf_counter() - t0, 3)
        if args.result:
            Path(f"{args.result}.rank{rank}").write_text(json.dumps(out))
        if dist.is_initialized():
            try:
                dist.barrier()
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a failed peer: torchrun reports it
                pass
    return 0


# ----------------------------------------------------------------------------------------------
# The driver


def _torchrun(nproc: int, rest: list[str], timeout: float, log: Path) -> tuple[int, float]:
    """torchrun with `rest`, its output in `log`; at `timeout` its whole process group is killed
    (the ranks with it: a rank stuck in a collective never returns by itself)."""
    import signal

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *rest]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
            rc = 124
    return rc, time.perf_counter() - t0


def _hazards(path: Path):
    try:
        return json.loads(path.read_text()).get("hazards", [])
    except (OSError, ValueError):
        return None


def _at(h: dict) -> str | None:
    a = h.get("access")
    if isinstance(a, list):
        a = a[0] if a else None
    return a.get("site") if isinstance(a, dict) else None


def _ran(result) -> bool:
    """Whether a rank's result says its runs finished (a failed rank wrote none of them)."""
    return isinstance(result, dict) and isinstance(result.get("runs"), int) and isinstance(result.get("right"), int)


def _right(result) -> bool:
    return _ran(result) and result["runs"] > 0 and result["right"] == result["runs"]


def report_main(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    lines = race_lines()
    deadline = time.monotonic() + args.seconds
    rows, checks = [], []

    def check(ok: bool, what: str) -> None:
        checks.append((ok, what))
        print(f"[{'PASS' if ok else 'FAIL'}] {what}", flush=True)

    variants = [(p, f) for p, (_, buggy) in PROGRAMS.items() for f in ((False, True) if buggy else (True,))]
    for program, fixed in variants:
        if args.only and program not in args.only:
            continue
        tag = f"{program}{'' if not PROGRAMS[program][1] else ('-fixed' if fixed else '-buggy')}"
        row = {"program": tag}
        rows.append(row)
        flag = ["--fixed"] if fixed else []
        for backend in args.backends:
            left = deadline - time.monotonic()
            if left < 20:
                row[backend] = {"not_run": "out of time"}
                continue
            rep = out / f"{tag}-{backend}.json"
            res = out / f"{tag}-{backend}.result"
            rc, secs = _torchrun(args.nproc, ["-m", "streamsan.torch", "--backend", backend, "--format", "json",
                                              "-o", str(rep), me, "run", program, *flag, "--result", str(res)],
                                 min(args.timeout, left), out / f"{tag}-{backend}.log")
            ranks = []
            for r in range(args.nproc):
                # a world of one keeps the path given (docs/pytorch.md, "Distributed runs")
                hz = _hazards(rep if args.nproc == 1 else out / f"{rep.stem}.rank{r}.json")
                try:
                    result = json.loads(Path(f"{res}.rank{r}").read_text())
                except (OSError, ValueError):
                    result = None
                ranks.append({
                    "rank": r,
                    "hazards": None if hz is None else len(hz),
                    "kinds": None if hz is None else sorted({h.get("kind") for h in hz}),
                    "sites": None if hz is None else sorted({s for s in map(_at, hz) if s}),
                    "at_race_line": None if hz is None else any(
                        (s or "").rsplit(":", 1)[0].endswith("multirank.py") and int((s or ":0").rsplit(":", 1)[1] or 0) in lines
                        for s in map(_at, hz)),
                    "result": result,
                })
            row[backend] = {"exit": rc, "seconds": round(secs, 1), "ranks": ranks}
            skipped = [r["result"]["skipped"] for r in ranks if r["result"] and r["result"].get("skipped")]
            if skipped:
                print(f"[SKIP] {tag} {backend}: {skipped[0]}", flush=True)
                continue
            right = all(_right(r["result"]) for r in ranks)
            if fixed:
                kinds = {k for r in ranks for k in (r["kinds"] or [])}
                known = KNOWN.get(program, set())
                clean = all(r["hazards"] is not None for r in ranks) and kinds <= known
                note = f" ({'known' if kinds <= known else 'reported'}: {', '.join(sorted(kinds))})" if kinds else ""
                check(clean and right, f"{backend}: {tag}: every rank clean and right{note} "
                      f"[{', '.join(str(r['hazards']) for r in ranks)} hazards; exit {rc}]")
            else:
                reported = all(r["hazards"] and r["at_race_line"] for r in ranks)
                check(reported, f"{backend}: {tag}: every rank reports it at a # RACE line "
                      f"[{'; '.join(','.join(r['sites'] or []) for r in ranks)}]")
        left = deadline - time.monotonic()
        if left < 20:
            row["widened"] = {"not_run": "out of time"}
            continue
        res = out / f"{tag}-widened.result"
        rc, secs = _torchrun(args.nproc, [me, "run", program, *flag, "--widen", "--runs", str(args.runs),
                                          "--result", str(res)], min(args.timeout, left), out / f"{tag}-widened.log")
        results = []
        for r in range(args.nproc):
            try:
                results.append(json.loads(Path(f"{res}.rank{r}").read_text()))
            except (OSError, ValueError):
                results.append(None)
        row["widened"] = {"exit": rc, "seconds": round(secs, 1), "ranks": results}
        if any(r and r.get("skipped") for r in results):
            continue
        wrong = [r["runs"] - r["right"] if _ran(r) else None for r in results]
        if fixed:
            check(rc == 0 and all(w == 0 for w in wrong), f"widened: {tag}: never wrong ({wrong} of {args.runs} a rank)")
        elif args.nproc == 1:
            print(f"[SKIP] widened: {tag}: a world of one has no late rank to widen the race "
                  f"(wrong in {wrong} of {args.runs})", flush=True)
        else:
            check(rc == 0 and None not in wrong and any(wrong), f"widened: {tag}: wrong in some run ({wrong} of {args.runs} a rank)")
    (out / "multirank.json").write_text(json.dumps({"rows": rows, "checks": checks}, indent=1))
    failed = sum(not ok for ok, _ in checks)
    print(f"\n{len(checks) - failed} criteria passed, {failed} failed", flush=True)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one program on this rank (under torchrun)")
    r.add_argument("program", choices=sorted(PROGRAMS))
    r.add_argument("--fixed", action="store_true")
    r.add_argument("--widen", action="store_true")
    r.add_argument("--runs", type=int, default=1)
    r.add_argument("--result")
    d = sub.add_parser("report", help="every program, checked and widened")
    d.add_argument("--out", required=True)
    d.add_argument("--nproc", type=int, default=2)
    d.add_argument("--runs", type=int, default=5)
    d.add_argument("--seconds", type=float, default=540)
    d.add_argument("--timeout", type=float, default=120, help="seconds a torchrun may take")
    d.add_argument("--backends", nargs="+", default=["native", "python"])
    d.add_argument("--only", nargs="*", help="these programs only")
    args = ap.parse_args()
    if args.cmd == "run":
        return run_main(args)
    if shutil.which("nvidia-smi") is None and os.environ.get("MULTIRANK_DEVICE") != "cpu":
        print("multirank: no GPU here (nvidia-smi not found); MULTIRANK_DEVICE=cpu runs the logic on gloo")
    return report_main(args)


if __name__ == "__main__":
    sys.exit(main())
