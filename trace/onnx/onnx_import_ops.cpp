// ONNX import: one mapping per ONNX op of the default domain, written in duet's public ops, so
// that an imported model runs eagerly and compiled, differentiates where the ops do, and needs no
// kernel of its own. The mappings live in onnx_import_{math,shape,nn,data,image,control}.cpp, one
// list per file; this file holds the helpers they share and the table that joins the lists, the
// only list of mapped ops (docs/onnx.md is generated from it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "core/ops.h"
#include "trace/onnx/onnx_import.h"
#include "trace/onnx/onnx_proto.h"

namespace duet::detail::onnx_import {

namespace io = onnx_io;

Tensor as(const Tensor& t, DType d) { return t.dtype() == d ? t : t.to(d); }

// Exact values: tensor() goes through double.
Tensor i64s(const std::vector<int64_t>& v, Device device) {
  Tensor t = ::duet::detail::empty(Shape{static_cast<int64_t>(v.size())}, DType::i64);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int64_t));
  return device.is_cpu() ? t : t.to(device);
}

Options like(const Tensor& t) { return Options().dtype(t.dtype()).device(t.device()); }

Tensor logical_and_(const Tensor& a, const Tensor& b) {
  return eq(as(a, DType::i32) + as(b, DType::i32), 2);
}

std::vector<int64_t> dims_of(const Tensor& t) { return t.sizes().vec(); }

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < v.size() && i < to; ++i) p *= v[i];
  return p;
}

// x with dim a moved last, and back.
Tensor movedim_last(const Tensor& x, int64_t a) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != a) p.push_back(i);
  p.push_back(a);
  return permute(x, Dims(p));
}
Tensor movedim_first(const Tensor& x, int64_t a) {
  std::vector<int64_t> p{a};
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != a) p.push_back(i);
  return permute(x, Dims(p));
}
Tensor movedim_back(const Tensor& x, int64_t a) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < x.dim() - 1; ++i) p.push_back(i);
  p.insert(p.begin() + a, x.dim() - 1);
  return permute(x, Dims(p));
}
Tensor bools(const Shape& shape, bool v, Device d) {
  return full(shape, v, Options().dtype(DType::b8).device(d));
}

DType dtype_attr(const Node& n, const char* name, DType fallback) {
  if (!n.has_attr(name)) return fallback;
  const int32_t e = static_cast<int32_t>(n.attr_i(name, 0));
  std::optional<DType> d = io::dtype_of(e);
  if (!d) io::unsupported_elem_type(e, fmt::format("attribute {} of {}", name, n.where()));
  return *d;
}

// A gather of the indices n-1, ..., 0.
Tensor flip(const Tensor& x, int64_t dim) {
  const int64_t len = x.sizes()[dim];
  std::vector<int64_t> idx(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) idx[static_cast<size_t>(i)] = len - 1 - i;
  return index_select(x, dim, i64s(idx, x.device()));
}

Tensor wrap_index(const Tensor& idx, int64_t len) {
  Tensor i = as(idx, DType::i64);
  return where(lt(i, 0), i + len, i);
}

// The (rows, cols) mask of the last two dims where col - row compares with k.
Tensor diagonal_offsets(int64_t rows, int64_t cols, Device d) {
  Tensor r = reshape(arange(rows, Options().device(d)), {rows, 1});
  Tensor c = reshape(arange(cols, Options().device(d)), {1, cols});
  return c - r;
}

Tensor matmul_any(const Tensor& a, const Tensor& b) {
  if (is_floating(a.dtype())) return matmul(a, b);
  return as(matmul(as(a, DType::f64), as(b, DType::f64)), a.dtype());
}

Tensor pad_nd(const Node& n, Tensor x, const std::vector<int64_t>& pads, const std::string& mode,
              const Tensor& value) {
  const int64_t r = x.dim();
  for (int64_t a = 0; a < r; ++a) {
    int64_t b = pads[static_cast<size_t>(a)], e = pads[static_cast<size_t>(a + r)];
    const int64_t len = x.sizes()[a];
    check_pad_dim(n, x.sizes(), a, b, e, mode);
    if (b < 0) x = slice(x, a, -b, len), b = 0;
    if (e < 0) x = slice(x, a, 0, x.sizes()[a] + e), e = 0;
    if (b == 0 && e == 0) continue;
    const int64_t m = x.sizes()[a];
    if (mode == "constant") {
      std::vector<Tensor> parts;
      std::vector<int64_t> s = dims_of(x);
      auto block = [&](int64_t k) {
        s[static_cast<size_t>(a)] = k;
        return expand(reshape(as(value, x.dtype()), {}), Shape(s)).contiguous();
      };
      if (b) parts.push_back(block(b));
      parts.push_back(x);
      if (e) parts.push_back(block(e));
      x = cat(parts, a);
      continue;
    }
    std::vector<int64_t> idx;
    for (int64_t k = -b; k < m + e; ++k) {
      int64_t j = k;
      if (mode == "edge") {
        j = std::clamp<int64_t>(k, 0, m - 1);
      } else if (mode == "reflect") {
        if (m == 1) j = 0;
        while (j < 0 || j >= m) j = j < 0 ? -j : 2 * (m - 1) - j;
      } else {
        n.fail(fmt::format("pad mode \"{}\" is not supported (constant, reflect, edge)", mode));
      }
      idx.push_back(j);
    }
    x = index_select(x, a, i64s(idx, x.device()));
  }
  return x;
}

namespace {
// Every mapped op, by name. An op absent here raises the "no mapping" error at import.
const std::map<std::string, ImportFn>& table() {
  static const std::map<std::string, ImportFn> t = [] {
    std::map<std::string, ImportFn> r;
    for (auto* part : {math_ops, shape_ops, nn_ops, data_ops, image_ops, control_ops})
      for (const OpEntry& e : part())
        if (!r.emplace(e.name, e.fn).second)
          throw InternalError(fmt::format("[import_onnx] {} is mapped twice", e.name));
    return r;
  }();
  return t;
}
}  // namespace

std::string op_key(const onnx::NodeProto& n) {
  if (n.domain().empty() || n.domain() == "ai.onnx") return n.op_type();
  if (n.domain() == "ai.onnx.preview.training") return n.domain() + "." + n.op_type();
  return "";
}

ImportFn find_op(const std::string& op_type) {
  auto it = table().find(op_type);
  return it == table().end() ? nullptr : it->second;
}

std::vector<std::string> mapped_ops() {
  std::vector<std::string> r;
  for (const auto& [name, fn] : table()) r.push_back(name);
  return r;
}

bool is_random(const std::string& op_type) {
  return op_type == "Dropout" || op_type.starts_with("Random") || op_type == "Bernoulli" ||
         op_type == "Multinomial";
}

}  // namespace duet::detail::onnx_import
