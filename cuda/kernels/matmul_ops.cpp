// duet: CUDA matmul through cuBLAS (f32, f64; integers on a plain kernel in int_gemm.cu), with
// the CPU kernel's batch broadcasting (kernels/matmul.cpp). duet's tensors are row-major and
// cuBLAS is column-major, so C = A B is computed as C^T = B^T A^T: a row-major operand is a
// column-major transpose for free. f32 uses TF32 tensor cores only when cuda::allow_tf32() is
// set (off by default: full f32 accuracy). One cuBLAS handle per device, bound to duet's stream.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <climits>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/kernels/adapt.h"
#include "kernels/fused.h"
#include "kernels/low_precision.h"
#include "kernels/matrices.h"
#include "cuda/runtime.h"

namespace duet::cuda::detail {
namespace {

// Per device: a cuBLAS and a cuBLASLt handle, made on first use and kept until exit, and one
// workspace of duet's own for both (they run in order on duet's stream). cublasSetStream resets
// cuBLAS's workspace to its own pool, so each use sets it again: a GEMM captured in a CUDA graph
// then allocates nothing (Note [CUDA graph capture] in cuda/runtime.cpp).
constexpr size_t kCublasWorkspace = size_t(32) << 20;

struct Blas {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
};

const Blas& blas_for(Device device) {  // made once per device; no lock after that
  static std::once_flag once[64];
  static Blas handles[64];
  Blas& b = handles[device.index];
  std::call_once(once[device.index], [&] {
    set_device(device);
    DUET_CUDA_CHECK(cudaMalloc(&b.workspace, kCublasWorkspace));
    DUET_CUBLAS_CHECK(cublasLtCreate(&b.lt));
    DUET_CUBLAS_CHECK(cublasCreate(&b.blas));
  });
  return b;
}

cublasHandle_t handle_for(Device device) {
  const Blas& b = blas_for(device);
  DUET_CUBLAS_CHECK(cublasSetStream(b.blas, stream(device)));
  DUET_CUBLAS_CHECK(cublasSetWorkspace(b.blas, b.workspace, kCublasWorkspace));
  return b.blas;
}

// How a [rows, cols] matrix with element strides (s0, s1) reaches a row-major GEMM (as the CPU).
struct MatLayout {
  bool trans;  // stored column-major
  int64_t ld;
  bool ok;
};
MatLayout layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  if (cols == 1) s1 = 1;
  if (rows == 1) s0 = std::max<int64_t>(cols, 1);
  if (s1 == 1 && s0 >= std::max<int64_t>(cols, 1)) return {false, s0, true};
  if (s0 == 1 && s1 >= std::max<int64_t>(rows, 1)) return {true, s1, true};
  return {false, 0, false};
}
bool fits(const Tensor& t) {
  return layout(t.size(-2), t.size(-1), t.strides()[t.dim() - 2], t.strides()[t.dim() - 1]).ok;
}

int as_int(int64_t v, const char* what) {
  DUET_CHECK(v <= INT_MAX, "[matmul] {} {} exceeds what one cuBLAS call takes", what, v);
  return static_cast<int>(v);
}

// The largest power of two, up to 256, that divides the address (cuBLASLt's alignment hints).
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 1;
  while (al < 256 && a % (2 * al) == 0) al *= 2;
  return al;
}

