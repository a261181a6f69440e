// duet: CUDA adapters of LstmCell, GruCell and their gradients (kernels in rnn.cu). The kernels
// address each operand by one stride over its leading dims, flattened into rows, and one along
// its last dim. That covers contiguous operands and the usual views (c as the second half of the
// previous LSTM step's (..., 2H) result, a gate block sliced out of a wider product); an operand
// whose leading dims do not flatten (a transposed batch) is first copied into a contiguous
// temporary by the convert kernel.
#include "core/ops.h"
#include "cuda/kernels/adapt.h"
#include "kernels/composed.h"
#include "cuda/runtime.h"

namespace duet::cuda::detail {
namespace {

// t's strides as a CellOperand, when its leading dims step through memory as one dim (size-1
// dims aside); false when they do not.
bool flat_rows(const Tensor& t, kern::CellOperand& o) {
  const Shape& s = t.sizes();
  const Strides& st = t.strides();
  const int64_t last = t.dim() - 1;
  int64_t rs = 0, next = -1;  // next: the stride the dim outside the last one seen must have
  for (int64_t d = last - 1; d >= 0; --d) {
    if (s[d] == 1) continue;
    if (next < 0)
      rs = st[d];
    else if (st[d] != next)
      return false;
    next = st[d] * s[d];
  }
  o.data = t.raw_data();
  o.rs = rs;
  o.cs = st[last];
  return true;
}

// The operand for input t, through a contiguous copy in tmp when its rows do not flatten.
kern::CellOperand cell_operand(const Tensor& t, Tensor& tmp) {
  kern::CellOperand o;
  if (flat_rows(t, o)) return o;
  tmp = duet::detail::empty(t.sizes(), t.dtype(), t.device());
  copy_into(t, tmp);
  flat_rows(tmp, o);
  return o;
}

// The rows, H and the operands that both passes of both cells share. Holds the copies of the inputs
// that needed one until the kernel is queued; freeing them then is safe, as the next user of their
// memory queues behind it on the same stream (Note [CUDA streams and the cache] in
// cuda/runtime.cpp).
struct CellCall {
  kern::CellArg arg;
  Tensor tmp[4];
  CellCall(const char* op, TensorRefs in, const Tensor& out) {
    const DType dt = in[0].dtype();
    DUET_CHECK_DTYPE(is_floating(dt), "[{}] has no CUDA kernel for dtype {}", op, dtype_name(dt));
    const Tensor& state = in[2];  // c or h, (..., H)
    const int64_t last = state.dim() - 1;
    arg.h = state.sizes()[last];
    arg.rows = 1;
    for (int64_t d = 0; d < last; ++d) arg.rows *= state.sizes()[d];
    if (out.numel() == 0) return;  // nothing to read
    arg.gx = cell_operand(in[0], tmp[0]);
    arg.gh = cell_operand(in[1], tmp[1]);
    arg.state = cell_operand(state, tmp[2]);
    if (in.size() > 3) arg.g = cell_operand(in[3], tmp[3]);
  }
};

// Runs launch on a contiguous result: out itself, or a temporary copied into it.
template <class Launch>
void run_cell(const CellCall& L, const Tensor& out, Launch launch) {
  if (out.numel() == 0) return;
  Tensor dense =
      out.is_contiguous() ? out : duet::detail::empty(out.sizes(), out.dtype(), out.device());
  kern::CellArg arg = L.arg;
  arg.out = dense.raw_data();
  DUET_CUDA_CHECK(launch(to_dt(out.dtype()), arg, stream_for(out)));
  if (!dense.is_same(out)) copy_into(dense, out);
}

void lstm_cell_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const CellCall L("lstm_cell", in, out);
  run_cell(L, out, kern::launch_lstm_cell);
}

void lstm_cell_backward_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const CellCall L("lstm_cell_backward", in, out);
  run_cell(L, out, kern::launch_lstm_cell_backward);
}

void gru_cell_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const CellCall L("gru_cell", in, out);
  run_cell(L, out, kern::launch_gru_cell);
}

void gru_cell_backward_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const CellCall L("gru_cell_backward", in, out);
  run_cell(L, out, kern::launch_gru_cell_backward);
}

}  // namespace

void register_rnn(OpDef* t) {
  duet::detail::register_kernel(t, OpId::LstmCell, DeviceType::CUDA, lstm_cell_kernel);
  duet::detail::register_kernel(t, OpId::LstmCellBackward, DeviceType::CUDA,
                                lstm_cell_backward_kernel);
  // lstm_step: the products on cuBLAS and the cell's kernel (Note [LSTM step] in core/ops/rnn.cpp).
  duet::detail::register_kernel(t, OpId::LstmStep, DeviceType::CUDA,
                                duet::kernels::lstm_step_composed_kernel);
  duet::detail::register_kernel(t, OpId::LstmStepBackward, DeviceType::CUDA,
                                duet::kernels::lstm_step_backward_composed_kernel);
  duet::detail::register_kernel(t, OpId::GruCell, DeviceType::CUDA, gru_cell_kernel);
  duet::detail::register_kernel(t, OpId::GruCellBackward, DeviceType::CUDA,
                                gru_cell_backward_kernel);
}

}  // namespace duet::cuda::detail
