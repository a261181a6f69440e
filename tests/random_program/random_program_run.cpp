// Random programs (random_program.h): the ops a program draws from, and running its steps on
// tensors (eagerly, or under compile, which traces the same code). The generator that builds
// programs is in random_program.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "eager/node.h"
#include "random_program.h"

namespace duet::test {
// ---- the program ----

const char* op_text(Op op) {
  static const char* names[] = {
#define X(n) #n,
      DUET_RANDOM_OPS(X)
#undef X
  };
  return names[int(op)];
}

// How often the generator tries each op (relative).
double op_weight(Op op) {
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::MatMul:
      return 4;
    case Op::Div:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Pow:
    case Op::Reshape:
    case Op::Slice:
    case Op::Where:
    case Op::Sum:
    case Op::Cast:
      return 3;
    case Op::Transpose:
    case Op::Permute:
    case Op::Unsqueeze:
    case Op::Expand:
    case Op::Cat:
    case Op::Mean:
    case Op::Max:
    case Op::Min:
    case Op::Gather:
    case Op::IndexSelect:
    case Op::Lt:
    case Op::Gt:
    case Op::Exp:
    case Op::Tanh:
      return 2;
    case Op::Argmax:
    case Op::Argmin:
    case Op::MseLoss:
    case Op::Unfold:
    case Op::Conv2d:
    case Op::RandnLike:
    case Op::Dropout:
    case Op::CrossEntropy:
    case Op::BceLogits:
    case Op::Embedding:
    case Op::Eq:
    case Op::Ne:
    case Op::Le:
    case Op::Ge:
    case Op::SqueezeAll:
    // The ops of the composites of core/api.def from masked_fill to einsum
    // (random_program_more.cpp).
    DUET_RANDOM_MORE_OP_CASES:
      return 0.7;
    case Op::MaxPool:
    case Op::AvgPool:
      return 1.5;  // only rank 4 operands: most tries do not apply
    case Op::UpdateBuffer:
      return 8;     // only programs with a buffer, once
    case Op::Cond:  // control flow: planned per program (Generator::make_steps), never drawn
    case Op::Scan:
    case Op::While:
    case Op::Take:
      return 0;
    default:
      return 1;
  }
}

bool floating(const Tensor& t) { return is_floating(t.dtype()); }

namespace {

Scalar scalar_of(const Step& st, double v) {
  return st.int_scalar ? Scalar(static_cast<int64_t>(v)) : Scalar(v);
}

// On the device of the step's first argument, as every tensor a step makes (the CUDA tests run
// the programs on GPU inputs).
Tensor index_tensor(const Step& st, Device device) {
  std::vector<double> v(st.index.begin(), st.index.end());
  return tensor(v, Shape(st.ishape), Options().dtype(DType::i64).device(device));
}

// Denominators and bases kept away from zero: |x| + 0.5.
Tensor safe(const Tensor& x) { return abs(x) + 0.5; }

Tensor unary(Op op, Tensor x) {
  switch (op) {
    case Op::Neg:
      return neg(std::move(x));
    case Op::Exp:
      return exp(clamp(x, -4.0, 4.0));
    case Op::Log:
      return log(abs(std::move(x)) + 0.5);
    case Op::Sqrt:
      return sqrt(abs(std::move(x)) + 0.25);
    case Op::Rsqrt:
      return rsqrt(abs(std::move(x)) + 0.25);
    case Op::Abs:
      return abs(std::move(x));
    case Op::Sin:
      return sin(std::move(x));
    case Op::Cos:
      return cos(std::move(x));
    case Op::Tanh:
      return tanh(std::move(x));
    case Op::Sigmoid:
      return sigmoid(std::move(x));
    case Op::Relu:
      return relu(std::move(x));
    case Op::Gelu:
      return gelu(x);
    case Op::Silu:
      return silu(x);
    case Op::Erf:
      return erf(std::move(x));
    case Op::LogSigmoid:
      return log_sigmoid(std::move(x));
    default:
      FAIL("not a unary op");
      return {};
  }
}

Tensor binary(Op op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case Op::Add:
      return add(a, b);
    case Op::Sub:
      return sub(a, b);
    case Op::Mul:
      return mul(a, b);
    case Op::Div:
      return div(a, safe(b));
    case Op::Maximum:
      return maximum(a, b);
    case Op::Minimum:
      return minimum(a, b);
    case Op::Pow:
      return pow(safe(a), clamp(b, -2.0, 2.0));
    default:
      FAIL("not a binary op");
      return {};
  }
}

