"""The real-code suite in compiled code: `torch.compile` (Inductor's Triton kernels, the default
mode and `mode="reduce-overhead"`'s CUDA graph trees) and user Triton kernels (`@triton.jit`
launched eagerly, and a `torch.library.triton_op`), in the conventions of realcode.py (read its
docstring: `fn(fixed, widen) -> bool`, `# RACE` lines, `widen`, `_gen()`, "needs X").
Those whose check runs the eager model (or function) again return it as a `Later`: it runs after
the program, outside the check and the clock, so that a compiled program's check and cost are the
compiled program's, not its eager reference's. A check against a reference computed on the host
(`torch.tanh(host)`) is still part of its program.

- `COMPILED_BUGS`: planted synchronization bugs in compiled code, each with a buggy and a fixed
  variant; the docstring says where `widen` spins and what is reported where.
- `COMPILED_CLEAN`: compiled variants of realcode.py's programs (and gpt-fast's decode loop);
  each checks that its results are right (the eager model's, or the host's data).
- `COMPILED_CAPTURES`: those that capture CUDA graphs (cudagraph trees).

realcode.programs(suite="compiled") (or "all") selects them; realcode_report.py and
gpu_realcode.sh run them with REALCODE_SET=compiled|all.

Where a racing access of compiled code is reported. A recorder that records Triton launches sees
Inductor's kernels (and the aten ops the generated code calls) at the user's line that called the
compiled function: that line is marked `# RACE` where the racing access is the compiled code's.
The Python recorder, and CSAN, run compiled functions eagerly (Dynamo leaves a frame uncompiled
while a TorchDispatchMode is active, even one it compiled before), so there the access is an
eager op in the compiled function's body: that line is marked too (the helper named in
`fn.race_helpers`). Every `# RACE` line of a program is in this file.

Compilation. Each compiled function is made once per process (`_cached`) and compiled at its
first call, whichever run that is (under a check or not): runners warm up before timing, and
gpu_realcode.sh runs every program of the suite once first (`realcode_report.py warm`) to fill
Inductor's and Triton's on-disk caches for the processes after it. Shapes never change between
runs (no recompilation).

CUDA graph trees (`mode="reduce-overhead"`). A check records a replay only when it recorded its
capture (a graph captured before the check began is not known to it). Cudagraph trees capture a
function again when the address of one of its static inputs (parameters, buffers) changed; the
programs here give the static inputs new storage at the start of every run (`_new_storage`: the
old storage is kept alive, so no earlier run's address comes back), so every run captures its
graphs (inside the run, a check's or not) and then replays them. The first call of a function
in the process is cudagraph trees' warm-up (the compiled kernels run, on a private stream), the
next its capture. The collector is paused around captures (realcode's `_gc_paused`).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from realcode import (
    SLEEP,
    Later,
    TinyGPT,
    TinyLlama,
    _all_close,
    _close,
    _finite,
    _gc_paused,
    _gen,
    _get_batch,
    _mlp,
    _need,
    _race_helpers,
    _tokens,
    compiled_llm_decode,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # the programs that need it raise RuntimeError("needs triton (…)")
    triton = tl = None

wrap_triton = getattr(torch.library, "wrap_triton", None)  # torch >= 2.6 (with triton_op)

N = 1 << 20  # floats per tensor of the stream programs (4 MiB: a block of its own in the allocator)
GPTFAST_PROMPT = 4  # tokens of the gpt-fast decode loop's prompt
GPTFAST_TOKENS = 64  # tokens it generates


# ----------------------------------------------------------------------------------------------
# Helpers

_CACHE: dict = {}  # key -> what `build()` made, once per process
_KEPT: list = []  # storages `_new_storage` replaced, kept alive (see the module docstring)
_OPS: dict = {}  # name -> torch.library's CustomOpDef (kept: dropping it unregisters the op)


def _cached(key: str, build):
    """`build()`'s result, made once per process."""
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def _need_compile() -> None:
    """Raises RuntimeError("needs …") unless torch.compile can make Triton kernels here."""
    if not hasattr(torch, "compile"):
        raise RuntimeError("needs torch.compile")
    _need("triton")


def _need_triton() -> None:
    _need("triton")
    if triton is None:
        raise RuntimeError("needs triton (it did not import with this module)")


