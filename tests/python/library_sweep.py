"""A sweep of library models under the check, on CPU tensors standing for device memory (the
recorders' `_fake_device`: one stream, no GPU needed): torchvision's classification models
(`tv`: each built with random weights, a forward and a backward on a small batch), torchvision's
other tasks (`tvx`: detection, instance segmentation and keypoints trained on random boxes, then
run in eval mode through their post-processing (NMS, RoIAlign: torchvision's own operators);
semantic segmentation; video classification; RAFT optical flow), timm's families (`timm`: one
model of each, at its own input size), transformers' architectures (`hf`: each from a tiny
config, a training step, then greedy and sampled `generate` for causal models, `generate` for
encoder-decoders; fifteen causal models again, generating with a static KV cache) and others (`misc`: torchaudio's models, PyTorch Geometric's GNNs, a Lightning
Trainer's loop).

    PYTHONPATH=SITE python tests/python/library_sweep.py native|python tv|tvx|timm|hf|misc [cuda] [compile]

On one stream nothing races and nothing is freed too early, so every report, crash or exception
under the check (a model that runs plain) is the recorder misreading an op.

With `cuda` the same models run on the GPU, checked for real (no stand-in device), fed as a
training loop feeds a model: each batch made in pinned host memory, copied on a side stream
(`non_blocking=True`) that the default stream then waits for, with `record_stream` on the copy
(the prefetcher of NVIDIA's Apex examples); two steps, the loss read with `.item()`, an SGD
step between them. That program is correct, so again every report is the recorder's. A model that fails
without the check is listed as skipped; each is bounded by 60 s. Exit status 1 when any checked
model reported an error. Needs torch and torchvision or transformers; the GPU machine's
versions, or `pip install --target SITE torchvision timm transformers` beside a CPU torch.
`tests/python/test_library_models_cpu.py` runs a few of these under pytest.

With `compile` (and `cuda`) four to six models of the set run `torch.compile`d (the default mode:
Inductor's Triton kernels, each launch recorded with its arguments' roles), compiled by the
plain run and run again compiled under the check, each given 300 s: compiled code no one here
wrote. For `hf` they are six causal models generating with a static KV cache, compiled by
transformers itself (`mode="reduce-overhead"`: CUDA graph trees captured and replayed under the
check). The Triton launches the C++ recorder saw are printed beside each model.
"""

import signal
import sys
import time
import warnings

import torch

import streamsan.torch
from realcode_report import _triton_launches  # the launches the C++ recorder saw

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
SETS = ("tv", "tvx", "timm", "hf", "misc")
if (
    len(sys.argv) not in (3, 4, 5)
    or sys.argv[1] not in ("native", "python")
    or sys.argv[2] not in SETS
    or sys.argv[3:] not in ([], ["cuda"], ["cuda", "compile"])
):
    sys.exit("usage: library_sweep.py native|python tv|tvx|timm|hf|misc [cuda [compile]]")
backend, which = sys.argv[1], sys.argv[2]
CUDA = sys.argv[3:4] == ["cuda"]
COMPILE = sys.argv[4:] == ["compile"]
if CUDA and not torch.cuda.is_available():
    sys.exit("library_sweep.py: `cuda` needs a GPU")
DEV = "cuda" if CUDA else "cpu"
LIMIT = 300 if COMPILE else 60  # seconds a model may take, each run (compiling, the first)
failed = []


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout()


signal.signal(signal.SIGALRM, _alarm)


