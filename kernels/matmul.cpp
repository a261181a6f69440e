// CPU matmul. f32 goes to oneDNN's sgemm, which measured fastest on these machines (see
// bench W3: oneDNN against OpenBLAS); bf16 and f16 to oneDNN's matmul primitive, which
// accumulates in f32 and uses AMX or AVX512-BF16 where the CPU has them (sgemm on f32 copies
// where oneDNN has no kernel for the dtype); other dtypes go to Eigen's GEMM. Transposed
// operands are passed as transposes, not copied; other strided operands are made contiguous
// first.
#include <oneapi/dnnl/dnnl.h>
#if DUET_WITH_OPENBLAS
#include <cblas.h>
#endif

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <strings.h>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "kernels/cpu_kernels.h"
#include "kernels/loops.h"
#include "kernels/low_precision.h"
#include "kernels/matrices.h"

namespace duet::kernels {
namespace {

// How a [rows, cols] matrix with element strides (s0, s1) reaches a row-major GEMM.
struct MatLayout {
  char trans;  // 'N' or 'T'
  int64_t ld;
  bool ok;
};
MatLayout layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  // Size-1 dims have arbitrary strides: normalize them.
  if (cols == 1) s1 = 1;
  if (rows == 1) s0 = std::max<int64_t>(cols, 1);
  if (s1 == 1 && s0 >= std::max<int64_t>(cols, 1)) return {'N', s0, true};
  if (s0 == 1 && s1 >= std::max<int64_t>(rows, 1)) return {'T', s1, true};
  return {'N', 0, false};
}

// ---- oneDNN's matmul primitive: f16 and bf16, and f32 read transposed -------------------------

dnnl::memory::data_type dnnl_type(DType dt) {
  return dt == DType::bf16  ? dnnl::memory::data_type::bf16
         : dt == DType::f16 ? dnnl::memory::data_type::f16
                            : dnnl::memory::data_type::f32;
}

// One matmul on the primitive: the operands' dtype and the result's, the sizes and layouts
// (transposed, leading dims), whether it accumulates (c += a @ b), the threads it runs on, and
// whether a bias (n) of the operands' dtype is added to the sums before they are stored (addmm).
using MatmulKey = std::array<int64_t, 13>;
MatmulKey matmul_key(DType in, DType out, int64_t m, int64_t n, int64_t k, bool ta, int64_t lda,
                     bool tb, int64_t ldb, int64_t ldc, bool accumulate, bool bias = false) {
  return {static_cast<int64_t>(in),
          static_cast<int64_t>(out),
          m,
          n,
          k,
          ta,
          lda,
          tb,
          ldb,
          ldc,
          accumulate,
          omp_in_parallel() ? 1 : omp_get_max_threads(),
          bias};
}

// Its primitive and its operands' layouts, or nothing where oneDNN has no kernel for it on this
// CPU (f16 before AVX512-FP16, say).
struct MatmulPrimitive {
  dnnl::matmul prim;
  dnnl::memory a, b, c, bias;  ///< made once, pointed at each call's data (set_data_handle)
  /// The arguments of execute(), made once: a call then allocates nothing.
  std::unordered_map<int, dnnl::memory> args;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

std::optional<MatmulPrimitive> make_matmul_primitive(const MatmulKey& key) {
  const auto [in, out, m, n, k, ta, lda, tb, ldb, ldc, accumulate, threads, bias] = key;
  (void)threads;
  using dims = dnnl::memory::dims;
  const auto t = dnnl_type(static_cast<DType>(in));
  const dnnl::memory::desc a(dims{m, k}, t, ta ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc b(dims{k, n}, t, tb ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc c(dims{m, n}, dnnl_type(static_cast<DType>(out)), dims{ldc, 1});
  const dnnl::memory::desc bias_desc =
      bias ? dnnl::memory::desc(dims{1, n}, t, dims{n, 1}) : dnnl::memory::desc();
  try {
    dnnl::engine& eng = cpu_engine();
    dnnl::primitive_attr attr;
    if (accumulate) {  // c += a @ b: the product, summed in f32, then added to c
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc d =
        bias ? dnnl::matmul::desc(a, b, bias_desc, c) : dnnl::matmul::desc(a, b, c);
    MatmulPrimitive mm{dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, eng)),
                       dnnl::memory(a, eng, DNNL_MEMORY_NONE),
                       dnnl::memory(b, eng, DNNL_MEMORY_NONE),
                       dnnl::memory(c, eng, DNNL_MEMORY_NONE),
                       dnnl::memory(bias_desc, eng, DNNL_MEMORY_NONE),
                       {}};
    mm.args = {{DNNL_ARG_SRC, mm.a}, {DNNL_ARG_WEIGHTS, mm.b}, {DNNL_ARG_DST, mm.c}};
    if (bias) mm.args.emplace(DNNL_ARG_BIAS, mm.bias);
    return mm;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// The product of `key` on its primitive, made on first use; false where there is none.
bool run_matmul_primitive(const MatmulKey& key, const void* a, const void* b, void* c,
                          const void* bias = nullptr) {
  // Per thread (a primitive runs on one thread at a time), bounded like the convolutions'.
  thread_local std::map<MatmulKey, std::optional<MatmulPrimitive>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 96) cache.clear();
    it = cache.emplace(key, make_matmul_primitive(key)).first;
  }
  if (!it->second) return false;
  MatmulPrimitive& mm = *it->second;
  mm.a.set_data_handle(const_cast<void*>(a));
  mm.b.set_data_handle(const_cast<void*>(b));
  mm.c.set_data_handle(c);
  thread_local dnnl::stream s(cpu_engine());
  if (bias) mm.bias.set_data_handle(const_cast<void*>(bias));
  mm.prim.execute(s, mm.args);
  s.wait();
  return true;
}

// c (m x n, dense) = a @ b on oneDNN's primitive; false where there is none.
template <class L>
bool low_gemm_onednn(const L* a, MatLayout la, const L* b, MatLayout lb, L* c, int64_t m, int64_t n,
                     int64_t k) {
  const DType dt = std::is_same_v<L, bf16_t> ? DType::bf16 : DType::f16;
  return run_matmul_primitive(
      matmul_key(dt, dt, m, n, k, la.trans == 'T', la.ld, lb.trans == 'T', lb.ld, n, false), a, b,
      c);
}

// Note [Small products]
// oneDNN's sgemm pays a cost per call (checks, its choice of kernel and of threads) that small
// products feel: on a 2-core AMX Xeon, 148 GFLOP/s at 64^3 and 27 at 16^3, where OpenBLAS's
// kernels for small matrices ran 181 and 94 (row-major, aligned operands, one call after
// another, both on two threads). From 80^3 on oneDNN is faster (218 against 169, and 314
// against 158 at 128^3: it splits the product over both threads where OpenBLAS keeps one).
// Where the build found OpenBLAS (its OpenMP build), f32 products of at most kSmallProduct
// (kernels/matrices.h) multiply-adds run on it. The choice depends on the shape only, so a call
// gives the same sums eagerly and compiled.

void sgemm(const float* a, MatLayout la, const float* b, MatLayout lb, float* c, int64_t m,
           int64_t n, int64_t k) {
  gemm_rows(la.trans == 'T', lb.trans == 'T', m, n, k, a, la.ld, b, lb.ld, 0.0f, c, n);
}

// The same product on f32 copies, rounded once (where oneDNN has no low-precision kernel).
template <class L>
void low_gemm_f32(const L* a, MatLayout la, const L* b, MatLayout lb, L* c, int64_t m, int64_t n,
                  int64_t k) {
  auto widen = [](const L* p, MatLayout l, int64_t r, int64_t cc) {
    std::vector<float> v(static_cast<size_t>(r * cc));
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < cc; ++j)
        v[i * cc + j] = static_cast<float>(l.trans == 'N' ? p[i * l.ld + j] : p[j * l.ld + i]);
    return v;
  };
  const std::vector<float> fa = widen(a, la, m, k), fb = widen(b, lb, k, n);
  std::vector<float> fc(static_cast<size_t>(m * n));
  sgemm(fa.data(), {'N', k, true}, fb.data(), {'N', n, true}, fc.data(), m, n, k);
  for (int64_t i = 0; i < m * n; ++i) c[i] = L(fc[i]);
}

template <class T>
void gemm(const T* a, MatLayout la, const T* b, MatLayout lb, T* c, int64_t m, int64_t n,
          int64_t k) {
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
    if (!low_gemm_onednn(a, la, b, lb, c, m, n, k)) low_gemm_f32(a, la, b, lb, c, m, n, k);
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    // Integer products and sums wrap around (two's complement), as in PyTorch. Signed overflow
    // is undefined behaviour in C++, so the GEMM runs on the same bits as unsigned integers
    // (reading an object through its unsigned type is allowed), where wrapping is defined.
    using U = std::make_unsigned_t<T>;
    gemm<U>(reinterpret_cast<const U*>(a), la, reinterpret_cast<const U*>(b), lb,
            reinterpret_cast<U*>(c), m, n, k);
  } else if constexpr (std::is_same_v<T, float>) {
    sgemm(a, la, b, lb, c, m, n, k);
  } else {
    using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using Stride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
    auto map = [](const T* p, MatLayout l, int64_t r, int64_t cc) {
      return l.trans == 'N' ? Eigen::Map<const Mat, 0, Stride>(p, r, cc, Stride(l.ld, 1))
                            : Eigen::Map<const Mat, 0, Stride>(p, r, cc, Stride(1, l.ld));
    };
    Eigen::Map<Mat> C(c, m, n);
    C.noalias() = map(a, la, m, k) * map(b, lb, k, n);
  }
}

}  // namespace

