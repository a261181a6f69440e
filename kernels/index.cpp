// CPU kernels of the indexing and joining ops: gather, scatter_add, cat, argmax, argsort.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/ops.h"
#include "kernels/composed.h"
#include "kernels/cpu_kernels.h"
#include "kernels/low_precision.h"
#include "kernels/loops.h"

namespace duet::kernels {
namespace {

// Index values are data, so they are checked here (before any parallel region), not by the
// shape rule.
void check_indices(const char* op, const Tensor& index, int64_t size, int64_t dim) {
  // A broadcast dim (stride 0, as index_select's expanded index) repeats the same values: each
  // is checked once, without materializing the broadcast.
  Shape s = index.sizes();
  for (int64_t d = 0; d < s.size(); ++d)
    if (index.strides()[d] == 0) s[d] = std::min<int64_t>(s[d], 1);
  Tensor idx = detail::make_view(index, s, index.strides(), index.storage_offset()).contiguous();
  const int64_t* p = static_cast<const int64_t*>(idx.raw_data());
  for (int64_t i = 0; i < idx.numel(); ++i)
    DUET_CHECK_T(p[i] >= 0 && p[i] < size, ValueError,
                 "[{}] index {} is out of range for dim {} of size {}", op, p[i], dim, size);
}

// x viewed at the index's shape with stride 0 along `dim`: a walk over it lands on the row
// that the index then moves along. A 0-d x is one row of one element.
Tensor base_view(const Tensor& x, const Tensor& index, int64_t dim) {
  Strides st = x.strides();
  if (x.dim()) st[dim] = 0;
  return detail::make_view(x, index.sizes(), st, x.storage_offset());
}
int64_t size_along(const Tensor& x, int64_t dim) { return x.dim() ? x.sizes()[dim] : 1; }
int64_t stride_along(const Tensor& x, int64_t dim) { return x.dim() ? x.strides()[dim] : 0; }

// in[0]: x, in[1]: index (i64, x's rank); attrs.dim. out has the index's shape.
void gather_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor &x = in[0], &index = in[1];
  if (out.numel() == 0) return;
  check_indices("gather", index, size_along(x, a.dim), a.dim);
  Tensor xv = base_view(x, index, a.dim);
  const int64_t step = stride_along(x, a.dim);
  // Elements are moved as their bits, in an unsigned integer of their size, for every dtype: a
  // bf16 embedding lookup went through f32 copies of its whole table (via_wide), 100x the time
  // of the same lookup in f32.
  bits_of_size(itemsize(out.dtype()), [&](auto zero) {
    using T = decltype(zero);
    for_each<3>(out.sizes(), {&out, &index, &xv}, [&](char** p, const int64_t* s, int64_t n) {
      // An index constant along the row (index_select's broadcast index, embedding lookups):
      // one row of x, copied.
      if (s[1] == 0 && s[0] == sizeof(T) && s[2] == sizeof(T)) {
        const int64_t j = *reinterpret_cast<const int64_t*>(p[1]);
        std::memcpy(p[0], reinterpret_cast<const T*>(p[2]) + j * step, n * sizeof(T));
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            reinterpret_cast<const T*>(p[2] + i * s[2])[j * step];
      }
    });
  });
}

// Whether a scatter_add is index_select's gradient: along dim 0 of an index broadcast along the
// other dims, into a contiguous out, from a src of out's rows and dtype.
bool whole_rows(const Tensor& index, const Tensor& src, const Attrs& a, const Tensor& out) {
  const auto *i = index.unsafe_impl(), *s = src.unsafe_impl(), *o = out.unsafe_impl();
  if (a.dim != 0 || o->shape.size() == 0 || !o->contiguous || s->shape.size() != o->shape.size() ||
      s->shape != i->shape || s->dtype != o->dtype || !detail::index_rows(index))
    return false;
  for (int64_t d = 1; d < o->shape.size(); ++d)
    if (s->shape[d] != o->shape[d]) return false;
  return true;
}

// That scatter_add: whole rows added, one after another (false: another layout, for the general
// loop).
bool add_rows(const Tensor& index, const Tensor& src_in, const Attrs& a, const Tensor& out) {
  if (!whole_rows(index, src_in, a, out)) return false;
  const auto *i = index.unsafe_impl(), *s = src_in.unsafe_impl();
  // A strided src (a gradient that is a slice or an expand of another) is copied first: one
  // pass, where the element-by-element loop below would look up the index at every element.
  Tensor held;
  const Tensor& src = s->contiguous ? src_in : (held = cast_to(src_in, src_in.dtype()));
  const int64_t rows = s->shape[0], len = s->shape.numel() / std::max<int64_t>(rows, 1);
  const auto* at = index.data_ptr<int64_t>();
  const int64_t step = i->strides[0];
  DUET_DISPATCH_DTYPE(out.dtype(), "scatter_add", [&] {
    using T = scalar_t;
    T* dst = out.data_ptr<T>();
    const T* from = src.data_ptr<T>();
    for (int64_t r = 0; r < rows; ++r) {
      T* row = dst + at[r * step] * len;
      const T* add = from + r * len;
      for (int64_t k = 0; k < len; ++k) row[k] = fn::wrap_add(row[k], add[k]);
    }
  });
  return true;
}

// in[0]: base, in[1]: index, in[2]: src (index's shape); attrs.dim. out = base, then
// out[..., index[p], ...] += src[p]. Serial, in row-major order of the index: two positions may
// hit the same element.
void scatter_add_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor &base = in[0], &index = in[1], &src = in[2];
  // In place (scatter_add_, which the backward uses to add rows into a gradient), base is out.
  const auto *b = base.unsafe_impl(), *o = out.unsafe_impl();
  if (b->storage.get() != o->storage.get() || b->offset != o->offset || b->strides != o->strides)
    copy_into(base, out);
  if (index.numel() == 0) return;
  check_indices("scatter_add", index, size_along(out, a.dim), a.dim);
  if (add_rows(index, src, a, out)) return;
  Tensor ov = base_view(out, index, a.dim);
  const int64_t step = stride_along(out, a.dim);
  DUET_DISPATCH_DTYPE(out.dtype(), "scatter_add", [&] {
    using T = scalar_t;
    const std::array<const Tensor*, 3> ops{&ov, &index, &src};
    for_each_serial<3>(index.sizes(), ops, [&](char** p, const int64_t* s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
        T& o = reinterpret_cast<T*>(p[0] + i * s[0])[j * step];
        o = fn::wrap_add(o, *reinterpret_cast<const T*>(p[2] + i * s[2]));
      }
    });
  });
}

