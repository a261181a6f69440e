// duet: CUDA adapters of the elementwise ops, conversions, sources and slice_scatter, mirroring
// kernels/elementwise.cpp: inputs whose dtype differs from the compute dtype are converted
// first (host wrapped numbers on the host, device tensors by the convert kernel).
#include <cstring>

#include "kernels/composed.h"
#include "kernels/low_precision.h"
#include "cuda/kernels/adapt.h"
#include "cuda/runtime.h"

namespace duet::cuda::detail {

cudaStream_t stream_for(const Tensor& out) {
  set_device(out.device());
  return stream(out.device());
}

kern::Operand make_operand(const Tensor& t, DType dtype) {
  kern::Operand o;
  if (!t.device().is_cuda()) {
    DUET_ASSERT(t.numel() == 1, "a host operand of a CUDA kernel must be a single number");
    o.by_value = true;
    if (is_low_precision(dtype)) {  // a number converted to f16 or bf16, through f32
      const uint16_t bits =
          float_to_low_precision(static_cast<float>(duet::detail::read_double(t, 0)), dtype);
      std::memcpy(o.value, &bits, sizeof(bits));
      return o;
    }
    DUET_DISPATCH_DTYPE(dtype, "cuda", [&] {
      using T = scalar_t;
      const T v = DUET_DISPATCH_DTYPE(t.dtype(), "cuda", [&] {
        const scalar_t s = *static_cast<const scalar_t*>(t.raw_data());
        if constexpr (std::is_same_v<T, bool>)
          return static_cast<T>(s != scalar_t(0));
        else
          return static_cast<T>(s);
      });
      std::memcpy(o.value, &v, sizeof(T));
    });
    return o;
  }
  o.data = t.raw_data();
  return o;
}

namespace {

// Loop dims before coalescing: up to 64, each with one stride per operand.
struct RawLoop {
  int64_t nd = 0;
  int64_t sizes[64];
  int64_t strides[4][64];
};

void coalesce(RawLoop& R, int nops, kern::Loop& L) {
  // Drop size-1 dims, then merge a dim into its inner neighbour when every operand steps
  // through both as one.
  int64_t nd = 0;
  for (int64_t d = 0; d < R.nd; ++d) {
    if (R.sizes[d] == 1) continue;
    R.sizes[nd] = R.sizes[d];
    for (int k = 0; k < nops; ++k) R.strides[k][nd] = R.strides[k][d];
    ++nd;
  }
  int64_t m = 0;  // merged dims, written in place
  for (int64_t d = 0; d < nd; ++d) {
    bool merge = m > 0;
    for (int k = 0; k < nops && merge; ++k)
      merge = R.strides[k][m - 1] == R.strides[k][d] * R.sizes[d];
    if (merge) {
      R.sizes[m - 1] *= R.sizes[d];
      for (int k = 0; k < nops; ++k) R.strides[k][m - 1] = R.strides[k][d];
    } else {
      R.sizes[m] = R.sizes[d];
      for (int k = 0; k < nops; ++k) R.strides[k][m] = R.strides[k][d];
      ++m;
    }
  }
  DUET_CHECK(m <= kern::kMaxDims,
             "[cuda] a loop over {} non-mergeable dims exceeds the {} a CUDA "
             "kernel walks; make the operands contiguous first",
             m, kern::kMaxDims);
  if (m == 0) {  // one element
    m = 1;
    R.sizes[0] = 1;
    for (int k = 0; k < nops; ++k) R.strides[k][0] = 0;
  }
  L.ndim = static_cast<int>(m);
  for (int64_t d = 0; d < m; ++d) {
    L.sizes[d] = R.sizes[d];
    L.out.strides[d] = R.strides[0][d];
    for (int k = 1; k < nops; ++k) L.in[k - 1].strides[d] = R.strides[k][d];
  }
}

}  // namespace

kern::Loop make_loop(const Tensor& out, std::initializer_list<const Tensor*> ins,
                     std::initializer_list<DType> dtypes) {
  kern::Loop L;
  const Shape& shape = out.sizes();
  const int64_t r = shape.size();
  DUET_CHECK(r <= 64, "[cuda] rank {} is too large", r);
  L.numel = shape.numel();
  RawLoop R;
  R.nd = r;
  for (int64_t d = 0; d < r; ++d) {
    R.sizes[d] = shape[d];
    R.strides[0][d] = out.strides()[d];
  }
  L.out.data = out.raw_data();
  int k = 0;
  auto dt = dtypes.begin();
  for (const Tensor* t : ins) {
    L.in[k] = make_operand(*t, *dt++);
    const int64_t tr = t->dim();
    for (int64_t d = 0; d < r; ++d) {
      const int64_t td = d - (r - tr);
      R.strides[k + 1][d] =
          L.in[k].by_value || td < 0 || t->sizes()[td] == 1 ? 0 : t->strides()[td];
    }
    ++k;
  }
  coalesce(R, k + 1, L);
  return L;
}

void copy_into(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  cudaStream_t s = stream_for(dst);
  if (src.device().is_cuda() && src.dtype() == dst.dtype() && src.is_contiguous() &&
      dst.is_contiguous() && src.sizes() == dst.sizes()) {
    if (src.raw_data() != dst.raw_data())
      DUET_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(),
                                      dst.numel() * itemsize(dst.dtype()), cudaMemcpyDeviceToDevice,
                                      s));
    return;
  }
  const kern::Loop L = make_loop(dst, {&src}, {src.device().is_cuda() ? src.dtype() : dst.dtype()});
  if (L.in[0].by_value) {  // converted on the host already
    DUET_CUDA_CHECK(kern::launch_convert(to_dt(dst.dtype()), to_dt(dst.dtype()), L, s));
    return;
  }
  DUET_CUDA_CHECK(kern::launch_convert(to_dt(dst.dtype()), to_dt(src.dtype()), L, s));
}

