// duet_bench [--only W1,W4,...] [--threads N] [--device cpu|cuda|all] [--reps N] [--json]
//            [--ablate] [--profile DIR]
// Runs the standard workloads (docs/benchmarks.md) with their floors and prints a table, or one
// JSON array. With --ablate it runs instead each compiled workload (W2, W4, W5, W6, TT, or those
// of --only) with each pass switched off in turn (models.cpp). The CUDA workloads of W7, W2cuda,
// W3cuda, W4cuda and W6cuda (cuda.cpp), run with --device cuda or all (W2, W3, W4 and W6 in
// --only select them there too), or when --only names them or W7. With --profile DIR each CPU
// workload writes a Chrome-trace profile, DIR/<workload>.json (Note [Profiler]), and the CUDA
// workloads one, DIR/W7.json, with each kernel's device time.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "bench/bench.h"
#include "kernels/matrices.h"
#include "duet.h"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: duet_bench [--only "
               "W1,...,W9,C1,CT,CS,TT,RN,DP,AT,MEM,MB,VM,B1,B2,B3,W2cuda,W3cuda,W4cuda,W6cuda] "
               "[--threads N] "
               "[--device cpu|cuda|all] [--reps N] [--json] [--ablate] [--profile DIR]\n");
}

std::string json(const std::vector<bench::Result>& rs) {
  std::string s = "[\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    s += fmt::format(
        "  {{\"workload\": \"{}\", \"mode\": \"{}\", \"device\": \"{}\", \"threads\": {}, "
        "\"metric\": \"{}\", \"median\": {:.6g}, \"min\": {:.6g}, \"max\": {:.6g}",
        r.workload, r.mode, r.device, r.threads, r.metric, r.median, r.min, r.max);
    if (!r.variant.empty()) s += fmt::format(", \"variant\": \"{}\"", r.variant);
    if (r.n) s += fmt::format(", \"n\": {}", r.n);
    s += i + 1 < rs.size() ? "},\n" : "}\n";
  }
  return s + "]\n";
}

