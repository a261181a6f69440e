// duet: activation checkpointing, as torch.utils.checkpoint (Note [Checkpoint] in
// eager/checkpoint.cpp).
#pragma once

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor_tree.h"

namespace duet {

namespace detail {
using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
/// checkpoint() on flat tensors: fn(inputs), with the values its ops save for the backward
/// given up at the end, and recomputed by running fn again when the backward needs them.
std::vector<Tensor> checkpoint_call(CheckpointFn fn, const std::vector<Tensor>& inputs);
}  // namespace detail

/// fn(args...), keeping for the backward only what fn's ops need from outside it: the values
/// computed inside are freed at its end, and the backward runs fn again to get them back, as
/// torch.utils.checkpoint does. Gradients, random draws (dropout) and results are those of
/// fn(args...) itself, eagerly and compiled; under compile the recomputation is part of the
/// backward graph. Tensor arguments (a Tensor, a std::vector<Tensor>, or tuples of them) are
/// fn's inputs; other arguments, and fn, are copied and kept for the rerun. fn returns a
/// Tensor, a std::vector<Tensor> or a std::tuple of Tensors, and must run the same ops when
/// rerun. Without grad mode it is fn(args...).
template <class F, class... Args>
auto checkpoint(F&& fn, Args&&... args) {
  using R = std::decay_t<std::invoke_result_t<std::decay_t<F>&, std::decay_t<Args>&...>>;
  auto held = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
  std::vector<Tensor> inputs;
  std::apply([&](const auto&... a) { (detail::collect_tensors(a, inputs), ...); }, *held);
  detail::CheckpointFn run = [f = std::decay_t<F>(std::forward<F>(fn)),
                              held](const std::vector<Tensor>& ts) mutable {
    size_t pos = 0;
    auto call = [&](const auto&... a) {
      // Braced initialisation evaluates left to right, so tensors are taken in order.
      std::tuple<std::decay_t<decltype(detail::substitute(a, ts, pos))>...> with{
          detail::substitute(a, ts, pos)...};
      return std::apply(f, with);
    };
    std::vector<Tensor> out;
    detail::flatten_result(std::apply(call, *held), out);
    return out;
  };
  std::vector<Tensor> out = detail::checkpoint_call(std::move(run), inputs);
  size_t pos = 0;
  return detail::unflatten_result<R>(out, pos);
}

}  // namespace duet