// Note [OpenBLAS's choice of kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// OpenBLAS as Debian builds it (DYNAMIC_ARCH) picks its kernels by the CPU's model number when it
// loads, and a model newer than the library gets its generic Prescott (SSE3) kernels: Debian
// 12's 0.3.21 on an Emerald Rapids Xeon (family 6, model 207) multiplied 256x64 by a vector in
// 7.9 us, against 1.2 us with its SkylakeX kernels and 3.0 us in oneDNN, and 64^3 in 38.9,
// 4.7 and 6.0 us (one thread, the best of 7 runs of 2,000 calls). Where the CPU has AVX2 and
// OpenBLAS runs none of its AVX2 kernels, the small products go to oneDNN too, which picks its
// kernels by the CPU's features: B1's per-sample loop went from 131 to about 250 samples/s.
// (Eigen, tried instead, matched oneDNN on B1's loop and autobatched steps but took the padded
// step from 34 to 79 ms: its OpenMP products of a few rows were slow.)
// OPENBLAS_CORETYPE=SkylakeX (or Haswell), set before the program starts, gives OpenBLAS its
// right kernels back, and the small products go to it again.
bool openblas_core_fits(std::string_view core, bool cpu_has_avx2) {
  if (!cpu_has_avx2) return true;
  for (std::string_view avx2 :
       {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "Excavator"})
    if (core.size() == avx2.size() && strncasecmp(core.data(), avx2.data(), core.size()) == 0)
      return true;
  return false;
}

