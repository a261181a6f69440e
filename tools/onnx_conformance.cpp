// duet_onnx_conformance: runs ONNX backend node test cases through import_onnx, eagerly and
// compiled, and compares with their expected outputs as the ONNX backend test runner does: the
// exact shape and dtype, values within rtol 1e-3, atol 1e-7 (NaN matching NaN).
//
//   duet_onnx_conformance DIR --set NAME [--write TABLE] [--check TABLE] [--filter TEXT] [-v]
//
// DIR holds one folder per case (model.onnx, test_data_set_*/input_N.pb, output_N.pb). The
// results go to stdout, one line per case, then the totals. --write puts them into TABLE (the
// section of NAME in docs/onnx.md, between its markers), --check fails (exit 1) when a case TABLE
// lists as passing in a mode fails now, or one it lists as unsupported fails otherwise than with
// the DTypeError of an element type duet has no dtype for.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "duet.h"
#include "trace/onnx/onnx_import.h"
#include "trace/onnx/onnx_proto.h"

namespace fs = std::filesystem;
using namespace duet;

namespace {

enum class Result { Pass, Fail, Unsupported };

const char* word(Result r) {
  switch (r) {
    case Result::Pass:
      return "pass";
    case Result::Fail:
      return "fail";
    case Result::Unsupported:
      return "unsupported";
  }
  return "?";
}

struct Outcome {
  Result result = Result::Fail;
  std::string why;  // for a failure: the first mismatch or the error
};

struct DataSet {
  std::vector<Tensor> inputs, outputs;
};

std::vector<fs::path> numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> r;
  for (int i = 0;; ++i) {
    fs::path p = dir / fmt::format("{}_{}.pb", prefix, i);
    if (!fs::exists(p)) break;
    r.push_back(p);
  }
  return r;
}

std::vector<DataSet> read_sets(const fs::path& dir) {
  std::vector<DataSet> sets;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("test_data_set_"))
      dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& d : dirs) {
    DataSet s;
    for (const fs::path& p : numbered(d, "input"))
      s.inputs.push_back(detail::onnx_io::tensor_from_proto(detail::onnx_io::read_tensor(p),
                                                            p.filename().string()));
    for (const fs::path& p : numbered(d, "output"))
      s.outputs.push_back(detail::onnx_io::tensor_from_proto(detail::onnx_io::read_tensor(p),
                                                             p.filename().string()));
    sets.push_back(std::move(s));
  }
  return sets;
}

// "" when got matches want; else the first difference, in words.
std::string compare(const Tensor& got_in, const Tensor& want, size_t k) {
  if (!got_in.defined()) return fmt::format("output {} is undefined", k);
  Tensor got = got_in.detach().to(Device::cpu());
  if (got.dtype() != want.dtype())
    return fmt::format("output {}: dtype {}, expected {}", k, got.dtype(), want.dtype());
  if (got.sizes() != want.sizes())
    return fmt::format("output {}: shape {}, expected {}", k, got.sizes(), want.sizes());
  if (got.numel() == 0) return "";
  std::vector<double> g = got.to(DType::f64).to_vector<double>();
  std::vector<double> w = want.to(DType::f64).to_vector<double>();
  if (!is_floating(want.dtype())) {  // integers compare exactly (as i64, not through double)
    std::vector<int64_t> gi = got.to(DType::i64).to_vector<int64_t>();
    std::vector<int64_t> wi = want.to(DType::i64).to_vector<int64_t>();
    for (size_t i = 0; i < gi.size(); ++i)
      if (gi[i] != wi[i])
        return fmt::format("output {}: element {} is {}, expected {}", k, i, gi[i], wi[i]);
    return "";
  }
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = g[i], b = w[i];
    if (std::isnan(a) && std::isnan(b)) continue;
    if (a == b) continue;  // infinities of one sign included
    if (!(std::abs(a - b) <= 1e-7 + 1e-3 * std::abs(b)))
      return fmt::format("output {}: element {} is {}, expected {}", k, i, a, b);
  }
  return "";
}

