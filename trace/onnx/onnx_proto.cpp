#include "trace/onnx/onnx_proto.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/input_file.h"
#include "core/ops.h"

namespace duet::detail::onnx_io {

using onnx::TensorProto;

std::optional<DType> dtype_of(int32_t e) {
  switch (e) {
    case TensorProto::FLOAT:
      return DType::f32;
    case TensorProto::DOUBLE:
      return DType::f64;
    case TensorProto::INT32:
      return DType::i32;
    case TensorProto::INT64:
      return DType::i64;
    case TensorProto::BOOL:
      return DType::b8;
    case TensorProto::FLOAT16:
      return DType::f16;
    case TensorProto::BFLOAT16:
      return DType::bf16;
    case TensorProto::INT8:
      return DType::i8;
    case TensorProto::UINT8:
      return DType::u8;
    case TensorProto::INT16:
      return DType::i16;
    default:
      return std::nullopt;
  }
}

int32_t elem_type_of(DType d) {
  switch (d) {
    case DType::f32:
      return TensorProto::FLOAT;
    case DType::f64:
      return TensorProto::DOUBLE;
    case DType::f16:
      return TensorProto::FLOAT16;
    case DType::bf16:
      return TensorProto::BFLOAT16;
    case DType::i32:
      return TensorProto::INT32;
    case DType::i64:
      return TensorProto::INT64;
    case DType::b8:
      return TensorProto::BOOL;
    case DType::i8:
      return TensorProto::INT8;
    case DType::u8:
      return TensorProto::UINT8;
    case DType::i16:
      return TensorProto::INT16;
  }
  return TensorProto::UNDEFINED;
}

std::string elem_type_name(int32_t e) {
  if (TensorProto::DataType_IsValid(e))
    return TensorProto::DataType_Name(static_cast<TensorProto::DataType>(e));
  return fmt::format("element type {}", e);
}

void unsupported_elem_type(int32_t e, const std::string& what) {
  throw DTypeError(fmt::format(
      "[import_onnx] {} has ONNX element type {}, which duet has no dtype for: duet imports "
      "tensors of {}",
      what, elem_type_name(e), kImportedElemTypes));
}

namespace {
template <class T, class Field>
void copy_field(const Field& f, Tensor& t, int64_t n, const std::string& what, const char* name) {
  DUET_CHECK_VALUE(f.size() == n, "[import_onnx] {}: {} holds {} values for {} elements", what,
                   name, f.size(), n);
  T* out = t.data_ptr<T>();
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(f.Get(static_cast<int>(i)));
}
}  // namespace

int64_t data_bytes(const TensorProto& p, const std::string& what) {
  std::optional<DType> dt = dtype_of(p.data_type());
  if (!dt) unsupported_elem_type(p.data_type(), what);
  int64_t n = 1;
  for (int64_t d : p.dims()) {
    DUET_CHECK_VALUE(d >= 0 && (d == 0 || n <= (int64_t(1) << 40) / d),
                     "[import_onnx] {} has a dim {} out of range", what, d);
    n *= d;
  }
  return n * itemsize(*dt);
}

Tensor tensor_from_proto(const TensorProto& p, const std::string& what) {
  DUET_CHECK_VALUE(p.data_location() != TensorProto::EXTERNAL,
                   "[import_onnx] {} keeps its data in an external file, which duet reads only "
                   "for the tensors of a model (import_onnx)",
                   what);
  const int64_t bytes = data_bytes(p, what);
  const DType dt = *dtype_of(p.data_type());
  const std::vector<int64_t> dims(p.dims().begin(), p.dims().end());
  const int64_t n = bytes / itemsize(dt);
  // The data must hold every element before anything is allocated for them.
  int64_t held = 0;
  if (p.has_raw_data()) {
    held = static_cast<int64_t>(p.raw_data().size()) / itemsize(dt);
    DUET_CHECK_VALUE(static_cast<int64_t>(p.raw_data().size()) == bytes,
                     "[import_onnx] {}: raw_data holds {} bytes for {} elements of {}", what,
                     p.raw_data().size(), n, elem_type_name(p.data_type()));
  } else {
    switch (dt) {
      case DType::f32:
        held = p.float_data_size();
        break;
      case DType::f64:
        held = p.double_data_size();
        break;
      case DType::i64:
        held = p.int64_data_size();
        break;
      default:
        held = p.int32_data_size();
        break;
    }
    DUET_CHECK_VALUE(held == n, "[import_onnx] {} holds {} values for {} elements", what, held, n);
  }
  Tensor t = ::duet::detail::empty(Shape(dims), dt);
  if (p.has_raw_data()) {
    if (bytes) std::memcpy(t.raw_data(), p.raw_data().data(), static_cast<size_t>(bytes));
    return t;
  }
  switch (dt) {
    case DType::f32:
      copy_field<float>(p.float_data(), t, n, what, "float_data");
      break;
    case DType::f64:
      copy_field<double>(p.double_data(), t, n, what, "double_data");
      break;
    case DType::i32:
      copy_field<int32_t>(p.int32_data(), t, n, what, "int32_data");
      break;
    case DType::i64:
      copy_field<int64_t>(p.int64_data(), t, n, what, "int64_data");
      break;
    case DType::b8:
      copy_field<bool>(p.int32_data(), t, n, what, "int32_data");
      break;
    case DType::i8:  // int32_data holds each element's value
      copy_field<int8_t>(p.int32_data(), t, n, what, "int32_data");
      break;
    case DType::u8:
      copy_field<uint8_t>(p.int32_data(), t, n, what, "int32_data");
      break;
    case DType::i16:
      copy_field<int16_t>(p.int32_data(), t, n, what, "int32_data");
      break;
    case DType::f16:
    case DType::bf16: {  // int32_data holds each element's 16 bits
      uint16_t* out = static_cast<uint16_t*>(t.raw_data());
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<uint16_t>(p.int32_data(static_cast<int>(i)) & 0xffff);
      break;
    }
    default:
      unsupported_elem_type(p.data_type(), what);
  }
  return t;
}

void tensor_to_proto(const Tensor& t, TensorProto& p) {
  Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
  p.set_data_type(elem_type_of(c.dtype()));
  p.clear_dims();
  for (int64_t d = 0; d < c.dim(); ++d) p.add_dims(c.sizes()[d]);
  const size_t bytes = static_cast<size_t>(c.numel() * itemsize(c.dtype()));
  p.set_raw_data(bytes ? std::string(static_cast<const char*>(c.raw_data()), bytes)
                       : std::string());
}

namespace {
// A regular file only, read no further than its size (Note [Reading user files] in
// core/input_file.h): /dev/zero would grow until memory runs out, and a FIFO would block.
std::string read_file(const std::string& path, const char* what) {
  InputFile f(path, what, "an ONNX file");
  return f.read(f.size());
}
}  // namespace

onnx::ModelProto read_model(const std::string& path) {
  onnx::ModelProto m;
  DUET_CHECK_VALUE(m.ParseFromString(read_file(path, "import_onnx")),
                   "[import_onnx] {} is not an ONNX model (it does not parse as a ModelProto)",
                   path);
  DUET_CHECK_VALUE(m.has_graph(), "[import_onnx] {} is a ModelProto without a graph", path);
  load_external_data(m, path);
  return m;
}

onnx::TensorProto read_tensor(const std::string& path) {
  onnx::TensorProto t;
  DUET_CHECK_VALUE(t.ParseFromString(read_file(path, "import_onnx")),
                   "[import_onnx] {} is not a serialized TensorProto", path);
  return t;
}

}  // namespace duet::detail::onnx_io
