"""A sweep of library models under the check, on CPU tensors standing for device memory (the
recorders' `_fake_device`: one stream, no GPU needed): torchvision's classification models
(`tv`: each built with random weights, a forward and a backward on a small batch) and
transformers' architectures (`hf`: each from a tiny config, a training step, then greedy and
sampled `generate` for causal models, `generate` for encoder-decoders).

    PYTHONPATH=SITE python tests/python/library_sweep.py native|python tv|hf [cuda]

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
"""

import signal
import sys
import time
import warnings

import torch

import streamsan.torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
if (
    len(sys.argv) not in (3, 4)
    or sys.argv[1] not in ("native", "python")
    or sys.argv[2] not in ("tv", "hf")
    or sys.argv[3:] not in ([], ["cuda"])
):
    sys.exit("usage: library_sweep.py native|python tv|hf [cuda]")
backend, which = sys.argv[1], sys.argv[2]
CUDA = sys.argv[3:] == ["cuda"]
if CUDA and not torch.cuda.is_available():
    sys.exit("library_sweep.py: `cuda` needs a GPU")
DEV = "cuda" if CUDA else "cpu"
failed = []


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout()


signal.signal(signal.SIGALRM, _alarm)


def check(name, fn):
    """Runs `fn` plain (a failure skips the model), then under the check (a failure, a report or
    a timeout is the recorder's)."""
    try:
        signal.alarm(60)
        fn()
    except Exception as e:  # noqa: BLE001 - the model itself fails here, unchecked
        print(f"{name:28s} skipped: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return
    finally:
        signal.alarm(0)
    t = time.time()
    try:
        signal.alarm(60)
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
    print(f"{name:28s} ops {r.ops:7d} errors {r.errors} {time.time() - t:.1f}s", flush=True)
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
        m = torchvision.models.get_model(name, weights=None, num_classes=10, **kw).to(DEV)

        def one_step():
            out = m(feed(lambda: torch.randn(2, 3, side, side)))
            if not torch.is_tensor(out):
                out = out[0]
            loss = out.float().logsumexp(-1).mean()
            loss.backward()
            return loss

        steps(m, one_step)

    return fn


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

    def fn():
        torch.manual_seed(0)
        cfg = _hf_config(tf, kind)
        ids = feed(lambda: torch.randint(3, 128, (2, 10)))

        def train(m):
            def one_step():
                loss = m(input_ids=ids, labels=ids).loss
                loss.backward()
                return loss

            steps(m, one_step)

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


if which == "tv":
    import torchvision

    for n in torchvision.models.list_models(module=torchvision.models):
        if not n.startswith(TV_LARGE):
            check(n, torchvision_model(n))
else:
    for kind in HF_TYPES:
        check(kind, transformers_model(kind))

print(f"{len(failed)} model(s) with reports: {', '.join(failed) or 'none'}")
sys.exit(1 if failed else 0)
