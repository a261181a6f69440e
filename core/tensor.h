// duet: Tensor, a reference-counted handle as in LibTorch. Copies share storage and metadata;
// clone() makes an independent copy.
#pragma once

#include <functional>
#include <iosfwd>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/call_site.h"
#include "core/error.h"
#include "core/options.h"
#include "core/scalar.h"
#include "core/tensor_impl.h"

namespace duet {

class Tensor;
namespace detail {
/// Reading the sizes (dim -1: all of them) of a tensor with symbolic dims as integers: allowed
/// under HintReads, a specialization inside a symbolic trace (Note [Symbolic dims]).
void read_symbolic_sizes(const Tensor& t, int64_t dim, const std::source_location& loc);
/// The sizes at the traced call, without specializing: for checks that the symbolic rule
/// repeats, and for messages.
inline const Shape& hint_sizes(const Tensor& t);
/// The dims of t as SymInts (concrete ones when it has no symbolic dims).
SymDims sym_dims(const Tensor& t);
/// Dim d of t as a SymInt: sym_dims(t)[d] without building the list (a heap vector per call,
/// a quarter of an Autobatch step's mallocs when every slice and linear made one).
SymInt sym_dim(const Tensor& t, int64_t d);
/// What detach() makes of an untraced tensor, for any tensor: a leaf over the same storage, and
/// in a trace the same value (detach() of a traced tensor records a view with grad mode off).
/// For the library's own aliases of traced values (a leaf to differentiate with respect to).
Tensor detached_alias(const Tensor& t);
/// The error for reading the data of a traced tensor (core/dispatch.h), for raw_data().
[[noreturn]] void throw_traced_use(const Tensor& t, const char* what, const char* file,
                                   unsigned line);
/// The error for the use of an undefined Tensor, out of line: Tensor::impl() stays small
/// enough to inline (with the message formatted in it, every op paid a call for it).
[[noreturn]] void throw_undefined_tensor();
}  // namespace detail

// The ops that are also Tensor methods, declared before the class so that its methods can call
// them inline: the elementwise rows of core/elementwise.def, and the kind-Method rows of
// core/api.def (core/ops.h declares the rest).

/// Elementwise math, one function per row of core/elementwise.def (docs/ops.md says what
/// each computes). Integer and bool inputs of the float functions (exp, sin, ...) give f32
/// results; neg, abs, relu and floor keep the dtype and refuse b8.
///
/// Elementwise ops have overloads for rvalue tensors: the buffer of a temporary that nobody else
/// holds is reused for the result, so `tanh(x * 1.5 + 0.5)` allocates one buffer, not three.
#define DUET_UNARY(Name, name, math, doc)  \
  Tensor name(const Tensor& x, DUET_HERE); \
  Tensor name(Tensor&& x, DUET_HERE);
#include "core/elementwise.def"

#define DUET_DECLARE_BINARY(name)                           \
  Tensor name(const Tensor& a, const Tensor& b, DUET_HERE); \
  Tensor name(Tensor&& a, const Tensor& b, DUET_HERE);      \
  Tensor name(const Tensor& a, Tensor&& b, DUET_HERE);      \
  Tensor name(Tensor&& a, Tensor&& b, DUET_HERE);           \
  Tensor name(const Tensor& a, Scalar b, DUET_HERE);        \
  Tensor name(Tensor&& a, Scalar b, DUET_HERE);             \
  Tensor name(Scalar a, const Tensor& b, DUET_HERE);        \
  Tensor name(Scalar a, Tensor&& b, DUET_HERE);
/// Binary elementwise ops with broadcasting and PyTorch's type promotion, one per binary row
/// of core/elementwise.def. div always gives a floating result.
#define DUET_BINARY(Name, name, doc) DUET_DECLARE_BINARY(name)
#include "core/elementwise.def"
#undef DUET_DECLARE_BINARY

#define DUET_DECLARE_COMPARE(name)                          \
  Tensor name(const Tensor& a, const Tensor& b, DUET_HERE); \
  Tensor name(const Tensor& a, Scalar b, DUET_HERE);        \
  Tensor name(Scalar a, const Tensor& b, DUET_HERE);
/// Comparisons with broadcasting; the result is b8.
#define DUET_COMPARE(Name, name, expr, doc) DUET_DECLARE_COMPARE(name)
#include "core/elementwise.def"
#undef DUET_DECLARE_COMPARE

/// The kind-Method rows of core/api.def (their docs are there, and in docs/ops.md).
#define DUET_API_DECLARE_Method(ret, name, params) \
  DUET_API_STRIP ret name(DUET_API_STRIP params, DUET_HERE);
#define DUET_API_DECLARE_Free(ret, name, params)
#define DUET_API_DECLARE_Like(ret, name, params)
#define DUET_API(kind, ret, name, params, args, doc) DUET_API_DECLARE_##kind(ret, name, params)
#include "core/api.def"
#undef DUET_API_DECLARE_Method
#undef DUET_API_DECLARE_Free
#undef DUET_API_DECLARE_Like

class Tensor {
 public:
  /// An undefined tensor (defined() is false).
  Tensor() = default;
  explicit Tensor(detail::TensorImplPtr impl) : impl_(std::move(impl)) {}

