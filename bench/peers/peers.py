#!/usr/bin/env python3
"""duet_bench's workloads in PyTorch 2 and JAX, beside duet, from one run.

Runs `duet_bench --json` and then the same workloads (docs/benchmarks.md) in
  - PyTorch eager, and torch.compile over the whole step (mode "default" on the CPU,
    "reduce-overhead" on CUDA, where it replays a CUDA graph);
  - JAX, jax.jit over the whole step (parameters donated, so updates reuse their buffers);
and prints one table: workload, metric, duet eager, duet compiled, torch eager, torch.compile,
jax jit, and the ratios duet/peer. Not part of CI.

Each peer does the work duet_bench does: the same shapes, float32, model structure, loss,
optimizer and batch, the same number of ops or steps in one timed repetition, warm-up first,
the median of --reps repetitions. What a peer cannot map exactly is labelled in the table:
  - W1 (per-op dispatch, 100,000 x `a + b` on 8 elements): torch eager from Python, without and
    with the tape (requires_grad); JAX has no tape, and its nearest figure is op-by-op dispatch
    (`a + b` on jax arrays without jit, blocked once per repetition), no_grad only.
  - W4 and W6 compile time, beside duet's CS s_to_steady (first call to steady state on an empty
    kernel cache): torch.compile's first call with an empty Inductor cache, and JAX's
    jit(step).lower(...).compile(). The other figures are steady state, after the compile.
  - Each peer writes its models as its users do: torch with nn modules (nn.Linear keeps its
    weight (out, in)), torch.optim.SGD / AdamW and zero_grad(set_to_none=True); JAX with plain
    functions over a parameter tree (weights (in, out), x @ w + b) and the update written out.
    The W4, W5 and W6 peers start from the same parameter values (drawn here, seeds as duet's).
  - B1 and B2 (per-sample models): PyTorch eagerly, one sample at a time, and B1 also padded and
    masked by hand; duet's compiled column is its loop in an Autobatch scope. JAX's jit does
    not take per-sample code of data-dependent structure, so it has no B rows.
  - VM and B3 (per-sample gradients of the last weight): torch.func.vmap(torch.func.grad(loss))
    eagerly and under torch.compile, against torch.func.grad once per sample; JAX
    jit(vmap(grad(loss))), against jit(grad(loss)) called once per sample. Weights from numpy
    (duet's randn cannot be reproduced; the timings do not depend on the values).
  - JAX calls are blocked on (block_until_ready) at the end of each call where the result is
    needed at once (W2, W3, W5, C1) and at the end of each repetition for training steps, whose
    parameters chain one step to the next.

CPU (--device cpu): the peers come from PyPI at the pinned versions (PINS), in a venv this
script makes at the repository root (.venv-peers, git-ignored; the PyPI torch wheel carries the
CUDA libraries, about 5 GB, and runs on the CPU). Each peer runs in its own process at 1 and at 2
threads (torch.set_num_threads and the process's CPU affinity; JAX sizes its thread pool from
the affinity) and keeps its better figure per row; so does duet_bench, run with --threads 1 and
2 (--duet-threads). The table says which thread count won.
CUDA (--device cuda): the torch and JAX installed for python3 on the machine, no venv; their
versions are recorded. duet's rows are its CUDA twins (W2cuda, W3cuda, W4cuda, W6cuda).

Usage, from the repository root:
  python3 bench/peers/peers.py [--device cpu|cuda] [--only W1,W4,...] [--reps N]
                               [--duet build/bench/duet_bench] [--json OUT]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV = os.path.join(ROOT, ".venv-peers")
# The peers on the CPU: exact versions from PyPI (wheels for Python 3.11 on x86-64 Linux).
AT_HEADS, AT_LEN, AT_DIM = 12, 1024, 64
PINS = ["torch==2.11.0", "jax==0.10.2", "jaxlib==0.10.2", "numpy==2.4.6"]
WORKLOADS = ["W1", "W2", "W3", "W4", "W5", "W6", "W8", "W9", "C1", "AT", "B1", "B2", "VM", "B3"]
ROW_TAG = "PEERROW "  # a worker's result lines on stdout start with this

# ---------------------------------------------------------------------------------------------
# Shared by the peers: timing, and the data duet_bench draws
# ---------------------------------------------------------------------------------------------


def time_interleaved(bodies, reps, warmup=2):
    """duet_bench's time_interleaved: warm-up calls, then reps rounds A B C A B C ..., each body
    timed on its own. Returns seconds per repetition, per body. A body synchronizes itself.
    A figure is then the median as duet_bench takes it: the middle of the sorted values (the
    upper middle for an even count)."""
    for _ in range(warmup):
        for body in bodies:
            body()
    secs = [[] for _ in bodies]
    for _ in range(reps):
        for k, body in enumerate(bodies):
            t0 = time.perf_counter()
            body()
            secs[k].append(time.perf_counter() - t0)
    return secs


def lcg_uniform(n, seed):
    """duet_bench's random_f32: uniform in [-1, 1) from the LCG s = s * 1664525 + 1013904223
    (mod 2^32), value (s >> 8) * 2 / 2^24 - 1; the same numbers, drawn in blocks with numpy."""
    import numpy as np

    a, c, m = 1664525, 1013904223, 1 << 32
    block = min(n, 4096)
    first, s = [], seed
    for _ in range(block):
        s = (s * a + c) % m
        first.append(s)
    jump_a, jump_c = 1, 0  # s -> jump_a * s + jump_c advances the generator by `block` draws
    for _ in range(block):
        jump_a, jump_c = (jump_a * a) % m, (jump_c * a + c) % m
    blocks, cur = [], np.array(first, dtype=np.uint64)
    for _ in range((n + block - 1) // block):
        blocks.append(cur)
        cur = (cur * np.uint64(jump_a) + np.uint64(jump_c)) % np.uint64(m)
    s = np.concatenate(blocks)[:n]
    return ((s >> np.uint64(8)).astype(np.float64) * (2.0 / 16777216.0) - 1.0).astype(np.float32)


def mlp_data(sizes, batch, loss, seed):
    """An MLP's parameters (weights (in, out), biases), scale 0.05 as duet's make_mlp, and one
    batch: x normal, y class ids (cross-entropy) or a normal target (MSE)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    params = [((rng.standard_normal((i, o)) * 0.05).astype(np.float32),
               (rng.standard_normal(o) * 0.05).astype(np.float32))
              for i, o in zip(sizes[:-1], sizes[1:])]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    if loss == "ce":
        y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    else:
        y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    return params, x, y


# The MLP workloads: sizes, batch, activation, activation after the last layer, loss, seed,
# steps per timed repetition on the CPU (models.cpp) and on CUDA (cuda.cpp).
W4 = dict(sizes=[784, 1024, 1024, 10], batch=256, act="relu", act_last=False, loss="ce",
          seed=42, steps=4, cuda_steps=20, metric="ms_per_step", unit=1e3)
W6 = dict(sizes=[64] * 21, batch=8, act="tanh", act_last=True, loss="mse", seed=42, steps=200,
          cuda_steps=200, metric="us_per_step", unit=1e6)
W5_SIZES, W5_CALLS = [784, 1024, 1024, 10], 200
W1_OPS = 100_000
W2_N = 1 << 22
C1_SHAPE = dict(n=32, ci=16, h=28, co=32, k=3)
# W9: GPT-2 small (bench/gpt.cpp); the CPU runs batch 1 x 1024, CUDA batch 8 x 1024.
W9_CFG = dict(vocab=50257, context=1024, width=768, heads=12, layers=12, seq=1024, batch=1,
              cuda_batch=8, reps=3)
# W8: 8 steps a repetition, as duet_bench times them (one cache refill in eight steps).
W8_CFG = dict(vocab=1024, width=256, heads=4, hidden=1024, blocks=2, batch=8, seq=128,
              steps=8)


