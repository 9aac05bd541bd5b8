"""Triton kernel launches: which tensors a kernel reads and writes, and where it is launched.

A Triton kernel is one CUDA launch that the dispatcher does not see as an aten op: the kernels
`torch.compile` (Inductor) generates, user `@triton.jit` kernels, and user kernels that Inductor
compiles into a graph. This module finds those launches and, for each tensor argument, whether
the kernel reads it, writes it, or both; the recorder turns each into a launch op on its stream.

What is seen:

- **Inductor's kernels**: `torch._inductor.runtime.triton_heuristics.CachingAutotuner.run(*args,
  stream=…)`, the call the generated wrapper code makes for every launch. `kind` is
  "inductor"; the stream is the raw stream handle Inductor passes; the name is the kernel's
  (`inductor_meta["kernel_name"]`, e.g. `triton_poi_fused_add_0`). Roles come from the kernel's
  TTIR (`ttir_roles`), found in its compiled kernel or in Triton's cache directory; without it,
  from the argument names Inductor gives (`inductor_roles`: `in_ptrN` read, `out_ptrN`
  written, `in_out_ptrN` both, …). A run with `benchmark_run=True` is not recorded, nor are the
  launches of autotuning benchmarks made inside `run`.
  Where a check uses the C++ recorder (`use_native`), the patch is its `FastRun`: a tuned
  kernel's launches (its plan made here, then told to it) go from it to the recorder and the
  original `run` without a Python frame; every other call comes to the Python wrapper.
- **Triton's own launches**: `triton.compiler.compiler.CompiledKernel.launch_metadata(grid,
  stream, *args)`, which `JITFunction.run` (`kernel[grid](…)`) and `CompiledKernel[grid](…)`
  call before every launch. `kind` is "triton"; roles come from the compiled kernel's TTIR
  (`user_kernel_roles`). This also sees the benchmark launches of `triton.autotune`, which are
  real launches on the current stream. While `CachingAutotuner.run` is running on a thread, this
  entry point records nothing on that thread (Inductor's launches are recorded once, by `run`).

Launches are recorded before they are issued. The one exception: an Inductor kernel that is not
tuned yet (its first launch in a process, unless Inductor's caches give it its config: several
configs, or none compiled, or one that coordinate descent or combo autotuning has not settled)
is recorded when `run` returns. That `run` compiles the kernel and benchmarks its configs (their
launches and copies, and `torch.cuda.synchronize()`) before it launches the best one; recorded
before all that, the kernel would be ordered before the synchronization and before nothing that
follows it, and a race of its output with the next stream's work would not be seen.

What is not seen: kernels launched by paths that bypass both entry points (Triton's or a
library's own C++ launchers, Inductor's C++ wrapper and AOTInductor, AOT-compiled Triton
kernels, `triton.tools.compile`); accesses through pointers a kernel gets from memory or as
integers (only pointer arguments are followed); and CUDA graph replays (a replay is recorded as
the graph's launch elsewhere; the Triton kernels inside a graph are recorded when captured).

The TTIR analysis is exact for what it understands (loads, stores, atomics, block pointers,
tensor descriptors, loops, branches, calls of noinline functions) and conservative for the
rest: an argument whose accesses it cannot follow (unknown ops, inline assembly, a pointer
stored to memory, unparseable IR) is taken as read and written, and the result says so
(`"exact": False`).

Neither torch nor triton is imported by this module: `TritonHooks` patches their classes when
they are imported (or at once if they already are), so that a check that never meets Triton
costs nothing, and its logic is tested without either.
"""

from __future__ import annotations

import glob
import importlib.abc
import importlib.util
import os
import re
import sys
import threading
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence

__all__ = [
    "AUTOTUNER_TARGET",
    "KERNEL_TARGET",
    "TritonHooks",
    "inductor_roles",
    "ttir_roles",
    "user_kernel_roles",
]

# (module, class, method) patched by TritonHooks.
AUTOTUNER_TARGET = ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner", "run")
KERNEL_TARGET = ("triton.compiler.compiler", "CompiledKernel", "launch_metadata")

CONSERVATIVE = (True, True)  # (read, write) of an argument whose accesses are not known

# ------------------------------------------------------------------------------------------------
# TTIR analysis
# ------------------------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = r"%[A-Za-z0-9_$.\-]+"
_SSA = re.compile(_NAME + r"(?:#\d+)?")
_RESULTS = re.compile(r"^(" + _NAME + r"(?::\d+)?(?:\s*,\s*" + _NAME + r"(?::\d+)?)*)\s*=\s*(.*)$")
_OPNAME = re.compile(r'^(?:"<(\d+)>"|([A-Za-z_][\w$]*(?:\.[\w$]+)+))')
_PAIR = re.compile(r"(" + _NAME + r")\s*=\s*(" + _NAME + r"(?:#\d+)?)")
_BLOCK_ARG = re.compile(r"(" + _NAME + r")\s*:")
_FUNC_ARG = re.compile(r"(" + _NAME + r")\s*:\s*(.*)$", re.S)
_FUNC = re.compile(r"^(?:tt|func)\.func\b")
_SYMBOL = re.compile(r'@(?:"<(\d+)>"|([\w$.\-]+))')
_LOC_ALIAS = re.compile(r'^#(loc\d*)\s*=\s*loc\(\s*"<(\d+)>"\s*\(')
_CALLS = ("tt.call", "func.call", "call")

# Ops that read the memory their first operand points to.
_READ_OPS = frozenset({
    "tt.load", "tt.descriptor_load", "tt.descriptor_gather",
    "tt.experimental_descriptor_load", "tt.experimental_descriptor_gather",
})
# Ops that write (or atomically update) the memory their first operand points to.
_WRITE_OPS = frozenset({
    "tt.store", "tt.atomic_rmw", "tt.atomic_cas",
    "tt.descriptor_store", "tt.descriptor_scatter", "tt.descriptor_reduce",
    "tt.experimental_descriptor_store", "tt.experimental_descriptor_scatter",
})
# Which operands of a write are the data written (an address there escapes to memory); the
# descriptor ops write their last operand.
_WRITE_VALUES = {"tt.store": slice(1, 2), "tt.atomic_rmw": slice(1, 2), "tt.atomic_cas": slice(1, 3)}
# Ops that touch no memory: their results carry their operands' addresses.
_PURE_PREFIXES = ("arith.", "math.", "scf.", "cf.", "ub.", "builtin.")
_PURE_OPS = frozenset({
    "tt.splat", "tt.unsplat", "tt.addptr", "tt.broadcast", "tt.expand_dims", "tt.reshape",
    "tt.trans", "tt.cat", "tt.join", "tt.split", "tt.make_range", "tt.get_program_id",
    "tt.get_num_programs", "tt.make_tensor_ptr", "tt.advance", "tt.make_tensor_descriptor",
    "tt.ptr_to_int", "tt.int_to_ptr", "tt.bitcast", "tt.fp_to_fp", "tt.clampf", "tt.precise_sqrt",
    "tt.precise_divf", "tt.mulhiui", "tt.dot", "tt.dot_scaled", "tt.reduce", "tt.reduce.return",
    "tt.scan", "tt.scan.return", "tt.map_elementwise", "tt.map_elementwise.return", "tt.gather",
    "tt.histogram", "tt.print", "tt.assert", "tt.assume", "tt.return", "func.return",
})


class _ParseError(Exception):
    pass


class _Op:
    __slots__ = ("name", "results", "operands", "pairs", "regions", "callee")

    def __init__(self, name: str, operands: list, callee: Optional[str]) -> None:
        self.name = name
        self.results: list = []  # value ids
        self.operands = operands  # value ids
        self.pairs: list = []  # [(defined id, initial value id)]: `iter_args(%a = %b)` and the like
        self.regions: list = []  # [[_Block]]
        self.callee = callee


class _Block:
    __slots__ = ("args", "ops")

    def __init__(self) -> None:
        self.args: list = []
        self.ops: list = []


class _Func:
    __slots__ = ("name", "public", "args", "body", "nvalues", "error")

    def __init__(self, name: str, public: bool, args: list) -> None:
        self.name = name
        self.public = public
        self.args = args  # argument i is value id i
        self.body: list = [_Block()]
        self.nvalues = len(args)
        self.error: Optional[str] = None


