// duet: function transforms, as torch.func and JAX: vmap (per-sample code run on a batch) and grad
// (the gradient of a scalar function, as a function). They compose: vmap(grad(loss)) gives
// per-sample gradients, vmap(vmap(f)) batches twice, and compile(vmap(f)) compiles the batched
// function (Note [vmap] in trace/func.cpp).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/call_site.h"
#include "core/error.h"
#include "core/tensor.h"
#include "eager/autograd.h"

namespace duet::func {

/// What vmap does with a random op inside the function, as torch.func's `randomness`: an error
/// (the default), the same draws for every sample, or different draws for each (one draw of the
/// batch's shape: the values `rand({batch, ...})` would give).
enum class Randomness { Error, Same, Different };

namespace detail {

/// The batched run of `fn` (a function of one sample's tensors) on `args`, batched along
/// `in_dims` (empty: every argument along dim 0; nullopt: an argument shared by every sample);
/// the results hold the batch at `out_dim`.
std::vector<Tensor> vmap_call(const std::function<std::vector<Tensor>(std::vector<Tensor>)>& fn,
                              const std::vector<Tensor>& args,
                              const std::vector<std::optional<int64_t>>& in_dims, int64_t out_dim,
                              Randomness randomness, const std::string& label);

/// grad's checks: argnum in range, and the result one floating-point element.
void check_argnum(int argnum, size_t args, const std::string& label);
void check_scalar_result(const Tensor& y, const std::string& label);

template <class R>
std::vector<Tensor> flat_result(const R& r) {
  if constexpr (std::is_same_v<R, Tensor>) {
    return {r};
  } else {
    static_assert(std::is_same_v<R, std::vector<Tensor>>,
                  "duet::func::vmap: the function must return a Tensor or a std::vector<Tensor>");
    return r;
  }
}

}  // namespace detail

/// f batched: vmap(f, in_dims, out_dim)(args...) runs f on every sample of the batched
/// arguments at once (one call per op, through each op's batching rule) and stacks the results
/// along out_dim. f takes Tensors and returns a Tensor or a std::vector<Tensor>.
template <class F>
class Vmapped {
 public:
  Vmapped(F f, std::vector<std::optional<int64_t>> in_dims, int64_t out_dim, Randomness randomness,
          std::string label)
      : f_(std::move(f)),
        in_dims_(std::move(in_dims)),
        out_dim_(out_dim),
        randomness_(randomness),
        label_(std::move(label)) {}

  template <class... A>
  auto operator()(const A&... args) const {
    static_assert((std::is_same_v<A, Tensor> && ...), "duet::func::vmap: arguments are Tensors");
    using R = std::invoke_result_t<const F&, const A&...>;
    auto fn = [this](std::vector<Tensor> in) { return call(in, std::index_sequence_for<A...>{}); };
    std::vector<Tensor> outs =
        detail::vmap_call(fn, {args...}, in_dims_, out_dim_, randomness_, label_);
    if constexpr (std::is_same_v<R, Tensor>)
      return outs.at(0);
    else
      return outs;
  }

 private:
  template <size_t... I>
  std::vector<Tensor> call(const std::vector<Tensor>& in, std::index_sequence<I...>) const {
    return detail::flat_result(f_(in[I]...));
  }
  F f_;
  std::vector<std::optional<int64_t>> in_dims_;
  int64_t out_dim_;
  Randomness randomness_;
  std::string label_;
};

/// vmap(f, in_dims, out_dim): as torch.func.vmap. in_dims holds one optional dim per argument
/// (std::nullopt: not batched); empty batches every argument along dim 0.
template <class F>
Vmapped<F> vmap(F f, std::vector<std::optional<int64_t>> in_dims = {}, int64_t out_dim = 0,
                Randomness randomness = Randomness::Error, DUET_HERE) {
  return Vmapped<F>(std::move(f), std::move(in_dims), out_dim, randomness,
                    fmt::format("vmap at {}:{}", loc.file_name(), loc.line()));
}

/// grad(f, argnum)(args...): the gradient of f's result (one floating-point element) with respect
/// to args[argnum], as torch.func.grad. It is differentiable again (grad(grad(f)) works), and
/// vmap(grad(f)) gives one gradient per sample.
template <class F>
auto grad(F f, int argnum = 0, DUET_HERE) {
  const std::string label = fmt::format("grad at {}:{}", loc.file_name(), loc.line());
  return [f = std::move(f), argnum, label](const auto&... args) -> Tensor {
    std::vector<Tensor> a{Tensor(args)...};
    detail::check_argnum(argnum, a.size(), label);
    const auto k = static_cast<size_t>(argnum);
    // An argument already in a graph (grad(grad(f)): the outer grad's input) stays in it, so
    // that the gradient is differentiable with respect to it; another becomes a leaf.
    if (!a[k].requires_grad()) {
      a[k] = a[k].detach();
      a[k].requires_grad_();
    }
    Tensor y = [&]<size_t... I>(std::index_sequence<I...>) { return Tensor(f(a[I]...)); }
    (std::index_sequence_for<decltype(args)...>{});
    detail::check_scalar_result(y, label);
    return duet::grad({y}, {a[k]}, {}, /*create_graph=*/true)[0];
  };
}

}  // namespace duet::func