// Note [Tuned GEMMs]
// cuBLAS's default choice for a single f32 or f64 product is often not its fastest kernel for
// the shape (at 256^3 f32 on an H100, cublasGemmEx ran at 60% of cuBLASLt's best). The first
// product of each shape (sizes, transposes, leading dimensions, dtype, TF32, operand alignment,
// device) times cuBLASLt's heuristic candidates and cublasGemmEx itself on the real operands,
// a few runs each with CUDA events, and keeps the fastest with its descriptors; later products
// of the shape make one cublasLtMatmul (or cublasGemmEx) call. Tuning synchronizes, so a product
// first seen while a CUDA graph is captured uses cublasGemmEx and is not tuned then.
struct GemmKey {
  int64_t m, n, k, lda, ldb;
  bool ta, tb, f32, tf32;
  uint32_t align;  // the operands' and the output's alignments, packed
  int device;
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = 0;
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, int64_t(k.ta), int64_t(k.tb), int64_t(k.f32),
                      int64_t(k.tf32), int64_t(k.align), int64_t(k.device)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
struct TunedGemm {
  bool lt = false;  // false: cublasGemmEx was fastest
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t da = nullptr, db = nullptr, dc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
std::mutex g_tuned_mu;
std::unordered_map<GemmKey, TunedGemm, GemmKeyHash>& tuned_gemms() {
  static auto* m = new std::unordered_map<GemmKey, TunedGemm, GemmKeyHash>;  // kept until exit
  return *m;
}

// One product (row-major C = A B as column-major C^T = op(B^T) op(A^T)) through its tuned
// choice (Note [Tuned GEMMs]); false when the caller should make it with cublasGemmEx.
bool tuned_gemm(cublasHandle_t h, Device device, cudaStream_t s, bool f32,
                cublasComputeType_t compute, cudaDataType_t type, cublasOperation_t opa,
                cublasOperation_t opb, int m, int n, int k, int lda, int ldb, const char* pa,
                const char* pb, char* pc, const void* alpha, const void* beta) {
  const uint32_t align = alignment_of(pa) | (alignment_of(pb) << 9) | (alignment_of(pc) << 18);
  const GemmKey key{m,
                    n,
                    k,
                    lda,
                    ldb,
                    opa == CUBLAS_OP_T,
                    opb == CUBLAS_OP_T,
                    f32,
                    compute == CUBLAS_COMPUTE_32F_FAST_TF32,
                    align,
                    device.index};
  const Blas& handles = blas_for(device);
  auto gemm_ex = [&] {
    return cublasGemmEx(h, opb, opa, n, m, k, alpha, pb, type, ldb, pa, type, lda, beta, pc, type,
                        n, compute, CUBLAS_GEMM_DEFAULT);
  };
  auto lt_call = [&](const TunedGemm& t, const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handles.lt, t.op, alpha, pb, t.da, pa, t.db, beta, pc, t.dc, pc, t.dc,
                          &algo, handles.workspace, kCublasWorkspace, s);
  };
  // A stored choice's descriptors live until exit: it is used outside the lock.
  auto use = [&](const TunedGemm& t) {
    return (t.lt ? lt_call(t, t.algo) : gemm_ex()) == CUBLAS_STATUS_SUCCESS;
  };
  {
    std::unique_lock<std::mutex> lock(g_tuned_mu);
    auto it = tuned_gemms().find(key);
    if (it != tuned_gemms().end()) {
      const TunedGemm t = it->second;
      lock.unlock();
      return use(t);
    }
  }
  if (capturing(s)) return false;
  // Tune: descriptors as gemm_bias_act makes them, without an epilogue.
  TunedGemm t;
  if (cublasLtMatmulDescCreate(&t.op, compute, type) != CUBLAS_STATUS_SUCCESS) return false;
  auto release = [&] {
    for (cublasLtMatrixLayout_t l : {t.da, t.db, t.dc})
      if (l) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(t.op);
  };
  const cublasOperation_t lta = opb, ltb = opa;
  bool ok = cublasLtMatmulDescSetAttribute(t.op, CUBLASLT_MATMUL_DESC_TRANSA, &lta, sizeof lta) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(t.op, CUBLASLT_MATMUL_DESC_TRANSB, &ltb, sizeof ltb) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&t.da, type, lta == CUBLAS_OP_T ? k : n,
                                       lta == CUBLAS_OP_T ? n : k, ldb) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&t.db, type, ltb == CUBLAS_OP_T ? m : k,
                                       ltb == CUBLAS_OP_T ? k : m, lda) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&t.dc, type, n, m, n) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t found[8];
  int count = 0;
  if (ok) {
    cublasLtMatmulPreference_t pref = nullptr;
    ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    const size_t ws = kCublasWorkspace;
    const uint32_t als[] = {alignment_of(pb), alignment_of(pa), alignment_of(pc), alignment_of(pc)};
    const cublasLtMatmulPreferenceAttributes_t attrs[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    if (ok)
      ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws) == CUBLAS_STATUS_SUCCESS;
    for (int i = 0; ok && i < 4; ++i)
      ok = cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &als[i], sizeof als[i]) ==
           CUBLAS_STATUS_SUCCESS;
    if (ok && cublasLtMatmulAlgoGetHeuristic(handles.lt, t.op, t.da, t.db, t.dc, t.dc, pref, 8,
                                             found, &count) != CUBLAS_STATUS_SUCCESS)
      count = 0;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
  // Candidate -1 is cublasGemmEx; each runs once untimed, then three times between events.
  cudaEvent_t start = nullptr, stop = nullptr;
  DUET_CUDA_CHECK(cudaEventCreate(&start));
  DUET_CUDA_CHECK(cudaEventCreate(&stop));
  float best = 0;
  int best_i = -2;
  for (int i = -1; i < (ok ? count : 0); ++i) {
    auto run = [&] { return i < 0 ? gemm_ex() : lt_call(t, found[i].algo); };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    DUET_CUDA_CHECK(cudaEventRecord(start, s));
    bool good = true;
    for (int r = 0; r < 3 && good; ++r) good = run() == CUBLAS_STATUS_SUCCESS;
    DUET_CUDA_CHECK(cudaEventRecord(stop, s));
    DUET_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DUET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (good && (best_i == -2 || ms < best)) best = ms, best_i = i;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();
  if (best_i >= 0) {
    t.lt = true;
    t.algo = found[best_i].algo;
  } else {
    release();
    t = TunedGemm{};
  }
  TunedGemm chosen;
  {
    std::lock_guard<std::mutex> lock(g_tuned_mu);
    auto [it, stored] = tuned_gemms().emplace(key, t);
    if (!stored && t.lt) release();  // another thread tuned the shape meanwhile
    chosen = it->second;
  }
  // The output holds the last candidate's product: the chosen one writes it again.
  return use(chosen);
}

