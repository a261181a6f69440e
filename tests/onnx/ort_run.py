"""Runs an ONNX model in ONNX Runtime for tests/test_onnx_export.cpp.

    ort_run.py MODEL OUT_PREFIX IN0.npy IN1.npy ...

Feeds the .npy files to the model's inputs in order and writes output k to OUT_PREFIX<k>.npy.
A model ONNX Runtime refuses, or inputs it rejects, exit with status 1 and ORT's message on stderr.
"""
import sys

import numpy as np
import onnxruntime as ort


def main(argv):
    model, prefix, inputs = argv[1], argv[2], argv[3:]
    try:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        if len(names) != len(inputs):
            raise ValueError(f"the model takes {len(names)} inputs ({names}), got {len(inputs)}")
        outputs = session.run(None, {n: np.load(p) for n, p in zip(names, inputs)})
    except Exception as e:  # ORT's own exception types differ between versions
        print(f"ort_run: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for k, o in enumerate(outputs):
        np.save(f"{prefix}{k}.npy", np.asarray(o))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