Tensor binary(Op op, const Tensor& a, Scalar b) {  // b: safe by construction
  switch (op) {
    case Op::Add:
      return add(a, b);
    case Op::Sub:
      return sub(a, b);
    case Op::Mul:
      return mul(a, b);
    case Op::Div:
      return div(a, b);
    case Op::Maximum:
      return maximum(a, b);
    case Op::Minimum:
      return minimum(a, b);
    case Op::Pow:
      return pow(safe(a), b);
    default:
      FAIL("not a binary op");
      return {};
  }
}

Tensor binary(Op op, Scalar a, const Tensor& b) {
  switch (op) {
    case Op::Add:
      return add(a, b);
    case Op::Sub:
      return sub(a, b);
    case Op::Mul:
      return mul(a, b);
    case Op::Div:
      return div(a, safe(b));
    case Op::Maximum:
      return maximum(a, b);
    case Op::Minimum:
      return minimum(a, b);
    case Op::Pow:
      return pow(a, clamp(b, -3.0, 3.0));
    default:
      FAIL("not a binary op");
      return {};
  }
}

Tensor compare(Op op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case Op::Lt:
      return a < b;
    case Op::Le:
      return le(a, b);
    case Op::Gt:
      return gt(a, b);
    case Op::Ge:
      return a >= b;
    case Op::Eq:
      return eq(a, b);
    default:
      return a != b;
  }
}
Tensor compare(Op op, const Tensor& a, Scalar b) {
  switch (op) {
    case Op::Lt:
      return lt(a, b);
    case Op::Le:
      return a <= b;
    case Op::Gt:
      return a > b;
    case Op::Ge:
      return ge(a, b);
    case Op::Eq:
      return a == b;
    default:
      return ne(a, b);
  }
}
Tensor compare(Op op, Scalar a, const Tensor& b) {
  switch (op) {
    case Op::Lt:
      return lt(a, b);
    case Op::Le:
      return le(a, b);
    case Op::Gt:
      return gt(a, b);
    case Op::Ge:
      return ge(a, b);
    case Op::Eq:
      return eq(a, b);
    default:
      return ne(a, b);
  }
}

Dims dims_of(const std::vector<int64_t>& v) { return Dims(v); }

}  // namespace

