// PyTorch-style printing: tensor([[1.0000, 2.5000],
//                                [3.0000, 4.0000]], shape=(2, 2), dtype=f32, device=cpu)
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace {

constexpr int64_t kSummarizeAbove = 1000;  // elements; then show kEdge items at each end
constexpr int64_t kEdge = 3;

enum class FloatMode { Integer, Fixed, Sci };

struct Printer {
  const Tensor& t;
  bool floating, summarize;
  FloatMode mode = FloatMode::Fixed;
  std::vector<double> f;
  std::vector<int64_t> i;
  int width = 1;

  std::string fmt_elem(int64_t k) const {
    if (t.dtype() == DType::b8) return i[k] ? "True" : "False";
    if (!floating) return std::to_string(i[k]);
    double v = f[k];
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    switch (mode) {
      case FloatMode::Integer:
        return fmt::format("{:.0f}.", v);
      case FloatMode::Sci:
        return fmt::format("{:.4e}", v);
      case FloatMode::Fixed:
        return fmt::format("{:.4f}", v);
    }
    return "";
  }

  // Row-major index of the element at `idx` within the full tensor.
  void rec(std::string& out, int64_t dim, int64_t base, int indent) const {
    const Shape& s = t.sizes();
    if (dim == s.size()) {
      std::string e = fmt_elem(base);
      if (static_cast<int>(e.size()) < width) out.append(width - e.size(), ' ');
      out += e;
      return;
    }
    out += '[';
    int64_t n = s[dim], stride = 1;
    for (int64_t d = dim + 1; d < s.size(); ++d) stride *= s[d];
    bool last = dim + 1 == s.size();
    for (int64_t k = 0; k < n; ++k) {
      if (summarize && n > 2 * kEdge && k == kEdge) {
        // As PyTorch: " ..." in a row; between blocks, "..." with the blocks' separator.
        out += last ? " ..., "
                    : "...," + std::string(s.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
        k = n - kEdge - 1;
        continue;
      }
      rec(out, dim + 1, base + k * stride, indent + 1);
      if (k + 1 < n) {
        if (last)
          out += ", ";
        else
          out += "," + std::string(s.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
      }
    }
    out += ']';
  }

  bool shown(int64_t flat) const {
    if (!summarize) return true;
    const Shape& s = t.sizes();
    for (int64_t d = s.size() - 1; d >= 0; --d) {
      int64_t k = flat % s[d];
      flat /= s[d];
      if (s[d] > 2 * kEdge && k >= kEdge && k < s[d] - kEdge) return false;
    }
    return true;
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  Printer p{*this, is_floating(dtype()), numel() > kSummarizeAbove, FloatMode::Fixed, {}, {}, 1};
  std::string suffix = fmt::format("shape={}, dtype={}, device={})", sizes(), dtype(), device());
  // A traced tensor has no values yet: print what it stands for (printing while tracing is a
  // normal way to look at shapes).
  if (detail::is_traced(*this))
    return fmt::format("tensor(<traced %{} of {}{}>, ", impl()->value, impl()->trace->name,
                       impl()->trace->alive ? "" : ", trace ended") +
           suffix;
  // Device tensors print their values through a copy to the CPU, as in PyTorch; f16 and bf16
  // through f64, which holds each of their values exactly.
  if (p.floating)
    p.f = to_vector<double>();
  else
    p.i = to_vector<int64_t>();
  // Choose the float format from the shown finite values, as PyTorch's _Formatter does.
  if (p.floating) {
    bool all_int = true, any = false;
    double amax = 0, amin = INFINITY;
    for (int64_t k = 0; k < numel(); ++k) {
      double v = p.f[k];
      if (!std::isfinite(v) || !p.shown(k)) continue;
      any = true;
      if (v != std::nearbyint(v)) all_int = false;
      amax = std::max(amax, std::fabs(v));
      if (v != 0) amin = std::min(amin, std::fabs(v));
    }
    if (!any) {
      p.mode = FloatMode::Fixed;
    } else if (all_int) {
      p.mode = amax > 1e8 ? FloatMode::Sci : FloatMode::Integer;
    } else {
      bool sci = amax > 1e8 || (amin != INFINITY && (amax / amin > 1000 || amin < 1e-4));
      p.mode = sci ? FloatMode::Sci : FloatMode::Fixed;
    }
  }
  // As PyTorch's _Formatter: the width of floats comes from the nonzero finite values only.
  for (int64_t k = 0; k < numel(); ++k)
    if (p.shown(k) && (!p.floating || (std::isfinite(p.f[k]) && p.f[k] != 0)))
      p.width = std::max<int>(p.width, static_cast<int>(p.fmt_elem(k).size()));
  std::string body;
  if (numel() == 0 && dim() > 0)
    body = "[]";
  else
    p.rec(body, 0, 0, 7);  // 7 = strlen("tensor(")
  return "tensor(" + body + ", " + suffix;
}

}  // namespace duet