def _compiled_fn(key: str, fn, **options):
    """`torch.compile(fn, **options)`, made once per process under `key`."""
    return _cached(key, lambda: torch.compile(fn, **options))


def _new_storage(tensors) -> None:
    """Gives each tensor (a parameter or buffer: a static input of cudagraph trees) new storage
    holding the same values, the old storage kept alive so that its address is not handed out
    again: the compiled function's next call captures its graph again, in this run."""
    with torch.no_grad():
        for t in tensors:
            _KEPT.append(t.data)
            t.data = t.data.clone()


def _grid(n: int, block: int = 1024) -> tuple:
    return ((n + block - 1) // block,)


if triton is not None:

    @triton.jit
    def _axpb_kernel(x_ptr, out_ptr, a, b, n, BLOCK: tl.constexpr):
        # out = a * x + b over n floats
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x * a + b, mask=mask)


def _axpb_impl(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """realcode_compiled::axpb's implementation: `a * x + b` by `_axpb_kernel`, through
    `torch.library.wrap_triton` (Inductor compiles the kernel into a graph that calls the op)."""
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(_axpb_kernel)[_grid(n)](x, out, a, b, n, BLOCK=1024)
    return out


def _axpb_op():
    """`torch.ops.realcode_compiled.axpb(x, a, b)`: a `torch.library.triton_op` over `_axpb_kernel`
    (registered once per process), or RuntimeError("needs …")."""
    _need_triton()
    if "axpb" not in _OPS:
        if not hasattr(torch.library, "triton_op") or wrap_triton is None:
            raise RuntimeError("needs torch.library.triton_op and wrap_triton (torch >= 2.6)")
        try:
            _OPS["axpb"] = torch.ops.realcode_compiled.axpb  # registered by another copy of this module
        except (AttributeError, RuntimeError):
            _OPS["axpb"] = torch.library.triton_op("realcode_compiled::axpb", _axpb_impl, mutates_args=())
    return torch.ops.realcode_compiled.axpb


# ----------------------------------------------------------------------------------------------
# Compiled functions and models


def _norm_gelu(x, w, b):
    """GELU(LayerNorm(x)) over the last dimension: one Inductor kernel. Eager (the Python
    recorder), its first line reads `x`."""
    return F.gelu(F.layer_norm(x, x.shape[-1:], w, b))  # RACE


def _swiglu(a, b):
    """SwiGLU's gate, `silu(a) * b`: one Inductor kernel."""
    return F.silu(a) * b


def _tanh_affine(x):
    """`0.5 * tanh(x) + 1`: one Inductor kernel."""
    return torch.tanh(x) * 0.5 + 1.0


def _axpb_relu(x, w):
    """`relu(2 x + 1) * w`, the affine map by the triton_op realcode_compiled::axpb (Inductor
    launches the user kernel from its generated code), the rest one Inductor kernel."""
    y = torch.ops.realcode_compiled.axpb(x, 2.0, 1.0)
    return torch.relu(y) * w


def _attention(q, k, v, w):
    """Causal SDPA (bf16: the flash kernel), its output and the fp32 loss `sum(out * w)`."""
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out, (out.float() * w).sum()


class GPTFastLlama(TinyLlama):
    """realcode.TinyLlama as gpt-fast's `Transformer`: `model(tok [1, 1], pos [1])` is the next
    token's logits, the keys and values kept in static caches (buffers) written at `pos`. The
    forward is TinyLlama's; its lines that read the step's inputs are marked `# RACE` (the eager
    reads of the planted bug of `gptfast_next_input_on_side_stream`, under the Python recorder)."""

    def forward(self, tok, pos):
        x = self.emb(tok)  # RACE
        cos, sin = self.cos[pos], self.sin[pos]  # RACE
        mask = self.causal[pos].view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.head(self.norm(x))[:, -1]


def decode_one_token(model, tok, pos):
    """gpt-fast's `decode_one_token`, greedy: the logits of the next token and its choice."""
    logits = model(tok, pos)
    return logits, torch.argmax(logits, dim=-1, keepdim=True)


def _gptfast():
    """(GPTFastLlama, `torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)`),
    made once per process."""

    def build():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = GPTFastLlama(max_seq=GPTFAST_PROMPT + GPTFAST_TOKENS).eval()
        return model, torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)

    return _cached("gptfast", build)


