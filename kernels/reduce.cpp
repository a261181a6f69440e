// CPU kernels of sum, max and min over any dims.
//
// The output is viewed at the input's shape with stride 0 along reduced dims, so one strided
// walk accumulates every input element into its output element. Rows run on packets: a row
// along a reduced dim folds into one value, a row along a kept dim is an elementwise update.
// Threads split a kept dim (so they write disjoint outputs), or, for a full reduction of a
// dense tensor, split the input and combine partials in a fixed order.
#include <limits>

#include "kernels/cpu_kernels.h"
#include "kernels/loops.h"

namespace duet::kernels {
namespace {

template <class T>
struct SumOp {
  using F = fn::Add;
  static T identity() { return T(0); }
  static T fold(const T* x, int64_t n) {
    if constexpr (std::is_floating_point_v<T>)
      return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, n).sum();
    T acc = 0;
    for (int64_t i = 0; i < n; ++i) acc = fn::wrap_add(acc, x[i]);
    return acc;
  }
};
template <class T>
struct MaxOp {
  using F = fn::Maximum;
  static T identity() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::lowest();
  }
  static T fold(const T* x, int64_t n) {
    if constexpr (std::is_floating_point_v<T>)
      return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, n)
          .template maxCoeff<Eigen::PropagateNaN>();
    T acc = identity();
    for (int64_t i = 0; i < n; ++i) acc = F{}(acc, x[i]);
    return acc;
  }
};
template <class T>
struct MinOp {
  using F = fn::Minimum;
  static T identity() {
    if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::max();
  }
  static T fold(const T* x, int64_t n) {
    if constexpr (std::is_floating_point_v<T>)
      return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, n)
          .template minCoeff<Eigen::PropagateNaN>();
    T acc = identity();
    for (int64_t i = 0; i < n; ++i) acc = F{}(acc, x[i]);
    return acc;
  }
};

// Accumulates x into out_view (out at x's shape, stride 0 on reduced dims), serially.
template <class Op, class T>
void accumulate(const Tensor& out_view, const Tensor& x) {
  using F = typename Op::F;
  const F f{};
  Loop<2> L = make_loop<2>(x.sizes(), {&out_view, &x});
  auto row = [&](char** p, const int64_t* s, int64_t n) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* v = reinterpret_cast<const T*>(p[1]);
    if (s[0] == 0) {  // fold the row into one output
      if (s[1] == sizeof(T)) {
        *o = f(*o, Op::fold(v, n));
      } else {
        T acc = *o;
        for (int64_t i = 0; i < n; ++i) acc = f(acc, *reinterpret_cast<const T*>(p[1] + i * s[1]));
        *o = acc;
      }
    } else if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
      binary_dense<T>(f, o, false, v, false, o, n);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        T* oi = reinterpret_cast<T*>(p[0] + i * s[0]);
        *oi = f(*oi, *reinterpret_cast<const T*>(p[1] + i * s[1]));
      }
    }
  };
  if (L.overflow) {
    run_slow<2>(x.sizes(), {&out_view, &x}, row);
    return;
  }
  // Serial walk of the coalesced loop (threads are split by the caller).
  const int64_t nd = L.nd, inner = L.shape[nd - 1];
  int64_t idx[16] = {};
  int64_t rows = L.numel / std::max<int64_t>(inner, 1);
  int64_t ist[2] = {L.strides[0][nd - 1], L.strides[1][nd - 1]};
  for (int64_t r = 0; r < rows; ++r) {
    char* p[2];
    for (int k = 0; k < 2; ++k) {
      int64_t off = 0;
      for (int64_t d = 0; d < nd - 1; ++d) off += idx[d] * L.strides[k][d];
      p[k] = L.base[k] + off;
    }
    row(p, ist, inner);
    for (int64_t d = nd - 2; d >= 0; --d) {
      if (++idx[d] < L.shape[d]) break;
      idx[d] = 0;
    }
  }
}

