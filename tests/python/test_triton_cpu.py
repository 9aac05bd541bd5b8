"""Triton kernel launches without a GPU and without Triton (streamsan.torch._triton): the TTIR
analysis on IR that Triton 3.6 generated (tests/python/fixtures/ttir, see generate.py there),
the pairing of a launch's arguments with the kernel's TTIR arguments, Inductor's argument names,
and the hooks on stand-in CachingAutotuner / CompiledKernel classes.

Where Triton is importable, a few tests also run against it (the fixtures are regenerated and
compared; the hooks patch and restore the real classes)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
import textwrap
import threading
import types
import warnings
from types import SimpleNamespace

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "ttir")


def _load_triton_module():
    """streamsan.torch._triton as installed; from this source tree when the installed package
    predates it (the module imports nothing from streamsan, so it loads on its own)."""
    try:
        from streamsan.torch import _triton as module
    except ImportError:
        path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python", "streamsan", "torch", "_triton.py")
        spec = importlib.util.spec_from_file_location("streamsan_triton_under_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


_triton = _load_triton_module()
TritonHooks = _triton.TritonHooks
inductor_roles = _triton.inductor_roles
ttir_roles = _triton.ttir_roles
user_kernel_roles = _triton.user_kernel_roles
with open(os.path.join(FIXTURES, "cases.json")) as _f:
    CASES = json.load(_f)["cases"]
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def ttir(name: str) -> str:
    with open(os.path.join(FIXTURES, name + ".ttir")) as f:
        return f.read()


def roles(analysis: dict) -> dict:
    """{name: "R", "W", "RW" or "-"} for the pointer arguments (by SSA name when names repeat)."""
    out = {}
    for a in analysis["args"]:
        if a["pointer"]:
            key = a["name"] if a["name"] not in out else a["ssa"]
            out[key] = ("R" if a["read"] else "") + ("W" if a["write"] else "") or "-"
    return out


@pytest.fixture(autouse=True)
def _fresh_caches():
    _triton._clear_caches()
    yield
    _triton._clear_caches()


# ------------------------------------------------------------------------------------------------
# TTIR analysis on generated fixtures
# ------------------------------------------------------------------------------------------------

EXPECTED = {
    "add_kernel": {"x_ptr": "R", "y_ptr": "R", "out_ptr": "W"},
    "inplace_scale": {"x_ptr": "RW"},
    "atomic_sum": {"x_ptr": "R", "acc_ptr": "W", "unused_ptr": "-"},
    # src and dst advance through scf.for iter_args: each keeps its own role
    "loop_ptrs": {"src_ptr": "R", "dst_ptr": "W", "other_ptr": "W"},
    # the carried pointers swap every iteration: both are loaded through, neither stored to
    "loop_swap": {"a_ptr": "R", "b_ptr": "R", "out_ptr": "W"},
    "while_ptr": {"src_ptr": "R", "dst_ptr": "W"},
    "if_ptr": {"a_ptr": "W", "b_ptr": "W", "c_ptr": "R"},
    "select_store": {"a_ptr": "W", "b_ptr": "W"},
    "block_ptr_copy": {"src_ptr": "R", "dst_ptr": "W"},
    "block_ptr_loop": {"src_ptr": "R", "dst_ptr": "W"},
    "cas_lock": {"lock_ptr": "W", "data_ptr": "R", "out_ptr": "W"},
    # x written and y read inside the noinline helper (a tt.call), z read by the kernel
    "calls_helper": {"x_ptr": "W", "y_ptr": "R", "z_ptr": "R"},
    # one=1 and maybe_ptr=None are specialized away
    "specialized": {"x_ptr": "R", "out_ptr": "W"},
    "middle_constexpr": {"x_ptr": "R", "out_ptr": "W"},
    "tuple_args": {"ptrs": "R", "%ptrs_0": "W"},
    "device_desc": {"a_ptr": "R", "b_ptr": "W"},
    "host_desc": {"a_desc": "R", "b_desc": "W"},
    # conservative: x's address is stored as data / handed to inline assembly
    "pointer_escape": {"x_ptr": "RW", "table_ptr": "W"},
    "inline_asm": {"x_ptr": "RW", "y_ptr": "W"},
}
INEXACT = {"pointer_escape": ["x_ptr"], "inline_asm": ["x_ptr"]}


def test_every_fixture_has_expectations():
    assert sorted(EXPECTED) == sorted(CASES)
    assert sorted(f[:-5] for f in os.listdir(FIXTURES) if f.endswith(".ttir")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ttir_roles_of_generated_kernels(name):
    a = ttir_roles(ttir(name))
    assert a["kernel"] == name
    assert a["error"] is None
    assert roles(a) == EXPECTED[name]
    inexact = [x["name"] for x in a["args"] if not x["exact"]]
    assert inexact == INEXACT.get(name, [])
    assert a["exact"] == (name not in INEXACT)
    assert [x["index"] for x in a["args"]] == list(range(len(a["args"])))
    for x in a["args"]:  # scalars are neither read nor written
        if not x["pointer"]:
            assert not x["read"] and not x["write"]


def test_ttir_arguments_are_the_non_constant_parameters():
    a = ttir_roles(ttir("specialized"))
    assert [(x["name"], x["type"]) for x in a["args"]] == [
        ("x_ptr", "!tt.ptr<f32>"), ("out_ptr", "!tt.ptr<f32>"), ("stride", "i32")]
    assert CASES["specialized"]["signature"]["one"] == "constexpr"  # Triton's own specialization
    assert CASES["specialized"]["signature"]["maybe_ptr"] == "constexpr"
    # a host descriptor is its descriptor, then its shape and strides
    h = ttir_roles(ttir("host_desc"))
    assert [x["name"] for x in h["args"]] == ["a_desc"] * 5 + ["b_desc"] * 5
    assert [x["pointer"] for x in h["args"]] == [True, False, False, False, False] * 2
    # a tuple's elements share its name
    t = ttir_roles(ttir("tuple_args"))
    assert [(x["name"], x["ssa"]) for x in t["args"]] == [("ptrs", "%ptrs"), ("ptrs", "%ptrs_0"), ("n", "%n")]


def _no_locs(text: str) -> str:
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))
    return re.sub(r"\s*loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)", "", text)


def _numbered(text: str, names: list) -> str:
    """The IR with its arguments renamed %arg0, %arg1, … and no locations."""
    text = _no_locs(text)
    for i, n in enumerate(names):
        text = re.sub(re.escape(n) + r"(?![\w$.\-])", f"%arg{i}", text)
    return text


def test_ttir_without_locations_or_names():
    a = ttir_roles(_no_locs(ttir("add_kernel")))
    assert roles(a) == EXPECTED["add_kernel"] and a["exact"]
    b = ttir_roles(_numbered(ttir("add_kernel"), ["%x_ptr", "%y_ptr", "%out_ptr", "%n"]))
    assert [x["name"] for x in b["args"]] == ["arg0", "arg1", "arg2", "arg3"]
    assert roles(b) == {"arg0": "R", "arg1": "R", "arg2": "W"}


def test_ttir_argument_names_from_location_aliases():
    ir = textwrap.dedent("""\
        #loc = loc("k.py":1:0)
        #loc3 = loc("src"(#loc))
        #loc4 = loc("dst"(#loc))
        module {
          tt.func public @k(%arg0: !tt.ptr<f32> loc(#loc3), %arg1: !tt.ptr<f32> loc(#loc4)) {
            %0 = tt.load %arg0 : !tt.ptr<f32> loc(#loc)
            tt.store %arg1, %0 : !tt.ptr<f32> loc(#loc)
            tt.return loc(#loc)
          } loc(#loc)
        } loc(#loc)
    """)
    a = ttir_roles(ir)
    assert [(x["name"], x["ssa"]) for x in a["args"]] == [("src", "%arg0"), ("dst", "%arg1")]
    assert roles(a) == {"src": "R", "dst": "W"} and a["exact"]


HEAD = "module {\n  tt.func public @k(%p: !tt.ptr<f32>, %q: !tt.ptr<f32>, %n: i32) {\n"
TAIL = "    tt.return\n  }\n}\n"


def kernel_ir(body: str, extra: str = "") -> str:
    return HEAD + textwrap.indent(textwrap.dedent(body), "    ") + TAIL + extra


def test_ttir_block_pointers_advanced_in_a_loop():
    # before Triton rewrites them: tt.make_tensor_ptr / tt.advance carried by scf.for
    a = ttir_roles(kernel_ir("""\
        %c0 = arith.constant 0 : i32
        %c1 = arith.constant 1 : i32
        %c64 = arith.constant 64 : i64
        %s = tt.make_tensor_ptr %p, [%c64], [%c64], [%c0] {order = array<i32: 0>} : <tensor<64xf32>>
        %d = tt.make_tensor_ptr %q, [%c64], [%c64], [%c0] {order = array<i32: 0>} : <tensor<64xf32>>
        %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%a = %s, %b = %d) -> (!tt.ptr<tensor<64xf32>>, !tt.ptr<tensor<64xf32>>) : i32 {
          %v = tt.load %a {boundaryCheck = array<i32: 0>} : !tt.ptr<tensor<64xf32>>
          tt.store %b, %v : !tt.ptr<tensor<64xf32>>
          %a2 = tt.advance %a, [%c1] : <tensor<64xf32>>
          %b2 = tt.advance %b, [%c1] : <tensor<64xf32>>
          scf.yield %a2, %b2 : !tt.ptr<tensor<64xf32>>, !tt.ptr<tensor<64xf32>>
        }
    """))
    assert roles(a) == {"p": "R", "q": "W"} and a["exact"]


def test_ttir_loop_results_and_carried_swaps():
    # q reaches the store only through the loop's result after a swap inside the loop
    a = ttir_roles(kernel_ir("""\
        %c0 = arith.constant 0 : i32
        %c1 = arith.constant 1 : i32
        %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%a = %p, %b = %q) -> (!tt.ptr<f32>, !tt.ptr<f32>) : i32 {
          scf.yield %b, %a : !tt.ptr<f32>, !tt.ptr<f32>
        }
        %v = arith.constant 1.0 : f32
        tt.store %r#0, %v : !tt.ptr<f32>
    """))
    assert roles(a) == {"p": "W", "q": "W"}
    b = ttir_roles(kernel_ir("""\
        %c0 = arith.constant 0 : i32
        %c1 = arith.constant 1 : i32
        %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%a = %p, %b = %q) -> (!tt.ptr<f32>, !tt.ptr<f32>) : i32 {
          scf.yield %a, %b : !tt.ptr<f32>, !tt.ptr<f32>
        }
        %v = arith.constant 1.0 : f32
        tt.store %r#1, %v : !tt.ptr<f32>
    """))
    assert roles(b) == {"p": "-", "q": "W"}


def test_ttir_while_loop_feeds_yields_back():
    # the pointers swap in the do-region: what the before-region stores through is p, then q
    a = ttir_roles(kernel_ir("""\
        %c0 = arith.constant 0 : i32
        %v = arith.constant 1.0 : f32
        %r:2 = scf.while (%a = %p, %b = %q) : (!tt.ptr<f32>, !tt.ptr<f32>) -> (!tt.ptr<f32>, !tt.ptr<f32>) {
          tt.store %a, %v : !tt.ptr<f32>
          %t = arith.cmpi slt, %c0, %n : i32
          scf.condition(%t) %a, %b : !tt.ptr<f32>, !tt.ptr<f32>
        } do {
        ^bb0(%x: !tt.ptr<f32>, %y: !tt.ptr<f32>):
          %w = tt.load %x : !tt.ptr<f32>
          scf.yield %y, %x : !tt.ptr<f32>, !tt.ptr<f32>
        }
    """))
    assert roles(a) == {"p": "RW", "q": "RW"} and a["exact"]
    b = ttir_roles(kernel_ir("""\
        %c0 = arith.constant 0 : i32
        %v = arith.constant 1.0 : f32
        %r:2 = scf.while (%a = %p, %b = %q) : (!tt.ptr<f32>, !tt.ptr<f32>) -> (!tt.ptr<f32>, !tt.ptr<f32>) {
          %t = arith.cmpi slt, %c0, %n : i32
          scf.condition(%t) %a, %b : !tt.ptr<f32>, !tt.ptr<f32>
        } do {
        ^bb0(%x: !tt.ptr<f32>, %y: !tt.ptr<f32>):
          scf.yield %x, %y : !tt.ptr<f32>, !tt.ptr<f32>
        }
        tt.store %r#1, %v : !tt.ptr<f32>
    """))
    assert roles(b) == {"p": "-", "q": "W"}


def test_ttir_if_results_come_from_the_yields_only():
    # the condition compares p's address, yet only q is stored through
    a = ttir_roles(kernel_ir("""\
        %z = arith.constant 0 : i64
        %v = arith.constant 1.0 : f32
        %pi = tt.ptr_to_int %p : !tt.ptr<f32> -> i64
        %c = arith.cmpi eq, %pi, %z : i64
        %r = scf.if %c -> (!tt.ptr<f32>) {
          scf.yield %q : !tt.ptr<f32>
        } else {
          %q1 = tt.addptr %q, %n : !tt.ptr<f32>, i32
          scf.yield %q1 : !tt.ptr<f32>
        }
        tt.store %r, %v : !tt.ptr<f32>
    """))
    assert roles(a) == {"p": "-", "q": "W"} and a["exact"]


def test_ttir_unknown_op_is_conservative():
    a = ttir_roles(kernel_ir("""\
        %0 = tt.frobnicate %p : !tt.ptr<f32> -> i32
    """))
    assert roles(a) == {"p": "RW", "q": "-"}
    assert not a["exact"] and [x["exact"] for x in a["args"]] == [False, True, True]
    # an unknown op whose name says it loads: read only, still not exact
    b = ttir_roles(kernel_ir("""\
        %0 = tt.future_async_load %q : !tt.ptr<f32> -> f32
    """))
    assert roles(b) == {"p": "-", "q": "R"} and not b["exact"]


def test_ttir_call_of_an_unknown_function_is_conservative():
    a = ttir_roles(kernel_ir("""\
        tt.call @elsewhere(%q) : (!tt.ptr<f32>) -> ()
    """))
    assert roles(a) == {"p": "-", "q": "RW"} and not a["exact"]


def test_ttir_call_with_a_returned_pointer():
    helper = textwrap.dedent("""\
        module {
          tt.func private @pick(%a: !tt.ptr<f32>, %b: !tt.ptr<f32>) -> !tt.ptr<f32> {
            %v = tt.load %b : !tt.ptr<f32>
            tt.return %a : !tt.ptr<f32>
          }
        }
    """)
    a = ttir_roles(kernel_ir("""\
        %r = tt.call @pick(%p, %q) : (!tt.ptr<f32>, !tt.ptr<f32>) -> !tt.ptr<f32>
        %v = arith.constant 1.0 : f32
        tt.store %r, %v : !tt.ptr<f32>
    """, helper))
    # q read in the callee; the stored-through result may be either pointer passed (conservative)
    assert roles(a) == {"p": "W", "q": "RW"}


@pytest.mark.parametrize("text", [
    "",
    "this is not MLIR",
    "module {\n  tt.func public @k(%p: !tt.ptr<f32>) {\n    %0 = tt.load %p : !tt.ptr<f32>\n",  # cut
    kernel_ir("%0 = tt.load %nowhere : !tt.ptr<f32>\n"),  # an undefined value
    "module {\n  tt.func public @k(%p: !tt.ptr<f32>, ???) {\n    tt.return\n  }\n}\n",
])
def test_ttir_that_cannot_be_read(text):
    a = ttir_roles(text)
    assert not a["exact"] and a["error"]
    for x in a["args"]:  # what is known of the arguments: every pointer read and written
        assert (x["read"], x["write"], x["exact"]) == ((True, True, False) if x["pointer"] else (False, False, True))


def test_ttir_analyses_the_public_function():
    # a private function printed first is not the kernel
    text = textwrap.dedent("""\
        module {
          tt.func private @helper(%a: !tt.ptr<f32>) {
            %v = arith.constant 1.0 : f32
            tt.store %a, %v : !tt.ptr<f32>
            tt.return
          }
          tt.func public @kernel(%x: !tt.ptr<f32>) {
            %v = tt.load %x : !tt.ptr<f32>
            tt.return
          }
        }
    """)
    a = ttir_roles(text)
    assert a["kernel"] == "kernel" and roles(a) == {"x": "R"}


def test_ttir_names_a_function():
    text = ttir("calls_helper")
    helper = re.search(r'tt\.func private @"([^"]+)"', text).group(1)
    a = ttir_roles(text, name=helper)
    assert a["kernel"] == helper and roles(a) == {"p": "W", "q": "R"}


# ------------------------------------------------------------------------------------------------
# A launch's arguments
# ------------------------------------------------------------------------------------------------


class FakeTensor:
    def __init__(self, name: str) -> None:
        self.name = name

    def data_ptr(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return self.name


class FakeDescriptor:  # triton.tools.tensor_descriptor.TensorDescriptor's shape
    def __init__(self, base) -> None:
        self.base = base
        self.block_shape = [32, 32]


def _arg(desc, name):
    if isinstance(desc, dict) and "tensor" in desc:
        return FakeTensor(name)
    if isinstance(desc, dict) and "descriptor" in desc:
        return FakeDescriptor(FakeTensor(name))
    if isinstance(desc, dict) and "tuple" in desc:
        return tuple(_arg(d, f"{name}[{i}]") for i, d in enumerate(desc["tuple"]))
    return desc


def fake_kernel(name: str, text: str = None, fn=True):
    """A CompiledKernel as Triton 3.6 builds it for the fixture's launch, and that launch's args."""
    case = CASES[name]
    src = SimpleNamespace(
        fn=SimpleNamespace(arg_names=list(case["arg_names"]), __name__=name) if fn else None,
        signature=dict(case["signature"]),
        constants={tuple(k): v for k, v in case["constants"]},
    )
    kernel = SimpleNamespace(name=name, asm={"ttir": ttir(name) if text is None else text}, src=src)
    args = [_arg(d, n) for d, n in zip(case["args"], case["arg_names"])]
    return kernel, args


def named(accesses) -> dict:
    out = {}
    for t, r, w in accesses:
        out[t.name] = ("R" if r else "") + ("W" if w else "") or "-"
    return out


EXPECTED_ARGS = {
    "add_kernel": {"x_ptr": "R", "y_ptr": "R", "out_ptr": "W"},
    "atomic_sum": {"x_ptr": "R", "acc_ptr": "W", "unused_ptr": "-"},
    "specialized": {"x_ptr": "R", "out_ptr": "W"},
    "middle_constexpr": {"x_ptr": "R", "out_ptr": "W"},
    "tuple_args": {"ptrs[0]": "R", "ptrs[1]": "W"},
    "host_desc": {"a_desc": "R", "b_desc": "W"},
    "calls_helper": {"x_ptr": "W", "y_ptr": "R", "z_ptr": "R"},
    "inline_asm": {"x_ptr": "RW", "y_ptr": "W"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ARGS))
def test_user_kernel_roles_pairs_tensors_with_the_ttir(name):
    kernel, args = fake_kernel(name)
    assert named(user_kernel_roles(kernel, args)) == EXPECTED_ARGS[name]


@pytest.mark.parametrize("name", ["add_kernel", "specialized", "middle_constexpr", "tuple_args", "host_desc",
                                  "atomic_sum"])
def test_user_kernel_roles_by_position_when_the_ttir_has_no_names(name):
    text = ttir(name)
    ssa = re.search(r"tt\.func public @\w+\((.*)\) attributes", _no_locs(text)).group(1)
    names = re.findall(r"(%[\w.$\-]+):", ssa)
    kernel, args = fake_kernel(name, text=_numbered(text, names))
    assert named(user_kernel_roles(kernel, args)) == EXPECTED_ARGS[name]


def test_user_kernel_roles_with_constants_outside_the_signature():
    # older Triton and Inductor: an int equal to 1 keeps its type in the signature but is a
    # constant (src.constants), absent from the TTIR
    kernel, args = fake_kernel("specialized")
    kernel.src.signature = {**kernel.src.signature, "one": "i32"}
    assert named(user_kernel_roles(kernel, args)) == EXPECTED_ARGS["specialized"]
    text = ttir("specialized")
    kernel, args = fake_kernel("specialized", text=_numbered(text, ["%x_ptr", "%out_ptr", "%stride"]))
    kernel.src.signature = {**kernel.src.signature, "one": "i32"}
    assert named(user_kernel_roles(kernel, args)) == EXPECTED_ARGS["specialized"]


def test_user_kernel_roles_without_a_python_function():
    # a kernel compiled from IR (triton.compiler.IRSource): the TTIR's arguments in order
    kernel, args = fake_kernel("add_kernel", fn=False)
    assert named(user_kernel_roles(kernel, args[:4])) == EXPECTED_ARGS["add_kernel"]


def test_user_kernel_roles_conservative_when_unknown():
    kernel, args = fake_kernel("add_kernel")
    kernel.asm = {}  # no TTIR kept
    assert named(user_kernel_roles(kernel, args)) == {"x_ptr": "RW", "y_ptr": "RW", "out_ptr": "RW"}
    kernel, args = fake_kernel("add_kernel", text="garbage")
    assert named(user_kernel_roles(kernel, args)) == {"x_ptr": "RW", "y_ptr": "RW", "out_ptr": "RW"}
    # more arguments than parameters: the extra tensor is read and written
    kernel, args = fake_kernel("add_kernel")
    extra = FakeTensor("extra")
    assert named(user_kernel_roles(kernel, args + [extra]))["extra"] == "RW"
    # TTIR arguments that do not match the parameters
    kernel, args = fake_kernel("add_kernel", text=ttir("inplace_scale"))
    assert set(named(user_kernel_roles(kernel, args)).values()) == {"RW"}


def test_user_kernel_roles_when_the_signature_does_not_match_the_ttir():
    # the signature says one pointer where the TTIR has two arguments of that name
    kernel, args = fake_kernel("tuple_args")
    kernel.src.signature = {**kernel.src.signature, "ptrs": "*fp32"}
    assert named(user_kernel_roles(kernel, args)) == {"ptrs[0]": "RW", "ptrs[1]": "RW"}


def test_user_kernel_roles_analyses_once_per_kernel(monkeypatch):
    calls = []
    real = _triton.ttir_roles
    monkeypatch.setattr(_triton, "ttir_roles", lambda text, name=None: calls.append(1) or real(text, name))
    kernel, args = fake_kernel("add_kernel")
    for _ in range(5):
        assert named(user_kernel_roles(kernel, args)) == EXPECTED_ARGS["add_kernel"]
    assert len(calls) == 1
    other, args2 = fake_kernel("add_kernel")
    user_kernel_roles(other, args2)
    assert len(calls) == 2


# ------------------------------------------------------------------------------------------------
# Inductor's names
# ------------------------------------------------------------------------------------------------


def test_inductor_roles_of_generated_kernels():
    # as codegen/common.py KernelArgs.python_argdefs orders them: in-place buffers, inputs,
    # outputs, sizes, workspaces; then the numels and the constexpr block sizes
    names = ["in_out_ptr0", "in_ptr0", "in_ptr1", "seed2", "out_ptr0", "out_ptr1", "ks0",
             "ws_ptr", "sem_ptr", "xnumel", "r0_numel", "XBLOCK", "R0_BLOCK"]
    got = dict(zip(names, inductor_roles(names, [], custom_kernel=False)))
    assert got["in_out_ptr0"] == (True, True)
    assert got["in_ptr0"] == got["in_ptr1"] == got["seed2"] == (True, False)
    assert got["out_ptr0"] == got["out_ptr1"] == (False, True)
    assert got["ws_ptr"] == got["sem_ptr"] == (True, True)
    # mutated inputs (an index_put into an input, a zeroed workspace) are written too
    got = dict(zip(names, inductor_roles(names, ["in_ptr1", "ws_ptr"], custom_kernel=False)))
    assert got["in_ptr1"] == (True, True) and got["in_ptr0"] == (True, False)


def test_inductor_roles_of_templates_and_unknown_names():
    names = ["arg_A", "arg_B", "out_ptr0", "ks0", "something_else"]
    got = dict(zip(names, inductor_roles(names, [], custom_kernel=False)))
    assert got["arg_A"] == got["arg_B"] == (True, False)
    assert got["out_ptr0"] == (False, True)
    assert got["something_else"] == (True, True)


def test_inductor_roles_of_custom_kernels():
    names = ["x_ptr", "y_ptr", "out_ptr", "in_ptr0", "n", "BLOCK"]
    got = dict(zip(names, inductor_roles(names, ["out_ptr"], custom_kernel=True)))
    assert got["out_ptr"] == (True, True)
    # a user's names mean nothing to Inductor: "in_ptr0" of a user kernel is as any other
    assert got["x_ptr"] == got["y_ptr"] == got["in_ptr0"] == (True, False)


# ------------------------------------------------------------------------------------------------
# Hooks, on stand-in classes
# ------------------------------------------------------------------------------------------------


class Log(list):
    def launch(self, name, stream, accesses, kind):
        self.append(("record", name, stream, named(accesses), kind))


@pytest.fixture
def fakes(monkeypatch):
    """Stand-ins for triton.compiler.compiler (CompiledKernel) and Inductor's triton_heuristics
    (CachingAutotuner), registered as modules of a fake package."""
    uid = f"fake_triton_{id(monkeypatch)}"
    pkg = types.ModuleType(uid)
    pkg.__path__ = []
    compiler = types.ModuleType(uid + ".compiler")
    heuristics = types.ModuleType(uid + ".heuristics")
    events = Log()

    class CompiledKernel:
        def __init__(self, name, text, arg_names, signature, constants=None):
            self.name = name
            self.asm = {"ttir": text}
            self.src = SimpleNamespace(fn=SimpleNamespace(arg_names=arg_names), signature=signature,
                                       constants=constants or {})

        def launch_metadata(self, grid, stream, *args):
            events.append(("metadata", self.name, stream))
            return "metadata"

        def __getitem__(self, grid):  # Triton's `kernel[grid](*args, stream=…)` launch
            def runner(*args, stream=7):
                md = self.launch_metadata(grid, stream, *args)
                events.append(("launch", self.name, stream))
                return md
            return runner

    class CachingAutotuner:
        def __init__(self, fn, triton_meta, inductor_meta=None, mutated_arg_names=(), custom_kernel=False,
                     compiled=None, compile_on_run=None):
            self.fn = fn
            self.triton_meta = triton_meta
            self.inductor_meta = inductor_meta or {}
            self.mutated_arg_names = list(mutated_arg_names)
            self.custom_kernel = custom_kernel
            self.compile_results = [SimpleNamespace(kernel=compiled)] if compiled is not None else []
            self.launchers = [SimpleNamespace(cache_hash="h0")] if compiled is not None else []
            self._compile_on_run = compile_on_run
            self.during_run = None  # called inside run, as autotuning would be

        def run(self, *args, stream, benchmark_run=False, **kwargs):
            if self.during_run is not None:
                self.during_run()
            if not self.launchers and self._compile_on_run is not None:
                self.compile_results = [SimpleNamespace(kernel=self._compile_on_run)]
                self.launchers = [SimpleNamespace(cache_hash="h0")]
            kernel = self.compile_results[0].kernel if self.compile_results else None
            if kernel is not None:  # Inductor's launcher, with a launch_enter_hook set
                kernel.launch_metadata((1, 1, 1), stream, *args)
            events.append(("launch", self.inductor_meta.get("kernel_name"), stream))
            return "ran"

    compiler.CompiledKernel = CompiledKernel
    heuristics.CachingAutotuner = CachingAutotuner
    for m in (pkg, compiler, heuristics):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    ns = SimpleNamespace(
        events=events, CompiledKernel=CompiledKernel, CachingAutotuner=CachingAutotuner,
        kernel_target=(compiler.__name__, "CompiledKernel", "launch_metadata"),
        autotuner_target=(heuristics.__name__, "CachingAutotuner", "run"),
    )
    ns.hooks = lambda on_error=None: TritonHooks(on_error, autotuner_target=ns.autotuner_target,
                                                 kernel_target=ns.kernel_target)
    yield ns
    _triton._WATCHER.pending.clear()
    if _triton._WATCHER in sys.meta_path:
        sys.meta_path.remove(_triton._WATCHER)


def user_kernel(fakes, name="add_kernel"):
    case = CASES[name]
    return fakes.CompiledKernel(name, ttir(name), case["arg_names"], case["signature"],
                                {tuple(k): v for k, v in case["constants"]})


def generated_autotuner(fakes, **kw):
    signature = {"in_ptr0": "*fp32", "in_out_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32",
                 "XBLOCK": "constexpr"}
    fn = SimpleNamespace(__name__="triton_poi_fn", arg_names=list(signature), constexprs=[4])
    return fakes.CachingAutotuner(fn,
                                  {"signature": signature, "device": 0},
                                  {"kernel_name": "triton_poi_fused_add_0"}, **kw)


def test_hooks_record_a_triton_launch_before_it_is_issued(fakes):
    errors = []
    hooks = fakes.hooks(errors.append)
    assert hooks.install(fakes.events.launch) is True
    assert hooks.patched == ["CachingAutotuner.run", "CompiledKernel.launch_metadata"]
    k = user_kernel(fakes)
    x, y, out = FakeTensor("x"), FakeTensor("y"), FakeTensor("out")
    assert k[(4,)](x, y, out, 1000, 1024, stream=123) == "metadata"
    assert fakes.events == [
        ("record", "add_kernel", 123, {"x": "R", "y": "R", "out": "W"}, "triton"),
        ("metadata", "add_kernel", 123),
        ("launch", "add_kernel", 123),
    ]
    assert hooks.launches == {"inductor": 0, "triton": 1}
    hooks.uninstall()
    assert errors == []


def test_the_plan_cache_holds_an_entry_as_long_as_its_object():
    """Plans are kept per object, by identity: an entry goes with its object (a new object at the
    same address finds none), and an object without weak references is held by its entry."""
    import gc

    cache = _triton._Cache()

    class Kernel:
        pass

    k = Kernel()
    cache.put(k, "plan")
    assert cache.get(k) == "plan" and cache.get(Kernel()) is None
    addr = id(k)
    del k
    gc.collect()
    assert addr not in cache._by_id
    slots = (1, 2)  # a tuple takes no weak reference: held
    cache.put(slots, "held")
    assert cache.get(slots) == "held" and cache.get((1, 2, 3)) is None
    cache.clear()
    assert cache.get(slots) is None


def test_a_tuned_inductor_launch_goes_straight_to_the_direct_entry(fakes):
    """Once an autotuner's launch has been recorded tuned, its next launches with the same
    launcher go to the one listener's `direct` entry with the kernel's name, the stream as
    passed, its role bytes and the launch's own arguments; a launch it cannot take (a negative
    answer), a new launcher, or a second listener takes the usual path."""
    direct_calls, fast_calls = [], []
    answer = [1]

    def direct(name, stream, roles, args):
        direct_calls.append((name, stream, roles, args))
        return answer[0]

    def fast(name, stream, roles, args):
        fast_calls.append(name)
        return True

    hooks = fakes.hooks()
    assert hooks.install(fakes.events.launch, fast, direct)
    at = generated_autotuner(fakes)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    a, b, c = FakeTensor("a"), FakeTensor("b"), FakeTensor("c")
    at.run(a, b, c, 1000, stream=2)  # the first: through _record_autotuner (the plan is made)
    assert fast_calls == ["triton_poi_fused_add_0"] and direct_calls == []
    at.run(a, b, c, 1000, stream=3)
    assert [(n, st, r[:3], args) for n, st, r, args in direct_calls] == [
        ("triton_poi_fused_add_0", 3, bytes([1, 3, 2]), (a, b, c, 1000))]  # in, in_out, out
    assert len(fast_calls) == 1 and hooks.launches == {"inductor": 2, "triton": 0}
    answer[0] = -1  # not taken: the fast path records it
    at.run(a, b, c, 1000, stream=4)
    assert len(direct_calls) == 2 and len(fast_calls) == 2 and hooks.launches["inductor"] == 3
    answer[0] = 1
    at.launchers = [SimpleNamespace(cache_hash="h1")]  # tuned again: a new plan first
    at.run(a, b, c, 1000, stream=5)
    assert len(direct_calls) == 2 and len(fast_calls) == 3
    at.run(a, b, c, 1000, stream=6)
    assert len(direct_calls) == 3
    other = fakes.hooks()
    assert other.install(lambda *x: None)  # two listeners: no direct entry
    at.run(a, b, c, 1000, stream=7)
    assert len(direct_calls) == 3 and len(fast_calls) == 4
    other.uninstall()
    at.run(a, b, c, 1000, stream=8)
    assert len(direct_calls) == 4
    hooks.uninstall(keep=True)  # stopped: the wrapper calls nothing
    at.run(a, b, c, 1000, stream=9)
    assert len(direct_calls) == 4 and len(fast_calls) == 4
    assert [e[2] for e in fakes.events if e[0] == "launch"] == [2, 3, 4, 5, 6, 7, 8, 9]
    hooks.uninstall()


def test_hooks_leave_out_untouched_tensors(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    k = user_kernel(fakes, "atomic_sum")
    k[(1,)](FakeTensor("x"), FakeTensor("acc"), FakeTensor("unused"), 1000, 1024, stream=5)
    assert fakes.events[0] == ("record", "atomic_sum", 5, {"x": "R", "acc": "W"}, "triton")
    hooks.uninstall()


def test_hooks_record_an_inductor_launch_once(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    # the compiled kernel Inductor launches also passes through launch_metadata: not recorded
    inner = fakes.CompiledKernel("triton_poi_fn", "garbage", ["in_ptr0", "in_out_ptr0", "out_ptr0", "xnumel"], {})
    at = generated_autotuner(fakes, compiled=inner)
    a, b, c = FakeTensor("a"), FakeTensor("b"), FakeTensor("c")
    assert at.run(a, b, c, 100, stream=99) == "ran"
    assert fakes.events == [
        ("record", "triton_poi_fused_add_0", 99, {"a": "R", "b": "RW", "c": "W"}, "inductor"),
        ("metadata", "triton_poi_fn", 99),
        ("launch", "triton_poi_fused_add_0", 99),
    ]
    assert hooks.launches == {"inductor": 1, "triton": 0}
    hooks.uninstall()


def test_a_first_run_that_benchmarks_its_configs_is_recorded_after_them(fakes):
    """Inductor's first `run` of a kernel with several configs benchmarks them, which ends with
    `torch.cuda.synchronize()`, then launches the best one: the launch is recorded after the
    synchronization (recorded before, it would look ordered before whatever comes next, and a
    side stream reading its output without a wait would not be reported); once the kernel has
    its config, each launch is recorded before it is issued."""
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    inner = fakes.CompiledKernel("triton_poi_fn", "garbage", ["in_ptr0", "in_out_ptr0", "out_ptr0", "xnumel"], {})
    at = generated_autotuner(fakes, compile_on_run=inner)
    at.during_run = lambda: fakes.events.append(("synchronize",))  # the benchmark's end
    a, b, c = FakeTensor("a"), FakeTensor("b"), FakeTensor("c")
    at.run(a, b, c, 100, stream=4)
    assert [e[0] for e in fakes.events] == ["synchronize", "metadata", "launch", "record"]
    assert fakes.events[-1] == ("record", "triton_poi_fused_add_0", 4, {"a": "R", "b": "RW", "c": "W"}, "inductor")
    del fakes.events[:]
    at.during_run = None
    at.run(a, b, c, 100, stream=4)
    assert [e[0] for e in fakes.events] == ["record", "metadata", "launch"]
    assert hooks.launches == {"inductor": 2, "triton": 0}
    hooks.uninstall()


def test_a_run_that_coordinate_descent_still_tunes_is_recorded_after_it(fakes):
    """With `coordinate_descent_tuning` (gpt-fast turns it on), `run` tunes its one config by
    benchmarks before the launch until the config is marked `found_by_coordesc`: recorded when
    `run` returns until then, before the launch afterwards."""
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    inner = fakes.CompiledKernel("triton_poi_fn", "garbage", ["in_ptr0", "in_out_ptr0", "out_ptr0", "xnumel"], {})
    at = generated_autotuner(fakes, compiled=inner)
    at.inductor_meta["coordinate_descent_tuning"] = True
    at.launchers = [SimpleNamespace(cache_hash="h0", config=SimpleNamespace(found_by_coordesc=False))]
    a, b, c = FakeTensor("a"), FakeTensor("b"), FakeTensor("c")
    at.run(a, b, c, 100, stream=4)
    assert [e[0] for e in fakes.events] == ["metadata", "launch", "record"]
    del fakes.events[:]
    at.launchers = [SimpleNamespace(cache_hash="h0", config=SimpleNamespace(found_by_coordesc=True))]
    at.run(a, b, c, 100, stream=4)
    assert [e[0] for e in fakes.events] == ["record", "metadata", "launch"]
    hooks.uninstall()


def test_hooks_skip_benchmark_runs(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    at = generated_autotuner(fakes, compiled=user_kernel(fakes))
    at.run(FakeTensor("a"), FakeTensor("b"), FakeTensor("c"), 100, stream=1, benchmark_run=True)
    assert [e[0] for e in fakes.events] == ["metadata", "launch"]
    assert hooks.launches == {"inductor": 0, "triton": 0}
    hooks.uninstall()


def test_hooks_use_inductor_names_and_mutations(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    at = generated_autotuner(fakes, mutated_arg_names=["in_ptr0"])  # not compiled yet: names are enough
    at.run(FakeTensor("a"), FakeTensor("b"), FakeTensor("c"), 100, stream=3)
    # (no config yet: recorded when run returns)
    assert fakes.events[1] == ("record", "triton_poi_fused_add_0", 3, {"a": "RW", "b": "RW", "c": "W"}, "inductor")
    # no kernel_name: the function's name
    at = generated_autotuner(fakes)
    at.inductor_meta = {}
    at.run(FakeTensor("a"), FakeTensor("b"), FakeTensor("c"), 100, stream=3)
    assert fakes.events[-1][1] == "triton_poi_fn"
    hooks.uninstall()


TEMPLATE_IR = textwrap.dedent("""\
    module {
      tt.func public @triton_tem_fused_0(%arg_Q: !tt.ptr<f32> loc("arg_Q"), %arg_LSE: !tt.ptr<f32> loc("arg_LSE"), %out_ptr0: !tt.ptr<f32> loc("out_ptr0"), %ks0: i32 loc("ks0")) {
        %v = tt.load %arg_Q : !tt.ptr<f32>
        tt.store %arg_LSE, %v : !tt.ptr<f32>
        tt.store %out_ptr0, %v : !tt.ptr<f32>
        tt.return
      }
    }
""")


def test_hooks_use_the_ttir_of_templates(fakes, tmp_path, monkeypatch):
    # a template may write a named input (flex attention's logsumexp) that Inductor does not
    # list as mutated: its TTIR says so, its name does not
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    errors = []
    hooks = fakes.hooks(errors.append)
    hooks.install(fakes.events.launch)
    signature = {"arg_Q": "*fp32", "arg_LSE": "*fp32", "out_ptr0": "*fp32", "ks0": "i32", "BLOCK_M": "constexpr"}
    fn = SimpleNamespace(__name__="triton_tem_fused_0", arg_names=list(signature), constexprs=[4])
    at = fakes.CachingAutotuner(fn, {"signature": signature, "device": 0}, {"kernel_name": "triton_tem_fused_0"})
    at.launchers = [SimpleNamespace(cache_hash="tem")]
    (tmp_path / "tem").mkdir()
    (tmp_path / "tem" / "triton_tem_fused_0.ttir").write_text(TEMPLATE_IR)
    at.run(FakeTensor("q"), FakeTensor("lse"), FakeTensor("out"), 64, stream=6)
    assert fakes.events[0] == ("record", "triton_tem_fused_0", 6, {"q": "R", "lse": "W", "out": "W"}, "inductor")
    # without its TTIR: the named inputs are read and written, and the check says so
    at2 = fakes.CachingAutotuner(fn, {"signature": signature, "device": 0}, {"kernel_name": "triton_tem_fused_1"})
    at2.launchers = [SimpleNamespace(cache_hash="elsewhere")]
    at2.run(FakeTensor("q"), FakeTensor("lse"), FakeTensor("out"), 64, stream=6)
    assert fakes.events[-2] == ("record", "triton_tem_fused_1", 6, {"q": "RW", "lse": "RW", "out": "W"}, "inductor")
    assert errors == ["Triton kernel triton_tem_fused_1: its TTIR was not found: the template's inputs are "
                      "taken as read and written"]
    hooks.uninstall()


def custom_autotuner(fakes, name, **kw):
    """A user kernel as Inductor compiles it: `fn` its JITFunction, the signature Triton 3.6's."""
    case = CASES[name]
    fn = SimpleNamespace(__name__=name, arg_names=case["arg_names"], constexprs=case["constexprs"])
    return fakes.CachingAutotuner(fn, {"signature": dict(case["signature"]), "device": 0},
                                  {"kernel_name": name + "_0"}, custom_kernel=True, **kw)


def run_args(name):
    """A custom kernel's arguments as Inductor passes them to run: no declared constexprs, -1
    for None (torch/_inductor/ir.py UserDefinedTritonKernel.codegen)."""
    case = CASES[name]
    out = []
    for i, (desc, n) in enumerate(zip(case["args"], case["arg_names"])):
        if i not in case["constexprs"]:
            out.append(-1 if desc is None else _arg(desc, n))
    return out


@pytest.mark.parametrize("name", ["specialized", "middle_constexpr", "add_kernel"])
def test_hooks_pair_inductor_arguments_around_constexprs(fakes, name):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    at = custom_autotuner(fakes, name, compiled=user_kernel(fakes, name))
    at.run(*run_args(name), stream=4)
    assert fakes.events[0] == ("record", name + "_0", 4, EXPECTED_ARGS[name], "inductor")
    hooks.uninstall()


def test_hooks_use_the_ttir_of_custom_kernels(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    # Inductor lists none of them as mutated; the TTIR says acc is written, unused untouched
    at = custom_autotuner(fakes, "atomic_sum", compiled=user_kernel(fakes, "atomic_sum"))
    at.run(FakeTensor("x"), FakeTensor("acc"), FakeTensor("unused"), 1000, stream=8)
    assert fakes.events[0] == ("record", "atomic_sum_0", 8, {"x": "R", "acc": "W"}, "inductor")
    hooks.uninstall()


def test_hooks_record_a_first_run_once_compiled(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    at = custom_autotuner(fakes, "atomic_sum", compile_on_run=user_kernel(fakes, "atomic_sum"))
    at.run(FakeTensor("x"), FakeTensor("acc"), FakeTensor("unused"), 1000, stream=8)
    assert [e[0] for e in fakes.events] == ["metadata", "launch", "record"]  # compiled by run: after
    assert fakes.events[2] == ("record", "atomic_sum_0", 8, {"x": "R", "acc": "W"}, "inductor")
    at.run(FakeTensor("x"), FakeTensor("acc"), FakeTensor("unused"), 1000, stream=8)
    assert [e[0] for e in fakes.events[3:]] == ["record", "metadata", "launch"]  # then before
    hooks.uninstall()


def test_hooks_read_the_ttir_from_tritons_cache(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "h0").mkdir()
    (tmp_path / "h0" / "atomic_sum.ttir").write_text(ttir("atomic_sum"))
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    at = custom_autotuner(fakes, "atomic_sum")
    at.launchers = [SimpleNamespace(cache_hash="h0")]  # launched statically: no CompiledKernel kept
    at.run(FakeTensor("x"), FakeTensor("acc"), FakeTensor("unused"), 1000, stream=8)
    assert fakes.events[0] == ("record", "atomic_sum_0", 8, {"x": "R", "acc": "W"}, "inductor")
    hooks.uninstall()


def test_hooks_without_the_ttir_of_a_custom_kernel(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    errors = []
    hooks = fakes.hooks(errors.append)
    hooks.install(fakes.events.launch)
    at = custom_autotuner(fakes, "atomic_sum")
    at.launchers = [SimpleNamespace(cache_hash="missing")]
    for _ in range(3):
        at.run(FakeTensor("x"), FakeTensor("acc"), FakeTensor("unused"), 1000, stream=8)
    assert fakes.events[0][3] == {"x": "RW", "acc": "RW", "unused": "RW"}
    assert len(errors) == 1 and "atomic_sum_0" in errors[0] and "TTIR" in errors[0]
    hooks.uninstall()


def test_hooks_never_break_the_launch(fakes):
    errors = []
    hooks = fakes.hooks(errors.append)

    def failing(name, stream, accesses, kind):
        raise ValueError("callback broke")

    hooks.install(failing)
    k = user_kernel(fakes)
    for _ in range(3):
        assert k[(1,)](FakeTensor("x"), FakeTensor("y"), FakeTensor("o"), 10, 1024, stream=1) == "metadata"
    assert errors == ["recording Triton kernel add_kernel failed: ValueError: callback broke"]  # once
    assert hooks.errors == 3

    class Exploding:  # an analysis that fails
        @property
        def asm(self):
            raise RuntimeError("no asm here")

    bad = user_kernel(fakes)
    bad.__class__ = type("Bad", (fakes.CompiledKernel, Exploding), {})
    assert bad[(1,)](FakeTensor("x"), stream=1) == "metadata"
    assert any("RuntimeError: no asm here" in e for e in errors)

    class BadMeta(dict):  # Inductor's attributes not as expected
        def get(self, key, default=None):
            raise KeyError(key)

    at = generated_autotuner(fakes)
    at.triton_meta = BadMeta(signature={})
    n = len(errors)
    assert at.run(FakeTensor("a"), stream=None) == "ran"
    assert len(errors) == n + 1 and "KeyError" in errors[-1]
    assert fakes.events[-1][0] == "launch"

    def failing_error(message):
        raise RuntimeError("and the error callback too")

    hooks2 = fakes.hooks(failing_error)
    hooks.uninstall()
    hooks2.install(failing)
    assert k[(1,)](FakeTensor("x"), stream=1) == "metadata"
    hooks2.uninstall()


def test_uninstall_restores_the_exact_originals(fakes):
    run = fakes.CachingAutotuner.__dict__["run"]
    md = fakes.CompiledKernel.__dict__["launch_metadata"]
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    assert fakes.CachingAutotuner.__dict__["run"] is not run
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is not md
    assert fakes.CompiledKernel.launch_metadata.__wrapped__ is md
    hooks.uninstall()
    assert fakes.CachingAutotuner.__dict__["run"] is run
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is md
    assert hooks.patched == [] and not hooks.installed
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=1)
    assert [e[0] for e in fakes.events] == ["metadata", "launch"]  # nothing recorded
    hooks.uninstall()  # a second uninstall does nothing


def test_a_wrapper_put_back_is_put_on_again_by_the_next_install(fakes):
    """A plain `uninstall()` puts the originals back; the next install puts the same wrappers on
    again rather than make new ones, unless the class's method was replaced in between (then the
    new one is wrapped, and is what the next uninstall leaves)."""
    md = fakes.CompiledKernel.__dict__["launch_metadata"]
    hooks = fakes.hooks()
    assert hooks.install(fakes.events.launch)
    first = fakes.CompiledKernel.__dict__["launch_metadata"]
    hooks.uninstall()
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is md
    assert hooks.install(fakes.events.launch)
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is first
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=3)
    assert [e[0] for e in fakes.events] == ["record", "metadata", "launch"]
    hooks.uninstall()
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is md

    theirs = _replace_launch_metadata(fakes, md)
    assert hooks.install(fakes.events.launch)
    now = fakes.CompiledKernel.__dict__["launch_metadata"]
    assert now is not first and now.__wrapped__ is theirs
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=4)
    assert [e[0] for e in fakes.events][3:] == ["record", "metadata", "launch"]
    hooks.uninstall()
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is theirs


def _replace_launch_metadata(fakes, inner):
    """The program's own `CompiledKernel.launch_metadata`, calling `inner`, put in place of
    whatever is there; returned."""

    def theirs(self, grid, stream, *args):
        return inner(self, grid, stream, *args)

    fakes.CompiledKernel.launch_metadata = theirs
    return theirs


def test_an_inherited_method_is_restored_by_removal(fakes, monkeypatch):
    class Sub(fakes.CompiledKernel):
        pass

    mod = types.ModuleType("fake_sub_mod")
    mod.Sub = Sub
    monkeypatch.setitem(sys.modules, "fake_sub_mod", mod)
    hooks = TritonHooks(autotuner_target=None, kernel_target=("fake_sub_mod", "Sub", "launch_metadata"))
    assert hooks.install(fakes.events.launch)
    assert "launch_metadata" in Sub.__dict__
    hooks.uninstall()
    assert "launch_metadata" not in Sub.__dict__


def test_nested_hooks_share_one_patch(fakes):
    run = fakes.CachingAutotuner.__dict__["run"]
    outer, inner = Log(), Log()
    h1, h2 = fakes.hooks(), fakes.hooks()
    assert h1.install(outer.launch) and h2.install(inner.launch)
    assert h1.install(outer.launch)  # installing again: still one listener
    patched = fakes.CachingAutotuner.__dict__["run"]
    assert patched.__wrapped__ is run  # not wrapped twice
    at = generated_autotuner(fakes)
    at.run(FakeTensor("a"), FakeTensor("b"), FakeTensor("c"), 1, stream=2)
    assert len(outer) == 1 and len(inner) == 1
    h2.uninstall()
    assert fakes.CachingAutotuner.__dict__["run"] is patched  # h1 still listens
    at.run(FakeTensor("a"), FakeTensor("b"), FakeTensor("c"), 1, stream=2)
    assert len(outer) == 2 and len(inner) == 1
    h1.uninstall()
    assert fakes.CachingAutotuner.__dict__["run"] is run


def test_a_wrapper_installed_over_ours_is_left_alone(fakes):
    errors = []
    hooks = fakes.hooks(errors.append)
    hooks.install(fakes.events.launch)
    ours = fakes.CompiledKernel.__dict__["launch_metadata"]

    def theirs(self, grid, stream, *args):
        return ours(self, grid, stream, *args)

    fakes.CompiledKernel.launch_metadata = theirs
    hooks.uninstall()
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is theirs
    assert any("launch_metadata" in e for e in errors)
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=1)
    assert [e[0] for e in fakes.events] == ["metadata", "launch"]  # ours is inert


def test_launches_on_another_thread_during_a_run_are_recorded(fakes):
    hooks = fakes.hooks()
    hooks.install(fakes.events.launch)
    k = user_kernel(fakes)
    at = generated_autotuner(fakes)
    seen_here = []

    def launch_elsewhere():
        # on this thread, inside run: not recorded (Inductor's own launches, benchmarks)
        seen_here.append(k.launch_metadata((1,), 5, FakeTensor("x"), FakeTensor("y"), FakeTensor("o"), 1, 64))
        t = threading.Thread(target=lambda: k[(1,)](FakeTensor("x"), FakeTensor("y"), FakeTensor("o"), 1, 64,
                                                    stream=77))
        t.start()
        t.join()

    at.during_run = launch_elsewhere
    at.run(FakeTensor("a"), FakeTensor("b"), FakeTensor("c"), 1, stream=2)
    records = [(e[2], e[4]) for e in fakes.events if e[0] == "record"]
    # (the autotuner has no config yet: its launch is recorded when run returns)
    assert records == [(77, "triton"), (2, "inductor")]
    assert seen_here == ["metadata"]
    assert hooks.launches == {"inductor": 1, "triton": 1}
    hooks.uninstall()


def test_install_without_triton_patches_nothing(monkeypatch):
    meta_path = list(sys.meta_path)
    hooks = TritonHooks(kernel_target=("streamsan_no_such_package.compiler", "CompiledKernel", "launch_metadata"),
                        autotuner_target=("streamsan_no_such_package.h", "CachingAutotuner", "run"))
    assert hooks.install(lambda *a: None) is False
    assert hooks.patched == [] and not hooks.installed and sys.meta_path == meta_path
    hooks.uninstall()
    if not HAVE_TRITON:  # the default targets: Triton is not installed here
        assert TritonHooks().install(lambda *a: None) is False
        assert sys.meta_path == meta_path


def _lazy_package(tmp_path, monkeypatch, name: str) -> TritonHooks:
    """A package `name` with a `compiler.CompiledKernel`, importable and not imported yet, and
    hooks whose kernel target is its class."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "compiler.py").write_text(textwrap.dedent("""\
        class CompiledKernel:
            def launch_metadata(self, grid, stream, *args):
                return ("original", stream)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in (name, name + ".compiler"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return TritonHooks(autotuner_target=None, kernel_target=(name + ".compiler", "CompiledKernel", "launch_metadata"))


def test_classes_are_patched_when_their_module_is_imported(tmp_path, monkeypatch):
    hooks = _lazy_package(tmp_path, monkeypatch, "streamsan_lazy_pkg")
    log = Log()
    assert hooks.install(log.launch)
    assert hooks.patched == [] and _triton._WATCHER in sys.meta_path
    mod = importlib.import_module("streamsan_lazy_pkg.compiler")
    assert hooks.patched == ["CompiledKernel.launch_metadata"]
    assert _triton._WATCHER not in sys.meta_path
    assert not isinstance(mod.__loader__, _triton._Loader)  # the module keeps its own loader
    assert not isinstance(mod.__spec__.loader, _triton._Loader)
    k = mod.CompiledKernel()
    k.name = "lazy"
    k.asm = {"ttir": ttir("add_kernel")}
    k.src = SimpleNamespace(fn=SimpleNamespace(arg_names=CASES["add_kernel"]["arg_names"]),
                            signature=CASES["add_kernel"]["signature"], constants={(4,): 1024})
    assert k.launch_metadata((1,), 5, FakeTensor("x"), FakeTensor("y"), FakeTensor("o"), 3, 1024) == ("original", 5)
    assert log == [("record", "lazy", 5, {"x": "R", "y": "R", "o": "W"}, "triton")]
    hooks.uninstall()
    assert "launch_metadata" in mod.CompiledKernel.__dict__
    assert mod.CompiledKernel.launch_metadata.__name__ == "launch_metadata"
    assert not hasattr(mod.CompiledKernel.launch_metadata, "_streamsan")  # the original, back


def test_a_class_imported_between_checks_is_patched_inert_then_listened_to(tmp_path, monkeypatch):
    """Hooks stopped with `keep` (between two checks) still watch a module not imported yet:
    imported then, its class gets the wrapper, recording nothing until the next install."""
    hooks = _lazy_package(tmp_path, monkeypatch, "streamsan_later_pkg")
    log = Log()
    assert hooks.install(log.launch)
    hooks.uninstall(keep=True)
    assert _triton._WATCHER in sys.meta_path
    mod = importlib.import_module("streamsan_later_pkg.compiler")
    assert _triton._WATCHER not in sys.meta_path
    wrapper = mod.CompiledKernel.__dict__["launch_metadata"]
    assert wrapper.__name__ == "launch_metadata" and hooks.patched == []
    k = mod.CompiledKernel()
    k.name = "later"
    k.asm = {"ttir": ttir("add_kernel")}
    k.src = SimpleNamespace(fn=SimpleNamespace(arg_names=CASES["add_kernel"]["arg_names"]),
                            signature=CASES["add_kernel"]["signature"], constants={(4,): 1024})
    args = (FakeTensor("x"), FakeTensor("y"), FakeTensor("o"), 3, 1024)
    assert k.launch_metadata((1,), 5, *args) == ("original", 5)
    assert log == []  # between checks: nothing recorded
    assert hooks.install(log.launch)
    assert mod.CompiledKernel.__dict__["launch_metadata"] is wrapper
    assert k.launch_metadata((1,), 6, *args) == ("original", 6)
    assert log == [("record", "later", 6, {"x": "R", "y": "R", "o": "W"}, "triton")]
    hooks.uninstall()
    assert mod.CompiledKernel.__dict__["launch_metadata"].__name__ == "launch_metadata"
    assert mod.CompiledKernel.__dict__["launch_metadata"] is not wrapper
    assert not hasattr(mod.CompiledKernel.launch_metadata, "_streamsan")


def test_uninstall_before_the_import_stops_watching(tmp_path, monkeypatch):
    hooks = TritonHooks(autotuner_target=None, kernel_target=("streamsan_never_imported.x", "C", "m"))
    monkeypatch.setitem(sys.modules, "streamsan_never_imported", types.ModuleType("streamsan_never_imported"))
    assert hooks.install(lambda *a: None)
    assert _triton._WATCHER in sys.meta_path
    hooks.uninstall()
    assert _triton._WATCHER not in sys.meta_path and not _triton._WATCHER.pending



def test_renewed_hooks_are_uninstalled_and_forget_their_counts_and_errors(monkeypatch):
    """One set of hooks serves check after check: `renew` stops what an earlier user left
    installed (its watch of a module not imported yet stays, as `uninstall(keep=True)` leaves
    it), and the next user hears each error once again, with its own callback."""
    hooks = TritonHooks(autotuner_target=None, kernel_target=("streamsan_never_imported.y", "C", "m"))
    monkeypatch.setitem(sys.modules, "streamsan_never_imported", types.ModuleType("streamsan_never_imported"))
    first: list = []
    hooks.renew(on_error=first.append)
    assert hooks.install(lambda *a: None)
    hooks._error("boom")
    hooks._error("boom")
    hooks.launches["triton"] = 3
    assert first == ["boom"] and hooks.errors == 2
    second: list = []
    hooks.renew(on_error=second.append)  # still installed: stopped first
    assert not hooks.installed and _triton._WATCHER in sys.meta_path
    assert hooks.errors == 0 and hooks.launches == {"inductor": 0, "triton": 0}
    assert hooks.install(lambda *a: None)
    assert len(_triton._WATCHER.pending["streamsan_never_imported.y"]) == 1  # watched once
    hooks._error("boom")
    hooks.uninstall()
    assert first == ["boom"] and second == ["boom"]
    assert _triton._WATCHER not in sys.meta_path and not _triton._WATCHER.pending


def test_kept_wrappers_stay_inert_and_are_listened_to_again(fakes):
    """`uninstall(keep=True)` (a check's end) leaves the wrappers in place, doing nothing but
    call their originals; the next install listens to the same wrappers (no patching), and a
    plain `uninstall()` puts the exact originals back."""
    run = fakes.CachingAutotuner.__dict__["run"]
    md = fakes.CompiledKernel.__dict__["launch_metadata"]
    hooks = fakes.hooks()
    assert hooks.install(fakes.events.launch)
    wrapped = (fakes.CachingAutotuner.__dict__["run"], fakes.CompiledKernel.__dict__["launch_metadata"])
    hooks.uninstall(keep=True)
    assert not hooks.installed and hooks.patched == []
    assert (fakes.CachingAutotuner.__dict__["run"], fakes.CompiledKernel.__dict__["launch_metadata"]) == wrapped
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=1)
    assert [e[0] for e in fakes.events] == ["metadata", "launch"]  # inert: nothing recorded
    assert hooks.install(fakes.events.launch)
    assert (fakes.CachingAutotuner.__dict__["run"], fakes.CompiledKernel.__dict__["launch_metadata"]) == wrapped
    assert hooks.patched == ["CachingAutotuner.run", "CompiledKernel.launch_metadata"]
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=3)
    assert [e[0] for e in fakes.events][2:] == ["record", "metadata", "launch"]
    hooks.uninstall(keep=True)
    hooks.uninstall()  # not installed: what was kept is put back
    assert fakes.CachingAutotuner.__dict__["run"] is run
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is md


