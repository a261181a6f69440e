// duet_bench floors: what the hardware and the best libraries do with the same work, written
// directly, so that a slow duet cannot hide behind a weak floor.
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <sys/resource.h>

#include <Eigen/Core>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench.h"
#include "kernels/matrices.h"

namespace bench {

double peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;
}

void w2_floor_memcpy(const float* x, float* y, int64_t n) {
#pragma omp parallel
  {
    int t = omp_get_thread_num(), k = omp_get_num_threads();
    int64_t chunk = (n + k - 1) / k, b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (b < e) std::memcpy(y + b, x + b, (e - b) * sizeof(float));
  }
}

// y = tanh(x*1.5 + 0.5) * sigmoid(x) + relu(x - 0.25), one pass, Eigen's vectorized math,
// split across the threads. The sigmoid is duet's, 1 / (1 + exp(-x)) (within 5 ulp of the exact
// value over [-80, 30]), or with `eigen_logistic` Eigen's faster rational approximation, which
// is 1 ulp of 1.0 in absolute terms but up to 7117 ulp (4e-4 relative) near x = -8.3.
void w2_floor_fused(const float* x, float* y, int64_t n, bool eigen_logistic) {
#pragma omp parallel
  {
    int t = omp_get_thread_num(), k = omp_get_num_threads();
    int64_t chunk = (n + k - 1) / k, b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    // Blocks of 4096 keep the expression's temporaries in L1.
    for (int64_t i = b; i < e; i += 4096) {
      int64_t m = std::min<int64_t>(4096, e - i);
      Eigen::Map<const Eigen::ArrayXf> X(x + i, m);
      Eigen::Map<Eigen::ArrayXf> Y(y + i, m);
      if (eigen_logistic)
        Y = (X * 1.5f + 0.5f).tanh() * X.logistic() + (X - 0.25f).max(0.0f);
      else
        Y = (X * 1.5f + 0.5f).tanh() * (1.0f + (-X).exp()).inverse() + (X - 0.25f).max(0.0f);
    }
  }
}

void sgemm_onednn(const float* a, const float* b, float* c, int64_t n) {
  dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
}

void sgemm_onednn_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, float* c) {
  dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, ta == 'N' ? k : m, b, tb == 'N' ? n : k, 0.0f, c, n);
}

namespace {

// Row-major C = op(A) op(B) on operands of type t with f32 accumulation and a C of type t, on
// oneDNN's matmul primitive: a transposed operand is the same memory read with swapped strides,
// as dnnl_sgemm reads it. One primitive per type, shape and transpose pair, built on first use.
void on_primitive(dnnl::memory::data_type t, char ta, char tb, int64_t m, int64_t n, int64_t k,
                  const void* a, const void* b, void* c) {
  using dims = dnnl::memory::dims;
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static std::map<std::tuple<int, char, char, int64_t, int64_t, int64_t>, dnnl::matmul> prims;
  const dnnl::memory::desc ad(dims{m, k}, t, ta == 'N' ? dims{k, 1} : dims{1, m});
  const dnnl::memory::desc bd(dims{k, n}, t, tb == 'N' ? dims{n, 1} : dims{1, k});
  const dnnl::memory::desc cd(dims{m, n}, t, dims{n, 1});
  const auto key = std::make_tuple(static_cast<int>(t), ta, tb, m, n, k);
  auto it = prims.find(key);
  if (it == prims.end())
    it = prims
             .emplace(key, dnnl::matmul(
                               dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng)))
             .first;
  dnnl::memory ma(ad, eng, const_cast<void*>(a)), mb(bd, eng, const_cast<void*>(b)), mc(cd, eng, c);
  dnnl::stream s(eng);
  it->second.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  s.wait();
}

// The same product as dnnl_sgemm on f32 copies, rounded to bf16 (to nearest even; the floors'
// operands hold no NaN): exact, since every bf16 value is an f32 value.
void bf16_by_sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                   void* c) {
  thread_local std::vector<float> fa, fb, fc;
  auto widen = [](const void* p, int64_t count, std::vector<float>& w) {
    w.resize(static_cast<size_t>(count));
    const auto* s = static_cast<const uint16_t*>(p);
    auto* d = reinterpret_cast<uint32_t*>(w.data());
#pragma omp parallel for simd if (count >= (1 << 16))
    for (int64_t i = 0; i < count; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
  };
  widen(a, m * k, fa);
  widen(b, k * n, fb);
  fc.resize(static_cast<size_t>(m * n));
  // A small product stays on this thread, which wrote its copies: another core would first
  // fetch them from this one's cache (64^3: 13 us on two threads, 5 on one).
  const bool small = m * n * k <= int64_t(128) * 128 * 128;
  const int threads = omp_get_max_threads();
  if (small) omp_set_num_threads(1);
  sgemm_onednn_mnk(ta, tb, m, n, k, fa.data(), fb.data(), fc.data());
  if (small) omp_set_num_threads(threads);
  const auto* r = reinterpret_cast<const uint32_t*>(fc.data());
  auto* out = static_cast<uint16_t*>(c);
  const int64_t count = m * n;
#pragma omp parallel for simd if (count >= (1 << 16))
  for (int64_t i = 0; i < count; ++i)
    out[i] = static_cast<uint16_t>((r[i] + 0x7fffu + ((r[i] >> 16) & 1u)) >> 16);
}

bool onednn_has_bf16_instructions() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & want) == want;  // (the levels are bit masks: AMX's holds AVX512-BF16's)
}

}  // namespace

void matmul_onednn_f32_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                           const float* b, float* c) {
  on_primitive(dnnl::memory::data_type::f32, ta, tb, m, n, k, a, b, c);
}

void sgemm_floor_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                     const float* b, float* c) {
  if (m * n * k > duet::kernels::kSmallProduct || !duet::kernels::small_products_on_openblas()) {
    if (ta == 'N' && tb == 'T' && m >= duet::kernels::kTransposedPrimitiveRows)
      return matmul_onednn_f32_mnk(ta, tb, m, n, k, a, b, c);
    return sgemm_onednn_mnk(ta, tb, m, n, k, a, b, c);
  }
  auto t = [](char x) { return x == 'N' ? CblasNoTrans : CblasTrans; };
  cblas_sgemm(CblasRowMajor, t(ta), t(tb), static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(ta == 'N' ? k : m), b,
              static_cast<blasint>(tb == 'N' ? n : k), 0.0f, c, static_cast<blasint>(n));
}

void matmul_onednn_bf16_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const void* a,
                            const void* b, void* c) {
  static const bool native = onednn_has_bf16_instructions();
  if (native) return on_primitive(dnnl::memory::data_type::bf16, ta, tb, m, n, k, a, b, c);
  bf16_by_sgemm(ta, tb, m, n, k, a, b, c);
}

std::string onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx (AMX-BF16)";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16 (AVX512-BF16)";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni (no native bf16: emulated)";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core (no native bf16: emulated)";
    case dnnl::cpu_isa::avx2:
      return "avx2 (no bf16 kernels)";
    default:
      return "other";
  }
}

void sgemm_openblas(const float* a, const float* b, float* c, int64_t n) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
}

void set_blas_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

}  // namespace bench
