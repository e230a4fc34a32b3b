"""Kernels per step, eager vs torch.compile(backend="fl"), and what each new pass contributes.

    python bench/bench_dynamo_passes.py                      # every bundled backend
    python bench/bench_dynamo_passes.py --backends rocm cpu

Workloads: BERT-tiny (Hugging Face BertModel, 2 layers, hidden 128, 2 heads,
intermediate 512, dropout 0.1 as configured by default; batch 2, sequence 32)
training step (forward + backward of last_hidden_state.square().mean()), and a
small conv net (conv-bn-relu, conv-relu, pool, linear; batch 2, 3x32x32) in
training and in eval under no_grad. Columns: eager, compiled with every pass,
compiled with one of qkv / pointwise / linear_act / add_norm switched off. Kernel counts
are torch_fl.profile()'s launches for one step after a warm-up step; they are
deterministic (no timing)."""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torch_fl as fl
from torch_fl.compile import dynamo as fl_dynamo


def bert_tiny() -> nn.Module:
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=64,
    )
    return transformers.BertModel(cfg)


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def kernels(net, step) -> int:
    step(net)
    with fl.profile() as prof:
        step(net)
    return prof.kernels


def run(backend: str) -> list[tuple]:
    fl.set_backend(backend)
    torch.manual_seed(0)
    rows = []
    bert = bert_tiny().to("fl").train()
    ids = torch.randint(0, 1000, (2, 32)).to("fl")

    def bert_step(net):
        net(input_ids=ids).last_hidden_state.square().mean().backward()

    cnn = conv_net().to("fl")
    images = torch.randn(2, 3, 32, 32).to("fl")

    def cnn_train(net):
        net(images).square().mean().backward()

    def cnn_eval(net):
        with torch.no_grad():
            net(images)

    for name, model, step, train in (
        ("BERT-tiny train", bert, bert_step, True),
        ("conv net train", cnn, cnn_train, True),
        ("conv net eval", cnn, cnn_eval, False),
    ):
        model.train(train)
        counts = [kernels(model, step)]
        for off in (None, "qkv", "pointwise", "linear_act", "add_norm"):
            fl_dynamo.reset()
            opts = {"passes": {off: False}} if off else None
            counts.append(kernels(torch.compile(model, backend="fl", options=opts), step))
        rows.append((name, backend, *counts))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["cpu", "rocm", "ascend", "minimal"])
    args = ap.parse_args()
    print(
        f"{'workload':<16} {'backend':<8} {'eager':>6} {'fl':>6} {'-qkv':>6} {'-pointwise':>10} {'-linear_act':>11} "
        f"{'-add_norm':>9}"
    )
    for backend in args.backends:
        for name, be, eager, full, no_qkv, no_pw, no_la, no_an in run(backend):
            print(f"{name:<16} {be:<8} {eager:>6} {full:>6} {no_qkv:>6} {no_pw:>10} {no_la:>11} {no_an:>9}")


if __name__ == "__main__":
    main()
