#include "trace/program.h"

#include <algorithm>

#include "core/dispatch.h"
#include "trace/executor.h"
#include "trace/passes.h"
#include "trace/tracer.h"

namespace duet {

namespace {
thread_local detail::Tracer* tls_builder = nullptr;  // the Program being built on this thread
}  // namespace

struct Program::State {
  Graph graph;
  std::map<std::string, int32_t> names;  // fetchable name -> value
  std::map<std::string, int32_t> placeholders;
  struct Planned {
    std::unique_ptr<detail::Plan> plan;
    std::vector<std::string> feeds;  // placeholder name per runtime slot (needed ones)
    std::vector<int32_t> slot_of_feed;
  };
  std::map<std::vector<std::string>, Planned> plans;
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
}

Program::~Program() = default;

const Graph& Program::graph() const { return s_->graph; }

std::vector<std::string> Program::names() const {
  std::vector<std::string> r;
  for (const auto& [k, v] : s_->names) r.push_back(k);
  return r;
}

std::vector<Tensor> Program::run(const std::map<std::string, Tensor>& feeds,
                                 const std::vector<std::string>& fetch_in) {
  std::vector<std::string> fetch = fetch_in;
  if (fetch.empty())
    for (size_t i = 0; i < s_->graph.outputs.size(); ++i) fetch.push_back(fmt::format("out{}", i));
  auto it = s_->plans.find(fetch);
  if (it == s_->plans.end()) {
    Graph g = s_->graph;
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
    it = s_->plans.emplace(fetch, std::move(p)).first;
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
    inputs[n.index] = t;
  }
  return p.plan->run(inputs);
}

}  // namespace duet
