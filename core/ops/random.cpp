// Randomness: the Random primitive draws from Philox at an explicit state, an i64 tensor
// {seed, offset}. Eager draws read the default generator's state and advance its offset with
// an ordinary in-place add, so a traced graph sees the state as a captured input that it
// reads and updates: compiled code draws the same numbers as eager code and is never frozen.
//
// Note [Default generators]
// As in PyTorch, each device has its own default generator: the CPU's, and one per CUDA device,
// made on that device's first draw. A device generator's state tensor lives on the device, so
// its kernel reads {seed, offset} there (no host sync) and a traced graph (later a CUDA graph)
// sees it as a captured device tensor. The generators are independent streams: a CPU draw does
// not advance a CUDA generator. manual_seed(s) reseeds them all (torch.manual_seed), and a
// generator made later starts at the last seed, so after manual_seed(s) the n-th draw of a
// shape on cuda:i gives the same uniform and integer bits as the n-th draw on the CPU (the
// kernels read the same Philox blocks; normals agree within 2 ulp of the device's log/sin/cos).
#include <array>
#include <limits>
#include <mutex>

#include "core/dispatch.h"
#include "core/op_table.h"
#include "core/op_errors.h"
#include "core/ops.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ull;  // PyTorch's default seed

// attrs: ints = shape, dtype, dim = distribution (0 uniform, 1 normal, 2 integers), end = high.
void infer_random(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Tensor& st = in[0];
  const char* op = a.dim == 0 ? "rand" : a.dim == 1 ? "randn" : "randint";  // the builder called
  DUET_CHECK_DTYPE(st.dtype() == DType::i64 && st.sizes() == Shape{2},
                   "[{}] generator state must be i64 of shape (2), got {} {}", op, st.dtype(),
                   st.sizes());
  out.shape = Shape(a.ints.data(), a.ints.size());
  for (int64_t d : out.shape)
    DUET_CHECK_VALUE(d >= 0, "[{}] negative size {} in shape {}", op, d, out.shape);
  if (a.dim == 2) {
    DUET_CHECK_DTYPE(is_integral(a.dtype) || is_floating(a.dtype),
                     "[randint] dtype must be numeric, got {}", a.dtype);
    DUET_CHECK_VALUE(a.end > 0, "[randint] high must be positive, got {}", a.end);
    // Every value below high must be exact in the dtype (PyTorch's bound for floats too).
    const int bits = a.dtype == DType::i32    ? 31
                     : a.dtype == DType::i16  ? 15
                     : a.dtype == DType::u8   ? 8
                     : a.dtype == DType::i8   ? 7
                     : a.dtype == DType::bf16 ? 8
                     : a.dtype == DType::f16  ? 11
                     : a.dtype == DType::f32  ? 24
                     : a.dtype == DType::f64  ? 53
                                              : 63;
    DUET_CHECK_VALUE(bits == 63 || a.end <= (int64_t(1) << bits),
                     "[randint] high {} is out of range for {} (at most 2^{})", a.end, a.dtype,
                     bits);
  } else {
    DUET_CHECK_DTYPE(is_floating(a.dtype), "[{}] dtype must be floating, got {}", op, a.dtype);
  }
  out.dtype = a.dtype;
  out.device = st.device();
}

std::mutex& generator_mutex() {
  static std::mutex m;
  return m;
}

// The seed of the last manual_seed (kDefaultSeed before any): where a device generator made
// later starts. Guarded by generator_mutex().
uint64_t g_seed = kDefaultSeed;

// A device's default generator: its state {seed, offset} on the device, and the constant {0, 1}
// there, which a draw scales by its block count to advance the offset with device ops only (a
// host tensor of two elements cannot be an operand of a device op).
struct DeviceGenerator {
  Tensor state;
  Tensor unit;
};

// One slot per value a Device::index (an int8_t) can hold, so an index never exceeds the table.
constexpr int kMaxDevices = std::numeric_limits<int8_t>::max() + 1;

// A CPU i64 tensor {a, b}.
Tensor pair(int64_t a, int64_t b) {
  Tensor t = empty(Shape{2}, DType::i64);
  static_cast<int64_t*>(t.raw_data())[0] = a;
  static_cast<int64_t*>(t.raw_data())[1] = b;
  return t;
}

// The device generators made so far, by device index (null where none yet). Guarded by
// generator_mutex().
std::array<DeviceGenerator*, kMaxDevices>& device_generators() {
  static std::array<DeviceGenerator*, kMaxDevices> gens{};
  return gens;
}