  /// Sizes of each dim.
  Shape shape(std::source_location loc = std::source_location::current()) const {
    return sizes(loc);
  }
  /// Sizes without a copy. Inside a compiled function with symbolic dims, reading them as
  /// integers specializes those dims (the function retraces with them concrete), and the
  /// reason recorded names the call site `loc`.
  const Shape& sizes(std::source_location loc = std::source_location::current()) const {
    if (__builtin_expect(!impl()->sym.empty(), 0)) detail::read_symbolic_sizes(*this, -1, loc);
    return impl()->shape;
  }
  /// Strides in elements.
  const Strides& strides() const { return impl()->strides; }
  /// Offset into the storage, in elements.
  int64_t storage_offset() const { return impl()->offset; }
  int64_t dim() const { return impl()->ndim(); }
  int64_t numel(std::source_location loc = std::source_location::current()) const {
    return sizes(loc).numel();
  }
  DType dtype() const { return impl()->dtype; }
  Device device() const { return impl()->device(); }
  /// False for a default-constructed Tensor.
  bool defined() const { return static_cast<bool>(impl_); }
  /// True when the elements are dense and row-major from storage_offset().
  bool is_contiguous() const { return impl()->contiguous; }
  /// Size of one dim (negative counts from the end).
  int64_t size(int64_t dim, std::source_location loc = std::source_location::current()) const;

  /// The single element converted to T; Error unless numel() == 1. Inside a traced function
  /// it is an Error naming the call site (`loc`): use duet::cond for a branch on data.
  template <class T>
  T item(std::source_location loc = std::source_location::current()) const;
  /// All elements in row-major order, converted to T. An Error inside a traced function.
  template <class T>
  std::vector<T> to_vector(std::source_location loc = std::source_location::current()) const;

  /// A copy on another device (this tensor itself when already there).
  Tensor to(Device device, DUET_HERE) const;
  /// A copy converted to another dtype (this tensor itself when already that dtype).
  Tensor to(DType dtype, DUET_HERE) const;
  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous(DUET_HERE) const;
  /// An independent contiguous copy.
  Tensor clone(DUET_HERE) const;
  /// The same data, cut off from autograd history.
  Tensor detach() const;

  /// Whether autograd tracks this tensor (a leaf marked with requires_grad_, or a result of
  /// ops on such tensors while grad mode is on).
  bool requires_grad() const;
  /// Marks a floating leaf as needing gradients (or not). Error on a non-leaf.
  Tensor& requires_grad_(bool requires_grad = true);
  /// True for tensors not produced by a recorded op (user-made tensors and parameters).
  bool is_leaf() const;
  /// The gradient accumulated by backward(); undefined until a backward reaches this leaf.
  Tensor grad() const;
  /// Replaces the gradient buffer (undefined to free it); shape and dtype must match.
  void set_grad(const Tensor& grad);
  /// Calls hook(leaf) each time a backward() has accumulated this leaf's whole gradient of that
  /// backward into grad(), as torch's register_post_accumulate_grad_hook (data-parallel training
  /// starts a gradient's all-reduce there). Hooks run in backward's grad mode, and are traced
  /// with it in a compiled function. Returns a handle for remove_post_accumulate_grad_hook.
  int64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook);
  void remove_post_accumulate_grad_hook(int64_t handle);
  /// Backpropagates from this tensor: accumulates d(this)/d(leaf) into every leaf's grad().
  /// grad_output defaults to 1 for a one-element tensor. Without retain_graph the saved
  /// tensors are freed, and a second backward through the same graph is an error.
  void backward(Tensor grad_output = {}, bool retain_graph = false, DUET_HERE) const;