// index_select's gradient in f16 or bf16 (add_rows' case: whole rows of a contiguous out, dim
// 0): via_wide widened the whole of out (an embedding's table) to f32, added the rows and rounded
// it all back, a pass over the table each way for a few rows. Only the rows the index touches are
// widened here, each once; the rows of src are added in f32 in the index's order and each touched
// row is rounded once at the end: the same values as via_wide's, where a row that appears twice
// sums in f32 before its one rounding. Untouched rows keep their bits. False: another case.
bool add_rows_low(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor &base = in[0], &index = in[1], &src_in = in[2];
  const DType dt = out.dtype();
  if (!is_low_precision(dt) || base.dtype() != dt || !whole_rows(index, src_in, a, out))
    return false;
  const auto *i = index.unsafe_impl(), *s = src_in.unsafe_impl(), *o = out.unsafe_impl();
  const auto* bi = base.unsafe_impl();
  if (bi->storage.get() != o->storage.get() || bi->offset != o->offset || bi->strides != o->strides)
    copy_into(base, out);
  if (index.numel() == 0) return true;
  check_indices("scatter_add", index, o->shape[0], 0);
  Tensor held;
  const Tensor& src = s->contiguous ? src_in : (held = cast_to(src_in, dt));
  const int64_t rows = s->shape[0], len = s->shape.numel() / std::max<int64_t>(rows, 1);
  const auto* at = index.data_ptr<int64_t>();
  const int64_t step = i->strides[0];
  auto* dst = static_cast<uint16_t*>(out.raw_data());
  const auto* from = static_cast<const uint16_t*>(src.raw_data());
  std::vector<int32_t> slot(static_cast<size_t>(o->shape[0]), -1);
  std::vector<int64_t> touched;
  std::vector<float> acc, row(static_cast<size_t>(len));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = at[r * step];
    int32_t& k = slot[static_cast<size_t>(j)];
    if (k < 0) {
      k = static_cast<int32_t>(touched.size());
      touched.push_back(j);
      acc.resize(touched.size() * static_cast<size_t>(len));
      widen_low_row(dt, dst + j * len, acc.data() + static_cast<size_t>(k) * len, len);
    }
    widen_low_row(dt, from + r * len, row.data(), len);
    float* sum = acc.data() + static_cast<size_t>(k) * len;
    for (int64_t c = 0; c < len; ++c) sum[c] += row[static_cast<size_t>(c)];
  }
  for (size_t k = 0; k < touched.size(); ++k)
    round_low(acc.data() + k * static_cast<size_t>(len), len, dt, dst + touched[k] * len);
  return true;
}

