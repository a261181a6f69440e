#include "util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace duet::test {

double round_to(double v, DType dtype) {
  switch (dtype) {
    case DType::f32:
      return static_cast<double>(static_cast<float>(v));
    case DType::f64:
      return v;
    case DType::i32:
      return static_cast<double>(static_cast<int32_t>(v));
    case DType::i64:
      return static_cast<double>(static_cast<int64_t>(v));
    case DType::b8:
      return v != 0 ? 1.0 : 0.0;
    case DType::f16:
    case DType::bf16:  // through f32, as a cast from f64 rounds (and as PyTorch's does)
      return low_precision_to_float(float_to_low_precision(static_cast<float>(v), dtype), dtype);
    case DType::i8:  // truncated, then the low bits (PyTorch's CPU cast: -1.0 to u8 is 255)
      return static_cast<int8_t>(static_cast<int64_t>(v));
    case DType::u8:
      return static_cast<uint8_t>(static_cast<int64_t>(v));
    case DType::i16:
      return static_cast<int16_t>(static_cast<int64_t>(v));
    default:
      FAIL("round_to: unknown dtype");
  }
  return 0;
}

namespace {

void write_at(void* base, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::f64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::i32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DType::b8:
      static_cast<bool*>(base)[i] = v != 0;
      break;
    case DType::f16:
    case DType::bf16:
      static_cast<uint16_t*>(base)[i] = float_to_low_precision(static_cast<float>(v), dtype);
      break;
    case DType::i8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(round_to(v, dtype));
      break;
    case DType::u8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(round_to(v, dtype));
      break;
    case DType::i16:
      static_cast<int16_t*>(base)[i] = static_cast<int16_t>(round_to(v, dtype));
      break;
    default:
      FAIL("write_at: dtype not computed on the CPU");
  }
}

double read_at(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::f64:
      return static_cast<const double*>(base)[i];
    case DType::i32:
      return static_cast<const int32_t*>(base)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::b8:
      return static_cast<const bool*>(base)[i] ? 1.0 : 0.0;
    case DType::f16:
    case DType::bf16:
      return low_precision_to_float(static_cast<const uint16_t*>(base)[i], dtype);
    case DType::i8:
      return static_cast<const int8_t*>(base)[i];
    case DType::u8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::i16:
      return static_cast<const int16_t*>(base)[i];
    default:
      FAIL("read_at: unknown dtype");
  }
  return 0;
}

// Calls f(i, offset) for element i (row-major) of a layout of `sizes` and `strides` (elements),
// stepping the offset as an odometer does: no division per element, and no call into the
// tensor per element (an unoptimised or instrumented build pays for each).
template <class F>
void for_offsets(const Shape& sizes, const Strides& strides, F&& f) {
  const int64_t nd = sizes.size(), n = sizes.numel();
  std::vector<int64_t> sz(static_cast<size_t>(nd)), st(static_cast<size_t>(nd)),
      idx(static_cast<size_t>(nd), 0);
  for (int64_t d = 0; d < nd; ++d) {
    sz[d] = sizes[d];
    st[d] = strides[d];
  }
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int64_t d = nd - 1; d >= 0; --d) {
      off += st[d];
      if (++idx[d] < sz[d]) break;
      off -= st[d] * sz[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype) {
  REQUIRE(static_cast<int64_t>(v.size()) == shape.numel());
  Tensor t = detail::empty(shape, dtype);
  void* base = t.raw_data();
  for (size_t i = 0; i < v.size(); ++i) write_at(base, dtype, static_cast<int64_t>(i), v[i]);
  return t;
}

std::vector<double> values(const Tensor& t) {
  if (!t.device().is_cpu()) return values(t.to(Device::cpu()));  // device memory: read a copy
  std::vector<double> out(static_cast<size_t>(t.numel()));
  const void* base = t.raw_data();
  const DType dtype = t.dtype();
  for_offsets(t.sizes(), t.strides(), [&](int64_t i, int64_t off) {
    out[static_cast<size_t>(i)] = read_at(base, dtype, off);
  });
  return out;
}

std::vector<unsigned char> element_bytes(const Tensor& t) {
  if (!t.device().is_cpu()) return element_bytes(t.to(Device::cpu()));
  const size_t isz = itemsize(t.dtype());
  std::vector<unsigned char> out(static_cast<size_t>(t.numel()) * isz);
  const auto* base = static_cast<const unsigned char*>(t.raw_data());
  for_offsets(t.sizes(), t.strides(), [&](int64_t i, int64_t off) {
    std::memcpy(out.data() + static_cast<size_t>(i) * isz, base + off * int64_t(isz), isz);
  });
  return out;
}

bool same_storage(const Tensor& a, const Tensor& b) {
  return a.impl()->storage.get() == b.impl()->storage.get();
}

uint64_t Rng::next() {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform(double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(next() >> 11) * 0x1.0p-53);
}

std::vector<double> random_values(int64_t n, const Domain& d, DType dtype, Rng& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    if (dtype == DType::b8) {
      x = static_cast<double>(rng.next() & 1);
    } else if (is_integral(dtype)) {
      // Within the dtype's range (a u8 draw of a domain [-5, 5] is in [0, 5]).
      const auto range = detail::integral_range(dtype);
      const double lo = std::max<double>(d.ilo, static_cast<double>(range.least));
      const double hi = std::min<double>(d.ihi, static_cast<double>(range.most));
      x = std::floor(rng.uniform(lo, hi + 1));
      if (x > hi) x = hi;
    } else {
      x = rng.uniform(d.lo, d.hi);
      if (d.discrete) x = std::round(x * 2) / 2;
      x = round_to(x, dtype);
    }
  }
  return v;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::Transposed:
      return "transposed";
    case Layout::Strided:
      return "strided";
    case Layout::Offset:
      return "offset";
  }
  return "?";
}