def check(name, fn):
    """Runs `fn` plain (a failure skips the model), then under the check (a failure, a report or
    a timeout is the recorder's: the check may take `LIMIT` seconds more than ten times the plain
    run)."""
    t = time.time()
    try:
        signal.alarm(LIMIT)
        fn()
    except Exception as e:  # noqa: BLE001 - the model itself fails here, unchecked
        print(f"{name:28s} skipped: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return
    finally:
        signal.alarm(0)
    plain = time.time() - t
    t = time.time()
    try:
        signal.alarm(LIMIT + int(10 * plain))
        run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=not CUDA)
        with run:
            fn()
    except Exception as e:  # noqa: BLE001 - ran plain: under the check it is the recorder's
        failed.append(name)
        print(f"{name:28s} FAILED under the check: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return
    finally:
        signal.alarm(0)
    r = run.report
    launches = ""
    if COMPILE:
        n = _triton_launches(run) if backend == "native" else None
        launches = f" triton {'-' if n is None else n}"
    print(f"{name:28s} ops {r.ops:7d} errors {r.errors}{launches} {time.time() - t:.1f}s (plain {plain:.1f}s)",
          flush=True)
    if r.errors:
        failed.append(name)
        print(r.to_text()[:2000], flush=True)


def feed(make):
    """The batch `make()` builds on the host: as it is (CPU), or (`cuda`) made in pinned memory and
    copied to the GPU on a side stream the default stream then waits for, `record_stream` on the
    copy, as a prefetching loader does."""
    host = make()
    if not CUDA:
        return host
    host = host.pin_memory()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        batch = host.to("cuda", non_blocking=True)
    torch.cuda.current_stream().wait_stream(side)
    batch.record_stream(torch.cuda.current_stream())
    return batch


def compiled(m):
    """`m` as it runs: `torch.compile`d (the default mode) under `compile`."""
    return torch.compile(m) if COMPILE else m


def steps(model, one_step):
    """`one_step()` once (CPU), or (`cuda`) twice with an SGD step after each and the loss read
    with `.item()`, as a training loop does."""
    if not CUDA:
        one_step()
        return
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        loss = one_step()
        opt.step()
        loss.item()


def trained(m, loss_of):
    """`steps` of the model `m`, each `loss_of()`'s backward."""

    def one_step():
        loss = loss_of()
        loss.backward()
        return loss

    steps(m, one_step)


# Too large to build and run here in a few seconds.
TV_LARGE = ("vit_h", "vit_l", "regnet_y_128", "regnet_y_32", "regnet_y_16", "regnet_x_32", "regnet_x_16",
            "efficientnet_b5", "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_m", "efficientnet_v2_l",
            "convnext_base", "convnext_large", "swin_b", "swin_v2_b", "maxvit", "wide_resnet101", "resnet152",
            "resnext101", "vgg16", "vgg19")


def torchvision_model(name):
    import torchvision

    def fn():
        torch.manual_seed(0)
        kw = {"image_size": 64} if name.startswith("vit") else {}
        side = 64
        if name.startswith(("inception", "googlenet")):
            kw.update(aux_logits=False, init_weights=False)
        if name.startswith("inception"):
            side = 80
        elif name.startswith("swin_v2"):
            side = 96
        m = compiled(torchvision.models.get_model(name, weights=None, num_classes=10, **kw).to(DEV))

        def one_step():
            out = m(feed(lambda: torch.randn(2, 3, side, side)))
            if not torch.is_tensor(out):
                out = out[0]
            loss = out.float().logsumexp(-1).mean()
            loss.backward()  # `out` alive until after the backward
            return loss

        steps(m, one_step)

    return fn


TVX_DETECTION = ("fasterrcnn", "fcos", "keypointrcnn", "maskrcnn", "retinanet", "ssd")
# Large variants of the same code, and the quantized models (CPU only).
TVX_LARGE = ("deeplabv3_resnet101", "fcn_resnet101", "swin3d_s", "swin3d_b", "mvit_v1_b", "raft_large")


def _targets(name, side):
    """Two random boxes an image, with what the model's heads train on."""
    boxes = torch.tensor([[10.0, 20.0, 60.0, 90.0], [30.0, 30.0, 100.0, 110.0]])
    t = {"boxes": boxes, "labels": torch.tensor([1, 1 if name.startswith("keypointrcnn") else 2])}
    if name.startswith("maskrcnn"):
        masks = torch.zeros(2, side, side, dtype=torch.uint8)
        masks[0, 20:90, 10:60] = 1
        masks[1, 30:110, 30:100] = 1
        t["masks"] = masks
    if name.startswith("keypointrcnn"):
        kp = torch.tensor([[[20.0, 30.0, 1.0]] * 5, [[40.0, 50.0, 1.0]] * 5])
        t["keypoints"] = kp
    return {k: v.to(DEV) for k, v in t.items()}


def torchvision_task_model(name):
    """`tvx`: a torchvision model of another task than classification, trained two steps on random
    data and (detection) run in eval mode through its post-processing."""
    import torchvision

    def fn():
        torch.manual_seed(0)
        get = torchvision.models.get_model
        if name.startswith(TVX_DETECTION):
            side = 128
            kw = {"weights": None, "weights_backbone": None}
            if name.startswith("keypointrcnn"):
                kw["num_keypoints"] = 5
            else:
                kw["num_classes"] = 3
            if not name.startswith("ssd"):
                kw.update(min_size=side, max_size=160)
            m = get(name, **kw).to(DEV).train()
            images = [feed(lambda: torch.rand(3, side, side)) for _ in range(2)]
            targets = [_targets(name, side) for _ in images]
            trained(m, lambda: sum(m(images, targets).values()))
            with torch.no_grad():
                out = m.eval()(images)
            for o in out:
                for v in o.values():
                    v.sum().item()
            return
        if name.startswith(("deeplabv3", "fcn", "lraspp")):
            m = compiled(get(name, weights=None, weights_backbone=None, num_classes=3).to(DEV))
            trained(m, lambda: m(feed(lambda: torch.randn(2, 3, 64, 64)))["out"].float().logsumexp(1).mean())
            return
        if name.startswith("raft"):
            m = compiled(get(name, weights=None).to(DEV))
            a, b = feed(lambda: torch.rand(1, 3, 128, 128)), feed(lambda: torch.rand(1, 3, 128, 128))
            trained(m, lambda: m(a, b, num_flow_updates=4)[-1].abs().mean())
            return
        # video classification
        clip = (1, 3, 16, 224, 224) if name.startswith(("s3d", "mvit")) else (2, 3, 8, 64, 64)
        m = compiled(get(name, weights=None, num_classes=10).to(DEV))
        trained(m, lambda: m(feed(lambda: torch.randn(*clip))).float().logsumexp(-1).mean())

    return fn


TIMM_MODELS = """resnet18 resnet50d efficientnet_b0 mobilenetv3_small_100 mobilenetv4_conv_small convnext_atto
convnextv2_atto regnety_002 rexnet_100 ghostnet_100 mixnet_s densenet121 dla34 cspresnet50 hrnet_w18_small
res2net50_14w_8s resnest14d skresnet18 selecsls42b ese_vovnet19b_dw repvgg_a0 nf_resnet26 levit_128s
vit_tiny_patch16_224 deit_tiny_patch16_224 swin_tiny_patch4_window7_224 cait_xxs24_224 coat_lite_tiny
convit_tiny pit_ti_224 mobilevit_xxs mobilevitv2_050 efficientformer_l1 efficientformerv2_s0
edgenext_xx_small poolformer_s12 mixer_s16_224 resmlp_12_224 gmlp_ti16_224 eva02_tiny_patch14_224
xcit_nano_12_p16_224 maxvit_nano_rw_256 coatnet_nano_rw_224 fastvit_t8 repvit_m0_9 tiny_vit_5m_224 hgnetv2_b0
inception_v3 lcnet_050 tinynet_a mnasnet_small fbnetc_100 gernet_s regnetx_002 visformer_tiny sequencer2d_s
halonet26t botnet26t_256 lambda_resnet26t gcvit_xxtiny davit_tiny focalnet_tiny_srf nest_tiny pvt_v2_b0
inception_next_tiny twins_svt_small crossvit_tiny_240 volo_d1_224 deit3_small_patch16_224 efficientvit_b0
efficientvit_m0 fastvit_sa12 starnet_s1 mambaout_femto""".split()


def timm_model(name):
    """`timm`: one model of a timm family, random weights, trained two steps at its own input
    size."""
    import timm

    def fn():
        torch.manual_seed(0)
        m = timm.create_model(name, pretrained=False, num_classes=10).to(DEV)
        c, h, w = m.pretrained_cfg.get("input_size", (3, 224, 224))
        m = compiled(m)
        trained(m, lambda: m(feed(lambda: torch.randn(2, c, h, w))).float().logsumexp(-1).mean())

    return fn


def _audio(name):
    from torchaudio import models as A

    if name == "conformer":
        m = A.Conformer(input_dim=80, num_heads=4, ffn_dim=128, num_layers=2, depthwise_conv_kernel_size=31)
        lengths = torch.tensor([100, 80], device=DEV)
        return m.to(DEV), lambda x: m(x, lengths)[0], (2, 100, 80)
    if name == "emformer":
        m = A.Emformer(input_dim=80, num_heads=4, ffn_dim=128, num_layers=2, segment_length=4, right_context_length=1)
        lengths = torch.tensor([41, 33], device=DEV)
        return m.to(DEV), lambda x: m(x, lengths)[0], (2, 41, 80)
    if name == "conv_tasnet_base":
        m = A.conv_tasnet_base(num_sources=2)
        return m.to(DEV), m, (2, 1, 4000)
    if name == "hdemucs_low":
        m = A.hdemucs_low(sources=["a", "b"])
        return m.to(DEV), m, (1, 2, 8000)
    if name == "deepspeech":
        m = A.DeepSpeech(n_feature=40, n_hidden=64, n_class=10)
        return m.to(DEV), m, (2, 1, 50, 40)
    if name == "wav2letter":
        m = A.Wav2Letter(num_classes=10, input_type="waveform", num_features=1)
        return m.to(DEV), m, (2, 1, 4000)
    if name == "wavernn":
        m = A.WaveRNN(upsample_scales=[5, 5, 8], n_classes=64, hop_length=200, n_res_block=2, n_rnn=32, n_fc=32,
                      kernel_size=5, n_freq=32, n_hidden=32, n_output=32)
        mel = torch.randn(2, 1, 32, 6, device=DEV)
        return m.to(DEV), lambda x: m(x, mel), (2, 1, 200 * (6 - 4))
    m = getattr(A, name)(aux_num_out=10)  # wav2vec2_base, hubert_base, wavlm_base
    return m.to(DEV), lambda x: m(x)[0], (2, 8000)


def _graph(name):
    from torch_geometric import nn as G

    kw = dict(in_channels=16, hidden_channels=32, num_layers=2, out_channels=4)
    if name == "GAT":
        m = G.models.GAT(**kw, heads=2)
    elif name == "GATv2":
        m = G.models.GAT(**kw, heads=2, v2=True)
    elif name == "PNA":
        deg = torch.tensor([0, 10, 20, 30])
        m = G.models.PNA(**kw, aggregators=["mean", "min", "max", "std"], scalers=["identity", "amplification"],
                         deg=deg)
    else:  # GCN, GraphSAGE, GIN, EdgeCNN
        m = getattr(G.models, name)(**kw)
    m = m.to(DEV)
    edges = feed(lambda: torch.randint(0, 200, (2, 1000)))
    batch = (torch.arange(200, device=DEV) // 50)

    def run(x):
        return G.global_mean_pool(m(x, edges), batch)

    return m, run, (200, 16)


def _lightning(precision):
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 4, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16, pin_memory=CUDA)
    trainer = L.Trainer(accelerator="gpu" if CUDA else "cpu", devices=1, max_steps=3, precision=precision,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Module(), loader)


# `misc`: torchaudio's models, PyTorch Geometric's GNNs (scatter and segment reductions over a
# random graph, pooled by a batch vector), a Lightning Trainer's loop (32-bit and bf16-mixed).
AUDIO = ["wav2vec2_base", "hubert_base", "wavlm_base", "conformer", "emformer", "conv_tasnet_base", "hdemucs_low",
         "deepspeech", "wav2letter", "wavernn"]
GNNS = ["GCN", "GraphSAGE", "GIN", "GAT", "GATv2", "EdgeCNN", "PNA"]
MISC = AUDIO + GNNS + ["lightning 32-true", "lightning bf16-mixed"]


def misc_model(name):
    def fn():
        torch.manual_seed(0)
        if name.startswith("lightning"):
            _lightning(name.split()[1])
            return
        m, run, shape = (_graph if name in GNNS else _audio)(name)
        run_compiled = compiled(run)
        trained(m, lambda: run_compiled(feed(lambda: torch.randn(*shape))).float().logsumexp(-1).mean())

    return fn


# With `compile`: the models of each set compiled (a few: compiling takes tens of seconds each).
COMPILED = {
    "tv": ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "swin_t", "vit_b_16"],
    "tvx": ["deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large", "r3d_18", "raft_small"],
    "timm": ["vit_tiny_patch16_224", "convnext_atto", "efficientnet_b0", "mobilenetv4_conv_small",
             "swin_tiny_patch4_window7_224", "levit_128s"],
    # generate with a static KV cache: transformers compiles the forward itself on a GPU
    # (`mode="reduce-overhead"`: CUDA graph trees), the path its docs give for fast decoding
    "hf": ["llama+static", "mistral+static", "qwen2+static", "qwen3+static", "gemma2+static", "phi3+static"],
    "misc": [],
}


