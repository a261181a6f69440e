// duet_bench floors: what the hardware and the best libraries do with the same work, written
// directly, so that a slow duet cannot hide behind a weak floor.
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <sys/resource.h>

#include <Eigen/Core>
#include <cstring>

#include "bench/bench.h"

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

void sgemm_openblas(const float* a, const float* b, float* c, int64_t n) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
}

void set_blas_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

}  // namespace bench
