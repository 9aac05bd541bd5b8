"""What the C++ recorder sees of a model's training step, with every op observed and with quiet
callees (docs/pytorch.md, "Quiet callees"): RecordFunction callbacks, records written, ops quiet
and the report's errors, for two steps checked after one unchecked. On the CPU (CPU tensors
standing for device memory, one intra-op thread) or on a GPU. A benchmark, not a test.

    python tests/python/count_callbacks.py vit|resnet|mlp [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os


def _workload(name: str, device: str):
    import torch

    torch.manual_seed(0)
    if name == "vit":
        import timm

        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)
        data, target = torch.randn(2, 3, 224, 224), torch.randint(0, 10, (2,))
        make_opt = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    elif name == "resnet":
        import torchvision

        model = torchvision.models.resnet18(num_classes=10)
        data, target = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
        make_opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    else:
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
        data, target = torch.randn(64, 1024), None
        make_opt = lambda p: torch.optim.SGD(p, lr=1e-3)  # noqa: E731
    model, data = model.to(device), data.to(device)
    target = target.to(device) if target is not None else None
    opt = make_opt(model.parameters())

    def step() -> None:
        opt.zero_grad()
        out = model(data)
        loss = torch.nn.functional.cross_entropy(out, target) if target is not None else out.square().mean()
        loss.backward()
        opt.step()

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["vit", "resnet", "mlp"])
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    import torch

    import streamsan.torch

    torch.set_num_threads(1)
    step = _workload(a.workload, a.device)
    step()
    out: dict = {}
    for mode in ("all", "learn"):
        os.environ["STREAMSAN_CALLEES"] = mode
        run = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=a.device == "cpu",
                                  _profile="1")
        with run:
            step()
            step()
            if a.device != "cpu":
                torch.cuda.synchronize()
            s = run.stats()
        out[mode] = {"callbacks": s["recorder_profile_callbacks"], "records": s["recorder_profile_ops"],
                     "quiet_ops": s["recorder_quiet_ops"], "errors": run.report.errors}
    print(json.dumps({"workload": a.workload, "device": a.device, **out}))


if __name__ == "__main__":
    main()
