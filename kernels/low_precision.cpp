// f16 and bf16 computed in f32, and the narrow integers in i32, around a kernel (Note [Low
// precision] in kernels/low_precision.h).
#include "kernels/low_precision.h"

#include "core/tensor_impl.h"

namespace duet::kernels {
namespace {

// `t` converted with the Cast kernel of `device` (kernels never re-enter dispatch).
Tensor convert_on(const Tensor& t, DType dtype, Device device) {
  Tensor out = detail::empty(t.sizes(), dtype, device);
  const Tensor* in[] = {&t};
  Attrs a;
  a.dtype = dtype;
  detail::op_def(OpId::Cast).kernel[static_cast<int>(device.type)](TensorRefs(in, 1), a, out);
  return out;
}

}  // namespace

bool has_storage_only(TensorRefs in, const Tensor& out) {
  if (is_storage_only(out.unsafe_impl()->dtype)) return true;
  for (int64_t i = 0; i < in.size(); ++i)
    if (in[i].defined() && is_storage_only(in[i].unsafe_impl()->dtype)) return true;
  return false;
}

void run_wide(KernelFn k, TensorRefs in, const Attrs& attrs, const Tensor& out) {
  std::vector<Tensor> held(static_cast<size_t>(in.size()));
  std::vector<const Tensor*> refs(static_cast<size_t>(in.size()));
  for (int64_t i = 0; i < in.size(); ++i) {
    const Tensor& t = in[i];
    // A wrapped number stays where it is (on the CPU); kernels of every device read it there.
    if (t.defined() && is_storage_only(t.dtype())) {
      held[i] = convert_on(t, compute_dtype(t.dtype()), t.device());
      refs[i] = &held[i];
    } else {
      refs[i] = &t;
    }
  }
  Attrs a = attrs;
  a.dtype = compute_dtype(a.dtype);  // Cast, Full, Arange, Random
  const TensorRefs wide_in(refs.data(), in.size());
  if (!is_storage_only(out.dtype())) {
    k(wide_in, a, out);
    return;
  }
  Tensor tmp = detail::empty(out.sizes(), compute_dtype(out.dtype()), out.device());
  k(wide_in, a, tmp);
  const Tensor* src[] = {&tmp};
  Attrs c;
  c.dtype = out.dtype();
  detail::op_def(OpId::Cast)
      .kernel[static_cast<int>(out.device().type)](TensorRefs(src, 1), c, out);
}

}  // namespace duet::kernels