def _gptfast_decode(prompt: torch.Tensor, side, fixed: bool, widen: bool):
    """gpt-fast's generate loop: the prompt fed one token at a time, then GPTFAST_TOKENS greedy
    tokens, each step the compiled `decode_one_token` (CUDA graph trees). Without `side`, as
    gpt-fast writes it: the next input is the new token, `pos += 1`, on the default stream. With
    `side`, the next step's inputs (a token buffer and the position) are written on that stream
    after it waited for the step; the default stream waits for it before the next step only when
    `fixed`. Widened (with `side`): the side stream spins before writing the inputs of the first
    three steps. Returns (the logits of every step [steps, 1, V], the token each step was meant
    to be fed)."""
    model, step = _gptfast()
    _new_storage([b for layer in model.layers for b in (layer.k_cache, layer.v_cache)])
    model.reset()
    main = torch.cuda.current_stream()
    tok = prompt[0].view(1, 1).clone()
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    logits, inputs = [], [tok.clone()]
    with _gc_paused(), torch.no_grad():  # cudagraph trees capture in these calls
        for i in range(GPTFAST_PROMPT - 1 + GPTFAST_TOKENS):
            torch.compiler.cudagraph_mark_step_begin()
            out, nxt = step(model, tok, pos)  # RACE
            logits.append(out.clone())  # a graph's outputs are overwritten by its next replay
            nxt = (prompt[i + 1].view(1, 1) if i + 1 < GPTFAST_PROMPT else nxt).clone()
            inputs.append(nxt)
            if side is None:
                tok = nxt
                pos += 1
                continue
            side.wait_stream(main)
            with torch.cuda.stream(side):
                if widen and i < 3:
                    torch.cuda._sleep(SLEEP)
                tok.copy_(nxt)
                pos.add_(1)
            if fixed:
                main.wait_stream(side)
        if side is not None:
            main.wait_stream(side)
    return torch.stack(logits), inputs[:-1]


def _gptfast_eager(inputs) -> torch.Tensor:
    """The eager model's logits when fed `inputs` at positions 0, 1, …"""
    model, _ = _gptfast()
    model.reset()
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    out = []
    with torch.no_grad():
        for t in inputs:
            out.append(decode_one_token(model, t, pos)[0])
            pos += 1
    return torch.stack(out)


def _prompt(g: torch.Generator) -> torch.Tensor:
    return torch.randint(3, 256, (GPTFAST_PROMPT,), generator=g).cuda()


# ----------------------------------------------------------------------------------------------
# COMPILED_BUGS: planted bugs in compiled code, each in a buggy and a fixed variant


@_race_helpers(_norm_gelu)
def compiled_reads_side_stream_tensor(fixed: bool, widen: bool) -> bool | Later:
    """Bug: a batch of uint8 rows is normalized on a side stream (a preprocessing stream that
    waited for the batch's copy) and fed to a compiled function (`torch.compile`, default mode:
    LayerNorm + GELU in one Triton kernel) on the default stream, which does not wait for the
    side stream: the kernel may read the batch before it is written. Fix:
    `torch.cuda.current_stream().wait_stream(side)` before the call. Widened: the side stream
    spins before normalizing. Reported: data-race at the call (Inductor's kernel, at the line that
    called the compiled function) or, eagerly (Python recorder), at `_norm_gelu`'s read of `x`."""
    _need_compile()
    f = _compiled_fn("norm_gelu", _norm_gelu)
    g = _gen()
    rows, dim = N // 1024, 1024
    raw = torch.randint(0, 256, (rows, dim), dtype=torch.uint8, generator=g).cuda()
    w = torch.randn(dim, generator=g).cuda()
    b = torch.randn(dim, generator=g).cuda()
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        x = raw.float().div_(255).sub_(0.5)
    if fixed:
        main.wait_stream(side)
    y = f(x, w, b)  # RACE
    main.wait_stream(side)
    torch.cuda.synchronize()
    return Later(lambda: _close(y, _norm_gelu(x, w, b), 1e-4))  # eager, after the run: the right batch