namespace {

// A function of a control-flow step (a branch, a body) as the construct calls it: its steps run
// on its arguments and then the free values, which it reads from the enclosing program (the
// tracer lifts them).
Fn function_of(const std::vector<Step>* steps, const std::vector<int>* outs,
               std::vector<Tensor> free) {
  return [steps, outs, free = std::move(free)](const std::vector<Tensor>& args) {
    std::vector<Tensor> v = args;
    v.insert(v.end(), free.begin(), free.end());
    for (const Step& st : *steps) v.push_back(apply_step(st, v));
    std::vector<Tensor> r;
    for (int o : *outs) r.push_back(v[size_t(o)]);
    return r;
  };
}

thread_local bool cond_zeros = false;  // (CondZerosScope)

// The leaves that the tapes of `outs` reach.
std::vector<const void*> tape_leaves(const std::vector<Tensor>& outs) {
  std::vector<const void*> leaves;
  std::vector<const detail::Node*> stack, seen;
  for (const Tensor& t : outs) {
    if (!t.defined() || !t.requires_grad()) continue;
    detail::TensorImpl& impl = *t.unsafe_impl();
    if (impl.autograd && impl.autograd->grad_fn)
      stack.push_back(impl.autograd->grad_fn.get());
    else
      leaves.push_back(&impl);
  }
  while (!stack.empty()) {
    const detail::Node* n = stack.back();
    stack.pop_back();
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    for (const detail::InputEdge& e : n->inputs) {
      if (e.fn) stack.push_back(e.fn.get());
      if (e.leaf) leaves.push_back(e.leaf.get());
    }
  }
  return leaves;
}

// The results r of a cond step st that ran eagerly on its operands ops and free values free,
// given the gradient of CondZerosScope: the other branch runs on fresh leaves, and each operand
// or free value that its result k reaches joins result k as a zero (where() of a false mask,
// whose value is 0 whatever the operand's, NaN too), as the compiled cond's gradient of result k
// gives it zeros.
std::vector<Tensor> with_other_branch_zeros(std::vector<Tensor> r, const Step& st, bool taken,
                                            const std::vector<Tensor>& ops,
                                            const std::vector<Tensor>& free) {
  std::vector<Tensor> all = ops, leaves;
  all.insert(all.end(), free.begin(), free.end());
  for (const Tensor& o : all) {
    Tensor l = o.detach().clone();
    if (floating(o) && o.requires_grad()) l.requires_grad_(true);
    leaves.push_back(l);
  }
  std::vector<Tensor> other;
  try {
    const std::vector<Tensor> leaf_ops(leaves.begin(), leaves.begin() + std::ptrdiff_t(ops.size()));
    const std::vector<Tensor> leaf_free(leaves.begin() + std::ptrdiff_t(ops.size()), leaves.end());
    other = taken ? function_of(&st.body2, &st.outs2, leaf_free)(leaf_ops)
                  : function_of(&st.body, &st.outs, leaf_free)(leaf_ops);
  } catch (const Error&) {
    return r;  // (no zeros: the comparison with this run then fails as with plain eager)
  }
  for (size_t k = 0; k < r.size() && k < other.size(); ++k) {
    if (!floating(r[k])) continue;
    const std::vector<const void*> reached = tape_leaves({other[k]});
    for (size_t i = 0; i < all.size(); ++i)
      if (std::find(reached.begin(), reached.end(), leaves[i].unsafe_impl()) != reached.end())
        r[k] = r[k] + sum(where(zeros_like(all[i]).to(DType::b8), all[i], zeros_like(all[i])))
                          .to(r[k].dtype());
  }
  return r;
}

}  // namespace

CondZerosScope::CondZerosScope() : prev_(cond_zeros) { cond_zeros = true; }
CondZerosScope::~CondZerosScope() { cond_zeros = prev_; }

