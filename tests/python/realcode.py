"""Real-code programs: what people write with torchvision, timm, transformers, DDP, FSDP2, FSDP1,
DataLoader, AMP, CUDA graphs and torch.compile, small enough to run in well under a second.

Every program is `fn(fixed: bool, widen: bool) -> bool` and returns whether its result is right,
or returns that check itself (a function of no arguments, `Later`) where it compares with a
reference that runs a model again (the compiled programs against the eager model): a runner calls
it after the run, outside the check and the clock (`judged(result)`), so what is checked and timed
is the program, not its reference.

- `CLEAN`: correct programs (`fixed` is ignored). A checker must report nothing for them. Those
  with streams or `non_blocking` copies of their own (loaders, prefetchers, the double buffer,
  pinned batches, save_on_cpu) delay, with `widen`, the stream whose work could race
  (`torch.cuda._sleep`, which bypasses the dispatcher and so is not part of what is checked) and
  compare what they computed with a reference made with explicit synchronization (the same
  batches summed on the host): a real race would show as a wrong result. Model programs without
  streams of their own check something cheap and deterministic (finite losses, the same numbers
  as an eager or unsharded reference, the shape of what was generated).
- `BUGS`: planted synchronization bugs in real-code settings. The buggy variant (`fixed=False`)
  has the bug; the line where the user's code issues the racing access is marked `# RACE` (a
  checker reports the later access of the race there; an `unsafe-free` is reported at the free,
  which is marked too where it is a line of ours). The fixed variant adds the missing
  synchronization. With `widen`, a stream first spins (`SLEEP` cycles): the one whose work the
  racing access should have waited for, or, for memory reused too early, the one still using it;
  so the buggy variant really reads or overwrites the wrong data and returns False, and the fixed
  one never does (each docstring says where it spins).
  The data of each run is new (`_gen()`), so memory left over from an earlier run never holds
  the right answer by chance.

A program whose library is missing raises `RuntimeError("needs X")`. Models are random (no
download anywhere: never `pretrained=True` / `from_pretrained`). `race_lines(fn)` gives the
`# RACE` lines of a program (and of the helpers it names in `fn.race_helpers`).

`NOTES`: what a run of a program found that is not a synchronization bug (a PyTorch bug it
measures, for one), keyed by the program function's `__name__`; a runner pops it after each run
(`take_note(fn)`).

CUDA graph captures here run with Python's cyclic garbage collector paused (`_gc_paused`):
torch 2.9+'s `torch.cuda.graph` no longer runs `gc.collect()` before capturing
(`torch.compiler.config.force_cudagraph_gc`, default off), and a graph of an earlier run kept
alive by a reference cycle (`make_graphed_callables` makes one: the module's `forward` closes over
the module) and collected in the middle of a capture calls `cudaGraphExecDestroy` during a
global-mode capture: "operation not permitted when stream is capturing" (CUDAGraph.cpp, `reset`),
the capture is invalidated and the CUDA RNG is left in capture state for the rest of the process
("Offset increment outside graph capture encountered unexpectedly"); see pytorch/pytorch#161037.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import inspect
import io
import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

SLEEP = 50_000_000  # cycles (about 25 ms on an H200): far longer than any copy or kernel here
DECAY = 0.9  # the EMA's decay
MEAN = (0.485, 0.456, 0.406)  # ImageNet normalization, as image pipelines do on the GPU
STD = (0.229, 0.224, 0.225)

_runs = itertools.count(1)


def _gen() -> torch.Generator:
    """A CPU generator with a new seed for each run: each run's data differs from the last's."""
    return torch.Generator().manual_seed(1000 + next(_runs))


def _need(module: str):
    """Imports `module`, or raises RuntimeError("needs MODULE")."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(f"needs {module} ({e})") from e


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    """Whether `a` is `b` up to `rel` of b's largest magnitude (and finite)."""
    a, b = a.detach().float(), b.detach().float()
    if a.shape != b.shape or not bool(torch.isfinite(a).all()):
        return False
    return float((a - b).abs().max()) <= rel * float(b.abs().max()) + 1e-6


def _all_close(xs, ys, rel: float = 1e-4) -> bool:
    xs, ys = list(xs), list(ys)
    return len(xs) == len(ys) and all(_close(x, y, rel) for x, y in zip(xs, ys))


def _finite(values) -> bool:
    return bool(torch.isfinite(torch.stack([v.detach().float() for v in values])).all())


class Later:
    """A program's result check, made after its run (module docstring): `Later(f, *args)` is
    `f(*args)`, called by `judged`."""

    def __init__(self, f, *args) -> None:
        self.f, self.args = f, args

    def __call__(self) -> bool:
        return bool(self.f(*self.args))


def judged(result) -> bool:
    """Whether a program's result is right: `result` itself, or, where the program returned a
    `Later`, what it says (call it after the run, outside streamsan's check and any clock; CSAN,
    enabled for the whole process, still sees it)."""
    return result() if isinstance(result, Later) else bool(result)


NOTES: dict = {}  # program function's __name__ -> a note of its last run (see the module docstring)


def take_note(fn):
    """The note the last run of program `fn` left (and forgets it), or None."""
    return NOTES.pop(getattr(fn, "__name__", ""), None)


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off meanwhile (a CUDA graph capture: see the module
    docstring); as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _make_graphed(model: nn.Module, sample: torch.Tensor):
    """`torch.cuda.make_graphed_callables(model, (sample,))`, the collector paused meanwhile."""
    with _gc_paused():
        return torch.cuda.make_graphed_callables(model, (sample,))


_group = None


def _one_rank_group() -> None:
    """A one-rank NCCL process group (made once per process), or RuntimeError("needs …")."""
    global _group
    if _group is None:
        try:
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_nccl_available():
                raise RuntimeError("torch.distributed with NCCL is not available")
            if not dist.is_initialized():
                dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
            _group = True
        except Exception as e:  # noqa: BLE001
            _group = f"{type(e).__name__}: {e}"
    if _group is not True:
        raise RuntimeError(f"needs a one-rank NCCL process group ({_group})")


def _race_helpers(*objs):
    """Marks the helpers (classes, functions) whose `# RACE` lines belong to a program too."""

    def mark(fn):
        fn.race_helpers = objs
        return fn

    return mark


def race_lines(fn) -> set[int]:
    """The lines marked `# RACE` of `fn` and of the helpers in `fn.race_helpers`."""
    out: set[int] = set()
    for obj in (fn, *getattr(fn, "race_helpers", ())):
        src, first = inspect.getsourcelines(obj)
        out |= {first + i for i, line in enumerate(src) if line.rstrip().endswith("# RACE")}
    return out


# ----------------------------------------------------------------------------------------------
# Models of our own (no library needed): an MLP, a nanoGPT, a Llama with a static KV cache


def _mlp(din: int = 64, hidden: int = 256, dout: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(din, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, dout))


class _Block(nn.Module):
    """A nanoGPT transformer block (pre-norm, causal SDPA, GELU MLP)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """nanoGPT's model, tiny: `model(idx, targets)` is the loss, `model(idx)` the logits."""

    def __init__(self, vocab: int = 64, block: int = 32, d: int = 64, heads: int = 4, layers: int = 2,
                 checkpoint: bool = False) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _tokens(g: torch.Generator, n: int = 4096, vocab: int = 64) -> torch.Tensor:
    """A tokenized "dataset" on the host."""
    return torch.randint(vocab, (n,), generator=g)


