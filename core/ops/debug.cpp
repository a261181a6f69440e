// Print: duet::print's op. An effect: its result (an empty b8 token) is read by nothing, so the
// graph passes keep it by its op (detail::has_effect in trace/ir/graph.h), and a trace chains each
// print to the one before it through a second input, so that a plan runs them in program order.
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

void infer_print(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  DUET_CHECK_VALUE(in.size() == 1 || in.size() == 2,
                   "[print] takes a tensor and, in a trace, the previous print's token; got {} "
                   "inputs",
                   in.size());
  DUET_CHECK_DEVICE(in[0].device().is_cpu(), "[print] prints a CPU tensor (got one on {})",
                    in[0].device());
  if (in.size() == 2)
    DUET_CHECK_DTYPE(in[1].dtype() == DType::b8 && in[1].numel() == 0,
                     "[print] the second input is a print's token (b8 (0)), got {} {}",
                     in[1].dtype(), in[1].sizes());
  const std::string& format = interned_format(a.dim);
  const std::string why = print_format_error(format);
  DUET_CHECK_VALUE(why.empty(),
                   "[print] the format \"{}\" does not format one tensor ({}); write \"{{}}\" "
                   "where its values go",
                   format, why);
  out.shape = Shape{0};
  out.dtype = DType::b8;
  out.device = Device::cpu();
}

void sym_print(const OpDef&, TensorRefs, const Attrs&, const TensorMeta&, SymDims& out) {
  out = {SymInt(0)};
}

std::mutex& format_mutex() {
  static std::mutex m;
  return m;
}
// Leaked: a plan may print while statics are destroyed at exit.
std::vector<std::string>& formats() {
  static auto* v = new std::vector<std::string>;
  return *v;
}
std::unordered_map<std::string, int64_t>& format_ids() {
  static auto* m = new std::unordered_map<std::string, int64_t>;
  return *m;
}

void stdout_sink(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}
std::atomic<PrintSink> g_sink{stdout_sink};

}  // namespace

std::string print_format_error(const std::string& format) {
  // A tensor formats as its text (fmt::formatter<Tensor> in core/tensor.h): what formats a
  // string formats a tensor.
  try {
    (void)fmt::format(fmt::runtime(format), std::string());
    return "";
  } catch (const fmt::format_error& e) {
    return e.what();
  }
}

int64_t intern_format(const std::string& format) {
  std::lock_guard<std::mutex> lock(format_mutex());
  auto [it, fresh] = format_ids().emplace(format, static_cast<int64_t>(formats().size()));
  if (fresh) formats().push_back(format);
  return it->second;
}

const std::string& interned_format(int64_t id) {
  std::lock_guard<std::mutex> lock(format_mutex());
  DUET_CHECK_VALUE(id >= 0 && id < static_cast<int64_t>(formats().size()),
                   "[print] no format string of index {}", id);
  return formats()[static_cast<size_t>(id)];
}

PrintSink set_print_sink(PrintSink sink) { return g_sink.exchange(sink ? sink : stdout_sink); }

void write_print(const std::string& line) { g_sink.load()(line); }

void register_debug_rules(OpDef* t) {
  t[int(OpId::Print)].infer = infer_print;
  t[int(OpId::Print)].sym_infer = sym_print;
  set_not_differentiable(t, OpId::Print);
}

}  // namespace detail

void print(const Tensor& t, std::string format, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(t.defined(), "[print] an undefined tensor");
  const std::string why = detail::print_format_error(format);
  DUET_CHECK_VALUE(why.empty(),
                   "[print] the format \"{}\" does not format one tensor ({}); write \"{{}}\" "
                   "where its values go",
                   format, why);
  Attrs a;
  a.dim = detail::intern_format(format);
  const Tensor host = t.device().is_cpu() ? t.detach() : t.detach().to(Device::cpu());
  const Tensor* in[] = {&host};
  (void)detail::call(OpId::Print, TensorRefs(in, 1), a);
}

}  // namespace duet