void scatter_add_any_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  if (add_rows_low(in, a, out)) return;
  via_wide<scatter_add_kernel>(in, a, out);
}

// The first index of the largest value along attrs.dim (NaN counts as largest, as PyTorch).
void argmax_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor& x = in[0];
  const int64_t len = x.dim() ? x.sizes()[a.dim] : 1;
  const int64_t step = x.dim() ? x.strides()[a.dim] : 0;
  Shape s = x.sizes();
  Strides st = x.strides();
  if (x.dim()) {
    s[a.dim] = 1;
    st[a.dim] = 0;
  }
  Tensor xv = detail::make_view(x, s, st, x.storage_offset());
  Tensor ov = detail::make_view(out, s, detail::contiguous_strides(s), out.storage_offset());
  DUET_DISPATCH_DTYPE(x.dtype(), "argmax", [&] {
    using T = scalar_t;
    for_each<2>(s, {&ov, &xv}, [&](char** p, const int64_t* ps, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const T* v = reinterpret_cast<const T*>(p[1] + i * ps[1]);
        int64_t best = 0;
        T bv = v[0];
        for (int64_t j = 1; j < len; ++j) {
          const T c = v[j * step];
          bool nan_c = false, nan_b = false;
          if constexpr (std::is_floating_point_v<T>) {
            nan_c = std::isnan(c);
            nan_b = std::isnan(bv);
          }
          if (!nan_b && (c > bv || nan_c)) {
            bv = c;
            best = j;
          }
        }
        *reinterpret_cast<int64_t*>(p[0] + i * ps[0]) = best;
      }
    });
  });
}

// The indices that sort each row along attrs.dim, stably; attrs.keepdim: descending. NaN sorts
// as the largest value (last ascending, first descending), as in PyTorch (Note [Argsort
// primitive] in core/ops/stats.cpp).
void argsort_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor& x = in[0];
  const int64_t len = x.dim() ? x.sizes()[a.dim] : 1;
  const int64_t step = x.dim() ? x.strides()[a.dim] : 0;
  const int64_t ostep = x.dim() ? out.strides()[a.dim] : 0;
  Shape s = x.sizes();
  Strides st = x.strides(), ost = out.strides();
  if (x.dim()) {
    s[a.dim] = 1;
    st[a.dim] = 0;
    ost[a.dim] = 0;
  }
  if (out.numel() == 0) return;
  Tensor xv = detail::make_view(x, s, st, x.storage_offset());
  Tensor ov = detail::make_view(out, s, ost, out.storage_offset());
  const bool desc = a.keepdim;
  DUET_DISPATCH_DTYPE(x.dtype(), "argsort", [&] {
    using T = scalar_t;
    for_each<2>(s, {&ov, &xv}, [&](char** p, const int64_t* ps, int64_t n) {
      std::vector<T> v(static_cast<size_t>(len));
      std::vector<int64_t> order(static_cast<size_t>(len));
      for (int64_t i = 0; i < n; ++i) {
        const T* row = reinterpret_cast<const T*>(p[1] + i * ps[1]);
        for (int64_t j = 0; j < len; ++j) v[j] = row[j * step];
        std::iota(order.begin(), order.end(), 0);
        // Whether value b goes before value c (NaN the largest): a strict weak order.
        auto before = [&](int64_t b, int64_t c) {
          const T vb = v[b], vc = v[c];
          if constexpr (std::is_floating_point_v<T>) {
            const bool nb = std::isnan(vb), nc = std::isnan(vc);
            if (nb || nc) return desc ? (nb && !nc) : (!nb && nc);
          }
          return desc ? vb > vc : vb < vc;
        };
        std::stable_sort(order.begin(), order.end(), before);
        int64_t* o = reinterpret_cast<int64_t*>(p[0] + i * ps[0]);
        for (int64_t j = 0; j < len; ++j) o[j * ostep] = order[j];
      }
    });
  });
}

}  // namespace

