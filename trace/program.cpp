#include "trace/program.h"

#include <algorithm>

#include "core/dispatch.h"
#include "core/input_file.h"
#include "eager/autograd.h"
#include "trace/compile.h"
#include "trace/control_flow.h"
#include "trace/plan/executor.h"
#include "trace/guards.h"
#include "trace/ir/passes.h"
#include "trace/serialize.h"
#include "trace/tracer.h"

namespace duet {

namespace {
thread_local detail::Tracer* tls_builder = nullptr;  // the Program being built on this thread
}  // namespace

struct Program::State {
  Graph graph;
  std::map<std::string, int32_t> names;  // fetchable name -> value
  std::map<std::string, int32_t> placeholders;
  std::vector<std::string> inputs;          // placeholder names by runtime slot
  std::vector<std::string> captured_names;  // by Graph::captured index
  std::vector<std::string> output_names;    // a loaded program's, in order
  // A loaded program: its signature, with symbolic dims and the guards on them.
  std::vector<detail::SavedInput> saved_inputs;
  int32_t num_symbols = 0;
  std::vector<detail::SavedGuard> guards;
  struct Planned {
    std::unique_ptr<detail::Plan> plan;
    std::vector<std::string> feeds;  // placeholder name per runtime slot (needed ones)
    std::vector<int32_t> slot_of_feed;
  };
  // By fetch list and the sizes of the symbols.
  std::map<std::pair<std::vector<std::string>, std::vector<int64_t>>, Planned> plans;
  // A function program (import_onnx): no graph of its own; calls run fn through `core`.
  std::unique_ptr<detail::FunctionProgram> fn;
  std::unique_ptr<detail::CompiledCore> core;
};

Tensor placeholder(Shape shape, DType dtype, std::string name) {
  DUET_CHECK(tls_builder,
             "[placeholder] \"{}\" can only be made inside a Program builder "
             "(duet::Program([&] {{ ... }}))",
             name);
  DUET_CHECK_VALUE(!name.empty(), "[placeholder] needs a name, to be fed by");
  for (const GraphNode& n : tls_builder->graph().nodes)
    DUET_CHECK_VALUE(n.name != name, "[placeholder] the name \"{}\" is already used", name);
  return tls_builder->input(InputRole::Placeholder, TensorMeta{shape, dtype, Device::cpu(), {}},
                            is_floating(dtype), name);
}

Tensor name(Tensor t, std::string name) {
  detail::Tracer* tr = detail::Tracer::current();
  if (tr && detail::is_traced(t)) tr->set_name(t, name);
  return t;
}

Program::Program(std::function<std::vector<Tensor>()> build) : s_(std::make_unique<State>()) {
  detail::Tracer tr("Program");
  std::vector<Tensor> outs;
  {
    detail::Tracer* prev = tls_builder;
    tls_builder = &tr;
    struct Restore {
      detail::Tracer* p;
      ~Restore() { tls_builder = p; }
    } restore{prev};
    ModeGuard mode(&tr);
    outs = build();
  }
  tr.finish(outs);
  s_->graph = std::move(tr.graph());
  s_->graph.verify();
  const Graph& g = s_->graph;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const GraphNode& n = g.nodes[i];
    if (n.name.empty()) continue;
    s_->names[n.name] = int32_t(i);
    if (n.kind == NodeKind::Input && n.role == InputRole::Placeholder)
      s_->placeholders[n.name] = int32_t(i);
  }
  for (size_t i = 0; i < g.outputs.size(); ++i)
    s_->names.emplace(fmt::format("out{}", i), g.outputs[i]);
  s_->inputs.assign(static_cast<size_t>(g.num_runtime_inputs), "");
  for (const GraphNode& n : g.nodes)
    if (n.kind == NodeKind::Input && n.role == InputRole::Placeholder) s_->inputs[n.index] = n.name;
  for (size_t i = 0; i < g.captured.size(); ++i)
    s_->captured_names.push_back(fmt::format("captured{}", i));
}

Program::Program() : s_(std::make_unique<State>()) {}
Program::~Program() = default;
Program::Program(Program&&) noexcept = default;
Program& Program::operator=(Program&&) noexcept = default;

std::vector<std::string> Program::input_names() const { return s_->inputs; }

