// Kernels of Conv2d, Conv2dInputGrad and Conv2dWeightGrad (Note [Conv2d] in core/ops/image.cpp).
//
// Two ways to compute each op, chosen per call:
//  - oneDNN's convolution primitives (CPU, f32; bf16 and f16 where the CPU multiplies them,
//    Note [Low-precision convolutions]): convolution_forward, convolution_backward_data and
//    convolution_backward_weights, on the layouts oneDNN picks for the shape (blocked ones on
//    AVX-512 and AVX2 machines), with reorders from and to duet's NCHW / OIHW. On the machines
//    duet is developed on this is faster than the im2col GEMMs themselves (bench C1).
//  - composed of the Unfold, Fold, MatMul and Copy kernels of the output's device, on
//    temporaries: every other dtype on CPU, shapes that oneDNN refuses, and CUDA (which
//    registers the composed kernels, cuda/kernels/index_ops.cpp).
//
// Note [Low-precision convolutions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where the CPU has instructions for bf16 products (AVX512-BF16 or AMX: low_products_native,
// as for matmul), a bf16 convolution runs on oneDNN's bf16 primitives: every operand and the
// result in bf16, the sums in f32 inside the primitive, rounded once, as PyTorch's CPU bf16
// convolutions are. Before, they ran as every other low-precision kernel does (via_wide: f32
// copies, the f32 primitive, the result rounded), and on an AMX Xeon bench C1 ran at 89 GFLOP/s
// in bf16, below f32's 102 and half PyTorch's 185. Without those instructions oneDNN would
// emulate bf16, slower than that f32 way, which they keep there (as matmul does, Note
// [Low-precision products without the instructions] in kernels/matmul.cpp). f16 takes oneDNN's
// primitives only where DUET_LOW_MATMUL=onednn asks, and the f32 way wherever oneDNN has none.
//
// attrs.ints: the window (core/window.h), oneDNN's dilation counted from 0 where duet's and
// PyTorch's count from 1; attrs.step, the groups g
// (Note [Conv2d] in core/ops/image.cpp): oneDNN takes them as its grouped weights (g, O / g,
// C / g, kh, kw), the composed kernels as a batched product over the g blocks.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <map>
#include <optional>

#include "core/window.h"
#include "kernels/composed.h"
#include "kernels/cpu_kernels.h"
#include "kernels/low_precision.h"
#include "kernels/matrices.h"

namespace duet::kernels {
namespace {

struct ConvGeom : WindowGeometry {
  int64_t n, c, o, groups;
  int64_t ckk() const { return c * kh * kw; }
  int64_t l() const { return ho * wo; }
  // Per group: its input channels' columns and its filters.
  int64_t gckk() const { return ckk() / groups; }
  int64_t go() const { return o / groups; }
};

// x (N, C, H, W) and the filters' (O, kh, kw) from the attributes, C and O all the groups'
// (attrs.step, at least 1: the shape rules check it).
ConvGeom conv_geom(const Attrs& a, int64_t n, int64_t c, int64_t o) {
  ConvGeom g;
  static_cast<WindowGeometry&>(g) = window_geometry(a);
  g.n = n;
  g.c = c;
  g.o = o;
  g.groups = a.step;
  return g;
}

// t itself when contiguous, else a contiguous copy on its device.
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = detail::empty(t.sizes(), t.dtype(), t.device());
  copy_on_device(t, c);
  return c;
}

// A contiguous tensor seen with another shape (row-major strides), or permuted/transposed.
Tensor view(const Tensor& t, const Shape& s, const Strides& st) {
  return detail::make_view(t, s, st, t.storage_offset());
}
Tensor rows(const Tensor& t, const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= std::max<int64_t>(s[d], 1);
  }
  return view(t, s, st);
}

// The columns of x: (N, C*kh*kw, L).
Tensor columns(const Tensor& x, const ConvGeom& g, const Attrs& a) {
  Tensor cols = detail::empty(Shape{g.n, g.ckk(), g.l()}, x.dtype(), x.device());
  run_kernel(OpId::Unfold, {&x}, a, cols);
  return cols;
}

