// duet: the guards of compiled functions (trace/guards.h): signatures, binding a call's sizes to
// an entry's symbols (Note [Symbolic dims] in trace/compile.h), the reason for a miss, and value
// guards (Note [Data-dependent reads] in trace/tracer.h).
#include "trace/guards.h"

#include <algorithm>
#include <cstring>

#include "core/autocast.h"
#include "core/dispatch.h"
#include "eager/autograd.h"

namespace duet::detail {

// An autocast state (autocast_key()) in words: "off", "cpu bf16", "cpu bf16, cuda f16".
static std::string autocast_text(uint32_t key) {
  std::string s;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const uint32_t b = key >> (4 * t) & 0xf;
    if (!(b & 8)) continue;
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", t == 0 ? "cpu" : "cuda",
                     static_cast<DType>(b & 7));
  }
  return s.empty() ? "off" : s;
}

TensorSig sig_of(const Tensor& t) {
  const TensorImpl* x = t.impl();
  TensorSig s{x->shape, {}, x->dtype, x->device(), x->requires_grad, x->contiguous};
  if (!x->contiguous) s.strides = x->strides;
  return s;
}

void check_call_tensors(const FlatArgs& args, const std::string& label) {
  for (const Tensor& t : args.tensors) {
    DUET_CHECK(t.defined(), "[compile] {} was called with an undefined tensor", label);
    if (is_traced(t)) throw_traced_use(t, "compile");
  }
}

std::vector<TensorSig> call_signature(const FlatArgs& args, const std::string& label) {
  check_call_tensors(args, label);
  std::vector<TensorSig> sig;
  sig.reserve(args.tensors.size());
  for (const Tensor& t : args.tensors) sig.push_back(sig_of(t));
  return sig;
}

// The symbol values of a call for entry e, or false when the call does not fit e: a concrete
// dim differs, a symbol's dims disagree (duck sizing), or a guard fails (`why` says which).
bool bind_symbols(const std::vector<std::vector<int32_t>>& dim_sym, int32_t num_symbols,
                  const std::vector<SymGuard>& guards, const std::vector<TensorSig>& want,
                  const std::vector<Tensor>& tensors, const ArgLabels& labels,
                  std::vector<int64_t>& values, std::string* why) {
  values.assign(static_cast<size_t>(num_symbols), -1);
  if (want.size() != tensors.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSig& a = want[i];
    const TensorImpl* b = tensors[i].unsafe_impl();  // (as sig_of(tensors[i]) reads it)
    if (a.shape.size() != b->shape.size() || a.dtype != b->dtype || a.device != b->device() ||
        a.requires_grad != b->requires_grad || a.contiguous != b->contiguous ||
        (!a.contiguous && a.strides != b->strides))
      return false;
    for (int64_t d = 0; d < a.shape.size(); ++d) {
      const int32_t id = dim_sym.empty() ? -1 : dim_sym[i][d];
      if (id < 0) {
        if (a.shape[d] != b->shape[d]) return false;
      } else if (values[id] < 0) {
        values[id] = b->shape[d];
      } else if (values[id] != b->shape[d]) {
        if (why)
          *why = fmt::format("{} dim {} is {} but s{} (the dims that were equal when traced) is {}",
                             labels[i], d, b->shape[d], id, values[id]);
        return false;
      }
    }
  }
  for (const SymGuard& g : guards)
    if (!g.holds(values)) {
      if (why) {
        std::string at;
        for (size_t k = 0; k < values.size(); ++k)
          at += fmt::format("{}s{} = {}", k ? ", " : "", k, values[k]);
        *why = fmt::format("guard {} failed at {}", g.str(), at);
      }
      return false;
    }
  return true;
}

const FlagGuard* changed_flag(const EntryGuards& e) {
  for (const FlagGuard& f : e.flags)
    if (*f.flag != f.value) return &f;
  return nullptr;
}

bool fits(const EntryGuards& e, const FlatArgs& args, bool grad_mode,
          std::vector<int64_t>& values) {
  if (e.grad_mode != grad_mode || e.autocast != detail::autocast_key() ||
      e.statics != args.statics || changed_flag(e))
    return false;
  for (size_t i = 0; i < e.captured_flags.size(); ++i)
    if (e.captured_flags[i].first.requires_grad() != e.captured_flags[i].second ||
        storage_serial(e.captured_flags[i].first) != e.captured_storage[i] ||
        hooks_key(e.captured_flags[i].first) != e.captured_hooks[i])
      return false;
  for (const auto& [leaf, buf] : e.grad_buffers) {
    const Tensor g = leaf.grad();
    if (g.defined() && !g.is_same(buf)) return false;
  }
  return bind_symbols(e.dim_sym, e.num_symbols, e.guards, e.sig, args.tensors, args.labels, values,
                      nullptr);
}