/// Runs one step on the values computed so far.
Tensor apply_step(const Step& st, const std::vector<Tensor>& v, Tuples* more) {
  auto arg = [&](size_t i) -> const Tensor& { return v[size_t(st.args[i])]; };
  auto results = [&](std::vector<Tensor> r) {  // a control-flow step's: the first is its value
    Tensor first = r[0];
    if (more) (*more)[v.size()] = std::move(r);
    return first;
  };
  switch (st.op) {
    case Op::Neg:
      if (st.mode == 2) return -arg(0);
      [[fallthrough]];
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Abs:
    case Op::Sin:
    case Op::Cos:
    case Op::Tanh:
    case Op::Sigmoid:
    case Op::Relu:
    case Op::Gelu:
    case Op::Silu:
    case Op::Erf:
    case Op::LogSigmoid:
      // mode 1: on a temporary, whose buffer the rvalue overloads may reuse.
      return st.mode == 1 ? unary(st.op, arg(0).clone()) : unary(st.op, arg(0));
    case Op::Clamp:
      return clamp(arg(0), st.s, st.s2);
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Pow:
      switch (st.mode) {
        case 1:
          return binary(st.op, arg(0), scalar_of(st, st.s));
        case 2:
          return binary(st.op, scalar_of(st, st.s), arg(0));
        case 3:  // the operators
          if (st.op == Op::Add) return arg(0) + arg(1);
          if (st.op == Op::Sub) return arg(0) - arg(1);
          if (st.op == Op::Mul) return arg(0) * arg(1);
          return arg(0) / safe(arg(1));
        default:
          return binary(st.op, arg(0), arg(1));
      }
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne:
      if (st.mode == 1) return compare(st.op, arg(0), scalar_of(st, st.s));
      if (st.mode == 2) return compare(st.op, scalar_of(st, st.s), arg(0));
      return compare(st.op, arg(0), arg(1));
    case Op::Where:
      if (st.mode == 1) return where(arg(0), arg(1), scalar_of(st, st.s));
      if (st.mode == 2) return where(arg(0), scalar_of(st, st.s), arg(1));
      return where(arg(0), arg(1), arg(2));
    case Op::MatMul:
      return matmul(arg(0), st.mode == 1 ? transpose(arg(1), -1, -2) : arg(1));
    case Op::Linear:
      return linear(arg(0), arg(1), st.args.size() > 2 ? arg(2) : Tensor());
    case Op::Reshape:
      return reshape(arg(0), Shape(st.ints));
    case Op::Transpose:
      return transpose(arg(0), st.ints[0], st.ints[1]);
    case Op::Permute:
      return permute(arg(0), dims_of(st.ints));
    case Op::Squeeze:
      return squeeze(arg(0), st.ints[0]);
    case Op::SqueezeAll:
      return squeeze(arg(0));
    case Op::Unsqueeze:
      return unsqueeze(arg(0), st.ints[0]);
    case Op::Expand:
      return expand(arg(0), Shape(st.ints));
    case Op::Slice:
      return slice(arg(0), st.ints[0], st.ints[1], st.ints[2], st.ints[3]);
    case Op::Cat:
    case Op::Stack: {
      std::vector<Tensor> parts;
      for (size_t i = 0; i < st.args.size(); ++i) parts.push_back(arg(i));
      return st.op == Op::Cat ? cat(parts, st.ints[0]) : stack(parts, st.ints[0]);
    }
    case Op::Sum:
      return sum(arg(0), dims_of(st.ints), st.mode);
    case Op::Mean:
      return mean(arg(0), dims_of(st.ints), st.mode);
    case Op::Max:
      return max(arg(0), dims_of(st.ints), st.mode);
    case Op::Min:
      return min(arg(0), dims_of(st.ints), st.mode);
    case Op::Argmax:
      return argmax(arg(0), st.ints[0], st.mode);
    case Op::Argmin:
      return argmin(arg(0), st.ints[0], st.mode);
    case Op::Softmax:
      return softmax(arg(0), st.ints[0]);
    case Op::LogSoftmax:
      return log_softmax(arg(0), st.ints[0]);
    case Op::LogSumExp:
      return logsumexp(arg(0), st.ints[0]);
    case Op::Gather:
      return gather(arg(0), st.ints[0], index_tensor(st, arg(0).device()));
    case Op::IndexSelect:
      return index_select(arg(0), st.ints[0], index_tensor(st, arg(0).device()));
    case Op::GatherArgmax:
      return gather(arg(0), st.ints[0], argmax(arg(0), st.ints[0], /*keepdim=*/true));
    case Op::ScatterAdd: {
      Tensor idx = index_tensor(st, arg(0).device());
      return scatter_add(arg(0), st.ints[0], idx, gather(arg(1), st.ints[0], idx));
    }
    case Op::SliceScatter: {
      const auto& i = st.ints;
      Tensor src = st.mode == 1 ? tanh(slice(arg(0), i[0], i[1], i[2], i[3])) : arg(1);
      return slice_scatter(arg(0), src, i[0], i[1], i[2], i[3]);
    }
    case Op::Cast:
      return arg(0).to(static_cast<DType>(st.mode));
    case Op::Clone:
      return arg(0).clone();
    case Op::Contiguous:
      return arg(0).contiguous();
    case Op::AddInplace:
    case Op::SubInplace:
    case Op::MulInplace:
    case Op::DivInplace: {
      // A fresh result (not a view, not read by anything yet), updated in place.
      Tensor t = (st.mode & 1) ? arg(0).clone() : arg(0) * st.s2;
      const bool scalar = st.mode & 2;
      switch (st.op) {
        case Op::AddInplace:
          scalar ? t.add_(st.s) : t.add_(arg(1));
          break;
        case Op::SubInplace:
          scalar ? t.sub_(st.s) : t.sub_(arg(1));
          break;
        // mul_ and div_ save self's value from before the write, which the gradient with
        // respect to the other operand needs; autograd then fails loudly (by design, see
        // core/dispatch.cpp), so the other operand is detached, before any op reads it: a
        // captured operand read only here then leaves the compiled guard alone
        // (grad_retraces in test_compile_random.cpp; seed 609637).
        case Op::MulInplace:
          scalar ? t.mul_(st.s) : t.mul_(arg(1).detach());
          break;
        default:
          scalar ? t.div_(st.s) : t.div_(safe(arg(1).detach()));
          break;
      }
      return t;
    }
    case Op::CopyInplace: {
      Tensor t = arg(0).clone();
      t.copy_(arg(1));
      return t;
    }
    case Op::LayerNorm: {
      Shape norm;  // size(k), not sizes(): a batch dim before them stays symbolic when compiled
      for (int64_t k = arg(0).dim() - st.ints[0]; k < arg(0).dim(); ++k)
        norm.push_back(arg(0).size(k));
      Tensor w = st.mode & 1 ? arg(1) : Tensor();
      Tensor b = st.mode & 2 ? arg(st.args.size() - 1) : Tensor();
      return layer_norm(arg(0), norm, w, b, st.s);
    }
    case Op::MseLoss:
      return mse_loss(arg(0), arg(1));
    case Op::CrossEntropy:
      return cross_entropy(arg(0), index_tensor(st, arg(0).device()));
    case Op::BceLogits:
      return binary_cross_entropy_with_logits(arg(0), sigmoid(arg(1)));
    case Op::Embedding:
      return embedding(arg(0), index_tensor(st, arg(0).device()));
    case Op::MaxPool:
      return max_pool2d(arg(0), st.ints[0], st.ints[1]);
    case Op::AvgPool:
      return avg_pool2d(arg(0), st.ints[0], st.ints[1]);
    case Op::Unfold: {
      const auto& i = st.ints;
      Tensor cols = unfold(arg(0), i[0], i[1], i[2]);
      // mode 1: and back (fold, the adjoint: overlapping windows are summed)
      return st.mode == 1 ? fold(cols, arg(0).size(2), arg(0).size(3), i[0], i[1], i[2]) : cols;
    }
    case Op::Conv2d:
      return conv2d(arg(0), arg(1), st.args.size() > 2 ? arg(2) : Tensor(), st.ints[0], st.ints[1]);
    case Op::Source: {
      // Tensors made inside the function: full, arange, eye. (Mode 0 reads every size, which
      // specializes a batch dim when compiled; the others read the last dim's only.)
      const Tensor& x = arg(0);
      const Options o = Options().dtype(x.dtype()).device(x.device());
      if (st.mode == 0) return x + full(x.sizes(), st.s, o);
      const int64_t n = x.size(x.dim() - 1);
      if (st.mode == 1)
        return x * arange(n, Options().device(x.device())) + st.s;  // i64 against the floating x
      return matmul(x, eye(n, o) * st.s);
    }
    case Op::RandnLike:
      return arg(0) +
             randn(arg(0).sizes(), Options().dtype(arg(0).dtype()).device(arg(0).device())) * 0.25;
    case Op::Dropout:
      return dropout(arg(0), st.s, st.mode == 1);
    case Op::UpdateBuffer: {
      // A running average of a value (detached, as the running stats of a batch norm): a
      // captured tensor written in place, which the compiled function writes back.
      Tensor b = arg(0);
      b.mul_(st.s2);
      const Tensor y = arg(1).detach();
      b.add_(st.mode == 1 ? mean(y) * (1 - st.s2) : y);
      return b;
    }
    DUET_RANDOM_MORE_OP_CASES:
      return apply_more(st, v);
    case Op::Cond: {
      // args: the predicate, ints[0] operands, then the free values the branches read.
      const size_t nop = size_t(st.ints[0]);
      std::vector<Tensor> ops, free;
      for (size_t i = 1; i < st.args.size(); ++i) (i <= nop ? ops : free).push_back(arg(i));
      std::vector<Tensor> r = cond(arg(0), function_of(&st.body, &st.outs, free),
                                   function_of(&st.body2, &st.outs2, free), ops);
      if (cond_zeros && grad_enabled() && !detail::is_traced(arg(0)))
        r = with_other_branch_zeros(std::move(r), st, arg(0).item<bool>(), ops, free);
      return results(std::move(r));
    }
    case Op::Scan: {
      // args: ints[0] carries, ints[1] xs (the first ints[2] of dim 0 when ints[2] >= 0), free.
      const size_t nc = size_t(st.ints[0]), nx = size_t(st.ints[1]);
      const int64_t len = st.ints[2];
      std::vector<Tensor> carry, xs, free;
      for (size_t i = 0; i < st.args.size(); ++i) {
        if (i < nc)
          carry.push_back(arg(i));
        else if (i < nc + nx)
          xs.push_back(len < 0 ? arg(i) : slice(arg(i), 0, 0, len));
        else
          free.push_back(arg(i));
      }
      return results(scan(function_of(&st.body, &st.outs, free), carry, xs));
    }
    case Op::While: {
      // {i, v} = {0, args[0]}; while i < k: {i + 1, v * s + c}, k args[1] (mode 1) or ints[0],
      // c the last arg (mode 2) or s2. Forward only: the results are detached.
      const Tensor k = st.mode & 1 ? arg(1) : Tensor();
      const Tensor c = st.mode & 2 ? arg(st.args.size() - 1) : Tensor();
      const int64_t kn = st.ints.empty() ? 0 : st.ints[0];
      const double s = st.s, s2 = st.s2;
      Fn below = [k, kn](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{k.defined() ? lt(x[0], k) : lt(x[0], Scalar(kn))};
      };
      Fn body = [c, s, s2](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{x[0] + 1, c.defined() ? x[1] * s + c : x[1] * s + s2};
      };
      std::vector<Tensor> r =
          while_loop(below, body,
                     {zeros(Shape{}, Options().dtype(DType::i64).device(arg(0).device())), arg(0)});
      return results({r[1].detach(), r[0].detach()});
    }
    case Op::Take:
      if (!more || !more->count(size_t(st.args[0]))) {
        FAIL("Take of a value that is not a control-flow step's");
        return {};
      }
      return more->at(size_t(st.args[0]))[size_t(st.mode)];
    case Op::Count:
      break;
  }
  FAIL("unknown op");
  return {};
}