std::vector<std::string> Program::output_names() const {
  if (s_->fn) return s_->fn->outputs;
  if (!s_->output_names.empty()) return s_->output_names;
  std::vector<std::string> r;
  for (size_t i = 0; i < s_->graph.outputs.size(); ++i) r.push_back(fmt::format("out{}", i));
  return r;
}

namespace {
// Every value of g (and of its constructs' functions) on `to` instead of `from`.
void move_graph(Graph& g, Device from, Device to, const char* label) {
  for (GraphNode& n : g.nodes) {
    DUET_CHECK_DEVICE(!(n.kind == NodeKind::Op && n.op == OpId::Print),
                      "[Program::to] {} prints, and a print reads a tensor on the CPU: it runs "
                      "on the device it was traced on",
                      label);
    // A 0-d constant (a wrapped number) stays on the CPU, value and meta, as in a trace made on
    // the device: ops take CPU scalars anywhere, and a fused kernel's plan copies them to the
    // device once. Moving its meta alone would hand a kernel a host pointer.
    const bool stays = n.kind == NodeKind::Constant && n.constant.dim() == 0;
    if (n.meta.device == from && !stays) n.meta.device = to;
    if (n.kind == NodeKind::Op && n.attrs.device == from &&
        (n.op == OpId::Full || n.op == OpId::Arange || n.op == OpId::Transfer))
      n.attrs.device = to;
    if (n.kind == NodeKind::Constant && n.constant.device() == from && !stays)
      n.constant = n.constant.to(to);
    if (n.kind == NodeKind::Control) {
      auto cf = std::make_shared<ControlFlow>(*n.control);
      for (Graph& sub : cf->graphs) move_graph(sub, from, to, label);
      for (TensorMeta& m : cf->results)
        if (m.device == from) m.device = to;
      n.control = std::move(cf);
    }
  }
  for (Tensor& c : g.captured)
    if (c.device() == from) c = c.detach().to(to);
}
}  // namespace

Program& Program::to(Device device) {
  detail::check_device_usable(device, "Program::to");
  if (s_->fn) {
    s_->fn->parameters = s_->fn->to(device);
    s_->core = std::make_unique<detail::CompiledCore>(s_->core->options(), s_->core->label());
    return *this;
  }
  Device from = Device::cpu();
  for (const GraphNode& n : s_->graph.nodes)
    if (n.kind == NodeKind::Input && n.role != InputRole::Captured) from = n.meta.device;
  if (from == device) return *this;
  Graph g = s_->graph;
  {
    detail::SuspendModes eager;
    NoGradGuard ng;
    move_graph(g, from, device, g.label.c_str());
  }
  g.verify();
  s_->graph = std::move(g);
  for (detail::SavedInput& in : s_->saved_inputs)
    if (in.device == from) in.device = device;
  s_->plans.clear();
  return *this;
}

std::vector<std::pair<std::string, Tensor>> Program::named_parameters() const {
  if (s_->fn) return s_->fn->parameters;
  std::vector<std::pair<std::string, Tensor>> r;
  for (size_t i = 0; i < s_->graph.captured.size(); ++i)
    r.emplace_back(s_->captured_names[i], s_->graph.captured[i]);
  return r;
}

std::vector<std::pair<std::string, Tensor>> Program::named_buffers() const {
  if (s_->fn && s_->fn->buffers) return s_->fn->buffers();
  return {};
}

std::vector<Tensor> Program::operator()(const std::vector<Tensor>& inputs) {
  DUET_CHECK_VALUE(inputs.size() == s_->inputs.size(), "[Program] takes {} inputs ({}), got {}",
                   s_->inputs.size(), fmt::join(s_->inputs, ", "), inputs.size());
  if (s_->fn) {
    detail::FlatArgs flat;
    flat.tensors = inputs;
    for (size_t i = 0; i < inputs.size(); ++i)
      flat.labels.add(detail::ArgPath(static_cast<uint32_t>(i)));
    return s_->core->call(flat, s_->fn->fn);
  }
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i) feeds[s_->inputs[i]] = inputs[i];
  return run(feeds);
}