bool small_products_on_openblas() {
#if DUET_WITH_OPENBLAS
  static const bool fits = [] {
    __builtin_cpu_init();
    const char* core = openblas_get_corename();
    return openblas_core_fits(core ? core : "", __builtin_cpu_supports("avx2") != 0);
  }();
  return fits;
#else
  return false;
#endif
}

std::string small_product_library() {
#if DUET_WITH_OPENBLAS
  const char* core = openblas_get_corename();
  const std::string_view name = core ? core : "unknown";
  if (small_products_on_openblas()) return fmt::format("OpenBLAS ({} kernels)", name);
  return fmt::format(
      "oneDNN (OpenBLAS chose its {} kernels, made for CPUs without AVX2; "
      "OPENBLAS_CORETYPE names the right ones)",
      name);
#else
  return "oneDNN (the build found no OpenBLAS)";
#endif
}

// Note [Products read transposed]
// An f32 product a @ b^T, b read transposed (nn::Linear's forward, the LSTM step's products, an
// attention score Q K^T), runs on oneDNN's matmul primitive rather than its sgemm from
// kTransposedPrimitiveRows rows of a on. On this project's CPUs sgemm shares such a product
// poorly between two threads, splitting its inner dim: a (16 x 1024) @ (1024 x 1024)^T took
// 1,710 us on two threads against 951 on one, and a (64 x 64) @ (64 x 256)^T 16.7 on two
// against 21.0 on one. The primitive (brgemm kernels) took 289 and 14.1 us on two. Over 97
// shapes of 16 to 512 rows, 64 to 1,024 columns and inner dims of 64 to 1,024, sgemm on two
// threads took 0.98x to 5.9x the primitive's time (1.58x the median), and the primitive gave the
// same bits on one thread and two in every one of them, so these products no longer follow the
// thread count (Note [Sums that follow the threads] in trace/plan/plan_waves.cpp). Below 16
// rows sgemm is faster (0.54x to 0.96x), and for a @ b and a^T @ b the primitive gained nothing
// over sgemm (medians 1.05x and 0.99x, as low as 0.42x), so those stay on sgemm. The primitive
// is made once per shape and layout and kept (run_matmul_primitive); it accumulates (beta 1) as
// a sum post-op.

void gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // (oneDNN refuses an empty inner dim)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#if DUET_WITH_OPENBLAS
  if (m * n * k <= kSmallProduct && small_products_on_openblas()) {  // (Note [Small products])
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
    return;
  }
#endif
  if (!ta && tb && m >= kTransposedPrimitiveRows && (beta == 0 || beta == 1) &&
      run_matmul_primitive(
          matmul_key(DType::f32, DType::f32, m, n, k, false, lda, true, ldb, ldc, beta == 1), a, b,
          c))
    return;  // (Note [Products read transposed])
  const dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  DUET_ASSERT(st == dnnl_success, "dnnl_sgemm failed with status {}", static_cast<int>(st));
}

void gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  auto map = [](const double* p, bool t, int64_t ld, int64_t r, int64_t cc) {
    return t ? Eigen::Map<const Mat, 0, Stride>(p, r, cc, Stride(1, ld))
             : Eigen::Map<const Mat, 0, Stride>(p, r, cc, Stride(ld, 1));
  };
  Eigen::Map<Mat, 0, Eigen::OuterStride<>> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0) C.setZero();
  C.noalias() += map(a, ta, lda, m, k) * map(b, tb, ldb, k, n);
}

namespace {

// The last two dims of t as a GEMM operand, read straight from the impl (this runs once per
// matmul call: small products are dominated by such overheads).
MatLayout operand_layout(const Tensor& t) {
  const detail::TensorImpl* x = t.unsafe_impl();
  const int64_t d = x->shape.size();
  return layout(x->shape[d - 2], x->shape[d - 1], x->strides[d - 2], x->strides[d - 1]);
}

// The last two dims of t as a GEMM reads them: t itself, or a contiguous copy (in `held`) where no
// layout expresses its strides.
const Tensor& as_operand(const Tensor& t, Tensor& held) {
  const int64_t d = t.dim();
  if (layout(t.size(-2), t.size(-1), t.strides()[d - 2], t.strides()[d - 1]).ok) return t;
  return held = cast_to(t, t.dtype());
}

// Note [Products by batch]
// A batched product runs its batch's GEMMs on the threads, each GEMM on one thread, where there
// are enough of them: a GEMM too small to split well (a vmapped outer product, 64 of
// (1024 x 1) @ (1 x 10), took 0.18 ms one after the other and 0.07 ms two at a time), or a
// batch that the threads share evenly. Otherwise the GEMMs run in turn, each on all threads. A
// GEMM in a parallel region runs on its own thread, so its sums are in the order they are in
// a compiled plan's parallel wave (Note [Parallel waves]), where kernels stay on their thread.
bool by_batch(int64_t nb, int64_t m, int64_t n, int64_t k) {
  const int64_t nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (nt <= 1 || nb < nt) return false;
  constexpr int64_t kSmallGemm = int64_t(128) * 128 * 128;  // multiply-adds
  return m * n * k <= kSmallGemm || nb % nt == 0 || nb >= 4 * nt;
}

// product(i) for each batch i, on the threads; the first error is rethrown here.
template <class F>
void for_each_batch(int64_t nb, F&& product) {
  std::exception_ptr error;
  std::mutex lock;
  parallel_for(
      nb, 1,
      [&](int64_t lo, int64_t hi) {
        try {
          for (int64_t i = lo; i < hi; ++i) product(i);
        } catch (...) {
          std::lock_guard<std::mutex> g(lock);
          if (!error) error = std::current_exception();
        }
      },
      1);
  if (error) std::rethrow_exception(error);
}

void matmul_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "matmul writes a fresh contiguous output");
  // The narrow integers multiply in i32 (Note [Low precision]), and bf16 and f16 in f32 where
  // the CPU has no instructions for them (Note [Low-precision products without the
  // instructions]).
  if (is_narrow_integral(out.dtype()) ||
      (is_low_precision(out.dtype()) && !low_products_native(out.dtype()))) [[unlikely]]
    return run_wide(matmul_kernel, in, attrs, out);
  // The common case: two 2-D f32 operands that a GEMM reads in place, a non-empty product.
  {
    const detail::TensorImpl *a = in[0].unsafe_impl(), *b = in[1].unsafe_impl();
    if (a->shape.size() == 2 && b->shape.size() == 2 && a->dtype == DType::f32) {
      const MatLayout la = operand_layout(in[0]), lb = operand_layout(in[1]);
      const int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
      if (la.ok && lb.ok && m > 0 && n > 0 && k > 0) {
        gemm<float>(static_cast<const float*>(a->data()), la, static_cast<const float*>(b->data()),
                    lb, static_cast<float*>(out.unsafe_impl()->data()), m, n, k);
        return;
      }
    }
  }
  // Operands that no GEMM layout expresses are made contiguous; others are used in place
  // (by reference: a handle copy costs two atomic operations per call).
  Tensor ta, tb;
  const Tensor &a = as_operand(in[0], ta), &b = as_operand(in[1], tb);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const MatLayout la = layout(m, k, a.strides()[a.dim() - 2], a.strides()[a.dim() - 1]);
  const MatLayout lb = layout(k, n, b.strides()[b.dim() - 2], b.strides()[b.dim() - 1]);
  // Batch offsets of a and b for each output batch (broadcast batch dims step by 0).
  const Shape& os = out.sizes();
  const int64_t nb = os.numel() / std::max<int64_t>(m * n, 1), bd = os.size() - 2;
  DUET_DISPATCH_WITH_LOW(out.dtype(), "matmul", [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, bool>) {
      DUET_ASSERT(false, "the matmul shape rule rejects b8");
    } else {
      T* pc = static_cast<T*>(out.raw_data());
      if (out.numel() == 0) return;
      if (k == 0) {
        std::fill(pc, pc + out.numel(), T(0));
        return;
      }
      const T* pa = static_cast<const T*>(a.raw_data());
      const T* pb = static_cast<const T*>(b.raw_data());
      auto product = [&](int64_t i) {
        int64_t oa = 0, ob = 0, r = i;
        for (int64_t d = bd - 1; d >= 0; --d) {
          int64_t c = r % os[d];
          r /= os[d];
          int64_t da = d - (bd - (a.dim() - 2)), db = d - (bd - (b.dim() - 2));
          if (da >= 0 && a.sizes()[da] != 1) oa += c * a.strides()[da];
          if (db >= 0 && b.sizes()[db] != 1) ob += c * b.strides()[db];
        }
        gemm<T>(pa + oa, la, pb + ob, lb, pc + i * m * n, m, n, k);
      };
      if (by_batch(nb, m, n, k))
        for_each_batch(nb, product);
      else
        for (int64_t i = 0; i < nb; ++i) product(i);
    }
  });
}

}  // namespace