def _balanced(text: str, start: int) -> int:
    """Index of the ')' closing the '(' at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise _ParseError("unbalanced parentheses")


def _strip_locs(line: str) -> str:
    """`line` without its loc(…) groups (strings already replaced, so parentheses balance)."""
    out = []
    i = 0
    while True:
        j = line.find("loc(", i)
        if j < 0:
            out.append(line[i:])
            return "".join(out)
        if j > 0 and (line[j - 1].isalnum() or line[j - 1] in "_.$#"):  # part of a longer word
            out.append(line[i:j + 4])
            i = j + 4
            continue
        out.append(line[i:j])
        i = _balanced(line, j + 3) + 1


def _split_top(text: str) -> list:
    """Split at the commas outside (), [], {} and <> (an arrow's '>' is not a bracket)."""
    parts, depth, start = [], 0, 0
    scan = text.replace("->", "  ")
    for i, c in enumerate(scan):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:])
    return parts


class _Parser:
    """A structural reader of MLIR's printed TTIR: functions, regions, blocks, ops, and the SSA
    values they define and use. Names are resolved in the scopes of the enclosing regions
    (sibling regions reuse names), so that every definition is a distinct value id."""

    def __init__(self, text: str) -> None:
        self.strings: list = []
        self.loc_names: dict = {}
        self.lines: list = []
        for raw in text.splitlines():
            line = _STRING.sub(self._keep_string, raw.strip())
            if line.startswith("#"):
                m = _LOC_ALIAS.match(line)
                if m:
                    self.loc_names[m.group(1)] = self.strings[int(m.group(2))]
                continue
            if line:
                self.lines.append(line)

    def _keep_string(self, m: "re.Match[str]") -> str:
        self.strings.append(m.group(0)[1:-1])
        return f'"<{len(self.strings) - 1}>"'

    def _symbol(self, text: str) -> Optional[str]:
        m = _SYMBOL.search(text)
        if not m:
            return None
        return self.strings[int(m.group(1))] if m.group(1) is not None else m.group(2)

    def _arg_name(self, arg_text: str) -> Optional[str]:
        m = re.search(r'loc\(\s*"<(\d+)>"\s*\(', arg_text)
        if m:
            return self.strings[int(m.group(1))]
        m = re.search(r"loc\(\s*#(loc\d*)\s*\)", arg_text)
        if m:
            return self.loc_names.get(m.group(1))
        return None

    def parse(self) -> list:
        funcs: list = []
        func: Optional[_Func] = None
        frames: list = []  # (op or None for the function, scope, blocks, pending results)
        for line in self.lines:
            if func is None:
                if _FUNC.match(line):
                    f = self._func_header(line)
                    if line.endswith("{"):  # else a declaration: no body
                        func = f
                        funcs.append(func)
                        frames = [(None, {a["ssa"]: i for i, a in enumerate(func.args)}, func.body, [])]
                continue
            try:
                if self._line(func, frames, line):
                    func = None
            except _ParseError as e:
                func.error = f"{e}: {line[:160]}"
                func = None
        if func is not None:
            func.error = "the function does not end"
        return funcs

    def _func_header(self, line: str) -> _Func:
        name = self._symbol(line) or "?"
        words = f" {line} "
        public = " private " not in words and " nested " not in words
        args = []
        start = line.find("(", line.find("@"))
        if start >= 0:
            end = _balanced(line, start)
            for i, text in enumerate(_split_top(line[start + 1:end])):
                text = text.strip()
                m = _FUNC_ARG.match(text)
                if not m:
                    raise _ParseError(f"unreadable argument {text[:60]!r}")
                ssa, rest = m.group(1), _strip_locs(m.group(2))
                typ = re.split(r"\s*\{", rest, maxsplit=1)[0].strip()
                args.append({
                    "index": i,
                    "name": self._arg_name(text) or ssa[1:],
                    "ssa": ssa,
                    "type": typ,
                    "pointer": "ptr<" in typ or "tensordesc" in typ,
                })
        return _Func(name, public, args)

    @staticmethod
    def _define(func: _Func, scope: dict, name: str) -> int:
        vid = func.nvalues
        func.nvalues += 1
        scope[name] = vid
        return vid

    @staticmethod
    def _lookup(frames: list, name: str) -> int:
        for frame in reversed(frames):
            vid = frame[1].get(name)
            if vid is not None:
                return vid
        raise _ParseError(f"use of an undefined value {name}")

    def _close_op(self, func: _Func, frames: list, op: _Op, pending: list) -> None:
        scope = frames[-1][1]
        for name, count in pending:
            if count is None:
                op.results.append(self._define(func, scope, name))
            else:
                ids = [self._define(func, scope, f"{name}#{k}") for k in range(count)]
                if ids:
                    scope[name] = ids[0]
                op.results.extend(ids)

    def _line(self, func: _Func, frames: list, line: str) -> bool:
        """Read one line of a function's body; True when the function ends there."""
        text = _strip_locs(line).strip()
        if not text:
            return False
        if text.startswith("}"):
            op, _scope, _blocks, pending = frames.pop()
            if op is None:
                return True
            rest = text[1:].lstrip(") ,").strip()
            if rest.endswith("{"):  # `} else {`, `} do {`, `}, {`: the op's next region
                blocks = [_Block()]
                op.regions.append(blocks)
                frames.append((op, {}, blocks, pending))
            else:
                self._close_op(func, frames, op, pending)
            return False
        blocks = frames[-1][2]
        if text.startswith("^"):
            block = _Block()
            m = re.match(r"\^[\w$.\-]+\s*\((.*)\)\s*:?\s*$", text)
            if m:
                block.args = [self._define(func, frames[-1][1], n) for n in _BLOCK_ARG.findall(m.group(1))]
            if len(blocks) == 1 and not blocks[0].ops and not blocks[0].args:
                blocks[0] = block
            else:
                blocks.append(block)
            return False
        pending: list = []
        m = _RESULTS.match(text)
        if m:
            for res in m.group(1).split(","):
                name, _, count = res.strip().partition(":")
                pending.append((name, int(count) if count else None))
            text = m.group(2)
        m = _OPNAME.match(text)
        if m is None:
            name = "?"
        else:
            name = self.strings[int(m.group(1))] if m.group(1) is not None else m.group(2)
        callee = self._symbol(text) if name in _CALLS else None
        opens = text.endswith("{")
        pairs = _PAIR.findall(text) if opens else []
        defined = {d for d, _u in pairs}
        operands = [self._lookup(frames, tok) for tok in _SSA.findall(text) if tok not in defined]
        op = _Op(name, operands, callee)
        blocks[-1].ops.append(op)
        if not opens:
            self._close_op(func, frames, op, pending)
            return False
        region = [_Block()]
        op.regions.append(region)
        scope: dict = {}
        op.pairs = [(self._define(func, scope, d), self._lookup(frames, u)) for d, u in pairs]
        region[0].args = [d for d, _u in op.pairs]
        frames.append((op, scope, region, pending))
        return False


def _walk(blocks: list) -> Iterable:
    for block in blocks:
        for op in block.ops:
            yield op
            for region in op.regions:
                yield from _walk(region)


def _terminator(region: list) -> Optional[_Op]:
    for block in reversed(region):
        if block.ops:
            return block.ops[-1]
    return None


def _yielded(region: Optional[list], name: str = "scf.yield") -> list:
    op = _terminator(region) if region else None
    return op.operands if op is not None and op.name == name else []


