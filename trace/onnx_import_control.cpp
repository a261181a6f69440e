// ONNX import: the mappings of control flow (If, Loop, Scan) and recurrent layers (RNN, GRU, LSTM)
// (trace/onnx_import.h).
#include "trace/onnx_import.h"

namespace duet::detail::onnx_import {

std::vector<OpEntry> control_ops() { return {}; }

}  // namespace duet::detail::onnx_import
