// duet: the guards of a compiled function (trace/compile.h): the signatures of a call's tensors,
// binding its sizes to an entry's symbols and the guards on them (Note [Symbolic dims]), and the
// value guards of data-dependent reads (Note [Data-dependent reads]). Private to
// trace/compile.cpp and trace/guards.cpp.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/symbolic.h"
#include "trace/compile.h"
#include "trace/executor.h"

namespace duet::detail {

// What the guard compares for one tensor.
struct TensorSig {
  Shape shape;
  Strides strides;  // only when not contiguous
  DType dtype;
  Device device;
  bool requires_grad;
  bool contiguous;
  bool operator==(const TensorSig& o) const {
    return shape == o.shape && dtype == o.dtype && device == o.device &&
           requires_grad == o.requires_grad && contiguous == o.contiguous &&
           (contiguous || strides == o.strides);
  }
};

TensorSig sig_of(const Tensor& t);
// A guard of a symbolic entry: a relation its graph assumes (Note [Symbolic dims]).
struct SymGuard {
  SymInt a;
  SymRel rel;
  SymInt b;
  std::string why;
  bool holds(const std::vector<int64_t>& v) const {
    return sym_rel_holds(a.evaluate(v), rel, b.evaluate(v));
  }
  std::string str() const {
    return fmt::format("{} {} {} ({})", a.str(), sym_rel_str(rel), b.str(), why);
  }
};

// The SymContext of one trace: the symbols' values at the traced call, and what it decided.
class TraceSyms final : public SymContext {
 public:
  std::vector<int64_t> hints;
  std::vector<SymGuard> guards;
  SymbolBounds bounds_;
  int64_t hint(const SymInt& s) const override { return s.evaluate(hints); }
  void guard(const SymInt& a, SymRel rel, const SymInt& b, std::string why) override {
    for (const SymGuard& g : guards)
      if (g.a == a && g.rel == rel && g.b == b) return;
    guards.push_back({a, rel, b, std::move(why)});
  }
  [[noreturn]] void specialize(const std::vector<SymInt>& sizes, std::string why) override {
    SpecializeRequest r;
    for (const SymInt& s : sizes)
      for (int32_t id : s.symbols())
        if (std::find(r.symbols.begin(), r.symbols.end(), id) == r.symbols.end())
          r.symbols.push_back(id);
    r.why = std::move(why);
    throw r;
  }
  const SymbolBounds& bounds() const override { return bounds_; }
};

// ---- binding a call to an entry's symbols ----

bool bind_symbols(const std::vector<std::vector<int32_t>>& dim_sym, int32_t num_symbols,
                  const std::vector<SymGuard>& guards, const std::vector<TensorSig>& want,
                  const std::vector<TensorSig>& sig, const std::vector<std::string>& labels,
                  std::vector<int64_t>& values, std::string* why);
std::vector<std::vector<int32_t>> assign_symbols(
    const std::vector<TensorSig>& sig, const std::set<std::pair<size_t, int64_t>>& dynamic,
    std::vector<int64_t>& hints);
Graph instantiate(const Graph& g, const std::vector<int64_t>& v);

// ---- value guards (Note [Data-dependent reads]) ----

PlanOptions plain_plan();
Tensor evaluate_value(const Graph& g, int32_t v, const std::vector<Tensor>& args,
                      const std::vector<int64_t>& hints);
void split_guards(const Graph& f, size_t k, Graph& guard, Graph& rest);
bool same_data(const Tensor& a, const Tensor& b);

// ---- cutting parts out of a graph (trace/compile.cpp) ----
// The joint graph of a trace is cut into its forward and backward parts, and a forward graph
// into the guards' part and the rest, with these.

void ancestors(const Graph& g, const std::vector<int32_t>& roots, const std::vector<bool>& stop,
               std::vector<bool>& in, std::set<int32_t>* boundary);
// Which write-backs a part of a graph keeps: those whose value it computes, those whose value
// it computes or takes as a boundary input, or none.
enum class KeepWritebacks { Computed, ComputedOrBoundary, None };
Graph extract(const Graph& g, const std::vector<bool>& include,
              const std::vector<int32_t>& boundary, const std::vector<int32_t>& roots,
              KeepWritebacks keep = KeepWritebacks::Computed);

}  // namespace duet::detail
