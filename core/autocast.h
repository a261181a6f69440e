// duet: autocast, as torch.autocast.
//
// Note [Autocast]
// Inside an Autocast scope for a device type, each op call with tensors on that device type is
// cast as its op-table attribute says (OpDef::autocast):
//  - Lower: the products (matmul, conv2d) run in the scope's low dtype: their f32, f16 and bf16
//    inputs are cast to it (f64 stays f64);
//  - F32: the numerically sensitive primitives (exp, log, pow, rsqrt, sum, ...) run in f32:
//    their f16 and bf16 inputs are cast to f32;
//  - None: the op runs on what it gets; binary ops promote as usual.
// The composites that PyTorch lists (linear, attention, einsum among the products; softmax,
// log_softmax, the norms, mean/var, cumsum and the losses among the f32 ops) say their class
// where they are defined, with autocast_lower() and autocast_f32() on their inputs.
//
// The casts are ordinary Cast calls made by the dispatcher before the op: autograd records
// them (so an f32 parameter gets an f32 .grad), and a trace records them (so a compiled step
// under autocast is the eager step, and the casts fuse with their neighbours). A compiled
// function keys its traces on the autocast state it was traced under. Gradient rules run with
// autocast off: backward ops use the dtypes the forward ops had, as in PyTorch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace duet {

class Tensor;
class TensorRefs;

/// An autocast scope (RAII, nestable) for one device type: inside it, ops on that device type
/// run products in `dtype` (f16 or bf16) and numerically sensitive ops in f32 (Note
/// [Autocast]). `enabled` false turns autocast off for the scope. The previous state comes
/// back when the scope ends.
class Autocast {
 public:
  /// PyTorch's default low dtype: bf16 on the CPU, f16 on CUDA.
  explicit Autocast(Device device);
  Autocast(Device device, DType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DeviceType type_;
  bool prev_enabled_;
  DType prev_dtype_;
};

/// Whether autocast is on for `device`'s type on this thread, and its low dtype.
bool autocast_enabled(Device device);
DType autocast_dtype(Device device);

namespace detail {

/// A packed description of this thread's autocast state (0 when off everywhere): a compiled
/// function keys its traces on it.
uint32_t autocast_key();
/// Whether autocast is on for some device type on this thread (the dispatcher's fast test).
bool autocast_any();

/// Sets this thread's autocast state to one autocast_key() returned, for a scope (a checkpoint
/// reruns its function under the state it first ran under).
class AutocastState {
 public:
  explicit AutocastState(uint32_t key);
  ~AutocastState();
  AutocastState(const AutocastState&) = delete;
  AutocastState& operator=(const AutocastState&) = delete;

 private:
  uint32_t saved_;
};

/// Turns autocast off for a scope (the backward engine runs gradient rules under it).
class AutocastOff : public AutocastState {
 public:
  AutocastOff() : AutocastState(0) {}
};

/// The inputs of a call of a Lower (`lower`) or F32 op, cast as the autocast state asks, in
/// `out`; false (and `out` untouched) when none needs a cast.
bool autocast_inputs(bool lower, TensorRefs in, std::vector<Tensor>& out);
/// x cast as a Lower (product) op's input under the current autocast state (into `held`), or
/// x itself: composites call it on their inputs (no handle copy when autocast is off).
const Tensor& autocast_lower(const Tensor& x, Tensor& held);
/// x cast as an F32 op's input under the current autocast state (into `held`), or x itself.
const Tensor& autocast_f32(const Tensor& x, Tensor& held);
/// The dtype autocast_f32 would give x (x's own where it would not cast it).
DType autocast_f32_dtype(const Tensor& x);

}  // namespace detail
}  // namespace duet