// Note [Low-precision products without the instructions]
// oneDNN's bf16 and f16 matmul sums exact products in f32. On a CPU with AVX512-BF16 or AMX it
// runs bf16 about 4x faster than f32 (1,450 against 340 GFLOP/s at 1024^3 on one of these
// machines). Without them it emulates the products: on an AVX512-VNNI Xeon, 62 GFLOP/s in bf16
// and 177 in f16 against 324 in f32 (1024^3), 58 and 85 against 327 at 256^3. So there a low
// product widens its operands to f32 (exact: every bf16 and f16 value is an f32 value), runs
// f32's kernel, and rounds the result once: the same products, summed in f32 as oneDNN sums
// them, in another order. oneDNN 2 has no f16 instructions at all (its f16 kernels convert),
// so f16 always widens. The choice depends on the CPU only, so eager and compiled calls make
// the same one and agree bit for bit.
bool low_products_native(DType dt) {
  static const int forced = [] {
    const char* e = std::getenv("DUET_LOW_MATMUL");
    const std::string v = e ? e : "";
    return v == "onednn" ? 1 : v == "f32" ? 0 : -1;
  }();
  if (forced >= 0) return forced == 1;
  if (dt != DType::bf16) return false;
  static const bool bf16 = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & want) == want;  // (the levels are bit masks: AMX's holds AVX512-BF16's)
  }();
  return bf16;
}

