// duet: nn::utils, gradient clipping as torch.nn.utils: clip_grad_norm_ and clip_grad_value_
// (docs/optim.md).
//
// Note [Clipping under compile]
// Both are written in duet ops on the .grad buffers, in place, under NoGradGuard, and never read
// a value into C++: clip_grad_norm_ multiplies every gradient by the clamped coefficient
// min(max_norm / (total + 1e-6), 1) as a 0-d tensor, so no branch depends on the norm. Inside a
// compiled training step (between backward() and the optimizer's step) they are recorded like
// the rest of the step and run at every call. The one exception is error_if_nonfinite, which
// must read the norm to decide whether to throw: inside a compiled function that read is the
// strict data-read error, unless CompileOptions::guard_data_reads is on.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace duet::nn::utils {

/// Scales the gradients of `parameters` in place so that their total norm is at most
/// max_norm, as torch.nn.utils.clip_grad_norm_: the norm of order norm_type (2, 1, any p, inf
/// or -inf, 0 counts nonzeros) of the per-gradient norms, then every gradient times
/// min(max_norm / (total + 1e-6), 1). Parameters without a .grad are skipped. Returns the total
/// norm before clipping, a 0-d tensor of the gradients' dtype on the first gradient's device (a
/// 0-d f32 zero when no parameter has a gradient). With error_if_nonfinite, a NaN or infinite
/// total is a ValueError and nothing is scaled (Note [Clipping under compile]).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);
/// clip_grad_norm_ of one parameter.
Tensor clip_grad_norm_(const Tensor& parameter, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

/// Clamps every gradient of `parameters` into [-clip_value, clip_value] in place, as
/// torch.nn.utils.clip_grad_value_ (NaN stays NaN). Parameters without a .grad are skipped.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);
/// clip_grad_value_ of one parameter.
void clip_grad_value_(const Tensor& parameter, double clip_value);

}  // namespace duet::nn::utils