  // LibTorch's methods: x.sum(), x.reshape({2, -1}), x.exp(), a.add(b), x.softmax(-1), ... Each
  // calls the free function of the same name with this tensor first (x.sum(dims) is
  // duet::sum(x, dims)); they are generated from the rows of core/elementwise.def and core/api.def,
  // whose docs say what each computes (docs/ops.md lists them). An rvalue's elementwise method
  // passes it on as an rvalue, so x.mul(2).exp() reuses the temporary's buffer as the free
  // functions do.
#define DUET_UNARY(Name, name, math, doc)                          \
  Tensor name(DUET_HERE) const& { return duet::name(*this, loc); } \
  Tensor name(DUET_HERE)&& { return duet::name(std::move(*this), loc); }
#define DUET_BINARY(Name, name, doc)                                                           \
  Tensor name(const Tensor& other, DUET_HERE) const& { return duet::name(*this, other, loc); } \
  Tensor name(const Tensor& other, DUET_HERE)&& {                                              \
    return duet::name(std::move(*this), other, loc);                                           \
  }                                                                                            \
  Tensor name(Scalar other, DUET_HERE) const& { return duet::name(*this, other, loc); }        \
  Tensor name(Scalar other, DUET_HERE)&& { return duet::name(std::move(*this), other, loc); }
#define DUET_COMPARE(Name, name, expr, doc)                                                   \
  Tensor name(const Tensor& other, DUET_HERE) const { return duet::name(*this, other, loc); } \
  Tensor name(Scalar other, DUET_HERE) const { return duet::name(*this, other, loc); }
#include "core/elementwise.def"
#define DUET_API_METHOD_Method(ret, name, params, args)           \
  DUET_API_STRIP ret name(DUET_API_TAIL params DUET_HERE) const { \
    return duet::name(*this, DUET_API_TAIL args loc);             \
  }
#define DUET_API_METHOD_Free(ret, name, params, args)
#define DUET_API_METHOD_Like(ret, name, params, args)
#define DUET_API(kind, ret, name, params, args, doc) DUET_API_METHOD_##kind(ret, name, params, args)
#include "core/api.def"
#undef DUET_API_METHOD_Method
#undef DUET_API_METHOD_Free
#undef DUET_API_METHOD_Like

  /// select(0, index): the sub-tensor at `index` along the first dim, a view without it
  /// (LibTorch's Tensor::operator[]).
  Tensor operator[](int64_t index) const;

  /// In-place arithmetic, with broadcasting of the argument to this tensor's shape.
  Tensor& add_(const Tensor& other, DUET_HERE);
  Tensor& add_(Scalar other, DUET_HERE);
  Tensor& sub_(const Tensor& other, DUET_HERE);
  Tensor& sub_(Scalar other, DUET_HERE);
  Tensor& mul_(const Tensor& other, DUET_HERE);
  Tensor& mul_(Scalar other, DUET_HERE);
  Tensor& div_(const Tensor& other, DUET_HERE);
  Tensor& div_(Scalar other, DUET_HERE);
  /// Copies `src` (broadcast, converted) into this tensor's elements.
  Tensor& copy_(const Tensor& src, DUET_HERE);
  /// Sets every element to zero.
  Tensor& zero_(DUET_HERE);

  /// Typed pointer to the first element (CPU tensors); Error if T does not match dtype(). A write
  /// through it is not an op: it leaves the tensor's version as it was, which autograd's checks
  /// of saved tensors and a compiled function's hoisted steps go by (docs/eager-vs-compiled.md).
  template <class T>
  T* data_ptr(DUET_HERE) const;
  /// Untyped pointer to the first element. An Error for a traced tensor (in a trace, or one
  /// that escaped its trace), which has no data.
  void* raw_data() const {
    const detail::TensorImpl* x = impl();
    if (__builtin_expect(x->trace.get() != nullptr, 0))
      detail::throw_traced_use(*this, "raw_data", nullptr, 0);
    return x->data();
  }

  /// PyTorch-style text of the values, shape, dtype and device.
  std::string str() const;

  /// The implementation object (internal).
  detail::TensorImpl* impl() const {
    if (__builtin_expect(!impl_, 0)) detail::throw_undefined_tensor();
    return impl_.get();
  }
  detail::TensorImpl* unsafe_impl() const { return impl_.get(); }
  const detail::TensorImplPtr& impl_ptr() const { return impl_; }
  /// True when this handle is the only reference to the tensor and to its storage.
  bool is_unique() const { return impl_.use_count() == 1 && impl_->storage.use_count() == 1; }
  /// Same underlying TensorImpl.
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  detail::TensorImplPtr impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

namespace detail {
/// An uninitialised contiguous tensor.
Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
/// A view of `base`'s storage with new metadata.
Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset);
/// A 0-d tensor holding a C++ number; promotes like a Scalar (PyTorch's wrapped numbers).
Tensor wrap_scalar(const Scalar& s, DType dtype, Device device);
/// While tracing, gives a captured leaf that requires grad and has no .grad a zero buffer (see
/// docs/design.md, "Missing .grad"); otherwise does nothing.
void materialize_grad(TensorImpl* t);
/// While set, materialize_grad on this thread records each leaf it gives a buffer to (the
/// shadow-eager check undoes what a trace did to the caller's gradients).
extern thread_local std::vector<const TensorImpl*>* tls_materialized;
/// Reads element `i` (row-major) of a CPU tensor as double / int64.
double read_double(const Tensor& t, int64_t i);
inline const Shape& hint_sizes(const Tensor& t) { return t.impl()->shape; }
}  // namespace detail

}  // namespace duet

template <>
struct fmt::formatter<duet::Tensor> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const duet::Tensor& t, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(t.str(), ctx);
  }
};
template <>
struct fmt::formatter<duet::Shape> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const duet::Shape& s, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
template <>
struct fmt::formatter<duet::DType> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(duet::DType d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(duet::dtype_name(d), ctx);
  }
};
template <>
struct fmt::formatter<duet::Device> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(duet::Device d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.str(), ctx);
  }
};