def mt19937(seed):
    """C++'s std::mt19937(seed): its outputs in turn (duet_bench draws B1's sentences so)."""
    mt = [0] * 624
    mt[0] = seed & 0xFFFFFFFF
    for i in range(1, 624):
        mt[i] = (1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF
    while True:
        for i in range(624):
            y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
            mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        for i in range(624):
            y = mt[i]
            y ^= y >> 11
            y ^= (y << 7) & 0x9D2C5680
            y ^= (y << 15) & 0xEFC60000
            yield y ^ (y >> 18)


B1_BATCH, B1_DIM, B1_VOCAB, B1_TAGS = 64, 64, 1000, 8
# VM and B3 (bench/func.cpp): per-sample gradients of the last weight, vmap(grad) against the
# loop of grad calls. VM: 256 samples of (tanh(x W1) W2 - y)^2, 64-128-1; B3: 64 samples of the
# W4 MLP's cross-entropy, 784-1024-1024-10 with ReLU.
VM_SAMPLES, VM_IN, VM_HIDDEN = 256, 64, 128
B3_SAMPLES, B3_SIZES = 64, (784, 1024, 1024, 10)


def per_sample_problem(workload):
    """VM's or B3's weights and samples as numpy arrays (the values duet_bench's randn draws
    cannot be reproduced here; the timings do not depend on them): the fixed weights, the
    differentiated last weight, the inputs and the targets (B3: class indices)."""
    import numpy as np
    g = np.random.default_rng(31 if workload == "VM" else 37)
    f32 = lambda *shape: g.standard_normal(shape).astype(np.float32)
    if workload == "VM":
        return ([f32(VM_IN, VM_HIDDEN) * 0.1], f32(VM_HIDDEN, 1) * 0.1,
                f32(VM_SAMPLES, VM_IN), f32(VM_SAMPLES, 1))
    i, h1, h2, o = B3_SIZES
    return ([f32(i, h1) * 0.03, f32(h1, h2) * 0.03], f32(h2, o) * 0.03,
            g.random((B3_SAMPLES, i), dtype=np.float32),
            g.integers(0, o, B3_SAMPLES).astype(np.int64))


B2_BATCH, B2_DIM, B2_VOCAB, B2_CLASSES = 64, 64, 1000, 5


def b2_trees():
    """B2's 64 random binary trees of 2-40 leaves, as duet_bench draws them (samples/treelstm.h,
    std::mt19937 seeded 43): per tree, its words, its label (the first word modulo the classes)
    and its tree, a leaf as its word's position and an inner node as (left, right)."""
    g = mt19937(43)

    def tree(lo, hi):
        if hi - lo == 1:
            return lo
        k = lo + 1 + next(g) % (hi - lo - 1)
        left = tree(lo, k)
        return (left, tree(k, hi))
    out = []
    for _ in range(B2_BATCH):
        leaves = 2 + next(g) % 39
        words = [next(g) % B2_VOCAB for _ in range(leaves)]
        out.append((words, words[0] % B2_CLASSES, tree(0, leaves)))
    return out


def b1_sentences():
    """B1's 64 sentences of 5-60 tokens, words and tags as duet_bench draws them
    (bench/autobatch.cpp, std::mt19937 seeded 53)."""
    g = mt19937(53)
    out = []
    for _ in range(B1_BATCH):
        n = 5 + next(g) % 56
        words, tags = [], []
        for _ in range(n):
            words.append(next(g) % B1_VOCAB)
            tags.append(next(g) % B1_TAGS)
        out.append((words, tags))
    return out


def c1_flop():
    s = C1_SHAPE
    return 3 * 2.0 * s["n"] * s["co"] * s["ci"] * s["k"] ** 2 * s["h"] ** 2


class Worker:
    """One peer in one process: runs the workloads and prints a row per figure."""

    name = ""

    def __init__(self, device, reps, threads):
        self.device, self.reps, self.threads = device, reps, threads

    def steps(self, cfg):
        """A training workload's steps per timed repetition on this device."""
        return cfg["cuda_steps"] if self.device == "cuda" else cfg["steps"]

    def emit(self, workload, mode, metric, secs, f, variant="", **extra):
        vals = sorted(f(s) for s in secs)
        row = dict(peer=self.name, version=self.version, mode=mode, workload=workload,
                   variant=variant, metric=metric, median=vals[len(vals) // 2],
                   min=vals[0], max=vals[-1], threads=self.threads, device=self.device,
                   reps=len(vals), **extra)
        print(ROW_TAG + json.dumps(row), flush=True)
        label = f"{workload} {variant}".strip()
        print(f"  {self.name} {self.threads or '-'}t {label} {mode}: {row['median']:.4g} "
              f"{metric}", file=sys.stderr, flush=True)

    def run(self, only):
        for w in only:
            if not hasattr(self, w.lower()):  # (B1: per-sample code, which jit does not take)
                continue
            try:
                getattr(self, w.lower())()
            except Exception as e:  # one failing workload must not lose the others' rows
                print(f"peers: {self.name} {w} failed: {type(e).__name__}: {e}",
                      file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------


class TorchWorker(Worker):
    name = "torch"

    def __init__(self, device, reps, threads):
        super().__init__(device, reps, threads)
        import torch

        self.torch = torch
        self.version = torch.__version__
        if threads:
            torch.set_num_threads(threads)
        self.dev = torch.device(device)
        self.compile_mode = "reduce-overhead" if device == "cuda" else "default"
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.compiler_started = False

    def compile(self, fn):
        torch = self.torch
        if not self.compiler_started:
            # Inductor's own imports and toolchain checks, once, so that the compile times
            # measured are the workloads' (the cache directory is new: no kernel is cached).
            torch.compile(lambda t: t + 1)(torch.ones(2, device=self.dev))
            self.compiler_started = True
        return torch.compile(fn, mode=self.compile_mode, dynamic=False)

    def tensor(self, a):
        return self.torch.from_numpy(a).to(self.dev)

    def synced(self, fn):
        def body():
            fn()
            self.sync()
        return body

    def w1(self):
        a, b = self.tensor(lcg_uniform(8, 1)), self.tensor(lcg_uniform(8, 2))
        ga, gb = a.clone().requires_grad_(), b.clone().requires_grad_()

        def ops(p, q):
            for _ in range(W1_OPS):
                p + q
        secs = time_interleaved([self.synced(lambda: ops(a, b)),
                                 self.synced(lambda: ops(ga, gb))], self.reps)
        per_op = lambda s: s / W1_OPS * 1e9
        self.emit("W1", "eager", "ns_per_op", secs[0], per_op, "no_grad")
        self.emit("W1", "eager", "ns_per_op", secs[1], per_op, "tape")

    def b1(self):
        """B1: the BiLSTM tagger one sentence at a time (the loop), and padded and masked by
        hand, as bench/autobatch.cpp writes both; samples per second."""
        torch, nn, F = self.torch, self.torch.nn, self.torch.nn.functional
        torch.manual_seed(47)
        emb, fwd, bwd = nn.Embedding(B1_VOCAB, B1_DIM), nn.LSTMCell(B1_DIM, B1_DIM), \
            nn.LSTMCell(B1_DIM, B1_DIM)
        tag = nn.Linear(2 * B1_DIM, B1_TAGS)
        mods = [m.to(self.dev) for m in (emb, fwd, bwd, tag)]
        params = [p for m in mods for p in m.parameters()]
        data = b1_sentences()
        sents = [(torch.tensor(w, device=self.dev), torch.tensor(t, device=self.dev))
                 for w, t in data]
        longest = max(len(w) for w, _ in data)
        lens = torch.tensor([len(w) for w, _ in data], device=self.dev)
        pad = lambda rows: torch.tensor([r + [0] * (longest - len(r)) for r in rows],
                                        device=self.dev)
        pwords, ptags = pad([w for w, _ in data]), pad([t for _, t in data])
        mask = (torch.arange(longest, device=self.dev)[None, :] < lens[:, None]).float()
        inv_len = (1.0 / lens.float())[:, None]

        def sentence_loss(w, t):
            x, n = emb(w), w.shape[0]
            hf, hb, s = [None] * n, [None] * n, None
            for k in range(n):
                s = fwd(x[k], s)
                hf[k] = s[0]
            s = None
            for k in range(n - 1, -1, -1):
                s = bwd(x[k], s)
                hb[k] = s[0]
            h = torch.stack([torch.cat([hf[k], hb[k]], 0) for k in range(n)], 0)
            return F.cross_entropy(tag(h), t)

        def loop():
            for p in params:
                p.grad = None
            loss = sum(sentence_loss(w, t) for w, t in sents)
            loss.backward()
            return loss.item()

        def run(cell, reverse, x):
            hs = [None] * longest
            h = torch.zeros(B1_BATCH, B1_DIM, device=self.dev)
            c = torch.zeros_like(h)
            for s in range(longest):
                k = longest - 1 - s if reverse else s
                h1, c1 = cell(x[:, k], (h, c))
                m = mask[:, k:k + 1]
                h, c = m * h1 + (1 - m) * h, m * c1 + (1 - m) * c
                hs[k] = h
            return torch.stack(hs, 1)

        def padded():
            for p in params:
                p.grad = None
            x = emb(pwords)
            h = torch.cat([run(fwd, False, x), run(bwd, True, x)], 2)
            lp = F.log_softmax(tag(h), -1)
            picked = lp.gather(2, ptags[:, :, None])[:, :, 0]
            loss = -(picked * mask * inv_len).sum()
            loss.backward()
            return loss.item()

        want, got = loop(), padded()
        if abs(got - want) > 1e-4 * (1 + abs(want)):
            raise RuntimeError(f"B1: the loop's loss {want} and the padded one's {got} differ")
        secs = time_interleaved([loop, padded], self.reps, warmup=1)
        per = lambda t: B1_BATCH / t
        self.emit("B1", "eager", "samples_per_s", secs[0], per, "loop")
        self.emit("B1", "eager", "samples_per_s", secs[1], per, "padded")

    def per_sample_grads(self, workload):
        """VM or B3: torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0)) eagerly and
        under torch.compile, against torch.func.grad once per sample (the loop); ms per call."""
        torch, F = self.torch, self.torch.nn.functional
        fixed, w, x, y = per_sample_problem(workload)
        fixed, w, x = [self.tensor(a) for a in fixed], self.tensor(w), self.tensor(x)
        y = self.tensor(y)

        def loss(wl, xi, yi):
            if workload == "VM":
                e = torch.tanh(xi[None] @ fixed[0]) @ wl - yi
                return (e * e).sum()
            h = torch.relu(torch.relu(xi[None] @ fixed[0]) @ fixed[1])
            return F.cross_entropy(h @ wl, yi[None])
        grad = torch.func.grad(loss)
        per_sample = torch.func.vmap(grad, in_dims=(None, 0, 0))
        compiled = self.compile(per_sample)

        def loop():
            return torch.stack([grad(w, x[i], y[i]) for i in range(x.shape[0])])
        want = loop()
        for got in (per_sample(w, x, y), compiled(w, x, y)):
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                raise RuntimeError(f"{workload}: vmap(grad) and the loop of grad differ")
        secs = time_interleaved([self.synced(lambda: per_sample(w, x, y)),
                                 self.synced(lambda: compiled(w, x, y)), self.synced(loop)],
                                self.reps)
        ms = lambda t: t * 1e3
        self.emit(workload, "eager", "ms_per_call", secs[0], ms, "vmap_grad")
        self.emit(workload, "compiled", "ms_per_call", secs[1], ms, "vmap_grad")
        self.emit(workload, "eager", "ms_per_call", secs[2], ms, "loop")

    def vm(self):
        self.per_sample_grads("VM")

    def b3(self):
        self.per_sample_grads("B3")

    def b2(self):
        """B2: the binary TreeLSTM of samples/treelstm.h one tree at a time, as a PyTorch user
        writes it (there is no batched version to write by hand); samples per second."""
        torch, nn, F = self.torch, self.torch.nn, self.torch.nn.functional
        torch.manual_seed(41)
        h = B2_DIM
        emb, leaf = nn.Embedding(B2_VOCAB, h), nn.Linear(h, 3 * h)
        inner, out = nn.Linear(2 * h, 5 * h), nn.Linear(h, B2_CLASSES)
        mods = [m.to(self.dev) for m in (emb, leaf, inner, out)]
        params = [p for m in mods for p in m.parameters()]
        trees = [(torch.tensor(w, device=self.dev), torch.tensor([c], device=self.dev), t)
                 for w, c, t in b2_trees()]

        def node(t, xs):
            if isinstance(t, int):
                iou = xs[t]
            else:
                (ha, ca), (hb, cb) = node(t[0], xs), node(t[1], xs)
                z = inner(torch.cat([ha, hb], 0))
                iou, fl, fr = z[:3 * h], torch.sigmoid(z[3 * h:4 * h]), torch.sigmoid(z[4 * h:])
            c = torch.sigmoid(iou[:h]) * torch.tanh(iou[2 * h:])
            if not isinstance(t, int):
                c = c + fl * ca + fr * cb
            return torch.sigmoid(iou[h:2 * h]) * torch.tanh(c), c

        def loop():
            for p in params:
                p.grad = None
            loss = sum(F.cross_entropy(out(node(t, leaf(emb(w)))[0]).reshape(1, -1), c)
                       for w, c, t in trees)
            loss.backward()
            return loss.item()
        secs = time_interleaved([loop], self.reps, warmup=1)
        self.emit("B2", "eager", "samples_per_s", secs[0], lambda t: B2_BATCH / t, "loop")

    def w2(self):
        torch = self.torch
        x = self.tensor(lcg_uniform(W2_N, 3))

        def chain(t):
            return torch.tanh(t * 1.5 + 0.5) * torch.sigmoid(t) + torch.relu(t - 0.25)
        compiled = self.compile(chain)
        compiled(x)
        secs = time_interleaved([self.synced(lambda: chain(x)),
                                 self.synced(lambda: compiled(x))], self.reps)
        for mode, s in zip(["eager", "compiled"], secs):
            self.emit("W2", mode, "ms", s, lambda t: t * 1e3)
            self.emit("W2", mode, "gbps", s, lambda t: 2 * 4 * W2_N / t / 1e9)

    def w3(self):
        for n in (1024, 256, 64):
            a = self.tensor(lcg_uniform(n * n, 4).reshape(n, n))
            b = self.tensor(lcg_uniform(n * n, 5).reshape(n, n))
            flop = 2.0 * n ** 3
            calls = max(1, int(4e9 / flop))
            mm = self.compile(lambda p, q: p @ q)
            mm(a, b)

            def rep(f):
                def body():
                    for _ in range(calls):
                        f(a, b)
                    self.sync()
                return body
            secs = time_interleaved([rep(lambda p, q: p @ q), rep(mm)], self.reps)
            for mode, s in zip(["eager", "compiled"], secs):
                self.emit("W3", mode, "gflops", s, lambda t: flop * calls / t / 1e9, f"n={n}")
            # bf16 operands (duet's bf16 rows), f32 accumulation inside the library.
            a, b = a.to(self.torch.bfloat16), b.to(self.torch.bfloat16)
            mm(a, b)
            secs = time_interleaved([rep(lambda p, q: p @ q), rep(mm)], self.reps)
            for mode, s in zip(["eager", "compiled"], secs):
                self.emit("W3", mode, "gflops", s, lambda t: flop * calls / t / 1e9,
                          f"n={n} bf16")

    def mlp(self, cfg):
        nn = self.torch.nn
        params, x, y = mlp_data(cfg["sizes"], cfg["batch"], cfg["loss"], cfg["seed"])
        act = nn.ReLU if cfg["act"] == "relu" else nn.Tanh
        layers = []
        for i, (w, b) in enumerate(params):
            lin = nn.Linear(*w.shape)
            with self.torch.no_grad():
                lin.weight.copy_(self.torch.from_numpy(w.T))
                lin.bias.copy_(self.torch.from_numpy(b))
            layers.append(lin)
            if i + 1 < len(params) or cfg["act_last"]:
                layers.append(act())
        return nn.Sequential(*layers).to(self.dev), self.tensor(x), self.tensor(y)

    def training(self, w, cfg, autocast=False):
        """W4 and W6: one SGD step (lr 0.01) as a PyTorch user writes it, eager and compiled,
        each on its own copy of the model; the compiled step's first call is its compile.
        autocast: the forward and the loss under torch.autocast(bf16), variant autocast_bf16."""
        torch, nn = self.torch, self.torch.nn
        on = "cuda" if self.device == "cuda" else "cpu"

        def make_step():
            model, x, y = self.mlp(cfg)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            loss_fn = nn.CrossEntropyLoss() if cfg["loss"] == "ce" else nn.MSELoss()

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(on, dtype=torch.bfloat16, enabled=autocast):
                    loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                return loss
            return step
        eager = make_step()
        compiled_step = self.compile(make_step())
        calls = []
        for _ in range(2):
            self.sync()
            t0 = time.perf_counter()
            compiled_step()
            self.sync()
            calls.append(time.perf_counter() - t0)
        for _ in range(5):  # cudagraph trees record on a later call than the first
            compiled_step()

        steps = self.steps(cfg)

        def rep(step):
            def body():
                for _ in range(steps):
                    step()
                self.sync()
            return body
        secs = time_interleaved([rep(eager), rep(compiled_step)], self.reps)
        per_step = lambda s: s / steps * cfg["unit"]
        variant = "autocast_bf16" if autocast else ""
        self.emit(w, "eager", cfg["metric"], secs[0], per_step, variant)
        self.emit(w, "compiled", cfg["metric"], secs[1], per_step, variant)
        if not autocast:
            self.emit(w, "compiled", "s", [calls[0]], lambda s: s, "compile",
                      what="torch.compile first call, empty Inductor cache",
                      second_call_s=calls[1])

    def w4(self):
        self.training("W4", W4)
        self.training("W4", W4, autocast=True)

    def w6(self):
        self.training("W6", W6)

    def w5(self):
        model, x, _ = self.mlp(dict(sizes=W5_SIZES, batch=1, loss="ce", seed=43, act="relu",
                                    act_last=False))
        compiled = self.compile(model)

        def rep(f):
            def body():
                with self.torch.no_grad():
                    for _ in range(W5_CALLS):
                        f(x)
                        self.sync()
            return body
        with self.torch.no_grad():
            compiled(x)
        secs = time_interleaved([rep(model), rep(compiled)], self.reps)
        for mode, s in zip(["eager", "compiled"], secs):
            self.emit("W5", mode, "us_per_call", s, lambda t: t / W5_CALLS * 1e6)

    def w8(self):
        torch, nn, c = self.torch, self.torch.nn, W8_CFG

        tokens = self.tensor(w8_tokens())
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        mask = nn.Transformer.generate_square_subsequent_mask(c["seq"], device=self.dev)
        on = "cuda" if self.device == "cuda" else "cpu"

        for variant, autocast in (("", False), ("autocast_bf16", True)):
            def make_step():
                torch.manual_seed(81)
                model = torch_w8_model(torch).to(self.dev)
                opt = torch.optim.AdamW(model.parameters())

                def step():
                    opt.zero_grad(set_to_none=True)
                    with torch.autocast(on, dtype=torch.bfloat16, enabled=autocast):
                        logits = model(x, mask)
                        loss = nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]),
                                                           y.reshape(-1))
                    loss.backward()
                    opt.step()
                    return loss
                return step
            eager, compiled = make_step(), self.compile(make_step())
            for _ in range(6):
                compiled()

            def rep(step):
                def body():
                    for _ in range(c["steps"]):
                        step()
                    self.sync()
                return body
            secs = time_interleaved([rep(eager), rep(compiled)], self.reps)
            for mode, s in zip(["eager", "compiled"], secs):
                self.emit("W8", mode, "ms_per_step", s, lambda t: t / c["steps"] * 1e3, variant)

    def c1(self):
        torch, s = self.torch, C1_SHAPE
        x = self.tensor(lcg_uniform(s["n"] * s["ci"] * s["h"] ** 2, 6)
                        .reshape(s["n"], s["ci"], s["h"], s["h"])).requires_grad_()
        w = self.tensor(lcg_uniform(s["co"] * s["ci"] * s["k"] ** 2, 7)
                        .reshape(s["co"], s["ci"], s["k"], s["k"])).requires_grad_()
        g = self.tensor(lcg_uniform(s["n"] * s["co"] * s["h"] ** 2, 8)
                        .reshape(s["n"], s["co"], s["h"], s["h"]))

        def conv(p, q):
            return torch.nn.functional.conv2d(p, q, padding=1)
        compiled = self.compile(conv)

        def rep(f):
            def body():
                f(x, w).backward(g)  # gradients of x and w accumulate, as in duet's C1
                self.sync()
            return body
        secs = time_interleaved([rep(conv), rep(compiled)], self.reps)
        for mode, t in zip(["eager", "compiled"], secs):
            self.emit("C1", mode, "gflops", t, lambda v: c1_flop() / v / 1e9, "conv2d_fwd_bwd")
        # bf16 input, filters and gradient (duet's bf16 row).
        bf = torch.bfloat16
        x = x.detach().to(bf).requires_grad_()
        w = w.detach().to(bf).requires_grad_()
        g = g.to(bf)
        compiled(x, w)
        secs = time_interleaved([rep(conv), rep(compiled)], self.reps)
        for mode, t in zip(["eager", "compiled"], secs):
            self.emit("C1", mode, "gflops", t, lambda v: c1_flop() / v / 1e9,
                      "conv2d_fwd_bwd bf16")

    def at(self):
        """AT: scaled_dot_product_attention at L = S = 1024, 12 heads of 64, causal, f32,
        forward + backward and forward alone (PyTorch picks its CPU flash kernel)."""
        torch = self.torch
        shape = (1, AT_HEADS, AT_LEN, AT_DIM)
        q, k, v, g = (self.tensor(lcg_uniform(AT_HEADS * AT_LEN * AT_DIM, 90 + i)
                                  .reshape(shape)) for i in range(4))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fwd_bwd():
            a, b, c = (t.detach().requires_grad_() for t in (q, k, v))
            torch.autograd.grad(sdpa(a, b, c, is_causal=True), (a, b, c), g)
            self.sync()

        def fwd():
            with torch.no_grad():
                sdpa(q, k, v, is_causal=True)
            self.sync()
        secs = time_interleaved([fwd_bwd, fwd], self.reps)
        self.emit("AT", "eager", "fwd_bwd_ms", secs[0], lambda t: t * 1e3, "L1024 h12")
        self.emit("AT", "eager", "fwd_ms", secs[1], lambda t: t * 1e3, "L1024 h12")

    def w9(self):
        """W9: GPT-2 small as nanoGPT writes it (tied embeddings, SDPA, tanh-GELU), AdamW
        (0.9, 0.95, weight decay 0.1), clip_grad_norm_(1.0); f32 and torch.autocast bf16, eager
        and torch.compile over the whole step; tokens per second of a step and of a forward."""
        torch, nn, F, c = self.torch, self.torch.nn, self.torch.nn.functional, W9_CFG
        batch = c["cuda_batch"] if self.device == "cuda" else c["batch"]

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.c_attn = nn.Linear(c["width"], 3 * c["width"])
                self.c_proj = nn.Linear(c["width"], c["width"])

            def forward(self, x):
                n, t, w = x.shape
                q, k, v = (z.view(n, t, c["heads"], w // c["heads"]).transpose(1, 2)
                           for z in self.c_attn(x).split(w, dim=2))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.c_proj(y.transpose(1, 2).reshape(n, t, w))

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln_1, self.attn = nn.LayerNorm(c["width"]), Attn()
                self.ln_2 = nn.LayerNorm(c["width"])
                self.mlp = nn.Sequential(nn.Linear(c["width"], 4 * c["width"]),
                                         nn.GELU(approximate="tanh"),
                                         nn.Linear(4 * c["width"], c["width"]))

            def forward(self, x):
                x = x + self.attn(self.ln_1(x))
                return x + self.mlp(self.ln_2(x))

        class Gpt(nn.Module):
            def __init__(self):
                super().__init__()
                self.wte = nn.Embedding(c["vocab"], c["width"])
                self.wpe = nn.Embedding(c["context"], c["width"])
                self.h = nn.ModuleList(Block() for _ in range(c["layers"]))
                self.ln_f = nn.LayerNorm(c["width"])
                for name, p in self.named_parameters():
                    if "ln_" in name:
                        continue
                    if name.endswith(".bias"):
                        nn.init.zeros_(p)
                    else:
                        std = 0.02 / (2 * c["layers"]) ** 0.5 if "c_proj.weight" in name \
                            or "mlp.2.weight" in name else 0.02
                        nn.init.normal_(p, 0, std)

            def forward(self, idx):
                x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
                for b in self.h:
                    x = b(x)
                return F.linear(self.ln_f(x), self.wte.weight)

        import numpy as np
        rng = np.random.default_rng(91)
        tokens = self.tensor(rng.integers(0, c["vocab"], (batch, c["seq"] + 1)))
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        on = "cuda" if self.device == "cuda" else "cpu"

        for variant, ac in (("f32", False), ("bf16 autocast", True)):
            def make():
                torch.manual_seed(90)
                model = Gpt().to(self.dev)
                opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                        weight_decay=0.1)

                def loss_of():
                    with torch.autocast(on, dtype=torch.bfloat16, enabled=ac):
                        logits = model(x)
                        return F.cross_entropy(logits.reshape(-1, c["vocab"]), y.reshape(-1))

                def step():
                    opt.zero_grad(set_to_none=True)
                    loss = loss_of()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    return loss

                def forward():
                    with torch.no_grad():
                        return loss_of()
                return step, forward
            (es, ef), (cs, cf) = make(), make()
            cs, cf = self.compile(cs), self.compile(cf)
            cs(), cf()
            reps = max(c["reps"], self.reps // 2)
            ts = time_interleaved([self.synced(es), self.synced(cs)], reps)
            tf = time_interleaved([self.synced(ef), self.synced(cf)], reps)
            per = batch * c["seq"]
            for mode, a, b in (("eager", ts[0], tf[0]), ("compiled", ts[1], tf[1])):
                self.emit("W9", mode, "train_tok_s", a, lambda t: per / t, variant)
                self.emit("W9", mode, "fwd_tok_s", b, lambda t: per / t, variant)
            del es, ef, cs, cf


def torch_w8_model(torch):
    """W8's transformer as PyTorch users write it (bench/w8.h): tok, blocks, ln_f, head; called as
    model(tokens, mask)."""
    nn, c = torch.nn, W8_CFG

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(c["width"])
            self.attn = nn.MultiheadAttention(c["width"], c["heads"], batch_first=True)
            self.ln2 = nn.LayerNorm(c["width"])
            self.fc1 = nn.Linear(c["width"], c["hidden"])
            self.act = nn.GELU(approximate="tanh")
            self.fc2 = nn.Linear(c["hidden"], c["width"])

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, is_causal=True, need_weights=False)[0]
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class TinyTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(c["vocab"], c["width"])
            self.blocks = nn.ModuleList(Block() for _ in range(c["blocks"]))
            self.ln_f = nn.LayerNorm(c["width"])
            self.head = nn.Linear(c["width"], c["vocab"])

        def forward(self, tokens, mask):
            x = self.tok(tokens)
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln_f(x))

    return TinyTransformer()


