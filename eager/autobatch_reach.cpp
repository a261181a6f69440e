// duet: which samples of a run a backward reached (Note [Gradients off the loss's path]).
//
// Note [Gradients off the loss's path]
// The batched backward reaches every sample of a batch. A sample whose result is not on the
// loss's path gets a gradient of zeros, and so would a tensor only such samples read: a weight of
// a head computed and kept but left out of the loss, a per-sample input whose sample was not
// summed in. Eagerly that tensor gets no gradient at all (`grad()` stays undefined), and an
// optimizer that skips tensors without one (Adam, set_to_none) must not update it. So the run
// keeps its per-sample graph (each pending op's producers, as OpIndex holds them), and:
//  - a tensor from outside the run that requires grad (a weight, an input, a result of an
//    earlier run) enters the batched tape through a gate: an alias of it whose tape node knows
//    which ops read it (gated);
//  - a result that outlives the run with its history (Note [The run's end]) gets a mark: a node
//    between it and its sample of the batch that, when a gradient reaches it, marks its op and
//    the ops behind it as reached in this backward (SampleGraph::mark), through the operands of
//    ops that record a gradient only (not through a comparison's, say), and only through
//    operands that require grad (not through a detached read of a result);
//  - a gate passes its gradient on only when one of its readers was reached in this backward;
//    otherwise it gives none, and the engine sends none on (eager/engine.cpp: a node whose
//    inputs gave no gradient runs no rule, and a leaf that got none keeps the .grad it had).
// The backward runs a gate after every batched node that read its tensor (they consume its
// alias), so after every mark behind them: each reader's fate is known when its gate runs. The
// zeros a gate holds back are exactly what the samples off the path added, so the gradients
// of everything that is on it are unchanged. A later backward from another result (a second
// loss) marks its own samples: reached holds the backward's number.
// A backward with create_graph opens the graph for good: the gradient it records reads the
// batches' saved values, so a backward through that gradient enters the batches at any node,
// not through the marks. An open graph's gates pass every gradient on, zeros included.
//
// Note [Batches shared by losses]
// Eagerly, two losses of separate samples have separate graphs: a backward from one frees its
// graph's saved values, and a backward from the other still runs. Batched, their samples share
// the batches' tape nodes, so the first backward would free what the second needs. So the run's
// nodes (made while it runs: node_keeper) have the run's graph as their keeper, and a backward
// that does not retain the graph frees their saved values only once every survivor was
// reached by it or by an earlier such backward (SampleGraph::keep). A survivor that the loss was
// computed from counts as reached, as eagerly the loss's backward frees its graph too. A
// backward from a survivor spent so raises the engine's error, as eagerly; until then the saved
// values live as long as the results that hold the nodes.
#include <algorithm>
#include <iterator>

#include "eager/autobatch_impl.h"
#include "eager/autograd.h"
#include "eager/node.h"