// The columns' rows (C*kh*kw, channel by channel) split into the groups' blocks, one after
// another, and so do the filters (O) and the output channels: each product below is batched
// over the G = groups blocks (a batch of one without groups).

// y (N, G, O/G, L) = w (G, O/G, C/G*kh*kw) @ cols (N, G, C/G*kh*kw, L).
void composed_forward(const Tensor& x, const Tensor& w, const Attrs& a, const Tensor& out,
                      const ConvGeom& g) {
  const Tensor cols = columns(x, g, a);
  const Tensor wd = dense(w);
  const Tensor w3 = rows(wd, Shape{g.groups, g.go(), g.gckk()});
  const Tensor cols4 = rows(cols, Shape{g.n, g.groups, g.gckk(), g.l()});
  const Tensor y4 = rows(out, Shape{g.n, g.groups, g.go(), g.l()});
  run_kernel(OpId::MatMul, {&w3, &cols4}, {}, y4);
}

// dx = fold(w^T (G, C/G*kh*kw, O/G) @ gy (N, G, O/G, L)).
void composed_input_grad(const Tensor& gy, const Tensor& w, const Attrs& a, const Tensor& out,
                         const ConvGeom& g) {
  const Tensor wd = dense(w), gyd = dense(gy);
  const Tensor wt =
      view(wd, Shape{g.groups, g.gckk(), g.go()}, Strides{g.go() * g.gckk(), 1, g.gckk()});
  const Tensor gy4 = rows(gyd, Shape{g.n, g.groups, g.go(), g.l()});
  const Tensor gcols = detail::empty(Shape{g.n, g.ckk(), g.l()}, out.dtype(), out.device());
  const Tensor gcols4 = rows(gcols, Shape{g.n, g.groups, g.gckk(), g.l()});
  run_kernel(OpId::MatMul, {&wt, &gy4}, {}, gcols4);
  run_kernel(OpId::Fold, {&gcols}, a, out);
}

// dw (G, O/G, C/G*kh*kw) = sum over n of gy_n (G, O/G, L) @ cols_n^T: one GEMM per group over
// the batch, with gy and the columns copied to (O, N*L) and (C*kh*kw, N*L).
void composed_weight_grad(const Tensor& x, const Tensor& gy, const Attrs& a, const Tensor& out,
                          const ConvGeom& g) {
  const Tensor cols = columns(x, g, a);
  const Tensor gyd = dense(gy);
  const int64_t nl = g.n * g.l();
  const Tensor gyp = detail::empty(Shape{g.o, g.n, g.l()}, out.dtype(), out.device());
  copy_on_device(view(gyd, Shape{g.o, g.n, g.l()}, Strides{g.l(), g.o * g.l(), 1}), gyp);
  const Tensor colsp = detail::empty(Shape{g.ckk(), g.n, g.l()}, out.dtype(), out.device());
  copy_on_device(view(cols, Shape{g.ckk(), g.n, g.l()}, Strides{g.l(), g.ckk() * g.l(), 1}), colsp);
  const Tensor lhs = rows(gyp, Shape{g.groups, g.go(), nl});
  const Tensor rhs = view(colsp, Shape{g.groups, nl, g.gckk()}, Strides{g.gckk() * nl, 1, nl});
  const Tensor dw = rows(out, Shape{g.groups, g.go(), g.gckk()});
  run_kernel(OpId::MatMul, {&lhs, &rhs}, {}, dw);
}

// ---- oneDNN ----

enum class Pass : int64_t { Forward, InputGrad, WeightGrad };

using dnnl::memory;
using Tag = memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One pass of one convolution shape: the primitive and the layouts it works in.
struct OneDnnConv {
  dnnl::primitive prim;
  memory::desc src, weights, dst;  // diff_src, diff_weights, diff_dst for the gradients
};

using ConvKey = std::array<int64_t, 19>;