def _edges(func: _Func) -> list:
    """(sources, destination) value ids: the destination's addresses include the sources'."""
    edges: list = []

    def add(srcs: Sequence, dst: int) -> None:
        if srcs:
            edges.append((tuple(srcs), dst))

    for op in _walk(func.body):
        name = op.name
        if name in _READ_OPS or name in _WRITE_OPS:
            continue  # loaded or returned data is not an argument's address
        if name == "scf.for" and op.regions:
            yields = _yielded(op.regions[0])
            for k, (d, init) in enumerate(op.pairs):
                carried = k - 1  # the first pair is the induction variable
                src = [init] + ([yields[carried]] if 0 <= carried < len(yields) else [])
                add(src, d)
                if 0 <= carried < len(op.results):
                    add(src, op.results[carried])
            continue
        if name == "scf.while" and op.regions:
            before = op.regions[0]
            after = op.regions[1] if len(op.regions) > 1 else None
            cond = _terminator(before)
            forwarded = cond.operands[1:] if cond is not None and cond.name == "scf.condition" else []
            yields = _yielded(after)
            for k, (d, init) in enumerate(op.pairs):
                add([init] + ([yields[k]] if k < len(yields) else []), d)
            after_args = after[0].args if after else []
            for k, v in enumerate(forwarded):
                if k < len(after_args):
                    add([v], after_args[k])
                if k < len(op.results):
                    add([v], op.results[k])
            continue
        if name == "scf.if":
            for region in op.regions:
                for k, v in enumerate(_yielded(region)):
                    if k < len(op.results):
                        add([v], op.results[k])
            continue
        # any other op: results (and its regions' arguments) from every operand, and from what
        # its regions' terminators return
        srcs = list(op.operands)
        for region in op.regions:
            for block in region:
                for a in block.args:
                    add(op.operands, a)
                if block.ops and not block.ops[-1].results:
                    srcs.extend(block.ops[-1].operands)
        for r in op.results:
            add(srcs, r)
    return edges


def _addresses(func: _Func) -> list:
    """For every value id, a bit mask of the pointer arguments its address may derive from."""
    masks = [0] * func.nvalues
    for i, a in enumerate(func.args):
        if a["pointer"]:
            masks[i] = 1 << i
    edges = _edges(func)
    changed = True
    while changed:  # to a fixed point: loop-carried values feed back
        changed = False
        for srcs, dst in edges:
            m = masks[dst]
            for s in srcs:
                m |= masks[s]
            if m != masks[dst]:
                masks[dst] = m
                changed = True
    return masks


def _summarize(func: _Func, funcs: dict, summaries: dict, visiting: set) -> tuple:
    """(read, write, inexact): bit masks over `func`'s arguments."""
    if func.name in summaries:
        return summaries[func.name]
    allptr = sum(1 << i for i, a in enumerate(func.args) if a["pointer"])
    if func.error is not None or func.name in visiting:
        return (allptr, allptr, allptr)
    visiting.add(func.name)
    masks = _addresses(func)
    read = write = inexact = 0
    for op in _walk(func.body):
        name = op.name
        if name in _READ_OPS:
            if op.operands:
                read |= masks[op.operands[0]]
            continue
        if name in _WRITE_OPS:
            if op.operands:
                write |= masks[op.operands[0]]
            values = op.operands[_WRITE_VALUES.get(name, slice(-1, None))] if len(op.operands) > 1 else []
            for v in values:
                if masks[v]:  # an argument's address written as data: who reads it is not known
                    read |= masks[v]
                    write |= masks[v]
                    inexact |= masks[v]
            continue
        if name in _CALLS:
            callee = funcs.get(op.callee) if op.callee else None
            if callee is None or len(callee.args) != len(op.operands):
                for v in op.operands:
                    read |= masks[v]
                    write |= masks[v]
                    inexact |= masks[v]
                continue
            r, w, x = _summarize(callee, funcs, summaries, visiting)
            for k, v in enumerate(op.operands):
                if r >> k & 1:
                    read |= masks[v]
                if w >> k & 1:
                    write |= masks[v]
                if x >> k & 1:
                    inexact |= masks[v]
            continue
        if name in _PURE_OPS or name.startswith(_PURE_PREFIXES):
            continue
        # an op this analysis does not know (inline assembly, an external function, a newer
        # memory op): an argument whose address it is handed may be read or written through it
        touched = 0
        for v in op.operands:
            touched |= masks[v]
        if touched:
            if "load" in name or "gather" in name or "prefetch" in name:
                read |= touched
            elif "store" in name or "atomic" in name or "scatter" in name:
                write |= touched
            else:
                read |= touched
                write |= touched
            inexact |= touched
    visiting.discard(func.name)
    summaries[func.name] = (read, write, inexact)
    return summaries[func.name]


def ttir_roles(ttir: str, name: Optional[str] = None) -> dict:
    """Which arguments a kernel reads and writes, from its TTIR (`CompiledKernel.asm["ttir"]`).

    Returns {"kernel": the function's name, "exact": bool, "error": str or None, "args": [...]}
    with one entry of "args" per argument of the kernel's function, in order:
    {"index": position, "name": its Python parameter (the argument's location; else the SSA name
    without "%"), "ssa": "%…", "type": "!tt.ptr<f32>", "pointer": bool, "read": bool,
    "write": bool, "exact": bool}.

    The function analysed is `name`, else the module's public function (the kernel). A pointer
    argument is read when a load (`tt.load`, `tt.descriptor_load`, …) goes through an address
    derived from it, written when a store or an atomic does (`tt.store`, `tt.atomic_rmw`,
    `tt.atomic_cas`, `tt.descriptor_store`, …). Addresses are followed through every op
    (`tt.splat`, `tt.addptr`, `arith.select`, block pointers, tensor descriptors, …), loop-carried
    values (`scf.for` iter_args, `scf.while`), `scf.if` results, and calls of the module's other
    functions (analysed in turn). Non-pointer arguments are neither read nor written.

    Conservative where it cannot follow: an argument whose address reaches an unknown op or
    inline assembly, is stored as data, or is passed to an unknown function, and every pointer
    argument of IR it cannot read, is read and written, with "exact": False (for the argument
    and for the result; "error" says what could not be read).
    """
    try:
        funcs = _Parser(ttir).parse()
    except Exception as e:  # noqa: BLE001 - any failure to read the IR means "not known"
        return {"kernel": name, "exact": False, "error": f"cannot read the TTIR: {e}", "args": []}
    if not funcs:
        return {"kernel": name, "exact": False, "error": "no function in the TTIR", "args": []}
    by_name = {f.name: f for f in funcs}
    func = by_name.get(name) if name else None
    if func is None:
        func = next((f for f in funcs if f.public), funcs[0])
    error = func.error
    try:
        read, write, inexact = _summarize(func, by_name, {}, set())
    except Exception as e:  # noqa: BLE001 - a failed analysis degrades to "read and written"
        read = write = inexact = sum(1 << i for i, a in enumerate(func.args) if a["pointer"])
        error = f"cannot analyse the TTIR: {type(e).__name__}: {e}"
    args = []
    for i, a in enumerate(func.args):
        bit = 1 << i
        args.append({**a, "read": bool(read & bit), "write": bool(write & bit), "exact": not inexact & bit})
    return {"kernel": func.name, "exact": error is None and not inexact, "error": error, "args": args}


# ------------------------------------------------------------------------------------------------
# Python arguments and TTIR arguments
# ------------------------------------------------------------------------------------------------


def _is_tensor(x: Any) -> bool:
    t = type(x)
    if t in _TENSOR_TYPES:
        return True
    if hasattr(x, "data_ptr") and not isinstance(x, type):
        if len(_TENSOR_TYPES) < 64:
            _TENSOR_TYPES.add(t)  # its instances are tensors: found faster next time
        return True
    return False


# Types whose instances were found to be tensors (torch.Tensor, nn.Parameter, …): a launch's
# arguments are checked by type first.
_TENSOR_TYPES: set = set()
# Arguments that carry no memory.
_SCALAR_TYPES = frozenset((bool, int, float, str, type(None)))


def _descriptor_base(x: Any) -> Any:
    """The tensor of a host tensor descriptor (triton.tools.tensor_descriptor.TensorDescriptor)."""
    base = getattr(x, "base", None)
    if base is not None and _is_tensor(base) and hasattr(x, "block_shape"):
        return base
    return None


def _role(a: dict) -> Optional[tuple]:
    return (a["read"], a["write"]) if a["pointer"] else None


def _desc_extra(sig: str) -> int:
    """How many scalar arguments follow a host descriptor's in the TTIR (its shape, strides)."""
    m = re.search(r"\[([^\]]*)\]", sig)
    return 2 * (m.group(1).count(",") + 1) if m else 0


