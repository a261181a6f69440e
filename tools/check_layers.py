#!/usr/bin/env python3
"""Fails when a library file includes a header of a layer above its own.

    python3 tools/check_layers.py            check the source tree this script is in
    python3 tools/check_layers.py ROOT       check the tree at ROOT
    python3 tools/check_layers.py --self-test  plant one violation of each rule in a scratch tree
                                               and check that each is caught

The layers, lowest first (docs/architecture.md):

    core  ->  kernels  ->  cuda  ->  eager  ->  trace  ->  nn

A file may include headers of its own layer and of the layers below it, never of one above:
core includes only core; kernels includes core (and never cuda: the CUDA code includes the CPU
kernels' functors and fused-program headers, not the other way round); cuda includes core and
kernels; eager includes core, kernels and cuda; trace includes anything but nn; nn includes any
layer. The top-level duet.h includes every layer, so no layer may include it. What core needs of
autograd it reaches through the hook table of core/autograd_hooks.h, which eager fills in, never
by an include.

Inside trace/, the compiled face's stages are layers of their own, lowest first:

    trace/ir  ->  trace/plan  ->  trace (its own files)  ->  trace/onnx

so the IR and its passes know nothing of plans, plans nothing of compile(), and only ONNX
interop sees everything. A layer is a top-level folder and everything under it, however deep,
except that trace/'s stage folders are their own (trace/ir/graph.h is the stage trace/ir).
Every file under a layer folder is scanned, and every #include "..." or #include <...> in it is
resolved as the compiler would: beside the including file first, then from the top of the tree;
an include that names no file of the tree (a system or generated header) is not a layer's.

Exit status: 0 when no file includes a layer above its own, 1 when one does, 2 on a usage error.
"""
import os
import re
import shutil
import sys
import tempfile

LAYERS = ["core", "kernels", "cuda", "eager", "trace", "nn"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# Top-level files that include layers: above every layer.
ABOVE_ALL = {"duet.h": len(LAYERS)}
SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".def", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


# trace/'s stages, lowest first; trace's own files sit between plan and onnx.
TRACE_STAGES = {"trace/ir": 0, "trace/plan": 1, "trace": 2, "trace/onnx": 3}


def stage_of(rel):
    """The name of the layer or trace stage of a root-relative path (None outside the layers)."""
    if rel in ABOVE_ALL:
        return rel
    if "/" not in rel:
        return None
    top, rest = rel.split("/", 1)
    if top not in RANK:
        return None
    if top == "trace" and "/" in rest and "trace/" + rest.split("/", 1)[0] in TRACE_STAGES:
        return "trace/" + rest.split("/", 1)[0]
    return top


def rank_of(rel):
    """The (layer, stage) rank of a root-relative path, or None for a path outside the layers."""
    s = stage_of(rel)
    if s is None:
        return None
    if s in ABOVE_ALL:
        return (ABOVE_ALL[s], 0)
    if s.startswith("trace"):
        return (RANK["trace"], TRACE_STAGES[s])
    return (RANK[s], 0)


def resolve(root, including, name, quoted):
    """The root-relative path of the file that `#include name` in `including` names, or None."""
    candidates = []
    if quoted:  # quoted includes look beside the including file first
        candidates.append(os.path.join(os.path.dirname(including), name))
    candidates.append(name)
    for c in candidates:
        rel = os.path.normpath(c).replace(os.sep, "/")
        if rel.startswith("../"):
            continue
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    return None


def includes(path):
    """(line number, name, quoted) of each include line of the file at path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield n, m.group(1) or m.group(2), m.group(1) is not None


def violations(root):
    """'file:line: ...' for each include of a layer above the including file's."""
    out = []
    for layer in LAYERS:
        top = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for fn in sorted(filenames):
                if not fn.endswith(SUFFIXES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, fn), root).replace(os.sep, "/")
                for n, name, quoted in includes(os.path.join(root, rel)):
                    target = resolve(root, rel, name, quoted)
                    if target is None:
                        continue
                    r = rank_of(target)
                    if r is not None and r > rank_of(rel):
                        what, own = stage_of(target), stage_of(rel)
                        order = (" -> ".join(TRACE_STAGES) if what.startswith("trace") and
                                 own.startswith("trace") else " -> ".join(LAYERS))
                        out.append(f"{rel}:{n}: {own}/ includes {target}, of {what}, a layer "
                                   f"above it (order: {order})")
    return out


def self_test():
    """Plants one violation of each rule in a scratch tree; each must be caught, and only it."""
    planted = [
        ("core/a.h", "kernels/k.h"),
        ("core/sub/b.cpp", "eager/e.h"),
        ("kernels/k.cpp", "cuda/c.h"),
        ("cuda/c.cpp", "eager/e.h"),
        ("eager/e.cpp", "trace/ir/g.h"),
        ("trace/ir/g.cpp", "nn/m.h"),
        ("nn/m.cpp", "duet.h"),
        ("trace/ir/g2.cpp", "trace/plan/p.h"),
        ("trace/plan/p.cpp", "trace/t.h"),
        ("trace/t.cpp", "trace/onnx/o.h"),
    ]
    allowed = [
        ("cuda/c.h", "kernels/k.h"),
        ("trace/ir/g.h", "eager/e.h"),
        ("trace/ir/g.h", "cuda/c.h"),
        ("nn/m.h", "trace/ir/g.h"),
        ("core/a.h", "core/sub/b.h"),
        ("trace/ir/g.h", "g2.h"),  # beside the including file
        ("core/a.h", "fmt/format.h"),  # not a file of the tree
        ("trace/plan/p.h", "trace/ir/g.h"),
        ("trace/t.h", "trace/plan/p.h"),
        ("trace/onnx/o.h", "trace/t.h"),
    ]
    root = tempfile.mkdtemp(prefix="check_layers_")
    try:
        files = {p for pair in planted + allowed for p in pair if "/" in p or p == "duet.h"}
        files |= {"trace/ir/g2.h"}
        files.discard("fmt/format.h")
        for p in files:
            os.makedirs(os.path.join(root, os.path.dirname(p)), exist_ok=True)
            open(os.path.join(root, p), "a").close()
        if violations(root):
            print("check_layers --self-test: a tree without includes fails", file=sys.stderr)
            return 1
        for src, dst in allowed:
            with open(os.path.join(root, src), "a") as f:
                f.write(f'#include "{dst}"\n')
        for src, dst in planted:
            with open(os.path.join(root, src), "a") as f:
                f.write(f'#include <{dst}>\n' if src.endswith("b.cpp") else f'#include "{dst}"\n')
        found = violations(root)
        caught = {v.split(":", 1)[0] for v in found}
        want = {src for src, _ in planted}
        if caught != want or len(found) != len(planted):
            print("check_layers --self-test: expected exactly one violation in each of "
                  f"{sorted(want)}, got:\n  " + "\n  ".join(found), file=sys.stderr)
            return 1
        print(f"check_layers --self-test: all {len(planted)} planted violations caught, "
              f"{len(allowed)} allowed includes passed")
        return 0
    finally:
        shutil.rmtree(root)


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not all(os.path.isdir(os.path.join(root, layer)) for layer in ("core", "eager")):
        print(f"check_layers: {root} is not a duet source tree", file=sys.stderr)
        return 2
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"check_layers: {len(found)} include(s) of a layer above the including file's",
              file=sys.stderr)
        return 1
    print(f"check_layers: every include of {', '.join(LAYERS)} stays in its layer or below")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
