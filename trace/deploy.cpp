// duet::save of a compiled function (trace/compile.h): the traced forward graph of the example
// arguments' signature, written in the format of trace/serialize.h.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "trace/compile.h"
#include "trace/serialize.h"

namespace duet::detail {
namespace {

// The name of each captured tensor: the name options give it (found by identity), else
// "captured<i>". Two captured tensors never share a name, so that load's named_parameters()
// tells them apart.
std::vector<std::string> captured_names(const Graph& g, const SaveOptions& options,
                                        const std::string& label) {
  std::vector<std::string> names;
  for (size_t i = 0; i < g.captured.size(); ++i) {
    std::string name = fmt::format("captured{}", i);
    for (const auto& [given, t] : options.parameter_names)
      if (t.defined() && t.unsafe_impl() == g.captured[i].unsafe_impl()) {
        name = given;
        break;
      }
    names.push_back(std::move(name));
  }
  std::map<std::string, size_t> first;  // name -> the captured tensor that has it
  for (size_t i = 0; i < names.size(); ++i) {
    DUET_CHECK_VALUE(!names[i].empty(),
                     "[save] {}: SaveOptions::parameter_names gives a captured tensor an empty "
                     "name",
                     label);
    const auto [it, fresh] = first.emplace(names[i], i);
    DUET_CHECK_VALUE(fresh,
                     "[save] {}: two captured tensors ({} and {}) would both be named \"{}\"; "
                     "SaveOptions::parameter_names must name each tensor once",
                     label, g.captured[it->second].sizes(), g.captured[i].sizes(), names[i]);
  }
  return names;
}

}  // namespace

void save_compiled(const CompileOptions& options, const std::string& label, const FlatArgs& args,
                   const TraceFn& fn, const std::string& path, const SaveOptions& save_options) {
  CompiledCore core(options, label);
  CompiledCore::Prepared p = core.prepare(args, fn);
  DUET_CHECK_VALUE(!p.value_guards,
                   "[save] {} reads tensor data into C++ (CompileOptions::guard_data_reads), so "
                   "its graph holds for the values it read only; a saved program cannot check "
                   "them. Use cond or scan for data-dependent control flow",
                   label);
  SavedProgram s;
  s.label = label;
  s.graph = std::move(p.symbolic);
  // The function's results (its probes last); the values saved for a backward are dropped.
  s.graph.outputs.resize(p.num_outputs);
  const size_t results = p.num_outputs - p.probe_names.size();
  for (size_t i = 0; i < results; ++i) s.outputs.push_back(fmt::format("out{}", i));
  for (const std::string& n : p.probe_names) s.outputs.push_back(n);
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const Tensor& t = args.tensors[i];
    SavedInput in;
    for (char c : args.labels[i])
      if (c != ' ') in.name += c;
    in.dtype = t.dtype();
    in.device = t.device();
    for (int64_t d = 0; d < t.dim(); ++d) {
      in.sizes.push_back(t.sizes()[d]);
      in.syms.push_back(p.dim_sym.empty() ? -1 : p.dim_sym[i][static_cast<size_t>(d)]);
    }
    s.inputs.push_back(std::move(in));
  }
  s.num_symbols = static_cast<int32_t>(p.hints.size());
  s.hints = p.hints;
  for (const auto& g : p.guards) s.guards.push_back({g.a, g.rel, g.b, g.why});
  s.captured_names = captured_names(s.graph, save_options, label);
  const std::string bytes = encode_program(s);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DUET_CHECK_VALUE(f.good(), "[save] cannot write {}: {}", path, std::strerror(errno));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  DUET_CHECK_VALUE(!f.fail(), "[save] writing {} failed: {}", path, std::strerror(errno));
}

}  // namespace duet::detail