void table(const std::vector<bench::Result>& rs) {
  std::printf("%-6s %-9s %-6s %-3s %-20s %-18s %12s %12s %12s\n", "id", "mode", "device", "thr",
              "variant", "metric", "median", "min", "max");
  for (const auto& r : rs) {
    std::string var = r.variant + (r.n ? fmt::format("{}n={}", r.variant.empty() ? "" : " ", r.n)
                                       : std::string());
    std::printf("%-6s %-9s %-6s %-3d %-20s %-18s %12.4g %12.4g %12.4g\n", r.workload.c_str(),
                r.mode.c_str(), r.device.c_str(), r.threads, var.c_str(), r.metric.c_str(),
                r.median, r.min, r.max);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Config cfg;
  std::set<std::string> only;
  bool as_json = false, ablation = false;
  std::string profile_dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--only") {
      std::stringstream ss(next());
      for (std::string w; std::getline(ss, w, ',');) only.insert(w);
    } else if (a == "--threads") {
      cfg.threads = std::stoi(next());
    } else if (a == "--device") {
      cfg.device = next();
    } else if (a == "--reps") {
      cfg.reps = std::max(1, std::stoi(next()));
    } else if (a == "--json") {
      as_json = true;
    } else if (a == "--ablate") {
      ablation = true;
    } else if (a == "--profile") {
      profile_dir = next();
    } else {
      usage();
      return 2;
    }
  }
  // The profiles' folder is made now, with its parents: a folder found missing only when the
  // first profile is written would cost the whole run.
  if (!profile_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(profile_dir, ec);
    if (ec) {
      std::fprintf(stderr, "duet_bench: cannot make the folder %s for --profile: %s\n",
                   profile_dir.c_str(), ec.message().c_str());
      return 2;
    }
  }
  if (cfg.device != "cpu" && cfg.device != "cuda" && cfg.device != "all") {
    usage();
    return 2;
  }
  duet::set_num_threads(cfg.threads);
  bench::set_blas_threads(cfg.threads);
  // Which kernels oneDNN runs here decides the bf16 rows (AMX, AVX512-BF16, or emulation).
  std::fprintf(stderr, "duet_bench: oneDNN dispatches to %s\n", bench::onednn_isa().c_str());
  std::fprintf(stderr, "duet_bench: small f32 products run on %s\n",
               duet::kernels::small_product_library().c_str());
  auto want = [&](const char* w) { return only.empty() || only.count(w); };
  std::vector<bench::Result> rs;
  const bool cpu = cfg.device != "cuda";
  if (cpu && ablation) {
    bench::run_ablation(cfg, want, rs);
  } else if (cpu) {
    // With --profile DIR, each workload runs under a Profiler writing DIR/<workload>.json (the
    // timings then include the profiler's cost).
    auto run = [&](const char* w, void (*fn)(const bench::Config&, std::vector<bench::Result>&)) {
      std::unique_ptr<duet::Profiler> prof;
      if (!profile_dir.empty())
        prof = std::make_unique<duet::Profiler>(profile_dir + "/" + w + ".json");
      fn(cfg, rs);
    };
    if (want("W1")) run("W1", bench::run_w1);
    if (want("W2")) run("W2", bench::run_w2);
    if (want("W3")) run("W3", bench::run_w3);
    if (want("W4")) run("W4", bench::run_w4);
    if (want("W5")) run("W5", bench::run_w5);
    if (want("W6")) run("W6", bench::run_w6);
    if (want("W8")) run("W8", bench::run_w8);
    if (want("W9")) run("W9", bench::run_w9);
    // On request, not standard workloads: conv2d, compile time, the two-tower model.
    if (only.count("C1")) run("C1", bench::run_c1);
    if (only.count("CT")) run("CT", bench::run_ct);
    if (only.count("CS")) run("CS", bench::run_cs);
    if (only.count("TT")) run("TT", bench::run_tt);
    if (only.count("RN")) run("RN", bench::run_rn);
    if (only.count("DP")) run("DP", bench::run_dp);
    if (only.count("AT")) run("AT", bench::run_at);
    if (only.count("MEM")) run("MEM", bench::run_mem);
    if (only.count("MB")) run("MB", bench::run_mb);
    if (only.count("VM")) run("VM", bench::run_vm);
    if (only.count("B1")) run("B1", bench::run_b1);
    if (only.count("B2")) run("B2", bench::run_b2);
    if (only.count("B3")) run("B3", bench::run_b3);
  }
  // CUDA workloads: on --device cuda or all, or when --only names them.
  const bool on_cuda = cfg.device != "cpu" && !ablation;
  auto want_cuda = [&](const char* w, const char* cpu_twin) {
    return only.count(w) || (on_cuda && (only.empty() || only.count(cpu_twin)));
  };
  // W7 names all four.
  auto want_w7 = [&](const char* w) {
    const std::string cpu_twin = std::string(w).substr(0, 2);
    return want_cuda(w, cpu_twin.c_str()) || only.count("W7") > 0;
  };
  std::string cuda_wanted;
  for (const char* w : {"W2cuda", "W3cuda", "W4cuda", "W6cuda"})
    if (want_w7(w)) cuda_wanted += (cuda_wanted.empty() ? "" : ", ") + std::string(w);
  if (!cuda_wanted.empty()) {
#ifdef DUET_WITH_CUDA
    // With --profile DIR, the CUDA workloads run under one Profiler writing DIR/W7.json, with
    // each kernel's device time (Note [Device time in profiles]); compiled calls then run their
    // plans step by step, not as CUDA graphs, so the timings are not the benchmark's.
    std::unique_ptr<duet::Profiler> prof;
    if (!profile_dir.empty()) prof = std::make_unique<duet::Profiler>(profile_dir + "/W7.json");
    bench::run_cuda(cfg, want_w7, rs);
#else
    std::fprintf(stderr, "%s: skipped (duet_bench was built without CUDA)\n", cuda_wanted.c_str());
#endif
  }
  rs.push_back(bench::single({"all", "process", "cpu", "peak_rss_bytes", "", cfg.threads},
                             bench::peak_rss_bytes()));
  // Under mpirun (DP), rank 0 reports for the job.
  if (duet::dist::is_initialized() && duet::dist::rank() != 0) return 0;
  if (as_json)
    std::fputs(json(rs).c_str(), stdout);
  else
    table(rs);
  return 0;
}