// The DTypeError of a tensor type duet does not import (trace/onnx/onnx_proto.cpp): one it has no
// dtype for; as opposed to an op refusing a dtype.
bool unsupported_dtype(const DTypeError& e) {
  const std::string_view w = e.what();
  return w.find("which duet has no dtype for") != std::string_view::npos;
}

// Runs one case in one mode.
Outcome run_case(const fs::path& dir, bool compiled) {
  try {
    Program p = import_onnx((dir / "model.onnx").string());
    std::vector<DataSet> sets = read_sets(dir);
    for (const DataSet& s : sets) {
      std::vector<Tensor> out = compiled ? p(s.inputs) : p.eager(s.inputs);
      if (out.size() != s.outputs.size())
        return {Result::Fail, fmt::format("{} outputs, expected {}", out.size(), s.outputs.size())};
      for (size_t k = 0; k < out.size(); ++k) {
        std::string why = compare(out[k], s.outputs[k], k);
        if (!why.empty()) return {Result::Fail, why};
      }
    }
    return {Result::Pass, ""};
  } catch (const DTypeError& e) {
    if (unsupported_dtype(e)) return {Result::Unsupported, e.what()};
    return {Result::Fail, e.what()};
  } catch (const std::exception& e) {
    return {Result::Fail, e.what()};
  }
}

std::string first_line(std::string s) {
  const size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  for (char& c : s)
    if (c == '|') c = '/';
  return s;
}

std::string begin_marker(const std::string& set) {
  return fmt::format("<!-- conformance {} begin -->", set);
}
std::string end_marker(const std::string& set) {
  return fmt::format("<!-- conformance {} end -->", set);
}

struct Row {
  std::string name;
  Outcome eager, compiled;
};

std::string section(const std::string& set, const std::vector<Row>& rows) {
  int pass_e = 0, pass_c = 0, unsupported = 0;
  for (const Row& r : rows) {
    pass_e += r.eager.result == Result::Pass;
    pass_c += r.compiled.result == Result::Pass;
    unsupported += r.eager.result == Result::Unsupported;
  }
  const int supported = static_cast<int>(rows.size()) - unsupported;
  auto pct = [&](int k) { return supported ? 100.0 * k / supported : 0.0; };
  std::ostringstream o;
  o << begin_marker(set) << "\n\n";
  o << fmt::format(
      "{} cases: {} with an element type duet does not import (unsupported), {} supported.\n\n",
      rows.size(), unsupported, supported);
  o << "| mode | pass | fail | pass rate of the supported cases |\n|---|---|---|---|\n";
  o << fmt::format("| eager | {} | {} | {:.1f}% |\n", pass_e, supported - pass_e, pct(pass_e));
  o << fmt::format("| compiled | {} | {} | {:.1f}% |\n\n", pass_c, supported - pass_c, pct(pass_c));
  o << "<details><summary>Every case</summary>\n\n";
  o << "| case | eager | compiled | why it fails |\n|---|---|---|---|\n";
  for (const Row& r : rows) {
    const Outcome& bad = r.eager.result == Result::Fail ? r.eager : r.compiled;
    o << fmt::format("| {} | {} | {} | {} |\n", r.name, word(r.eager.result),
                     word(r.compiled.result),
                     bad.result == Result::Fail ? first_line(bad.why) : "");
  }
  o << "\n</details>\n\n" << end_marker(set) << "\n";
  return o.str();
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream b;
  b << f.rdbuf();
  return b.str();
}