bool differs_in_sizes_only(const EntryGuards& e, const std::vector<TensorSig>& sig,
                           const FlatArgs& args, bool grad_mode) {
  if (e.grad_mode != grad_mode || e.autocast != detail::autocast_key() ||
      e.statics != args.statics || e.sig.size() != sig.size() || changed_flag(e))
    return false;
  bool same = true;
  for (size_t i = 0; same && i < e.captured_flags.size(); ++i)
    same = e.captured_flags[i].first.requires_grad() == e.captured_flags[i].second &&
           hooks_key(e.captured_flags[i].first) == e.captured_hooks[i];
  for (size_t i = 0; same && i < sig.size(); ++i) {
    const TensorSig& a = e.sig[i];
    const TensorSig& b = sig[i];
    same = a.shape.size() == b.shape.size() && a.dtype == b.dtype && a.device == b.device &&
           a.requires_grad == b.requires_grad && a.contiguous == b.contiguous;
  }
  return same;
}

std::string miss_reason(const EntryGuards& p, const std::vector<TensorSig>& sig,
                        const FlatArgs& args, bool gm,
                        const std::map<std::pair<size_t, int64_t>, std::string>& specialized,
                        const std::string& value_why, DimSet& dynamic) {
  std::string why;
  std::vector<int64_t> values;
  bool same_structure = p.sig.size() == sig.size();
  for (size_t i = 0; same_structure && i < sig.size(); ++i)
    same_structure = p.sig[i].shape.size() == sig[i].shape.size();
  if (p.grad_mode != gm)
    why = fmt::format("grad mode changed {} -> {}", p.grad_mode ? "on" : "off", gm ? "on" : "off");
  else if (p.autocast != detail::autocast_key())
    why = fmt::format("autocast changed {} -> {}", autocast_text(p.autocast),
                      autocast_text(detail::autocast_key()));
  else if (const FlagGuard* f = changed_flag(p))
    why = fmt::format("{} changed {} -> {}", f->what, f->value, !f->value);
  for (size_t i = 0; why.empty() && i < std::max(p.statics.size(), args.statics.size()); ++i) {
    std::string a = i < p.statics.size() ? p.statics[i] : "nothing";
    std::string b = i < args.statics.size() ? args.statics[i] : "nothing";
    if (a != b) why = fmt::format("static argument changed: {} -> {}", a, b);
  }
  // The .grad of an argument is an input of its own (Note [Argument gradients]).
  auto grads_of = [](const std::vector<std::string>& labels) {
    std::string r;
    for (const std::string& l : labels)
      if (l.size() > 5 && l.compare(l.size() - 5, 5, ".grad") == 0)
        r += fmt::format("{}{}", r.empty() ? "" : ", ", l.substr(0, l.size() - 5));
    return r.empty() ? std::string("none") : r;
  };
  if (why.empty() && grads_of(p.labels) != grads_of(args.labels.strings()))
    why = fmt::format("the arguments that have a .grad changed: {} -> {}", grads_of(p.labels),
                      grads_of(args.labels.strings()));
  std::string dims_changed;
  for (size_t i = 0; why.empty() && i < sig.size() && i < p.sig.size(); ++i) {
    const TensorSig& a = p.sig[i];
    const TensorSig& b = sig[i];
    const std::string& l = args.labels[i];
    if (a.shape.size() != b.shape.size())
      why = fmt::format("{} rank changed {} -> {} (shape {} -> {})", l, a.shape.size(),
                        b.shape.size(), a.shape, b.shape);
    for (int64_t d = 0; why.empty() && d < a.shape.size(); ++d) {
      const bool was_symbolic = !p.dim_sym.empty() && p.dim_sym[i][d] >= 0;
      if (a.shape[d] == b.shape[d] || was_symbolic) continue;
      auto sp = specialized.find({i, d});
      if (sp != specialized.end() || !b.contiguous) {
        why = fmt::format(
            "{} dim {} changed {} -> {} (kept concrete: {})", l, d, a.shape[d], b.shape[d],
            sp != specialized.end() ? sp->second : std::string("the tensor is not contiguous"));
      } else {
        dims_changed += fmt::format("{}{} dim {} changed {} -> {}",
                                    dims_changed.empty() ? "" : ", ", l, d, a.shape[d], b.shape[d]);
        dynamic.insert({i, d});
      }
    }
    if (why.empty() && a.dtype != b.dtype)
      why = fmt::format("{} dtype changed {} -> {}", l, a.dtype, b.dtype);
    if (why.empty() && a.device != b.device)
      why = fmt::format("{} device changed {} -> {}", l, a.device, b.device);
    if (why.empty() && a.requires_grad != b.requires_grad)
      why = fmt::format("{} requires_grad changed {} -> {}", l, a.requires_grad, b.requires_grad);
    if (why.empty() && (a.contiguous != b.contiguous || (!a.contiguous && a.strides != b.strides)))
      why = fmt::format(
          "{} layout changed ({} -> {})", l,
          a.contiguous ? "contiguous"
                       : fmt::format("strides {}", Shape(a.strides.data(), a.strides.size())),
          b.contiguous ? "contiguous"
                       : fmt::format("strides {}", Shape(b.strides.data(), b.strides.size())));
  }
  for (size_t i = 0; why.empty() && i < p.captured_flags.size(); ++i) {
    const auto& [t, rg] = p.captured_flags[i];
    if (t.requires_grad() != rg)
      why = fmt::format("captured tensor {} (shape {}) requires_grad changed {} -> {}", i,
                        t.sizes(), rg, !rg);
  }
  for (size_t i = 0; why.empty() && i < p.captured_flags.size(); ++i)
    if (storage_serial(p.captured_flags[i].first) != p.captured_storage[i])
      why = fmt::format("captured tensor {} (shape {}) was given new storage (Module::to)", i,
                        p.captured_flags[i].first.sizes());
  for (size_t i = 0; why.empty() && i < p.captured_flags.size(); ++i)
    if (hooks_key(p.captured_flags[i].first) != p.captured_hooks[i])
      why = fmt::format(
          "a post-accumulate-grad hook of captured tensor {} (shape {}) was added or removed", i,
          p.captured_flags[i].first.sizes());
  for (size_t i = 0; why.empty() && i < p.grad_buffers.size(); ++i) {
    const auto& [leaf, buf] = p.grad_buffers[i];
    const Tensor g = leaf.grad();
    if (g.defined() && !g.is_same(buf))
      why = fmt::format("the .grad of a captured tensor (shape {}) was replaced by another tensor",
                        leaf.sizes());
  }
  if (why.empty() && !dims_changed.empty())
    why = dims_changed + ": retraced with these dims symbolic";
  if (why.empty()) why = value_why;
  if (why.empty() && p.num_symbols && same_structure)
    bind_symbols(p.dim_sym, p.num_symbols, p.guards, p.sig, args.tensors, args.labels, values,
                 &why);
  if (why.empty()) why = "a new combination of argument signatures seen before";
  if (same_structure)
    for (size_t i = 0; i < p.dim_sym.size(); ++i)
      for (size_t d = 0; d < p.dim_sym[i].size(); ++d)
        if (p.dim_sym[i][d] >= 0) dynamic.insert({i, static_cast<int64_t>(d)});
  return why;
}

