// duet: function transforms, as torch.func and JAX: vmap (per-sample code run on a batch), grad
// (the gradient of a scalar function, as a function), grad_and_value, vjp, jvp, jacrev, jacfwd
// and hessian.
// They compose: vmap(grad(loss)) gives per-sample gradients, vmap(vmap(f)) batches twice, and
// compile(vmap(f)) compiles the batched function (Note [vmap] in trace/func.cpp).
#pragma once

#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/call_site.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "core/tensor_tree.h"
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

/// grad's checks: argnum in range; argnums in range, at least one, and no two the same.
void check_argnum(int argnum, size_t args, const std::string& label);
void check_argnums(const std::vector<int>& argnums, size_t args, const std::string& label);
/// The result one floating-point element.
void check_scalar_result(const Tensor& y, const std::string& label);
/// jacrev's and vjp's (op): the result a floating-point tensor.
void check_jacobian_result(const char* op, const Tensor& y, const std::string& label);
/// xs[k] for each k made a leaf that requires grad, where it does not require grad already (an
/// argument in a graph stays in it, so that a gradient is differentiable with respect to it).
void make_leaves(std::vector<Tensor>& xs, const std::vector<int>& ks);
/// vjp's product: the gradients of sum(y * v) with respect to xs (zeros where y does not
/// depend on one), differentiable again; v must have y's shape.
std::vector<Tensor> vjp_grads(const Tensor& y, const std::vector<Tensor>& xs, const Tensor& v);
/// jvp's checks: one tangent per argument, of its shape, floating-point.
void check_tangents(const std::vector<Tensor>& xs, const std::vector<Tensor>& vs);
/// jvp's product: the sum over xs of each one's Jacobian of y times its tangent vs[i], of y's
/// shape (zeros where y depends on none of them), differentiable again.
Tensor jvp_product(const Tensor& y, const std::vector<Tensor>& xs, const std::vector<Tensor>& vs);
/// The gradients of y, a function's value (one floating-point element), with respect to xs:
/// differentiable again, and zeros where y does not depend on an x (as torch.func and JAX).
std::vector<Tensor> value_grads(const Tensor& y, const std::vector<Tensor>& xs,
                                const std::string& label);

