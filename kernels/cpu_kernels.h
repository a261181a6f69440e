// duet: CPU kernels, registered into the op table by register_cpu_kernels().
#pragma once

#include <initializer_list>

#include "core/op_table.h"

namespace duet::kernels {

/// Fills every CPU kernel slot of the table.
void register_cpu_kernels(OpDef* table);
void register_elementwise_kernels(OpDef* table);
/// The unary and the binary/comparison families, which register_elementwise_kernels calls.
void register_unary_kernels(OpDef* table);
void register_binary_kernels(OpDef* table);
void register_reduction_kernels(OpDef* table);
void register_matmul_kernels(OpDef* table);

void register_index_kernels(OpDef* table);
void register_image_kernels(OpDef* table);
void register_conv_kernels(OpDef* table);
void register_attention_kernels(OpDef* table);
void register_rnn_kernels(OpDef* table);
void register_softmax_kernels(OpDef* table);
void register_random_kernels(OpDef* table);
void register_print_kernels(OpDef* table);
void register_collective_kernels(OpDef* table);

/// Runs op's kernel for out's device on `in` (no dispatch, no tape): kernels made of other
/// ops' kernels (conv2d's products, addmv, log_softmax on devices without its own).
void run_kernel(OpId op, std::initializer_list<const Tensor*> in, const Attrs& a,
                const Tensor& out);

/// Copies src into dst (same shape; any dtypes and layouts) with the Copy kernel.
void copy_into(const Tensor& src, const Tensor& dst);

/// c (m x n, rows ldc apart, f32) = a @ b, or c += a @ b where `accumulate`: a and b of one low
/// dtype (bf16 or f16), each row-major or transposed (ta, tb) with leading dims lda and ldb, on
/// oneDNN's matmul primitive, which multiplies the low values exactly and sums in f32 (with
/// AVX512-BF16 or AMX where the CPU has them). Runs on the calling thread's OpenMP threads.
/// False, with c untouched, where oneDNN has no kernel for the dtype on this CPU.
bool low_gemm_to_f32(DType dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, const void* b, int64_t ldb, float* c, int64_t ldc,
                     bool accumulate);

/// Whether this CPU has instructions for products of `dt` (bf16 or f16) that oneDNN uses:
/// AVX512-BF16 or AMX for bf16; none for f16 in the oneDNN 2 that Debian ships. Without them
/// oneDNN emulates the low products, slower than its f32 sgemm on f32 copies (Note [Low-precision
/// products without the instructions] in kernels/matmul.cpp). DUET_LOW_MATMUL=onednn or f32
/// sets the answer (tests run both); it is read once.
bool low_products_native(DType dt);

/// A contiguous copy of `t` converted to `dtype`, made by calling the Cast kernel directly
/// (kernels never re-enter dispatch).
Tensor cast_to(const Tensor& t, DType dtype);

}  // namespace duet::kernels
