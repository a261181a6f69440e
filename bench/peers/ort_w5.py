#!/usr/bin/env python3
"""W5 (batch-1 MLP forward, docs/benchmarks.md) in duet and in ONNX Runtime, in one run.

Runs `duet_bench --only W5 --json` with DUET_BENCH_W5_ONNX set, so that duet_bench writes the
compiled W5 function as an ONNX model (duet::export_onnx), then times that model in ONNX Runtime
on the same machine right after, with as many threads as duet used. The ONNX Runtime figure
includes the Python call of InferenceSession.run (a few microseconds); duet's rows are timed in
C++. Each rep times 200 back-to-back calls; the figure is the median of the reps.

Not part of CI. Pinned peer: onnxruntime 1.20.1 (the venv tools/setup_deps.sh makes,
.venv-onnx). Usage, from the repository root:
  .venv-onnx/bin/python bench/peers/ort_w5.py [--bench build/bench/duet_bench] [--reps 15]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build/bench/duet_bench")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model = os.path.join(tempfile.mkdtemp(), "w5.onnx")
    env = dict(os.environ, DUET_BENCH_W5_ONNX=model)
    out = subprocess.run([a.bench, "--only", "W5", "--json", "--threads", str(a.threads)],
                         env=env, check=True, capture_output=True, text=True).stdout
    rows = [r for r in json.loads(out) if r["metric"] == "us_per_call"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    for _ in range(200):
        s.run(None, {name: x})
    calls, reps = 200, []
    for _ in range(a.reps):
        t = time.perf_counter()
        for _ in range(calls):
            s.run(None, {name: x})
        reps.append((time.perf_counter() - t) / calls * 1e6)
    print(f"W5, batch-1 MLP forward, {a.threads} threads, us per call (median, min, max):")
    for r in rows:
        label = r["mode"] + (f" ({r['variant']})" if "variant" in r else "")
        print(f"  duet {label:32s} {r['median']:8.1f} {r['min']:8.1f} {r['max']:8.1f}")
    print(f"  onnxruntime {ort.__version__:27s} {statistics.median(reps):8.1f} "
          f"{min(reps):8.1f} {max(reps):8.1f}")


if __name__ == "__main__":
    sys.exit(main())