def w8_tokens():
    """W8's batch: token ids (batch, seq + 1); inputs are the first seq, targets the last."""
    import numpy as np

    c = W8_CFG
    return np.random.default_rng(81).integers(0, c["vocab"], (c["batch"], c["seq"] + 1))


# ---------------------------------------------------------------------------------------------
# JAX
# ---------------------------------------------------------------------------------------------


class JaxWorker(Worker):
    name = "jax"

    def __init__(self, device, reps, threads):
        super().__init__(device, reps, threads)
        import warnings

        import jax
        import jax.numpy as jnp

        # Where a backend cannot reuse a donated buffer it says so once per compile; harmless.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        # float32 products in float32, as duet and torch make them (on a GPU JAX's default
        # precision would use TF32).
        jax.config.update("jax_default_matmul_precision", "highest")

        self.jax, self.jnp = jax, jnp
        self.version = f"{jax.__version__} (jaxlib {jax.lib.__version__})"
        self.put = jax.device_put

    def ready(self, tree):
        return self.jax.block_until_ready(tree)

    def w1(self):
        a, b = self.put(lcg_uniform(8, 1)), self.put(lcg_uniform(8, 2))

        def ops():
            r = None
            for _ in range(W1_OPS):
                r = a + b
            self.ready(r)
        secs = time_interleaved([ops], self.reps)
        self.emit("W1", "op_by_op", "ns_per_op", secs[0], lambda s: s / W1_OPS * 1e9,
                  "no_grad", what="op-by-op dispatch without jit")

    def per_sample_grads(self, workload):
        """VM or B3: jit(vmap(grad(loss), in_axes=(None, 0, 0))), against jit(grad(loss)) called
        once per sample (the loop); ms per call."""
        jax, jnp = self.jax, self.jnp
        fixed, w, x, y = per_sample_problem(workload)
        fixed, w, x, y = [self.put(a) for a in fixed], self.put(w), self.put(x), self.put(y)

        def loss(wl, xi, yi):
            if workload == "VM":
                e = jnp.tanh(xi[None] @ fixed[0]) @ wl - yi
                return (e * e).sum()
            h = jax.nn.relu(jax.nn.relu(xi[None] @ fixed[0]) @ fixed[1])
            return -jax.nn.log_softmax(h @ wl)[0, yi]
        grad = jax.jit(jax.grad(loss))
        per_sample = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))
        rows = [(x[i], y[i]) for i in range(x.shape[0])]

        def loop():
            return self.ready(jnp.stack([grad(w, xi, yi) for xi, yi in rows]))
        want, got = loop(), self.ready(per_sample(w, x, y))
        if not jnp.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"{workload}: vmap(grad) and the loop of grad differ")
        secs = time_interleaved([lambda: self.ready(per_sample(w, x, y)), loop], self.reps)
        ms = lambda t: t * 1e3
        self.emit(workload, "compiled", "ms_per_call", secs[0], ms, "vmap_grad")
        self.emit(workload, "compiled", "ms_per_call", secs[1], ms, "loop",
                  what="jit(grad) called once per sample")

    def vm(self):
        self.per_sample_grads("VM")

    def b3(self):
        self.per_sample_grads("B3")

    def w2(self):
        jnp = self.jnp
        x = self.put(lcg_uniform(W2_N, 3))
        f = self.jax.jit(lambda t: jnp.tanh(t * 1.5 + 0.5) * self.jax.nn.sigmoid(t)
                         + self.jax.nn.relu(t - 0.25))
        secs = time_interleaved([lambda: self.ready(f(x))], self.reps)
        self.emit("W2", "compiled", "ms", secs[0], lambda t: t * 1e3)
        self.emit("W2", "compiled", "gbps", secs[0], lambda t: 2 * 4 * W2_N / t / 1e9)

    def w3(self):
        for n in (1024, 256, 64):
            a = self.put(lcg_uniform(n * n, 4).reshape(n, n))
            b = self.put(lcg_uniform(n * n, 5).reshape(n, n))
            flop = 2.0 * n ** 3
            calls = max(1, int(4e9 / flop))
            mm = self.jax.jit(self.jnp.matmul)

            def body():
                for _ in range(calls):
                    self.ready(mm(a, b))
            secs = time_interleaved([body], self.reps)
            self.emit("W3", "compiled", "gflops", secs[0], lambda t: flop * calls / t / 1e9,
                      f"n={n}")
            a, b = a.astype(self.jnp.bfloat16), b.astype(self.jnp.bfloat16)
            secs = time_interleaved([body], self.reps)
            self.emit("W3", "compiled", "gflops", secs[0], lambda t: flop * calls / t / 1e9,
                      f"n={n} bf16")

    def mlp_forward(self, act, act_last, dtype=None):
        """The MLP's forward; with dtype (bf16), each product in that dtype over the f32
        parameters, as autocast runs it, and the result in f32 for the loss."""
        jax = self.jax
        f = jax.nn.relu if act == "relu" else self.jnp.tanh

        def forward(params, h):
            for i, (w, b) in enumerate(params):
                if dtype is None:
                    h = h @ w + b
                else:
                    h = h.astype(dtype) @ w.astype(dtype) + b.astype(dtype)
                if i + 1 < len(params) or act_last:
                    h = f(h)
            return h if dtype is None else h.astype(self.jnp.float32)
        return forward

    def training(self, w, cfg, bf16=False):
        """W4 and W6: the SGD step (lr 0.01) under jit, parameters donated; and the time of
        jit(step).lower(...).compile() (median of three, caches cleared before each). bf16: the
        products in bf16 (variant autocast_bf16), no compile time."""
        jax, jnp = self.jax, self.jnp
        forward = self.mlp_forward(cfg["act"], cfg["act_last"], jnp.bfloat16 if bf16 else None)

        def loss_fn(params, x, y):
            out = forward(params, x)
            if cfg["loss"] == "ce":
                logp = jax.nn.log_softmax(out)
                return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
            return jnp.mean((out - y) ** 2)

        def step(params, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), loss

        params, x, y = mlp_data(cfg["sizes"], cfg["batch"], cfg["loss"], cfg["seed"])
        params, x, y = self.put(params), self.put(x), self.put(y)
        compile_s = []
        for _ in range(0 if bf16 else 3):
            jax.clear_caches()
            t0 = time.perf_counter()
            jax.jit(step, donate_argnums=0).lower(params, x, y).compile()
            compile_s.append(time.perf_counter() - t0)
        jstep = jax.jit(step, donate_argnums=0)
        state, steps = [params], self.steps(cfg)

        def body():
            p = state[0]
            for _ in range(steps):
                p, loss = jstep(p, x, y)
            state[0] = self.ready(p)
        secs = time_interleaved([body], self.reps)
        self.emit(w, "compiled", cfg["metric"], secs[0], lambda s: s / steps * cfg["unit"],
                  "autocast_bf16" if bf16 else "")
        if not bf16:
            self.emit(w, "compiled", "s", compile_s, lambda s: s, "compile",
                      what="jit(step).lower(...).compile()")

    def w4(self):
        self.training("W4", W4)
        self.training("W4", W4, bf16=True)

    def w6(self):
        self.training("W6", W6)

    def w5(self):
        params, x, _ = mlp_data(W5_SIZES, 1, "ce", 43)
        params, x = self.put(params), self.put(x)
        f = self.jax.jit(self.mlp_forward("relu", False))

        def body():
            for _ in range(W5_CALLS):
                self.ready(f(params, x))
        secs = time_interleaved([body], self.reps)
        self.emit("W5", "compiled", "us_per_call", secs[0], lambda t: t / W5_CALLS * 1e6)

    def w8(self):
        """The W8 transformer as plain JAX functions: pre-LayerNorm blocks, causal attention
        (jax.nn.dot_product_attention), tanh-GELU, cross-entropy, and AdamW with PyTorch's
        defaults (lr 1e-3, betas 0.9 and 0.999, eps 1e-8, weight decay 1e-2) written out."""
        import numpy as np

        jax, jnp, c = self.jax, self.jnp, W8_CFG
        e, hid, heads = c["width"], c["hidden"], c["heads"]
        rng = np.random.default_rng(81)

        def dense(i, o):
            return dict(w=(rng.standard_normal((i, o)) * 0.02).astype(np.float32),
                        b=np.zeros(o, np.float32))

        def norm():
            return dict(g=np.ones(e, np.float32), b=np.zeros(e, np.float32))
        params = dict(
            tok=rng.standard_normal((c["vocab"], e)).astype(np.float32),
            blocks=[dict(ln1=norm(), qkv=dense(e, 3 * e), out=dense(e, e), ln2=norm(),
                         fc1=dense(e, hid), fc2=dense(hid, e)) for _ in range(c["blocks"])],
            ln_f=norm(), head=dense(e, c["vocab"]))

        def layer_norm(x, p):
            mu = jnp.mean(x, -1, keepdims=True)
            var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
            return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]

        dt = [None]  # the products' dtype: None (f32), or bf16 over the f32 parameters

        def lin(x, p):
            if dt[0] is None:
                return x @ p["w"] + p["b"]
            d = dt[0]
            return (x.astype(d) @ p["w"].astype(d) + p["b"].astype(d)).astype(jnp.float32)

        def loss_fn(params, tokens, targets):
            x = params["tok"][tokens]
            n, t = tokens.shape
            for blk in params["blocks"]:
                q, k, v = jnp.split(lin(layer_norm(x, blk["ln1"]), blk["qkv"]), 3, axis=-1)
                q, k, v = (a.reshape(n, t, heads, e // heads) for a in (q, k, v))
                if dt[0] is not None:
                    q, k, v = (a.astype(dt[0]) for a in (q, k, v))
                o = jax.nn.dot_product_attention(q, k, v, is_causal=True).astype(jnp.float32)
                x = x + lin(o.reshape(n, t, e), blk["out"])
                h = jax.nn.gelu(lin(layer_norm(x, blk["ln2"]), blk["fc1"]), approximate=True)
                x = x + lin(h, blk["fc2"])
            logits = lin(layer_norm(x, params["ln_f"]), params["head"])
            logp = jax.nn.log_softmax(logits.reshape(-1, c["vocab"]))
            return -jnp.mean(jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1))

        lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2

        def step(params, m, v, count, tokens, targets):
            loss, g = jax.value_and_grad(loss_fn)(params, tokens, targets)
            count = count + 1
            m = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
            v = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
            c1, c2 = 1 - b1 ** count, 1 - b2 ** count

            def update(p, mi, vi):
                p = p * (1 - lr * wd)
                return p - lr * (mi / c1) / (jnp.sqrt(vi / c2) + eps)
            return jax.tree_util.tree_map(update, params, m, v), m, v, count, loss

        tokens = w8_tokens()
        x, y = self.put(tokens[:, :-1].astype(np.int32)), self.put(tokens[:, 1:].astype(np.int32))
        host_params = params
        for variant, dtype in (("", None), ("autocast_bf16", jnp.bfloat16)):
            dt[0] = dtype
            params = self.put(host_params)
            zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
            state = [params, zeros, jax.tree_util.tree_map(jnp.zeros_like, params),
                     jnp.zeros((), jnp.float32)]
            jstep = jax.jit(step, donate_argnums=(0, 1, 2))

            def body():
                s = state
                for _ in range(c["steps"]):
                    *s, loss = jstep(*s, x, y)
                state[:] = self.ready(s)
            secs = time_interleaved([body], self.reps)
            self.emit("W8", "compiled", "ms_per_step", secs[0], lambda t: t / c["steps"] * 1e3,
                      variant)

    def c1(self):
        jax, s = self.jax, C1_SHAPE
        x = self.put(lcg_uniform(s["n"] * s["ci"] * s["h"] ** 2, 6)
                     .reshape(s["n"], s["ci"], s["h"], s["h"]))
        w = self.put(lcg_uniform(s["co"] * s["ci"] * s["k"] ** 2, 7)
                     .reshape(s["co"], s["ci"], s["k"], s["k"]))
        g = self.put(lcg_uniform(s["n"] * s["co"] * s["h"] ** 2, 8)
                     .reshape(s["n"], s["co"], s["h"], s["h"]))

        def conv(p, q):
            return jax.lax.conv_general_dilated(p, q, (1, 1), ((1, 1), (1, 1)),
                                                dimension_numbers=("NCHW", "OIHW", "NCHW"))

        def fwd_bwd(p, q, dy):
            y, vjp = jax.vjp(conv, p, q)
            return (y, *vjp(dy))  # the forward's output too, so that XLA cannot drop it
        f = jax.jit(fwd_bwd)
        secs = time_interleaved([lambda: self.ready(f(x, w, g))], self.reps)
        self.emit("C1", "compiled", "gflops", secs[0], lambda t: c1_flop() / t / 1e9,
                  "conv2d_fwd_bwd")
        bf = self.jnp.bfloat16
        x, w, g = x.astype(bf), w.astype(bf), g.astype(bf)
        secs = time_interleaved([lambda: self.ready(f(x, w, g))], self.reps)
        self.emit("C1", "compiled", "gflops", secs[0], lambda t: c1_flop() / t / 1e9,
                  "conv2d_fwd_bwd bf16")

    def at(self):
        """AT: jax.nn.dot_product_attention, causal, under jit, forward + backward (vjp) and
        forward alone; jax's layout is (batch, length, heads, dim)."""
        jax = self.jax
        shape = (1, AT_LEN, AT_HEADS, AT_DIM)
        q, k, v, g = (self.put(lcg_uniform(AT_HEADS * AT_LEN * AT_DIM, 90 + i).reshape(shape))
                      for i in range(4))

        def attend(a, b, c):
            return jax.nn.dot_product_attention(a, b, c, is_causal=True)

        def fwd_bwd(a, b, c, dy):
            y, vjp = jax.vjp(attend, a, b, c)
            return (y, *vjp(dy))
        fb, f = jax.jit(fwd_bwd), jax.jit(attend)
        secs = time_interleaved([lambda: self.ready(fb(q, k, v, g)),
                                 lambda: self.ready(f(q, k, v))], self.reps)
        self.emit("AT", "compiled", "fwd_bwd_ms", secs[0], lambda t: t * 1e3, "L1024 h12")
        self.emit("AT", "compiled", "fwd_ms", secs[1], lambda t: t * 1e3, "L1024 h12")

    def w9(self):
        """W9: GPT-2 small in plain JAX functions (weights (in, out), tied embeddings,
        dot_product_attention, tanh-GELU), AdamW (0.9, 0.95, weight decay 0.1) and global-norm
        clipping written out, the step under jax.jit with the state donated. bf16: the products
        in bf16 over f32 weights, as autocast runs them."""
        jax, jnp, c = self.jax, self.jax.numpy, W9_CFG
        import numpy as np
        batch = c["cuda_batch"] if self.device == "cuda" else c["batch"]
        w, layers, heads = c["width"], c["layers"], c["heads"]
        keys = iter(jax.random.split(jax.random.PRNGKey(90), 2 + 4 * layers))

        def normal(shape, std=0.02):
            return std * jax.random.normal(next(keys), shape, jnp.float32)
        zeros, ones, pstd = jnp.zeros, jnp.ones, 0.02 / (2 * layers) ** 0.5
        params = dict(
            wte=normal((c["vocab"], w)), wpe=normal((c["context"], w)),
            lnf_g=ones(w), lnf_b=zeros(w),
            blocks=[dict(ln1_g=ones(w), ln1_b=zeros(w), attn_w=normal((w, 3 * w)),
                         attn_b=zeros(3 * w), proj_w=normal((w, w), pstd), proj_b=zeros(w),
                         ln2_g=ones(w), ln2_b=zeros(w), fc_w=normal((w, 4 * w)),
                         fc_b=zeros(4 * w), out_w=normal((4 * w, w), pstd), out_b=zeros(w))
                    for _ in range(layers)])

        def ln(x, g, b):
            m = x.mean(-1, keepdims=True)
            v = ((x - m) ** 2).mean(-1, keepdims=True)
            return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b

        def loss_fn(p, x, y, dt):
            n, t = x.shape

            def mm(a, wt, bias):
                return (a.astype(dt) @ wt.astype(dt) + bias.astype(dt)).astype(jnp.float32)
            h = p["wte"][x] + p["wpe"][:t]
            for b in p["blocks"]:
                qkv = mm(ln(h, b["ln1_g"], b["ln1_b"]), b["attn_w"], b["attn_b"]).astype(dt)
                q, k, v = (z.reshape(n, t, heads, w // heads) for z in jnp.split(qkv, 3, -1))
                a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(n, t, w)
                h = h + mm(a, b["proj_w"], b["proj_b"])
                f = jax.nn.gelu(mm(ln(h, b["ln2_g"], b["ln2_b"]), b["fc_w"], b["fc_b"]),
                                approximate=True)
                h = h + mm(f, b["out_w"], b["out_b"])
            logits = (ln(h, p["lnf_g"], p["lnf_b"]).astype(dt) @ p["wte"].T.astype(dt))
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
            return -jnp.take_along_axis(logp, y[..., None], -1).mean()

        def make(dt):
            def step(p, m, v, t, x, y):
                loss, g = jax.value_and_grad(loss_fn)(p, x, y, dt)
                norm = jnp.sqrt(sum(jnp.sum(z * z) for z in jax.tree_util.tree_leaves(g)))
                g = jax.tree_util.tree_map(lambda z: z * jnp.minimum(1.0, 1.0 / (norm + 1e-6)), g)
                t = t + 1
                m = jax.tree_util.tree_map(lambda a, z: 0.9 * a + 0.1 * z, m, g)
                v = jax.tree_util.tree_map(lambda a, z: 0.95 * a + 0.05 * z * z, v, g)
                lr, c1, c2 = 3e-4, 1 - 0.9 ** t, 1 - 0.95 ** t
                p = jax.tree_util.tree_map(
                    lambda q, a, b: q * (1 - lr * 0.1) - lr * (a / c1) / (jnp.sqrt(b / c2) + 1e-8),
                    p, m, v)
                return p, m, v, t, loss
            return jax.jit(step, donate_argnums=(0, 1, 2)), jax.jit(
                lambda p, x, y: loss_fn(p, x, y, dt))

        rng = np.random.default_rng(91)
        tokens = rng.integers(0, c["vocab"], (batch, c["seq"] + 1))
        x, y = self.put(tokens[:, :-1]), self.put(tokens[:, 1:])
        per = batch * c["seq"]
        for variant, dt in (("f32", jnp.float32), ("bf16 autocast", jnp.bfloat16)):
            step, fwd = make(dt)
            zero = jax.tree_util.tree_map(jnp.zeros_like, params)
            state = [jax.tree_util.tree_map(jnp.array, params), zero,
                     jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0)]

            def train():
                p, m, v, t, loss = step(*state, x, y)
                state[:] = [p, m, v, t]
                self.ready(loss)
            reps = max(c["reps"], self.reps // 2)
            secs = time_interleaved([train, lambda: self.ready(fwd(state[0], x, y))], reps)
            self.emit("W9", "compiled", "train_tok_s", secs[0], lambda t: per / t, variant)
            self.emit("W9", "compiled", "fwd_tok_s", secs[1], lambda t: per / t, variant)


def worker_main(a):
    """A peer in this process (--worker): the CPU affinity first, before the framework starts
    its thread pools."""
    if a.threads:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:a.threads])
    cls = TorchWorker if a.worker == "torch" else JaxWorker
    cls(a.device, a.reps, a.threads).run(a.only.split(","))
    return 0


# ---------------------------------------------------------------------------------------------
# The driver: environment, duet_bench, the workers, the table
# ---------------------------------------------------------------------------------------------


def peer_python(device):
    """The Python that runs the peers: the pinned venv on the CPU (made here when missing or
    out of date), python3's own on CUDA."""
    if device == "cuda":
        return sys.executable
    python, stamp = os.path.join(VENV, "bin", "python"), os.path.join(VENV, "peers-pins.txt")
    want = " ".join(PINS)
    if os.path.exists(python) and os.path.exists(stamp) and open(stamp).read().strip() == want:
        return python
    print(f"peers: installing {want} into {VENV}", file=sys.stderr, flush=True)
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
                   check=True)
    with open(stamp, "w") as f:
        f.write(want + "\n")
    return python


