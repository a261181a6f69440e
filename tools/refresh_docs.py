#!/usr/bin/env python3
"""The text surgery of tools/refresh_docs.sh, and the README's benchmark table.

A regenerated region of a markdown file sits between two HTML comments, which the rendered page
does not show:

    <!-- refresh_docs: NAME -->
    ...written by tools/refresh_docs.sh: a caption where the figures depend on the machine,
    and a fenced block...
    <!-- /refresh_docs: NAME -->

  refresh_docs.py regions FILE...             every region: FILE NAME, one a line
  refresh_docs.py replace FILE NAME TEXTFILE   the region NAME of FILE becomes TEXTFILE's text
  refresh_docs.py bench-table CAPTION JSON...  the README's CPU table from duet_bench --json runs
  refresh_docs.py peers-table PEERS_STDOUT     the table lines of bench/peers/peers.py's output
"""
import json
import re
import sys

OPEN = re.compile(r"^<!-- refresh_docs: ([a-z0-9_]+) -->$")


def regions(path):
    """(name, first line index of the content, index of the closing line) per region."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i].strip())
        if m:
            name = m.group(1)
            close = f"<!-- /refresh_docs: {name} -->"
            j = i + 1
            while j < len(lines) and lines[j].strip() != close:
                if OPEN.match(lines[j].strip()):
                    sys.exit(f"{path}:{j + 1}: region {name} opened at line {i + 1} is not closed")
                j += 1
            if j == len(lines):
                sys.exit(f"{path}:{i + 1}: region {name} has no '{close}'")
            found.append((name, i + 1, j))
            i = j
        i += 1
    return lines, found


def cmd_regions(paths):
    for p in paths:
        for name, _, _ in regions(p)[1]:
            print(p, name)


def cmd_replace(path, name, text_path):
    lines, found = regions(path)
    hits = [r for r in found if r[0] == name]
    if len(hits) != 1:
        sys.exit(f"{path}: {len(hits)} regions named {name}, want 1")
    _, a, b = hits[0]
    text = open(text_path, encoding="utf-8").read().rstrip("\n").split("\n")
    new = lines[:a] + text + lines[b:]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(new))


# ---- the README's CPU benchmark table, from runs of duet_bench --json -------------------------
#
# One figure: (workload, mode, variant, metric), variant "" for none; W3's size goes in as
# variant "n=1024". Each cell shows the range over the runs of the per-run medians; a ratio is
# computed per run, then ranged.


def key(r):
    variant = r.get("variant", "")
    if "n" in r:
        variant = (variant + " " if variant else "") + f"n={r['n']}"
    return (r["workload"], r["mode"], variant, r["metric"])


def load_runs(paths):
    runs = []
    for p in paths:
        rows = json.load(open(p, encoding="utf-8"))
        runs.append({key(r): r["median"] for r in rows if r.get("device", "cpu") == "cpu"})
    return runs


def num(v):
    """3 significant digits, thousands separated: 77.7, 411, 4,488, 0.652."""
    if v == 0:
        return "0"
    digits = max(0, 2 - int(f"{abs(v):e}".split("e")[1]))
    return f"{v:,.{digits}f}"


def span(values, unit="", fmt=num):
    if not values:
        return None
    lo, hi = fmt(min(values)), fmt(max(values))
    return (lo if lo == hi else f"{lo}–{hi}") + unit


class Table:
    def __init__(self, runs):
        self.runs = runs
        self.missing = []

    def values(self, k, scale=1.0):
        v = [r[k] * scale for r in self.runs if k in r]
        if len(v) != len(self.runs):
            self.missing.append(" ".join(x for x in k if x))
        return v

    def cell(self, k, unit, scale=1.0):
        return span(self.values(k, scale), unit) or "(not measured)"

    def ratio(self, a, b, unit="×", pct=False, invert=False):
        """a over b, per run; b may be a list of figures, of which each run takes the largest
        (W3's floor: the faster of the two sgemms)."""
        bs = b if isinstance(b, list) else [b]
        v = []
        for r in self.runs:
            if a in r and all(k in r for k in bs) and r[a]:
                d = max(r[k] for k in bs)
                if not d:
                    continue
                x = d / r[a] if invert else r[a] / d
                v.append(100 * x if pct else x)
        if len(v) != len(self.runs):
            return "(not measured)"
        if pct:
            return span(v, "%", lambda x: f"{x:.0f}")
        return span(v, unit, lambda x: f"{x:.2f}")


def bench_table(caption, paths):
    runs = load_runs(paths)
    t = Table(runs)
    E, C, F = "eager", "compiled", "floor"
    W2f = ("W2", F, "fused_eigen", "ms")
    W2l = ("W2", F, "fused_eigen_logistic", "ms")
    W4f = ("W4", F, "onednn_gemms", "ms_per_step")
    W6f = ("W6", F, "onednn_gemms", "us_per_step")
    W8f = ("W8", F, "onednn_gemms", "ms_per_step")
    C1f = ("C1", F, "onednn_gemms", "gflops")
    C1 = ("C1", E, "conv2d_fwd_bwd", "gflops")
    # W5's floor is the faster of two candidates, and duet_bench reports the winner only.
    w5_names = {"onednn_sgemm_m1": "oneDNN sgemm M=1", "openblas_sgemv": "OpenBLAS sgemv"}
    W5f, winners = ("W5", F, "the faster", "us_per_call"), set()
    for r in runs:
        for k in w5_names:
            if ("W5", F, k, "us_per_call") in r:
                r[W5f] = r[("W5", F, k, "us_per_call")]
                winners.add(w5_names[k])
    w5_label = " or ".join(sorted(winners)) if winners else "oneDNN sgemm M=1"
    rows = [
        ("W1 `c = a + b`, 8 elements, no grad", t.cell(("W1", E, "no_grad", "ns_per_op"), " ns/op"),
         "LibTorch 1.13: 640 ns ¹", "(≤ 100 ns)"),
        ("W1 same, a and b require grad (tape)", t.cell(("W1", E, "tape", "ns_per_op"), " ns/op"),
         "LibTorch 1.13: 1,240 ns ¹", "(≤ 200 ns)"),
        ("W2 eager elementwise chain, n = 2^22", t.cell(("W2", E, "", "ms"), " ms"),
         f"fused Eigen loop {t.cell(W2f, ' ms')}",
         f"{t.ratio(('W2', E, '', 'ms'), W2f)} (≤ 7×)"),
        ("W2 same, compiled (one fused kernel, generated code)", t.cell(("W2", C, "", "ms"), " ms"),
         f"fused Eigen loop with duet's sigmoid {t.cell(W2f, ' ms')} (with Eigen's less accurate "
         f"`logistic()` {t.cell(W2l, ' ms')})",
         f"{t.ratio(('W2', C, '', 'ms'), W2f)} ({t.ratio(('W2', C, '', 'ms'), W2l)} against "
         f"`logistic()`) (≤ 1.1×)"),
    ]
    for n in (1024, 256, 64):
        d, o, b = (("W3", E, f"n={n}", "gflops"), ("W3", F, f"onednn n={n}", "gflops"),
                   ("W3", F, f"openblas n={n}", "gflops"))
        rows.append((f"W3 matmul {n}³", t.cell(d, " GFLOP/s"),
                     f"oneDNN sgemm {t.cell(o, '')} (OpenBLAS {t.cell(b, '')})",
                     f"{t.ratio(d, [o, b], pct=True)} of the faster (≥ 90%)"))
    rows += [
        ("C1 conv2d fwd+bwd, (32,16,28,28), 32 3×3", t.cell(C1, " GFLOP/s"),
         f"same GEMMs on oneDNN {t.cell(C1f, '')}", f"{t.ratio(C1, C1f, pct=True)}"),
        ("W4 MLP 784-1024-1024-10 training step, eager", t.cell(("W4", E, "", "ms_per_step"), " ms"),
         f"the step's GEMMs on oneDNN {t.cell(W4f, ' ms')}",
         f"{t.ratio(('W4', E, '', 'ms_per_step'), W4f)} (≤ 1.25×)"),
        ("W4 same, compiled", t.cell(("W4", C, "", "ms_per_step"), " ms"), "same",
         f"{t.ratio(('W4', C, '', 'ms_per_step'), W4f)} (≤ 1.1×); LibTorch eager 16–18 ms ¹"),
        ("W4 allocator high-water mark, compiled / eager",
         f"{t.cell(('W4', C, '', 'peak_tensor_bytes'), '', 1e-6)} / "
         f"{t.cell(('W4', E, '', 'peak_tensor_bytes'), ' MB', 1e-6)}", "",
         f"{t.ratio(('W4', C, '', 'peak_tensor_bytes'), ('W4', E, '', 'peak_tensor_bytes'))} "
         f"(≤ 0.8×)"),
        ("W5 W4's forward at batch 1, eager / compiled",
         f"{t.cell(('W5', E, '', 'us_per_call'), '')} / {t.cell(('W5', C, '', 'us_per_call'), ' µs')}",
         f"{w5_label} {t.cell(W5f, ' µs')}",
         f"compiled {t.ratio(('W5', C, '', 'us_per_call'), W5f)} (≤ 1.15×)"),
        ("W6 20 × (Linear 64 + tanh) training step, eager",
         t.cell(("W6", E, "", "us_per_step"), " µs"), f"the step's GEMMs {t.cell(W6f, ' µs')}",
         f"{t.ratio(('W6', E, '', 'us_per_step'), W6f)} (≤ 3×)"),
        ("W6 same, compiled", t.cell(("W6", C, "", "us_per_step"), " µs"), "same",
         f"{t.ratio(('W6', C, '', 'us_per_step'), W6f)} (≤ 1.3×); LibTorch eager 545 µs ¹"),
        ("TT two-tower step, batch 16, compiled in waves / in order",
         f"{t.cell(('TT', C, 'b16_waves', 'us_per_step'), '')} / "
         f"{t.cell(('TT', C, 'b16_serial', 'us_per_step'), ' µs')}", "",
         f"parallel branches "
         f"{t.ratio(('TT', C, 'b16_serial', 'us_per_step'), ('TT', C, 'b16_waves', 'us_per_step'))}"
         f" faster"),
        ("W8 transformer training step (2 pre-LN blocks, width 256, 4 causal heads, batch 8 × 128 "
         "tokens, AdamW), eager", t.cell(("W8", E, "", "ms_per_step"), " ms"),
         f"the step's GEMMs on oneDNN {t.cell(W8f, ' ms')}",
         t.ratio(("W8", E, "", "ms_per_step"), W8f)),
        ("W8 same, compiled", t.cell(("W8", C, "", "ms_per_step"), " ms"), "same",
         f"{t.ratio(('W8', C, '', 'ms_per_step'), W8f)} (≤ 1.3×); peak "
         f"{t.cell(('W8', C, '', 'peak_tensor_bytes'), ' MB', 1e-6)} vs eager "
         f"{t.cell(('W8', E, '', 'peak_tensor_bytes'), ' MB', 1e-6)}"),
    ]
    out = [caption, "", "| workload | duet | floor | ratio (target) |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    out += ["", "¹ measured once on the 2-core development machines (docs/benchmarks.md), not by "
            "this script."]
    if t.missing:
        print("refresh_docs: not in every run: " + ", ".join(sorted(set(t.missing))),
              file=sys.stderr)
    print("\n".join(out))


def peers_table(path):
    """The table of peers.py's stdout: from its header line to the first blank line after it."""
    lines = open(path, encoding="utf-8").read().split("\n")
    start = next((i for i, l in enumerate(lines) if l.startswith("workload ")), None)
    if start is None:
        sys.exit(f"{path}: no table (a line starting with 'workload ')")
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    print("\n".join(l.rstrip() for l in lines[start:end]))


def main(argv):
    if len(argv) >= 2 and argv[1] == "regions":
        return cmd_regions(argv[2:])
    if len(argv) == 5 and argv[1] == "replace":
        return cmd_replace(argv[2], argv[3], argv[4])
    if len(argv) >= 4 and argv[1] == "bench-table":
        return bench_table(argv[2], argv[3:])
    if len(argv) == 3 and argv[1] == "peers-table":
        return peers_table(argv[2])
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