DimSet requested_dynamic_dims(const CompileOptions& options, const FlatArgs& args,
                              const std::string& label) {
  DimSet dynamic;
  for (const auto& [arg, dim] : options.dynamic) {
    const std::string name = fmt::format("arg {}", arg);
    bool found = false;
    for (size_t i = 0; i < args.tensors.size(); ++i) {
      const std::string& l = args.labels[i];
      if (l != name && l.rfind(name + "[", 0) != 0) continue;
      found = true;
      DUET_CHECK_VALUE(dim < args.tensors[i].dim(),
                       "[compile] CompileOptions::dynamic names dim {} of {}, which has shape {}",
                       dim, l, args.tensors[i].sizes());
      dynamic.insert({i, dim});
    }
    DUET_CHECK_VALUE(found,
                     "[compile] CompileOptions::dynamic names {}, but {} has no such tensor "
                     "argument",
                     name, label);
  }
  return dynamic;
}

// A symbol for each dynamic dim (per tensor, per dim; -1 for a concrete dim, and no rows when
// none is dynamic), with the call's sizes as `hints`. Dims of equal size share one (duck sizing,
// as PyTorch does): a call where they differ misses and traces again.
std::vector<std::vector<int32_t>> assign_symbols(
    const std::vector<TensorSig>& sig, const std::set<std::pair<size_t, int64_t>>& dynamic,
    std::vector<int64_t>& hints) {
  std::vector<std::vector<int32_t>> dim_sym;
  hints.clear();
  if (dynamic.empty()) return dim_sym;
  std::map<int64_t, int32_t> by_size;
  for (size_t i = 0; i < sig.size(); ++i) {
    dim_sym.emplace_back(static_cast<size_t>(sig[i].shape.size()), -1);
    for (int64_t d = 0; d < sig[i].shape.size(); ++d) {
      if (!dynamic.count({i, d})) continue;
      auto it = by_size.try_emplace(sig[i].shape[d], static_cast<int32_t>(hints.size())).first;
      if (it->second == static_cast<int32_t>(hints.size())) hints.push_back(sig[i].shape[d]);
      dim_sym[i][static_cast<size_t>(d)] = it->second;
    }
  }
  return dim_sym;
}