HF_TYPES = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3", "gemma",
            "gemma2", "falcon", "gpt_neox", "gpt_neo", "gptj", "opt", "bloom", "gpt2", "mpt", "olmo", "stablelm",
            "starcoder2", "granite", "cohere", "deepseek_v3", "bert", "roberta", "distilbert", "albert",
            "electra", "deberta-v2", "t5", "bart", "mbart"]


def _hf_config(tf, kind):
    kw = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "gpt2":
        kw = dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    elif kind == "t5":
        kw = dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, pad_token_id=0,
                  eos_token_id=2, decoder_start_token_id=0)
    elif kind in ("bart", "mbart"):
        kw = dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    elif kind == "gpt_neo":
        kw.update(attention_types=[[["global", "local"], 1]], num_layers=2, window_size=16)
    elif kind == "deepseek_v3":
        kw.update(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                  kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                  n_group=1, topk_group=1)
    elif kind in ("mixtral", "qwen2_moe", "qwen3_moe"):
        kw.update(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32)
    return tf.AutoConfig.for_model(kind, **kw)


def transformers_model(kind):
    import transformers as tf

    if kind.endswith("+static"):
        return _static_generate(tf, kind[: -len("+static")])

    def fn():
        torch.manual_seed(0)
        cfg = _hf_config(tf, kind)
        ids = feed(lambda: torch.randint(3, 128, (2, 10)))

        def train(m):
            trained(m, lambda: m(input_ids=ids, labels=ids).loss)

        if cfg.is_encoder_decoder:
            m = tf.AutoModelForSeq2SeqLM.from_config(cfg).to(DEV).train()
            train(m)
            with torch.no_grad():
                m.eval().generate(ids, max_new_tokens=4, do_sample=False)
            return
        try:
            m = tf.AutoModelForCausalLM.from_config(cfg).to(DEV).train()
        except ValueError:  # an encoder
            train(tf.AutoModelForMaskedLM.from_config(cfg).to(DEV).train())
            return
        train(m)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            m.eval().generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
            m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, top_k=10)

    return fn