bool low_gemm_to_f32(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, const void* b, int64_t ldb, float* c, int64_t ldc,
                     bool accumulate) {
  if (dt != DType::bf16 && dt != DType::f16) return false;
  if (m == 0 || n == 0) return true;
  if (k == 0) {  // (a product of nothing: zeros; oneDNN refuses an empty inner dim)
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return true;
  }
  return run_matmul_primitive(
      matmul_key(dt, DType::f32, m, n, k, ta, lda, tb, ldb, ldc, accumulate), a, b, c);
}

void run_as_matrices(KernelFn k, TensorRefs in, const Attrs& attrs, const Tensor& out) {
  const detail::TensorImpl *a = in[0].unsafe_impl(), *b = in[1].unsafe_impl();
  const bool av = a->shape.size() == 1, bv = b->shape.size() == 1;
  // A row (1, k) and a column (k, 1), strided as unsqueeze makes them.
  const Tensor a2 =
      av ? detail::make_view(in[0], Shape{1, a->shape[0]},
                             Strides{a->shape[0] * a->strides[0], a->strides[0]}, a->offset)
         : in[0];
  const Tensor b2 =
      bv ? detail::make_view(in[1], Shape{b->shape[0], 1}, Strides{b->strides[0], 1}, b->offset)
         : in[1];
  Shape s = out.sizes();
  if (av) s.insert(s.size() - (bv ? 0 : 1), 1);
  if (bv) s.push_back(1);
  const Tensor out2 =
      detail::make_view(out, s, detail::contiguous_strides(s), out.unsafe_impl()->offset);
  const Tensor* ab[] = {&a2, &b2};
  k(TensorRefs(ab, 2), attrs, out2);
}

void addmv_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  run_kernel(OpId::MatMul, {&in[1], &in[2]}, attrs, out);
  run_kernel(OpId::Add, {&out, &in[0]}, Attrs{}, out);
}

namespace {

// addmm (Note [addmm] in core/ops/linalg.cpp): out (m, n) = bias (n) + a (m, k) @ b (k, n). bf16
// on oneDNN's primitive, its bias argument added to the f32 sums before they are rounded; f16,
// and bf16 without the instructions, on f32 copies, rounded once. Other dtypes store the product
// and add the bias in place: an f32 sgemm accumulating into the bias rows (beta 1) measured
// slower than that pass (1.34 against 1.33 ms at 1024 x 1024 x 256), and the sums are then
// those of matmul and add, bit for bit.
void addmm_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "addmm writes a fresh contiguous output");
  const DType dt = out.dtype();
  if (is_narrow_integral(dt) || (is_low_precision(dt) && !low_products_native(dt)))
    return run_wide(addmm_kernel, in, attrs, out);
  if (dt != DType::bf16) return addmv_kernel(in, attrs, out);
  const int64_t m = out.size(0), n = out.size(1), k = in[1].size(1);
  if (out.numel() == 0) return;
  Tensor ha, hb, hbias;
  const Tensor &a = as_operand(in[1], ha), &b = as_operand(in[2], hb);
  const Tensor& bias = in[0].is_contiguous() ? in[0] : (hbias = cast_to(in[0], dt));
  const MatLayout la = operand_layout(a), lb = operand_layout(b);
  if (k > 0 && run_matmul_primitive(matmul_key(dt, dt, m, n, k, la.trans == 'T', la.ld,
                                               lb.trans == 'T', lb.ld, n, false, /*bias=*/true),
                                    a.raw_data(), b.raw_data(), out.raw_data(), bias.raw_data()))
    return;
  if (k > 0) return run_wide(addmm_kernel, in, attrs, out);        // (no primitive)
  const bf16_t* pb = static_cast<const bf16_t*>(bias.raw_data());  // no product: the bias rows
  bf16_t* po = static_cast<bf16_t*>(out.raw_data());
  for (int64_t i = 0; i < m; ++i) std::copy(pb, pb + n, po + i * n);
}

}  // namespace

