// duet: arguments and results as trees of tensors. A Tensor, a std::vector<Tensor> or a
// std::tuple of those flattens into a list of tensors and is rebuilt from one; any other value
// is a leaf that holds no tensor. compile() and checkpoint() take functions of such trees.
#pragma once

#include <tuple>
#include <type_traits>
#include <vector>

#include "core/tensor.h"

namespace duet::detail {

template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

/// Appends the tensors of an argument, in order (none for a value that is not a tree of them).
template <class T>
void collect_tensors(const T& a, std::vector<Tensor>& out) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, Tensor>) {
    out.push_back(a);
  } else if constexpr (std::is_same_v<U, std::vector<Tensor>>) {
    out.insert(out.end(), a.begin(), a.end());
  } else if constexpr (is_tuple<U>::value) {
    std::apply([&](const auto&... x) { (collect_tensors(x, out), ...); }, a);
  }
}

/// The argument rebuilt with tensors taken in order from ts.
template <class T>
decltype(auto) substitute(const T& a, const std::vector<Tensor>& ts, size_t& pos) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, Tensor>) {
    return Tensor(ts[pos++]);
  } else if constexpr (std::is_same_v<U, std::vector<Tensor>>) {
    std::vector<Tensor> v;
    for (size_t i = 0; i < a.size(); ++i) v.push_back(ts[pos++]);
    return v;
  } else if constexpr (is_tuple<U>::value) {
    return std::apply([&](const auto&... x) { return U{substitute(x, ts, pos)...}; }, a);
  } else {
    return static_cast<const T&>(a);
  }
}

/// Appends the tensors of a function's result.
template <class R>
void flatten_result(const R& r, std::vector<Tensor>& out) {
  if constexpr (std::is_same_v<R, Tensor>) {
    out.push_back(r);
  } else if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    out.insert(out.end(), r.begin(), r.end());
  } else if constexpr (is_tuple<R>::value) {
    std::apply([&](const auto&... x) { (flatten_result(x, out), ...); }, r);
  } else {
    static_assert(sizeof(R) == 0,
                  "duet: the function must return a Tensor, a std::vector<Tensor>, a std::tuple "
                  "of those, or nothing");
  }
}

/// A result of type R rebuilt from v, starting at pos (a std::vector<Tensor> takes the rest).
template <class R>
R unflatten_result(const std::vector<Tensor>& v, size_t& pos) {
  if constexpr (std::is_same_v<R, Tensor>) {
    return v[pos++];
  } else if constexpr (std::is_same_v<R, std::vector<Tensor>>) {
    std::vector<Tensor> r(v.begin() + pos, v.end());
    pos = v.size();
    return r;
  } else {
    return std::apply([&](auto... x) { return R{unflatten_result<decltype(x)>(v, pos)...}; }, R{});
  }
}

}  // namespace duet::detail
