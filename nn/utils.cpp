// duet: gradient clipping in duet ops, with no read of a value into C++ (Note [Clipping under
// compile] in nn/utils.h).
#include "nn/utils.h"

#include <cmath>

#include "core/error.h"
#include "core/ops.h"
#include "eager/autograd.h"

namespace duet::nn::utils {
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  DUET_CHECK_VALUE(!std::isnan(norm_type), "[clip_grad_norm_] norm_type is NaN");
  NoGradGuard ng;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    DUET_CHECK_VALUE(p.defined(), "[clip_grad_norm_] parameter {} is an undefined tensor", i);
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return zeros(Shape{});
  const Device device = grads[0].device();
  std::vector<Tensor> norms;
  for (const Tensor& g : grads) {
    Tensor n = vector_norm(g, norm_type);
    norms.push_back(n.device() == device ? n : n.to(device));
  }
  Tensor total = vector_norm(stack(norms), norm_type);
  if (error_if_nonfinite) {
    // The one read of a value (Note [Clipping under compile]).
    DUET_CHECK_VALUE(isfinite(total).item<bool>(),
                     "[clip_grad_norm_] the total norm of order {} of the gradients is {}, so it "
                     "cannot be clipped; with error_if_nonfinite = false the gradients are "
                     "scaled by it anyway",
                     norm_type, total.item<double>());
  }
  // min(coef, 1) as a tensor: no branch on the norm, so a compiled step clips at every call.
  Tensor coef = minimum(max_norm / (total + 1e-6), 1.0);
  for (Tensor& g : grads) g.mul_(g.device() == device ? coef : coef.to(g.device()));
  return total;
}

Tensor clip_grad_norm_(const Tensor& parameter, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  return clip_grad_norm_(std::vector<Tensor>{parameter}, max_norm, norm_type, error_if_nonfinite);
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  NoGradGuard ng;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    DUET_CHECK_VALUE(p.defined(), "[clip_grad_value_] parameter {} is an undefined tensor", i);
    Tensor g = p.grad();
    if (g.defined()) g.copy_(clamp(g, -clip_value, clip_value));
  }
}

void clip_grad_value_(const Tensor& parameter, double clip_value) {
  clip_grad_value_(std::vector<Tensor>{parameter}, clip_value);
}

}  // namespace duet::nn::utils
