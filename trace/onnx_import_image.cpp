// ONNX import: the mappings of resampling and transposed convolution (trace/onnx_import.h).
#include "trace/onnx_import.h"

namespace duet::detail::onnx_import {

std::vector<OpEntry> image_ops() { return {}; }

}  // namespace duet::detail::onnx_import
