// duet: matmul's vector operands as matrices, for the kernels (Note [Vector operands] in
// core/ops/linalg.cpp).
#pragma once

#include <string>
#include <string_view>

#include "core/op_table.h"

namespace duet::kernels {

/// Runs matmul kernel k with a 1-D operand as a row (left) or a column (right) and the output
/// with that dim put back: views, no copy.
void run_as_matrices(KernelFn k, TensorRefs in, const Attrs& attrs, const Tensor& out);

/// addmv (Note [addmv] in core/ops/linalg.cpp) on any device: the MatMul kernel of the output's
/// device stores mat @ vec, and its Add kernel adds the input in place. addmm's kernels (Note
/// [addmm]) fall back on it where they have no GEMM that adds the bias itself.
void addmv_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out);

/// The most multiply-adds an f32 product has that runs on OpenBLAS, where the build found it,
/// rather than on oneDNN (Note [Small products] in kernels/matmul.cpp). The bench's GEMM floors
/// choose their library by it too.
inline constexpr int64_t kSmallProduct = int64_t(64) * 64 * 64;

/// From this many rows of a on, an f32 product a @ b^T of more than kSmallProduct multiply-adds
/// runs on oneDNN's matmul primitive rather than its sgemm (Note [Products read transposed] in
/// kernels/matmul.cpp). The bench's GEMM floors follow it.
inline constexpr int64_t kTransposedPrimitiveRows = 16;

/// Whether f32 products of at most kSmallProduct multiply-adds run on OpenBLAS: where the build
/// found it and its kernels fit this CPU (Note [OpenBLAS's choice of kernels] in
/// kernels/matmul.cpp); otherwise on oneDNN. Decided once per process.
bool small_products_on_openblas();
/// Whether OpenBLAS's kernels named `core` (as openblas_get_corename names them) fit a CPU with
/// AVX2 or one without: on a CPU with AVX2, only those that use it do.
bool openblas_core_fits(std::string_view core, bool cpu_has_avx2);
/// The library small f32 products run on, in words (the bench prints it).
std::string small_product_library();

/// Below this many FLOPs a convolution runs on the calling thread (kernels/conv.cpp): oneDNN
/// opens a parallel region for any size, and its fork and join cost more than they save on a
/// few microseconds of work.
inline constexpr double kSerialConvFlops = 4e6;

/// Whether the CPU matmul kernel's sums for (m x k) @ (k x n) of dtype dt depend on the number of
/// threads it runs on (Note [Sums that follow the threads] in trace/plan/plan_waves.cpp): found
/// by running it both ways, once per shape and thread count, and cached.
bool product_sums_follow_threads(DType dt, int64_t m, int64_t n, int64_t k);

/// c (m x n, rows ldc apart) = a b + beta c, with a (m x k) and b (k x n) row-major, or read
/// transposed where ta, tb, with leading dims lda and ldb: on the library the matmul kernel picks
/// for the shape (f32: OpenBLAS up to kSmallProduct where it fits the CPU, else oneDNN; f64:
/// Eigen). The calling thread's OpenMP threads run it.
void gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

/// Matmul kernel K, which multiplies operands of rank >= 2, for vector operands too.
template <KernelFn K>
void with_matrices(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  if (in[0].unsafe_impl()->shape.size() < 2 || in[1].unsafe_impl()->shape.size() < 2) [[unlikely]]
    return run_as_matrices(K, in, attrs, out);
  K(in, attrs, out);
}

}  // namespace duet::kernels
