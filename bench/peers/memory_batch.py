#!/usr/bin/env python3
"""The largest W8 batch whose training step fits a fixed memory: duet beside PyTorch (bench MB).

duet's rows come from `duet_bench --only MB` (bench/memory.cpp): eager, compiled, each with
duet::checkpoint around the blocks, and compiled under CompileOptions::memory_budget. Here the
same step runs in PyTorch (the pinned version of peers.py, in its venv): eager and torch.compile,
each with and without torch.utils.checkpoint(use_reentrant=False) around the blocks, zero_grad(
set_to_none=True) and AdamW, as peers.py's W8 writes it. Each (mode, batch) runs in a process of
its own, on 2 threads, with glibc's mmap threshold fixed (MALLOC_MMAP_THRESHOLD_), so that large
buffers go back to the system when freed and the resident set follows what is live. After three
steps (torch.compile compiles in the first), a thread samples the resident set during one more
step: its peak above the resident set before that step is the figure, as duet_bench measures its
own with its allocator (the memory a step holds beyond what was allocated before it: the
gradients freed by zero_grad come back during the step, so they count in both). Not part of CI.

Usage, from the repository root:
  python3 bench/peers/memory_batch.py [--duet build/bench/duet_bench] [--budget-mib 256]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the venv and the pinned versions)

BATCHES = [8, 16, 24, 32, 48, 64, 80, 96, 112, 128]
MODES = ["eager", "eager checkpoint", "compiled", "compiled checkpoint"]


def probe(mode, batch):
    """One step's resident-set peak in MiB (run inside the venv's python)."""
    import threading
    import time

    import torch
    import torch.nn as nn
    import torch.utils.checkpoint as ckpt

    torch.set_num_threads(2)
    c = peers.W8_CFG

    torch.manual_seed(81)
    model = peers.torch_w8_model(torch)
    tok, blocks, ln_f, head = model.tok, model.blocks, model.ln_f, model.head
    opt = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, c["vocab"], (batch, c["seq"] + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    mask = nn.Transformer.generate_square_subsequent_mask(c["seq"])
    checkpointed = "checkpoint" in mode

    def step():
        opt.zero_grad(set_to_none=True)
        h = tok(x)
        for b in blocks:
            h = ckpt.checkpoint(b, h, mask, use_reentrant=False) if checkpointed else b(h, mask)
        logits = head(ln_f(h))
        loss = nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    if mode.startswith("compiled"):
        step = torch.compile(step)
    for _ in range(3):
        step()
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    before = rss()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.0002)

    t = threading.Thread(target=sample)
    t.start()
    step()
    done.set()
    t.join()
    peak[0] = max(peak[0], rss())
    return (peak[0] - before) / 2**20


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duet", default=os.path.join(peers.ROOT, "build", "bench", "duet_bench"))
    p.add_argument("--budget-mib", type=float, default=256)
    p.add_argument("--probe", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.probe:
        print(json.dumps(probe(a.probe[0], int(a.probe[1]))))
        return 0
    raw = subprocess.run([a.duet, "--only", "MB", "--reps", "1", "--json"], check=True,
                         capture_output=True, text=True).stdout
    duet = [r for r in json.loads(raw) if r["workload"] == "MB"]
    python = peers.peer_python("cpu")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="2")
    torch_rows = {}
    for mode in MODES:
        for b in BATCHES:
            out = subprocess.run([python, __file__, "--probe", mode, str(b)], env=env,
                                 capture_output=True, text=True)
            mib = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
            torch_rows[(mode, b)] = mib
            print(f"torch {mode} batch {b}: "
                  f"{'failed: ' + out.stderr[-300:] if mib is None else f'{mib:.1f} MiB'}",
                  file=sys.stderr, flush=True)
    version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"\nW8 training step memory (MiB above what was allocated before it), batch by batch; "
          f"the largest batch within {a.budget_mib:.0f} MiB; duet beside torch {version}, CPU, "
          f"2 threads\n")
    duet_modes = ["eager", "eager checkpoint", "compiled", "compiled checkpoint",
                  "compiled budget"]
    print(f"{'':28}" + "".join(f"{b:>9}" for b in BATCHES) + "   largest")
    for m in duet_modes:
        vals = {int(r["n"]): r["median"] for r in duet if r["mode"] == m and r["metric"] ==
                "step_peak_MiB"}
        largest = next((r["median"] for r in duet if r["mode"] == m and r["metric"] ==
                        "largest_batch"), 0)
        print(f"{'duet ' + m:28}" + "".join(
            f"{vals.get(b, -1):>9.1f}" if vals.get(b, -1) >= 0 else f"{'-':>9}" for b in BATCHES)
            + f"{int(largest):>10}")
    for m in MODES:
        vals = [torch_rows[(m, b)] for b in BATCHES]
        fits = [b for b, v in zip(BATCHES, vals) if v is not None and v <= a.budget_mib]
        name = "torch " + m.replace("compiled", "torch.compile")
        print(f"{name:28}" + "".join(f"{v:>9.1f}" if v is not None else f"{'-':>9}"
                                     for v in vals) + f"{max(fits) if fits else 0:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
