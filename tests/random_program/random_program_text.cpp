// Random programs (random_program.h): the listings a failing test prints.
#include "random_program.h"

namespace duet::test {

std::string meta_text(const Tensor& t) {
  std::string s = fmt::format("{} {}", dtype_name(t.dtype()), t.sizes());
  if (!t.is_contiguous())
    s += fmt::format(" strides {}", Shape(t.strides().data(), t.strides().size()));
  return s;
}

namespace {

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string values_text(const std::vector<int>& vs, size_t from, size_t to, const char* sigil) {
  std::string s;
  for (size_t i = from; i < to && i < vs.size(); ++i)
    s += fmt::format("{}{}{}", i > from ? ", " : "", sigil, vs[i]);
  return s;
}

// A function of a control-flow step: its steps, then what it returns, one per line (each line
// starts with a newline and the indentation under the step's own line).
std::string function_text(const std::vector<Step>& steps, size_t first, const std::string& ret) {
  std::string s;
  for (size_t k = 0; k < steps.size(); ++k) s += "\n        " + step_text(steps[k], first + k, "$");
  return s + "\n        return " + ret;
}

// The listing of Cond, Scan, While and Take steps (see random_program.h).
std::string control_text(const Step& st, size_t value) {
  std::string s = fmt::format("%{} = {}(", value, op_text(st.op));
  const auto& a = st.args;
  switch (st.op) {
    case Op::Cond: {
      const size_t nop = size_t(st.ints[0]), n_in = a.size() - 1;
      s += fmt::format("%{}; operands {}", a[0], values_text(a, 1, 1 + nop, "%"));
      if (n_in > nop) s += "; free " + values_text(a, 1 + nop, a.size(), "%");
      s += ")  -> " + st.result + "\n      true branch (";
      for (size_t i = 0; i < n_in; ++i) s += fmt::format("{}${} = %{}", i ? ", " : "", i, a[1 + i]);
      s += "):" + function_text(st.body, n_in, values_text(st.outs, 0, st.outs.size(), "$"));
      s += "\n      false branch:" +
           function_text(st.body2, n_in, values_text(st.outs2, 0, st.outs2.size(), "$"));
      return s;
    }
    case Op::Scan: {
      const size_t nc = size_t(st.ints[0]), nx = size_t(st.ints[1]);
      const std::string len = st.ints[2] < 0 ? "" : fmt::format("[:{}]", st.ints[2]);
      s += "carry " + values_text(a, 0, nc, "%") + "; xs";
      for (size_t i = nc; i < nc + nx; ++i)
        s += fmt::format("{} %{}{}", i > nc ? "," : "", a[i], len);
      if (a.size() > nc + nx) s += "; free " + values_text(a, nc + nx, a.size(), "%");
      s += ")  -> " + st.result + "\n      body (";
      for (size_t i = 0; i < a.size(); ++i)
        s += fmt::format("{}${} = {}%{}{}", i ? ", " : "", i, i < nc ? "carry " : "", a[i],
                         i >= nc && i < nc + nx ? "[t]" : "");
      std::vector<int> ys(st.outs.begin() + std::ptrdiff_t(nc), st.outs.end());
      std::string ret = "carry " + values_text(st.outs, 0, nc, "$");
      if (!ys.empty()) ret += "; ys " + values_text(ys, 0, ys.size(), "$");
      return s + "):" + function_text(st.body, a.size(), ret);
    }
    case Op::While: {
      const std::string k = st.mode & 1 ? fmt::format("%{}", a[1]) : std::to_string(st.ints[0]);
      const std::string c = st.mode & 2 ? fmt::format("%{}", a.back()) : fmt::format("{}", st.s2);
      s += fmt::format("%{}; k {}{})  -> {}", a[0], k, st.mode & 2 ? "; free " + c : "", st.result);
      return s +
             fmt::format(
                 "\n      {{i, v}} = {{0, %{}}}; while i < {}: {{i, v}} = {{i + 1, v * {} + {}}}; "
                 "results detached",
                 a[0], k, st.s, c);
    }
    default:  // Take
      return s + fmt::format("%{}) result {}  -> {}", a[0], st.mode, st.result);
  }
}

}  // namespace

std::string step_text(const Step& st, size_t value, const char* sigil) {
  if (st.op == Op::Cond || st.op == Op::Scan || st.op == Op::While || st.op == Op::Take)
    return control_text(st, value);
  std::string s = fmt::format("{}{} = {}(", sigil, value, op_text(st.op));
  for (size_t i = 0; i < st.args.size(); ++i)
    s += fmt::format("{}{}{}", i ? ", " : "", sigil, st.args[i]);
  s += ")";
  if (!st.ints.empty()) s += " ints=" + ints_text(st.ints);
  if (!st.index.empty()) s += " index=" + ints_text(st.index) + " of " + ints_text(st.ishape);
  s += fmt::format(" s={} s2={}{} mode={}", st.s, st.s2, st.int_scalar ? " (int)" : "", st.mode);
  return s + "  -> " + st.result;
}

std::string program_text(const Program& p) {
  std::string s =
      fmt::format("seed {} ({}{} inputs, {} steps{}):\n", p.seed,
                  p.mix == Mix::Fusion      ? "fusion mix, "
                  : p.mix == Mix::LowFusion ? "fusion mix in bf16 and f16, "
                  : p.mix == Mix::LowMixed  ? "mixed mix in bf16 and f16, "
                  : p.mix == Mix::Batch     ? "batch mix, "
                                            : "",
                  p.inputs.size(), p.steps.size(), p.domain.discrete ? ", discrete values" : "");
  if (is_low_precision(p.autocast))
    s += fmt::format("  (run inside Autocast(Device::cpu(), {}))\n", dtype_name(p.autocast));
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const InputSpec& in = p.inputs[i];
    s += fmt::format("  %{} = input {} {} {}", i, dtype_name(in.dtype), in.shape,
                     layout_name(in.layout));
    if (in.made != in.shape) s += fmt::format(", expanded from {}", in.made);
    if (in.captured) s += in.buffer ? ", captured buffer" : ", captured";
    if (in.batched) s += ", dim 0 the batch dim B";
    s += "\n";
  }
  for (size_t k = 0; k < p.steps.size(); ++k)
    s += "  " + step_text(p.steps[k], p.inputs.size() + k) + "\n";
  s += "  outputs:";
  for (int o : p.outputs) s += fmt::format(" %{}", o);
  return s + "\n";
}

}  // namespace duet::test