Tensor make_layout(const std::vector<double>& v, const Shape& shape, DType dtype, Layout layout) {
  const int64_t nd = shape.size();
  if (layout == Layout::Transposed && nd >= 2) {
    // Store (..., b, a) so that the transpose of the stored tensor reads as (..., a, b).
    Shape stored = shape;
    std::swap(stored[nd - 1], stored[nd - 2]);
    const int64_t a = shape[nd - 2], b = shape[nd - 1];
    std::vector<double> w(v.size());
    for (int64_t i = 0; i < shape.numel(); ++i) {
      int64_t batch = i / (a * b), r = (i / b) % a, c = i % b;
      w[static_cast<size_t>(batch * a * b + c * a + r)] = v[static_cast<size_t>(i)];
    }
    Tensor t = transpose(make(w, stored, dtype), -1, -2);
    REQUIRE((!t.is_contiguous() || a <= 1 || b <= 1));
    return t;
  }
  if (layout == Layout::Strided && nd >= 1) {
    // Dim 0 of a larger buffer, every other element from index 1; the gaps hold junk.
    Shape big = shape;
    big[0] = 2 * shape[0] + 1;
    const int64_t inner = shape.numel() / std::max<int64_t>(shape[0], 1);
    const double junk = dtype == DType::b8 ? 1 : 99;
    std::vector<double> w(static_cast<size_t>(big.numel()), junk);
    for (int64_t i = 0; i < shape.numel(); ++i) {
      int64_t k = i / inner, r = i % inner;
      w[static_cast<size_t>((2 * k + 1) * inner + r)] = v[static_cast<size_t>(i)];
    }
    return slice(make(w, big, dtype), 0, 1, big[0], 2);
  }
  if (layout == Layout::Offset) {
    // One junk row (or element) in front of the values; a 0-d result is reshaped from it.
    int64_t row = 1;
    for (int64_t d = 1; d < nd; ++d) row *= shape[d];
    std::vector<double> w(static_cast<size_t>(row), dtype == DType::b8 ? 1 : 99);
    w.insert(w.end(), v.begin(), v.end());
    Shape big = nd == 0 ? Shape{2} : shape;
    if (nd > 0) big[0] += 1;
    Tensor t = slice(make(w, big, dtype), 0, 1, big[0]);
    return nd == 0 ? reshape(t, {}) : t;
  }
  return make(v, shape, dtype);
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  const int64_t n = std::max(a.size(), b.size());
  Shape out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

Tensor make_sample(std::vector<double>& v, const Shape& made, const Shape& shape, DType dtype,
                   Layout layout) {
  Tensor x = make_layout(v, made, dtype, layout);
  if (made == shape) return x;
  v = broadcast_values(v, made, shape);
  return expand(x, shape);
}

std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(static_cast<size_t>(s.size()));
  for (int64_t d = s.size() - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (int64_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

std::vector<double> broadcast_values(const std::vector<double>& v, const Shape& from,
                                     const Shape& to) {
  // `from`'s row-major strides aligned to `to`, 0 where a dim broadcasts.
  const int64_t nd = to.size(), lead = to.size() - from.size();
  Strides st(nd, 0);
  int64_t mul = 1;
  for (int64_t d = nd - 1; d >= lead; --d) {
    const int64_t fs = from[d - lead];
    st[d] = fs == 1 ? 0 : mul;
    mul *= fs;
  }
  std::vector<double> out(static_cast<size_t>(to.numel()));
  for_offsets(to, st, [&](int64_t i, int64_t off) {
    out[static_cast<size_t>(i)] = v[static_cast<size_t>(off)];
  });
  return out;
}

std::string differences(const std::vector<double>& got, const std::vector<double>& want,
                        double rtol, double atol, Zeros zeros) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(g) || std::isnan(w))
      ok = std::isnan(g) && std::isnan(w);  // a NaN equals only a NaN
    else if (g == w)                        // infinities too; zeros of either sign
      ok = zeros == Zeros::Equal || std::signbit(g) == std::signbit(w);
    else
      ok = std::isfinite(w) && std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << got.size() << " elements differ; first at " << first << ": got "
     << got[first] << ", want " << want[first];
  return os.str();
}

const std::vector<double>& special_values() {
  static const std::vector<double> v = {std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        0.0,
                                        -0.0,
                                        1.0,
                                        -1.5,
                                        2.5};
  return v;
}

std::vector<std::vector<double>> special_grid(const std::vector<bool>& cond) {
  const std::vector<double>& sv = special_values();
  std::vector<int64_t> radix;
  int64_t n = 1;
  for (bool c : cond) {
    radix.push_back(c ? 2 : static_cast<int64_t>(sv.size()));
    n *= radix.back();
  }
  const int64_t total = std::max<int64_t>((32 + n - 1) / n, 1) * n;
  REQUIRE(total % 8 == 0);
  std::vector<std::vector<double>> vals(cond.size());
  for (int64_t e = 0; e < total; ++e) {
    int64_t r = e % n;
    for (size_t i = 0; i < cond.size(); ++i) {
      const int64_t k = r % radix[i];
      r /= radix[i];
      vals[i].push_back(cond[i] ? static_cast<double>(k == 0) : sv[static_cast<size_t>(k)]);
    }
  }
  return vals;
}

bool ieee_exact(OpId op) {
  switch (op) {
    case OpId::Neg:
    case OpId::Abs:
    case OpId::Relu:
    case OpId::Sqrt:
    case OpId::Add:
    case OpId::Sub:
    case OpId::Mul:
    case OpId::Div:
    case OpId::Maximum:
    case OpId::Minimum:
    case OpId::Lt:
    case OpId::Le:
    case OpId::Gt:
    case OpId::Ge:
    case OpId::Eq:
    case OpId::Ne:
    case OpId::Where:
      return true;
    default:
      return false;
  }
}

void check_tensor(const Tensor& got, const Shape& shape, DType dtype,
                  const std::vector<double>& want, double rtol, double atol) {
  CHECK(got.sizes().str() == shape.str());
  CHECK(dtype_name(got.dtype()) == dtype_name(dtype));
  if (got.sizes() != shape) return;
  std::string m = differences(values(got), want, rtol, atol);
  CHECK_MESSAGE(m.empty(), m);
}

Tensor CountingMode::handle(const OpCall& call) {
  ++counts[std::string(op_name(call.op))];
  return detail::redispatch(this, call);
}

int CountingMode::count(const std::string& op) const {
  auto it = counts.find(op);
  return it == counts.end() ? 0 : it->second;
}

int CountingMode::total() const {
  int n = 0;
  for (const auto& [k, v] : counts) n += v;
  return n;
}

namespace {
std::atomic<bool> g_skipped{false};
}  // namespace

void skip(const std::string& reason) {
  std::printf("skipped: %s\n", reason.c_str());
  std::fflush(stdout);
  g_skipped.store(true);
}

bool skipped() { return g_skipped.load(); }

bool gpu() {
  static const bool ok = [] {
    const bool available = cuda::is_available();
    if (available) return true;
    // The reason discovery failed, as the error of using the device says it.
    std::string why = "no usable CUDA GPU";
    try {
      (void)zeros({1}).to(Device::cuda());
    } catch (const Error& e) {
      why = e.what();
    }
    // A GPU machine's run (tests/gpu_run.sh sets this where nvidia-smi lists a GPU) must not
    // pass by skipping every CUDA case: a driver older than the runtime, say.
    const char* require = std::getenv("DUET_REQUIRE_GPU");
    if (require && std::string(require) == "1")
      throw std::runtime_error("DUET_REQUIRE_GPU=1, but CUDA is not usable: " + why);
    skip(why);
    return false;
  }();
  return ok;
}

Tensor cuda_like(const Tensor& t) {
  if (!t.defined() || t.unsafe_impl()->wrapped_number) return t;
  if (t.numel() == 0) return t.to(Device::cuda());
  int64_t extent = t.storage_offset() + 1;
  for (int64_t d = 0; d < t.dim(); ++d) extent += (t.sizes()[d] - 1) * t.strides()[d];
  Tensor flat = detail::make_view(t, Shape{extent}, Strides{1}, 0).to(Device::cuda());
  return detail::make_view(flat, t.sizes(), t.strides(), t.storage_offset());
}
std::vector<Tensor> cuda_like(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(cuda_like(t));
  return out;
}

bool close(const Tensor& a, const Tensor& b, double tol) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  // Not a hand-written |a - b| > tol * (1 + |b|): that is false for a NaN, and would pass a run
  // that diverged.
  return differences(values(a), values(b), tol, tol).empty();
}

Tensor classifier_step(nn::Module& m, optim::Optimizer& o, const Tensor& x, const Tensor& y) {
  o.zero_grad();
  Tensor loss = cross_entropy(m(x), y);
  loss.backward();
  o.step();
  return loss;
}

}  // namespace duet::test