def side_stream_reads_compiled_output(fixed: bool, widen: bool) -> bool:
    """Bug: the output of a compiled function (SwiGLU's gate, default mode: one Triton kernel)
    is offloaded to pinned host memory (activation offloading) by a `non_blocking` copy on a side
    stream that does not wait for the default stream, where the kernel writes it: the copy may
    read it before it is written. Fix: `side.wait_stream(torch.cuda.current_stream())` before the
    copy. Widened: the default stream spins before the call. Reported: data-race at the copy."""
    _need_compile()
    f = _compiled_fn("swiglu", _swiglu)
    g = _gen()
    a = torch.randn(N, generator=g).cuda()
    b = torch.randn(N, generator=g).cuda()
    host = torch.empty(N, pin_memory=True)
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    if widen:
        torch.cuda._sleep(SLEEP)
    y = f(a, b)
    if fixed:
        side.wait_stream(main)
    with torch.cuda.stream(side):
        host.copy_(y, non_blocking=True)  # RACE
    side.synchronize()
    ok = torch.equal(host, y.cpu())
    torch.cuda.synchronize()
    return ok


def triton_kernel_output_read_without_wait(fixed: bool, widen: bool) -> bool:
    """Bug: a user Triton kernel (`@triton.jit`, launched eagerly `kernel[grid](…)`) writes
    `2 x + 1` into a buffer on a side stream; the default stream reads the buffer without waiting
    for it. Fix: an event recorded on the side stream after the kernel, waited for by the default
    stream. Widened: the side stream (the writer's) spins before the kernel. Reported: data-race
    at the default stream's read (the kernel's write is seen by a recorder that records Triton
    launches; CSAN does not)."""
    _need_triton()
    g = _gen()
    host = torch.randn(N, generator=g)
    x = host.cuda()
    out = torch.zeros(N, device="cuda")
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    done = torch.cuda.Event()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        _axpb_kernel[_grid(N)](x, out, 2.0, 1.0, N, BLOCK=1024)
        done.record()
    if fixed:
        main.wait_event(done)
    y = out * 0.5 - 0.5  # RACE
    main.wait_stream(side)
    ok = _close(y.cpu(), host, 1e-5)
    torch.cuda.synchronize()
    return ok


def compiled_kernel_input_freed_without_record_stream(fixed: bool, widen: bool) -> bool:
    """Bug: a tensor of the default stream is the input of a compiled function (`0.5 tanh(x) + 1`,
    default mode: one Triton kernel) called on a side stream, then freed without `record_stream`:
    the allocator hands its memory to the next allocation of its size on the default stream,
    which writes it while the side stream's kernel may still read it. Fix:
    `t.record_stream(side)` before the free. Widened: the side stream spins before the call, so
    the kernel reads the memory after it was overwritten. Reported: unsafe-free at the free (`del
    t`) and reuse-race at the new tensor's write (both lines `# RACE`)."""
    _need_compile()
    f = _compiled_fn("tanh_affine", _tanh_affine)
    g = _gen()
    host = torch.randn(N, generator=g)
    t = host.cuda()
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        y = f(t)
    if fixed:
        t.record_stream(side)
    # expected here (buggy): unsafe-free, t freed while the side stream's kernel may read it
    del t  # RACE
    # expected here (buggy): reuse-race, t's memory written on the default stream
    z = torch.full((N,), 7.0, device="cuda")  # RACE
    main.wait_stream(side)
    got = y.cpu()
    torch.cuda.synchronize()
    del z
    return _close(got, torch.tanh(host) * 0.5 + 1.0, 1e-5)


def _ro_mlp():
    """(an MLP 64-256-256-64 in eval mode, its `torch.compile(mode="reduce-overhead")`), made once
    per process."""

    def build():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = _mlp(64, 256, 64).eval()
        return model, torch.compile(model, mode="reduce-overhead")

    return _cached("ro-mlp", build)


