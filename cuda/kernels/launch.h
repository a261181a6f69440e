// duet: the CUDA kernels' launchers, as plain C++17 structs and functions. The .cu files (nvcc,
// C++17) define them without seeing any duet header; the adapters in the .cpp files (C++20)
// read tensors and attributes, fill these structs and call the launchers on duet's stream.
//
// Note [CUDA launch structs]
// Strides count elements, not bytes. An elementwise Loop holds the output's sizes after the
// adapter has dropped size-1 dims and merged dims that every operand walks densely, so a dense
// op arrives as one dim of stride 1 (the vectorized path) and the general case walks at most
// kMaxDims dims with an offset calculator. Every launcher returns cudaGetLastError() (or
// cudaErrorNotSupported for a dtype it has no kernel for); the adapter wraps it in
// DUET_CUDA_CHECK.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace duet::cuda::kern {

/// Mirrors duet::DType (core/dtype.h), value for value.
enum class DT : uint8_t { f32, f64, f16, bf16, i32, i64, b8, i8, u8, i16 };

inline constexpr int kMaxDims = 8;

/// One operand of an elementwise loop: its first element and its strides over the loop's dims,
/// or (by_value) one value already converted to the operand's dtype, passed with the launch
/// (wrapped numbers live on the host).
struct Operand {
  const void* data = nullptr;
  int64_t strides[kMaxDims] = {};
  alignas(8) unsigned char value[8] = {};
  bool by_value = false;
};

/// An elementwise loop: out and up to three inputs over the same (coalesced) sizes.
struct Loop {
  int64_t numel = 0;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  Operand out;
  Operand in[3];
};

// The elementwise families of core/elementwise.def, in their order.
enum class Unary : uint8_t {
#define DUET_UNARY(Name, name, math, doc) Name,
#include "core/elementwise.def"
};
enum class Binary : uint8_t {
#define DUET_BINARY(Name, name, doc) Name,
#define DUET_COMPARE(Name, name, expr, doc) Name,
#include "core/elementwise.def"
};
/// out = op(in[0]), all of dtype dt.
cudaError_t launch_unary(Unary op, DT dt, const Loop& loop, cudaStream_t s);
/// out = op(in[0], in[1]) with inputs of dtype dt; out has dtype dt, or b8 for comparisons.
cudaError_t launch_binary(Binary op, DT dt, const Loop& loop, cudaStream_t s);
/// out = in[0] (b8) ? in[1] : in[2], values of dtype dt.
cudaError_t launch_where(DT dt, const Loop& loop, cudaStream_t s);
/// out (dtype to) = in[0] (dtype from) converted; b8 results test != 0.
cudaError_t launch_convert(DT to, DT from, const Loop& loop, cudaStream_t s);
/// out[0:n] = the value (8 bytes holding one element of dt).
cudaError_t launch_full(DT dt, void* out, int64_t n, const unsigned char* value, cudaStream_t s);
/// out[i] = i for i < n.
cudaError_t launch_arange(DT dt, void* out, int64_t n, cudaStream_t s);

enum class Reduce : uint8_t { Sum, Max, Min, Argmax };
/// A reduction: for each of nout outputs (contiguous, in the order of the kept dims), fold the
/// nred input elements over the reduced dims. Argmax has one reduced dim and writes the index
/// (i64) of the first largest value, NaN counting as largest.
struct ReduceArg {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t nout = 0, nred = 0;
  int nkept = 0, nreduced = 0;
  int64_t kept_sizes[kMaxDims] = {}, kept_strides[kMaxDims] = {};
  int64_t red_sizes[kMaxDims] = {}, red_strides[kMaxDims] = {};
  /// With nsplit > 1: nout * nsplit partial results of kReduceScratchBytes each, on the device.
  void* scratch = nullptr;
  int64_t nsplit = 1;
};
inline constexpr int64_t kReduceScratchBytes = 16;
/// How many slices each output's elements are folded in, by blocks of their own: more than one
/// only when the outputs alone leave most of the device idle (a full reduction, or a sum over
/// the batch into a few thousand features), which then needs nout * nsplit *
/// kReduceScratchBytes of scratch.
int64_t reduce_splits(const ReduceArg& arg);
/// Sum accumulates in the output dtype (i64 for integer and b8 inputs), Max and Min keep it.
cudaError_t launch_reduce(Reduce op, DT in, DT out, const ReduceArg& arg, cudaStream_t s);

/// A Philox draw (kernels/random.cpp): state is a device i64 pair {seed, offset} (elements 0 and
/// state_stride); dist 0 uniform, 1 normal, 2 integers in [0, high).
struct RandomArg {
  void* out = nullptr;
  int64_t n = 0;
  const int64_t* state = nullptr;
  int64_t state_stride = 1;
  int dist = 0;
  int64_t high = 1;
};
cudaError_t launch_random(DT dt, const RandomArg& arg, cudaStream_t s);

/// Where gather and scatter_add record an index outside [0, size) (Note [Device index checks] in
/// cuda/runtime.cpp): the first such index wins, the rest of the element's work is skipped.
struct IndexCheck {
  int64_t* record;  ///< {set, index, size, dim, op}: host-mapped memory of the device
  int64_t size;     ///< the size along dim
  int64_t dim;
  int64_t op;  ///< 1: gather, 2: scatter_add
};