// The sizes of a loaded program's symbols in a call, after checking each input against the
// saved signature and the guards (in words when something does not fit).
namespace {
// A saved input's signature in words: "f32 (s0, 12) cpu".
std::string saved_signature(const detail::SavedInput& in) {
  std::string want;
  for (size_t d = 0; d < in.sizes.size(); ++d)
    want +=
        fmt::format("{}{}", d ? ", " : "",
                    in.syms[d] >= 0 ? fmt::format("s{}", in.syms[d]) : std::to_string(in.sizes[d]));
  return fmt::format("{} ({}) {}", in.dtype, want, in.device);
}

std::vector<int64_t> bind_loaded(const std::vector<detail::SavedInput>& saved, int32_t num_symbols,
                                 const std::vector<detail::SavedGuard>& guards,
                                 const std::map<std::string, Tensor>& feeds) {
  std::vector<int64_t> v(static_cast<size_t>(num_symbols), -1);
  std::vector<std::pair<const detail::SavedInput*, size_t>> from(v.size());  // what set it
  for (const detail::SavedInput& in : saved) {
    auto f = feeds.find(in.name);
    if (f == feeds.end()) continue;  // run() says so, if it is needed
    const Tensor& t = f->second;
    auto sig_of = [&in] { return saved_signature(in); };
    DUET_CHECK_VALUE(t.defined(), "[Program::run] input \"{}\" is an undefined tensor", in.name);
    DUET_CHECK_DTYPE(t.dtype() == in.dtype, "[Program::run] input \"{}\" expects {}, got {} {}",
                     in.name, sig_of(), t.dtype(), t.sizes());
    DUET_CHECK_DEVICE(t.device() == in.device,
                      "[Program::run] input \"{}\" expects {}, got a "
                      "tensor on {}",
                      in.name, sig_of(), t.device());
    DUET_CHECK_SHAPE(t.dim() == static_cast<int64_t>(in.sizes.size()),
                     "[Program::run] input \"{}\" expects {}, got shape {} (rank {}, not {})",
                     in.name, sig_of(), t.sizes(), t.dim(), in.sizes.size());
    for (size_t d = 0; d < in.sizes.size(); ++d) {
      const int64_t got = t.sizes()[static_cast<int64_t>(d)];
      const int32_t id = in.syms[d];
      DUET_CHECK_SHAPE(id >= 0 || got == in.sizes[d],
                       "[Program::run] input \"{}\" expects {}, got shape {}: dim {} was saved "
                       "fixed at {}",
                       in.name, sig_of(), t.sizes(), d, in.sizes[d]);
      if (id < 0) continue;
      DUET_CHECK_SHAPE(v[id] < 0 || v[id] == got,
                       "[Program::run] input \"{}\" expects {}, got shape {}: s{} is {} in {}",
                       in.name, sig_of(), t.sizes(), id, v[id],
                       fmt::format("input \"{}\" dim {}", from[id].first->name, from[id].second));
      v[id] = got;
      from[id] = {&in, d};
    }
  }
  // A size no fed input gives: the inputs that give it were not fed.
  for (size_t k = 0; k < v.size(); ++k) {
    if (v[k] >= 0) continue;
    std::vector<std::string> missing;
    for (const detail::SavedInput& in : saved)
      if (std::find(in.syms.begin(), in.syms.end(), int32_t(k)) != in.syms.end())
        missing.push_back(fmt::format("\"{}\" ({})", in.name, saved_signature(in)));
    DUET_CHECK_VALUE(!missing.empty(), "[Program::run] no input gives the saved program's size s{}",
                     k);
    DUET_CHECK_VALUE(false,
                     "[Program::run] input {} was not fed: the saved program takes its size s{} "
                     "from it",
                     fmt::join(missing, " or "), k);
  }
  for (const detail::SavedGuard& g : guards) {
    int64_t a = 0, b = 0;
    try {
      a = g.a.evaluate(v);
      b = g.b.evaluate(v);
    } catch (const Error&) {
      continue;  // a symbol of an input this run does not feed
    }
    if (detail::sym_rel_holds(a, g.rel, b)) continue;
    std::string at;
    for (size_t k = 0; k < v.size(); ++k)
      if (v[k] >= 0) at += fmt::format("{}s{} = {}", at.empty() ? "" : ", ", k, v[k]);
    DUET_CHECK_SHAPE(false,
                     "[Program::run] the inputs break a guard of the saved program: {} {} {} "
                     "({}), with {}",
                     g.a.str(), detail::sym_rel_str(g.rel), g.b.str(), g.why, at);
  }
  return v;
}
}  // namespace