def reduce_overhead_weights_overwritten_during_replay(fixed: bool, widen: bool) -> bool | Later:
    """Bug: an MLP compiled with `mode="reduce-overhead"` (CUDA graph trees) serves 4 batches
    while new weights arrive after each (an RL weight sync onto an inference copy, an EMA loaded
    for evaluation): `torch._foreach_copy_` copies them into its parameters, the graph's static
    inputs, which its replay reads in place, on a side stream that does not wait for the replay:
    the copy may overwrite the weights the replay is still reading. Fix:
    `side.wait_stream(torch.cuda.current_stream())` before the copy (in both, the default stream
    waits for the copy before the next batch). Widened: the default stream spins before each batch
    but the first (replays of this run's capture), so the replay runs after the copy. Reported:
    data-race at the copy. Right when each batch's output is the eager MLP's with the weights it
    was meant to see."""
    _need_compile()
    model, served = _ro_mlp()
    params = list(model.parameters())
    _new_storage(params)  # this run captures its graph (module docstring)
    g = _gen()
    steps = 4
    loads = [[torch.randn(p.shape, generator=g).mul_(0.1).cuda() for p in params] for _ in range(steps + 1)]
    xs = [torch.randn(32, 64, generator=g).cuda() for _ in range(steps)]
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    outs = []
    with torch.no_grad():
        torch._foreach_copy_(params, loads[0])
        torch.cuda.synchronize()
        with _gc_paused():  # cudagraph trees capture in these calls
            for i, x in enumerate(xs):
                if widen and i > 0:
                    torch.cuda._sleep(SLEEP)
                torch.compiler.cudagraph_mark_step_begin()
                outs.append(served(x).clone())
                if fixed:
                    side.wait_stream(main)
                with torch.cuda.stream(side):
                    torch._foreach_copy_(params, loads[i + 1])  # RACE
                main.wait_stream(side)
    torch.cuda.synchronize()

    def right() -> bool:
        with torch.no_grad():
            want = []
            for w, x in zip(loads, xs):
                torch._foreach_copy_(params, w)
                want.append(model(x))
        return _all_close(outs, want, 1e-4)

    return Later(right)  # the eager MLP's outputs, after the run


@_race_helpers(_gptfast_decode, GPTFastLlama)
def gptfast_next_input_on_side_stream(fixed: bool, widen: bool) -> bool | Later:
    """Bug: gpt-fast's decode loop (`decode_one_token` compiled with `mode="reduce-overhead",
    fullgraph=True`, 64 tokens; see `gptfast_decode`) with the next step's inputs, a token
    buffer and the position, written on a side stream (after it waited for the step), and the
    next step not waiting for the side stream: it may read the previous token and position.
    Fix: `torch.cuda.current_stream().wait_stream(side)` before each step. Widened: the side
    stream spins before writing the inputs of the first three steps. Reported: data-race at the
    compiled call (cudagraph trees copy the inputs into the graph's, an aten op at that line) or,
    eagerly (Python recorder), at the model's reads of the token and the position. Right when
    every step's logits are the eager model's on the inputs it was meant to get."""
    _need_compile()
    g = _gen()
    got, inputs = _gptfast_decode(_prompt(g), torch.cuda.Stream(), fixed, widen)
    torch.cuda.synchronize()
    return Later(lambda: _close(got, _gptfast_eager(inputs), 1e-3))  # the eager model's, after the run


COMPILED_BUGS = {
    "compiled function fed a side-stream batch without wait": compiled_reads_side_stream_tensor,
    "side stream offloads a compiled output without wait": side_stream_reads_compiled_output,
    "user Triton kernel output read without wait": triton_kernel_output_read_without_wait,
    "input of a compiled kernel on a side stream freed without record_stream":
        compiled_kernel_input_freed_without_record_stream,
    "reduce-overhead weights overwritten on a side stream during a replay":
        reduce_overhead_weights_overwritten_during_replay,
    "gpt-fast decode with its next input written on a side stream": gptfast_next_input_on_side_stream,
}


# ----------------------------------------------------------------------------------------------
# COMPILED_CLEAN: correct compiled programs


def _resnet():
    """(ResNet-18, its torch.compile, an eager copy, the initial state), made once per process."""
    tv = _need("torchvision")

    def build():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = tv.models.resnet18(num_classes=10)
        return model, torch.compile(model), copy.deepcopy(model), copy.deepcopy(model.state_dict())

    return _cached("resnet18", build)