void matmul_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "matmul writes a fresh contiguous output");
  const DType dt = out.dtype();
  DUET_CHECK_DTYPE(dt == DType::f32 || dt == DType::f64 || dt == DType::i32 || dt == DType::i64,
                   "[matmul] has no CUDA kernel for dtype {}", dtype_name(dt));
  if (out.numel() == 0) return;
  cudaStream_t s = stream_for(out);
  // Operands that no GEMM layout expresses are made contiguous; others are used in place.
  Tensor ta, tb;
  auto dense = [&](const Tensor& t, Tensor& tmp) -> const Tensor& {
    if (fits(t)) return t;
    tmp = duet::detail::empty(t.sizes(), t.dtype(), t.device());
    copy_into(t, tmp);
    return tmp;
  };
  const Tensor& a = dense(in[0], ta);
  const Tensor& b = dense(in[1], tb);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (k == 0) {
    DUET_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.numel() * itemsize(dt), s));
    return;
  }
  const MatLayout la = layout(m, k, a.strides()[a.dim() - 2], a.strides()[a.dim() - 1]);
  const MatLayout lb = layout(k, n, b.strides()[b.dim() - 2], b.strides()[b.dim() - 1]);
  // Batch offsets of a and b for each output batch (broadcast batch dims step by 0).
  const Shape& os = out.sizes();
  const int64_t nb = os.numel() / (m * n), bd = os.size() - 2;
  std::vector<int64_t> oa(nb), ob(nb);
  bool affine = true;
  for (int64_t i = 0; i < nb; ++i) {
    int64_t pa = 0, pb = 0, r = i;
    for (int64_t d = bd - 1; d >= 0; --d) {
      const int64_t c = r % os[d];
      r /= os[d];
      const int64_t da = d - (bd - (a.dim() - 2)), db = d - (bd - (b.dim() - 2));
      if (da >= 0 && a.sizes()[da] != 1) pa += c * a.strides()[da];
      if (db >= 0 && b.sizes()[db] != 1) pb += c * b.strides()[db];
    }
    oa[i] = pa;
    ob[i] = pb;
    if (i > 0 && (pa != i * oa[1] || pb != i * ob[1])) affine = false;
  }
  const int64_t isz = itemsize(dt);
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  char* pc = static_cast<char*>(out.raw_data());

  if (dt == DType::i32 || dt == DType::i64) {
    for (int64_t i = 0; i < nb; ++i) {
      kern::IntGemmArg g;
      g.a = pa + oa[i] * isz;
      g.b = pb + ob[i] * isz;
      g.c = pc + i * m * n * isz;
      g.m = m;
      g.n = n;
      g.k = k;
      g.as0 = la.trans ? 1 : la.ld;
      g.as1 = la.trans ? la.ld : 1;
      g.bs0 = lb.trans ? 1 : lb.ld;
      g.bs1 = lb.trans ? lb.ld : 1;
      DUET_CUDA_CHECK(kern::launch_int_gemm(to_dt(dt), g, s));
    }
    return;
  }

  cublasHandle_t h = handle_for(out.device());
  const bool f32 = dt == DType::f32;
  const cudaDataType_t type = f32 ? CUDA_R_32F : CUDA_R_64F;
  const cublasComputeType_t compute =
      f32 ? (allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void* alpha = f32 ? static_cast<const void*>(&one_f) : &one_d;
  const void* beta = f32 ? static_cast<const void*>(&zero_f) : &zero_d;
  // Column-major: C^T (n x m, ld n) = op(B^T) (n x k) * op(A^T) (k x m).
  const cublasOperation_t opb = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opa = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int im = as_int(m, "size"), in_ = as_int(n, "size"), ik = as_int(k, "size");
  const int lda = as_int(la.ld, "leading dimension"), ldb = as_int(lb.ld, "leading dimension");
  if (nb == 1 && tuned_gemm(h, out.device(), s, f32, compute, type, opa, opb, im, in_, ik, lda, ldb,
                            pa, pb, pc, alpha, beta))
    return;
  if (affine) {
    DUET_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, opb, opa, in_, im, ik, alpha, pb, type, ldb, nb > 1 ? ob[1] : 0, pa, type, lda,
        nb > 1 ? oa[1] : 0, beta, pc, type, in_, m * n, as_int(nb, "batch count"), compute,
        CUBLAS_GEMM_DEFAULT));
    return;
  }
  for (int64_t i = 0; i < nb; ++i)
    DUET_CUBLAS_CHECK(cublasGemmEx(h, opb, opa, in_, im, ik, alpha, pb + ob[i] * isz, type, ldb,
                                   pa + oa[i] * isz, type, lda, beta, pc + i * m * n * isz, type,
                                   in_, compute, CUBLAS_GEMM_DEFAULT));
}