/// A function's result with an auxiliary value: (value, aux), as torch.func's has_aux.
template <class T>
struct is_value_aux : std::false_type {};
template <class A>
struct is_value_aux<std::tuple<Tensor, A>> : std::true_type {};
/// f(a[I]...) with the arguments at `ks` made leaves that require grad (make_leaves) and grad mode
/// on, as torch.func calls the function it transforms: f's result as f returns it.
template <class F, size_t... I>
auto call_on_leaves(const F& f, std::vector<Tensor>& a, const std::vector<int>& ks,
                    std::index_sequence<I...>) {
  make_leaves(a, ks);
  duet::detail::GradModeScope grad_on(true);
  return f(a[I]...);
}
/// 0, 1, ..., n - 1: every argument of n.
inline std::vector<int> every_index(size_t n) {
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

/// A function's value: the first of (value, aux), or the result as the Tensor it converts to.
template <class R>
Tensor value_of(const R& r) {
  if constexpr (is_value_aux<R>::value)
    return std::get<0>(r);
  else
    return Tensor(r);
}

/// f's result on Tensors standing for args, and that result as grad takes it: a (value, aux)
/// tuple as it is, anything else as the Tensor it converts to.
template <class F, class... A>
using raw_result_t =
    std::decay_t<std::invoke_result_t<const F&, const std::conditional_t<true, Tensor, A>&...>>;
template <class F, class... A>
using value_result_t =
    std::conditional_t<is_value_aux<raw_result_t<F, A...>>::value, raw_result_t<F, A...>, Tensor>;

/// f(args...) with the arguments at `ks` made leaves that require grad (an argument already in
/// a graph stays in it, so that the gradient is differentiable with respect to it: grad(grad(f))):
/// the gradients of f's value with respect to them, and f's result. Grad mode is on inside, as
/// in torch.func.grad.
template <class F, class... A>
std::pair<std::vector<Tensor>, value_result_t<F, A...>> grads_and_result(const F& f,
                                                                         const std::vector<int>& ks,
                                                                         const std::string& label,
                                                                         const A&... args) {
  using R = value_result_t<F, A...>;
  static_assert(
      is_value_aux<R>::value || std::is_convertible_v<raw_result_t<F, A...>, Tensor>,
      "duet::func::grad: the function must return a Tensor (its value) or a std::tuple<Tensor, "
      "Aux> (its value and an auxiliary result, as torch.func's has_aux)");
  std::vector<Tensor> a{Tensor(args)...};
  check_argnums(ks, a.size(), label);
  R r(call_on_leaves(f, a, ks, std::index_sequence_for<A...>{}));
  const Tensor* y = nullptr;
  if constexpr (is_value_aux<R>::value)
    y = &std::get<0>(r);
  else
    y = &r;
  std::vector<Tensor> xs;
  for (int k : ks) xs.push_back(a[static_cast<size_t>(k)]);
  return {value_grads(*y, xs, label), std::move(r)};
}

/// grad's and grad_and_value's function: the gradients (the one of a single argnum when `One`),
/// then the value (`WithValue`) or the auxiliary result where f returns (value, aux).
template <bool One, bool WithValue, class F>
auto grad_transform(F f, std::vector<int> argnums, std::string label) {
  return [f = std::move(f), argnums = std::move(argnums),
          label = std::move(label)](const auto&... args) {
    auto [g, r] = grads_and_result(f, argnums, label, args...);
    using G = std::conditional_t<One, Tensor, std::vector<Tensor>>;
    G grads = [](std::vector<Tensor>& all) -> G {
      if constexpr (One)
        return std::move(all[0]);
      else
        return std::move(all);
    }(g);
    if constexpr (WithValue)
      return std::tuple(std::move(grads), std::move(r));
    else if constexpr (is_value_aux<decltype(r)>::value)
      return std::tuple(std::move(grads), std::move(std::get<1>(r)));
    else
      return grads;
  };
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
    using R = std::decay_t<std::invoke_result_t<const F&, const A&...>>;
    static_assert(!std::is_void_v<R>, "duet::func::vmap: the function must return its results");
    // The result's structure (how many tensors each vector holds) is that of the one traced
    // call: the batched tensors are put back in its place.
    std::optional<R> shape;
    auto fn = [&](std::vector<Tensor> in) {
      shape.emplace(call(in, std::index_sequence_for<A...>{}));
      std::vector<Tensor> flat;
      duet::detail::flatten_result(*shape, flat);
      return flat;
    };
    std::vector<Tensor> outs =
        detail::vmap_call(fn, {args...}, in_dims_, out_dim_, randomness_, label_);
    size_t pos = 0;
    return R(duet::detail::substitute(*shape, outs, pos));
  }

 private:
  template <size_t... I>
  auto call(const std::vector<Tensor>& in, std::index_sequence<I...>) const {
    return f_(in[I]...);
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
/// vmap(grad(f)) gives one gradient per sample. A result that does not depend on the argument
/// has a gradient of zeros. f may return std::tuple<Tensor, Aux>, its value and an auxiliary
/// result (torch.func's has_aux): grad then returns std::tuple<Tensor, Aux>, the gradient and
/// the auxiliary result.
template <class F>
auto grad(F f, int argnum = 0, DUET_HERE) {
  return detail::grad_transform<true, false>(
      std::move(f), {argnum}, fmt::format("grad at {}:{}", loc.file_name(), loc.line()));
}

/// grad(f, argnums): the gradients with respect to several arguments, one per argnum in order,
/// as a std::vector<Tensor> (torch.func.grad's tuple of argnums; JAX's argnums). With an
/// auxiliary result: std::tuple<std::vector<Tensor>, Aux>. (A braced list of one, {0}, picks
/// the single-argnum overload; pass std::vector<int>{0} for a vector of one gradient.)
template <class F>
auto grad(F f, std::vector<int> argnums, DUET_HERE) {
  return detail::grad_transform<false, false>(
      std::move(f), std::move(argnums), fmt::format("grad at {}:{}", loc.file_name(), loc.line()));
}

/// grad_and_value(f, argnum)(args...): the gradient and f's result at once, as
/// torch.func.grad_and_value and jax.value_and_grad (in torch's order): std::tuple<Tensor,
/// Tensor>, the gradient then the value; with argnums, a std::vector<Tensor> of gradients
/// first. Where f returns (value, aux), the second is that tuple, as torch.func's. The value
/// keeps the history f gave it.
template <class F>
auto grad_and_value(F f, int argnum = 0, DUET_HERE) {
  return detail::grad_transform<true, true>(
      std::move(f), {argnum}, fmt::format("grad_and_value at {}:{}", loc.file_name(), loc.line()));
}

template <class F>
auto grad_and_value(F f, std::vector<int> argnums, DUET_HERE) {
  return detail::grad_transform<false, true>(
      std::move(f), std::move(argnums),
      fmt::format("grad_and_value at {}:{}", loc.file_name(), loc.line()));
}

/// vjp(f, args...): f's result and its vector-Jacobian product, as torch.func.vjp:
///     auto [y, vjp_fn] = func::vjp(f, w, x);
///     std::vector<Tensor> g = vjp_fn(v);  // the gradients of sum(y * v) for w and x
/// vjp_fn(v) takes v of y's shape and gives one gradient per argument, zeros where y does not
/// depend on it. It can be called again, is differentiable again, and runs under vmap (one
/// Jacobian row per cotangent). f returns a floating-point Tensor, or (value, aux) as
/// torch.func's has_aux: then vjp returns std::tuple(y, vjp_fn, aux).
template <class F, class... A>
auto vjp(const F& f, const A&... args) {
  std::vector<Tensor> a{Tensor(args)...};
  auto r =
      detail::call_on_leaves(f, a, detail::every_index(a.size()), std::index_sequence_for<A...>{});
  const Tensor y = detail::value_of(r);
  detail::check_jacobian_result("vjp", y, "func::vjp");
  auto fn = [y, a](const Tensor& v) { return detail::vjp_grads(y, a, v); };
  if constexpr (detail::is_value_aux<decltype(r)>::value)
    return std::tuple(y, std::move(fn), std::get<1>(std::move(r)));
  else
    return std::tuple(y, std::move(fn));
}

namespace detail {
/// jacrev's Jacobians, one per argnum (checked), each of shape result.shape + argument.shape.
template <class F, class... A>
std::vector<Tensor> jacobians_rev(const F& f, const std::vector<int>& argnums,
                                  const std::string& label, const std::source_location& loc,
                                  const A&... args) {
  check_argnums(argnums, sizeof...(args), label);
  Tensor y;
  {
    NoGradGuard off;
    y = Tensor(f(args...));
  }
  check_jacobian_result("jacrev", y, label);
  const int64_t n = y.numel();
  Shape rows{n};
  for (int64_t d : y.sizes()) rows.push_back(d);
  const Tensor basis = eye(n, Options().dtype(y.dtype()).device(y.device())).reshape(rows);
  // The product of the cotangent v and f's Jacobian, as the gradient of sum(f(args) * v).
  auto vjp = [f](const Tensor& v, const auto&... xs) { return (Tensor(f(xs...)) * v).sum(); };
  std::vector<std::optional<int64_t>> dims(1 + sizeof...(args), std::nullopt);
  dims[0] = 0;
  std::vector<int> shifted;
  for (int a : argnums) shifted.push_back(a + 1);
  std::vector<Tensor> js = vmap(grad(vjp, shifted, loc), dims, 0, Randomness::Error, loc)(
      basis, Tensor(args)...);  // each (n, argument's shape)
  for (Tensor& j : js) {
    Shape shape = y.sizes();
    for (int64_t k = 1; k < j.dim(); ++k) shape.push_back(j.sizes()[k]);
    j = j.reshape(shape);
  }
  return js;
}

/// jac(f) where f returns a Tensor; where f returns (value, aux) (torch.func's has_aux), jac of
/// the value alone and the aux beside it: std::tuple(jac(value), aux), the aux from one more call
/// of f, with grad mode off.
template <class F, class J, class... A>
auto with_aux(const F& f, const J& jac, const A&... args) {
  if constexpr (is_value_aux<raw_result_t<F, A...>>::value) {
    auto value = [f](const auto&... xs) { return std::get<0>(f(xs...)); };
    auto aux = [&] {
      NoGradGuard off;
      return std::get<1>(f(args...));
    }();
    return std::tuple(jac(value), std::move(aux));
  } else {
    return jac(f);
  }
}
}  // namespace detail

/// jacrev(f, argnum)(args...): the Jacobian of f's result with respect to args[argnum], as
/// torch.func.jacrev and jax.jacrev: of shape result.shape + argument.shape. Reverse mode, one
/// vector-Jacobian product per element of the result, batched into one call by vmap (the rows
/// of the identity as the cotangents); f also runs once first, with grad mode off, for the
/// result's shape. f returns a floating-point Tensor, or (value, aux) as torch.func's has_aux:
/// then jacrev returns std::tuple(Jacobian, aux).
template <class F>
auto jacrev(F f, int argnum = 0, DUET_HERE) {
  const std::string label = fmt::format("jacrev at {}:{}", loc.file_name(), loc.line());
  return [f, argnum, label, loc](const auto&... args) {
    detail::check_argnum(argnum, sizeof...(args), label);
    auto jac = [&](const auto& g) {
      return detail::jacobians_rev(g, {argnum}, label, loc, args...)[0];
    };
    return detail::with_aux(f, jac, args...);
  };
}

/// jacrev(f, argnums)(args...): the Jacobians with respect to several arguments, one per argnum
/// in order, as a std::vector<Tensor> (torch.func.jacrev's tuple of argnums), from one call of
/// vmap. (A braced list of one, {0}, picks the single-argnum overload.)
template <class F>
auto jacrev(F f, std::vector<int> argnums, DUET_HERE) {
  const std::string label = fmt::format("jacrev at {}:{}", loc.file_name(), loc.line());
  return [f, argnums = std::move(argnums), label, loc](const auto&... args) {
    auto jac = [&](const auto& g) {
      return detail::jacobians_rev(g, argnums, label, loc, args...);
    };
    return detail::with_aux(f, jac, args...);
  };
}

/// jvp(f, {args...}, {tangents...}): f's result and its Jacobian-vector product J v, as
/// torch.func.jvp(f, primals, tangents): std::tuple<Tensor, Tensor>, the result then the sum
/// over the arguments of each one's Jacobian times its tangent (of the result's shape):
///     auto [y, jv] = func::jvp(f, {w, x}, {vw, vx});
/// duet has no forward mode: the product is the reverse mode's twice (Note [jvp by two vjps] in
/// trace/func.cpp), as torch.autograd.functional.jvp computes it, about two backward passes of
/// f. It is differentiable again and runs under vmap. f returns a floating-point Tensor; each
/// tangent has its argument's shape and a floating dtype. Where f returns (value, aux), as
/// torch.func's has_aux, jvp returns std::tuple(y, jv, aux).
template <class F, size_t N>
auto jvp(const F& f, const Tensor (&primals)[N], const Tensor (&tangents)[N]) {
  std::vector<Tensor> a(primals, primals + N), v(tangents, tangents + N);
  detail::check_tangents(a, v);
  auto r = detail::call_on_leaves(f, a, detail::every_index(N), std::make_index_sequence<N>{});
  const Tensor y = detail::value_of(r);
  detail::check_jacobian_result("jvp", y, "func::jvp");
  if constexpr (detail::is_value_aux<decltype(r)>::value)
    return std::tuple(y, detail::jvp_product(y, a, v), std::get<1>(std::move(r)));
  else
    return std::tuple(y, detail::jvp_product(y, a, v));
}

namespace detail {
/// jacfwd's Jacobian of f's result (a Tensor) with respect to args[argnum] (checked).
template <class F, class... A>
Tensor jacobian_fwd(const F& f, int argnum, const std::string& label,
                    const std::source_location& loc, const A&... args) {
  constexpr size_t kN = sizeof...(args);
  check_argnum(argnum, kN, label);
  const Tensor x[kN] = {Tensor(args)...};
  const Tensor& arg = x[argnum];
  DUET_CHECK_DTYPE(is_floating(arg.dtype()),
                   "[jacfwd] argument {} must be floating-point to be differentiated, got {} ({})",
                   argnum, arg.dtype(), label);
  const int64_t n = arg.numel();
  Shape cols{n};
  for (int64_t d : arg.sizes()) cols.push_back(d);
  const Tensor basis = eye(n, Options().dtype(arg.dtype()).device(arg.device())).reshape(cols);
  // J e for a tangent e of the argument (zeros for the other arguments).
  auto column = [&f, argnum, &x](const Tensor& e) {
    constexpr size_t count = std::extent_v<std::remove_reference_t<decltype(x)>>;  // (kN)
    Tensor t[count];
    for (size_t i = 0; i < count; ++i) t[i] = static_cast<int>(i) == argnum ? e : zeros_like(x[i]);
    return std::get<1>(jvp(f, x, t));
  };
  const Tensor j = vmap(column, {}, 0, Randomness::Error, loc)(basis);  // (n, result's shape)
  // The argument's elements last: result.shape + argument.shape.
  std::vector<int64_t> order;
  for (int64_t d = 1; d < j.dim(); ++d) order.push_back(d);
  order.push_back(0);
  Shape shape;
  for (int64_t d = 1; d < j.dim(); ++d) shape.push_back(j.sizes()[d]);
  for (int64_t d : arg.sizes()) shape.push_back(d);
  return permute(j, Dims(order)).reshape(shape);
}
}  // namespace detail

/// jacfwd(f, argnum)(args...): the Jacobian of f's result with respect to args[argnum], as
/// torch.func.jacfwd and jax.jacfwd: of shape result.shape + argument.shape, one
/// Jacobian-vector product per element of the argument (the columns of the identity as the
/// tangents), batched into one call by vmap. Each product is computed as jvp computes it, so
/// jacrev is the cheaper of the two here, where in a framework with forward mode jacfwd is for
/// arguments smaller than the result. f returns a floating-point Tensor, or (value, aux) as
/// torch.func's has_aux: then jacfwd returns std::tuple(Jacobian, aux).
template <class F>
auto jacfwd(F f, int argnum = 0, DUET_HERE) {
  const std::string label = fmt::format("jacfwd at {}:{}", loc.file_name(), loc.line());
  return [f, argnum, label, loc](const auto&... args) {
    detail::check_argnum(argnum, sizeof...(args), label);
    auto jac = [&](const auto& g) { return detail::jacobian_fwd(g, argnum, label, loc, args...); };
    return detail::with_aux(f, jac, args...);
  };
}

/// jacfwd(f, argnums)(args...): the Jacobians with respect to several arguments, one per argnum
/// in order, as a std::vector<Tensor> (torch.func.jacfwd's tuple of argnums): one vmap of
/// Jacobian-vector products per argument. (A braced list of one, {0}, picks the single-argnum
/// overload.)
template <class F>
auto jacfwd(F f, std::vector<int> argnums, DUET_HERE) {
  const std::string label = fmt::format("jacfwd at {}:{}", loc.file_name(), loc.line());
  return [f, argnums = std::move(argnums), label, loc](const auto&... args) {
    detail::check_argnums(argnums, sizeof...(args), label);
    auto jac = [&](const auto& g) {
      std::vector<Tensor> js;
      for (int a : argnums) js.push_back(detail::jacobian_fwd(g, a, label, loc, args...));
      return js;
    };
    return detail::with_aux(f, jac, args...);
  };
}

/// hessian(f, argnum)(args...): the second derivatives of f's result with respect to
/// args[argnum], as torch.func.hessian: jacrev(jacrev(f)), of shape result.shape +
/// argument.shape + argument.shape.
template <class F>
auto hessian(F f, int argnum = 0, DUET_HERE) {
  return jacrev(jacrev(std::move(f), argnum, loc), argnum, loc);
}

}  // namespace duet::func