std::vector<Tensor> run_values(const Program& p, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> v = inputs;
  v.reserve(inputs.size() + p.steps.size());
  Tuples more;
  for (const Step& st : p.steps) v.push_back(apply_step(st, v, &more));
  return v;
}

Program shrink_program(Program p, const std::function<std::vector<Tensor>(const Program&)>& values,
                       const std::function<bool(const Program&)>& fails,
                       const std::function<bool(Program&)>& more) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; p.outputs.size() > 1 && i < p.outputs.size();) {
      Program q = p;
      q.outputs.erase(q.outputs.begin() + std::ptrdiff_t(i));
      if (fails(q)) {
        p = q;
        changed = true;
      } else {
        ++i;
      }
    }
    for (size_t k = p.steps.size(); k-- > 0;) {
      const std::vector<Tensor> v = values(p);
      const int self = int(p.inputs.size() + k);
      bool used = std::count(p.outputs.begin(), p.outputs.end(), self) > 0;
      bool taken = false;  // a control-flow step whose other results Take steps read stays
      for (size_t j = k + 1; j < p.steps.size(); ++j) {
        used |= std::count(p.steps[j].args.begin(), p.steps[j].args.end(), self) > 0;
        taken |= p.steps[j].op == Op::Take && p.steps[j].args[0] == self;
      }
      if (taken) continue;
      std::vector<int> reps;
      if (!used) reps.push_back(-1);
      for (int x : p.steps[k].args)
        if (used && v[size_t(x)].sizes() == v[size_t(self)].sizes() &&
            v[size_t(x)].dtype() == v[size_t(self)].dtype())
          reps.push_back(x);
      for (int rep : reps)
        if (Program q = without_step(p, k, rep); fails(q)) {
          p = q;
          changed = true;
          break;
        }
    }
    if (more && more(p)) changed = true;
  }
  return p;
}