// The cases the table's section lists with `result` in a mode: {name, compiled}.
std::set<std::pair<std::string, bool>> listed(const std::string& text, const std::string& set,
                                              const std::string& result) {
  std::set<std::pair<std::string, bool>> r;
  const size_t b = text.find(begin_marker(set)), e = text.find(end_marker(set));
  if (b == std::string::npos || e == std::string::npos) return r;
  std::istringstream in(text.substr(b, e - b));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("| test_")) continue;
    std::vector<std::string> cells;
    std::istringstream l(line.substr(1));
    std::string cell;
    while (std::getline(l, cell, '|')) {
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
    }
    if (cells.size() < 3) continue;
    if (cells[1] == result) r.insert({cells[0], false});
    if (cells[2] == result) r.insert({cells[0], true});
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, set, write, check, filter;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--set")
      set = next();
    else if (a == "--write")
      write = next();
    else if (a == "--check")
      check = next();
    else if (a == "--filter")
      filter = next();
    else if (a == "-v")
      verbose = true;
    else
      dir = a;
  }
  if (dir.empty() || set.empty()) {
    std::cerr << "usage: duet_onnx_conformance DIR --set NAME [--write TABLE] [--check TABLE] "
                 "[--filter TEXT] [-v]\n";
    return 2;
  }
  if (!fs::is_directory(dir)) {
    std::cerr << "duet_onnx_conformance: " << dir << " is not a folder of cases\n";
    return 2;
  }
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "model.onnx") &&
        e.path().filename().string().find(filter) != std::string::npos)
      cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  std::vector<Row> rows;
  for (const fs::path& c : cases) {
    Row r{c.filename().string(), run_case(c, false), run_case(c, true)};
    if (verbose || r.eager.result == Result::Fail || r.compiled.result == Result::Fail)
      std::cout << fmt::format(
          "{}: eager {}, compiled {}{}\n", r.name, word(r.eager.result), word(r.compiled.result),
          r.eager.result == Result::Fail
              ? "\n  eager: " + first_line(r.eager.why)
              : (r.compiled.result == Result::Fail ? "\n  compiled: " + first_line(r.compiled.why)
                                                   : std::string()));
    rows.push_back(std::move(r));
  }
  const std::string sec = section(set, rows);
  std::cout << sec.substr(0, sec.find("<details>")) << "\n";
  int status = 0;
  if (!check.empty()) {
    const std::string text = read_text(check);
    const auto passes = listed(text, set, "pass"), unsupported = listed(text, set, "unsupported");
    if (passes.empty()) {
      std::cerr << "duet_onnx_conformance: " << check << " has no section for " << set << "\n";
      return 1;
    }
    // A listed pass must pass; a case listed as unsupported must still raise the DTypeError of
    // an element type duet has no dtype for (or pass), never fail otherwise or crash.
    for (const Row& r : rows)
      for (bool compiled : {false, true}) {
        const Outcome& o = compiled ? r.compiled : r.eager;
        const bool lost = passes.count({r.name, compiled}) && o.result != Result::Pass;
        const bool broke = unsupported.count({r.name, compiled}) && o.result == Result::Fail;
        if (lost || broke) {
          std::cout << fmt::format("REGRESSION {} ({}): {}\n", r.name,
                                   compiled ? "compiled" : "eager", first_line(o.why));
          status = 1;
        }
      }
  }
  if (!write.empty()) {
    std::string text = read_text(write);
    const size_t b = text.find(begin_marker(set)), e = text.find(end_marker(set));
    if (b == std::string::npos || e == std::string::npos) {
      std::cerr << "duet_onnx_conformance: " << write << " has no markers for " << set << "\n";
      return 1;
    }
    text.replace(b, e + end_marker(set).size() + 1 - b, sec);
    // The list of mapped ops, from the importer's table.
    const std::string ob = "<!-- onnx ops begin -->", oe = "<!-- onnx ops end -->";
    const size_t p = text.find(ob), q = text.find(oe);
    if (p != std::string::npos && q != std::string::npos) {
      const std::vector<std::string> ops = detail::onnx_import::mapped_ops();
      text.replace(p, q - p,
                   fmt::format("{}\n{} ops: {}.\n", ob, ops.size(), fmt::join(ops, ", ")));
    }
    std::ofstream(write) << text;
  }
  return status;
}