// Below kSerialConvFlops (kernels/matrices.h) a convolution runs on the calling thread; its fork
// and join would cost far more on a loaded machine, where the second thread waits for a time
// slice.
constexpr double kSerialFlops = kSerialConvFlops;

// Sets the OpenMP thread count of the calling thread for a scope (oneDNN reads it when it
// builds a primitive and when it runs one).
struct ThreadsGuard {
  int saved;
  explicit ThreadsGuard(int n) : saved(omp_get_max_threads()) {
    if (n != saved) omp_set_num_threads(n);
  }
  ~ThreadsGuard() {
    if (omp_get_max_threads() != saved) omp_set_num_threads(saved);
  }
};

// Whether each filter tap meets the input (not only the padding) at some output position,
// along both dims. oneDNN's bf16 weight gradient (jit:avx512_core_amx_bf16, oneDNN 2.6) gave a
// tap that meets only the padding garbage instead of zero, now and then (a 2x2 filter at stride 3
// and padding 1); such shapes get no low-precision primitive, and take the f32 ones.
bool taps_reach_input(const ConvGeom& g) {
  auto reach = [](int64_t k, int64_t s, int64_t p, int64_t d, int64_t in, int64_t out) {
    for (int64_t t = 0; t < k; ++t) {
      bool met = false;
      for (int64_t o = 0; o < out && !met; ++o)
        met = o * s - p + t * d >= 0 && o * s - p + t * d < in;
      if (!met) return false;
    }
    return true;
  };
  return reach(g.kh, g.sh, g.ph, g.dh, g.h, g.ho) && reach(g.kw, g.sw, g.pw, g.dw, g.w, g.wo);
}

// The filters as oneDNN takes them: (O, C, kh, kw), or grouped (G, O/G, C/G, kh, kw), which is
// duet's (O, C/G, kh, kw) buffer as it is (goihw).
memory::dims weight_dims(const ConvGeom& g) {
  if (g.groups == 1) return {g.o, g.c, g.kh, g.kw};
  return {g.groups, g.go(), g.c / g.groups, g.kh, g.kw};
}

// Builds the primitive, or nothing when oneDNN has no implementation for the shape.
std::optional<OneDnnConv> make_conv(const ConvGeom& g, Pass pass, memory::data_type dt) {
  const memory::dims xd = {g.n, g.c, g.h, g.w}, wd = weight_dims(g), yd = {g.n, g.o, g.ho, g.wo};
  // oneDNN counts the dilation from 0 (taps next to each other), duet from 1 as PyTorch does.
  const memory::dims strides = {g.sh, g.sw}, pad = {g.ph, g.pw}, dilates = {g.dh - 1, g.dw - 1};
  // The bottom and right padding oneDNN needs for the output size duet computes (the last
  // window may stop short of the padded edge when the stride does not divide it).
  const memory::dims pad_r = {(g.ho - 1) * g.sh + g.span_h() - g.h - g.ph,
                              (g.wo - 1) * g.sw + g.span_w() - g.w - g.pw};
  if (dt != memory::data_type::f32 && !taps_reach_input(g)) return std::nullopt;
  const memory::desc x(xd, dt, Tag::any), w(wd, dt, Tag::any), y(yd, dt, Tag::any);
  try {
    dnnl::engine& eng = cpu_engine();
    const dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, x, w, y, strides,
                                        dilates, pad, pad_r),
        eng);
    switch (pass) {
      case Pass::Forward:
        return OneDnnConv{dnnl::convolution_forward(fwd), fwd.src_desc(), fwd.weights_desc(),
                          fwd.dst_desc()};
      case Pass::InputGrad: {
        const dnnl::convolution_backward_data::primitive_desc pd(
            dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, x, w, y,
                                                  strides, dilates, pad, pad_r),
            eng, fwd);
        return OneDnnConv{dnnl::convolution_backward_data(pd), pd.diff_src_desc(),
                          pd.weights_desc(), pd.diff_dst_desc()};
      }
      case Pass::WeightGrad: {
        const dnnl::convolution_backward_weights::primitive_desc pd(
            dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, x, w, y,
                                                     strides, dilates, pad, pad_r),
            eng, fwd);
        return OneDnnConv{dnnl::convolution_backward_weights(pd), pd.src_desc(),
                          pd.diff_weights_desc(), pd.diff_dst_desc()};
      }
    }
  } catch (const dnnl::error&) {
  }
  return std::nullopt;
}