def compiled_resnet_training(fixed: bool, widen: bool) -> bool | Later:
    """torchvision ResNet-18 (random weights, 10 classes) compiled (`torch.compile(model)`, default
    mode: Inductor's Triton kernels around cuDNN's convolutions, forward and backward) trained 3
    SGD steps (momentum, weight decay) on one 8x3x64x64 batch, from the same weights every run;
    right when the losses are finite and the first is the eager model's (within 1e-2: cuDNN's
    TF32 convolutions in another layout)."""
    _need_compile()
    model, compiled, ref, init = _resnet()
    model.load_state_dict(init)
    ref.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    g = _gen()
    x = torch.randn(8, 3, 64, 64, generator=g).cuda()
    y = torch.randint(0, 10, (8,), generator=g).cuda()
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    def right() -> bool:
        with torch.no_grad():  # the eager copy keeps the initial weights
            first = F.cross_entropy(ref(x), y)
        return _finite(losses) and _close(losses[0], first, 1e-2)

    return Later(right)


def compiled_vit_inference(fixed: bool, widen: bool) -> bool | Later:
    """timm ViT-Tiny/16 (random weights, img_size 64, 10 classes) compiled (default mode),
    inference on 2 batches of 4x3x64x64; right when the logits are the eager model's (1e-3)."""
    timm = _need("timm")
    _need_compile()

    def build():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=64)
        model.eval()
        return model, torch.compile(model)

    model, compiled = _cached("vit", build)
    g = _gen()
    xs = [torch.randn(4, 3, 64, 64, generator=g).cuda() for _ in range(2)]
    with torch.no_grad():
        got = [compiled(x) for x in xs]

    def right() -> bool:
        with torch.no_grad():
            return _all_close(got, [model(x) for x in xs], 1e-3)

    return Later(right)


def compiled_sdpa(fixed: bool, widen: bool) -> bool | Later:
    """A compiled function (default mode) of causal `F.scaled_dot_product_attention` in bf16
    (2x4x128x64: the flash kernel) and an fp32 weighted sum of its output (a Triton kernel),
    forward and backward; right when output and gradients match the math backend in fp32 (3e-2,
    as realcode's SDPA program)."""
    _need_compile()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    f = _compiled_fn("attention", _attention)
    g = _gen()
    q, k, v = (torch.randn(2, 4, 128, 64, generator=g).cuda().to(torch.bfloat16).requires_grad_() for _ in range(3))
    w = torch.randn(2, 4, 128, 64, generator=g).cuda()
    out, loss = f(q, k, v, w)
    loss.backward()

    def right() -> bool:
        q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
        (ref * w).sum().backward()
        return _close(out, ref, 3e-2) and _all_close([q.grad, k.grad, v.grad], [q2.grad, k2.grad, v2.grad], 3e-2)

    return Later(right)


def _gpt(key: str):
    """(TinyGPT, its torch.compile, an eager copy, the initial state), made once per process
    under `key`."""

    def build():
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TinyGPT()
        return model, torch.compile(model), copy.deepcopy(model), copy.deepcopy(model.state_dict())

    return _cached(key, build)


def compiled_nanogpt_loop(fixed: bool, widen: bool) -> bool | Later:
    """nanoGPT's train.py loop with `compile=True` (the model compiled, default mode), 10 steps:
    the next batch fetched between forward and backward as nanoGPT does
    (`x.pin_memory().to("cuda", non_blocking=True)`: a new pinned batch every step), AdamW,
    `loss.item()` every 5 steps. Widened: the default stream spins before every 5th step's
    copies. Right when every batch the compiled model saw is the host's, the logged losses are
    finite and the first loss is the eager model's (1e-3)."""
    _need_compile()
    model, compiled, ref, init = _gpt("gpt")
    model.load_state_dict(init)
    ref.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = _gen()
    data = _tokens(g)
    seen, want, logged, losses = [], [], [], []

    def get_batch(it):
        x, y = _get_batch(data, g)
        want.append(x.sum() + y.sum())
        if widen and it % 5 == 0:
            torch.cuda._sleep(SLEEP)
        return x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True)

    X, Y = get_batch(0)
    X0, Y0 = X, Y
    steps = 10
    for it in range(steps):
        seen.append(X.sum() + Y.sum())
        loss = compiled(X, Y)
        X, Y = get_batch(it + 1)  # nanoGPT: the next batch while the GPU runs the forward
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if it % 5 == 4:
            logged.append(loss.item())

    def right() -> bool:
        with torch.no_grad():  # the eager copy keeps the initial weights
            first = ref(X0, Y0)
        return (torch.equal(torch.stack(seen).cpu(), torch.stack(want[:steps])) and all(map(math.isfinite, logged))
                and _close(losses[0], first, 1e-3))

    return Later(right)


