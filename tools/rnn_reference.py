#!/usr/bin/env python3
"""Known values for tests/test_nn_layers.cpp ("known values from ONNX Runtime"): nn::RNN,
nn::GRU, nn::LSTM and nn::Conv1d on fixed inputs, computed by ONNX Runtime's own kernels.

PyTorch's CPU wheels were not reachable from the machine these numbers were made on, so the
reference is ONNX Runtime's RNN, GRU (linear_before_reset=1, PyTorch's form of the n gate),
LSTM and Conv, the ops torch.onnx exports these layers to. The weights are given in PyTorch's
layout (weight_ih_l0 of shape (gates * hidden, input), gate rows r, z, n for GRU and i, f, g, o
for LSTM) and reordered here into ONNX's (z, r, h and i, o, f, c), so the test checks duet's
layout and gate order against an implementation that shares no code with it.

Every input is a formula of its index (value()), which the test computes the same way; the
script prints the outputs as C++ initializers to paste into the test.

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install onnx==1.17.0 onnxruntime==1.20.1 \
        numpy==2.2.6
    /tmp/ref/bin/python tools/rnn_reference.py
"""
import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def value(n, scale, freq, phase):
    """scale * sin(freq * i + phase) for i = 0 .. n-1, the test's fill() too."""
    return np.array([scale * math.sin(freq * i + phase) for i in range(n)], dtype=np.float64)


def run(nodes, inputs, outputs):
    """Runs one graph in ONNX Runtime on float32 inputs given as {name: array}."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {k: v.astype(np.float32) for k, v in inputs.items()}
    return sess.run(outputs, feed)


def reorder(w, order, hidden):
    """Row blocks of hidden rows, taken in `order`."""
    return np.concatenate([w[k * hidden:(k + 1) * hidden] for k in order], axis=0)


def recurrent(kind, input_size, hidden, steps, batch, bidirectional):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    # PyTorch's gate rows -> ONNX's: GRU r, z, n -> z, r, h; LSTM i, f, g, o -> i, o, f, c.
    order = {"RNN": [0], "GRU": [1, 0, 2], "LSTM": [0, 3, 1, 2]}[kind]
    dirs = 2 if bidirectional else 1
    W, R, B = [], [], []
    for d in range(dirs):
        k = 4 * d  # the parameter's index in PyTorch's order, as the test numbers them
        w_ih = value(gates * hidden * input_size, 0.5, 1.3, 0.7 * k).reshape(gates * hidden, -1)
        w_hh = value(gates * hidden * hidden, 0.5, 1.3, 0.7 * (k + 1)).reshape(gates * hidden, -1)
        b_ih = value(gates * hidden, 0.5, 1.3, 0.7 * (k + 2))
        b_hh = value(gates * hidden, 0.5, 1.3, 0.7 * (k + 3))
        W.append(reorder(w_ih, order, hidden))
        R.append(reorder(w_hh, order, hidden))
        B.append(np.concatenate([reorder(b_ih, order, hidden), reorder(b_hh, order, hidden)]))
    x = value(steps * batch * input_size, 1.0, 0.9, 0.3).reshape(steps, batch, input_size)
    h0 = value(dirs * batch * hidden, 0.3, 2.1, 0.5).reshape(dirs, batch, hidden)
    c0 = value(dirs * batch * hidden, 0.2, 1.7, 1.1).reshape(dirs, batch, hidden)
    inputs = {"X": x, "W": np.stack(W), "R": np.stack(R), "B": np.stack(B), "h0": h0}
    names = ["X", "W", "R", "B", "", "h0"]
    outs = ["Y", "Y_h"]
    attrs = {"hidden_size": hidden,
             "direction": "bidirectional" if bidirectional else "forward"}
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    if kind == "LSTM":
        inputs["c0"] = c0
        names.append("c0")
        outs.append("Y_c")
    node = helper.make_node(kind, names, outs, **attrs)
    res = run([node], inputs, outs)
    y = np.transpose(res[0], (0, 2, 1, 3)).reshape(steps, batch, dirs * hidden)  # PyTorch's
    return [y] + res[1:]


def conv1d(c_in, c_out, k, stride, pad, n, length):
    w = value(c_out * c_in * k, 0.5, 1.3, 0.0).reshape(c_out, c_in, k)
    b = value(c_out, 0.5, 1.3, 0.7)
    x = value(n * c_in * length, 1.0, 0.9, 0.3).reshape(n, c_in, length)
    node = helper.make_node("Conv", ["X", "W", "B"], ["Y"], kernel_shape=[k], strides=[stride],
                            pads=[pad, pad])
    return run([node], {"X": x, "W": w, "B": b}, ["Y"])


def show(name, arrays):
    vals = ", ".join(f"{v:.9g}" for a in arrays for v in np.asarray(a, np.float64).ravel())
    print(f"// {name}: {' + '.join(str(tuple(np.shape(a))) for a in arrays)}")
    print(f"{{{vals}}},")


if __name__ == "__main__":
    print(f"// onnxruntime {ort.__version__}, onnx {onnx.__version__}, numpy {np.__version__}")
    show("RNN(3, 4) tanh, T 3, N 2: output, h_n", recurrent("RNN", 3, 4, 3, 2, False))
    show("GRU(3, 4) bidirectional, T 3, N 2: output, h_n", recurrent("GRU", 3, 4, 3, 2, True))
    show("LSTM(3, 4), T 4, N 2: output, h_n, c_n", recurrent("LSTM", 3, 4, 4, 2, False))
    show("Conv1d(2, 3, 3, stride 2, padding 1), N 2, L 7", conv1d(2, 3, 3, 2, 1, 2, 7))