def _slot(sig: Any, path: tuple, constants: dict, args: list, cursor: list) -> Any:
    """The slot of one parameter (or tuple element) whose TTIR arguments are `args` from
    `cursor[0]` on: None (no memory through it), (read, write), or a list of slots (a tuple)."""
    if sig == "constexpr" or path in constants:
        return None  # a constant: not an argument of the TTIR
    if isinstance(sig, (list, tuple)):
        return [_slot(s, path + (j,), constants, args, cursor) for j, s in enumerate(sig)]
    if cursor[0] >= len(args):
        raise LookupError("fewer TTIR arguments than parameters")
    a = args[cursor[0]]
    cursor[0] += 1
    if isinstance(sig, str) and sig.startswith("tensordesc"):
        cursor[0] += _desc_extra(sig)
    return _role(a)


def _plan(arg_names: Sequence[str], signature: Any, constants: Any, analysis: Optional[dict]) -> list:
    """One slot per parameter of a kernel (see `_slot`), conservative where the TTIR's
    arguments cannot be matched to the parameters."""
    signature = dict(signature or {})
    constants = {tuple(k) if isinstance(k, (list, tuple)) else (k,): v for k, v in dict(constants or {}).items()}
    unknown = [None if signature.get(n) == "constexpr" or (i,) in constants else CONSERVATIVE
               for i, n in enumerate(arg_names)]
    if analysis is None or not analysis.get("args"):
        return unknown
    groups: dict = {}
    for a in analysis["args"]:
        groups.setdefault(a["name"], []).append(a)
    slots: list = []
    if set(groups) <= set(arg_names):
        # every TTIR argument is named after its parameter (a tuple or descriptor has several)
        for i, n in enumerate(arg_names):
            args = groups.get(n, [])
            if n not in signature:  # no signature: the union of the parameter's arguments
                roles = [r for r in map(_role, args) if r is not None]
                slots.append((any(r[0] for r in roles), any(r[1] for r in roles)) if roles else None)
                continue
            try:
                cursor = [0]
                slot = _slot(signature[n], (i,), constants, args, cursor)
                if cursor[0] != len(args):
                    raise LookupError("more TTIR arguments than parameters")
            except LookupError:
                slot = unknown[i]
            slots.append(slot)
        return slots
    # by position: the TTIR's arguments are the parameters' leaves that are not constants
    cursor = [0]
    try:
        for i, n in enumerate(arg_names):
            slots.append(_slot(signature.get(n, ""), (i,), constants, analysis["args"], cursor))
        if cursor[0] != len(analysis["args"]):
            raise LookupError("more TTIR arguments than parameters")
    except LookupError:
        return unknown
    return slots


def _collect(arg: Any, slot: Any, out: list) -> None:
    """Append (tensor, read, write) for the tensors of one argument, given its slot."""
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return
    if _is_tensor(arg):
        role = slot if isinstance(slot, tuple) else CONSERVATIVE
        out.append((arg, role[0], role[1]))
    elif isinstance(arg, (tuple, list)):
        for j, element in enumerate(arg):
            if isinstance(slot, list):
                sub = slot[j] if j < len(slot) else CONSERVATIVE
            else:
                sub = slot if isinstance(slot, tuple) else CONSERVATIVE
            _collect(element, sub, out)
    else:
        base = _descriptor_base(arg)
        if base is not None:
            role = slot if isinstance(slot, tuple) else CONSERVATIVE
            out.append((base, role[0], role[1]))


def _apply(slots: list, args: Sequence, positions: Optional[dict] = None, kwargs: Optional[dict] = None) -> list:
    out: list = []
    n = len(slots)
    for i, arg in enumerate(args):
        t = type(arg)
        if t in _SCALAR_TYPES:
            continue
        slot = slots[i] if i < n else CONSERVATIVE
        if t in _TENSOR_TYPES and type(slot) is tuple:  # the common case, without _collect's walk
            out.append((arg, slot[0], slot[1]))
            continue
        _collect(arg, slot, out)
    for key, arg in (kwargs or {}).items():
        i = positions.get(key) if positions else None
        _collect(arg, slots[i] if i is not None and i < n else CONSERVATIVE, out)
    return out


def _fast_roles(slots: list) -> Optional[bytes]:
    """The slots of a kernel whose parameters are all single values, one byte each for the C++
    recorder's `record_triton` (0 untouched, 1 read, 2 written, 3 both; a parameter with no
    memory through it is 3, as `_apply` takes a tensor passed there), or None when a parameter
    is a tuple (`_apply` walks those)."""
    out = bytearray()
    for slot in slots:
        if slot is None:
            out.append(3)
        elif type(slot) is tuple:
            out.append((1 if slot[0] else 0) | (2 if slot[1] else 0))
        else:
            return None
    return bytes(out)


def _kernel_ttir(kernel: Any) -> Optional[str]:
    asm = getattr(kernel, "asm", None)
    if asm is None:
        return None
    try:
        text = asm.get("ttir") if hasattr(asm, "get") else asm["ttir"]
    except (KeyError, TypeError):
        return None
    return text if isinstance(text, str) else None


class _Cache:
    """Results per object, by the object's identity: held with a weak reference to it where the
    object allows one (the entry goes with the object), else with the object itself. A lookup
    is a dict read and a dereference (a launch's path looks up its kernel's plan each time)."""

    def __init__(self) -> None:
        self._by_id: dict = {}  # id(key) -> (a callable giving key, value)
        # Reentrant: a weak reference's callback (`_drop`) may run on this thread inside `put`
        # or `clear`, when what they let go of frees an object with an entry.
        self._lock = threading.RLock()

    def get(self, key: Any) -> Any:
        hit = self._by_id.get(id(key))
        return hit[1] if hit is not None and hit[0]() is key else None

    def put(self, key: Any, value: Any) -> None:
        k = id(key)
        try:
            holder = weakref.ref(key, lambda ref, k=k: self._drop(k, ref))
        except TypeError:  # not weakly referenceable: held (and kept alive) as it is
            holder = _Held(key)
        with self._lock:
            self._by_id[k] = (holder, value)

    def _drop(self, k: int, ref: Any) -> None:
        with self._lock:
            hit = self._by_id.get(k)
            if hit is not None and hit[0] is ref:  # not a newer object's, at a reused id
                del self._by_id[k]

    def items(self) -> list:
        """(key, value) of the entries whose key is alive."""
        with self._lock:
            hits = list(self._by_id.values())
        return [(k, v) for k, v in ((h(), v) for h, v in hits) if k is not None]

    def clear(self) -> None:
        with self._lock:
            self._by_id.clear()