// The default generator of a non-CPU device, made on its first use at the last manual_seed.
// Called with generator_mutex() held. The tensors are made with the modes suspended (a first
// draw inside a trace makes real state, which the trace then captures) and are leaked: they
// are used until exit, and freeing device memory after the CUDA runtime is torn down fails.
DeviceGenerator& device_generator(Device device, const char* op) {
  check_device_usable(device, op);
  DUET_CHECK_DEVICE(device.index >= 0, "[{}] bad device {}", op, device);
  DeviceGenerator*& g = device_generators()[static_cast<size_t>(device.index)];
  if (__builtin_expect(g == nullptr, 0)) {
    SuspendModes eager;
    auto* made = new DeviceGenerator;
    made->state = pair(static_cast<int64_t>(g_seed), 0).to(device);
    made->unit = pair(0, 1).to(device);
    g = made;
  }
  return *g;
}

}  // namespace

Tensor& generator_state() {
  static Tensor* state = [] {
    auto* t = new Tensor(empty(Shape{2}, DType::i64));  // leaked: used until exit
    int64_t* p = static_cast<int64_t*>(t->raw_data());
    p[0] = static_cast<int64_t>(kDefaultSeed);
    p[1] = 0;
    return t;
  }();
  return *state;
}

std::vector<Tensor> generator_states() {
  std::lock_guard<std::mutex> lock(generator_mutex());
  std::vector<Tensor> r{generator_state()};
  for (DeviceGenerator* g : device_generators())
    if (g) r.push_back(g->state);
  return r;
}

void register_random_rules(OpDef* t) {
  t[int(OpId::Random)].infer = infer_random;
  set_not_differentiable(t, OpId::Random);
}

// A draw of the shape `dims`, which may be symbolic (the shape of a traced tensor, as dropout's
// mask): the graph then advances the state by a count of blocks computed from the sizes.
Tensor random_dims(const char* op, const SymDims& dims, DType dtype, int dist, int64_t high,
                   const Options& o) {
  Attrs a = shape_attrs(dims);
  a.dtype = dtype;
  a.dim = dist;
  a.end = high;
  // Two 32-bit words per element, four per Philox block.
  const SymInt blocks = floordiv(sym_numel(dims) + 1, 2);
  std::lock_guard<std::mutex> lock(generator_mutex());
  if (__builtin_expect(!o.device_.is_cpu(), 0)) {
    // A device's own generator (Note [Default generators]): the draw and the advance are device
    // ops on its state, {0, 1} * blocks added to {seed, offset}.
    DeviceGenerator& g = device_generator(o.device_, op);
    const Tensor* in[] = {&g.state};
    Tensor out = call(OpId::Random, TensorRefs(in, 1), a);
    Tensor step;
    if (blocks.is_concrete()) {
      // The count travels as a host wrapped number (it goes with tensors on any device).
      step = g.unit * wrap_scalar(Scalar(blocks.concrete()), DType::i64, Device::cpu());
    } else {
      // A traced count is a CPU tensor, no operand of a device op: {0, blocks} is summed from
      // {0, 1} broadcast to (2, blocks) on the device.
      step = sum(expand_dims(unsqueeze(g.unit, 1), SymDims{SymInt(2), blocks}), Dims{1});
    }
    g.state.add_(step);
    if (o.requires_grad_) out.requires_grad_(true);
    return out;
  }
  Tensor& st = generator_state();
  const Tensor* in[] = {&st};
  Tensor out = call(OpId::Random, TensorRefs(in, 1), a);
  Tensor step;
  if (blocks.is_concrete()) {
    step = empty(Shape{2}, DType::i64);
    static_cast<int64_t*>(step.raw_data())[0] = 0;
    static_cast<int64_t*>(step.raw_data())[1] = blocks.concrete();
  } else {
    step = arange(2, Options().dtype(DType::i64)) * size_scalar(blocks, DType::i64);  // {0, blocks}
  }
  st.add_(step);
  if (o.requires_grad_) out.requires_grad_(true);
  return out;
}

Tensor random(const char* op, Shape shape, DType dtype, int dist, int64_t high, const Options& o) {
  return random_dims(op, SymDims(shape.begin(), shape.end()), dtype, dist, high, o);
}

}  // namespace detail

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(detail::generator_mutex());
  Tensor& st = detail::generator_state();
  Tensor v = detail::pair(static_cast<int64_t>(seed), 0);
  st.copy_(v);
  // Every device generator too (torch.manual_seed seeds all CUDA devices); one made later
  // starts at this seed. Written in place, so compiled functions that captured a state keep it.
  detail::g_seed = seed;
  for (detail::DeviceGenerator* g : detail::device_generators())
    if (g) g->state.copy_(v.to(g->state.device()));
}

Tensor rand(Shape shape, Options o, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::random("rand", shape, o.dtype_.value_or(DType::f32), 0, 0, o);
}
Tensor randn(Shape shape, Options o, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::random("randn", shape, o.dtype_.value_or(DType::f32), 1, 0, o);
}
Tensor randint(int64_t high, Shape shape, Options o, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::random("randint", shape, o.dtype_.value_or(DType::i64), 2, high, o);
}