const Tensor& in_dtype(const Tensor& t, DType dt, Tensor& tmp) {
  if (t.dtype() == dt || !t.device().is_cuda()) return t;
  tmp = duet::detail::empty(t.sizes(), dt, t.device());
  copy_into(t, tmp);
  return tmp;
}

namespace {

bool is_float(DType d) { return d == DType::f32 || d == DType::f64; }

void check_dtype(bool ok, const char* op, DType d) {
  DUET_CHECK_DTYPE(ok, "[{}] has no CUDA kernel for dtype {}", op, dtype_name(d));
}

template <kern::Unary Op, bool FloatOnly>
void unary_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const DType ct = out.dtype();
  check_dtype(FloatOnly ? is_float(ct) : ct != DType::b8 && ct != DType::f16 && ct != DType::bf16,
              "unary", ct);
  Tensor tx;
  const Tensor& x = in_dtype(in[0], ct, tx);
  const kern::Loop L = make_loop(out, {&x}, {ct});
  DUET_CUDA_CHECK(kern::launch_unary(Op, to_dt(ct), L, stream_for(out)));
}

template <kern::Binary Op, bool Compare>
void binary_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const DType ct = Compare ? duet::detail::result_type(in) : out.dtype();
  check_dtype(ct != DType::f16 && ct != DType::bf16 && (Op != kern::Binary::Div || is_float(ct)),
              "binary", ct);
  Tensor ta, tb;
  const Tensor& a = in_dtype(in[0], ct, ta);
  const Tensor& b = in_dtype(in[1], ct, tb);
  const kern::Loop L = make_loop(out, {&a, &b}, {ct, ct});
  DUET_CUDA_CHECK(kern::launch_binary(Op, to_dt(ct), L, stream_for(out)));
}

void where_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const DType ct = out.dtype();
  check_dtype(ct != DType::f16 && ct != DType::bf16, "where", ct);
  Tensor ta, tb;
  const Tensor& a = in_dtype(in[1], ct, ta);
  const Tensor& b = in_dtype(in[2], ct, tb);
  const kern::Loop L = make_loop(out, {&in[0], &a, &b}, {DType::b8, ct, ct});
  DUET_CUDA_CHECK(kern::launch_where(to_dt(ct), L, stream_for(out)));
}

void convert_kernel(TensorRefs in, const Attrs&, const Tensor& out) { copy_into(in[0], out); }

void full_kernel(TensorRefs, const Attrs& a, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "full writes a fresh contiguous output");
  alignas(8) unsigned char value[8] = {};
  DUET_DISPATCH_DTYPE(out.dtype(), "full", [&] {
    const scalar_t v = a.value.to<scalar_t>();
    std::memcpy(value, &v, sizeof(v));
  });
  DUET_CUDA_CHECK(
      kern::launch_full(to_dt(out.dtype()), out.raw_data(), out.numel(), value, stream_for(out)));
}

void arange_kernel(TensorRefs, const Attrs&, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "arange writes a fresh contiguous output");
  check_dtype(out.dtype() != DType::f16 && out.dtype() != DType::bf16, "arange", out.dtype());
  DUET_CUDA_CHECK(
      kern::launch_arange(to_dt(out.dtype()), out.raw_data(), out.numel(), stream_for(out)));
}

}  // namespace

void register_elementwise(OpDef* t) {
  using kern::Binary;
  using kern::Unary;
  auto reg = [&](OpId op, KernelFn k) {
    duet::detail::register_kernel(t, op, DeviceType::CUDA, k);
  };
  // f16 and bf16 compute in f32 around the f32 kernels (Note [Low precision] in
  // kernels/low_precision.h); the conversions and the copies handle them themselves.
  using duet::kernels::via_wide;
#define DUET_UNARY(Name, name, math, doc) \
  reg(OpId::Name, via_wide<unary_kernel<Unary::Name, UnaryMath::math == UnaryMath::Float>>);
#define DUET_BINARY(Name, name, doc) reg(OpId::Name, via_wide<binary_kernel<Binary::Name, false>>);
#define DUET_COMPARE(Name, name, expr, doc) \
  reg(OpId::Name, via_wide<binary_kernel<Binary::Name, true>>);
#include "core/elementwise.def"
  reg(OpId::Where, via_wide<where_kernel>);
  reg(OpId::Cast, convert_kernel);
  reg(OpId::Copy, convert_kernel);
  reg(OpId::SliceScatter, duet::kernels::slice_scatter_kernel);
  reg(OpId::Full, via_wide<full_kernel>);
  reg(OpId::Arange, via_wide<arange_kernel>);
}

}  // namespace duet::cuda::detail
