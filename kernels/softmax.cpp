// duet: log_softmax's kernels (kernels/softmax.h).
#include "kernels/softmax.h"

#include <Eigen/Core>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "kernels/loops.h"
#include "kernels/low_precision.h"

namespace duet::kernels {
namespace {

// The row's maximum as the composite takes it: 0 where it is +-inf (NaN stays NaN).
template <class T>
T stable_max(T m) {
  return std::isinf(m) ? T(0) : m;
}

// y = z - log(sum(exp(z))), z = x - m, over a contiguous row of n.
template <class T>
void log_softmax_row(const T* x, T* y, int64_t n) {
  using Row = Eigen::Array<T, Eigen::Dynamic, 1>;
  const Eigen::Map<const Row> xr(x, n);
  Eigen::Map<Row> yr(y, n);
  const T m = stable_max(xr.template maxCoeff<Eigen::PropagateNaN>());
  yr = xr - m;
  yr -= std::log(yr.exp().sum());
}

// A row of n, `step` apart, as C (the compute type), and back.
template <class In, class C>
void load_row(const In* x, int64_t step, int64_t n, C* dst) {
  if constexpr (std::is_same_v<In, bf16_t> && std::is_same_v<C, float>) {
    if (step == 1) return widen_bf16(x, dst, n);
  }
  for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<C>(x[k * step]);
}
template <class C, class Out>
void store_row(const C* src, int64_t n, Out* y, int64_t step) {
  if constexpr (std::is_same_v<Out, bf16_t> && std::is_same_v<C, float>) {
    if (step == 1) return round_to_bf16(src, y, n);
  }
  for (int64_t k = 0; k < n; ++k) y[k * step] = static_cast<Out>(src[k]);
}

// rows rows of n along the dim, inner apart (1: each row contiguous), computed in C: f64 for
// f64, f32 for the others. A contiguous row of C is read in place, and one of the result is
// written in place (bf16 logits to f32 log-probabilities, as cross_entropy asks); other rows go
// through a buffer.
template <class In, class Out>
void log_softmax_rows(const In* px, Out* py, int64_t rows, int64_t n, int64_t inner) {
  using C = std::conditional_t<std::is_same_v<In, double>, double, float>;
  constexpr bool read_c = std::is_same_v<In, C>, write_c = std::is_same_v<Out, C>;
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t b, int64_t e) {
    std::vector<C> in_row, out_row;
    if (!read_c || inner != 1) in_row.resize(static_cast<size_t>(n));
    if (!write_c || inner != 1) out_row.resize(static_cast<size_t>(n));
    for (int64_t r = b; r < e; ++r) {
      const int64_t start = (r / inner) * n * inner + r % inner;
      const C* x = nullptr;
      if constexpr (read_c) x = px + start;
      if (!read_c || inner != 1) {
        load_row(px + start, inner, n, in_row.data());
        x = in_row.data();
      }
      if constexpr (write_c) {
        if (inner == 1) {
          log_softmax_row(x, py + start, n);
          continue;
        }
      }
      log_softmax_row(x, out_row.data(), n);
      store_row(out_row.data(), n, py + start, inner);
    }
  });
}

// The CPU kernel: row by row along the dim, each row's steps (its maximum, the difference, the
// sum of exp, the log subtracted) run while it is in cache, with no scratch but a row's buffer;
// f16 and bf16 read and written as they are, computed in f32.
void log_softmax_cpu(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  if (out.numel() == 0) return;
  const Tensor x = in[0].is_contiguous() ? in[0] : cast_to(in[0], in[0].dtype());
  const Shape& s = x.sizes();
  const int64_t dim = s.size() ? attrs.dim : 0;
  const int64_t n = s.size() ? s[dim] : 1;
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t rows = x.numel() / n;  // (outer * inner; n > 0 as out is not empty)
  auto go = [&](auto in_type, auto out_type) {
    using In = decltype(in_type);
    using Out = decltype(out_type);
    log_softmax_rows(static_cast<const In*>(x.raw_data()), static_cast<Out*>(out.raw_data()), rows,
                     n, inner);
  };
  const DType di = x.dtype(), dout = out.dtype();
  if (di == DType::f64) return go(double(), double());
  if (di == DType::f32) return go(float(), float());
  if (di == DType::bf16) return dout == DType::f32 ? go(bf16_t(), float()) : go(bf16_t(), bf16_t());
  DUET_ASSERT(di == DType::f16, "the log_softmax shape rule takes floating inputs only");
  return dout == DType::f32 ? go(f16_t(), float()) : go(f16_t(), f16_t());
}

}  // namespace

void log_softmax_composed(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  if (out.numel() == 0) return;
  // A 0-d input is a row of one.
  const Tensor& x0 = in[0];
  const bool scalar = x0.dim() == 0;
  const Tensor x = scalar ? detail::make_view(x0, Shape{1}, Strides{1}, x0.storage_offset()) : x0;
  const Tensor y =
      scalar ? detail::make_view(out, Shape{1}, Strides{1}, out.storage_offset()) : out;
  const DType dt = x.dtype();
  const Device dv = out.device();
  Shape row = x.sizes();  // one value per row: the dim kept, of size 1
  row[attrs.dim] = 1;
  Attrs along;  // a reduction over the dim, kept
  along.ints = {attrs.dim};
  along.keepdim = true;
  // m: the row's maximum, or 0 where that is not finite (m - m is 0 only where m is finite; a
  // NaN row gives NaN either way).
  const Tensor m = detail::empty(row, dt, dv), s = detail::empty(row, dt, dv);
  const Tensor finite = detail::empty(row, DType::b8, dv);
  const Tensor zero = detail::wrap_scalar(0.0, DType::f64, dv);
  run_kernel(OpId::Max, {&x}, along, m);
  run_kernel(OpId::Sub, {&m, &m}, {}, s);
  run_kernel(OpId::Eq, {&s, &zero}, {}, finite);
  run_kernel(OpId::Where, {&finite, &m, &zero}, {}, m);
  // y = z - log(sum(exp(z))), z = x - m; exp(z) is made in y, then z again.
  run_kernel(OpId::Sub, {&x, &m}, {}, y);
  run_kernel(OpId::Exp, {&y}, {}, y);
  run_kernel(OpId::Sum, {&y}, along, s);
  run_kernel(OpId::Log, {&s}, {}, s);
  run_kernel(OpId::Sub, {&x, &m}, {}, y);
  run_kernel(OpId::Sub, {&y, &s}, {}, y);
}

void register_softmax_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::LogSoftmax, DeviceType::CPU, log_softmax_cpu);
}

}  // namespace duet::kernels
