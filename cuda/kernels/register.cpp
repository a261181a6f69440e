// duet: fills the CUDA kernel slots of the op table (called by kernels/backends.cpp). Views
// need no kernel; every other primitive of core/ops.def is registered by one family below.
#include "cuda/fused.h"
#include "cuda/kernels/adapt.h"

namespace duet::cuda::detail {

// The LSTM and GRU cells and their gradients (rnn_ops.cpp).
void register_rnn(OpDef* table);

void register_cuda_kernels(OpDef* table) {
  register_elementwise(table);
  register_reductions(table);
  register_index(table);
  register_attention(table);
  register_rnn(table);
  register_matmul(table);
  register_random(table);
  register_fused_runner();  // fused groups of compiled functions (cuda/fused.h)
}

}  // namespace duet::cuda::detail