SymDims symbolic_dims(const Tensor& t, const std::vector<std::vector<int32_t>>& dim_sym, size_t i) {
  SymDims dims;
  if (dim_sym.empty()) return dims;
  const Shape& shape = t.impl()->shape;
  bool any = false;
  for (int64_t d = 0; d < shape.size(); ++d) {
    const int32_t id = dim_sym[i][d];
    dims.push_back(id >= 0 ? SymInt::symbol(id) : SymInt(shape[d]));
    any = any || id >= 0;
  }
  if (!any) dims.clear();
  return dims;
}

namespace {

TensorMeta concrete_meta(TensorMeta m, const std::vector<int64_t>& v) {
  for (size_t d = 0; d < m.sym.size(); ++d) m.shape[static_cast<int64_t>(d)] = m.sym[d].evaluate(v);
  return m;
}

}  // namespace

// The graph at concrete symbol values: every meta and size-holding attribute evaluated. The
// symbolic dims stay beside them, for printing.
Graph instantiate(const Graph& g, const std::vector<int64_t>& v) {
  Graph r = g;
  for (GraphNode& n : r.nodes) {
    n.meta = concrete_meta(std::move(n.meta), v);
    if (n.kind == NodeKind::Op && n.attrs.sym) {
      const SymAttrs& s = *n.attrs.sym;
      for (size_t i = 0; i < s.ints.size(); ++i)
        n.attrs.ints[static_cast<int64_t>(i)] = s.ints[i].evaluate(v);
      if (s.start) n.attrs.start = s.start->evaluate(v);
      if (s.end) n.attrs.end = s.end->evaluate(v);
      if (s.value) n.attrs.value = Scalar(static_cast<double>(s.value->evaluate(v)));
    }
    if (n.kind == NodeKind::Control) {
      auto cf = std::make_shared<ControlFlow>(*n.control);
      for (Graph& sub : cf->graphs) sub = instantiate(sub, v);
      for (TensorMeta& m : cf->results) m = concrete_meta(std::move(m), v);
      n.control = std::move(cf);
    }
  }
  return r;
}

// A plan that runs each op as traced, one kernel per node.
PlanOptions plain_plan() {
  PlanOptions o;
  o.fuse = o.codegen = o.plan_memory = o.parallel = o.hoist = false;
  return o;
}

// The value v of a graph being traced, computed on the traced call's arguments (symbols at
// `hints`): the part of the graph it needs, run by a plan with no passes.
Tensor evaluate_value(const Graph& g, int32_t v, const std::vector<Tensor>& args,
                      const std::vector<int64_t>& hints) {
  const size_t n = g.nodes.size();
  std::vector<bool> in(n, false), none(n, false);
  std::vector<int32_t> roots{v};
  for (size_t i = 0; i < n; ++i)
    if (g.nodes[i].kind == NodeKind::Input && g.nodes[i].role == InputRole::Argument)
      roots.push_back(static_cast<int32_t>(i));
  ancestors(g, roots, none, in, nullptr);
  Graph part = extract(g, in, {}, {v}, KeepWritebacks::None);
  if (!hints.empty()) part = instantiate(part, hints);
  Plan p(std::move(part), plain_plan());
  return p.run(args)[0];
}

