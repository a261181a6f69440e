// duet: kernels made only of views and the Copy kernel of the output's device, so that one
// definition serves every device: each backend registers these beside its own kernels.
#pragma once

#include "core/op_table.h"

namespace duet::kernels {

/// Copies src into dst (same shape; any layouts) with the Copy kernel of dst's device.
void copy_on_device(const Tensor& src, const Tensor& dst);
/// Cat: every input copied into its slice of the output along attrs.dim.
void cat_kernel(TensorRefs in, const Attrs& a, const Tensor& out);
/// SliceScatter: out = base, then src into out's start:end:step slice along attrs.dim.
void slice_scatter_kernel(TensorRefs in, const Attrs& a, const Tensor& out);
/// Transfer: in[0]'s values copied to out's device (Note [Device transfers] in kernels/index.cpp).
void transfer_kernel(TensorRefs in, const Attrs& a, const Tensor& out);

/// Conv2d, Conv2dInputGrad and Conv2dWeightGrad composed of the Unfold, Fold, MatMul and Copy
/// kernels of the output's device, on temporaries (kernels/conv.cpp).
void conv2d_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out);
void conv2d_input_grad_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out);
void conv2d_weight_grad_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out);

/// LstmStep and LstmStepBackward (Note [LSTM step] in core/ops/rnn.cpp) composed of the Addmm,
/// LstmCell, LstmCellBackward, Add, Full and Copy kernels of the output's device (kernels/rnn.cpp):
/// the CUDA backend's; the CPU has kernels of its own, which the tests compare with these.
void lstm_step_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out);
void lstm_step_backward_composed_kernel(TensorRefs in, const Attrs& a, const Tensor& out);

/// The collectives (AllReduce, Broadcast, AllGather, ReduceScatter): contiguous buffers handed
/// to the transport of the output's device (kernels/collective.cpp).
template <OpId op>
void collective_kernel(TensorRefs in, const Attrs& a, const Tensor& out);
/// CollectiveWait: waits for the collective started into in[0], then copies it.
void collective_wait_kernel(TensorRefs in, const Attrs& a, const Tensor& out);

}  // namespace duet::kernels
