// NumPy .npy files (nn/data.h): the format of numpy.lib.format. A file is the magic
// "\x93NUMPY", a version (major, minor), a header length (u16 for 1.x, u32 for 2.x and 3.x),
// and a header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces to a multiple of 64 bytes and ended by a newline; then the raw values.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/dispatch.h"
#include "core/input_file.h"
#include "core/ops.h"
#include "nn/data.h"

namespace duet::data {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw ValueError(fmt::format("[read_npy] {}: {}", path, what));
}

// The value of key `key` in the header dict, as text ("'<f4'", "False", "(2, 3)").
std::string dict_value(const std::string& h, const std::string& key, const std::string& path) {
  const std::string k = "'" + key + "'";
  const size_t at = h.find(k);
  if (at == std::string::npos) bad(path, fmt::format("the header has no {} ({})", k, h));
  size_t i = h.find(':', at + k.size());
  if (i == std::string::npos) bad(path, fmt::format("the header's {} has no value", k));
  ++i;
  while (i < h.size() && h[i] == ' ') ++i;
  size_t end = i;
  if (i < h.size() && (h[i] == '\'' || h[i] == '"')) {
    end = h.find(h[i], i + 1);
    if (end == std::string::npos) bad(path, "an unterminated string in the header");
    return h.substr(i, end - i + 1);
  }
  if (i < h.size() && h[i] == '(') {
    end = h.find(')', i);
    if (end == std::string::npos) bad(path, "an unterminated shape in the header");
    return h.substr(i, end - i + 1);
  }
  while (end < h.size() && h[end] != ',' && h[end] != '}') ++end;
  std::string v = h.substr(i, end - i);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

// A Python tuple of sizes, as numpy writes a shape: "()", "(3,)", "(2, 3)"; a trailing comma
// is allowed, and needed for one element ("(3)" is the number 3, which numpy refuses too).
Shape parse_shape(const std::string& text, const std::string& path) {
  auto refuse = [&] {
    bad(path, fmt::format("'shape' is {}, expected a tuple of sizes such as (2, 3) or (3,)",
                          text.empty() ? "empty" : text));
  };
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') refuse();
  Shape shape;
  size_t i = 1, commas = 0;
  const size_t end = text.size() - 1;
  auto skip_spaces = [&] {
    while (i < end && text[i] == ' ') ++i;
  };
  skip_spaces();
  while (i < end) {
    const size_t from = i;
    while (i < end && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == from || i - from > 15) refuse();  // not a size, or over 10^15
    shape.push_back(std::stoll(text.substr(from, i - from)));
    skip_spaces();
    if (i == end) break;
    if (text[i] != ',') refuse();
    ++i;
    ++commas;
    skip_spaces();
  }
  if (shape.size() == 1 && commas == 0) refuse();  // "(3)"
  return shape;
}

}  // namespace