class _Held:
    """A strong reference called like a weak one."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


_KERNEL_PLANS = _Cache()


def _kernel_plan(kernel: Any) -> tuple:
    """(slots, analysis, fast roles: see `_fast_roles`) of a CompiledKernel, computed once per
    kernel."""
    hit = _KERNEL_PLANS.get(kernel)
    if hit is not None:
        return hit
    ttir = _kernel_ttir(kernel)
    analysis = ttir_roles(ttir) if ttir is not None else None
    src = getattr(kernel, "src", None)
    fn = getattr(src, "fn", None)
    arg_names = list(getattr(fn, "arg_names", None) or [])
    if not arg_names and analysis is not None and analysis["args"] and analysis["error"] is None:
        slots = [_role(a) for a in analysis["args"]]  # compiled from IR: the TTIR's arguments
    else:
        slots = _plan(arg_names, getattr(src, "signature", None), getattr(src, "constants", None), analysis)
    hit = (slots, analysis, _fast_roles(slots))
    _KERNEL_PLANS.put(kernel, hit)
    return hit


def user_kernel_roles(compiled_kernel: Any, args: Sequence) -> list:
    """[(tensor, read, write)] for the tensors among `args`, the arguments of one launch of a
    Triton `CompiledKernel` (all the kernel's parameters in order, as `JITFunction.run` passes
    them to `launch_metadata`).

    Parameters (`compiled_kernel.src.fn.arg_names`) are matched to the TTIR's arguments by name
    (a TTIR argument's location is its parameter), else by position among the parameters that
    are not constants (`src.signature` value "constexpr", or in `src.constants`: constexprs,
    ints equal to 1, None). The tensors of a tuple argument and the `base` of a host tensor
    descriptor are paired too. A tensor whose role is not known is read and written; one the
    kernel does not touch comes with (False, False). The analysis is cached per kernel: a launch
    costs a lookup and a pass over `args`."""
    slots, _analysis, _roles = _kernel_plan(compiled_kernel)
    return _apply(slots, args)


# ------------------------------------------------------------------------------------------------
# Inductor's kernels
# ------------------------------------------------------------------------------------------------

_NAME_ROLES = (
    (re.compile(r"in_out_ptr\d*$"), (True, True)),
    (re.compile(r"in_ptr\d*$"), (True, False)),
    (re.compile(r"out_ptr\d*$"), (False, True)),
    (re.compile(r"ws_ptr\d*$"), (True, True)),  # workspace
    (re.compile(r"sem_ptr\d*$"), (True, True)),  # semaphores: counted up, then back to zero
    (re.compile(r"seed\d*$"), (True, False)),  # random seeds
    (re.compile(r"arg_\w+$"), (True, False)),  # a template's named input (mm's arg_A, arg_B)
)


def inductor_roles(arg_names: Sequence[str], mutated_arg_names: Iterable[str], custom_kernel: bool) -> list:
    """[(read, write)] for the arguments of a kernel Inductor launches (CachingAutotuner), from
    their names alone; the caller skips the arguments that are not tensors.

    Generated kernels (torch/_inductor/codegen/common.py KernelArgs): `in_ptrN` read,
    `out_ptrN` written, `in_out_ptrN` read and written, `ws_ptr` (workspace) and `sem_ptr`
    (semaphores) read and written, `seedN` read, a template's `arg_X` read, any other name read
    and written; a name in `mutated_arg_names` is written too. Custom (user) kernels compiled
    by Inductor: read and written when in `mutated_arg_names`, else read. (For a custom kernel
    Inductor lists there only what a `triton.autotune` restores, so `TritonHooks` uses the
    kernel's TTIR instead when it finds it.)"""
    mutated = set(mutated_arg_names or ())
    out = []
    for name in arg_names:
        if custom_kernel:
            out.append((True, True) if name in mutated else (True, False))
            continue
        role = CONSERVATIVE
        for pattern, r in _NAME_ROLES:
            if pattern.match(name):
                role = r
                break
        out.append((role[0], True) if name in mutated else role)
    return out


def _needs_ttir(names: Sequence[str], custom: bool) -> bool:
    """Whether names do not say what a kernel writes: a custom kernel, or a template (whose
    named inputs a template may write without Inductor listing them as mutated)."""
    return custom or any(n.startswith("arg_") for n in names)


def _triton_cache_dir(device: Any) -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        return triton_cache_dir(int(device or 0))
    except Exception:  # noqa: BLE001 - another torch, or none: Triton's own default
        d = os.environ.get("TRITON_CACHE_DIR")
        if d:
            return d
        return os.path.join(os.path.expanduser("~"), ".triton", "cache")


def _autotuner_ttirs(autotuner: Any, launcher: Any) -> list:
    """The TTIR texts of the kernel an autotuner launches: from a CompiledKernel it keeps (the
    launcher's `bin`, its compile results' kernels), else from Triton's cache directory (the
    launcher's `cache_hash` folder, which statically launched kernels have too)."""
    text = _kernel_ttir(getattr(launcher, "bin", None))
    if text is not None:
        return [text]
    texts = []
    for result in getattr(autotuner, "compile_results", None) or ():
        text = _kernel_ttir(getattr(result, "kernel", None))
        if text is not None:
            texts.append(text)
    if texts:
        return texts
    cache_hash = getattr(launcher, "cache_hash", None)
    if not cache_hash:
        return []
    meta = getattr(autotuner, "triton_meta", None) or {}
    directory = os.path.join(_triton_cache_dir(meta.get("device", 0)), str(cache_hash))
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.ttir"))):
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            continue
    return texts


def _declared_constexprs(fn: Any) -> set:
    """The names of a JITFunction's parameters declared `tl.constexpr`."""
    arg_names = list(getattr(fn, "arg_names", None) or [])
    indices = getattr(fn, "constexprs", None)
    if indices is None:
        indices = [p.num for p in getattr(fn, "params", None) or () if getattr(p, "is_constexpr", False)]
    return {arg_names[i] for i in indices if isinstance(i, int) and 0 <= i < len(arg_names)}


def _autotuner_names(autotuner: Any) -> list:
    """The names of the positional arguments of `CachingAutotuner.run`: the keys of
    `triton_meta["signature"]` but for the kernel's declared constexprs (with Triton 3.3 and
    later the signature lists those, and Inductor does not pass them; a parameter specialized
    to a constant, such as an int equal to 1, is still passed)."""
    meta = getattr(autotuner, "triton_meta", None) or {}
    sig = meta.get("signature") or {}
    fn = getattr(autotuner, "fn", None)
    names = list(sig.keys()) if hasattr(sig, "keys") else []
    if not names:
        names = list(getattr(fn, "arg_names", None) or [])
    declared = _declared_constexprs(fn)
    return [n for n in names if n not in declared]


def _autotuner_plan(autotuner: Any, launcher: Any) -> tuple:
    """(slots by position, position by name, note): the roles of an autotuner's arguments, from
    the kernel's TTIR when it is found, else from their names (`inductor_roles`); `note` says
    why some were taken as read and written."""
    names = _autotuner_names(autotuner)
    mutated = set(getattr(autotuner, "mutated_arg_names", None) or ())
    custom = bool(getattr(autotuner, "custom_kernel", False))
    by_name = inductor_roles(names, mutated, custom)
    positions = {n: i for i, n in enumerate(names)}
    texts = _autotuner_ttirs(autotuner, launcher) if launcher is not None else []
    analyses = [a for a in (ttir_roles(t) for t in texts) if a["args"]]
    if analyses:
        roles: dict = {}  # the union over the compiled configurations (one source)
        for a in analyses:
            for arg in a["args"]:
                if arg["pointer"]:
                    r = roles.get(arg["name"], (False, False))
                    roles[arg["name"]] = (r[0] or arg["read"], r[1] or arg["write"])
        slots = []
        for n, fallback in zip(names, by_name):
            role = roles.get(n)
            if role is None:  # not a pointer of the TTIR: by its name
                role = CONSERVATIVE if custom else fallback
            slots.append((role[0], True) if n in mutated else role)
        return slots, positions, None
    if custom:
        note = "its TTIR was not found: its tensors are taken as read and written"
        return [CONSERVATIVE] * len(names), positions, note
    if _needs_ttir(names, custom):
        note = "its TTIR was not found: the template's inputs are taken as read and written"
        return [CONSERVATIVE if n.startswith("arg_") else r for n, r in zip(names, by_name)], positions, note
    return by_name, positions, None


def _autotuner_name(autotuner: Any) -> str:
    meta = getattr(autotuner, "inductor_meta", None) or {}
    name = meta.get("kernel_name") if hasattr(meta, "get") else None
    if not name:
        name = getattr(getattr(autotuner, "fn", None), "__name__", None)
    return str(name or "triton_kernel")


# ------------------------------------------------------------------------------------------------
# Hooks
# ------------------------------------------------------------------------------------------------

_TLS = threading.local()  # .depth: CachingAutotuner.run calls in progress on this thread
_LOCK = threading.RLock()
# How many TritonHooks are installed (changed under _LOCK): none, and a wrapper calls its
# original and nothing else.
_INSTALLED = 0


_MISSING = object()
_DEFER = object()
_AUTOTUNER_PLANS = _Cache()


# Whether a module is importable, by (name, sys.path): TritonHooks._available.
_FOUND: dict = {}

# The C++ recorder's module where a check uses it (`use_native`): its `FastRun` wraps
# `CachingAutotuner.run` in patches made from then on, taking a tuned kernel's launches to its
# `record_triton` without a Python frame; `fast_plan_put` is told each plan seen tuned.
_NATIVE: Any = None


def use_native(ext: Any) -> None:
    """Patches of `CachingAutotuner.run` made from now on are the C++ recorder's `FastRun` (the
    module `ext`), which takes a tuned kernel's launch to `ext.record_triton` itself while one set
    of hooks listens through that entry (their `direct`), and passes every other call to the
    Python wrapper. Tuned plans already known are told to it. None: every launch through the
    Python wrapper (a FastRun in place passes each call on)."""
    global _NATIVE
    with _LOCK:
        if _NATIVE is ext:
            return
        _NATIVE = ext
        for patch in list(_PATCHES.values()):
            patch.refresh()
        for key, plan in _AUTOTUNER_PLANS.items():
            _tell_native(key, plan)


def _tell_native(autotuner: Any, plan: tuple) -> None:
    """A plan seen tuned, told to the C++ wrapper (where its launches can go straight to the
    recorder: roles known, `stream` not a kernel argument)."""
    ext = _NATIVE
    launcher, _slots, positions, name, roles, seen_tuned = plan
    if ext is None or not seen_tuned or roles is None or launcher is None or "stream" in positions:
        return
    try:
        ext.fast_plan_put(autotuner, launcher, name, roles)
    except Exception:  # noqa: BLE001 - its launches go through the Python wrapper
        pass


def _native_depth() -> int:
    """`CachingAutotuner.run` calls in progress on this thread through the C++ wrapper."""
    ext = _NATIVE
    return ext.fast_depth() if ext is not None else 0


class _Patch:
    """One method of a class, replaced by a wrapper that calls the hooks listening to it."""

    def __init__(self, owner: type, attr: str, kind: str, target: tuple = ()) -> None:
        self.owner = owner
        self.attr = attr
        self.kind = kind
        self.target = target  # the hooks' target it serves: ((module, class, method), kind)
        self.raw = owner.__dict__.get(attr, _MISSING)  # the exact attribute, to put back
        self.original = getattr(owner, attr)
        self._listeners: tuple = ()
        self.kept_by: tuple = ()  # hooks uninstalled with `keep` that will listen again
        # The C++ wrapper in front of the Python one (`use_native`), and the hooks whose
        # launches it takes while it does (they are counted as theirs: `_harvest`).
        self.fast: Any = None
        self._fast_owner: Any = None
        wrapper = _autotuner_wrapper(self) if kind == "autotuner" else _kernel_wrapper(self)
        if kind == "autotuner" and _NATIVE is not None:
            try:
                self.fast = _wraps(_NATIVE.FastRun(self.original, wrapper), self.original)
            except Exception:  # noqa: BLE001 - the Python wrapper alone
                self.fast = None
        self.wrapper = self.fast if self.fast is not None else wrapper
        setattr(owner, attr, self.wrapper)

    @property
    def listeners(self) -> tuple:
        """The hooks listening to this method's calls."""
        return self._listeners

    @listeners.setter
    def listeners(self, value: tuple) -> None:
        self._listeners = value
        self.refresh()

    def refresh(self) -> None:
        """The C++ wrapper told whether to take tuned launches: while one set of hooks listens,
        through the C++ recorder's own entry (its `direct`)."""
        fast = self.fast
        if fast is None:
            return
        self._harvest()
        ls = self._listeners
        ext = _NATIVE
        owner = ls[0] if len(ls) == 1 and ext is not None and ls[0]._direct is getattr(ext, "record_triton", None) else None
        self._fast_owner = owner
        fast.set_on(owner is not None)

    def _harvest(self) -> None:
        """The launches the C++ wrapper took, counted as its listener's."""
        n = self.fast.take() if self.fast is not None else 0
        if n and self._fast_owner is not None:
            counts = self._fast_owner._launches
            counts["inductor"] = counts.get("inductor", 0) + n

    @property
    def in_place(self) -> bool:
        """Whether the class's attribute is still this wrapper (nobody replaced it since)."""
        return self.owner.__dict__.get(self.attr) is self.wrapper

    def put_on(self, owner: type, attr: str, kind: str) -> bool:
        """Puts this patch's wrapper, put back earlier, in place again where a patch made now
        would be the same (the same method and kind, the class's attribute what it wrapped):
        see TritonHooks._attach. False, touching nothing, where it would not."""
        if (
            owner is not self.owner
            or attr != self.attr
            or kind != self.kind
            or owner.__dict__.get(attr, _MISSING) is not self.raw
            or getattr(owner, attr, None) is not self.original
        ):
            return False
        setattr(owner, attr, self.wrapper)
        return True

    def restore(self) -> bool:
        if not self.in_place:
            return False  # wrapped again by someone else since: ours stays, inert
        if self.raw is _MISSING:
            delattr(self.owner, self.attr)
        else:
            setattr(self.owner, self.attr, self.raw)
        return True


_PATCHES: dict = {}  # (id(owner), attr) -> _Patch


def _wraps(wrapper: Callable, original: Callable) -> Callable:
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    name = getattr(original, "__name__", None) or getattr(wrapper, "__name__", "wrapper")
    wrapper.__name__ = name
    wrapper.__qualname__ = getattr(original, "__qualname__", None) or getattr(wrapper, "__qualname__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper._streamsan = True  # type: ignore[attr-defined]
    return wrapper


def _autotuner_wrapper(patch: _Patch) -> Callable:
    original = patch.original

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _INSTALLED:  # between checks (kept wrappers): the original alone
            return original(self, *args, **kwargs)
        listeners = patch._listeners
        deferred = False
        if listeners and not kwargs.get("benchmark_run", False):
            # A tuned kernel's launch handed straight to the one listener's recorder (its
            # `direct`: the C++ recorder's `record_triton`), else through `_record_autotuner`.
            # Its plan (`_record_autotuner`'s) says whether a launch was seen tuned with this
            # launcher (`_tuned` stays true for a launcher once it is).
            direct = listeners[0]._direct if len(listeners) == 1 else None
            plan = _AUTOTUNER_PLANS.get(self) if direct is not None else None
            taken = False
            if plan is not None and plan[5] and plan[4] is not None:
                launchers = self.launchers
                if len(launchers) == 1 and launchers[0] is plan[0] and plan[2].keys().isdisjoint(kwargs):
                    try:
                        taken = direct(plan[3], kwargs.get("stream"), plan[4], args) >= 0
                    except Exception:  # noqa: BLE001 - the list path says what went wrong
                        taken = False
                    if taken:
                        listeners[0]._launches["inductor"] += 1
            if not taken:
                deferred = _record_autotuner(listeners, self, args, kwargs, before=True) is _DEFER
        _TLS.depth = getattr(_TLS, "depth", 0) + 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            _TLS.depth -= 1
        if deferred:
            _record_autotuner(listeners, self, args, kwargs, before=False)
        return result

    return _wraps(run, original)


def _kernel_wrapper(patch: _Patch) -> Callable:
    original = patch.original

    def launch_metadata(self: Any, grid: Any, stream: Any, *args: Any) -> Any:
        listeners = patch._listeners
        if listeners and not getattr(_TLS, "depth", 0) and not _native_depth():
            _record_kernel(listeners, self, stream, args)
        return original(self, grid, stream, *args)

    return _wraps(launch_metadata, original)


def _stream_handle(stream: Any) -> Any:
    try:
        return int(stream)
    except (TypeError, ValueError):
        return stream


def _not_taken(listeners: tuple, name: str, stream: Any, roles: bytes, args: tuple, kind: str) -> tuple:
    """Offers a launch to the listeners that record it from its arguments themselves (the C++
    recorder: `TritonHooks._launch_fast`); returns those that did not take it."""
    if len(listeners) == 1:  # the common case, without a generator
        return () if listeners[0]._launch_fast(name, stream, roles, args, kind) else listeners
    return tuple(h for h in listeners if not h._launch_fast(name, stream, roles, args, kind))


def _tuned(autotuner: Any, launcher: Any) -> bool:
    """Whether `CachingAutotuner.run` launches `launcher` (its only one, or None) without tuning
    first: it tunes while it has several configs (or none compiled yet), and, one config left,
    while coordinate descent (`coordinate_descent_tuning`, which gpt-fast turns on) or combo
    autotuning has not settled it."""
    if launcher is None:
        return False
    meta = getattr(autotuner, "inductor_meta", None) or {}
    config = getattr(launcher, "config", None)
    if meta.get("coordinate_descent_tuning") and not getattr(config, "found_by_coordesc", False):
        return False
    if meta.get("combo_tuning_groups") and not getattr(config, "found_by_combo_autotune", False):
        return False
    return True


def _record_autotuner(listeners: tuple, autotuner: Any, args: tuple, kwargs: dict, before: bool) -> Any:
    try:
        launchers = getattr(autotuner, "launchers", None) or []
        launcher = launchers[0] if len(launchers) == 1 else None
        if before and not _tuned(autotuner, launcher):
            # Not tuned yet: `run` compiles the kernel and benchmarks its configs (launches,
            # copies, a device synchronization) before it launches the best one. Recorded once
            # `run` returns, after what it did: before it, the device synchronization would
            # order the kernel before the work that follows it.
            return _DEFER
        hit = _AUTOTUNER_PLANS.get(autotuner)
        if hit is None or hit[0] is not launcher:
            slots, positions, note = _autotuner_plan(autotuner, launcher)
            hit = (launcher, slots, positions, _autotuner_name(autotuner), _fast_roles(slots), False)
            _AUTOTUNER_PLANS.put(autotuner, hit)
            if note is not None:
                for h in listeners:
                    h._error(f"Triton kernel {_autotuner_name(autotuner)}: {note}")
        if before and not hit[5] and launcher is not None:  # seen tuned: the wrapper's direct path
            hit = hit[:5] + (True,)
            _AUTOTUNER_PLANS.put(autotuner, hit)
            _tell_native(autotuner, hit)
        _launcher, slots, positions, name, roles, _seen_tuned = hit
        stream = _stream_handle(kwargs.get("stream"))
        if roles is not None and positions.keys().isdisjoint(kwargs):  # (walks the few kwargs)
            listeners = _not_taken(listeners, name, stream, roles, args, "inductor")
            if not listeners:
                return None
        named = {k: v for k, v in kwargs.items() if k in positions}
        accesses = [a for a in _apply(slots, args, positions, named) if a[1] or a[2]]
    except Exception as e:  # noqa: BLE001 - never break the program's launch
        for h in listeners:
            h._error(f"recording an Inductor Triton launch failed: {type(e).__name__}: {e}")
        return None
    for h in listeners:
        h._launch(name, stream, accesses, "inductor")
    return None


def _record_kernel(listeners: tuple, kernel: Any, stream: Any, args: tuple) -> None:
    try:
        slots, _analysis, roles = _kernel_plan(kernel)
        name = str(getattr(kernel, "name", None) or "triton_kernel")
        stream = _stream_handle(stream)
        if roles is not None:
            listeners = _not_taken(listeners, name, stream, roles, args, "triton")
            if not listeners:
                return
        accesses = [a for a in _apply(slots, args) if a[1] or a[2]]
    except Exception as e:  # noqa: BLE001 - never break the program's launch
        for h in listeners:
            h._error(f"recording a Triton launch failed: {type(e).__name__}: {e}")
        return
    for h in listeners:
        h._launch(name, stream, accesses, "triton")


class _Loader:
    """A module's loader, wrapped so that its classes are patched once it has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader  # the module keeps its own loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        _WATCHER.loaded(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)


class _Watcher(importlib.abc.MetaPathFinder):
    """Patches a class when its module is imported, for hooks installed before that."""

    def __init__(self) -> None:
        self.pending: dict = {}  # module name -> [(hooks, (target, kind))]

    def watch(self, module: str, hooks: "TritonHooks", target: tuple) -> None:
        self.pending.setdefault(module, []).append((hooks, target))
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def unwatch(self, hooks: "TritonHooks") -> None:
        for module in list(self.pending):
            left = [(h, t) for h, t in self.pending[module] if h is not hooks]
            if left:
                self.pending[module] = left
            else:
                del self.pending[module]
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.pending:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, name)
        return spec

    def loaded(self, name: str, module: Any) -> None:
        with _LOCK:
            waiting = self.pending.pop(name, [])
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)
        for hooks, target in waiting:
            hooks._attach(module, target)


_WATCHER = _Watcher()


def _imported(module_name: str, cls_name: str) -> Any:
    """The module `module_name` where it is imported and has its class `cls_name`, else None."""
    module = sys.modules.get(module_name)
    return module if module is not None and getattr(module, cls_name, None) is not None else None


class TritonHooks:
    """Records Triton kernel launches (see the module's docstring) while installed.

    `on_error(message)` hears what went wrong while recording, each distinct message once;
    nothing raised while recording reaches the program. `autotuner_target` and `kernel_target`
    are the (module, class, method) patched: by default `AUTOTUNER_TARGET` (Inductor's
    `CachingAutotuner.run`) and `KERNEL_TARGET` (Triton's `CompiledKernel.launch_metadata`);
    None leaves one out.

    `launches` counts the launches recorded by kind ({"inductor": n, "triton": m}); `errors`
    counts the errors met; `patched` names the methods patched now ("CompiledKernel.launch_metadata").
    """

    def __init__(
        self,
        on_error: Optional[Callable[[str], Any]] = None,
        *,
        autotuner_target: Optional[tuple] = AUTOTUNER_TARGET,
        kernel_target: Optional[tuple] = KERNEL_TARGET,
    ) -> None:
        self._on_error = on_error
        self._on_launch: Optional[Callable[..., Any]] = None
        self._on_launch_fast: Optional[Callable[..., Any]] = None
        self.__direct: Optional[Callable[..., int]] = None
        self._targets = [(t, "autotuner") for t in [autotuner_target] if t]
        self._targets += [(t, "kernel") for t in [kernel_target] if t]
        self._attached: list = []
        # The patches left in place, inert, by `uninstall(keep=True)`, by target: the next
        # install listens to them again without patching anything.
        self._kept: dict = {}
        self._target_of: dict = {}  # id(patch) -> the target of these hooks it serves
        # The patches these hooks last put back, by target: put in place again by the next
        # install where they still fit, rather than made anew at every check.
        self._spare: dict = {}
        self._keeping = False  # uninstalled with `keep`: still watching, patching inert
        self._installed = False
        self._found = False  # Triton was found installed (it stays so)
        self._seen_errors: set = set()
        self._launches = {"inductor": 0, "triton": 0}
        self.errors = 0

    def _harvest(self) -> None:
        """The launches the C++ wrappers took for these hooks, counted in `_launches`."""
        for patch in self._attached:
            if patch._fast_owner is self:
                patch._harvest()

    @property
    def launches(self) -> dict:
        """The launches recorded by kind ({"inductor": n, "triton": m})."""
        self._harvest()
        return self._launches

    @launches.setter
    def launches(self, value: dict) -> None:
        self._harvest()  # (what FastRun took before: counted in the old dict)
        self._launches = value

    @property
    def _direct(self) -> Optional[Callable[..., int]]:
        return self.__direct

    @_direct.setter
    def _direct(self, value: Optional[Callable[..., int]]) -> None:
        self.__direct = value
        for patch in getattr(self, "_attached", ()):
            patch.refresh()

    def renew(self, on_error: Optional[Callable[[str], Any]] = None) -> None:
        """Makes the hooks as new, `on_error` their error callback: uninstalled (where an
        earlier user left them installed), the counts and the errors heard forgotten (one set of
        hooks serves check after check; the wrappers a previous check left in place stay)."""
        with _LOCK:
            if self._installed:  # (for hooks not installed, `uninstall(keep=True)` does nothing)
                self.uninstall(keep=True)
            self._on_error = on_error
            self._seen_errors.clear()
            self.launches = {"inductor": 0, "triton": 0}
            self.errors = 0

    @property
    def installed(self) -> bool:
        return self._installed

    @property
    def patched(self) -> list:
        return [f"{p.owner.__name__}.{p.attr}" for p in self._attached]

    def install(
        self,
        on_launch: Callable[[str, Any, list, str], Any],
        on_launch_fast: Optional[Callable[[str, int, bytes, tuple], Any]] = None,
        direct: Optional[Callable[[str, Any, bytes, tuple], int]] = None,
    ) -> bool:
        """Start recording: `on_launch(name, stream, accesses, kind)` is called for each launch,
        before it is issued, with `stream` the raw CUDA stream handle (an int), `accesses` a list
        of (tensor, read, write) for the tensors the kernel reads or writes, `kind` "inductor" or
        "triton".

        `on_launch_fast(name, stream, roles, args)`, where given, is offered each launch first,
        when the kernel's parameters are single values and none is passed by name: `args` the
        launch's positional arguments, `roles` one byte per position (0 untouched, 1 read, 2
        written, 3 both; positions past its end read and written). It returns True when it
        recorded the launch (or had nothing to record), False to get it through `on_launch`.

        `direct(name, stream, roles, args)`, where given, takes an Inductor launch whose kernel
        is tuned and whose plan is known before any of that (the recorder's own entry, with
        `stream` as the launch passed it): it returns a negative number when it cannot take
        the launch (which then goes through `on_launch_fast` and `on_launch`), else it took it.
        It is used while these hooks are the only ones listening.

        Returns False, patching nothing, when Triton is not installed (the top-level package of
        the kernel target cannot be found). A class whose module is not imported yet is patched
        when it is. Installing installed hooks again only replaces the callback. Several hooks
        may be installed at once (nested checks): each hears every launch; the methods are
        patched once, and put back when the last of them is uninstalled (or left in place,
        inert, by `uninstall(keep=True)`, for the next install to listen to again)."""
        global _INSTALLED
        with _LOCK:
            if self._installed:
                self._on_launch = on_launch
                self._on_launch_fast = on_launch_fast
                self._direct = direct
                return True
            if not self._found and not self._available():
                return False
            self._found = True
            self._on_launch = on_launch
            self._on_launch_fast = on_launch_fast
            self._direct = direct
            self._installed = True
            _INSTALLED += 1
            kept, self._kept = self._kept, {}
            for patch in kept.values():  # listened to again below, or let go of
                patch.kept_by = tuple(h for h in patch.kept_by if h is not self)
            for target in self._targets:
                patch = kept.pop(target, None)
                if patch is not None and patch.in_place and _PATCHES.get((id(patch.owner), patch.attr)) is patch:
                    if self not in patch.listeners:
                        patch.listeners = patch.listeners + (self,)
                    self._attached.append(patch)
                    self._target_of[id(patch)] = target
                    continue
                (module_name, cls_name, _attr), _kind = target
                module = _imported(module_name, cls_name)
                if module is None:
                    # Watched first, then looked at again: an import racing us is seen.
                    if not self._watching(module_name, target):
                        _WATCHER.watch(module_name, self, target)
                    module = _imported(module_name, cls_name)
                    if module is None:
                        continue
                # Imported: patched now, and not watched for (a watch left from an earlier
                # install, or the one above, taken off; the import's own hook took it if it ran).
                self._attach(module, target)
                if _WATCHER.pending.get(module_name):
                    self._unwatch_one(module_name, target)
            for patch in kept.values():  # kept under no target of these hooks: not theirs to keep
                if not patch.listeners and not patch.kept_by:
                    self._put_back(patch)
            return True

    def _watching(self, module_name: str, target: tuple) -> bool:
        watched = _WATCHER.pending.get(module_name)
        return watched is not None and any(h is self and t == target for h, t in watched)

    def uninstall(self, keep: bool = False) -> None:
        """Stop recording; the original methods are put back when no other hooks listen. With
        `keep`, the wrappers stay in place instead, each calling its original and nothing else
        while no hooks listen: the next `install` of these hooks patches nothing (a check
        starts without patching and ends without restoring)."""
        global _INSTALLED
        with _LOCK:
            if not self._installed:
                if not keep:  # what an earlier `uninstall(keep=True)` left: put back
                    _WATCHER.unwatch(self)
                    kept, self._kept = self._kept, {}
                    for patch in kept.values():
                        patch.kept_by = tuple(h for h in patch.kept_by if h is not self)
                        if not patch.listeners and not patch.kept_by:
                            self._put_back(patch)
                self._keeping = keep and self._keeping
                return
            self._installed = False
            _INSTALLED -= 1
            # With `keep`, a class not imported yet stays watched: patched (inert) when it is.
            self._keeping = keep
            if not keep:
                _WATCHER.unwatch(self)
            for patch in self._attached:
                patch.listeners = tuple(h for h in patch.listeners if h is not self)
                if keep and patch.in_place:
                    # Under these hooks' own target (the patch may be another's, same method).
                    self._kept[self._target_of.get(id(patch), patch.target)] = patch
                    patch.kept_by = patch.kept_by + (self,)
                    continue
                if patch.listeners or patch.kept_by:
                    continue
                self._put_back(patch)
            self._attached = []
            self._target_of = {}
            self._on_launch = None
            self._on_launch_fast = None
            self._direct = None

    def _put_back(self, patch: _Patch) -> None:
        """The original method back in place of `patch`'s wrapper (no hooks listen to it)."""
        key = (id(patch.owner), patch.attr)
        if _PATCHES.get(key) is patch:
            del _PATCHES[key]
        if patch.restore():
            self._spare[patch.target] = patch
        else:
            self._error(f"{patch.owner.__name__}.{patch.attr} was replaced after streamsan "
                        "patched it: streamsan's wrapper stays there, recording nothing")

    def _available(self) -> bool:
        kernel = [t for t, kind in self._targets if kind == "kernel"]
        target = kernel[0] if kernel else (self._targets[0][0] if self._targets else None)
        if target is None:
            return False
        root = target[0].split(".")[0]
        if sys.modules.get(root) is not None:
            return True
        key = (root, tuple(sys.path))
        found = _FOUND.get(key)
        if found is None:  # looked for once per sys.path: a check starts without listing folders
            try:
                found = importlib.util.find_spec(root) is not None
            except (ImportError, ValueError):
                found = False
            _FOUND[key] = found
        return found

    def _unwatch_one(self, module_name: str, target: tuple) -> None:
        left = [(h, t) for h, t in _WATCHER.pending.get(module_name, []) if not (h is self and t == target)]
        if left:
            _WATCHER.pending[module_name] = left
        else:
            _WATCHER.pending.pop(module_name, None)
            if not _WATCHER.pending and _WATCHER in sys.meta_path:
                sys.meta_path.remove(_WATCHER)

    def _attach(self, module: Any, target: tuple) -> None:
        (module_name, cls_name, attr), kind = target
        with _LOCK:
            if not self._installed and not self._keeping:
                return
            owner = getattr(module, cls_name, None)
            if not isinstance(owner, type) or not callable(getattr(owner, attr, None)):
                self._error(f"{module_name}.{cls_name}.{attr} not found: those launches are not recorded")
                return
            key = (id(owner), attr)
            patch = _PATCHES.get(key)
            if patch is None or patch.owner is not owner or not patch.in_place:
                # (a wrapper replaced since stays in the chain, inert once nobody listens)
                patch = self._spare.pop(target, None)
                if patch is None or not patch.put_on(owner, attr, kind):
                    patch = _Patch(owner, attr, kind, target)
                _PATCHES[key] = patch
            if not self._installed:  # imported between checks: in place, inert, for the next
                self._kept[target] = patch
                if self not in patch.kept_by:
                    patch.kept_by = patch.kept_by + (self,)
                return
            if self not in patch.listeners:
                patch.listeners = patch.listeners + (self,)
            if patch not in self._attached:
                self._attached.append(patch)
            self._target_of[id(patch)] = target

    def _launch(self, name: str, stream: Any, accesses: list, kind: str) -> None:
        on_launch = self._on_launch
        if on_launch is None:
            return
        self._launches[kind] = self._launches.get(kind, 0) + 1
        try:
            on_launch(name, stream, accesses, kind)
        except Exception as e:  # noqa: BLE001 - the program's launch goes on regardless
            self._error(f"recording Triton kernel {name} failed: {type(e).__name__}: {e}")

    def _launch_fast(self, name: str, stream: Any, roles: bytes, args: tuple, kind: str) -> bool:
        """Offers a launch to `on_launch_fast`: True when it took it (nothing more to do)."""
        fast = self._on_launch_fast
        if fast is None or self._on_launch is None:
            return False
        try:
            taken = bool(fast(name, int(stream), roles, args))
        except Exception as e:  # noqa: BLE001 - the program's launch goes on regardless
            self._launches[kind] = self._launches.get(kind, 0) + 1
            self._error(f"recording Triton kernel {name} failed: {type(e).__name__}: {e}")
            return True
        if taken:
            self._launches[kind] = self._launches.get(kind, 0) + 1
        return taken

    def _error(self, message: str) -> None:
        self.errors += 1
        if self._on_error is None or message in self._seen_errors:
            return
        if len(self._seen_errors) < 1000:
            self._seen_errors.add(message)
        try:
            self._on_error(message)
        except Exception:  # noqa: BLE001 - a failing error callback has nowhere left to report
            pass


def _clear_caches() -> None:
    """Forget the analyses cached per kernel and per autotuner."""
    _KERNEL_PLANS.clear()
    _AUTOTUNER_PLANS.clear()
    if _NATIVE is not None:
        _NATIVE.fast_plans_clear()