// The primitives of this thread (a primitive runs on one thread at a time; oneDNN's own cache
// makes a second thread's construction of the same shape cheap). Bounded: a model called at
// many batch sizes starts over once it has used kMaxCached shapes.
constexpr size_t kMaxCached = 96;
const OneDnnConv* cached_conv(const ConvGeom& g, Pass pass, int threads, memory::data_type dt) {
  thread_local std::map<ConvKey, std::optional<OneDnnConv>> cache;
  const ConvKey key = {g.n,      g.c,
                       g.h,      g.w,
                       g.o,      g.kh,
                       g.kw,     g.sh,
                       g.sw,     g.ph,
                       g.pw,     g.ho,
                       g.wo,     static_cast<int64_t>(pass),
                       threads,  static_cast<int64_t>(dt),
                       g.groups, g.dh,
                       g.dw};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxCached) cache.clear();
    it = cache.emplace(key, make_conv(g, pass, dt)).first;
  }
  return it->second ? &*it->second : nullptr;
}

// duet's contiguous NCHW / OIHW buffer as a oneDNN memory, and the memory the primitive works
// in: the same one when the layouts agree, else a fresh one (`reorder_in`: filled from the
// user's buffer).
struct Operand {
  memory user, inner;
};
Operand operand(const memory::desc& inner, const memory::dims& dims, Tag tag, void* data,
                bool reorder_in, dnnl::stream& s) {
  dnnl::engine& eng = cpu_engine();
  Operand o{memory({dims, inner.data_type(), tag}, eng, data), {}};
  if (inner == o.user.get_desc()) {
    o.inner = o.user;
  } else {
    o.inner = memory(inner, eng);
    if (reorder_in) dnnl::reorder(o.user, o.inner).execute(s, o.user, o.inner);
  }
  return o;
}

// Runs one pass with oneDNN; false when it has no primitive for the shape (then the caller
// composes the kernels).
bool onednn_conv(Pass pass, const Tensor& a, const Tensor& b, const Tensor& out,
                 const ConvGeom& g) {
  if (g.n == 0 || g.c == 0 || g.o == 0 || g.ho <= 0 || g.wo <= 0) return false;
  const DType dt = out.dtype();
  if (a.dtype() != dt || b.dtype() != dt) return false;
  memory::data_type type = memory::data_type::f32;
  if (dt == DType::bf16 || dt == DType::f16) {  // Note [Low-precision convolutions]
    if (!low_products_native(dt)) return false;
    type = dt == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f16;
  } else if (dt != DType::f32) {
    return false;
  }
  const double flops = 2.0 * static_cast<double>(g.n * g.o * g.l()) * static_cast<double>(g.gckk());
  const ThreadsGuard threads(flops < kSerialFlops ? 1 : omp_get_max_threads());
  const OneDnnConv* conv = cached_conv(g, pass, omp_get_max_threads(), type);
  if (!conv) return false;
  const Tensor ad = dense(a), bd = dense(b);
  auto ptr = [](const Tensor& t) { return const_cast<void*>(t.raw_data()); };
  const memory::dims xd = {g.n, g.c, g.h, g.w}, wd = weight_dims(g), yd = {g.n, g.o, g.ho, g.wo};
  dnnl::stream s(cpu_engine());
  // Which tensor is which: (x, w) -> y, (gy, w) -> gx, (x, gy) -> gw.
  void* px = pass == Pass::InputGrad ? out.raw_data() : ptr(ad);
  void* pw = pass == Pass::WeightGrad ? out.raw_data() : ptr(bd);
  void* py = pass == Pass::Forward ? out.raw_data() : pass == Pass::InputGrad ? ptr(ad) : ptr(bd);
  Operand x = operand(conv->src, xd, Tag::nchw, px, pass != Pass::InputGrad, s);
  Operand w = operand(conv->weights, wd, g.groups == 1 ? Tag::oihw : Tag::goihw, pw,
                      pass != Pass::WeightGrad, s);
  Operand y = operand(conv->dst, yd, Tag::nchw, py, pass != Pass::Forward, s);
  Operand& result = pass == Pass::Forward ? y : pass == Pass::InputGrad ? x : w;
  switch (pass) {
    case Pass::Forward:
      conv->prim.execute(
          s, {{DNNL_ARG_SRC, x.inner}, {DNNL_ARG_WEIGHTS, w.inner}, {DNNL_ARG_DST, y.inner}});
      break;
    case Pass::InputGrad:
      conv->prim.execute(s, {{DNNL_ARG_DIFF_DST, y.inner},
                             {DNNL_ARG_WEIGHTS, w.inner},
                             {DNNL_ARG_DIFF_SRC, x.inner}});
      break;
    case Pass::WeightGrad:
      conv->prim.execute(s, {{DNNL_ARG_SRC, x.inner},
                             {DNNL_ARG_DIFF_DST, y.inner},
                             {DNNL_ARG_DIFF_WEIGHTS, w.inner}});
      break;
  }
  if (result.inner != result.user)
    dnnl::reorder(result.inner, result.user).execute(s, result.inner, result.user);
  s.wait();
  return true;
}

