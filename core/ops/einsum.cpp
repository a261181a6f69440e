// einsum, lowered to permute, reshape, sum and matmul (Note [Einsum lowering]).
#include <algorithm>
#include <string>

#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"
#include "core/ops.h"

namespace duet {

namespace {

// An operand on its way through the lowering: its tensor and the letter of each dim.
struct Term {
  Tensor t;
  std::string letters;
};

// Sums the dims of `a` whose letters are not in `keep`.
Term sum_out(Term a, const std::string& keep) {
  Dims dims;
  std::string left;
  for (size_t i = 0; i < a.letters.size(); ++i) {
    if (keep.find(a.letters[i]) == std::string::npos)
      dims.push_back(static_cast<int64_t>(i));
    else
      left += a.letters[i];
  }
  if (dims.empty()) return a;
  return {sum(a.t, dims), left};
}

// The product of the dims of t at the positions of `letters` within `of`.
SymInt size_of(const SymDims& d, const std::string& of, const std::string& letters) {
  SymInt n = 1;
  for (char c : letters) n *= d[of.find(c)];
  return n;
}

// a and b contracted over the letters they share that `keep` lacks; the result's letters are
// batch (shared, kept), then a's own, then b's own.
Term contract(const Term& a, const Term& b, const std::string& keep) {
  std::string batch, con, la, lb;
  for (char c : a.letters) {
    const bool in_b = b.letters.find(c) != std::string::npos;
    const bool kept = keep.find(c) != std::string::npos;
    (in_b ? (kept ? batch : con) : la) += c;
  }
  for (char c : b.letters)
    if (a.letters.find(c) == std::string::npos) lb += c;
  auto order = [](const std::string& of, const std::string& want) {
    std::vector<int64_t> o;
    for (char c : want) o.push_back(static_cast<int64_t>(of.find(c)));
    return Dims(o);
  };
  const SymDims ad = detail::sym_dims(a.t), bd = detail::sym_dims(b.t);
  // a as (batch, la, con), b as (batch, con, lb): one batched matmul.
  Tensor ap = permute(a.t, order(a.letters, batch + la + con));
  Tensor bp = permute(b.t, order(b.letters, batch + con + lb));
  const SymInt nb = size_of(ad, a.letters, batch), nl = size_of(ad, a.letters, la),
               nk = size_of(ad, a.letters, con), nr = size_of(bd, b.letters, lb);
  Tensor prod =
      matmul(detail::reshape_dims(ap, {nb, nl, nk}), detail::reshape_dims(bp, {nb, nk, nr}));
  SymDims out;
  for (char c : batch) out.push_back(ad[a.letters.find(c)]);
  for (char c : la) out.push_back(ad[a.letters.find(c)]);
  for (char c : lb) out.push_back(bd[b.letters.find(c)]);
  return {detail::reshape_dims(prod, out), batch + la + lb};
}

}  // namespace

// Note [Einsum lowering]
// The equation is parsed into one string of letters per operand and the output's (implicit:
// the letters that appear once, in alphabetical order). Each operand first sums the letters no
// other operand and not the output has. Operands then contract left to right: the running term
// and the next operand keep the letters that the output or a later operand needs; the letters
// they share and do not keep are contracted by a batched matmul of the two, permuted and
// reshaped into (batch, rows, k) and (batch, k, cols). What remains is summed to the output's
// letters and permuted into their order. Every step is a view, a sum or a matmul, so the
// gradient is theirs and compile fuses and plans it as it does them.
Tensor einsum(std::string_view equation, const std::vector<Tensor>& tensors,
              std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("einsum", [&]() -> Tensor {
    std::string eq;
    for (char c : equation)
      if (c != ' ') eq += c;
    DUET_CHECK_VALUE(eq.find("...") == std::string::npos && eq.find('.') == std::string::npos,
                     "[einsum] ellipsis (\"...\") is not supported, in \"{}\"", equation);
    const size_t arrow = eq.find("->");
    const std::string lhs = eq.substr(0, arrow);
    std::vector<std::string> ins(1);
    for (char c : lhs) {
      if (c == ',') {
        ins.emplace_back();
        continue;
      }
      DUET_CHECK_VALUE((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'),
                       "[einsum] unexpected character '{}' in \"{}\"", c, equation);
      ins.back() += c;
    }
    DUET_CHECK_VALUE(ins.size() == tensors.size(),
                     "[einsum] \"{}\" names {} operands but {} tensors were given", equation,
                     ins.size(), tensors.size());
    std::string out;
    if (arrow != std::string::npos) {
      out = eq.substr(arrow + 2);
      for (char c : out) {
        DUET_CHECK_VALUE(((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) &&
                             lhs.find(c) != std::string::npos &&
                             std::count(out.begin(), out.end(), c) == 1,
                         "[einsum] output letter '{}' of \"{}\" must be a letter of an operand, "
                         "once",
                         c, equation);
      }
    } else {
      for (char c : lhs)
        if (c != ',' && std::count(lhs.begin(), lhs.end(), c) == 1) out += c;
      std::sort(out.begin(), out.end());
    }
    // Checks: ranks, no repeated letter within an operand, one size per letter.
    std::vector<Term> terms;
    std::string seen;
    std::vector<SymInt> sizes;
    for (size_t i = 0; i < ins.size(); ++i) {
      const std::string& s = ins[i];
      DUET_CHECK_SHAPE(static_cast<int64_t>(s.size()) == tensors[i].dim(),
                       "[einsum] operand {} (\"{}\") has {} letters but shape {}", i, s, s.size(),
                       detail::dims_str(detail::sym_dims(tensors[i])));
      const SymDims d = detail::sym_dims(tensors[i]);
      for (size_t k = 0; k < s.size(); ++k) {
        DUET_CHECK_VALUE(std::count(s.begin(), s.end(), s[k]) == 1,
                         "[einsum] letter '{}' repeats within operand {} (\"{}\"): diagonals are "
                         "not supported",
                         s[k], i, s);
        const size_t at = seen.find(s[k]);
        if (at == std::string::npos) {
          seen += s[k];
          sizes.push_back(d[k]);
        } else {
          DUET_CHECK_SHAPE(
              detail::size_is(tensors[i], static_cast<int64_t>(k), sizes[at], "einsum"),
              "[einsum] letter '{}' has size {} in operand {} but {} before (\"{}\")", s[k],
              d[k].str(), i, sizes[at].str(), equation);
        }
      }
      terms.push_back({tensors[i], s});
    }
    // The letters needed after operand i: the output's and those of later operands.
    auto needed_after = [&](size_t i) {
      std::string need = out;
      for (size_t j = i + 1; j < ins.size(); ++j) need += ins[j];
      return need;
    };
    // Each operand sums the letters no one else has.
    for (size_t i = 0; i < terms.size(); ++i) {
      std::string others = out;
      for (size_t j = 0; j < ins.size(); ++j)
        if (j != i) others += ins[j];
      terms[i] = sum_out(terms[i], others);
    }
    Term acc = terms[0];
    for (size_t i = 1; i < terms.size(); ++i) {
      const std::string keep = needed_after(i);
      acc = contract(sum_out(acc, keep + terms[i].letters), terms[i], keep);
    }
    acc = sum_out(acc, out);
    std::vector<int64_t> order;
    for (char c : out) order.push_back(static_cast<int64_t>(acc.letters.find(c)));
    if (order.empty()) return acc.t;
    return permute(acc.t, Dims(order));
  });
}

}  // namespace duet
