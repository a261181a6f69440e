// ONNX import (trace/onnx.h).
#include "trace/onnx.h"

namespace duet {

Program import_onnx(const std::string&, const OnnxImportOptions&) {
  throw ValueError("[import_onnx] not built yet");
}

}  // namespace duet