namespace duet {

namespace autobatch {

// The ops behind those in `todo` (already visited) that a gradient reaches: through the operands
// that require grad of ops that record a gradient. visit(p) marks op p, or returns false where p
// was visited already.
template <class Visit>
void walk_back(const SampleGraph& g, std::vector<int32_t> todo, Visit&& visit) {
  while (!todo.empty()) {
    const auto i = static_cast<size_t>(todo.back());
    todo.pop_back();
    if (!g.grad[i]) continue;  // (a comparison's operands get no gradient through it)
    for (int32_t e = g.edge_at[i]; e < g.edge_at[i + 1]; ++e) {
      const int32_t p = g.edges[static_cast<size_t>(e)];
      if (visit(p)) todo.push_back(p);
    }
  }
}

void SampleGraph::mark(int32_t op, uint64_t backward) {
  if (static_cast<size_t>(op) >= reached.size() || reached[static_cast<size_t>(op)] == backward)
    return;
  ++marks;
  reached[static_cast<size_t>(op)] = backward;
  walk_back(*this, {op}, [&](int32_t p) {
    if (reached[static_cast<size_t>(p)] == backward) return false;
    reached[static_cast<size_t>(p)] = backward;
    return true;
  });
}

std::vector<char> SampleGraph::reached_from(const std::vector<int32_t>& roots) const {
  std::vector<char> on(grad.size(), 0);
  for (int32_t r : roots) on[static_cast<size_t>(r)] = 1;
  walk_back(*this, roots, [&](int32_t p) {
    if (on[static_cast<size_t>(p)]) return false;
    on[static_cast<size_t>(p)] = 1;
    return true;
  });
  return on;
}

bool SampleGraph::read_by_reached(size_t gate, uint64_t backward) const {
  if (reached.empty()) return true;  // (a run that failed kept no graph: pass it all)
  for (int32_t r : readers[gate])
    if (reached[static_cast<size_t>(r)] == backward) return true;
  return false;
}

bool SampleGraph::keep() {
  const uint64_t backward = detail::backward_id();
  if (cached_backward == backward && cached_marks == marks && cached_backward != 0) return cached;
  // (Asked only by a backward that does not retain the graph: what it reached is spent.)
  consumed.resize(survivors.size());
  bool waiting = false;
  for (size_t k = 0; k < survivors.size(); ++k) {
    const auto s = static_cast<size_t>(survivors[k]);
    if (s < reached.size() && reached[s] == backward) consumed[k] = 1;
    waiting = waiting || !consumed[k];
  }
  cached_backward = backward;
  cached_marks = marks;
  cached = waiting;
  return waiting;
}

namespace {

const OpDef& gate_def() {
  static const OpDef d = detail::opaque_node_def("autobatch_gate");
  return d;
}
const OpDef& row_gate_def() {
  static const OpDef d = detail::opaque_node_def("autobatch_row_gate");
  return d;
}
const OpDef& mark_def() {
  static const OpDef d = detail::opaque_node_def("autobatch_mark");
  return d;
}

// A tape node of one input, x, running `fn` as its backward.
std::shared_ptr<detail::Node> node_over(
    const OpDef& def, const Tensor& x,
    std::function<void(const Tensor&, const bool*, Tensor*)> fn) {
  auto node = detail::make_node();
  node->def = &def;
  node->sequence = detail::next_sequence();
  node->inputs.resize(1);
  node->saved.resize(1);
  detail::set_input_edge(node->inputs[0], x);
  const TensorImpl* t = x.unsafe_impl();
  node->output_meta = {t->shape, t->dtype, t->device(), t->sym};
  node->backward_fn = std::move(fn);
  node->backward_fn_differentiable = true;  // (the identity, or nothing)
  return node;
}

}  // namespace

}  // namespace autobatch

Tensor Autobatch::Impl::gated(const Tensor& x, const int32_t* readers, size_t count) {
  const TensorImpl* xi = x.unsafe_impl();
  if (!xi->requires_grad) return x;  // (callers ask only for groups that record a gradient)
  // Only readers that record a gradient read x through its gate. A group that records one may
  // hold ops that do not (one made under NoGradGuard, grouped by rows with ops that do): such an
  // op sends x nothing eagerly, and a backward that reaches it (through a detached view of its
  // result, whose storage it made) must not pass the group's zeros on to x. (Autobatch seed
  // 157334 of the batch mix: a while_loop's copy of its state, under NoGradGuard, in one group
  // with a scan's copies of its carry, gave x a gradient of zeros where eagerly it has none.)
  auto records = [&](int32_t r) {
    return !run_index_ || static_cast<size_t>(r) >= run_index_->grad.size() ||
           run_index_->grad[static_cast<size_t>(r)];
  };
  std::vector<int32_t> recording;  // (made only where some reader does not record)
  if (!std::all_of(readers, readers + count, records)) {
    std::copy_if(readers, readers + count, std::back_inserter(recording), records);
    if (recording.empty()) return x.detach();  // (the group's tape must not reach x through it)
    readers = recording.data();
    count = recording.size();
  }
  auto [it, fresh] = gates_.try_emplace(xi);
  if (fresh) {
    const size_t at = graph_->readers.size();
    graph_->readers.emplace_back();
    // An alias of x (its memory, read the same way) whose history is the gate.
    Tensor alias = detail::make_view(x, xi->shape, xi->strides, xi->offset);
    alias.unsafe_impl()->requires_grad = true;
    std::shared_ptr<SampleGraph> held = graph_;
    std::shared_ptr<detail::Node>& fn = detail::autograd_meta(*alias.unsafe_impl()).grad_fn;
    fn = node_over(gate_def(), x, [held, at](const Tensor& grad, const bool* needs, Tensor* gi) {
      held->open = held->open || detail::grad_mode();
      if (needs[0] && (held->open || held->read_by_reached(at, detail::backward_id())))
        gi[0] = grad;
    });
    fn->keeper = held;  // (a later loss's backward may pass it again)
    it->second = {std::move(alias), at};
  }
  std::vector<int32_t>& r = graph_->readers[it->second.second];
  r.insert(r.end(), readers, readers + count);
  return it->second.first;
}

// Note [Row gates]
// Gates stop the zeros of the samples off a backward's path where a tensor from outside the run
// enters, not inside it: a group that batches samples on the path with samples off it (two abs
// of one shape, one summed into the loss, one only read detached) sends the off-path samples
// zeros, and a gradient rule that gives NaN for a zero gradient (std of equal values: 0 * 0 /
// 0; sqrt at 0) behind them turns those into NaN, which the batches carry to the inputs. Eagerly
// no gradient reaches that rule at all. A run that a backward starts splits such groups (Note
// [Groups on the loss's path] in eager/autobatch.cpp); any other run (one that a read started:
// loss.item() before the backward, a value the step reads) gates each batched operand of a
// differentiated group: an alias whose tape node knows which op each row along dim 0 belongs
// to, and which, when the backward reaches it (after every mark behind the group's readers: the
// group's node ran after them), passes the gradient on where every row's op was reached, none
// where none was, and otherwise the gradient with the rows of ops not reached set to zero. A
// NaN that the group's rule made for an off-path row stops there. A shared operand that the run
// computed (a value its group computed once for all samples, a sample every op of the group
// reads) passes through a gate of the whole: the gradient where a reader was reached, none
// where none was (Autobatch seed 214649: the sqrt of a value computed once, read only by
// samples off the path, got the zeros of a group that held samples on it, and made them NaN).
// A group whose ops all lie on the path of the backward that started the run gets no gate
// (they are reached). What a gate cannot stop: a rule that sums over the samples inside it,
// for a shared operand (a weight every sample reads), adds the off-path rows' terms in before
// any gate sees them, so a NaN that one of those terms makes (0 * inf: a sample's NaN or inf
// value, a division by a sample's zero) still reaches that operand.
Tensor Autobatch::Impl::row_gated(const Tensor& x, std::vector<int32_t> row_ops, bool whole) {
  const TensorImpl* xi = x.unsafe_impl();
  if (!xi->requires_grad || row_ops.empty() || !graph_) return x;
  if (run_on_path_ && !run_on_path_->empty() &&
      std::all_of(row_ops.begin(), row_ops.end(),
                  [&](int32_t r) { return (*run_on_path_)[static_cast<size_t>(r)] != 0; }))
    return x;
  if (row_ops.size() == 1) whole = true;
  DUET_ASSERT(whole || (x.dim() > 0 && xi->shape[0] == int64_t(row_ops.size())),
              "autobatch row gate: {} row ops for a batch of shape {}", row_ops.size(),
              detail::dims_str(detail::sym_dims(x)));
  ++stats_.row_gates;
  Tensor alias = detail::make_view(x, xi->shape, xi->strides, xi->offset);
  alias.unsafe_impl()->requires_grad = true;
  std::shared_ptr<SampleGraph> held = graph_;
  std::shared_ptr<detail::Node>& fn = detail::autograd_meta(*alias.unsafe_impl()).grad_fn;
  fn = node_over(
      row_gate_def(), x,
      [held, whole, rows = std::move(row_ops)](const Tensor& grad, const bool* needs, Tensor* gi) {
        held->open = held->open || detail::grad_mode();
        if (!needs[0]) return;
        if (held->open || held->reached.empty()) {
          gi[0] = grad;
          return;
        }
        const uint64_t backward = detail::backward_id();
        std::vector<char> on(rows.size());
        size_t count = 0;
        for (size_t k = 0; k < rows.size(); ++k) {
          const auto r = static_cast<size_t>(rows[k]);
          on[k] = r >= held->reached.size() || held->reached[r] == backward;
          count += static_cast<size_t>(on[k]);
        }
        if (count == 0) return;  // (no gradient: Note [No gradient] in engine.cpp)
        if (count == rows.size() || whole) {
          gi[0] = grad;
          return;
        }
        Shape s{static_cast<int64_t>(rows.size())};
        for (int64_t d = 1; d < grad.dim(); ++d) s.push_back(1);
        Tensor mask = detail::empty(s, DType::b8, Device::cpu());
        std::copy(on.begin(), on.end(), static_cast<char*>(mask.unsafe_impl()->data()));
        gi[0] = where(grad.device().is_cpu() ? mask : mask.to(grad.device()), grad, 0.0);
      });
  fn->keeper = held;  // (a later loss's backward may pass it again)
  return alias;
}

void Autobatch::Impl::mark_survivor(PendingOp& o, int32_t id, const Tensor& history) {
  graph_->survivors.push_back(id);
  std::shared_ptr<SampleGraph> held = graph_;
  detail::autograd_meta(*o.impl).grad_fn =
      node_over(mark_def(), history, [held, id](const Tensor& grad, const bool* needs, Tensor* gi) {
        held->open = held->open || detail::grad_mode();
        held->mark(id, detail::backward_id());
        if (needs[0]) gi[0] = grad;
      });
}

void Autobatch::Impl::start_graph(const OpIndex& index) {
  graph_ = std::make_shared<SampleGraph>();
  graph_->edge_at.assign(1, 0);
  for (size_t i = 0; i + 1 < index.edge_at.size(); ++i) {
    for (int32_t e = index.edge_at[i]; e < index.edge_at[i + 1]; ++e)
      if (index.edge_grad[static_cast<size_t>(e)])
        graph_->edges.push_back(index.edges[static_cast<size_t>(e)]);
    graph_->edge_at.push_back(static_cast<int32_t>(graph_->edges.size()));
  }
  graph_->grad = index.grad;
}

void Autobatch::Impl::keep_graph() { graph_->reached.assign(graph_->grad.size(), 0); }

}  // namespace duet