def compiled_amp_bf16(fixed: bool, widen: bool) -> bool | Later:
    """realcode's AMP program compiled: nanoGPT's model compiled (default mode) under
    `torch.autocast("cuda", torch.bfloat16)`, a `torch.amp.GradScaler`, `unscale_`, gradient
    clipping, AdamW, 4 steps; right when the losses and the scale are finite and the first loss is
    the eager model's under the same autocast (2e-2: bf16)."""
    _need_compile()
    model, compiled, ref, init = _gpt("gpt-amp")
    model.load_state_dict(init)
    ref.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    g = _gen()
    data = _tokens(g)
    losses, batches = [], []
    for _ in range(4):
        x, y = _get_batch(data, g)
        x, y = x.cuda(), y.cuda()
        batches.append((x, y))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())

    def right() -> bool:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # the eager copy: the initial weights
            first = ref(*batches[0]).float()
        return _finite(losses) and math.isfinite(scaler.get_scale()) and _close(losses[0], first, 2e-2)

    return Later(right)


def triton_op_on_side_stream(fixed: bool, widen: bool) -> bool:
    """A user Triton kernel as a `torch.library.triton_op` (realcode_compiled::axpb, `2 x + 1`)
    run eagerly on a side stream, an event recorded after it and waited for by the default stream
    (which then `record_stream`s the output and reads it), and a compiled function (default mode)
    that calls the op itself (Inductor launches the user kernel from its generated code) on the
    default stream. Widened: the side stream spins before the kernel. Right when both results are
    the host's `relu(2 x + 1) * w`."""
    op = _axpb_op()
    _need_compile()
    f = _compiled_fn("axpb_relu", _axpb_relu)
    g = _gen()
    hx, hw = torch.randn(N, generator=g), torch.randn(N, generator=g)
    x, w = hx.cuda(), hw.cuda()
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    done = torch.cuda.Event()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if widen:
            torch.cuda._sleep(SLEEP)
        y = op(x, 2.0, 1.0)
        done.record()
    main.wait_event(done)
    y.record_stream(main)
    eager = torch.relu(y) * w
    compiled = f(x, w)
    want = torch.relu(hx * 2 + 1) * hw
    ok = _close(eager.cpu(), want, 1e-5) and _close(compiled.cpu(), want, 1e-5)
    torch.cuda.synchronize()
    return ok


def gptfast_decode(fixed: bool, widen: bool) -> bool | Later:
    """gpt-fast's decode loop: a random Llama-style model (`GPTFastLlama`: 2 layers, hidden 128,
    vocabulary 256) with static KV caches, `decode_one_token` compiled with
    `mode="reduce-overhead", fullgraph=True` (CUDA graph trees), a prompt of 4 tokens fed one at a
    time, then 64 greedy tokens (`cur_token = next_token`, `input_pos += 1`). Right when every
    step's logits are the eager model's on the same inputs (1e-3)."""
    _need_compile()
    g = _gen()
    got, inputs = _gptfast_decode(_prompt(g), None, True, False)
    return Later(lambda: _close(got, _gptfast_eager(inputs), 1e-3))  # the eager model's, after the run


COMPILED_CLEAN = {  # those that capture CUDA graphs last
    "torch.compile ResNet-18 training": compiled_resnet_training,
    "torch.compile timm ViT-Tiny inference": compiled_vit_inference,
    "torch.compile SDPA forward/backward": compiled_sdpa,
    "torch.compile nanoGPT loop with pinned batches": compiled_nanogpt_loop,
    "torch.compile AMP bf16 + GradScaler": compiled_amp_bf16,
    "user Triton kernel as a triton_op on a side stream": triton_op_on_side_stream,
    "gpt-fast decode (reduce-overhead) 64 tokens": gptfast_decode,
    "torch.compile reduce-overhead LLM decode": compiled_llm_decode,  # realcode.py's, in both suites
}


# The programs that capture CUDA graphs (cudagraph trees), as realcode.CAPTURES.
COMPILED_CAPTURES = {reduce_overhead_weights_overwritten_during_replay, gptfast_next_input_on_side_stream,
                     gptfast_decode, compiled_llm_decode}