// The geometry of a call from its operands: (x, w) -> y, (gy, w) -> dx, (x, gy) -> dw.
ConvGeom geometry(Pass pass, TensorRefs in, const Attrs& a) {
  const Shape &p = in[0].sizes(), &q = in[1].sizes();
  switch (pass) {
    case Pass::Forward:
      return conv_geom(a, p[0], p[1], q[0]);
    case Pass::InputGrad:  // (the filters hold C/G channels each)
      return conv_geom(a, p[0], q[1] * a.step, q[0]);
    case Pass::WeightGrad:
      break;
  }
  return conv_geom(a, p[0], p[1], q[1]);
}

template <Pass pass>
void composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "the conv2d kernels write a fresh contiguous output");
  const ConvGeom g = geometry(pass, in, a);
  if constexpr (pass == Pass::Forward)
    composed_forward(in[0], in[1], a, out, g);
  else if constexpr (pass == Pass::InputGrad)
    composed_input_grad(in[0], in[1], a, out, g);
  else
    composed_weight_grad(in[0], in[1], a, out, g);
}

template <Pass pass>
void cpu_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "the conv2d kernels write a fresh contiguous output");
  if (onednn_conv(pass, in[0], in[1], out, geometry(pass, in, a))) return;
  composed_kernel<pass>(in, a, out);
}

// bf16 and f16 on oneDNN's primitives for them where it has them (Note [Low-precision
// convolutions]); elsewhere every dtype but f32 computes in its wide dtype (via_wide).
template <Pass pass>
void conv_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "the conv2d kernels write a fresh contiguous output");
  if (is_low_precision(out.dtype()) && onednn_conv(pass, in[0], in[1], out, geometry(pass, in, a)))
    return;
  via_wide<cpu_kernel<pass>>(in, a, out);
}

}  // namespace

void conv2d_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  composed_kernel<Pass::Forward>(in, a, out);
}
void conv2d_input_grad_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  composed_kernel<Pass::InputGrad>(in, a, out);
}
void conv2d_weight_grad_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  composed_kernel<Pass::WeightGrad>(in, a, out);
}

void register_conv_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Conv2d, DeviceType::CPU, conv_kernel<Pass::Forward>);
  detail::register_kernel(t, OpId::Conv2dInputGrad, DeviceType::CPU, conv_kernel<Pass::InputGrad>);
  detail::register_kernel(t, OpId::Conv2dWeightGrad, DeviceType::CPU,
                          conv_kernel<Pass::WeightGrad>);
}

}  // namespace duet::kernels
