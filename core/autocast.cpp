// Autocast scopes and the casts they ask for (Note [Autocast] in core/autocast.h).
#include "core/autocast.h"

#include "core/error.h"
#include "core/op_table.h"
#include "core/tensor.h"
#include "core/tensor_impl.h"

namespace duet {
namespace detail {

// Per device type, 4 bits: bit 3 on, bits 0-2 the low dtype.
thread_local uint32_t tls_autocast = 0;

namespace {

constexpr uint32_t kOn = 8;

uint32_t bits_of(DeviceType t) { return (tls_autocast >> (4 * static_cast<int>(t))) & 0xf; }
void set_bits(DeviceType t, uint32_t b) {
  const int s = 4 * static_cast<int>(t);
  tls_autocast = (tls_autocast & ~(0xfu << s)) | (b << s);
}

// The dtype x is cast to as an input of an op of class Lower (low) or F32 (!low), or x's own.
DType target(const TensorImpl* x, bool lower) {
  if (x->wrapped_number || !x->storage || !is_floating(x->dtype)) return x->dtype;
  const uint32_t b = bits_of(x->device().type);
  if (!(b & kOn)) return x->dtype;
  if (lower) return x->dtype == DType::f64 ? x->dtype : static_cast<DType>(b & 7);
  return is_low_precision(x->dtype) ? DType::f32 : x->dtype;
}

Tensor cast_for(const Tensor& x, bool lower) {
  if (!x.defined() || tls_autocast == 0) return x;
  const DType d = target(x.unsafe_impl(), lower);
  return d == x.dtype() ? x : x.to(d);
}

}  // namespace

uint32_t autocast_key() { return tls_autocast; }
bool autocast_any() { return tls_autocast != 0; }

AutocastState::AutocastState(uint32_t key) : saved_(tls_autocast) { tls_autocast = key; }
AutocastState::~AutocastState() { tls_autocast = saved_; }

const Tensor& autocast_lower(const Tensor& x, Tensor& held) {
  if (tls_autocast == 0 || !x.defined() || target(x.unsafe_impl(), true) == x.dtype()) return x;
  held = cast_for(x, true);
  return held;
}
const Tensor& autocast_f32(const Tensor& x, Tensor& held) {
  if (tls_autocast == 0 || !x.defined() || target(x.unsafe_impl(), false) == x.dtype()) return x;
  held = cast_for(x, false);
  return held;
}

DType autocast_f32_dtype(const Tensor& x) {
  return tls_autocast == 0 || !x.defined() ? x.dtype() : target(x.unsafe_impl(), false);
}

bool autocast_inputs(bool lower, TensorRefs in, std::vector<Tensor>& out) {
  bool any = false;
  for (int64_t i = 0; i < in.size() && !any; ++i)
    any = in[i].defined() && target(in[i].unsafe_impl(), lower) != in[i].unsafe_impl()->dtype;
  if (!any) return false;
  out.clear();
  for (int64_t i = 0; i < in.size(); ++i) out.push_back(cast_for(in[i], lower));
  return true;
}

}  // namespace detail

Autocast::Autocast(Device device)
    : Autocast(device, device.is_cpu() ? DType::bf16 : DType::f16, true) {}

Autocast::Autocast(Device device, DType dtype, bool enabled) : type_(device.type) {
  DUET_CHECK_DTYPE(is_low_precision(dtype),
                   "[Autocast] the low dtype must be f16 or bf16, got {} (for {})", dtype,
                   device.str());
  const uint32_t b = detail::bits_of(type_);
  prev_enabled_ = b & detail::kOn;
  prev_dtype_ = static_cast<DType>(b & 7);
  detail::set_bits(type_, enabled ? (detail::kOn | static_cast<uint32_t>(dtype)) : 0);
}

Autocast::~Autocast() {
  detail::set_bits(type_, prev_enabled_ ? (detail::kOn | static_cast<uint32_t>(prev_dtype_)) : 0);
}

bool autocast_enabled(Device device) { return detail::bits_of(device.type) & detail::kOn; }

DType autocast_dtype(Device device) {
  const uint32_t b = detail::bits_of(device.type);
  return b & detail::kOn ? static_cast<DType>(b & 7) : (device.is_cpu() ? DType::bf16 : DType::f16);
}

}  // namespace duet
