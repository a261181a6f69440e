// duet: gradcheck. The analytical Jacobian comes from grad() with one-hot grad_outputs (one
// row per output element); the numerical one from central differences of fn, in float64.
#include <cmath>
#include <cstring>

#include "core/ops.h"
#include "eager/autograd.h"

namespace duet {

GradcheckResult gradcheck(std::function<Tensor(const std::vector<Tensor>&)> fn,
                          std::vector<Tensor> inputs, double eps, double atol, double rtol) {
  std::vector<size_t> wrt;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DUET_CHECK_DTYPE(inputs[i].dtype() == DType::f64,
                     "[gradcheck] inputs must be f64 for a meaningful check; input {} is {}", i,
                     inputs[i].dtype());
    if (inputs[i].requires_grad()) wrt.push_back(i);
  }
  DUET_CHECK(!wrt.empty(), "[gradcheck] no input requires grad");
  Tensor out = fn(inputs);
  DUET_CHECK(out.requires_grad(),
             "[gradcheck] the output does not depend on any input that "
             "requires grad");
  const int64_t n_out = out.numel();
  std::vector<Tensor> targets;
  for (size_t i : wrt) targets.push_back(inputs[i]);

  // Analytical: row j of the Jacobian is grad(out, inputs, one_hot(j)).
  std::vector<std::vector<double>> analytical(wrt.size());
  for (size_t w = 0; w < wrt.size(); ++w)
    analytical[w].resize(static_cast<size_t>(n_out * inputs[wrt[w]].numel()));
  for (int64_t j = 0; j < n_out; ++j) {
    Tensor onehot = zeros(out.sizes(), Options().dtype(DType::f64));
    static_cast<double*>(onehot.raw_data())[j] = 1.0;  // f64: the output may be another dtype
    onehot = onehot.to(out.dtype());
    Tensor fresh = fn(inputs);  // a new graph per row: grad() frees the graph it walks
    std::vector<Tensor> gs = grad({fresh}, targets, {onehot});
    for (size_t w = 0; w < wrt.size(); ++w) {
      std::vector<double> v = gs[w].to_vector<double>();
      for (size_t k = 0; k < v.size(); ++k) analytical[w][k * n_out + j] = v[k];
    }
  }

  // Numerical: perturb each element of each input that requires grad.
  NoGradGuard no_grad;
  for (size_t w = 0; w < wrt.size(); ++w) {
    const size_t idx = wrt[w];
    const Tensor original = inputs[idx];
    Tensor work = original.detach().clone();
    double* p = static_cast<double*>(work.raw_data());
    std::vector<Tensor> args = inputs;
    args[idx] = work;
    const int64_t n_in = work.numel();
    for (int64_t k = 0; k < n_in; ++k) {
      const double x0 = p[k];
      p[k] = x0 + eps;
      std::vector<double> fp = fn(args).to(DType::f64).to_vector<double>();
      p[k] = x0 - eps;
      std::vector<double> fm = fn(args).to(DType::f64).to_vector<double>();
      p[k] = x0;
      for (int64_t j = 0; j < n_out; ++j) {
        const double num = (fp[j] - fm[j]) / (2 * eps);
        const double ana = analytical[w][k * n_out + j];
        if (!(std::fabs(ana - num) <= atol + rtol * std::fabs(num))) {
          return {false, fmt::format("gradcheck: input {} element {}, output element {}: "
                                     "analytical {:.10g} but numerical {:.10g} (atol {}, rtol {})",
                                     idx, k, j, ana, num, atol, rtol)};
        }
      }
    }
  }
  return {true, ""};
}

}  // namespace duet