def run_duet(a, only):
    """duet_bench --json at each of --duet-threads: the wanted workloads, and CS (compile time
    to steady state) for W4 and W6 on the CPU. Returns all rows, and the stderr of the runs."""
    ids = list(only)
    if a.device == "cpu" and ({"W4", "W6"} & set(only)):
        ids.append("CS")
    rows, log = [], ""
    thread_counts = a.duet_threads.split(",")
    if a.device == "cuda":
        thread_counts = thread_counts[-1:]  # the host's threads barely matter there
    for threads in thread_counts:
        cmd = [a.duet, "--only", ",".join(ids), "--json", "--reps", str(a.reps),
               "--threads", threads]
        if a.device == "cuda":
            cmd += ["--device", "cuda"]
        print("peers: " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        # An empty kernel cache of its own: CS and the CUDA first calls are cold starts.
        env = dict(os.environ, DUET_CACHE_DIR=tempfile.mkdtemp(prefix="peers_duet_cache_"))
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        for line in p.stderr.splitlines():
            if "warning" in line.lower() or p.returncode:
                print("duet_bench: " + line, file=sys.stderr)
        if p.returncode:
            raise SystemExit(f"peers: duet_bench exited with {p.returncode}")
        rows += json.loads(p.stdout)
        log += p.stderr
        print(f"peers: duet done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows, log


def duet_rows(raw):
    """duet_bench's rows in the peers' keys, the better thread count's where it ran at several:
    W3's size as variant "n=...", CUDA twins (W4cuda) under W4, CS s_to_steady (CPU) or
    first_call_s (CUDA) as the compile row of W4 and W6."""
    rows = {}
    for r in raw:
        w, variant, metric, mode = r["workload"], r.get("variant", ""), r["metric"], r["mode"]
        if w in ("B1", "B2"):  # the loop and the padded model eagerly; Autobatch over the loop
            variant, mode = {"loop": ("loop", "eager"), "padded": ("padded", "eager"),
                             "autobatch": ("loop", "compiled")}.get(mode, ("", ""))
        if w in ("VM", "B3"):  # vmap(grad) eagerly and compiled; the loop of grad calls eagerly
            variant, mode = {"eager": ("vmap_grad", "eager"), "compiled": ("vmap_grad", "compiled"),
                             "loop": ("loop", "eager")}.get(mode, ("", ""))
        if mode not in ("eager", "compiled"):
            continue
        if r.get("n"):
            if variant.endswith("tf32"):  # W3cuda with TF32 on: the peers multiply in f32
                continue
            variant = f"n={r['n']}" + (" bf16" if variant == "bf16" else "")
        if w.endswith("cuda"):
            w = w[:-4]
            if metric == "first_call_s":
                variant, metric = "compile", "s"
        if w == "CS":
            if metric != "s_to_steady":
                continue
            w, variant, metric = variant, "compile", "s"
        key = (w, variant, metric, mode)
        if key not in rows or better(r, rows[key]):
            rows[key] = r
    return rows


def run_workers(a, python, only):
    """Each peer in its own process, at each thread count; all their rows."""
    rows = []
    thread_counts = [int(t) for t in a.threads.split(",")] if a.device == "cpu" else [0]
    for peer in a.peers.split(","):
        for threads in thread_counts:
            env = dict(os.environ, PYTHONUNBUFFERED="1",
                       TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="peers_inductor_"),
                       TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="peers_triton_"),
                       XLA_PYTHON_CLIENT_PREALLOCATE="false")
            if a.device == "cpu":
                env.update(JAX_PLATFORMS="cpu", OMP_NUM_THREADS=str(threads),
                           CUDA_VISIBLE_DEVICES="")
            cmd = [python, os.path.abspath(__file__), "--worker", peer, "--device", a.device,
                   "--only", ",".join(only), "--reps", str(a.reps),
                   "--threads", str(threads)]
            print(f"peers: {peer}, {threads or 'default'} threads", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
            if p.returncode:
                print(f"peers: the {peer} worker exited with {p.returncode}", file=sys.stderr)
            rows += [json.loads(line[len(ROW_TAG):]) for line in p.stdout.splitlines()
                     if line.startswith(ROW_TAG)]
            print(f"peers: {peer} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows


HIGHER_IS_BETTER = {"gflops", "gbps", "train_tok_s", "fwd_tok_s", "samples_per_s"}


def better(r, old):
    """Whether row r's figure beats old's (higher for throughputs, lower for times)."""
    if r["metric"] in HIGHER_IS_BETTER:
        return r["median"] > old["median"]
    return r["median"] < old["median"]


def best_rows(rows):
    """Per (peer, mode, workload, variant, metric), the row of the better thread count."""
    best = {}
    for r in rows:
        key = (r["peer"], r["mode"], r["workload"], r["variant"], r["metric"])
        if key not in best or better(r, best[key]):
            best[key] = r
    return best


# The table's rows: (workload, variant, metric); and which peer rows fill which column.
TABLE = [("W1", "no_grad", "ns_per_op"), ("W1", "tape", "ns_per_op"), ("W2", "", "ms"),
         ("W3", "n=1024", "gflops"), ("W3", "n=256", "gflops"), ("W3", "n=64", "gflops"),
         ("W3", "n=1024 bf16", "gflops"), ("W3", "n=256 bf16", "gflops"),
         ("W3", "n=64 bf16", "gflops"), ("W4", "autocast_bf16", "ms_per_step"),
         ("W8", "autocast_bf16", "ms_per_step"), ("C1", "conv2d_fwd_bwd bf16", "gflops"),
         ("W4", "", "ms_per_step"), ("W5", "", "us_per_call"), ("W6", "", "us_per_step"),
         ("W8", "", "ms_per_step"), ("C1", "conv2d_fwd_bwd", "gflops"),
         ("W4", "compile", "s"), ("W6", "compile", "s"),
         ("AT", "L1024 h12", "fwd_bwd_ms"), ("AT", "L1024 h12", "fwd_ms"),
         ("W9", "f32", "train_tok_s"), ("W9", "f32", "fwd_tok_s"),
         ("W9", "bf16 autocast", "train_tok_s"), ("W9", "bf16 autocast", "fwd_tok_s"),
         ("B1", "loop", "samples_per_s"), ("B1", "padded", "samples_per_s"),
         ("B2", "loop", "samples_per_s"),
         ("VM", "vmap_grad", "ms_per_call"), ("VM", "loop", "ms_per_call"),
         ("B3", "vmap_grad", "ms_per_call"), ("B3", "loop", "ms_per_call")]
PEER_COLUMNS = [("torch eager", "torch", ("eager",)), ("torch.compile", "torch", ("compiled",)),
                ("jax jit", "jax", ("compiled", "op_by_op"))]
NOTES = {
    ("W1", "no_grad"): "jax: op-by-op dispatch (no jit); torch from Python",
    ("W1", "tape"): "torch: requires_grad; JAX has no tape",
    ("C1", "conv2d_fwd_bwd"): "duet eager only: the compiled ratios use it",
    ("W4", "compile"): "duet: CS s_to_steady; torch: first call; jax: lower+compile",
    ("W6", "compile"): "duet: CS s_to_steady; torch: first call; jax: lower+compile",
    ("AT", "L1024 h12"): "causal sdpa; duet eager: the fused kernels; torch: eager SDPA",
    ("B1", "loop"): "one sentence at a time; duet comp: the same loop in an Autobatch scope",
    ("B1", "padded"): "padded and masked by hand, eagerly",
    ("B2", "loop"): "one tree at a time; duet comp: the same loop in an Autobatch scope",
    ("VM", "vmap_grad"): "vmap(grad) of the last weight; torch: torch.func",
    ("VM", "loop"): "grad once per sample; jax: jit(grad) per sample",
    ("B3", "vmap_grad"): "vmap(grad) of the last weight; torch: torch.func",
    ("B3", "loop"): "grad once per sample; jax: jit(grad) per sample",
}


def ratio(duet, peer, metric):
    """duet's time over the peer's (below 1: duet is faster), from figures in `metric`."""
    if duet is None or peer is None or not duet["median"] or not peer["median"]:
        return "-"
    r = peer["median"] / duet["median"] if metric in HIGHER_IS_BETTER \
        else duet["median"] / peer["median"]
    return f"{r:.2f}"


def table(duet, peers, only, device):
    head = ["workload", "metric", "duet eager", "duet comp", "torch eager", "torch.compile",
            "jax jit", "e/torch", "c/torch.c", "c/jax"]
    lines = []
    thr = lambda r: f"/{r['threads']}t" if device == "cpu" else ""
    for w, variant, metric in TABLE:
        if w not in only:
            continue
        de, dc = duet.get((w, variant, metric, "eager")), duet.get((w, variant, metric, "compiled"))
        cells, found = [], []
        for _, peer, modes in PEER_COLUMNS:
            r = next((peers[k] for m in modes
                      if (k := (peer, m, w, variant, metric)) in peers), None)
            found.append(r)
            cells.append("-" if r is None else f"{r['median']:.4g}{thr(r)}")
        if de is None and dc is None and not any(found):
            continue
        dcomp = dc or de
        fmt = lambda r: "-" if r is None else f"{r['median']:.4g}{thr(r)}"
        lines.append([f"{w} {variant}".strip(), metric, fmt(de), fmt(dc), *cells,
                      ratio(de, found[0], metric), ratio(dcomp, found[1], metric),
                      ratio(dcomp, found[2], metric)])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(h.ljust(wd) if i < 2 else h.rjust(wd) for i, (h, wd) in
                     enumerate(zip(row, widths))) for row in [head, *lines]]
    notes = [f"  {w} {v}: {n}" for (w, v), n in NOTES.items() if w in only]
    return "\n".join(out + [""] + notes)


def main():
    p = argparse.ArgumentParser(description="duet_bench's workloads in PyTorch and JAX, beside "
                                "duet (docs/benchmarks.md, Peers)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--only", default=",".join(WORKLOADS),
                   help="workloads, of " + ",".join(WORKLOADS))
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per figure")
    p.add_argument("--duet", default=os.path.join(ROOT, "build", "bench", "duet_bench"))
    p.add_argument("--duet-json", help="duet_bench --json output to read instead of running it")
    p.add_argument("--duet-threads", default="1,2", help="duet_bench --threads, one run each")
    p.add_argument("--threads", default="1,2", help="peer thread counts on the CPU")
    p.add_argument("--peers", default="torch,jax")
    p.add_argument("--json", dest="json_out", help="write every row and the versions here")
    p.add_argument("--worker", choices=["torch", "jax"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        a.threads = int(a.threads)
        return worker_main(a)
    only = [w for w in a.only.split(",") if w]
    unknown = set(only) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; known: {','.join(WORKLOADS)}")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    python = peer_python(a.device)
    if a.duet_json:
        raw, duet_log = json.load(open(a.duet_json)), ""
    else:
        raw, duet_log = run_duet(a, only)
    duet = duet_rows(raw)
    peer_rows = run_workers(a, python, only)
    best = best_rows(peer_rows)
    versions = {r["peer"]: r["version"] for r in peer_rows}
    print(f"\nduet vs peers, {a.device}, medians of {a.reps} reps, {started}; "
          + "; ".join(f"{k} {v}" for k, v in versions.items()))
    if a.device == "cpu":
        duet_threads = ",".join(sorted({str(r["threads"]) for r in raw}))
        print(f"figures: the better of duet at threads {duet_threads} and of each peer at "
              f"threads {a.threads} (/Nt: the winner)")
    print("ratios: duet's time over the peer's (below 1: duet faster); e/ eager vs eager, c/ "
          "duet compiled (eager where it has none) vs the compiled peer\n")
    print(table(duet, best, only, a.device))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(dict(started=started, device=a.device, reps=a.reps, only=only,
                           argv=sys.argv, versions=versions, python=platform.python_version(),
                           machine=platform.platform(), cpus=os.cpu_count(),
                           duet=raw, duet_stderr=duet_log, peers=peer_rows,
                           best=list(best.values())), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