// Note [cuBLASLt epilogues]
// A compiled plan whose 2-D matmul is read only by the add of a bias along its last dim (an add,
// or a fused group of the add and a relu) runs both as one cublasLtMatmul with the BIAS or
// RELU_BIAS epilogue (the executor asks, trace/plan/executor.cpp). Row-major D = A B + bias is
// column-major D^T = B^T A^T + bias, the bias along D^T's rows, as cuBLASLt adds it. Whatever
// cuBLASLt does not take (a layout, a dtype, no algorithm) returns false, and the plan runs the
// matmul and the group as two kernels.
bool gemm_bias_act(const Tensor& a, const Tensor& b, const Tensor& bias, bool relu,
                   const Tensor& out) {
  const DType dt = out.dtype();
  if ((dt != DType::f32 && dt != DType::f64) || a.dtype() != dt || b.dtype() != dt ||
      bias.dtype() != dt)
    return false;
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2 || !out.is_contiguous() ||
      !bias.is_contiguous() || !fits(a) || !fits(b))
    return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0 || bias.numel() != n || m > INT_MAX || n > INT_MAX || k > INT_MAX)
    return false;
  // cuBLASLt reads the bias with vector loads: an offset view of a bias (a chunk of a packed
  // parameter) runs as two kernels instead.
  if (reinterpret_cast<uintptr_t>(bias.raw_data()) % 16 != 0) return false;
  const MatLayout la = layout(m, k, a.strides()[0], a.strides()[1]);
  const MatLayout lb = layout(k, n, b.strides()[0], b.strides()[1]);
  const Device device = out.device();
  const Blas& handles = blas_for(device);
  cublasLtHandle_t h = handles.lt;
  void* ws = handles.workspace;
  const bool f32 = dt == DType::f32;
  const cudaDataType_t type = f32 ? CUDA_R_32F : CUDA_R_64F;
  const cublasComputeType_t compute =
      f32 ? (allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_64F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t da = nullptr, db = nullptr, dc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  struct Release {
    cublasLtMatmulDesc_t* op;
    cublasLtMatrixLayout_t *a, *b, *c;
    cublasLtMatmulPreference_t* p;
    ~Release() {
      if (*p) cublasLtMatmulPreferenceDestroy(*p);
      for (cublasLtMatrixLayout_t* l : {a, b, c})
        if (*l) cublasLtMatrixLayoutDestroy(*l);
      if (*op) cublasLtMatmulDescDestroy(*op);
    }
  } release{&op, &da, &db, &dc, &pref};
  DUET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute, type));
  // cuBLASLt's A is B^T (n x k), its B is A^T (k x m): the operands swap, as in matmul_kernel.
  const cublasOperation_t ta = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  const void* bias_ptr = bias.raw_data();
  DUET_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DUET_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  DUET_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  DUET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                                   sizeof bias_ptr));
  // Stored shapes (column-major rows x cols) and leading dimensions.
  DUET_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&da, type, lb.trans ? k : n, lb.trans ? n : k, lb.ld));
  DUET_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&db, type, la.trans ? m : k, la.trans ? k : m, la.ld));
  DUET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&dc, type, n, m, n));
  DUET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws_bytes = kCublasWorkspace;
  DUET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  // The heuristic assumes 256-byte aligned operands unless told: an offset view (x[:, 1:], a
  // chunk of a fused qkv) would get a kernel that faults with a misaligned address.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligned[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b.raw_data()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a.raw_data()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, out.raw_data()},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, out.raw_data()}};
  for (const auto& [attr, ptr] : aligned) {
    const uint32_t al = alignment_of(ptr);
    DUET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
  }
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(h, op, da, db, dc, dc, pref, 1, &best, &found) !=
          CUBLAS_STATUS_SUCCESS ||
      found == 0)
    return false;
  const float one_f = 1, zero_f = 0;
  const double one_d = 1, zero_d = 0;
  const void* alpha = f32 ? static_cast<const void*>(&one_f) : &one_d;
  const void* beta = f32 ? static_cast<const void*>(&zero_f) : &zero_d;
  set_device(device);
  // A refusal (CUBLAS_STATUS_NOT_SUPPORTED for these pointers, say) is not an error: the plan
  // runs the product and the bias as two kernels.
  return cublasLtMatmul(h, op, alpha, b.raw_data(), da, a.raw_data(), db, beta, out.raw_data(), dc,
                        out.raw_data(), dc, &best.algo, ws, kCublasWorkspace,
                        stream(device)) == CUBLAS_STATUS_SUCCESS;
}

// addmm (Note [addmm] in core/ops/linalg.cpp): cuBLASLt with its bias epilogue, else the
// product and then the add (f16 and bf16 among others, rounded twice there).
void addmm_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  if (gemm_bias_act(in[1], in[2], in[0], /*relu=*/false, out)) return;
  duet::kernels::addmv_kernel(in, attrs, out);
}

}  // namespace

void register_matmul(OpDef* t) {
  duet::detail::register_kernel(
      t, OpId::MatMul, DeviceType::CUDA,
      duet::kernels::with_matrices<duet::kernels::via_wide<matmul_kernel>>);
  duet::detail::register_kernel(t, OpId::Addmv, DeviceType::CUDA, duet::kernels::addmv_kernel);
  duet::detail::register_kernel(t, OpId::Addmm, DeviceType::CUDA, addmm_kernel);
  kernels::set_gemm_epilogue(DeviceType::CUDA, gemm_bias_act);
}

}  // namespace duet::cuda::detail
