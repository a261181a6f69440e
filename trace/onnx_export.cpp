// ONNX export (trace/onnx.h): written by the export work; see docs/onnx.md.
#include "trace/onnx.h"

namespace duet {

void export_onnx(const Program&, const std::string&, const OnnxExportOptions&) {
  throw ValueError("[export_onnx] not built yet");
}

void detail::export_onnx_compiled(const CompileOptions&, const std::string&, const FlatArgs&,
                                  const TraceFn&, const std::string&, const OnnxExportOptions&) {
  throw ValueError("[export_onnx] not built yet");
}

}  // namespace duet
