#include "kernels/cpu_kernels.h"

namespace duet::kernels {

void run_kernel(OpId op, std::initializer_list<const Tensor*> in, const Attrs& a,
                const Tensor& out) {
  detail::op_def(op).kernel[static_cast<int>(out.device().type)](
      TensorRefs(in.begin(), static_cast<int64_t>(in.size())), a, out);
}

void register_cpu_kernels(OpDef* table) {
  register_elementwise_kernels(table);
  register_reduction_kernels(table);
  register_matmul_kernels(table);
  register_index_kernels(table);
  register_image_kernels(table);
  register_conv_kernels(table);
  register_attention_kernels(table);
  register_rnn_kernels(table);
  register_softmax_kernels(table);
  register_random_kernels(table);
  register_print_kernels(table);
  register_collective_kernels(table);
}

}  // namespace duet::kernels
