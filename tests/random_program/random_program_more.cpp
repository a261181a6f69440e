// Random programs (random_program.h): the steps of the composites of core/api.def from masked_fill
// to einsum (masked_fill, tril/triu, split/chunk, flip, roll, pad, the *_like creators and draws,
// cumsum, var/std, max/min_with_indices, sort/argsort/topk, einsum, one_hot, nll_loss,
// multinomial): how the generator proposes them and how a step runs. Dims whose size the op reads
// as an integer (the pieces of split, roll's shift, topk's k, cumsum's rounds, reflect's bound) are
// never batch dims, so that the batch mix keeps its batch symbolic.
#include <algorithm>
#include <string>

#include "core/ops.h"
#include "random_program.h"

namespace duet::test {

namespace {
// The einsum equations of Op::Einsum's two-operand forms (ints[0] = 1..5); form 0 is one
// operand, its output letters in ints[1..].
const char* const kEinsumForms[] = {"",        "ij,jk->ik",    "ij,jk->ki",
                                    "ij,j->i", "bij,bjk->bik", "i,j->ij"};
const char kLetters[] = "ijkl";
}  // namespace

bool Generator::propose_more(Op op, Step& st) {
  auto numeric = [](const Tensor& t) { return t.dtype() != DType::b8; };
  auto fl = [](const Tensor& t) { return floating(t); };
  // A dim of value a that is not a batch dim, -1 when every dim is one.
  auto fixed_dim = [&](int a) -> int64_t {
    const std::vector<bool> b = batch_dims(a);
    std::vector<int64_t> d;
    for (size_t e = 0; e < b.size(); ++e)
      if (!b[e]) d.push_back(int64_t(e));
    return d.empty() ? -1 : d[size_t(irand(0, int64_t(d.size()) - 1))];
  };
  switch (op) {
    case Op::MaskedFill: {
      int a = pick([](const Tensor&) { return true; });
      if (a < 0) return false;
      const Shape sa = at(a).sizes();
      int b = pick([&](const Tensor& t) {
        return can_broadcast(sa, t.sizes()) && broadcast_shape(sa, t.sizes()) == sa;
      });
      if (b < 0 || !broadcasts_into(b, a)) return false;
      st.args = {a, b};
      st.s2 = at(b).dtype() == DType::b8 ? 0 : urand(-0.5, 0.5);  // the mask: b > s2
      st.s = nice_scalar();
      st.int_scalar = !floating(at(a));
      if (st.int_scalar) st.s = std::round(st.s);
      if (floating(at(a)) && chance(0.3)) {  // a 0-d tensor value: the mean of a floating value
        int c = pick(fl);
        if (c < 0) return false;
        st.args.push_back(c);
        st.mode = 1;
      }
      return true;
    }
    case Op::Tril: {
      int a = pick([](const Tensor& t) { return t.dim() >= 2; });
      if (a < 0) return false;
      st.args = {a};
      st.mode = chance(0.5);
      st.ints = {irand(-2, 2)};
      return true;
    }
    case Op::Split: {
      int a = pick([](const Tensor& t) { return t.dim() >= 1 && t.numel() > 0; });
      if (a < 0) return false;
      const int64_t d = fixed_dim(a);
      if (d < 0) return false;
      const int64_t n = at(a).sizes()[d];
      st.args = {a};
      st.mode = int(irand(0, 2));  // split by size, chunk, split by two sizes
      int64_t param = 0, pieces = 2;
      if (st.mode == 0) {
        param = irand(1, n);
        pieces = (n + param - 1) / param;
      } else if (st.mode == 1) {
        param = irand(1, n + 1);
        const int64_t size = (n + param - 1) / param;
        pieces = (n + size - 1) / size;
      } else {
        param = irand(0, n);
      }
      st.ints = {wrap_or_negative(d, at(a).dim()), param, irand(0, pieces - 1)};
      return true;
    }
    case Op::Flip: {
      int a = pick([](const Tensor&) { return true; });
      if (a < 0) return false;
      st.args = {a};
      for (int64_t d = 0; d < std::max<int64_t>(at(a).dim(), 1); ++d)
        if (chance(0.5)) st.ints.push_back(wrap_or_negative(d, std::max<int64_t>(at(a).dim(), 1)));
      return true;
    }
    case Op::Roll: {
      int a = pick([](const Tensor&) { return true; });
      if (a < 0) return false;
      st.args = {a};
      if (at(a).dim() == 0 || (!has_batch_dim(a) && chance(0.3))) {
        st.ints = {0, irand(-7, 7)};  // flattened: no dims, one shift
        return !has_batch_dim(a);
      }
      const int64_t d = fixed_dim(a);
      if (d < 0) return false;
      st.ints = {1, wrap_or_negative(d, at(a).dim()), irand(-5, 5)};  // {count, dims, shifts}
      const int64_t e = fixed_dim(a);
      if (e != d && chance(0.5)) st.ints = {2, d, e, irand(-5, 5), irand(-5, 5)};
      return true;
    }
    case Op::Pad: {
      int a = pick([&](const Tensor& t) { return t.dim() >= 1 && numeric(t); });
      if (a < 0) return false;
      const Tensor& A = at(a);
      const std::vector<bool> b = batch_dims(a);
      st.args = {a};
      st.mode = chance(0.35);  // reflect
      const int64_t p = irand(1, std::min<int64_t>(2, A.dim()));
      for (int64_t k = 0; k < p; ++k) {
        const int64_t d = A.dim() - 1 - k, n = A.sizes()[d];
        if (b[size_t(d)]) return false;
        int64_t l, r;
        if (st.mode == 1) {
          l = irand(0, std::min<int64_t>(n - 1, 3));
          r = irand(0, std::min<int64_t>(n - 1, 3));
        } else {
          l = irand(-1, 2);
          r = irand(-1, 2);
          if (n + l + r < 1) l = r = 1;
        }
        st.ints.push_back(l);
        st.ints.push_back(r);
      }
      st.s = floating(A) ? nice_scalar() : std::round(nice_scalar());
      st.int_scalar = !floating(A);
      return true;
    }
    case Op::Like: {
      int a = pick(numeric);
      if (a < 0) return false;
      st.args = {a};
      st.mode = int(irand(0, floating(at(a)) ? 4 : 2));  // zeros, ones, full, rand, randn
      st.s = floating(at(a)) ? nice_scalar() : std::round(nice_scalar());
      st.int_scalar = !floating(at(a));
      return true;
    }
    case Op::Cumsum: {
      int a = pick([](const Tensor&) { return true; });
      if (a < 0) return false;
      const int64_t d = at(a).dim() ? fixed_dim(a) : 0;
      if (d < 0) return false;
      st.args = {a};
      st.ints = {wrap_or_negative(d, std::max<int64_t>(at(a).dim(), 1))};
      return true;
    }
    case Op::Var: {
      int a = pick([](const Tensor& t) { return floating(t) && t.dim() >= 1; });
      if (a < 0) return false;
      const Tensor& A = at(a);
      const std::vector<bool> b = batch_dims(a);
      st.args = {a};
      int64_t count = 1;
      for (int64_t d = 0; d < A.dim(); ++d)
        if (!b[size_t(d)] && chance(0.5)) {
          st.ints.push_back(wrap_or_negative(d, A.dim()));
          count *= A.sizes()[d];
        }
      if (st.ints.empty()) return false;
      st.s = double(irand(0, 1));                                // the correction
      st.mode = (chance(0.4) ? 1 : 0) | (chance(0.25) ? 2 : 0);  // keepdim, std
      return count > st.s;
    }
    case Op::MaxIndices: {
      int a = pick(numeric);
      if (a < 0) return false;
      st.args = {a};
      const int64_t r = std::max<int64_t>(at(a).dim(), 1);
      st.ints = {wrap_or_negative(irand(0, r - 1), r)};
      st.mode = int(irand(0, 7));  // bit 1: min, 2: the indices, 4: keepdim
      return true;
    }
    case Op::Sort: {
      int a = pick([](const Tensor& t) { return t.numel() > 0; });
      if (a < 0) return false;
      const Tensor& A = at(a);
      const int64_t d = A.dim() ? fixed_dim(a) : 0;
      if (d < 0) return false;
      const int64_t n = A.dim() ? A.sizes()[d] : 1;
      if (n > 64) return false;  // argsort compares every pair
      st.args = {a};
      st.mode = int(irand(0, 3));  // sort values, argsort, topk values, topk indices
      if (A.dtype() == DType::b8 && st.mode != 1) return false;
      st.ints = {wrap_or_negative(d, std::max<int64_t>(A.dim(), 1)), irand(1, n), chance(0.5)};
      return true;
    }
    case Op::Einsum: {
      const int form = int(irand(0, 5));
      if (form == 0) {
        int a = pick([](const Tensor& t) { return floating(t) && t.dim() >= 1 && t.dim() <= 4; });
        if (a < 0) return false;
        std::vector<int64_t> letters(size_t(at(a).dim()));
        for (size_t i = 0; i < letters.size(); ++i) letters[i] = int64_t(i);
        for (int64_t i = int64_t(letters.size()) - 1; i > 0; --i)
          std::swap(letters[size_t(i)], letters[size_t(irand(0, i))]);
        letters.resize(size_t(irand(0, int64_t(letters.size()))));
        st.args = {a};
        st.ints = {0};
        st.ints.insert(st.ints.end(), letters.begin(), letters.end());
        return true;
      }
      const int64_t ra = form == 4 ? 3 : form == 5 ? 1 : 2;
      int a = pick([&](const Tensor& t) { return floating(t) && t.dim() == ra; });
      if (a < 0) return false;
      const Shape sa = at(a).sizes();
      int b = pick([&](const Tensor& t) {
        if (!floating(t) || t.dtype() != at(a).dtype()) return false;
        const Shape& s = t.sizes();
        switch (form) {
          case 1:
          case 2:
            return s.size() == 2 && s[0] == sa[1];
          case 3:
            return s.size() == 1 && s[0] == sa[1];
          case 4:
            return s.size() == 3 && s[0] == sa[0] && s[1] == sa[2];
          default:
            return s.size() == 1 && s[0] * sa[0] <= kMaxNumel;
        }
      });
      if (b < 0) return false;
      st.args = {a, b};
      st.ints = {form};
      return true;
    }
    case Op::OneHot: {
      int a = pick([&](const Tensor& t) { return numeric(t) && t.dim() >= 1 && t.dim() <= 2; });
      if (a < 0) return false;
      const int64_t d = fixed_dim(a);
      if (d < 0) return false;
      st.args = {a};
      st.ints = {d, at(a).sizes()[d] + irand(0, 2)};  // the classes: argmax along d, then more
      return true;
    }
    case Op::NllLoss: {
      int a = pick([](const Tensor& t) { return floating(t) && t.dim() >= 1 && t.dim() <= 2; });
      if (a < 0) return false;
      class_targets(st, a);
      const auto n = static_cast<int64_t>(st.index.size());
      if (n > 1 && chance(0.3)) st.index[size_t(irand(0, n - 1))] = -100;  // ignored
      st.mode = int(irand(0, 2));                                          // mean, sum, none
      return true;
    }
    case Op::Multinomial: {
      int a = pick([](const Tensor& t) {
        return floating(t) && t.dim() >= 1 && t.dim() <= 2 && t.sizes()[t.dim() - 1] >= 2;
      });
      if (a < 0) return false;
      if (batch_dims(a)[size_t(at(a).dim() - 1)]) return false;
      const int64_t n = at(a).sizes()[at(a).dim() - 1];
      st.args = {a};
      st.mode = chance(0.5);  // with replacement
      st.ints = {irand(1, st.mode ? 6 : n)};
      return true;
    }
    default:
      return false;
  }
}

Tensor apply_more(const Step& st, const std::vector<Tensor>& v) {
  auto arg = [&](size_t i) -> const Tensor& { return v[size_t(st.args[i])]; };
  const Scalar s = st.int_scalar ? Scalar(static_cast<int64_t>(st.s)) : Scalar(st.s);
  switch (st.op) {
    case Op::MaskedFill: {
      const Tensor mask = arg(1).dtype() == DType::b8 ? arg(1) : gt(arg(1), st.s2);
      if (st.mode == 1) return masked_fill(arg(0), mask, mean(arg(2)));
      return masked_fill(arg(0), mask, s);
    }
    case Op::Tril:
      return st.mode ? triu(arg(0), st.ints[0]) : tril(arg(0), st.ints[0]);
    case Op::Split: {
      const int64_t d = st.ints[0], p = st.ints[1];
      std::vector<Tensor> parts;
      if (st.mode == 0) parts = split(arg(0), p, d);
      if (st.mode == 1) parts = chunk(arg(0), p, d);
      if (st.mode == 2) parts = split(arg(0), {p, arg(0).size(d) - p}, d);
      return parts[std::min(size_t(st.ints[2]), parts.size() - 1)];
    }
    case Op::Flip:
      return flip(arg(0), Dims(st.ints));
    case Op::Roll: {
      const size_t n = size_t(st.ints[0]);
      if (n == 0) return roll(arg(0), st.ints[1]);
      std::vector<int64_t> dims(st.ints.begin() + 1, st.ints.begin() + 1 + n),
          shifts(st.ints.begin() + 1 + n, st.ints.end());
      return roll(arg(0), Dims(shifts), Dims(dims));
    }
    case Op::Pad:
      return pad(arg(0), st.ints, st.mode ? "reflect" : "constant", st.mode ? Scalar(0) : s);
    case Op::Like: {
      const Tensor& x = arg(0);
      switch (st.mode) {
        case 0:
          return x + zeros_like(x);
        case 1:
          return x - ones_like(x);
        case 2:
          return x * full_like(x, s);
        case 3:
          return x + rand_like(x) * 0.25;
        default:
          return x + randn_like(x) * 0.25;
      }
    }
    case Op::Cumsum:
      return cumsum(arg(0), st.ints[0]);
    case Op::Var: {
      const bool keepdim = st.mode & 1;
      return (st.mode & 2) ? duet::std(arg(0), Dims(st.ints), st.s, keepdim)
                           : var(arg(0), Dims(st.ints), st.s, keepdim);
    }
    case Op::MaxIndices: {
      auto [values, indices] = (st.mode & 1) ? min_with_indices(arg(0), st.ints[0], st.mode & 4)
                                             : max_with_indices(arg(0), st.ints[0], st.mode & 4);
      return (st.mode & 2) ? indices : values;
    }
    case Op::Sort: {
      const int64_t d = st.ints[0], k = st.ints[1];
      const bool desc = st.ints[2];
      if (st.mode == 1) return argsort(arg(0), d, desc);
      auto [values, indices] = st.mode >= 2 ? topk(arg(0), k, d, desc) : sort(arg(0), d, desc);
      return st.mode == 3 ? indices : values;
    }
    case Op::Einsum: {
      if (st.ints[0] != 0) return einsum(kEinsumForms[st.ints[0]], {arg(0), arg(1)});
      std::string eq(kLetters, size_t(arg(0).dim()));
      eq += "->";
      for (size_t i = 1; i < st.ints.size(); ++i) eq += kLetters[st.ints[i]];
      return einsum(eq, {arg(0)});
    }
    case Op::OneHot:
      return one_hot(argmax(arg(0), st.ints[0]), st.ints[1]);
    case Op::NllLoss: {
      std::vector<double> t(st.index.begin(), st.index.end());
      Tensor target =
          tensor(t, Shape(st.ishape), Options().dtype(DType::i64).device(arg(0).device()));
      const char* reductions[] = {"mean", "sum", "none"};
      return nll_loss(log_softmax(arg(0), -1), target, reductions[st.mode]);
    }
    case Op::Multinomial:
      return multinomial(softmax(arg(0), -1), st.ints[0], st.mode == 1);
    default:
      throw InternalError("apply_more: not an op of random_program_more.cpp");
  }
}

}  // namespace duet::test
