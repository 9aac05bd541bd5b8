"""More real code, in the conventions of realcode.py (read its docstring: `fn(fixed, widen) ->
bool`, `widen`, `_gen()`, "needs X"): library code paths the first suite does not take, each a
correct program a checker must report nothing for.

- `EXTRA_CLEAN`: torchvision's Faster R-CNN trained (custom ops: `torchvision::nms`,
  `roi_align`; data-dependent shapes, so device-to-host reads inside the model), a transformers
  BERT trained under bf16 autocast with the fused AdamW kernel, a training loop timed with CUDA
  events whose losses are logged through pinned memory (an event polled with `query()`, then
  `synchronize()`), DDP with `no_sync()` gradient accumulation and gradients as bucket views, timm
  EfficientNet-B0 in channels_last under fp16 autocast with a GradScaler and a model EMA.

realcode.programs(suite="extra") (or "all") selects them; realcode_report.py and gpu_realcode.sh
run them with REALCODE_SET=extra|all.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from realcode import SLEEP, _all_close, _close, _finite, _gen, _mlp, _need, _one_rank_group


def detection_training(fixed: bool, widen: bool) -> bool:
    """torchvision Faster R-CNN (MobileNetV3-Large 320 FPN, random weights, 5 classes) trained 2
    SGD steps on two 3x128x128 images with two boxes each; right when every loss is finite. Its
    proposals, NMS and RoI pooling run custom ops with shapes known only on the device (the
    sizes of what survives NMS are read back by the host inside the model)."""
    tv = _need("torchvision")
    torch.manual_seed(0)
    model = tv.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    g = _gen()
    images = [torch.rand(3, 128, 128, generator=g).cuda() for _ in range(2)]
    targets = []
    for _ in range(2):
        xy = torch.rand(2, 2, generator=g) * 64
        wh = torch.rand(2, 2, generator=g) * 48 + 16
        boxes = torch.cat([xy, xy + wh], dim=1)
        labels = torch.randint(1, 5, (2,), generator=g)
        targets.append({"boxes": boxes.cuda(), "labels": labels.cuda()})
    losses = []
    for _ in range(2):
        parts = model(images, targets)
        loss = sum(parts.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return _finite(losses)


def bert_fused_adamw_bf16(fixed: bool, widen: bool) -> bool:
    """transformers BERT (random, 2 layers, hidden 128, vocabulary 512, no dropout) for sequence
    classification trained 3 steps under `torch.autocast("cuda", torch.bfloat16)` with
    `AdamW(fused=True)` (one fused kernel updates every parameter) and gradient clipping; right
    when the losses are finite and close to those of a twin trained the same way with the
    default (foreach) AdamW."""
    tf = _need("transformers")
    cfg = tf.BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=64, num_labels=3,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(cfg).cuda().train()
    twin = copy.deepcopy(model)
    g = _gen()
    ids = torch.randint(1, 512, (4, 16), generator=g).cuda()
    labels = torch.randint(0, 3, (4,), generator=g).cuda()
    mask = torch.ones_like(ids)
    runs = []
    for m, fused in ((model, True), (twin, False)):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=fused)
        losses = []
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach().float())
        runs.append(torch.stack(losses))
    return _finite(runs[0]) and _close(runs[0], runs[1], 5e-2)


def event_timed_async_logging(fixed: bool, widen: bool) -> bool:
    """A training loop timed with CUDA events (`Event(enable_timing=True)` around each step,
    `elapsed_time` after `synchronize()`) that logs each step's loss without stalling: the loss
    goes to a slot of a pinned host buffer by a non_blocking copy, an event is recorded after it,
    and the host reads the slot only once that event is done (polled with `query()` a bounded
    number of times, then `synchronize()`). Widened: the default stream spins before each copy,
    so a host read before the event would see a stale slot. Right when the logged losses are the
    device's and every step's time is positive."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = _gen()
    xs = [torch.randn(32, 64, generator=g).cuda() for _ in range(4)]
    ys = [torch.randint(0, 10, (32,), generator=g).cuda() for _ in range(4)]
    slots = torch.full((4,), float("nan"), pin_memory=True)
    logged, kept, times = [], [], []
    pending = None
    for step, (x, y) in enumerate(zip(xs, ys)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        end.record()
        if widen:
            torch.cuda._sleep(SLEEP)  # the copy into the slot runs late
        slots[step].copy_(loss.detach(), non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        kept.append(loss.detach())
        if pending is not None:  # the previous step's loss, once its copy is done
            prev_done, prev_step = pending
            for _ in range(1000):
                if prev_done.query():
                    break
            prev_done.synchronize()
            logged.append(float(slots[prev_step]))
        pending = (done, step)
        end.synchronize()
        times.append(start.elapsed_time(end))
    prev_done, prev_step = pending
    prev_done.synchronize()
    logged.append(float(slots[prev_step]))
    want = [float(v) for v in torch.stack(kept).cpu()]
    return logged == want and all(t > 0 for t in times)


def ddp_no_sync_accumulation(fixed: bool, widen: bool) -> bool:
    """DistributedDataParallel over a one-rank NCCL group with `gradient_as_bucket_view=True`
    (the gradients are views into DDP's communication buckets), two micro-batches a step, the
    first under `no_sync()` (no all-reduce: the gradients accumulate), 3 SGD steps; right when
    the weights are those of the same MLP trained without DDP on the same micro-batches."""
    _one_rank_group()
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _mlp()
    ref = copy.deepcopy(model)
    ddp = DDP(model, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = _gen()
    for _ in range(3):
        micro = [(torch.randn(16, 64, generator=g).cuda(), torch.randint(0, 10, (16,), generator=g).cuda())
                 for _ in range(2)]
        opt.zero_grad(set_to_none=False)
        with ddp.no_sync():
            F.cross_entropy(ddp(micro[0][0]), micro[0][1]).backward()
        F.cross_entropy(ddp(micro[1][0]), micro[1][1]).backward()
        opt.step()
        ropt.zero_grad(set_to_none=False)
        for x, y in micro:
            F.cross_entropy(ref(x), y).backward()
        ropt.step()
    return _all_close(model.parameters(), ref.parameters(), 1e-5)


def timm_efficientnet_amp_ema(fixed: bool, widen: bool) -> bool:
    """timm EfficientNet-B0 (random weights, 10 classes) in channels_last trained 2 SGD steps
    under `torch.autocast("cuda", torch.float16)` with a `torch.amp.GradScaler`, a model EMA
    (timm's ModelEmaV3, or V2) updated after each step, then the EMA model evaluated; right when
    the losses, the scale and the EMA's outputs are finite."""
    timm = _need("timm")
    from timm import utils as tu

    torch.manual_seed(0)
    model = timm.create_model("efficientnet_b0", pretrained=False, num_classes=10).cuda()
    model = model.to(memory_format=torch.channels_last).train()
    ema_cls = getattr(tu, "ModelEmaV3", None) or tu.ModelEmaV2
    ema = ema_cls(model, decay=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    g = _gen()
    x = torch.randn(4, 3, 64, 64, generator=g).cuda().to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (4,), generator=g).cuda()
    losses = []
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        ema.update(model)
        losses.append(loss.detach().float())
    with torch.no_grad():
        out = ema.module.eval()(x)
    return _finite(losses) and bool(torch.isfinite(out).all()) and scaler.get_scale() > 0


EXTRA_BUGS: dict = {}

EXTRA_CLEAN = {
    "torchvision Faster R-CNN training": detection_training,
    "transformers BERT with fused AdamW under bf16 autocast": bert_fused_adamw_bf16,
    "CUDA-event timing and pinned loss logging": event_timed_async_logging,
    "DDP no_sync gradient accumulation (bucket views)": ddp_no_sync_accumulation,
    "timm EfficientNet-B0 channels_last fp16 with EMA": timm_efficientnet_amp_ema,
}
