#!/usr/bin/env python3
"""PyTorch peers of duet_bench's training steps W4 and W6, for the same machine and run.

W4: MLP 784-1024-1024-10, ReLU, batch 256, softmax cross-entropy, SGD lr 0.01.
W6: 20 x (Linear(64, 64) + tanh), batch 8, MSE against a fixed random target, SGD lr 0.01.
One step is forward, backward and the update, written as a PyTorch user writes it
(nn.Sequential, torch.optim.SGD, zero_grad(set_to_none=True)). Modes: "eager", and
"reduce-overhead" (torch.compile(mode="reduce-overhead") over the whole step, which replays a
CUDA graph). Each rep times enough back-to-back steps to take tens of milliseconds (CUDA events
on CUDA, perf_counter on the CPU); the figure is the median of the reps, with min and max.

Not part of CI. Pinned peer: torch 2.11 (the version the GPU machines carry); the script
records torch.__version__ in every row and warns on another version.

Usage: torch_steps.py [--device cuda|cpu] [--only W4,W6] [--modes eager,reduce-overhead]
                      [--reps N] [--json]
Rows, one JSON object per line with --json, use duet_bench's keys:
  {"workload": "W6cuda", "mode": "torch_eager", "device": "cuda", "metric": "us_per_step",
   "median": ..., "min": ..., "max": ..., "peer": "torch 2.11.0+cu130", ...}
plus "first_call_s" rows: the seconds of the first step (torch.compile's compile and capture).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn

PINNED = "2.11"


def model_w4():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10)), 256, 784, "ce"


def model_w6():
    layers = []
    for _ in range(20):
        layers += [nn.Linear(64, 64), nn.Tanh()]
    return nn.Sequential(*layers), 8, 64, "mse"


def make_step(model, opt, loss_kind):
    loss_fn = nn.CrossEntropyLoss() if loss_kind == "ce" else nn.MSELoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def timer(device):
    if device == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)

        def run(body, calls):
            start.record()
            for _ in range(calls):
                body()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) * 1e-3 / calls

        return run

    def run_cpu(body, calls):
        t0 = time.perf_counter()
        for _ in range(calls):
            body()
        return (time.perf_counter() - t0) / calls

    return run_cpu


def bench(workload, mode, device, reps):
    torch.manual_seed(42)
    model, batch, nin, loss_kind = model_w4() if workload == "W4" else model_w6()
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, nin, device=device)
    if loss_kind == "ce":
        y = torch.randint(0, 10, (batch,), device=device)
    else:
        y = torch.randn(batch, 64, device=device)
    step = make_step(model, opt, loss_kind)
    if mode == "reduce-overhead":
        step = torch.compile(step, mode="reduce-overhead")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    step(x, y)
    sync()
    first = time.perf_counter() - t0
    for _ in range(5):  # cudagraph trees record on a later call than the first
        step(x, y)
    sync()
    run = timer(device)
    one = run(lambda: step(x, y), 3)
    calls = max(3, min(2000, int(0.03 / max(one, 1e-7))))
    times = [run(lambda: step(x, y), calls) for _ in range(reps)]
    return times, first


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--only", default="W4,W6")
    p.add_argument("--modes", default="eager,reduce-overhead")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_steps: no CUDA device", file=sys.stderr)
        return 1
    if not torch.__version__.startswith(PINNED):
        print(f"torch_steps: warning: torch {torch.__version__}, pinned {PINNED}", file=sys.stderr)
    peer = f"torch {torch.__version__}"
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else ""
    for w in a.only.split(","):
        unit, metric = (1e3, "ms_per_step") if w == "W4" else (1e6, "us_per_step")
        name = w + ("cuda" if a.device == "cuda" else "")
        for mode in a.modes.split(","):
            times, first = bench(w, mode, a.device, a.reps)
            v = [t * unit for t in times]
            row = {"workload": name, "mode": "torch_" + mode.replace("-", "_"),
                   "device": a.device, "metric": metric, "median": statistics.median(v),
                   "min": min(v), "max": max(v), "reps": a.reps, "peer": peer, "gpu": gpu}
            first_row = dict(row, metric="first_call_s", median=first, min=first, max=first)
            for r in (row, first_row):
                if a.json:
                    print(json.dumps(r), flush=True)
            print(f"{name} {peer} {mode}: {row['median']:.1f} {metric} "
                  f"(min {row['min']:.1f}, max {row['max']:.1f}); first step {first:.2f} s",
                  file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