def _static_generate(tf, kind):
    """Greedy `generate` with a static KV cache (`cache_implementation="static"`: the cache's
    tensors allocated once, written in place at each token's position). Eager, except under
    `compile`, where transformers compiles the forward itself (its auto-compile for a static
    cache on a GPU: `torch.compile(mode="reduce-overhead")`, CUDA graph trees). Under `compile`
    each run starts from `torch.compiler.reset()` with a model made anew, so the check's run
    compiles and captures its CUDA graphs under the check (graphs captured before a check are
    replayed unseen); the Triton launches printed say that it compiled."""

    def fn():
        if COMPILE:
            torch.compiler.reset()
        torch.manual_seed(0)
        cfg = _hf_config(tf, kind)
        ids = feed(lambda: torch.randint(3, 128, (2, 10)))
        m = tf.AutoModelForCausalLM.from_config(cfg).to(DEV).eval()
        with torch.no_grad():
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                       cache_implementation="static", disable_compile=not COMPILE)

    return fn


# The causal language models again, generating with a static KV cache.
HF_STATIC = [f"{k}+static" for k in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma",
                                      "gemma2", "gpt_neox", "gpt2", "olmo", "granite", "cohere", "starcoder2")]


if which == "tv":
    import torchvision

    names = [n for n in torchvision.models.list_models(module=torchvision.models) if not n.startswith(TV_LARGE)]
    build = torchvision_model
elif which == "tvx":
    import torchvision

    M = torchvision.models
    names = [n for mod in (M.detection, M.segmentation, M.video, M.optical_flow)
             for n in M.list_models(module=mod) if not n.startswith(TVX_LARGE)]
    build = torchvision_task_model
elif which == "timm":
    names, build = TIMM_MODELS, timm_model
elif which == "misc":
    names, build = MISC, misc_model
else:
    names, build = HF_TYPES + HF_STATIC, transformers_model
if COMPILE:
    if not COMPILED[which]:
        sys.exit(f"library_sweep.py: no compiled models for `{which}`")
    names = [n for n in COMPILED[which] if n in names]
for n in names:
    check(n, build(n))

print(f"{len(failed)} model(s) with reports: {', '.join(failed) or 'none'}")
sys.exit(1 if failed else 0)
