// export_onnx and import_onnx in a build without Debian's libonnx-dev (or a sanitizer build).
#include "trace/onnx/onnx.h"

namespace duet {

namespace {
[[noreturn]] void no_onnx(const char* op) {
  throw ValueError(
      fmt::format("[{}] this duet was built without ONNX: install libonnx-dev and libprotobuf-dev "
                  "(tools/setup_deps.sh) and configure again (the sanitizer builds leave ONNX out)",
                  op));
}
}  // namespace

void export_onnx(const Program&, const std::string&, const OnnxExportOptions&) {
  no_onnx("export_onnx");
}

void detail::export_onnx_compiled(const CompileOptions&, const std::string&, const FlatArgs&,
                                  const TraceFn&, const std::string&, const OnnxExportOptions&) {
  no_onnx("export_onnx");
}

Program import_onnx(const std::string&, const OnnxImportOptions&) { no_onnx("import_onnx"); }

}  // namespace duet
