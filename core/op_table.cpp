#include "core/op_table.h"

#include <bit>
#include <functional>

namespace duet {
namespace detail {
namespace {

OpDef* build_table() {
  static OpDef table[] = {
#define DUET_OP(Name, name, arity, cls, cuda, doc) \
  {OpId::Name, #name, arity, OpClass::cls, doc, cuda},
#include "core/ops.def"
#undef DUET_OP
  };
  register_elementwise_rules(table);
  register_reduction_rules(table);
  register_linalg_rules(table);
  register_view_rules(table);
  register_source_rules(table);
  register_index_rules(table);
  register_image_rules(table);
  register_attention_rules(table);
  register_rnn_rules(table);
  register_random_rules(table);
  register_debug_rules(table);
  register_collective_rules(table);
  register_symbolic_rules(table);
  register_batching_rules(table);
  register_row_rules(table);
  register_backends(table);
  for (const OpDef& d : table) {
    DUET_ASSERT(d.infer, "op {} has no shape rule", d.name);
    DUET_ASSERT(d.cls != OpClass::View || d.view, "view op {} has no view rule", d.name);
    DUET_ASSERT(d.grad || !d.differentiable,
                "op {} has no gradient rule and is not marked "
                "as not differentiable",
                d.name);
  }
  return table;
}

}  // namespace

OpDef* op_table() {
  static OpDef* t = build_table();
  return t;
}

void register_kernel(OpDef* table, OpId id, DeviceType device, KernelFn fn) {
  table[static_cast<int>(id)].kernel[static_cast<int>(device)] = fn;
}

}  // namespace detail

std::string_view op_name(OpId id) { return detail::op_def(id).name; }
OpClass op_class(OpId id) { return detail::op_def(id).cls; }

namespace {
// A Scalar attribute's bits: attributes are equal only when their values are the same bits, as
// the graph passes need (0.0 == -0.0 and NaN payloads differ, yet a node of one is no node of
// the other: x / -0.0 is not x / 0.0).
uint64_t value_bits(const Scalar& s) {
  return s.is_floating() ? std::bit_cast<uint64_t>(s.to<double>())
                         : static_cast<uint64_t>(s.to<int64_t>());
}
}  // namespace

bool operator==(const Attrs& a, const Attrs& b) {
  return a.ints == b.ints && a.dim == b.dim && a.start == b.start && a.end == b.end &&
         a.step == b.step && a.keepdim == b.keepdim && a.dtype == b.dtype && a.device == b.device &&
         a.value.kind() == b.value.kind() && value_bits(a.value) == value_bits(b.value) &&
         (a.sym == b.sym || (a.sym && b.sym && *a.sym == *b.sym));
}

size_t Attrs::hash() const {
  size_t h = 0;
  auto mix = [&](uint64_t v) {
    h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  };
  for (int64_t v : ints) mix(static_cast<uint64_t>(v));
  mix(static_cast<uint64_t>(dim));
  mix(static_cast<uint64_t>(start));
  mix(static_cast<uint64_t>(end));
  mix(static_cast<uint64_t>(step));
  mix(keepdim);
  mix(static_cast<uint64_t>(dtype));
  mix(static_cast<uint64_t>(device.type) << 8 | static_cast<uint8_t>(device.index));
  if (sym)
    for (const SymInt& v : sym->ints) mix(v.hash());
  mix(static_cast<uint64_t>(value.kind()));
  mix(value_bits(value));
  return h;
}

}  // namespace duet
