// ONNX protobuf messages <-> duet tensors, shared by export, import and the conformance runner
// (internal; includes the ONNX headers of Debian's libonnx-dev).
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>

#include "core/tensor.h"

namespace duet::detail::onnx_io {

/// The duet dtype of an ONNX element type, when duet computes it on the CPU.
std::optional<DType> dtype_of(int32_t elem_type);
/// The ONNX element type of a dtype.
int32_t elem_type_of(DType dtype);
/// "FLOAT", "UINT8", ...
std::string elem_type_name(int32_t elem_type);
/// The element types that have a dtype, for error messages.
inline constexpr const char* kImportedElemTypes =
    "FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT8, UINT8, INT16, INT32, INT64 and BOOL";
/// The DTypeError for an element type duet has no dtype for; `what` names the tensor.
[[noreturn]] void unsupported_elem_type(int32_t elem_type, const std::string& what);

/// The bytes the proto's elements take as raw_data (its dims' product times the item size): a
/// DTypeError for an element type duet has no dtype for, a ValueError for a dim out of range.
int64_t data_bytes(const onnx::TensorProto& p, const std::string& what);
/// A CPU tensor with the proto's values (raw_data or the typed fields); `what` names it in
/// errors (a DTypeError for an unsupported element type, a ValueError for a malformed proto).
Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& what);
/// Writes t's values (copied to the CPU) into p as raw_data, with its dims and element type.
void tensor_to_proto(const Tensor& t, onnx::TensorProto& p);

/// Parses a serialized ModelProto / TensorProto file; a ValueError names the file when it
/// cannot be read or is not one. read_model reads the data its tensors keep in external files
/// into them (load_external_data).
onnx::ModelProto read_model(const std::string& path);
onnx::TensorProto read_tensor(const std::string& path);

/// Reads the data of every tensor of m kept in an external file (data_location EXTERNAL: an
/// initializer, a node attribute's value, a subgraph's, at any depth) into its raw_data, from
/// the file its "location" names in `folder`, the folder of the model file `model`
/// (trace/onnx/onnx_external.cpp, Note [External data]). A location outside the folder, a file that
/// is not a regular file, or an offset or length past its end raises a ValueError naming the
/// model, the tensor and the file.
void load_external_data(onnx::ModelProto& m, const std::string& model);

}  // namespace duet::detail::onnx_io
