"""Library models under the check on CPU tensors standing for device memory (`_fake_device`: one
stream, no GPU needed): torchvision (detection with masks, a shifted-window transformer,
optical flow, video), timm, transformers' `generate` in its decoding modes and a fused-AdamW
training step, and the odd corners of plain PyTorch (`copy.deepcopy`, `resize_`, in-place
metadata ops, RNNs, checkpointing, `torch.save`).

On one stream nothing can race and nothing is freed too early, so every report here is the
recorder misreading an op; and the check must come through what these libraries do to tensors
(`copy.deepcopy` of a model once crashed the C++ recorder). A test whose library is not
installed is skipped (CI has none of them; the GPU machine has all three).
"""

from __future__ import annotations

import copy
import importlib.util
import os

import pytest

from conftest import torch_or_skip


def _need(module: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    return importlib.import_module(module)


def _maskrcnn():
    import torch

    tv = _need("torchvision")
    torch.manual_seed(0)
    m = tv.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3,
                                                  min_size=96, max_size=96).train()
    imgs = [torch.rand(3, 96, 96)]
    masks = torch.zeros(1, 96, 96, dtype=torch.uint8)
    masks[0, 10:60, 10:60] = 1
    targets = [{"boxes": torch.tensor([[10.0, 10.0, 60.0, 60.0]]), "labels": torch.tensor([1]), "masks": masks}]
    sum(m(imgs, targets).values()).backward()
    m.eval()
    with torch.no_grad():
        m(imgs)


def _swin_with_ema():
    import torch

    tv = _need("torchvision")
    torch.manual_seed(0)
    m = tv.models.swin_t(weights=None, num_classes=10)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(2, 3, 64, 64)
    for _ in range(2):
        loss = m(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ema = copy.deepcopy(m)
    with torch.no_grad():
        for p, q in zip(ema.parameters(), m.parameters()):
            p.lerp_(q, 0.1)


def _timm_efficientnet_ema():
    import torch
    import torch.nn.functional as F

    timm = _need("timm")
    from timm import utils as tu

    torch.manual_seed(0)
    m = timm.create_model("efficientnet_b0", pretrained=False, num_classes=10).to(memory_format=torch.channels_last)
    ema = (getattr(tu, "ModelEmaV3", None) or tu.ModelEmaV2)(m, decay=0.9)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)
    for _ in range(2):
        loss = F.cross_entropy(m(x), torch.tensor([1, 2]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(m)


def _llama_generate():
    import torch

    tf = _need("transformers")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    m = tf.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 256, (2, 8))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        m.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20, top_p=0.9, temperature=0.7)
        m.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2, do_sample=False)
        m.generate(ids, attention_mask=mask, max_new_tokens=6, cache_implementation="static")


def _t5_generate():
    import torch

    tf = _need("transformers")
    torch.manual_seed(0)
    cfg = tf.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    m = tf.T5ForConditionalGeneration(cfg).eval()
    ids = torch.randint(3, 256, (2, 8))
    with torch.no_grad():
        m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)


def _bert_fused_adamw():
    import torch

    tf = _need("transformers")
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=3)
    m = tf.BertForSequenceClassification(cfg).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(3, 256, (2, 12))
    for _ in range(2):
        loss = m(input_ids=ids, labels=torch.tensor([0, 2])).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def _plain_pytorch(tmp_path):
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    out, _ = lstm(torch.randn(3, 5, 8))
    out.sum().backward()
    bag = nn.EmbeddingBag(50, 8, mode="mean")
    bag(torch.randint(0, 50, (10,)), torch.tensor([0, 4])).sum().backward()
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2)
    enc(torch.randn(2, 6, 16)).sum().backward()
    lin = nn.Linear(8, 8)
    checkpoint(lambda z: lin(z).relu(), torch.randn(4, 8, requires_grad=True), use_reentrant=False).sum().backward()
    torch.nn.utils.clip_grad_norm_(lin.parameters(), 1.0)
    a = torch.randn(16, 16)
    a.resize_(32, 32)
    a.resize_(4)
    a.unsqueeze_(0).t_()
    a.set_(torch.ones(8).untyped_storage())
    a.add_(1)
    state = copy.deepcopy(lin.state_dict())
    lin.load_state_dict(state)
    path = os.path.join(tmp_path, "state.pt")
    torch.save(state, path)
    torch.load(path)


def _raft_and_video():
    import torch

    tv = _need("torchvision")
    torch.manual_seed(0)
    flow = tv.models.optical_flow.raft_small(weights=None)
    a, b = torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128)
    flow(a, b, num_flow_updates=2)[-1].abs().mean().backward()
    video = tv.models.video.r2plus1d_18(weights=None, num_classes=4)
    video(torch.randn(1, 3, 4, 32, 32)).logsumexp(-1).mean().backward()


PROGRAMS = {  # name: (program, the library it needs)
    "torchvision Mask R-CNN train and eval": (_maskrcnn, "torchvision"),
    "torchvision Swin-T AdamW and a deep-copied EMA": (_swin_with_ema, "torchvision"),
    "torchvision RAFT optical flow and R(2+1)D video": (_raft_and_video, "torchvision"),
    "timm EfficientNet-B0 channels_last with ModelEma": (_timm_efficientnet_ema, "timm"),
    "transformers Llama generate (greedy, sampling, beams, static cache)": (_llama_generate, "transformers"),
    "transformers T5 generate": (_t5_generate, "transformers"),
    "transformers BERT fused AdamW": (_bert_fused_adamw, "transformers"),
    "plain PyTorch corners": (_plain_pytorch, None),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_library_model_checks_clean_on_one_stream(backend, name, tmp_path):
    torch_or_skip()
    import streamsan.torch

    fn, library = PROGRAMS[name]
    if library:
        _need(library)  # a missing library skips before the check starts
    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
    with run:
        if fn is _plain_pytorch:
            fn(tmp_path)
        else:
            fn()
    assert run.backend == backend
    assert run.report.ops > 0
    assert run.report.errors == 0, run.report.to_text()
