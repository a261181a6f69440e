// duet: nn::Module, the base of layers and models. A Module is a handle, like a Tensor or
// LibTorch's ModuleHolder: copies share parameters, buffers, children and the training flag.
//
// Note [Module state]
// Everything a module registers lives in one State behind a std::shared_ptr; a Module object is
// that pointer plus the public Tensor members its class declares (Linear::weight, ...), which
// are handles to the same tensors as the registry. So copying a module, registering a copy as a
// child, or holding it in a std::shared_ptr all name one module. Operations that change values
// or placement (to(), load_state_dict(), initializers) work in place on the tensors, so every
// handle -- the user's, a layer member, an optimizer's list -- stays valid and sees the change.
#pragma once

#include <concepts>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/call_site.h"
#include "core/tensor.h"

namespace duet::nn {

class Module;

/// Any module class (derived from Module).
template <class M>
concept ModuleType = std::derived_from<M, Module>;

/// Parameters and buffers by dotted name ("fc1.weight"), as state_dict() gives them.
using StateDict = std::map<std::string, Tensor>;

/// Named tensors in registration order.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  /// A module with an empty registry, named after its class in messages.
  Module();
  virtual ~Module() = default;
  /// Copies share the state (Note [Module state]); a move is a copy, so no handle is ever empty.
  Module(const Module&) = default;
  Module& operator=(const Module&) = default;

  /// The module's computation. The default raises "[nn] <name> has no forward(Tensor)";
  /// modules whose forward takes other arguments declare their own.
  virtual Tensor forward(const Tensor& x);
  /// forward(x), with the caller's line as the call site of the ops inside (core/call_site.h).
  Tensor operator()(const Tensor& x, DUET_HERE) {
    detail::SiteGuard site(loc);
    return forward(x);
  }

  /// Every parameter of this module and its descendants, each tensor once, in registration
  /// order (a module's own parameters first, then each child's, depth first).
  std::vector<Tensor> parameters() const;
  /// parameters() with dotted names: a child's names are prefixed with its registered name.
  NamedTensors named_parameters() const;
  /// Every buffer (registered state that is not trained), each tensor once, as parameters().
  std::vector<Tensor> buffers() const;
  NamedTensors named_buffers() const;
  /// The direct children, in registration order, as the concrete modules they are.
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;

  /// Sets training mode (on) or evaluation mode (off) for this module and all descendants;
  /// it changes what Dropout does.
  void train(bool on = true);
  /// train(false).
  void eval() { train(false); }
  bool is_training() const;

  /// Moves every parameter and buffer (and existing gradients) to `device` in place: the same
  /// tensors then live on the device, requires_grad unchanged. A device with no kernels raises
  /// Tensor::to's DeviceError, and then nothing has moved.
  void to(Device device);
  /// Converts every floating parameter and buffer (and existing gradients) to the floating
  /// `dtype` in place, as to(Device) does; integer buffers keep their dtype.
  void to(DType dtype);
  /// Zeroes existing gradient buffers in place (it does not free them).
  void zero_grad();

  /// Parameters and buffers by dotted name. The values share storage with the module's tensors
  /// but are outside autograd (as PyTorch's detach()ed state_dict values).
  StateDict state_dict() const;
  /// Copies values from `dict` into the parameters and buffers, in place and outside autograd.
  /// Shapes and dtypes must match (a ShapeError or DTypeError naming the key and both sides);
  /// with `strict`, missing and unexpected names are an Error listing them. Nothing is copied
  /// unless every entry checks out.
  void load_state_dict(const StateDict& dict, bool strict = true);
  /// Writes state_dict() to `path` (Note [State dict file]).
  void save(const std::string& path) const;
  /// Reads a file written by save() and loads it strictly. Unreadable, damaged or foreign files
  /// raise an Error naming the file and what was expected.
  void load(const std::string& path);

  /// A name for messages: "Linear(784, 1024)" for layers, the class name for other modules.
  std::string name() const;
  /// True when both handles name the same module (copies of each other).
  bool is_same(const Module& other) const { return state_ == other.state_; }

 protected:
  /// A module with a fixed name for messages ("Linear(784, 1024)").
  explicit Module(std::string name);

  /// Registers a parameter under `name` (no '.', unique in this module) and returns it. The
  /// tensor must be a leaf; it is marked requires_grad(requires_grad).
  Tensor register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  /// Registers a buffer: state saved in state_dict() and moved by to(), but not trained.
  Tensor register_buffer(std::string name, Tensor tensor);
  /// Registers a child module, given by value (a copy, which shares the module's state) or by
  /// std::shared_ptr, and returns it: `fc1 = register_module("fc1", Linear(784, 1024));`.
  template <ModuleType M>
  M register_module(std::string name, M module) {
    auto held = std::make_shared<M>(std::move(module));
    add_child(std::move(name), held);
    return *held;
  }
  template <ModuleType M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    add_child(std::move(name), module);
    return module;
  }

  /// The number of children, and the i-th (registration order): for containers' forward.
  size_t num_children() const;
  Module& child(size_t i) const;
  /// The i-th child as registered (a ValueError when out of range), and the child registered
  /// as `name` (null when there is none): for containers' accessors.
  const std::shared_ptr<Module>& child_ptr(size_t i) const;
  std::shared_ptr<Module> child_named(const std::string& name) const;

 private:
  struct State;
  void add_child(std::string name, std::shared_ptr<Module> child);

  std::shared_ptr<State> state_;
};

// Note [State dict file]
// save() writes a versioned little-endian binary file:
//   magic "DUETDICT" (8 bytes) | version u32 (1) | file size u64 | entry count u64
//   per entry: name length u32, name bytes, dtype code u8, rank u32, dims i64 x rank,
//              raw elements (row-major, numel * itemsize bytes)
//   CRC-32 (zlib's crc32) u32 of every byte before it.
// The reader checks magic, version, size and checksum before it parses an entry, so a foreign,
// newer, truncated or damaged file is an Error that says which, never a partial load.

/// Writes a state dict to `path` in the format of Note [State dict file].
void write_state_dict(const StateDict& dict, const std::string& path);
/// Reads a state dict written by write_state_dict or Module::save (CPU tensors).
StateDict read_state_dict(const std::string& path);

}  // namespace duet::nn
