// CPU matmul. f32 goes to oneDNN's sgemm, which measured fastest on these machines (see
// bench W3: oneDNN against OpenBLAS); other dtypes go to Eigen's GEMM. Transposed operands are
// passed as transposes, not copied; other strided operands are made contiguous first.
#include <oneapi/dnnl/dnnl.h>

#include <Eigen/Core>

#include "kernels/cpu_kernels.h"
#include "kernels/loops.h"

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

template <class T>
void gemm(const T* a, MatLayout la, const T* b, MatLayout lb, T* c, int64_t m, int64_t n,
          int64_t k) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    // Integer products and sums wrap around (two's complement), as in PyTorch. Signed overflow
    // is undefined behaviour in C++, so the GEMM runs on the same bits as unsigned integers
    // (reading an object through its unsigned type is allowed), where wrapping is defined.
    using U = std::make_unsigned_t<T>;
    gemm<U>(reinterpret_cast<const U*>(a), la, reinterpret_cast<const U*>(b), lb,
            reinterpret_cast<U*>(c), m, n, k);
  } else if constexpr (std::is_same_v<T, float>) {
    dnnl_status_t st =
        dnnl_sgemm(la.trans, lb.trans, m, n, k, 1.0f, a, la.ld, b, lb.ld, 0.0f, c, n);
    DUET_ASSERT(st == dnnl_success, "dnnl_sgemm failed with status {}", static_cast<int>(st));
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

// The last two dims of t as a GEMM operand, read straight from the impl (this runs once per
// matmul call: small products are dominated by such overheads).
MatLayout operand_layout(const Tensor& t) {
  const detail::TensorImpl* x = t.unsafe_impl();
  const int64_t d = x->shape.size();
  return layout(x->shape[d - 2], x->shape[d - 1], x->strides[d - 2], x->strides[d - 1]);
}

void matmul_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "matmul writes a fresh contiguous output");
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
  auto fits = [](const Tensor& t) {
    return layout(t.size(-2), t.size(-1), t.strides()[t.dim() - 2], t.strides()[t.dim() - 1]).ok;
  };
  Tensor ta, tb;
  const Tensor& a = fits(in[0]) ? in[0] : (ta = cast_to(in[0], in[0].dtype()));
  const Tensor& b = fits(in[1]) ? in[1] : (tb = cast_to(in[1], in[1].dtype()));
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const MatLayout la = layout(m, k, a.strides()[a.dim() - 2], a.strides()[a.dim() - 1]);
  const MatLayout lb = layout(k, n, b.strides()[b.dim() - 2], b.strides()[b.dim() - 1]);
  // Batch offsets of a and b for each output batch (broadcast batch dims step by 0).
  const Shape& os = out.sizes();
  const int64_t nb = os.numel() / std::max<int64_t>(m * n, 1), bd = os.size() - 2;
  DUET_DISPATCH_DTYPE(out.dtype(), "matmul", [&] {
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
      for (int64_t i = 0; i < nb; ++i) {
        int64_t oa = 0, ob = 0, r = i;
        for (int64_t d = bd - 1; d >= 0; --d) {
          int64_t c = r % os[d];
          r /= os[d];
          int64_t da = d - (bd - (a.dim() - 2)), db = d - (bd - (b.dim() - 2));
          if (da >= 0 && a.sizes()[da] != 1) oa += c * a.strides()[da];
          if (db >= 0 && b.sizes()[db] != 1) ob += c * b.strides()[db];
        }
        gemm<T>(pa + oa, la, pb + ob, lb, pc + i * m * n, m, n, k);
      }
    }
  });
}

}  // namespace

void register_matmul_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::MatMul, DeviceType::CPU, matmul_kernel);
}

}  // namespace duet::kernels
