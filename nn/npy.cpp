// NumPy .npy files (nn/data.h): the format of numpy.lib.format. A file is the magic
// "\x93NUMPY", a version (major, minor), a header length (u16 for 1.x, u32 for 2.x and 3.x),
// and a header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces to a multiple of 64 bytes and ended by a newline; then the raw values.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/dispatch.h"
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

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, fmt::format("cannot open it ({})", std::strerror(errno)));
  std::ostringstream buf;
  buf << f.rdbuf();
  const std::string b = buf.str();
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) bad(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(b[6]);
  if (major < 1 || major > 3) bad(path, fmt::format("format version {} is not 1, 2 or 3", major));
  size_t hlen, at;
  if (major == 1) {
    hlen = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8);
    at = 10;
  } else {
    if (b.size() < 12) bad(path, "truncated header");
    hlen = 0;
    for (int k = 3; k >= 0; --k) hlen = (hlen << 8) | static_cast<unsigned char>(b[8 + k]);
    at = 12;
  }
  if (b.size() < at + hlen) bad(path, "truncated header");
  const std::string h = b.substr(at, hlen);
  at += hlen;
  std::string descr = dict_value(h, "descr", path);
  const std::string fortran = dict_value(h, "fortran_order", path);
  const std::string shape_text = dict_value(h, "shape", path);
  if (descr.size() < 4) bad(path, fmt::format("descr {} is no dtype", descr));
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
  else
    throw DTypeError(fmt::format(
        "[read_npy] {}: dtype '{}' is not one duet has (f4, f8, f2, i4, i8, b1)", path, descr));
  if (order != '<' && order != '>' && order != '|' && order != '=')
    bad(path, fmt::format("descr '{}' has no byte order", descr));
  Shape shape;
  {
    std::string s = shape_text.substr(1, shape_text.size() - 2);
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
      item.erase(std::remove(item.begin(), item.end(), ' '), item.end());
      if (item.empty()) continue;
      if (!std::all_of(item.begin(), item.end(), [](char c) { return std::isdigit(c); }) ||
          item.size() > 15)
        bad(path, fmt::format("shape {} is not a tuple of sizes", shape_text));
      shape.push_back(std::stoll(item));
    }
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d != 0 && numel > (int64_t(1) << 40) / d) bad(path, "the shape is too large");
    numel *= d;
  }
  const size_t bytes = static_cast<size_t>(numel * itemsize(dt));
  if (b.size() - at < bytes)
    bad(path, fmt::format("truncated data: {} bytes for shape {} {}, the file holds {}", bytes,
                          shape, descr, b.size() - at));
  if (b.size() - at > bytes)
    bad(path,
        fmt::format("{} bytes after the data of shape {} {}", b.size() - at - bytes, shape, descr));
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
  std::memcpy(out, b.data() + at, bytes);
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