void copy_on_device(const Tensor& src, const Tensor& dst) {
  const Tensor* in[] = {&src};
  detail::op_def(OpId::Copy)
      .kernel[static_cast<int>(dst.device().type)](TensorRefs(in, 1), Attrs{}, dst);
}

void cat_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  int64_t at = 0;
  for (int64_t i = 0; i < in.size(); ++i) {
    const Tensor& t = in[i];
    const int64_t len = t.sizes()[a.dim];
    if (len && t.numel()) {
      Shape s = out.sizes();
      s[a.dim] = len;
      copy_on_device(t, detail::make_view(out, s, out.strides(),
                                          out.storage_offset() + at * out.strides()[a.dim]));
    }
    at += len;
  }
}

void slice_scatter_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  copy_on_device(in[0], out);
  Strides st = out.strides();
  Shape shape = out.sizes();
  shape[a.dim] = in[1].sizes()[a.dim];
  if (shape.numel() == 0) return;
  const int64_t off = out.storage_offset() + a.start * st[a.dim];
  if (shape[a.dim] > 1) st[a.dim] *= a.step;  // as view_slice: a huge step past one element
  copy_on_device(in[1], detail::make_view(out, shape, st, off));
}

// Note [Device transfers]
// Transfer copies contiguous bytes with the device backend's copy (cudaMemcpyAsync on the
// device's stream), which orders it after pending work on both devices; a copy to the CPU
// waits for the data, so host reads (item, to_vector) see finished values. A strided source is
// made dense on its own device first, and a strided destination (copy_ across devices) gets a
// dense staging buffer on its device. Registered for every device type: dispatch picks the
// kernel of the output's device.
void transfer_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const Tensor& x = in[0];
  const Device from = x.device(), to = out.device();
  if (from == to) return copy_on_device(x, out);
  const size_t nbytes = static_cast<size_t>(x.numel()) * itemsize(x.dtype());
  if (nbytes == 0) return;
  Tensor src = x;
  if (!x.is_contiguous()) {
    src = detail::empty(x.sizes(), x.dtype(), from);
    copy_on_device(x, src);
  }
  const Tensor dst = out.is_contiguous() ? out : detail::empty(out.sizes(), out.dtype(), to);
  const DeviceBackend* backend = detail::device_backend(from.is_cpu() ? to.type : from.type);
  DUET_CHECK_DEVICE(backend, "[to_device] no backend for {} -> {} in this build", from, to);
  backend->copy(dst.raw_data(), to, src.raw_data(), from, nbytes);
  if (!dst.is_same(out)) copy_on_device(dst, out);
}

void register_index_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Gather, DeviceType::CPU, gather_kernel);
  detail::register_kernel(t, OpId::ScatterAdd, DeviceType::CPU, scatter_add_any_kernel);
  detail::register_kernel(t, OpId::Cat, DeviceType::CPU, cat_kernel);
  detail::register_kernel(t, OpId::Transfer, DeviceType::CPU, transfer_kernel);
  detail::register_kernel(t, OpId::SliceScatter, DeviceType::CPU, slice_scatter_kernel);
  detail::register_kernel(t, OpId::Argmax, DeviceType::CPU, via_wide<argmax_kernel>);
  detail::register_kernel(t, OpId::Argsort, DeviceType::CPU, via_wide<argsort_kernel>);
}

}  // namespace duet::kernels
