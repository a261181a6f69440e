// The kernel of every collective on every device (Note [Collectives are ops] in core/dist.h): the
// input made contiguous on its device, a contiguous output (or a staging buffer for a strided
// one), and the transport of the device (MPI, NCCL, or the world of one) between them.
#include "core/dist.h"
#include "core/error.h"
#include "kernels/composed.h"
#include "kernels/cpu_kernels.h"

namespace duet::kernels {
template <OpId op>
void collective_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const char* name = detail::op_def(op).name;
  const int world = dist::is_initialized() ? dist::world_size() : 0;
  DUET_CHECK_T(world == a.end, DistError,
               "[{}] was traced in a world of {} ranks, and runs in a world of {}{}", name, a.end,
               world, world ? "" : " (duet::dist::init() was not called)");
  dist::detail::Comm& comm = dist::detail::comm_for(out.device(), name);
  Tensor x = in[0];
  if (!x.is_contiguous()) {
    x = detail::empty(in[0].sizes(), in[0].dtype(), in[0].device());
    copy_on_device(in[0], x);
  }
  const Tensor dst =
      out.is_contiguous() ? out : detail::empty(out.sizes(), out.dtype(), out.device());
  dist::detail::CollectiveCall c{op,
                                 name,
                                 x.raw_data(),
                                 dst.raw_data(),
                                 op == OpId::ReduceScatter ? out.numel() : x.numel(),
                                 x.dtype(),
                                 a.dim == 1 ? dist::ReduceOp::Max : dist::ReduceOp::Sum,
                                 static_cast<int>(a.start),
                                 out.device(),
                                 in[0].sizes()};
  // A started all-reduce writes `out` until its wait (Note [Overlapped collectives]).
  if (op == OpId::AllReduce && a.keepdim && dst.is_same(out))
    comm.start(c);
  else
    comm.run(c);
  if (!dst.is_same(out)) copy_on_device(dst, out);
}

void collective_wait_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  dist::detail::comm_for(out.device(), "collective_wait").wait(in[0].raw_data(), "all_reduce");
  copy_on_device(in[0], out);
}

template void collective_kernel<OpId::AllReduce>(TensorRefs, const Attrs&, const Tensor&);
template void collective_kernel<OpId::Broadcast>(TensorRefs, const Attrs&, const Tensor&);
template void collective_kernel<OpId::AllGather>(TensorRefs, const Attrs&, const Tensor&);
template void collective_kernel<OpId::ReduceScatter>(TensorRefs, const Attrs&, const Tensor&);

void register_collective_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::AllReduce, DeviceType::CPU, collective_kernel<OpId::AllReduce>);
  detail::register_kernel(t, OpId::Broadcast, DeviceType::CPU, collective_kernel<OpId::Broadcast>);
  detail::register_kernel(t, OpId::AllGather, DeviceType::CPU, collective_kernel<OpId::AllGather>);
  detail::register_kernel(t, OpId::ReduceScatter, DeviceType::CPU,
                          collective_kernel<OpId::ReduceScatter>);
  detail::register_kernel(t, OpId::CollectiveWait, DeviceType::CPU, collective_wait_kernel);
}

}  // namespace duet::kernels
