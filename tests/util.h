// duet tests: helpers shared by the test binaries. Values are written into and read out of
// storage directly (with the strides), so the checks do not depend on the kernels under test.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "duet.h"

namespace duet::test {

/// Whether s contains part / starts with prefix (for checking error messages).
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
inline bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

/// Every dtype, as a list to loop over.
inline const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                              DType::i32, DType::i64, DType::b8,  DType::i8,
                                              DType::u8,  DType::i16};

/// A double rounded as storing it in `dtype` rounds it (b8: nonzero is 1, ints truncate).
double round_to(double v, DType dtype);

/// A contiguous tensor holding `v` (row-major) converted to `dtype`, written without kernels.
Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype = DType::f32);

/// The logical values of any tensor (strided, offset, expanded), row-major, read from storage.
std::vector<double> values(const Tensor& t);
/// The bytes of each element, row-major, read from storage (like values()).
std::vector<unsigned char> element_bytes(const Tensor& t);
/// Same shape, dtype and bits, element by element (a NaN equals the same NaN).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && element_bytes(a) == element_bytes(b);
}
/// Same shape and dtype, and differences(values(a), values(b), tol, tol) is empty:
/// |a - b| <= tol * (1 + |b|) everywhere, a NaN equals only a NaN, infinities match exactly.
bool close(const Tensor& a, const Tensor& b, double tol = 1e-6);
/// Whether a CUDA GPU is usable. Without one it calls skip("no usable CUDA GPU") once: the
/// binary then exits with 77 if nothing failed, which ctest reports as skipped
/// (SKIP_RETURN_CODE, tests/CMakeLists.txt).
bool gpu();
/// One training step as users write it: zero_grad, the cross-entropy of m(x) against the labels
/// y, backward, step; returns the loss.
Tensor classifier_step(nn::Module& m, optim::Optimizer& o, const Tensor& x, const Tensor& y);
/// The same logical tensor on cuda:0, with the same sizes, strides and offset: the elements the
/// CPU tensor's view can reach are copied, and the view is rebuilt over the copy. Wrapped numbers
/// stay on the host (they go anywhere).
Tensor cuda_like(const Tensor& t);
std::vector<Tensor> cuda_like(const std::vector<Tensor>& in);

/// True when the two tensors share one storage block.
bool same_storage(const Tensor& a, const Tensor& b);

/// A deterministic generator (splitmix64).
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next();
  /// Uniform in [lo, hi].
  double uniform(double lo, double hi);
};

/// n values in [lo, hi] representable in `dtype`: integers for i32/i64 (in [ilo, ihi]), 0/1 for
/// b8; `discrete` floats are multiples of 0.5 so that equality comparisons hit.
struct Domain {
  double lo = -3, hi = 3;
  double ilo = -5, ihi = 5;
  bool discrete = false;
};
std::vector<double> random_values(int64_t n, const Domain& d, DType dtype, Rng& rng);

/// How a tensor with given logical values sits in memory.
enum class Layout {
  Contiguous,
  Transposed,  ///< stored transposed (last two dims swapped), viewed back: non-contiguous
  Strided,     ///< every other element of a larger buffer along dim 0, at an offset
  Offset,      ///< contiguous, but at a nonzero offset into a larger buffer
};
const char* layout_name(Layout l);
/// A tensor of `shape` holding the logical values `v`, laid out as asked.
Tensor make_layout(const std::vector<double>& v, const Shape& shape, DType dtype, Layout layout);

/// The multi-index of element i of a row-major shape, and back (plain index arithmetic, shared
/// with no kernel, for references).
std::vector<int64_t> unravel(int64_t i, const Shape& s);
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s);
/// Broadcasts row-major values of shape `from` to shape `to` (plain index arithmetic).
std::vector<double> broadcast_values(const std::vector<double>& v, const Shape& from,
                                     const Shape& to);
/// The broadcast of two shapes (PyTorch's rule, written independently of the library's).
Shape broadcast_shape(const Shape& a, const Shape& b);
/// A sample input: values `v` of shape `made` laid out as asked, then, when `shape` differs
/// from `made`, expanded to it (a stride-0 view); `v` becomes the broadcast logical values.
Tensor make_sample(std::vector<double>& v, const Shape& made, const Shape& shape, DType dtype,
                   Layout layout);

/// How differences() compares zeros: Equal lets -0.0 match +0.0 (as ==); Signed makes them
/// differ, for results whose sign IEEE 754 defines (x * -0.0, x / -0.0, -(0.0), abs(-0.0)).
enum class Zeros { Equal, Signed };

/// Empty when `got` matches `want` within atol + rtol * |want| (NaN equals only NaN, whatever its
/// sign and payload; infinities match exactly; with Zeros::Signed a zero matches only a zero of
/// its sign); otherwise a description of the first mismatch.
std::string differences(const std::vector<double>& got, const std::vector<double>& want,
                        double rtol, double atol, Zeros zeros = Zeros::Equal);

/// The values where floating point is special, NaN, +inf, -inf, +0.0 and -0.0, then ordinary
/// values (1, -1.5, 2.5) that binary ops meet them with. All are exact in f32.
const std::vector<double>& special_values();
/// Row-major values of inputs on a grid of special_values(): each input runs over them (over 1
/// and 0 where `cond[i]`, a b8 condition) against every combination of the others, the grid
/// repeated to at least 32 elements (whole SIMD packets of f32 and f64), a multiple of 8.
std::vector<std::vector<double>> special_grid(const std::vector<bool>& cond);
/// Whether IEEE 754 (or the op's definition on top of it) gives the float result of an
/// elementwise op exactly, the sign of a zero included: correctly rounded arithmetic (add, sub,
/// mul, div, sqrt), sign operations (neg, abs), selections (relu, maximum, minimum, where) and
/// comparisons. Such results compare exactly and signbit-aware; the others (exp, sin, ...)
/// within a tolerance.
bool ieee_exact(OpId op);

/// Checks shape, dtype and values of `got` in one assertion each.
void check_tensor(const Tensor& got, const Shape& shape, DType dtype,
                  const std::vector<double>& want, double rtol = 0, double atol = 0);

/// Throws nothing and returns the message when `f` throws duet::Error of type E; fails the test
/// (and returns "") when it throws something else or nothing.
template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw the wrong exception type: " << e.what());
    return "";
  }
  FAIL_CHECK("did not throw");
  return "";
}

/// A dispatch mode that counts calls by op name and forwards them unchanged.
class CountingMode : public DispatchMode {
 public:
  Tensor handle(const OpCall& call) override;
  int count(const std::string& op) const;
  int total() const;
  std::map<std::string, int> counts;
};

/// Runs f with the OpenMP thread count set to n, then restores it.
template <class F>
void with_threads(int n, F&& f) {
  int old = get_num_threads();
  set_num_threads(n);
  try {
    f();
  } catch (...) {
    set_num_threads(old);
    throw;
  }
  set_num_threads(old);
}

/// Reports that a test could not run here: prints "skipped: <reason>" and makes main()
/// (tests/main.cpp) exit with 77 when every test case passed, which ctest reports as Skipped for
/// a test registered with SKIP_RETURN_CODE 77 (tests/CMakeLists.txt). A failure still exits
/// with 1. gpu() calls it when no GPU is usable.
void skip(const std::string& reason);
/// Whether skip() was called in this process.
bool skipped();

}  // namespace duet::test
