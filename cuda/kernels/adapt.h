// duet: the host side of the CUDA kernels (C++20, compiled by the C++ compiler): turning
// tensors into the launch structs of cuda/kernels/launch.h (Note [CUDA launch structs]), and
// the registration of each op family.
#pragma once

#include <initializer_list>

#include "core/op_table.h"
#include "cuda/check.h"
#include "cuda/kernels/launch.h"

namespace duet::cuda::detail {

inline kern::DT to_dt(DType d) { return static_cast<kern::DT>(static_cast<uint8_t>(d)); }

/// Makes out's device current and returns duet's stream for it.
cudaStream_t stream_for(const Tensor& out);

/// An operand's data pointer; a tensor on the host (a wrapped number, 0-d) travels by value
/// instead, converted to `dtype`. make_loop fills the strides.
kern::Operand make_operand(const Tensor& t, DType dtype);

/// The loop for out = f(ins...) over out's sizes, dims merged where every operand allows it.
/// `dtypes` gives each input's dtype in the kernel (used for host values).
kern::Loop make_loop(const Tensor& out, std::initializer_list<const Tensor*> ins,
                     std::initializer_list<DType> dtypes);

/// `t` itself when it has dtype `dt` or lives on the host (converted when read), else a
/// converted copy on the device held in `tmp`.
const Tensor& in_dtype(const Tensor& t, DType dt, Tensor& tmp);

/// Copies src into dst (same sizes, any dtypes and layouts) on dst's device.
void copy_into(const Tensor& src, const Tensor& dst);

// Registration of each family (register.cpp calls them all).
void register_elementwise(OpDef* table);
void register_reductions(OpDef* table);
void register_index(OpDef* table);
void register_attention(OpDef* table);
void register_matmul(OpDef* table);
void register_random(OpDef* table);

}  // namespace duet::cuda::detail