// Splits a forward graph whose last k outputs are guarded values into the guards' part (what
// they need; outputs: the guarded values, then the values of that part the rest reads) and the
// rest (the other outputs and the write-backs, reading those values as Saved inputs first).
void split_guards(const Graph& f, size_t k, Graph& guard, Graph& rest) {
  const size_t n = f.nodes.size();
  const size_t m = f.outputs.size() - k;
  std::vector<int32_t> args;
  for (size_t i = 0; i < n; ++i)
    if (f.nodes[i].kind == NodeKind::Input && f.nodes[i].role == InputRole::Argument)
      args.push_back(static_cast<int32_t>(i));
  std::vector<int32_t> gvals(f.outputs.begin() + static_cast<std::ptrdiff_t>(m), f.outputs.end());
  std::vector<bool> in_guard(n, false), none(n, false);
  std::vector<int32_t> roots = gvals;
  roots.insert(roots.end(), args.begin(), args.end());
  ancestors(f, roots, none, in_guard, nullptr);
  // A construct the guards run is theirs with all its results (the rest never reads the tuple).
  for (size_t i = 0; i < n; ++i)
    if (f.nodes[i].kind == NodeKind::Project && in_guard[f.nodes[i].inputs[0]]) in_guard[i] = true;
  std::vector<bool> stop(n, false);
  for (size_t i = 0; i < n; ++i)
    stop[i] =
        in_guard[i] && f.nodes[i].kind != NodeKind::Input && f.nodes[i].kind != NodeKind::Constant;
  std::vector<int32_t> outs(f.outputs.begin(), f.outputs.begin() + static_cast<std::ptrdiff_t>(m));
  std::vector<int32_t> rest_roots = outs;
  for (const WriteBack& w : f.writebacks) rest_roots.push_back(w.value);
  rest_roots.insert(rest_roots.end(), args.begin(), args.end());
  std::vector<bool> in_rest(n, false);
  std::set<int32_t> boundary;
  ancestors(f, rest_roots, stop, in_rest, &boundary);
  std::vector<int32_t> b(boundary.begin(), boundary.end());
  std::vector<int32_t> gout = gvals;
  gout.insert(gout.end(), b.begin(), b.end());
  guard = extract(f, in_guard, {}, gout, KeepWritebacks::None);
  rest = extract(f, in_rest, b, outs, KeepWritebacks::ComputedOrBoundary);
}

// Bitwise equality of two values of a guard (NaN equals itself).
bool same_data(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  // Compared on the host: values guarded on a GPU are read through host copies.
  const Tensor ca = a.contiguous().to(Device::cpu()), cb = b.contiguous().to(Device::cpu());
  return std::memcmp(ca.raw_data(), cb.raw_data(),
                     static_cast<size_t>(ca.numel()) * itemsize(ca.dtype())) == 0;
}

bool shares_memory(const Tensor& a, const Tensor& b) {
  // The bytes of the storage a tensor lies in, where its data is (not a lazy one's).
  auto bytes_of = [](const Tensor& t) -> std::pair<const char*, const char*> {
    const StorageImpl* s = t.unsafe_impl()->storage.get();
    if (!s || !s->data) return {nullptr, nullptr};
    const auto* lo = static_cast<const char*>(s->data);
    return {lo, lo + s->nbytes};
  };
  const auto [alo, ahi] = bytes_of(a);
  const auto [blo, bhi] = bytes_of(b);
  return alo && blo && alo < bhi && blo < ahi;
}

std::vector<size_t> overlapping_written(const EntryGuards& e, const FlatArgs& args) {
  std::vector<size_t> out;
  for (size_t i = 0; i < args.tensors.size(); ++i)
    for (const Tensor& w : e.written)
      if (shares_memory(args.tensors[i], w)) {
        out.push_back(i);
        break;
      }
  return out;
}

void restore_grad_buffers(const EntryGuards& e) {
  for (const auto& [leaf, buf] : e.grad_buffers) {
    if (leaf.grad().defined()) continue;
    duet::NoGradGuard ng;
    Tensor(buf).zero_();
    Tensor(leaf).set_grad(buf);
  }
}

}  // namespace duet::detail