Tensor read_npy(const std::string& path) {
  // Only a regular file, read no further than the header declares (Note [Reading user files]).
  detail::InputFile file(path, "read_npy", "a .npy file");
  std::string b = file.read(10);
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) bad(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(b[6]);
  if (major < 1 || major > 3) bad(path, fmt::format("format version {} is not 1, 2 or 3", major));
  size_t hlen;
  if (major == 1) {
    hlen = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8);
  } else {
    b += file.read(2);
    if (b.size() < 12) bad(path, "truncated header");
    hlen = 0;
    for (int k = 3; k >= 0; --k) hlen = (hlen << 8) | static_cast<unsigned char>(b[8 + k]);
  }
  const std::string h = file.read(hlen);
  if (h.size() < hlen) bad(path, "truncated header");
  std::string descr = dict_value(h, "descr", path);
  const std::string fortran = dict_value(h, "fortran_order", path);
  const Shape shape = parse_shape(dict_value(h, "shape", path), path);
  if (descr.size() < 4 || (descr[0] != '\'' && descr[0] != '"'))
    bad(path, fmt::format("descr {} is no dtype", descr));
  descr = descr.substr(1, descr.size() - 2);  // without the quotes
  const char order = descr[0];
  const std::string kind = descr.substr(1);
  DType dt;
  if (kind == "f4")
    dt = DType::f32;
  else if (kind == "f8")
    dt = DType::f64;
  else if (kind == "f2")
    dt = DType::f16;
  else if (kind == "i4")
    dt = DType::i32;
  else if (kind == "i8")
    dt = DType::i64;
  else if (kind == "b1")
    dt = DType::b8;
  else if (kind == "i1")
    dt = DType::i8;
  else if (kind == "u1")
    dt = DType::u8;
  else if (kind == "i2")
    dt = DType::i16;
  else
    throw DTypeError(
        fmt::format("[read_npy] {}: dtype '{}' is not one duet has (f4, f8, f2, i4, i8, i2, i1, "
                    "u1, b1)",
                    path, descr));
  if (order != '<' && order != '>' && order != '|' && order != '=')
    bad(path, fmt::format("descr '{}' has no byte order", descr));
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d != 0 && numel > (int64_t(1) << 40) / d) bad(path, "the shape is too large");
    numel *= d;
  }
  const size_t bytes = static_cast<size_t>(numel * itemsize(dt));
  if (file.left() < bytes)
    bad(path, fmt::format("truncated data: {} bytes for shape {} {}, the file holds {}", bytes,
                          shape, descr, file.left()));
  if (file.left() > bytes)
    bad(path,
        fmt::format("{} bytes after the data of shape {} {}", file.left() - bytes, shape, descr));
  const bool fortran_order = fortran == "True";
  if (!fortran_order && fortran != "False") bad(path, fmt::format("fortran_order is {}", fortran));
  detail::SuspendModes eager;
  // Fortran order: the values of the transposed shape, in C order.
  Shape stored = shape;
  if (fortran_order) {
    stored = Shape{};
    for (int64_t d = shape.size() - 1; d >= 0; --d) stored.push_back(shape[d]);
  }
  Tensor t = detail::empty(stored, dt);
  char* out = static_cast<char*>(t.raw_data());
  const std::string data = file.read(bytes);
  if (data.size() < bytes) bad(path, "truncated data");
  std::memcpy(out, data.data(), bytes);
  const size_t item = static_cast<size_t>(itemsize(dt));
  if (order == '>' && item > 1)
    for (size_t i = 0; i < bytes; i += item) std::reverse(out + i, out + i + item);
  if (dt == DType::b8)
    for (size_t i = 0; i < bytes; ++i) out[i] = out[i] != 0;
  if (fortran_order && shape.size() > 1) {
    std::vector<int64_t> dims;
    for (int64_t d = shape.size() - 1; d >= 0; --d) dims.push_back(d);
    t = permute(t, dims).contiguous();
  }
  return t;
}

void write_npy(const std::string& path, const Tensor& t) {
  detail::SuspendModes eager;
  const Tensor c = t.detach().to(Device::cpu()).contiguous();
  const char* descr = nullptr;
  switch (c.dtype()) {
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f64:
      descr = "<f8";
      break;
    case DType::f16:
      descr = "<f2";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    case DType::b8:
      descr = "|b1";
      break;
    case DType::i8:
      descr = "|i1";
      break;
    case DType::u8:
      descr = "|u1";
      break;
    case DType::i16:
      descr = "<i2";
      break;
    default:
      throw DTypeError(fmt::format("[write_npy] {}: numpy has no dtype for {}", path, c.dtype()));
  }
  std::string shape;
  for (int64_t d : c.sizes()) shape += fmt::format("{}{}", shape.empty() ? "" : ", ", d);
  if (c.dim() == 1) shape += ",";  // a 1-tuple
  std::string h =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  out += h;
  out.append(static_cast<const char*>(c.raw_data()),
             static_cast<size_t>(c.numel() * itemsize(c.dtype())));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DUET_CHECK_VALUE(f.good(), "[write_npy] cannot write {}: {}", path, std::strerror(errno));
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  DUET_CHECK_VALUE(!f.fail(), "[write_npy] writing {} failed", path);
}

}  // namespace duet::data