std::vector<Tensor> Program::eager(const std::vector<Tensor>& inputs) {
  DUET_CHECK_VALUE(s_->fn,
                   "[Program::eager] this program is one traced graph (a Program builder, or "
                   "duet::load): it runs compiled only. An imported program (import_onnx) runs "
                   "both ways");
  DUET_CHECK_VALUE(inputs.size() == s_->inputs.size(),
                   "[Program::eager] takes {} inputs ({}), got {}", s_->inputs.size(),
                   fmt::join(s_->inputs, ", "), inputs.size());
  return s_->fn->fn(inputs);
}

const Graph& Program::graph() const {
  if (s_->fn) {
    DUET_CHECK_VALUE(s_->core->stats().traces > 0,
                     "[Program::graph] {} has no graph before its first compiled call",
                     s_->fn->label);
    return s_->core->graph();
  }
  return s_->graph;
}

std::vector<std::string> Program::names() const {
  if (s_->fn) return s_->fn->outputs;
  std::vector<std::string> r;
  for (const auto& [k, v] : s_->names) r.push_back(k);
  return r;
}

std::vector<Tensor> Program::run(const std::map<std::string, Tensor>& feeds,
                                 const std::vector<std::string>& fetch_in) {
  if (s_->fn) return run_function(feeds, fetch_in);
  std::vector<std::string> fetch = fetch_in;
  if (fetch.empty() && !s_->output_names.empty()) fetch = s_->output_names;
  if (fetch.empty())
    for (size_t i = 0; i < s_->graph.outputs.size(); ++i) fetch.push_back(fmt::format("out{}", i));
  const std::vector<int64_t> values =
      !s_->saved_inputs.empty() ? bind_loaded(s_->saved_inputs, s_->num_symbols, s_->guards, feeds)
                                : std::vector<int64_t>{};
  auto it = s_->plans.find({fetch, values});
  if (it == s_->plans.end()) {
    Graph g = values.empty() ? s_->graph : detail::instantiate(s_->graph, values);
    g.outputs.clear();
    for (const std::string& f : fetch) {
      auto n = s_->names.find(f);
      if (n == s_->names.end()) {
        std::string known;
        for (const auto& [k, v] : s_->names) known += (known.empty() ? "" : ", ") + k;
        throw ValueError(::duet::detail::with_context(fmt::format(
            "[Program::run] nothing named \"{}\" to fetch; the names are {}", f, known)));
      }
      g.outputs.push_back(n->second);
    }
    g = detail::optimize(g, {});
    State::Planned p;
    // Placeholders the fetched values need (an input nothing reads needs no feed).
    std::vector<bool> used(g.nodes.size(), false);
    for (const GraphNode& n : g.nodes)
      for (int32_t in : n.inputs) used[in] = true;
    for (int32_t o : g.outputs) used[o] = true;
    for (const WriteBack& w : g.writebacks) used[w.value] = true;
    p.feeds.assign(g.num_runtime_inputs, "");
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const GraphNode& n = g.nodes[i];
      if (n.kind == NodeKind::Input && n.role == InputRole::Placeholder && used[i])
        p.feeds[n.index] = n.name;
    }
    p.plan = std::make_unique<detail::Plan>(std::move(g), detail::PlanOptions{});
    it = s_->plans.emplace(std::make_pair(fetch, values), std::move(p)).first;
  }
  for (const auto& [k, v] : feeds)
    DUET_CHECK_VALUE(s_->placeholders.count(k),
                     "[Program::run] feed \"{}\" names no placeholder of this program", k);
  const State::Planned& p = it->second;
  const Graph& g = p.plan->graph();
  std::vector<Tensor> inputs(g.num_runtime_inputs);
  for (const GraphNode& n : g.nodes) {
    if (n.kind != NodeKind::Input || n.role != InputRole::Placeholder) continue;
    const std::string& nm = n.name;
    auto f = feeds.find(nm);
    if (f == feeds.end()) {
      DUET_CHECK_VALUE(p.feeds[n.index].empty(),
                       "[Program::run] placeholder \"{}\" ({} of shape {}) is needed but was not "
                       "fed",
                       nm, n.meta.dtype, n.meta.shape);
      // Not needed: any tensor of the right metadata keeps the calling convention.
      inputs[n.index] = detail::make_meta_tensor(n.meta);
      continue;
    }
    const Tensor& t = f->second;
    DUET_CHECK_VALUE(t.defined(), "[Program::run] feed \"{}\" is an undefined tensor", nm);
    DUET_CHECK_SHAPE(t.sizes() == n.meta.shape,
                     "[Program::run] placeholder \"{}\" expects shape {}, fed shape {}", nm,
                     n.meta.shape, t.sizes());
    DUET_CHECK_DTYPE(t.dtype() == n.meta.dtype,
                     "[Program::run] placeholder \"{}\" expects dtype {}, fed {}", nm, n.meta.dtype,
                     t.dtype());
    inputs[n.index] = t.is_contiguous() ? t : t.contiguous();
  }
  // A feed is a value: one that shares memory with a captured tensor the program writes in place
  // is read as it was when run() began, not as the writes leave it partway (Note [Arguments
  // that share memory with written captures] in trace/compile.cpp).
  for (const WriteBack& w : g.writebacks)
    for (Tensor& x : inputs)
      if (detail::shares_memory(x, g.captured[static_cast<size_t>(w.target)])) x = x.clone();
  return p.plan->run(inputs);
}