template <template <class> class OpT>
void reduce_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  // Sums of integers accumulate in the output dtype (i64).
  Tensor x = in[0].dtype() == out.dtype() ? in[0] : cast_to(in[0], out.dtype());
  const int64_t nd = x.dim();
  bool reduced[64] = {};
  if (attrs.ints.empty())
    for (int64_t d = 0; d < nd; ++d) reduced[d] = true;
  else
    for (int64_t d : attrs.ints) reduced[d] = true;
  DUET_DISPATCH_DTYPE(out.dtype(), "reduce", [&] {
    using T = scalar_t;
    using Op = OpT<T>;
    if constexpr (std::is_same_v<T, bool> && std::is_same_v<Op, SumOp<T>>) {
      DUET_ASSERT(false, "bool sums accumulate in i64");
    } else {
      T* po = static_cast<T*>(out.raw_data());
      const int64_t nout = out.numel();
      std::fill(po, po + nout, Op::identity());
      if (x.numel() == 0 || nout == 0) return;
      // The output seen at x's shape: stride 0 along reduced dims.
      Strides vs(nd);
      int64_t st = 1;
      for (int64_t d = nd - 1; d >= 0; --d) {
        vs[d] = reduced[d] ? 0 : st;
        if (!reduced[d]) st *= x.sizes()[d];
      }
      Tensor ov = detail::make_view(out, x.sizes(), vs, out.storage_offset());
      // Full reduction of a dense input: per-thread partials, combined in thread order.
      if (nout == 1 && x.is_contiguous()) {
        const T* px = static_cast<const T*>(x.raw_data());
        const int64_t n = x.numel();
        T partial[64];
        int used = 1;
        int nt = static_cast<int>(std::min<int64_t>(std::min(omp_get_max_threads(), 64),
                                                    std::max<int64_t>(1, n / kParallelGrain)));
        parallel_threads(nt, [&](int t, int k) {
          int64_t chunk = (n + k - 1) / k;
          int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
          partial[t] = b < e ? Op::fold(px + b, e - b) : Op::identity();
          if (t == 0) used = k;
        });
        T acc = Op::identity();
        for (int t = 0; t < used; ++t) acc = typename Op::F{}(acc, partial[t]);
        po[0] = acc;
        return;
      }
      // Split the largest kept dim across threads.
      int64_t split = -1;
      for (int64_t d = 0; d < nd; ++d)
        if (!reduced[d] && (split < 0 || x.sizes()[d] > x.sizes()[split])) split = d;
      int nt = omp_get_max_threads();
      if (split < 0 || nt <= 1 || x.numel() < 2 * kParallelGrain || omp_in_parallel() ||
          x.sizes()[split] < 2) {
        accumulate<Op, T>(ov, x);
        return;
      }
      const int64_t len = x.sizes()[split];
      nt = static_cast<int>(std::min<int64_t>(nt, len));
      parallel_threads(nt, [&](int t, int k) {
        int64_t chunk = (len + k - 1) / k;
        int64_t b = std::min(len, t * chunk), e = std::min(len, b + chunk);
        if (b >= e) return;
        Shape s = x.sizes();
        s[split] = e - b;
        Tensor xs =
            detail::make_view(x, s, x.strides(), x.storage_offset() + b * x.strides()[split]);
        Tensor os = detail::make_view(ov, s, vs, ov.storage_offset() + b * vs[split]);
        accumulate<Op, T>(os, xs);
      });
    }
  });
}

}  // namespace

void register_reduction_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Sum, DeviceType::CPU, reduce_kernel<SumOp>);
  detail::register_kernel(t, OpId::Max, DeviceType::CPU, reduce_kernel<MaxOp>);
  detail::register_kernel(t, OpId::Min, DeviceType::CPU, reduce_kernel<MinOp>);
}

}  // namespace duet::kernels