@pytest.mark.skipif(not HAVE_TRITON, reason="needs Triton installed")
def test_a_check_puts_tritons_method_back_unless_told_to_keep_it(monkeypatch):
    """A check's end puts Triton's `launch_metadata` back (a program may go on unchecked); where
    every check of the process keeps them (`_KEEP_WRAPPERS`: `pytest --streamsan`), the next
    check finds its wrapper in place, and `release_triton_hooks` puts the original back."""
    torch = pytest.importorskip("torch")
    import streamsan.torch
    from streamsan.torch import _recorder
    from triton.compiler.compiler import CompiledKernel

    _recorder.release_triton_hooks()
    original = CompiledKernel.__dict__["launch_metadata"]

    def check(expect_patched):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with streamsan.torch.Run(raise_on_hazard=False, backend="python", _fake_device=True):
                assert (CompiledKernel.__dict__["launch_metadata"] is not original) == expect_patched
                torch.ones(4).add_(1)

    check(True)
    assert CompiledKernel.__dict__["launch_metadata"] is original
    monkeypatch.setattr(_recorder, "_KEEP_WRAPPERS", True)
    check(True)
    kept = CompiledKernel.__dict__["launch_metadata"]
    assert kept is not original and getattr(kept, "_streamsan", False)
    check(True)
    assert CompiledKernel.__dict__["launch_metadata"] is kept
    _recorder.release_triton_hooks()
    assert CompiledKernel.__dict__["launch_metadata"] is original