void register_matmul_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::MatMul, DeviceType::CPU, with_matrices<matmul_kernel>);
  detail::register_kernel(t, OpId::Addmv, DeviceType::CPU, addmv_kernel);
  detail::register_kernel(t, OpId::Addmm, DeviceType::CPU, addmm_kernel);
}

}  // namespace duet::kernels

namespace duet::kernels {

// Note [Sums that follow the threads] in trace/plan/plan_waves.cpp. The product runs once on the
// calling thread's OpenMP threads and once alone inside a parallel region (as a plan's wave runs
// it), in each layout of its operands, on the same values; a difference in any bit says that
// the library's split of the work (its inner dim too) changes the sums. Cached per shape.
bool product_sums_follow_threads(DType dt, int64_t m, int64_t n, int64_t k) {
  const int nt = omp_get_max_threads();
  if (nt < 2 || omp_in_parallel() || m <= 0 || n <= 0 || k <= 0) return false;
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int>;
  static std::mutex lock;
  static std::map<Key, bool> seen;
  const Key key{static_cast<int>(dt), m, n, k, nt};
  {
    std::lock_guard<std::mutex> g(lock);
    if (auto it = seen.find(key); it != seen.end()) return it->second;
  }
  // An r x c matrix of values in [-1, 1) from a fixed sequence (the user's generator untouched).
  auto filled = [&](int64_t r, int64_t c, uint32_t s) {
    Tensor f = detail::empty({r, c}, DType::f32, Device::cpu());
    float* p = static_cast<float*>(f.unsafe_impl()->data());
    for (int64_t i = 0; i < r * c; ++i) {
      s = s * 1664525u + 1013904223u;
      p[i] = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / float(1 << 23);
    }
    if (dt == DType::f32) return f;
    Tensor t = detail::empty({r, c}, dt, Device::cpu());
    copy_into(f, t);
    return t;
  };
  auto transposed = [](const Tensor& t) {  // (c x r) read as its transpose (r x c)
    const Shape& s = t.unsafe_impl()->shape;
    return detail::make_view(t, Shape{s[1], s[0]}, Strides{1, s[1]}, 0);
  };
  bool differ = false;
  for (int layout = 0; layout < 4 && !differ; ++layout) {
    const Tensor a = layout & 1 ? transposed(filled(k, m, 1)) : filled(m, k, 1);
    const Tensor b = layout & 2 ? transposed(filled(n, k, 2)) : filled(k, n, 2);
    const Tensor all = detail::empty({m, n}, dt, Device::cpu());
    const Tensor one = detail::empty({m, n}, dt, Device::cpu());
    run_kernel(OpId::MatMul, {&a, &b}, Attrs{}, all);
    std::exception_ptr error;
#pragma omp parallel num_threads(2)
    if (omp_get_thread_num() == 0) {
      try {
        run_kernel(OpId::MatMul, {&a, &b}, Attrs{}, one);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    differ = std::memcmp(all.unsafe_impl()->data(), one.unsafe_impl()->data(),
                         static_cast<size_t>(m * n * itemsize(dt))) != 0;
  }
  std::lock_guard<std::mutex> g(lock);
  seen[key] = differ;
  return differ;
}

}  // namespace duet::kernels