/// Gather: loop.out = out, loop.in[0] = index (i64), loop.in[1] = x seen at the index's shape
/// with stride 0 along dim; out[p] = x_row(p)[index[p] * step] (0 where the index is out of range).
cudaError_t launch_gather(DT dt, const Loop& loop, int64_t step, const IndexCheck& check,
                          cudaStream_t s);
/// ScatterAdd: loop.out = out seen at the index's shape with stride 0 along dim, loop.in[0] =
/// index, loop.in[1] = src; out_row(p)[index[p] * step] += src[p] (atomically; nothing where the
/// index is out of range).
cudaError_t launch_scatter_add(DT dt, const Loop& loop, int64_t step, const IndexCheck& check,
                               cudaStream_t s);

/// Argsort: a loop over x's shape with loop.out = out (i64, contiguous), loop.in[0] = x,
/// loop.in[1] = x and loop.in[2] = out, each seen with stride 0 along the sorted dim (the start
/// of the element's row). Each element counts the elements of its row that go before it (value,
/// NaN the largest, then position: a stable order; descending flips the values' order) and
/// writes its position at that rank. len, step and out_step: the row's length and its strides
/// in x and out.
cudaError_t launch_argsort(DT dt, const Loop& loop, int64_t len, int64_t step, int64_t out_step,
                           bool descending, cudaStream_t s);

/// Unfold / Fold geometry (kernels/image.cpp); the input read through its 4-D (image) or 3-D
/// (columns) strides, the output contiguous.
struct WindowArg {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, ho, wo;
  int64_t dh = 1, dw = 1;  ///< the dilation (core/window.h)
  int64_t in_strides[4] = {};
};
cudaError_t launch_unfold(DT dt, const WindowArg& arg, cudaStream_t s);
/// Attention and its gradient (Note [Attention] in core/ops/attention.cpp). Each operand is
/// addressed by its strides over the batch dims (batch_sizes, at most kMaxDims - 2 of them) and
/// its last two dims; a broadcast dim has stride 0.
struct AttnOperand {
  const void* data = nullptr;
  int64_t batch[kMaxDims - 2] = {};
  int64_t rs = 0, cs = 0;
};
struct AttnArg {
  int nbatch = 0;
  int64_t batch_sizes[kMaxDims - 2] = {};
  int64_t nb = 0, l = 0, s = 0, e = 0, f = 0;
  double scale = 0;
  bool causal = false;
  int mask = 0;  ///< 0: none, 1: b8 (true keeps), 2: added, of the inputs' dtype
  AttnOperand q, k, v, m;
  AttnOperand r, g;         ///< the forward's result (its output: `out`) and its gradient
  void* out = nullptr;      ///< forward: r's data; backward: (nb, l*e + s*e + s*f), contiguous
  void* scratch = nullptr;  ///< backward: nb * l of the accumulation dtype
};
/// `dt`: the inputs' dtype (f32, f64, f16 or bf16); the result is f64 for f64, else f32.
cudaError_t launch_attention(DT dt, const AttnArg& arg, cudaStream_t s);
cudaError_t launch_attention_backward(DT dt, const AttnArg& arg, cudaStream_t s);

/// LstmCell, GruCell and their gradients (core/ops/rnn.cpp), the operands' leading dims flattened
/// into rows: element (r, k) of an operand is data[r * rs + k * cs].
struct CellOperand {
  const void* data = nullptr;
  int64_t rs = 0, cs = 0;
};
/// G gates: 4 for the LSTM (i, f, g, o), 3 for the GRU (r, z, n).
struct CellArg {
  int64_t rows = 0, h = 0;
  CellOperand gx, gh;  ///< (rows, G*H) each
  CellOperand state;   ///< (rows, H): c for the LSTM, h for the GRU
  CellOperand g;       ///< backward: the gradient of the forward's result, (rows, 2H) or (rows, H)
  /// Contiguous: (rows, 2H) forward and (rows, 5H) backward for the LSTM, (rows, H) forward and
  /// (rows, 7H) backward for the GRU.
  void* out = nullptr;
};
/// `dt`: the inputs' and the result's dtype (f32, f64, f16 or bf16); f16 and bf16 compute in f32.
cudaError_t launch_lstm_cell(DT dt, const CellArg& arg, cudaStream_t s);
cudaError_t launch_lstm_cell_backward(DT dt, const CellArg& arg, cudaStream_t s);
cudaError_t launch_gru_cell(DT dt, const CellArg& arg, cudaStream_t s);
cudaError_t launch_gru_cell_backward(DT dt, const CellArg& arg, cudaStream_t s);

cudaError_t launch_fold(DT dt, const WindowArg& arg, cudaStream_t s);

/// One integer GEMM (no cuBLAS for integers): c[m, n] (contiguous) = a[m, k] b[k, n], wrapping.
struct IntGemmArg {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t m = 0, n = 0, k = 0;
  int64_t as0 = 0, as1 = 0, bs0 = 0, bs1 = 0;
};
cudaError_t launch_int_gemm(DT dt, const IntGemmArg& arg, cudaStream_t s);

}  // namespace duet::cuda::kern