def test_a_kept_wrapper_outlives_other_hooks(fakes):
    """Other hooks installed and uninstalled between two checks listen to the kept wrapper and
    leave it in place for the hooks that kept it."""
    run = fakes.CachingAutotuner.__dict__["run"]
    kept, other = fakes.hooks(), fakes.hooks()
    assert kept.install(fakes.events.launch)
    kept.uninstall(keep=True)
    wrapper = fakes.CompiledKernel.__dict__["launch_metadata"]
    log = Log()
    assert other.install(log.launch)
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is wrapper
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=1)
    assert [e[0] for e in log] == ["record"] and [e[0] for e in fakes.events] == ["metadata", "launch"]
    other.uninstall()
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is wrapper
    assert kept.install(fakes.events.launch)
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=2)
    assert [e[0] for e in fakes.events][2:] == ["record", "metadata", "launch"] and len(log) == 1
    kept.uninstall()
    assert fakes.CachingAutotuner.__dict__["run"] is run
    assert "streamsan" not in repr(fakes.CompiledKernel.__dict__["launch_metadata"].__code__.co_filename)


def test_hooks_of_other_targets_for_one_method_keep_and_put_back_alike(tmp_path, monkeypatch):
    """Two hooks naming one class's method by different module paths (a re-export) share its
    wrapper; each keeps it under its own target, listens to it again, and the last plain
    uninstall puts the original back."""
    pkg = tmp_path / "streamsan_reexport"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .sub import C\n")
    (pkg / "sub.py").write_text("class C:\n    def m(self, grid, stream, *args):\n        return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("streamsan_reexport", "streamsan_reexport.sub"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    mod = importlib.import_module("streamsan_reexport")
    original = mod.C.__dict__["m"]
    h1 = TritonHooks(autotuner_target=None, kernel_target=("streamsan_reexport.sub", "C", "m"))
    h2 = TritonHooks(autotuner_target=None, kernel_target=("streamsan_reexport", "C", "m"))
    for _ in range(2):  # kept between the rounds
        assert h1.install(lambda *a: None) and h2.install(lambda *a: None)
        assert h1.patched == h2.patched == ["C.m"]
        h1.uninstall(keep=True)
        h2.uninstall(keep=True)
        assert mod.C.__dict__["m"] is not original
    assert h1.install(lambda *a: None) and h2.install(lambda *a: None)
    h1.uninstall()
    h2.uninstall()
    assert mod.C.__dict__["m"] is original


def test_a_kept_wrapper_replaced_since_is_patched_anew(fakes):
    """A wrapper kept by `uninstall(keep=True)` that someone replaced before the next install
    is not listened to again: the class is patched anew, over theirs."""
    hooks = fakes.hooks()
    assert hooks.install(fakes.events.launch)
    hooks.uninstall(keep=True)
    ours = fakes.CompiledKernel.__dict__["launch_metadata"]

    theirs = _replace_launch_metadata(fakes, ours)
    assert hooks.install(fakes.events.launch)
    now = fakes.CompiledKernel.__dict__["launch_metadata"]
    assert now is not theirs and now.__wrapped__ is theirs
    user_kernel(fakes)[(1,)](FakeTensor("x"), stream=3)
    assert [e[0] for e in fakes.events].count("record") == 1  # recorded once, by the new wrapper
    hooks.uninstall()
    assert fakes.CompiledKernel.__dict__["launch_metadata"] is theirs

# ------------------------------------------------------------------------------------------------
# With Triton installed (PYTHONPATH=/path/to/triton): the real classes, the real compiler
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed")
def test_real_triton_classes_are_patched_and_restored():
    from triton.compiler.compiler import CompiledKernel

    original = CompiledKernel.__dict__["launch_metadata"]
    log = Log()
    hooks = TritonHooks()
    assert hooks.install(log.launch)
    assert "CompiledKernel.launch_metadata" in hooks.patched
    # a CompiledKernel as Triton makes one, without loading it on a GPU
    k = CompiledKernel.__new__(CompiledKernel)
    k.name = "add_kernel"
    k.asm = {"ttir": ttir("add_kernel")}
    k.src = SimpleNamespace(fn=SimpleNamespace(arg_names=CASES["add_kernel"]["arg_names"], launch_metadata=None),
                            signature=CASES["add_kernel"]["signature"], constants={(4,): 1024})
    import triton.knobs as knobs

    if knobs.runtime.launch_enter_hook is None:  # the original returns at once then
        assert k.launch_metadata((1, 1, 1), 11, FakeTensor("x"), FakeTensor("y"), FakeTensor("o"), 3, 1024) is None
        assert log == [("record", "add_kernel", 11, {"x": "R", "y": "R", "o": "W"}, "triton")]
    hooks.uninstall()
    assert CompiledKernel.__dict__["launch_metadata"] is original
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except Exception:  # noqa: BLE001 - no torch, or an Inductor that cannot import here
        return
    run = CachingAutotuner.__dict__["run"]
    hooks = TritonHooks()
    assert hooks.install(log.launch)
    assert "CachingAutotuner.run" in hooks.patched
    assert CachingAutotuner.__dict__["run"] is not run
    hooks.uninstall()
    assert CachingAutotuner.__dict__["run"] is run


@pytest.mark.skipif(not HAVE_TRITON, reason="Triton is not installed")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixtures_match_this_triton(name):
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("streamsan_ttir_generate", os.path.join(FIXTURES, "generate.py"))
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    target = GPUTarget("cuda", 90, 32)
    fn, make_args, kwargs = next(c for c in generate.CASES if c[0].__name__ == name)
    text, info = generate.compile_ttir(fn, make_args(), kwargs, target, CUDABackend(target))
    assert roles(ttir_roles(text)) == EXPECTED[name]
    assert json.loads(json.dumps(info["signature"])) == CASES[name]["signature"]
