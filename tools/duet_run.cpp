// duet-run: runs a program that duet::save wrote on NumPy .npy files, and can time it.
//
//   duet-run MODEL.duet [--input [NAME=]FILE.npy]... [--output [NAME=]FILE.npy]...
//            [--bench N] [--device cpu|cuda]
//
// Inputs are given by name (the program's input names: arg0, arg1, ...) or in order, and every
// input must be given. Without --output, each output is printed; with it, written as .npy (an
// output named, or the outputs in order). --bench N (digits, 1 to 10000000) runs the program N
// more times after three warm-up runs and prints the median and the fastest time of a run.
// --device cuda moves the program and its inputs to the GPU. Errors are printed as duet reports
// them, and the exit status is 1; bad usage exits 2. Nothing aborts: an exception that is not a
// duet::Error is printed too, and exits 1.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "duet.h"

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "duet-run: %s\nusage: duet-run MODEL.duet [--input [NAME=]FILE.npy]... "
               "[--output [NAME=]FILE.npy]... [--bench N] [--device cpu|cuda]\n",
               why);
  return 2;
}

// "name=path" -> {name, path}; "path" -> {"", path}.
std::pair<std::string, std::string> split(const std::string& a) {
  const size_t eq = a.find('=');
  if (eq == std::string::npos) return {"", a};
  return {a.substr(0, eq), a.substr(eq + 1)};
}

// The most runs --bench takes: each run's time is kept, to take the median.
constexpr long long kMaxBench = 10'000'000;

// --bench's count: digits only ("1e3", "5x" and "-1" are refused), from 1 to kMaxBench.
bool parse_bench(const char* v, long long& out) {
  if (!v) return false;
  const char* end = v + std::strlen(v);
  const auto [at, ec] = std::from_chars(v, end, out);
  return end != v && ec == std::errc() && at == end && out >= 1 && out <= kMaxBench;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage("no program file");
  std::string model;
  std::vector<std::pair<std::string, std::string>> inputs, outputs;
  long long bench = 0;
  std::string device = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--input" || a == "--output") {
      const char* v = value();
      if (!v) return usage(("missing value after " + a).c_str());
      (a == "--input" ? inputs : outputs).push_back(split(v));
    } else if (a == "--bench") {
      const char* v = value();
      if (!parse_bench(v, bench))
        return usage(fmt::format("--bench takes a whole number of runs from 1 to {}, got \"{}\"",
                                 kMaxBench, v ? v : "")
                         .c_str());
    } else if (a == "--device") {
      const char* v = value();
      if (!v || (std::string(v) != "cpu" && std::string(v) != "cuda"))
        return usage("--device takes cpu or cuda");
      device = v;
    } else if (!a.empty() && a[0] == '-') {
      return usage(("unknown option " + a).c_str());
    } else if (model.empty()) {
      model = a;
    } else {
      return usage(("a second program file " + a).c_str());
    }
  }
  if (model.empty()) return usage("no program file");
  try {
    duet::Program p = duet::load(model);
    const duet::Device dev = device == "cuda" ? duet::Device::cuda() : duet::Device::cpu();
    if (dev.is_cuda()) p.to(dev);
    const std::vector<std::string> names = p.input_names();
    std::map<std::string, duet::Tensor> feeds;
    size_t next = 0;
    for (const auto& [name, path] : inputs) {
      std::string n = name;
      if (n.empty()) {
        if (next >= names.size())
          throw duet::ValueError(fmt::format("[duet-run] {} takes {} inputs ({}); {} is one more",
                                             model, names.size(), fmt::join(names, ", "), path));
        n = names[next++];
      }
      if (std::find(names.begin(), names.end(), n) == names.end())
        throw duet::ValueError(fmt::format("[duet-run] {} has no input named \"{}\" (it has {})",
                                           model, n, fmt::join(names, ", ")));
      feeds[n] = duet::data::read_npy(path).to(dev);
    }
    std::vector<std::string> missing;
    for (const std::string& n : names)
      if (!feeds.count(n)) missing.push_back(n);
    if (!missing.empty())
      throw duet::ValueError(fmt::format(
          "[duet-run] {} takes {} input{} ({}); not given: {}. Give each as --input NAME=FILE.npy "
          "(or --input FILE.npy, in order), e.g. --input {}=FILE.npy",
          model, names.size(), names.size() == 1 ? "" : "s", fmt::join(names, ", "),
          fmt::join(missing, ", "), missing[0]));
    std::vector<duet::Tensor> out = p.run(feeds);
    if (bench > 0) {
      for (int k = 0; k < 3; ++k) p.run(feeds);
      std::vector<double> ms;
      for (long long k = 0; k < bench; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<duet::Tensor> r = p.run(feeds);
        if (dev.is_cuda()) duet::cuda::synchronize();
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      std::vector<double> sorted = ms;
      std::sort(sorted.begin(), sorted.end());
      std::printf("%lld runs on %s: median %.4f ms, fastest %.4f ms\n", bench, device.c_str(),
                  sorted[sorted.size() / 2], sorted.front());
    }
    const std::vector<std::string> out_names = p.output_names();
    if (outputs.empty()) {
      for (size_t k = 0; k < out.size(); ++k)
        fmt::print("{}: {}\n", k < out_names.size() ? out_names[k] : fmt::format("out{}", k),
                   out[k]);
    }
    size_t next_out = 0;
    for (const auto& [name, path] : outputs) {
      size_t k = next_out++;
      if (!name.empty()) {
        auto it = std::find(out_names.begin(), out_names.end(), name);
        if (it == out_names.end())
          throw duet::ValueError(fmt::format("[duet-run] {} has no output named \"{}\" (it has {})",
                                             model, name, fmt::join(out_names, ", ")));
        k = static_cast<size_t>(it - out_names.begin());
      }
      if (k >= out.size())
        throw duet::ValueError(fmt::format("[duet-run] {} has {} outputs; --output {} is one more",
                                           model, out.size(), path));
      duet::data::write_npy(path, out[k]);
    }
  } catch (const duet::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Whatever escapes is reported and exits 1: a duet::Error above, anything else here.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "duet-run: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "duet-run: an unknown exception\n");
  }
  return 1;
}
