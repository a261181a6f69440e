// duet: CUDA adapter of Random (kernel in random.cu). The generator state {seed, offset} lives
// on the output's device and the kernel reads it there, so a draw needs no host sync.
#include "cuda/kernels/adapt.h"
#include "kernels/low_precision.h"

namespace duet::cuda::detail {
namespace {

void random_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "random writes a fresh contiguous output");
  const Tensor& state = in[0];
  DUET_CHECK_DEVICE(state.device() == out.device(),
                    "[random] the generator state is on {}, the draw on {}", state.device(),
                    out.device());
  DUET_CHECK_DTYPE(out.dtype() != DType::b8, "[random] has no CUDA kernel for dtype {}",
                   dtype_name(out.dtype()));
  // The narrow integers draw as i32, as on the CPU (Note [Low precision]).
  if (is_narrow_integral(out.dtype())) return duet::kernels::run_wide(random_kernel, in, a, out);
  kern::RandomArg A;
  A.out = out.raw_data();
  A.n = out.numel();
  A.state = static_cast<const int64_t*>(state.raw_data());
  A.state_stride = state.strides()[0];
  A.dist = static_cast<int>(a.dim);
  A.high = a.end;
  DUET_CUDA_CHECK(kern::launch_random(to_dt(out.dtype()), A, stream_for(out)));
}

}  // namespace

void register_random(OpDef* t) {
  duet::detail::register_kernel(t, OpId::Random, DeviceType::CUDA, random_kernel);
}

}  // namespace duet::cuda::detail