namespace {
// A draw of x's shape (its dims as SymInts: a symbolic batch dim stays symbolic), in x's dtype
// and on x's device unless the Options say otherwise (as the other *_like creators).
Tensor random_like(const char* op, const Tensor& x, const Options& o, int dist) {
  const DType dtype = o.dtype_.value_or(x.dtype());
  DUET_CHECK_DTYPE(is_floating(dtype), "[{}] dtype must be floating, got {} (input of shape {})",
                   op, dtype, detail::dims_str(detail::sym_dims(x)));
  Options drawn = Options().dtype(dtype).device(o.device_.is_cpu() ? x.device() : o.device_);
  drawn.requires_grad(o.requires_grad_);
  return detail::random_dims(op, detail::sym_dims(x), dtype, dist, 0, drawn);
}
}  // namespace

Tensor rand_like(Located x, Options o) {
  detail::SiteGuard site(x.loc);
  return random_like("rand_like", x.tensor, o, 0);
}
Tensor randn_like(Located x, Options o) {
  detail::SiteGuard site(x.loc);
  return random_like("randn_like", x.tensor, o, 1);
}

// With replacement: u * total, for u uniform in [0, 1) and total the row's sum, falls in the
// interval [cdf[j-1], cdf[j]) of category j with probability p[j] / total; j is the number of
// cumulative sums at or below it (a category of weight 0 has an empty interval), clamped to the
// last category against rounding. Without replacement: the num_samples largest of
// log(p) + Gumbel noise are a draw without replacement (the Gumbel top-k trick); weight 0 gives
// -inf, never drawn before a positive weight. The weights are not checked for negative or
// non-finite values, as torch.multinomial does: that would read them on the host (a sync on a
// device, a data-dependent read under compile).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("multinomial", [&]() -> Tensor {
    DUET_CHECK_DTYPE(is_floating(probs.dtype()),
                     "[multinomial] probabilities must be floating, got {} of shape {}",
                     probs.dtype(), detail::dims_str(detail::sym_dims(probs)));
    DUET_CHECK_SHAPE(probs.dim() == 1 || probs.dim() == 2,
                     "[multinomial] probabilities must be 1-D or 2-D (rows), got shape {}",
                     detail::dims_str(detail::sym_dims(probs)));
    const SymDims ps = detail::sym_dims(probs);
    const SymInt n = ps.back();
    DUET_CHECK_VALUE(num_samples > 0, "[multinomial] num_samples must be positive, got {}",
                     num_samples);
    DUET_CHECK_VALUE(!detail::sym_decide(n, detail::SymRel::Eq, 0, "multinomial"),
                     "[multinomial] needs at least one category, got shape {}",
                     detail::dims_str(ps));
    DUET_CHECK_VALUE(replacement || detail::sym_decide(SymInt(num_samples), detail::SymRel::Le, n,
                                                       "multinomial"),
                     "[multinomial] cannot draw {} samples without replacement from {} "
                     "categories",
                     num_samples, n.str());
    const Tensor p = probs.detach();
    const Options o = Options().dtype(p.dtype()).device(p.device());
    if (!replacement) {
      Tensor u = rand_like(p, o);
      Tensor keys = log(p) - log(neg(log(u)));
      return std::get<1>(topk(keys, num_samples, -1));
    }
    Tensor cdf = cumsum(p, -1);                    // (..., n)
    Tensor total = slice(cdf, -1, -1, INT64_MAX);  // (..., 1)
    SymDims us = ps;
    us.back() = num_samples;
    Tensor u = detail::random_dims("multinomial", us, p.dtype(), 0, 0, o) * total;  // (..., s)
    Tensor count = sum(le(unsqueeze(cdf, -2), unsqueeze(u, -1)), -1);               // (..., s)
    return minimum(count, detail::size_scalar(n - SymInt(1), DType::i64));
  });
}

Tensor dropout(const Tensor& x, double p, bool training, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(p >= 0 && p <= 1, "[dropout] probability must be in [0, 1], got {}", p);
  DUET_CHECK_DTYPE(is_floating(x.dtype()), "[dropout] needs a floating input, got {}", x.dtype());
  if (!training || p == 0) return x;
  if (p == 1) return x * 0;
  // The mask has x's dims as SymInts: a symbolic batch dim of x stays symbolic.
  Tensor keep = ge(detail::random_dims("rand", detail::sym_dims(x), x.dtype(), 0, 0,
                                       Options().dtype(x.dtype()).device(x.device())),
                   p);
  return x * keep * (1.0 / (1.0 - p));
}

}  // namespace duet