bool has_dtype(const Program& p, DType d) {
  for (const InputSpec& in : p.inputs)
    if (in.dtype == d) return true;
  const std::string name(dtype_name(d));
  for (const Step& st : p.steps)
    if (st.result.starts_with(name)) return true;
  return false;
}

Program without_step(const Program& p, size_t k, int rep) {
  Program q = p;
  const int v = int(p.inputs.size() + k);
  auto fix = [&](int& x) { x = x == v ? rep : x > v ? x - 1 : x; };
  q.steps.erase(q.steps.begin() + std::ptrdiff_t(k));
  for (size_t j = k; j < q.steps.size(); ++j)
    for (int& x : q.steps[j].args) fix(x);
  for (int& x : q.outputs) fix(x);
  return q;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::vector<uint64_t> seeds_from_env(const char* count, int fallback, const char* one) {
  std::vector<uint64_t> seeds;
  const char* s = std::getenv(one);
  if (s && *s)
    seeds.push_back(std::strtoull(s, nullptr, 10));
  else
    for (int i = 0, n = env_int(count, fallback), first = env_int("DUET_SEED_FIRST", 0); i < n; ++i)
      seeds.push_back(uint64_t(first) + uint64_t(i));
  return seeds;
}

std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs) {
  std::optional<Autocast> scope;
  if (is_low_precision(p.autocast)) scope.emplace(Device::cpu(), p.autocast);
  const std::vector<Tensor> v = run_values(p, inputs);
  std::vector<Tensor> out;
  for (int o : p.outputs) out.push_back(v[size_t(o)]);
  return out;
}

