// ONNX import: the op mappings.