// run() of a function program: the feeds by name in input order, the fetched outputs by name.
std::vector<Tensor> Program::run_function(const std::map<std::string, Tensor>& feeds,
                                          const std::vector<std::string>& fetch) {
  const detail::FunctionProgram& f = *s_->fn;
  for (const auto& [k, v] : feeds)
    DUET_CHECK_VALUE(std::find(f.inputs.begin(), f.inputs.end(), k) != f.inputs.end(),
                     "[Program::run] feed \"{}\" names no input of {}; its inputs are {}", k,
                     f.label, fmt::join(f.inputs, ", "));
  std::vector<Tensor> in;
  for (const std::string& n : f.inputs) {
    auto it = feeds.find(n);
    DUET_CHECK_VALUE(it != feeds.end(), "[Program::run] input \"{}\" of {} was not fed", n,
                     f.label);
    in.push_back(it->second);
  }
  std::vector<Tensor> out = (*this)(in);
  if (fetch.empty()) return out;
  std::vector<Tensor> r;
  for (const std::string& name : fetch) {
    auto it = std::find(f.outputs.begin(), f.outputs.end(), name);
    DUET_CHECK_VALUE(it != f.outputs.end(),
                     "[Program::run] nothing named \"{}\" to fetch; the outputs are {}", name,
                     fmt::join(f.outputs, ", "));
    r.push_back(out[static_cast<size_t>(it - f.outputs.begin())]);
  }
  return r;
}

Program detail::make_function_program(FunctionProgram f, const CompileOptions& options) {
  Program p;
  p.s_->inputs = f.inputs;
  p.s_->core = std::make_unique<CompiledCore>(options, f.label);
  p.s_->fn = std::make_unique<FunctionProgram>(std::move(f));
  return p;
}

Program load(const std::string& path) {
  // Only a regular file, and no more than its size (Note [Reading user files]). A file that
  // does not start as a program is decoded, and refused, from its first bytes alone.
  detail::InputFile file(path, "load", "a duet program file");
  std::string bytes = file.read(8);
  if (bytes == "DUETPROG") bytes += file.read(file.left());
  detail::SavedProgram saved = detail::decode_program(bytes, path);
  Program p;
  Program::State& s = *p.s_;
  s.graph = std::move(saved.graph);
  s.graph.label = saved.label;
  // The function's arguments become placeholders named as saved, fed by name or in order.
  for (GraphNode& n : s.graph.nodes)
    if (n.kind == NodeKind::Input && n.role == InputRole::Argument) {
      n.role = InputRole::Placeholder;
      n.name = saved.inputs[static_cast<size_t>(n.index)].name;
    }
  for (size_t i = 0; i < s.graph.nodes.size(); ++i) {
    const GraphNode& n = s.graph.nodes[i];
    if (n.kind == NodeKind::Input && n.role == InputRole::Placeholder) {
      s.placeholders[n.name] = int32_t(i);
      s.names[n.name] = int32_t(i);
    }
  }
  for (const detail::SavedInput& in : saved.inputs) s.inputs.push_back(in.name);
  for (size_t i = 0; i < s.graph.outputs.size(); ++i)
    s.names.emplace(saved.outputs[i], s.graph.outputs[i]);
  s.captured_names = std::move(saved.captured_names);
  s.saved_inputs = std::move(saved.inputs);
  s.num_symbols = saved.num_symbols;
  s.guards = std::move(saved.guards);
  s.output_names = std::move(saved.outputs);
  return p;
}

bool detail::is_function_program(const Program& p) { return p.s_->fn != nullptr; }

}  // namespace duet