def _get_batch(data: torch.Tensor, g: torch.Generator, batch: int = 8, block: int = 32):
    """nanoGPT's get_batch, on the host: random windows of `data` and the next tokens."""
    ix = torch.randint(len(data) - block - 1, (batch,), generator=g).tolist()
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
    return x, y


class _RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class _LlamaLayer(nn.Module):
    """A Llama decoder layer (RMSNorm, RoPE, SDPA over a static KV cache, SwiGLU)."""

    def __init__(self, d: int, heads: int, hidden: int, max_seq: int, batch: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = _RMSNorm(d), _RMSNorm(d)
        self.wqkv, self.wo = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.register_buffer("k_cache", torch.zeros(batch, heads, max_seq, d // heads))
        self.register_buffer("v_cache", torch.zeros(batch, heads, max_seq, d // heads))

    def forward(self, x, pos, cos, sin, mask):
        B, T, D = x.shape
        H = self.heads
        q, k, v = self.wqkv(self.n1(x)).split(D, dim=-1)
        q = _rope(q.view(B, T, H, D // H).transpose(1, 2), cos, sin)
        k = _rope(k.view(B, T, H, D // H).transpose(1, 2), cos, sin)
        v = v.view(B, T, H, D // H).transpose(1, 2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, D))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    """A Llama-style decoder for one token a step: `model(tok [B,1], pos [1]) -> logits [B,V]`,
    the keys and values kept in static caches (module buffers) written at `pos`, as gpt-fast does."""

    def __init__(self, vocab: int = 256, d: int = 128, layers: int = 2, heads: int = 4, hidden: int = 256,
                 max_seq: int = 32, batch: int = 1) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_LlamaLayer(d, heads, hidden, max_seq, batch) for _ in range(layers))
        self.norm = _RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        f = torch.outer(torch.arange(max_seq).float(), inv)
        self.register_buffer("cos", f.cos())
        self.register_buffer("sin", f.sin())
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def forward(self, tok, pos):
        x = self.emb(tok)
        cos, sin = self.cos[pos], self.sin[pos]
        mask = self.causal[pos].view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.head(self.norm(x))[:, -1]

    def reset(self) -> None:
        for layer in self.layers:
            layer.k_cache.zero_()
            layer.v_cache.zero_()


class CudaPrefetcher:
    """The apex / timm style prefetcher: while the current batch is used, the next one is copied
    to the GPU on a stream of its own. `record_stream=False` is the bug of BUGS' prefetcher: the
    device batch is allocated on the copy stream, used on the default stream and freed without
    `record_stream`, so the allocator hands its memory to a later copy while the default stream
    may still read it. `slow_copies` (widened runs) spins the copy stream before the copies of the
    even-numbered batches (0, 2, …)."""

    def __init__(self, host_batches, record_stream: bool = True, slow_copies: bool = False) -> None:
        self.batches = iter(host_batches)
        self.stream = torch.cuda.Stream()
        self.record_stream = record_stream
        self.slow_copies = slow_copies
        self.loaded = 0
        self.preload()

    def preload(self) -> None:
        host = next(self.batches, None)
        if host is None:
            self.next = None
            return
        with torch.cuda.stream(self.stream):
            if self.slow_copies and self.loaded % 2 == 0:
                torch.cuda._sleep(SLEEP)
            self.next = host.to("cuda", non_blocking=True)  # RACE
        self.loaded += 1

    def __iter__(self):
        return self

    def __next__(self):
        torch.cuda.current_stream().wait_stream(self.stream)
        batch = self.next
        if batch is None:
            raise StopIteration
        if self.record_stream:
            batch.record_stream(torch.cuda.current_stream())
        self.preload()
        return batch


# ----------------------------------------------------------------------------------------------
# Side streams inside autograd's backward (on its device thread) and inside a custom op


_OPS: dict = {}  # name -> torch.library's CustomOpDef (kept: dropping it unregisters the op)
_OP_STREAMS: dict = {}  # device index -> the side stream of realcode::side_axpb_


def _side_axpb_kernel(x: torch.Tensor, a: float, b: float, spin: int) -> None:
    """realcode::side_axpb_'s CUDA kernel: `x = a * x + b` in place, on a side stream of the op's
    own that first waits for the current stream (which produced `x`); then the current stream
    waits for it (whatever comes after reads `x`). `spin` (widened runs): the side stream spins
    that many cycles before writing."""
    side = _OP_STREAMS.get(x.device.index)
    if side is None:
        side = _OP_STREAMS[x.device.index] = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        if spin:
            torch.cuda._sleep(spin)
        x.mul_(a).add_(b)
    cur.wait_stream(side)


def side_axpb_op():
    """`torch.ops.realcode.side_axpb_(x, a, b, spin)`, a `torch.library.custom_op` mutating `x`
    whose CUDA implementation is `_side_axpb_kernel` (registered once per process), or
    RuntimeError("needs …")."""
    if "side_axpb_" not in _OPS:
        if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
            raise RuntimeError("needs torch.library.custom_op (torch >= 2.4)")
        try:
            _OPS["side_axpb_"] = torch.ops.realcode.side_axpb_  # registered by another copy of this module
        except (AttributeError, RuntimeError):
            _OPS["side_axpb_"] = torch.library.custom_op(
                "realcode::side_axpb_", _side_axpb_kernel, mutates_args=("x",), device_types="cuda",
                schema="(Tensor(a!) x, float a, float b, int spin) -> ()")
    return torch.ops.realcode.side_axpb_


class SideStreamGradScale(torch.autograd.Function):
    """`y = x` forward; backward, on autograd's device thread (whose current stream is the one the
    forward ran on), scales the incoming gradient by `scale` into a new tensor on the side stream
    `side`: first `side.wait_stream(current)` (with `wait_first`: the fix of BUGS' variant, which
    reads the gradient before it is produced), then the current stream waits for the side stream
    and the new gradient is `record_stream`ed on it (it was allocated on the side stream and is
    used and freed on the current one). With `axpb` = (a, b, spin), then `realcode::side_axpb_` on
    the new gradient: a custom op inside the backward, on a side stream of its own."""

    @staticmethod
    def forward(ctx, x, scale, side, wait_first, axpb):
        ctx.scale, ctx.side, ctx.wait_first, ctx.axpb = scale, side, wait_first, axpb
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        cur = torch.cuda.current_stream()
        if ctx.wait_first:
            ctx.side.wait_stream(cur)
        with torch.cuda.stream(ctx.side):
            out = grad * ctx.scale  # RACE
        cur.wait_stream(ctx.side)
        out.record_stream(cur)
        if ctx.axpb is not None:
            side_axpb_op()(out, *ctx.axpb)
        return out, None, None, None, None


class _GradScaleRef(torch.autograd.Function):
    """SideStreamGradScale's reference: the same arithmetic on the current stream alone."""

    @staticmethod
    def forward(ctx, x, scale, ab):
        ctx.scale, ctx.ab = scale, ab
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        out = grad * ctx.scale
        if ctx.ab is not None:
            out.mul_(ctx.ab[0]).add_(ctx.ab[1])
        return out, None, None


class _SpinInBackward(torch.autograd.Function):
    """`y = x`; its backward first spins the current stream `cycles` (widened runs): the gradients
    autograd computes after it (those of the layers before it) are produced late."""

    @staticmethod
    def forward(ctx, x, cycles):
        ctx.cycles = cycles
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.cycles:
            torch.cuda._sleep(ctx.cycles)
        return grad, None


def _side_stream_grad_mlp(wait_first: bool, widen: bool, with_op: bool) -> bool:
    """An MLP (64-256-10) trained 3 SGD steps with `SideStreamGradScale` (scale 0.5) after its
    hidden layer; with `with_op`, each batch goes through `realcode::side_axpb_` (0.5 x + 0.25) and
    the scaled gradient too (2 g + 0, inside the backward). Widened: the default stream spins
    before it produces each batch, in the backward before it produces the hidden layer's gradient
    (`_SpinInBackward`), and the custom op's side stream before each write. Right when losses and
    weights are those of the same MLP computed on the default stream alone (after it: no memory
    it freed holds a right gradient for a too early read to find)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        fc1, fc2 = nn.Linear(64, 256), nn.Linear(256, 10)
    rfc1, rfc2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    params = [*fc1.parameters(), *fc2.parameters()]
    rparams = [*rfc1.parameters(), *rfc2.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    ropt = torch.optim.SGD(rparams, lr=0.1)
    op = side_axpb_op() if with_op else None
    _OP_STREAMS.clear()  # the op's side stream made in this run (under the check, when checked)
    side = torch.cuda.Stream()
    spin = SLEEP if widen else 0
    g = _gen()
    xs = [torch.randn(32, 64, generator=g).cuda() for _ in range(3)]
    ys = [torch.randint(0, 10, (32,), generator=g).cuda() for _ in range(3)]
    losses, rlosses = [], []
    for x0, y in zip(xs, ys):
        opt.zero_grad(set_to_none=True)
        if widen:
            torch.cuda._sleep(SLEEP)
        x = x0.clone()
        if op is not None:
            op(x, 0.5, 0.25, spin)
        h = SideStreamGradScale.apply(F.relu(fc1(x)), 0.5, side, wait_first, (2.0, 0.0, spin) if with_op else None)
        loss = F.cross_entropy(_SpinInBackward.apply(fc2(h), spin), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    for x0, y in zip(xs, ys):
        ropt.zero_grad(set_to_none=True)
        x = x0.clone()
        if op is not None:
            x.mul_(0.5).add_(0.25)
        h = _GradScaleRef.apply(F.relu(rfc1(x)), 0.5, (2.0, 0.0) if with_op else None)
        loss = F.cross_entropy(rfc2(h), y)
        loss.backward()
        ropt.step()
        rlosses.append(loss.detach())
    return _all_close(losses, rlosses, 1e-5) and _all_close(params, rparams, 1e-5)


# ----------------------------------------------------------------------------------------------
# CLEAN: correct programs


def resnet_training(fixed: bool, widen: bool) -> bool:
    """torchvision ResNet-18 (random weights, 10 classes) trained 3 SGD steps (momentum, weight
    decay) on one 8x3x64x64 batch; right when every loss is finite."""
    tv = _need("torchvision")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tv.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    g = _gen()
    x = torch.randn(8, 3, 64, 64, generator=g).cuda()
    y = torch.randint(0, 10, (8,), generator=g).cuda()
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return _finite(losses)


def timm_vit_training(fixed: bool, widen: bool) -> bool:
    """timm ViT-Tiny/16 (random weights, img_size 64, 10 classes) trained 2 AdamW steps on a
    4x3x64x64 batch; right when the losses are finite."""
    timm = _need("timm")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    g = _gen()
    x = torch.randn(4, 3, 64, 64, generator=g).cuda()
    y = torch.randint(0, 10, (4,), generator=g).cuda()
    losses = []
    for _ in range(2):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return _finite(losses)


def gpt2_generate(fixed: bool, widen: bool) -> bool:
    """transformers GPT-2 (random, 2 layers, n_embd 128, vocabulary 512) `generate`s 8 tokens
    greedily (KV cache) for 2 prompts of 8 tokens; right when they are the tokens a greedy loop
    without cache picks."""
    tf = _need("transformers")
    cfg = tf.GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg).cuda().eval()
    g = _gen()
    ids = torch.randint(3, 512, (2, 8), generator=g).cuda()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                             do_sample=False)
        ref = ids
        for _ in range(8):
            logits = model(ref, use_cache=False).logits[:, -1].clone()
            logits[:, cfg.eos_token_id] = float("-inf")  # as min_new_tokens does
            ref = torch.cat([ref, logits.argmax(-1, keepdim=True)], dim=1)
    return tuple(out.shape) == (2, 16) and torch.equal(out, ref)


def amp_bf16_gradscaler(fixed: bool, widen: bool) -> bool:
    """nanoGPT's training step with AMP: `torch.autocast("cuda", torch.bfloat16)`, a
    `torch.amp.GradScaler`, `unscale_`, gradient clipping, AdamW, 4 steps; right when the
    losses and the scale are finite."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    g = _gen()
    data = _tokens(g)
    losses = []
    for _ in range(4):
        x, y = _get_batch(data, g)
        x, y = x.cuda(), y.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return _finite(losses) and math.isfinite(scaler.get_scale())


def ddp_one_rank(fixed: bool, widen: bool) -> bool:
    """DistributedDataParallel over a one-rank NCCL group: an MLP trained 3 SGD steps (momentum);
    right when its weights are those of the same MLP trained without DDP."""
    _one_rank_group()
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp()
    ref = copy.deepcopy(model)
    ddp = DDP(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = _gen()
    for _ in range(3):
        x = torch.randn(32, 64, generator=g).cuda()
        y = torch.randint(0, 10, (32,), generator=g).cuda()
        for m, o in ((ddp, opt), (ref, ropt)):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
            o.step()
    return _all_close(model.parameters(), ref.parameters(), 1e-5)


def _sharded_gpt_losses(sharded: nn.Module, ref: nn.Module, g: torch.Generator, device="cuda",
                        each_step=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A sharded nanoGPT (`sharded`) and the same model unsharded (`ref`) trained side by side,
    AdamW, 3 steps on the batches of `g`'s tokens (`each_step()` first in each): their losses."""
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    data = _tokens(g)
    losses, rlosses = [], []
    for _ in range(3):
        if each_step is not None:
            each_step()
        x, y = _get_batch(data, g)
        x, y = x.to(device), y.to(device)
        loss = sharded(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        rloss = ref(x, y)
        rloss.backward()
        ropt.step()
        ropt.zero_grad()
        losses.append(loss.detach())
        rlosses.append(rloss.detach())
    return torch.stack(losses), torch.stack(rlosses)


def fsdp2_one_rank(fixed: bool, widen: bool) -> bool:
    """FSDP2 over a one-rank NCCL group: `fully_shard` on each block of a nanoGPT and on the
    model, AdamW, 3 steps; right when the losses are those of the unsharded model."""
    _one_rank_group()
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError as e:
            raise RuntimeError(f"needs FSDP2 (torch.distributed.fsdp.fully_shard: {e})") from e
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    ref = copy.deepcopy(model)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    return _close(*_sharded_gpt_losses(model, ref, _gen()), 1e-4)


def fsdp1_one_rank(fixed: bool, widen: bool) -> bool:
    """FSDP1 over a one-rank NCCL group: `FullyShardedDataParallel` around each nanoGPT block and
    the model (`use_orig_params=True`, forward prefetch), AdamW, 3 steps; right when the losses
    are those of the unsharded model. Its parameters' views are made on its unshard stream, so
    their backward nodes run there and are handed gradients made on the default stream: the
    autograd engine's marks of them (docs/pytorch.md, "What is seen") keep it clean."""
    _one_rank_group()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    ref = copy.deepcopy(model)
    sharded = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({_Block}), use_orig_params=True,
                   forward_prefetch=True, device_id=torch.cuda.current_device())
    return _close(*_sharded_gpt_losses(sharded, ref, _gen()), 1e-4)


def _dataloader_linear(workers: int, widen: bool) -> bool:
    from torch.utils.data import DataLoader, TensorDataset

    g = _gen()
    X, Y = torch.randn(512, 32, generator=g), torch.randn(512, 4, generator=g)
    loader = DataLoader(TensorDataset(X, Y), batch_size=64, pin_memory=True, num_workers=workers)
    torch.manual_seed(0)
    model = nn.Linear(32, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for xb, yb in loader:
        if widen:
            torch.cuda._sleep(SLEEP)  # the copies run late: their pinned batch must not be reused before
        xb = xb.to("cuda", non_blocking=True)
        yb = yb.to("cuda", non_blocking=True)
        seen.append(torch.cat([xb.sum(1), yb.sum(1)]))
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    want = torch.stack([torch.cat([X[i:i + 64].sum(1), Y[i:i + 64].sum(1)]) for i in range(0, 512, 64)])
    return _close(torch.stack(seen).cpu(), want, 1e-5)


def dataloader_pinned_workers0(fixed: bool, widen: bool) -> bool:
    """`DataLoader(TensorDataset(X, Y), batch_size=64, pin_memory=True)` (num_workers=0), each
    batch `.to("cuda", non_blocking=True)`, training a Linear. Widened: the default stream (where
    the copies run) spins before each copy. Right when the batches the GPU saw are the dataset's."""
    return _dataloader_linear(0, widen)


def dataloader_pinned_workers2(fixed: bool, widen: bool) -> bool:
    """The same with `num_workers=2` (forked workers, the loader's pin-memory thread)."""
    return _dataloader_linear(2, widen)


def save_on_cpu_pinned(fixed: bool, widen: bool) -> bool:
    """An MLP whose saved activations go to pinned host memory
    (`torch.autograd.graph.save_on_cpu(pin_memory=True)`: backward brings them back with
    non_blocking copies), 2 iterations. Widened: the default stream spins before backward, so the
    copies back run late. Right when the gradients are those computed without save_on_cpu."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp(256, 512, 10)
    params = list(model.parameters())
    g = _gen()
    x = torch.randn(64, 256, generator=g).cuda()
    y = torch.randint(0, 10, (64,), generator=g).cuda()
    want = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    ok = True
    for _ in range(2):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            loss = F.cross_entropy(model(x), y)
        if widen:
            torch.cuda._sleep(SLEEP)
        got = torch.autograd.grad(loss, params)
        ok = ok and _all_close(got, want, 1e-5)
    return ok


def activation_checkpointing(fixed: bool, widen: bool) -> bool:
    """nanoGPT with `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` around
    each block; right when its loss and gradients are those without checkpointing."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT(checkpoint=True)
    g = _gen()
    x, y = _get_batch(_tokens(g), g)
    x, y = x.cuda(), y.cuda()
    loss = model(x, y)
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model.checkpoint = False
    ref = model(x, y)
    ref.backward()
    return _close(loss, ref, 1e-5) and _all_close(got, [p.grad for p in model.parameters()], 1e-4)


def _graphed_mlp_train(xs, ys, set_to_none: bool, widen: bool, eager: bool) -> dict:
    """An MLP (seed 0) through `make_graphed_callables`, trained one SGD step per batch of `xs`,
    `ys` with `zero_grad(set_to_none=set_to_none)`; with `eager`, the same MLP without the graphs
    beside it, step by step. Widened: the default stream spins before each backward (the graphed
    backward's replay and the gradients' accumulation run late). Returns the losses, the final
    parameters, and with `eager` the eager MLP's and, per step, the ratio of the graphed MLP's
    gradients to the eager one's (<g, r> / <r, r> over all parameters, before the step)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp()
    ref = copy.deepcopy(model) if eager else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1) if eager else None
    graphed = _make_graphed(model, torch.randn(32, 64, device="cuda"))
    out: dict = {"losses": [], "rlosses": [], "ratios": []}
    for x, y in zip(xs, ys):
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(graphed(x), y)
        if widen:
            torch.cuda._sleep(SLEEP)
        loss.backward()
        out["losses"].append(loss.detach())
        if eager:
            ropt.zero_grad(set_to_none=set_to_none)
            rloss = F.cross_entropy(ref(x), y)
            rloss.backward()
            out["rlosses"].append(rloss.detach())
            g = torch.cat([p.grad.flatten() for p in model.parameters()])
            r = torch.cat([p.grad.flatten() for p in ref.parameters()])
            out["ratios"].append(float((g * r).sum() / (r * r).sum()))
            ropt.step()
        opt.step()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    if eager:
        out["rparams"] = [p.detach().clone() for p in ref.parameters()]
    return out


def _graphed_batches():
    g = _gen()
    xs = [torch.randn(32, 64, generator=g).cuda() for _ in range(3)]
    ys = [torch.randint(0, 10, (32,), generator=g).cuda() for _ in range(3)]
    return xs, ys


def graphed_mlp_set_to_none(fixed: bool, widen: bool) -> bool:
    """An MLP through `torch.cuda.make_graphed_callables`, trained 3 SGD steps with
    `zero_grad(set_to_none=True)`. Widened: the default stream spins before each backward. Right
    when losses and weights are those of the eager MLP."""
    r = _graphed_mlp_train(*_graphed_batches(), set_to_none=True, widen=widen, eager=True)
    return _all_close(r["losses"], r["rlosses"], 1e-4) and _all_close(r["params"], r["rparams"], 1e-4)


def graphed_mlp_zero_grad_in_place(fixed: bool, widen: bool) -> bool:
    """The same with `zero_grad(set_to_none=False)`. Here the graphed MLP does NOT train as the
    eager one does, widened or not, under a checker or not: PyTorch's own bug
    (pytorch/pytorch#181723), not a synchronization bug. On the first step AccumulateGrad takes
    the graphed backward's static gradient output itself as `p.grad` (there is none yet);
    `zero_grad(set_to_none=False)` then zeroes that static buffer in place, the next replay writes
    the new gradient into it, and AccumulateGrad adds `p.grad` (the same buffer) to itself: from
    the second step on every gradient is doubled. The program is in the suite because a checker
    once reported false data races on it (the gradients accumulated into, in place, by the graph's
    replay and by AccumulateGrad on the default stream).

    So its result is whether it does not depend on timing: a run (widened: the default stream
    spins before each backward) trains exactly as a second, unwidened run of the same seed and
    batches does (losses and final weights equal within 1e-6), and its first step, which the bug
    does not reach, is the eager MLP's (loss within 1e-4, gradient ratio 1). The doubling is
    measured, not judged: the ratio of the graphed MLP's gradients to the eager MLP's on the
    second step (2.0 with the bug, 1.0 once PyTorch fixes it) goes to `NOTES`."""
    xs, ys = _graphed_batches()
    a = _graphed_mlp_train(xs, ys, set_to_none=False, widen=widen, eager=True)
    b = _graphed_mlp_train(xs, ys, set_to_none=False, widen=False, eager=False)
    ratio = a["ratios"][1]
    if abs(ratio - 2.0) < 1e-3:
        what = "gradients doubled"
    elif abs(ratio - 1.0) < 1e-3:
        what = "gradients right (the bug looks fixed in this PyTorch)"
    else:
        what = "gradients off"
    NOTES[graphed_mlp_zero_grad_in_place.__name__] = {
        "title": "PyTorch bug #181723", "bug": "pytorch/pytorch#181723", "what": what,
        "ratio": round(ratio, 4), "widened": bool(widen), "sync_bug": False}
    same = _all_close(a["losses"], b["losses"], 1e-6) and _all_close(a["params"], b["params"], 1e-6)
    first = _close(a["losses"][0], a["rlosses"][0], 1e-4) and abs(a["ratios"][0] - 1.0) < 1e-3
    return same and first


def cuda_graph_inference(fixed: bool, widen: bool) -> bool:
    """torchvision ResNet-18 inference captured with `torch.cuda.graph` (warm-up on a side stream
    first, as PyTorch's docs do; the garbage collector paused during the capture), replayed for 3 batches copied into the static input; right
    when the outputs are the eager model's."""
    tv = _need("torchvision")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tv.models.resnet18(num_classes=10).eval()
    g = _gen()
    batches = [torch.randn(4, 3, 64, 64, generator=g).cuda() for _ in range(3)]
    static_x = torch.zeros(4, 3, 64, 64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with _gc_paused(), torch.no_grad(), torch.cuda.graph(graph):
        static_y = model(static_x)
    outs = []
    for xb in batches:
        static_x.copy_(xb)
        graph.replay()
        outs.append(static_y.clone())
    with torch.no_grad():
        refs = [model(xb) for xb in batches]
    return _all_close(outs, refs, 1e-3)


_COMPILED: dict = {}


def _compiled_llama():
    """(TinyLlama, its torch.compile(mode="reduce-overhead")), made once per process."""
    if "llama" not in _COMPILED:
        if not hasattr(torch, "compile"):
            raise RuntimeError("needs torch.compile")
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TinyLlama().eval()
        _COMPILED["llama"] = (model, torch.compile(model, mode="reduce-overhead", fullgraph=True))
    return _COMPILED["llama"]


def compiled_llm_decode(fixed: bool, widen: bool) -> bool | Later:
    """An LLM decode loop compiled with `torch.compile(mode="reduce-overhead")` (CUDA graph
    trees): a random 2-layer Llama-style model (hidden 128) with a static KV cache, fed a prompt
    of 4 tokens one at a time, then 8 greedy decode steps. Compiled once per process; the compiled
    decode runs with the garbage collector paused (its first calls capture CUDA graphs). Right when
    its logits are the eager model's on the same tokens (computed after the run: `Later`)."""
    model, step = _compiled_llama()
    prompt = torch.tensor([3, 17, 42, 5], device="cuda").view(-1, 1, 1)  # tokens [1, 1], as argmax's

    def decode(fn, forced=None):
        model.reset()
        pos = torch.zeros(1, dtype=torch.long, device="cuda")
        tok = prompt[0]
        toks, logits = [], []
        with torch.no_grad():
            for i in range(len(prompt) + 8):
                if fn is step:
                    torch.compiler.cudagraph_mark_step_begin()
                out = fn(tok, pos).clone()  # a graph's output is overwritten by its next replay
                logits.append(out)
                if i + 1 < len(prompt):
                    tok = prompt[i + 1]
                elif forced is not None:
                    tok = forced[len(toks)]
                    toks.append(tok)
                else:
                    tok = out.argmax(-1, keepdim=True)
                    toks.append(tok)
                pos += 1
        return toks, torch.stack(logits)

    with _gc_paused():  # CUDA graph trees capture in the first calls
        toks, got = decode(step)

    def right() -> bool:
        _, want = decode(model, forced=toks)
        return _close(got, want, 1e-3)

    return Later(right)  # the eager model's logits, after the run


def sdpa_attention(fixed: bool, widen: bool) -> bool:
    """`F.scaled_dot_product_attention(is_causal=True)` forward and backward in bf16 (2x4x128x64,
    the fused kernels); right when output and gradients match the math backend in fp32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = _gen()
    q, k, v = (torch.randn(2, 4, 128, 64, generator=g).cuda().to(torch.bfloat16).requires_grad_() for _ in range(3))
    w = torch.randn(2, 4, 128, 64, generator=g).cuda()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (out.float() * w).sum().backward()
    q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    (ref * w).sum().backward()
    return _close(out, ref, 3e-2) and _all_close([q.grad, k.grad, v.grad], [q2.grad, k2.grad, v2.grad], 3e-2)


def nanogpt_pinned_batches(fixed: bool, widen: bool) -> bool:
    """nanoGPT's training loop, 20 steps: each step's batch is `x.pin_memory().to("cuda",
    non_blocking=True)` (a new pinned batch every step, freed after its copy is issued), AdamW,
    `loss.item()` every 5 steps, and a checkpoint `torch.save`d (into a BytesIO) at the end.
    Widened: the default stream spins before every 5th step's copies, so they run late while the
    host pins the next batches. Right when every batch the GPU saw is the host's."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = _gen()
    data = _tokens(g)
    seen, want, logged = [], [], []
    for it in range(20):
        x, y = _get_batch(data, g)
        want.append(x.sum() + y.sum())
        if widen and it % 5 == 0:
            torch.cuda._sleep(SLEEP)
        x, y = x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True)
        seen.append(x.sum() + y.sum())
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if it % 5 == 4:
            logged.append(loss.item())
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter": it}, buf)
    return (torch.equal(torch.stack(seen).cpu(), torch.stack(want)) and all(map(math.isfinite, logged))
            and buf.tell() > 0)


def double_buffered_loader(fixed: bool, widen: bool) -> bool:
    """A double-buffered loader: each step a new pinned batch is copied on a copy stream, an event
    recorded after the copy; the consumer waits for the event and calls `record_stream` on the
    batch; an MLP trains on it, 6 steps. Widened: the copy stream spins before the even steps'
    copies (the consumer must wait), the default stream before the odd steps' use (batch i's
    memory must not go to the copy of batch i + 2, which does not spin, while it is still read).
    Right when the batches the GPU saw are the host's."""
    g = _gen()
    steps = 6
    host = [torch.randint(-8, 8, (64, 256), generator=g).float() for _ in range(steps)]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp(256, 512, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randint(0, 10, (64,), generator=g).cuda()
    main, copier = torch.cuda.current_stream(), torch.cuda.Stream()

    def stage(i):
        pinned = host[i].pin_memory()
        with torch.cuda.stream(copier):
            if widen and i % 2 == 0:
                torch.cuda._sleep(SLEEP)
            dev = pinned.to("cuda", non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(copier)
        return dev, ready

    nxt = stage(0)
    seen = []
    for i in range(steps):
        dev, ready = nxt
        main.wait_event(ready)
        dev.record_stream(main)
        if i + 1 < steps:
            nxt = stage(i + 1)
        if widen and i % 2 == 1:
            torch.cuda._sleep(SLEEP)
        seen.append(dev.sum(1))
        loss = F.cross_entropy(model(dev), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    del dev, nxt
    return torch.equal(torch.stack(seen).cpu(), torch.stack([h.sum(1) for h in host]))


def prefetcher_pinned_randn(fixed: bool, widen: bool) -> bool:
    """`CudaPrefetcher` (with `record_stream`) over host batches made each step as
    `torch.randn(n).pin_memory()`, feeding an MLP, 6 steps. Widened: the copy stream spins before
    the even batches' copies (the consumer must wait for them), the default stream before the even
    steps' use (batch i's memory must not go to the copy of batch i + 3, which does not spin, while
    it is still read). Right when the batches the GPU saw are the host's."""
    g = _gen()
    n, steps = 64 * 256, 6
    want = []

    def host_batches():
        for _ in range(steps):
            h = torch.randn(n, generator=g).pin_memory()
            want.append(h.view(64, 256).sum(1))
            yield h

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp(256, 512, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randint(0, 10, (64,), generator=g).cuda()
    seen = []
    for i, batch in enumerate(CudaPrefetcher(host_batches(), record_stream=True, slow_copies=widen)):
        if widen and i % 2 == 0:
            torch.cuda._sleep(SLEEP)
        x = batch.view(64, 256)
        seen.append(x.sum(1))
        loss = F.cross_entropy(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return _close(torch.stack(seen).cpu(), torch.stack(want), 1e-5)


def autograd_side_streams(fixed: bool, widen: bool) -> bool:
    """The order of ops on autograd's device thread inside nested scopes: an MLP trained 3 steps
    whose backward runs a custom `torch.autograd.Function` (`SideStreamGradScale`) that scales the
    gradient on a side stream (`side.wait_stream(current)`, the kernel there, the current stream
    waiting for it, `record_stream`) and, inside that backward, a `torch.library` custom op
    (`realcode::side_axpb_`, its CUDA implementation in Python: `wait_stream`, a kernel on a side
    stream of its own writing its mutated input, `wait_stream` back), which also normalizes each
    batch in the forward. Widened: the default stream spins before producing each batch and before
    producing the gradient the backward scales, the op's side stream before each write. Right when
    losses and weights are those of the same arithmetic on the default stream alone."""
    return _side_stream_grad_mlp(True, widen, True)


CLEAN = {  # those that could hang or take long (fork, NCCL, compilation) last
    "torchvision ResNet-18 training": resnet_training,
    "timm ViT-Tiny training": timm_vit_training,
    "transformers GPT-2 generate": gpt2_generate,
    "AMP bf16 + GradScaler": amp_bf16_gradscaler,
    "DataLoader pin_memory num_workers=0": dataloader_pinned_workers0,
    "save_on_cpu(pin_memory=True)": save_on_cpu_pinned,
    "activation checkpointing": activation_checkpointing,
    "make_graphed_callables set_to_none=True": graphed_mlp_set_to_none,
    "make_graphed_callables set_to_none=False": graphed_mlp_zero_grad_in_place,
    "torch.cuda.graph inference (ResNet-18)": cuda_graph_inference,
    "SDPA forward/backward": sdpa_attention,
    "nanoGPT loop with per-step pinned batches": nanogpt_pinned_batches,
    "double-buffered loader": double_buffered_loader,
    "prefetcher of randn().pin_memory() batches": prefetcher_pinned_randn,
    "autograd.Function and custom op on side streams": autograd_side_streams,
    "DDP on one NCCL rank": ddp_one_rank,
    "FSDP2 fully_shard on one NCCL rank": fsdp2_one_rank,
    "FSDP1 FullyShardedDataParallel on one NCCL rank": fsdp1_one_rank,
    "DataLoader pin_memory num_workers=2": dataloader_pinned_workers2,
    "torch.compile reduce-overhead LLM decode": compiled_llm_decode,
}


# ----------------------------------------------------------------------------------------------
# BUGS: planted bugs, each in a buggy and a fixed variant


def resnet_ema_without_wait(fixed: bool, widen: bool) -> bool:
    """Bug: a ResNet-18 training step, then the weights' EMA (`torch._foreach_lerp_`, as timm's
    ModelEmaV3 does) updated on a side stream that does not wait for the default stream, where
    `opt.step()` just wrote the weights: the EMA may read the weights before the update.
    Fix: `ema_stream.wait_stream(torch.cuda.current_stream())` first. Widened: the default stream
    spins before `opt.step()`. Reported: data-race at the `_foreach_lerp_`."""
    tv = _need("torchvision")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tv.models.resnet18(num_classes=10)
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.1)
    ema_stream = torch.cuda.Stream()
    g = _gen()
    x = torch.randn(8, 3, 32, 32, generator=g).cuda()
    y = torch.randint(0, 10, (8,), generator=g).cuda()
    F.cross_entropy(model(x), y).backward()
    before = [e.clone() for e in ema]
    if widen:
        torch.cuda._sleep(SLEEP)
    opt.step()
    if fixed:
        ema_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(ema_stream):
        torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - DECAY)  # RACE
    torch.cuda.current_stream().wait_stream(ema_stream)
    want = [b.lerp(p.detach(), 1 - DECAY) for b, p in zip(before, params)]
    return _all_close(ema, want, 1e-5)


def vit_batch_before_copy(fixed: bool, widen: bool) -> bool:
    """Bug: a timm ViT-Tiny trained on uint8 image batches copied to the GPU on a copy stream;
    the default stream normalizes the batch without waiting for its copy. Fix:
    `torch.cuda.current_stream().wait_stream(copy_stream)` before using it (`record_stream` is
    there in both variants). Widened: the copy stream spins before each copy. Reported:
    data-race at the normalization."""
    timm = _need("timm")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    copier = torch.cuda.Stream()
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    g = _gen()
    host = [torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=g).pin_memory() for _ in range(2)]
    y = torch.randint(0, 10, (4,), generator=g).cuda()
    seen = []
    for hb in host:
        with torch.cuda.stream(copier):
            if widen:
                torch.cuda._sleep(SLEEP)
            xb = hb.to("cuda", non_blocking=True)
        if fixed:
            torch.cuda.current_stream().wait_stream(copier)
        xb.record_stream(torch.cuda.current_stream())
        x = (xb.float() / 255 - mean) / std  # RACE
        seen.append(x.sum(dim=(1, 2, 3)))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    mean_h, std_h = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    want = [((hb.float() / 255 - mean_h) / std_h).sum(dim=(1, 2, 3)) for hb in host]
    return _close(torch.stack(seen).cpu(), torch.stack(want), 1e-4)


@_race_helpers(CudaPrefetcher)
def resnet_prefetcher_without_record_stream(fixed: bool, widen: bool) -> bool:
    """Bug: a ResNet-18 trained from `CudaPrefetcher` (the apex/timm prefetcher) with its
    `batch.record_stream(torch.cuda.current_stream())` dropped: each device batch is allocated on
    the copy stream and freed, after its use on the default stream, with nothing telling the
    allocator; two steps later the copy of a new batch gets its memory while the default stream
    may still read it. Fix: the `record_stream`. Widened: the default stream spins before the
    first step's use, so the copy of the fourth batch overwrites the first before it is read; the
    spin outlasts the host's queueing of two training steps (8 × SLEEP, about 200 ms: at 25 ms,
    a host that queued a step in more than about 12 ms read the first batch in time).
    Reported: reuse-race at the prefetcher's copy (`preload`), unsafe-free at the loop's line
    (where the old batch is freed)."""
    tv = _need("torchvision")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tv.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    g = _gen()
    host = [torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=g).pin_memory() for _ in range(4)]
    y = torch.randint(0, 10, (8,), generator=g).cuda()
    seen = []
    for i, batch in enumerate(CudaPrefetcher(host, record_stream=fixed)):  # RACE
        if widen and i == 0:
            torch.cuda._sleep(8 * SLEEP)
        seen.append(batch.sum())
        x = (batch.float() / 255 - mean) / std
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    del batch
    return torch.equal(torch.stack(seen).cpu(), torch.stack([h.sum() for h in host]))


def grad_offload_hook_without_wait(fixed: bool, widen: bool) -> bool:
    """Bug: a ResNet-18's gradients offloaded to pinned host memory as backward produces them
    (`register_post_accumulate_grad_hook`, a CPU-optimizer / ZeRO-offload pattern) by a D2H copy
    on a side stream, without waiting for the stream backward computed the gradient on. Fix:
    `side.wait_stream(torch.cuda.current_stream())` in the hook (the current stream there is the
    one autograd ran the gradient on). Widened: the default stream spins before `backward()`.
    Reported: data-race at the copy in the hook."""
    tv = _need("torchvision")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tv.models.resnet18(num_classes=10)
    side = torch.cuda.Stream()
    host = {p: torch.empty(p.shape, pin_memory=True) for p in model.parameters()}

    def offload(p):
        if fixed:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host[p].copy_(p.grad, non_blocking=True)  # RACE

    handles = [p.register_post_accumulate_grad_hook(offload) for p in model.parameters()]
    g = _gen()
    x = torch.randn(8, 3, 32, 32, generator=g).cuda()
    y = torch.randint(0, 10, (8,), generator=g).cuda()
    loss = F.cross_entropy(model(x), y)
    if widen:
        torch.cuda._sleep(SLEEP)
    loss.backward()
    side.synchronize()
    for h in handles:
        h.remove()
    return all(torch.equal(host[p], p.grad.cpu()) for p in model.parameters())


def nanogpt_loss_logged_before_sync(fixed: bool, widen: bool) -> bool:
    """Bug: nanoGPT's loop logs the loss without a blocking `.item()` on the GPU tensor: it
    copies it `non_blocking` into a pinned host scalar and reads that with `.item()` before the
    copy is done. Fix: an event recorded after the copy, synchronized before the read. Widened:
    the default stream spins before the forward. Reported: data-race at the host's read."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = _gen()
    data = _tokens(g)
    loss_host = torch.empty(1, pin_memory=True).fill_(float("nan"))
    copied = torch.cuda.Event()
    logged, true = [], []
    for _ in range(4):
        x, y = _get_batch(data, g)
        x, y = x.cuda(), y.cuda()
        if widen:
            torch.cuda._sleep(SLEEP)
        loss = model(x, y)
        true.append(loss.detach())
        loss_host.copy_(loss.detach(), non_blocking=True)
        copied.record()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if fixed:
            copied.synchronize()
        logged.append(loss_host.item())  # RACE
    torch.cuda.synchronize()
    return logged == [t.item() for t in true]


def checkpoint_pinned_without_sync(fixed: bool, widen: bool) -> bool:
    """Bug: a checkpoint staged asynchronously: after an AdamW step, every tensor of the
    state_dict is copied `.to("cpu", non_blocking=True)` (pinned host memory, the copy not done
    yet) and `torch.save`d into a BytesIO at once, before the copies end. Fix:
    `torch.cuda.current_stream().synchronize()` before saving. Widened: the default stream spins
    before `opt.step()`, so the copies, after it, run late. Reported (if the checker sees
    torch.save's reads of the host tensors, which are not aten ops): data-race at torch.save."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = _gen()
    x, y = _get_batch(_tokens(g), g)
    model(x.cuda(), y.cuda()).backward()
    if widen:
        torch.cuda._sleep(SLEEP)
    opt.step()
    staged = {k: v.detach().to("cpu", non_blocking=True) for k, v in model.state_dict().items()}
    if fixed:
        torch.cuda.current_stream().synchronize()
    buf = io.BytesIO()
    torch.save({"model": staged, "step": 1}, buf)  # RACE
    buf.seek(0)
    saved = torch.load(buf)["model"]
    return all(torch.equal(saved[k], v.cpu()) for k, v in model.state_dict().items())


def nanogpt_pinned_staging_refilled(fixed: bool, widen: bool) -> bool:
    """Bug: nanoGPT's get_batch through one persistent pinned staging buffer: each step the host
    writes the next batch into it and copies it `non_blocking` to the GPU; the next step's host
    write may come while the previous copy still reads it. Fix: an event recorded after the copy,
    synchronized before the host refills the buffer. Widened: the default stream spins before
    each copy. Reported: data-race at the host's refill."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = _gen()
    data = _tokens(g)
    staging = torch.empty(2, 8, 32, dtype=torch.long, pin_memory=True)
    copied = torch.cuda.Event()
    seen, want = [], []
    for it in range(3):
        x, y = _get_batch(data, g)
        want.append(x.sum() + y.sum())
        if fixed and it > 0:
            copied.synchronize()
        staging.copy_(torch.stack([x, y]))  # RACE
        if widen:
            torch.cuda._sleep(SLEEP)
        xy = staging.to("cuda", non_blocking=True)
        copied.record()
        seen.append(xy.sum())
        loss = model(xy[0], xy[1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return torch.equal(torch.stack(seen).cpu(), torch.stack(want))


@_race_helpers(SideStreamGradScale)
def autograd_backward_side_stream_without_wait(fixed: bool, widen: bool) -> bool:
    """Bug: an MLP trained 3 steps through `SideStreamGradScale`, whose backward, on autograd's
    device thread, scales the incoming gradient on a side stream without first making the side
    stream wait for the current stream, where autograd just launched the kernel that produces that
    gradient: the side stream may read it before it is written. Fix:
    `side.wait_stream(torch.cuda.current_stream())` first. Widened: the current stream spins in the
    backward before producing the gradient (`_SpinInBackward`), so the side stream reads memory
    the gradient is not in yet. Reported: data-race at the side stream's read (the backward's
    scaling)."""
    return _side_stream_grad_mlp(fixed, widen, False)


def graphed_mlp_batch_before_copy(fixed: bool, widen: bool) -> bool:
    """Bug: an MLP made a CUDA graph by `torch.cuda.make_graphed_callables`, trained on batches
    copied to the GPU on a copy stream; the graphed callable (whose first op copies the batch into
    its static input) is called without waiting for the copy. Fix:
    `torch.cuda.current_stream().wait_stream(copy_stream)`. Widened: the copy stream spins before
    each copy. Reported: data-race at the graphed call."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    graphed = _make_graphed(model, torch.randn(32, 64, device="cuda"))
    copier = torch.cuda.Stream()
    g = _gen()
    host = [torch.randn(32, 64, generator=g).pin_memory() for _ in range(2)]
    ys = [torch.randint(0, 10, (32,), generator=g).cuda() for _ in range(2)]
    outs = []
    for hb, y in zip(host, ys):
        with torch.cuda.stream(copier):
            if widen:
                torch.cuda._sleep(SLEEP)
            xb = hb.to("cuda", non_blocking=True)
        if fixed:
            torch.cuda.current_stream().wait_stream(copier)
        xb.record_stream(torch.cuda.current_stream())
        out = graphed(xb)  # RACE
        outs.append(out.detach().clone())
        loss = F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    routs = []
    for hb, y in zip(host, ys):
        out = ref(hb.cuda())
        routs.append(out.detach())
        loss = F.cross_entropy(out, y)
        ropt.zero_grad(set_to_none=True)
        loss.backward()
        ropt.step()
    return _all_close(outs, routs, 1e-4)


BUGS = {
    "ResNet-18 EMA on a side stream without wait_stream": resnet_ema_without_wait,
    "timm ViT batch used before its copy stream": vit_batch_before_copy,
    "ResNet-18 prefetcher without record_stream": resnet_prefetcher_without_record_stream,
    "grad offload hook on a side stream without wait": grad_offload_hook_without_wait,
    "nanoGPT loss read from pinned memory before sync": nanogpt_loss_logged_before_sync,
    "checkpoint staged to pinned memory and saved before sync": checkpoint_pinned_without_sync,
    "nanoGPT pinned staging buffer refilled too early": nanogpt_pinned_staging_refilled,
    "autograd.Function backward on a side stream without wait_stream": autograd_backward_side_stream_without_wait,
    "graphed MLP fed before its copy stream": graphed_mlp_batch_before_copy,
}


# The programs that capture CUDA graphs (under CSAN, a capture that fails can leave the process
# unusable: runners put them last, or in a process of their own).
CAPTURES = {graphed_mlp_batch_before_copy, graphed_mlp_set_to_none, graphed_mlp_zero_grad_in_place,
            cuda_graph_inference, compiled_llm_decode}


# The suites: "realcode" (the programs of this file), "compiled" (tests/python/realcode_compiled.py:
# torch.compile and user Triton kernels), "extra" (tests/python/realcode_extra.py: more library
# code paths) and "all" (every one, in that order; a program of two, compiled_llm_decode, once).
# The other files import this module, so they are imported on first use.
SUITES = ("realcode", "compiled", "extra", "all")


def _suite_module(name: str):
    """The module `name` (realcode_compiled or realcode_extra, beside this file)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        import os
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        return importlib.import_module(name)


def _compiled_suite():
    """The module realcode_compiled (beside this file)."""
    return _suite_module("realcode_compiled")


def _extra_suite():
    """The module realcode_extra (beside this file)."""
    return _suite_module("realcode_extra")


def _suite_parts(suite: str) -> list[tuple[dict, dict]]:
    """[(buggy-and-fixed programs, clean programs)] of `suite`, in suite order."""
    if suite == "realcode":
        return [(BUGS, CLEAN)]
    if suite == "compiled":
        rc = _compiled_suite()
        return [(rc.COMPILED_BUGS, rc.COMPILED_CLEAN)]
    if suite == "extra":
        rx = _extra_suite()
        return [(rx.EXTRA_BUGS, rx.EXTRA_CLEAN)]
    if suite == "all":
        return [part for s in ("realcode", "compiled", "extra") for part in _suite_parts(s)]
    raise ValueError(f"unknown suite {suite!r}: expected {', '.join(SUITES)}")


def captures(suite: str = "all") -> set:
    """The programs of `suite` that capture CUDA graphs: CAPTURES unless `suite` is "compiled" or
    "extra", and realcode_compiled's COMPILED_CAPTURES unless it is "realcode" or "extra" (none of
    realcode_extra's captures)."""
    if suite == "extra":
        return set()
    if suite == "realcode":
        return set(CAPTURES)
    if suite == "compiled":
        return set(_compiled_suite().COMPILED_CAPTURES)
    return set(CAPTURES) | set(_compiled_suite().COMPILED_CAPTURES)


def compiled_programs() -> set:
    """The program functions of the compiled suite (compiled_llm_decode among them), or an empty
    set when realcode_compiled cannot be imported."""
    try:
        rc = _compiled_suite()
    except Exception:  # noqa: BLE001
        return set()
    return set(rc.COMPILED_BUGS.values()) | set(rc.COMPILED_CLEAN.values())


def suite_of(fn) -> str:
    """"compiled" for a program of the compiled suite (it compiles: torch.compile or a Triton
    kernel; runners warm it up first), "extra" for one of realcode_extra's, else "realcode"."""
    if fn in compiled_programs():
        return "compiled"
    try:
        rx = _extra_suite()
        extra = set(rx.EXTRA_CLEAN.values()) | set(rx.EXTRA_BUGS.values())
    except Exception:  # noqa: BLE001 - realcode_extra cannot be imported here
        extra = set()
    return "extra" if fn in extra else "realcode"


def program_sets(which: str = "all") -> tuple[dict, dict]:
    """(buggy-and-fixed programs, clean programs): "all", "bugs" (no clean ones) or "clean" of
    this file's suite, "compiled" (realcode_compiled's COMPILED_BUGS and COMPILED_CLEAN) or
    "extra" (realcode_extra's EXTRA_BUGS and EXTRA_CLEAN)."""
    if which == "all":
        return BUGS, CLEAN
    if which == "bugs":
        return BUGS, {}
    if which == "clean":
        return {}, CLEAN
    if which in ("compiled", "extra"):
        return _suite_parts(which)[0]
    raise ValueError(f"unknown program set {which!r}: expected all, bugs, clean, compiled or extra")


def programs(only=None, graphs: str = "all", suite: str = "realcode") -> list[tuple[str, object, bool]]:
    """[(name, fn, clean)] of every program of `suite` (SUITES: "realcode", this file's, "compiled"
    or "all"), or of those named in `only` (each an exact name, or else every program whose name
    contains it, case-insensitively; no match raises ValueError). `graphs`: "all", "without" (no
    program that captures CUDA graphs: `captures(suite)`), "only" (those alone) or "last" (all,
    those last)."""
    out, have = [], set()
    for bugs, clean in _suite_parts(suite):
        for progs, is_clean in ((bugs, False), (clean, True)):
            for n, f in progs.items():
                if f not in have:
                    have.add(f)
                    out.append((n, f, is_clean))
    caps = captures(suite)
    if only:
        picked = []
        for want in only:
            exact = [p for p in out if p[0] == want]
            hits = exact or [p for p in out if want.lower() in p[0].lower()]
            if not hits:
                raise ValueError(f"no program named {want!r}; programs: {', '.join(p[0] for p in out)}")
            picked += [p for p in hits if p not in picked]
        out = picked
    if graphs == "without":
        return [p for p in out if p[1] not in caps]
    if graphs == "only":
        return [p for p in out if p[1] in caps]
    if graphs == "last":
        return [p for p in out if p[1] not in caps] + [p for p in out if p[1] in caps]
    if graphs != "all":
        raise ValueError(f"unknown graphs={graphs!r}: expected all, without, only or last")
    return out