namespace {
bool comparison(Op op) {
  return op == Op::Lt || op == Op::Le || op == Op::Gt || op == Op::Ge || op == Op::Eq ||
         op == Op::Ne;
}
}  // namespace

std::vector<int> branches_taken(const Program& p, const Values& vals) {
  std::vector<int> out;
  if (std::none_of(p.steps.begin(), p.steps.end(), [](const Step& s) { return s.op == Op::Cond; }))
    return out;
  NoGradGuard ng;
  manual_seed(kRandSeed);
  const std::vector<Tensor> v = run_values(p, build_inputs(p, vals, false));
  const size_t n = p.inputs.size();
  for (const Step& st : p.steps) {
    if (st.op != Op::Cond) continue;
    const size_t pv = size_t(st.args[0]);
    int taken = v[pv].item<bool>() ? 1 : 0;
    // The predicate compares a value with a number (as the generator makes it): how close?
    if (pv >= n && comparison(p.steps[pv - n].op) && p.steps[pv - n].mode != 0) {
      const Step& ps = p.steps[pv - n];
      const double x = values(v[size_t(ps.args[0])])[0];
      if (!(std::fabs(x - ps.s) > 1e-3 * std::max(1.0, std::fabs(x)))) taken = -1;
    }
    out.push_back(taken);
  }
  return out;
}

}  // namespace duet::test
