// The fused CUDA kernels' source generator (cuda/fused.h), checked without a GPU: NVRTC needs no
// device, so every generated program must compile for sm_90 here, on the CPU machines of CI.
// The programs: one per compute dtype and reduction mode using every fusable op and every input
// dtype, and the fused groups that the fusion pass finds in the random programs of the fusion
// mix. The elementwise kernels also run on the host: the same source, compiled by the C++
// compiler over a small CUDA shim (threads run one after another, which an elementwise kernel
// allows), launched with the grid, block, vmask and vec that the runner computes, must give the
// interpreter's values in every layout (dense, broadcast, strided, misaligned; vector and scalar
// paths). (Running the kernels on a GPU, against eager, is test_cuda_compile's.)
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "cuda/fused.h"
#include "random_program.h"
#include "trace/compile.h"
#include "trace/plan/fusion.h"
#include "util.h"

namespace duet::detail {
extern const char* const kCodegenCompiler;
extern const char* const kCodegenEigenInclude;
extern const char* const kCodegenFunctorsH;
extern const char* const kCodegenFusedAbiH;
}  // namespace duet::detail

namespace duet::test {
namespace {

using kernels::FusedInstr;
using kernels::FusedProgram;
using kernels::FusedReduce;

std::string check_program(const FusedProgram& p) {
  const std::string src = cuda::detail::fused_source(p);
  const std::string log = cuda::detail::nvrtc_check(src, 90);
  return log.empty() ? "" : log + "\nprogram:\n" + p.str() + "\nsource:\n" + src;
}

// Every fusable op, reading inputs of every dtype, with T and b8 outputs.
FusedProgram every_op(DType t, FusedReduce reduce, OpId reduce_op) {
  FusedProgram p;
  p.dtype = t;
  p.in_dtypes = {t,          t,          DType::b8,
                 DType::i32, DType::i64, t == DType::f32 ? DType::f64 : DType::f32};
  int16_t next = static_cast<int16_t>(p.in_dtypes.size());
  auto emit = [&](OpId op, std::initializer_list<int16_t> src, DType to = DType::f32) {
    FusedInstr in;
    in.op = op;
    in.dst = next++;
    int k = 0;
    for (int16_t s : src) in.src[k++] = s;
    in.to = to;
    p.code.push_back(in);
    return in.dst;
  };
  int16_t acc = 0;
  // The families of core/elementwise.def, each row once.
  for (int i = 0; i < kNumOps; ++i)
    if (unary_math(OpId(i)) != UnaryMath::None) acc = emit(OpId::Add, {acc, emit(OpId(i), {1})});
  for (int i = 0; i < kNumOps; ++i)
    if (is_binary_family(OpId(i))) acc = emit(OpId(i), {acc, int16_t(3)});
  int16_t flag = 2;
  for (int i = 0; i < kNumOps; ++i)
    if (is_compare(OpId(i)))
      flag = emit(OpId::Where,
                  {flag, emit(OpId(i), {acc, int16_t(4)}), emit(OpId(i), {int16_t(5), acc})});
  const int16_t as_b8 = emit(OpId::Cast, {acc}, DType::b8);
  const int16_t as_t = emit(OpId::Cast, {as_b8}, t);
  const int16_t copy = emit(OpId::Copy, {as_t});
  const int16_t last = emit(OpId::Where, {flag, acc, copy});
  p.outputs = {last, as_b8};
  p.out_dtypes = {t, DType::b8};
  p.reduce = reduce;
  p.reduce_op = reduce_op;
  p.reduce_src = reduce == FusedReduce::None ? int16_t(-1) : last;
  p.num_regs = next;
  return p;
}

// The fused groups that the fusion pass finds in the random programs of the fusion mix with
// seeds 0..seeds-1 (compiled on the CPU; programs the compiled face rejects are left out).
std::vector<FusedProgram> random_fusion_groups(uint64_t seeds) {
  std::vector<FusedProgram> out;
  for (uint64_t seed = 0; seed < seeds; ++seed) {
    Program p;
    p.seed = seed;
    Generator gen(p, seed, Mix::Fusion);
    if (!gen.build()) continue;
    auto f = compile([&p](std::vector<Tensor> xs) { return run_program(p, xs); });
    try {
      f(build_inputs(p, gen.first_values(), false));
    } catch (const Error&) {
      continue;  // test_compile_random's business
    }
    for (const detail::FusionGroup& g : detail::find_fusion_groups(f.graph()))
      out.push_back(g.program);
  }
  return out;
}

}  // namespace

TEST_CASE("cuda codegen: every fusable op, dtype and reduction compiles with NVRTC") {
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  for (DType t : {DType::f32, DType::f64}) {
    for (auto [reduce, op] :
         {std::pair{FusedReduce::None, OpId::Sum}, std::pair{FusedReduce::Inner, OpId::Sum},
          std::pair{FusedReduce::Inner, OpId::Max}, std::pair{FusedReduce::Outer, OpId::Min},
          std::pair{FusedReduce::Outer, OpId::Sum}}) {
      INFO(dtype_name(t) << " reduce " << int(reduce) << " " << op_name(op));
      const FusedProgram p = every_op(t, reduce, op);
      CHECK(check_program(p) == "");
      ++n;
    }
  }
  // A program with no elementwise output (only the reduction) and one with a single input.
  FusedProgram q = every_op(DType::f32, FusedReduce::Inner, OpId::Sum);
  q.outputs.clear();
  q.out_dtypes.clear();
  CHECK(check_program(q) == "");
  MESSAGE(
      fmt::format("{} programs compiled in {:.1f} s", n + 1,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
}

// Built side by side, as a plan's first run builds its kernels (Note [Parallel NVRTC builds]).
TEST_CASE("cuda codegen: the fused groups of random fusion programs compile with NVRTC") {
  const auto t0 = std::chrono::steady_clock::now();
  std::set<std::string> seen;
  std::vector<std::string> sources;
  std::vector<const FusedProgram*> programs;
  const std::vector<FusedProgram> groups = random_fusion_groups(16);
  for (const FusedProgram& g : groups) {
    std::string src = cuda::detail::fused_source(g);
    if (!seen.insert(src).second) continue;
    sources.push_back(std::move(src));
    programs.push_back(&g);
  }
  CHECK(sources.size() >= 15);
  const std::vector<cuda::detail::NvrtcBuilt> built = cuda::detail::nvrtc_build_all(sources, 90, 4);
  REQUIRE(built.size() == sources.size());
  for (size_t i = 0; i < built.size(); ++i) {
    INFO(programs[i]->str());
    CHECK(built[i].log == "");
    CHECK(!built[i].image.empty());
  }
  MESSAGE(fmt::format(
      "{} fused groups, {} distinct kernels compiled in {:.1f} s", groups.size(), sources.size(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  // Each image as NVRTC makes it alone, in its own slot (a slot mixed up between threads, or a
  // build sharing state with another, would differ).
  for (size_t i = 0; i < 6 && i < sources.size(); ++i) {
    INFO(programs[i]->str());
    const std::vector<cuda::detail::NvrtcBuilt> alone =
        cuda::detail::nvrtc_build_all({sources[i]}, 90, 1);
    CHECK(alone[0].image == built[i].image);
  }
}

// Note [Parallel NVRTC builds]: an error on a builder thread must reach the caller (an escaping
// exception would end the process), and the work not yet started is dropped.
TEST_CASE("cuda codegen: side-by-side builds rethrow a builder's error once all are done") {
  for (int threads : {1, 4}) {
    INFO(threads << " threads");
    std::atomic<int> ran{0};
    bool threw = false;
    try {
      cuda::detail::run_side_by_side(200, threads, [&](size_t i) {
        ++ran;
        if (i == 3) throw ValueError("build 3 failed");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a build takes a while
      });
    } catch (const ValueError& e) {
      threw = std::string(e.what()).find("build 3 failed") != std::string::npos;
    }
    CHECK(threw);
    CHECK(ran.load() >= 4);
    CHECK(ran.load() < 200);
  }
  std::vector<int> seen(50, 0);
  cuda::detail::run_side_by_side(50, 4, [&](size_t i) { ++seen[i]; });
  CHECK(std::count(seen.begin(), seen.end(), 1) == 50);  // each index once
}

TEST_CASE("cuda codegen: the kernel cache key covers the source, the headers and every option") {
  using cuda::detail::kernel_cache_key;
  using cuda::detail::NvrtcHeader;
  const std::string src = cuda::detail::fused_source(every_op(DType::f32, FusedReduce::None, {}));
  const std::vector<NvrtcHeader> headers = cuda::detail::fused_headers();
  const cuda::detail::NvrtcOptions o = cuda::detail::nvrtc_options(90);
  // What prepare() hashes is what NVRTC builds from: the embedded headers, and these options.
  REQUIRE(headers.size() == 2);
  CHECK(headers[0].text == detail::kCodegenFusedAbiH);
  CHECK(headers[1].text == detail::kCodegenFunctorsH);
  CHECK(check_program(every_op(DType::f32, FusedReduce::None, {})) == "");
  const uint64_t key = kernel_cache_key(src, headers, o.options);
  CHECK(key == kernel_cache_key(src, headers, o.options));
  std::set<uint64_t> keys = {key};
  int variants = 0;
  auto differs = [&](const std::string& what, const std::string& s,
                     const std::vector<NvrtcHeader>& h, const std::vector<std::string>& opts) {
    INFO(what);
    ++variants;
    CHECK(keys.insert(kernel_cache_key(s, h, opts)).second);
  };
  differs("source", src + " ", headers, o.options);
  for (size_t i = 0; i < headers.size(); ++i) {
    std::vector<NvrtcHeader> h = headers;
    h[i].text += "\n// edited\n";
    differs("text of " + headers[i].name, src, h, o.options);
    h = headers;
    h[i].name += "x";
    differs("name of " + headers[i].name, src, h, o.options);
  }
  std::vector<NvrtcHeader> swapped = headers;
  std::swap(swapped[0].text, swapped[1].text);
  differs("header texts swapped", src, swapped, o.options);
  differs(
      "a header more", src,
      [&] {
        std::vector<NvrtcHeader> h = headers;
        h.push_back({"extra.h", ""});
        return h;
      }(),
      o.options);
  // Each option dropped, and each changed.
  for (size_t i = 0; i < o.options.size(); ++i) {
    std::vector<std::string> opts = o.options;
    opts.erase(opts.begin() + static_cast<std::ptrdiff_t>(i));
    differs("without " + o.options[i], src, headers, opts);
    opts = o.options;
    opts[i] += "0";
    differs("changed " + o.options[i], src, headers, opts);
  }
  std::vector<std::string> opts = o.options;
  opts.push_back("-I/elsewhere");
  differs("an include directory more", src, headers, opts);
  differs("another architecture", src, headers, cuda::detail::nvrtc_options(80).options);
  // Text moved across a boundary between two parts.
  opts = o.options;
  opts.back() += opts[0];
  opts.erase(opts.begin());
  differs("options joined", src, headers, opts);
  CHECK(keys.size() == static_cast<size_t>(variants) + 1);
  // The options name the architecture and the math flags.
  CHECK(o.cubin);
  CHECK(std::find(o.options.begin(), o.options.end(), "--gpu-architecture=sm_90") !=
        o.options.end());
  // Contraction stays on (as for the eager kernels); Add, Sub and Mul opt out in the source.
  CHECK(std::find(o.options.begin(), o.options.end(), "--fmad=false") == o.options.end());
}

TEST_CASE("cuda codegen: a kernel's launch bounds are the largest block the launcher gives it") {
  // Shapes from one element to long rows and long columns, on a small and a large device.
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},      {1, 33},  {1, 1 << 20}, {1 << 20, 1},
                                                {7, 3},      {3, 700}, {64, 4096},   {100000, 3},
                                                {3, 100000}, {2, 257}};
  for (DType t : {DType::f32, DType::f64}) {
    for (auto [reduce, op] :
         {std::pair{FusedReduce::None, OpId::Sum}, std::pair{FusedReduce::Inner, OpId::Max},
          std::pair{FusedReduce::Outer, OpId::Sum}}) {
      const FusedProgram p = every_op(t, reduce, op);
      INFO(dtype_name(t) << " reduce " << int(reduce));
      const std::string src = cuda::detail::fused_source(p);
      // The bound the source declares, and the largest block launched over the shapes.
      CHECK(src.find("__launch_bounds__(kBlockThreads)") != std::string::npos);
      const size_t at = src.find("kBlockThreads = ");
      REQUIRE(at != std::string::npos);
      const unsigned bound =
          static_cast<unsigned>(std::stoul(src.substr(at + std::strlen("kBlockThreads = "))));
      CHECK(bound == cuda::detail::fused_block_limit(reduce));
      unsigned most = 0;
      for (int sms : {1, 132})
        for (auto [outer, inner] : shapes) {
          kernels::DuetFusedArgs a{};
          a.outer = outer;
          a.inner = inner;
          const cuda::detail::FusedLaunch l = cuda::detail::fused_launch(p, a, sms);
          INFO(outer << " x " << inner << " on " << sms << " SMs: block " << l.block_x << " x "
                     << l.block_y);
          CHECK(l.block_x * l.block_y <= bound);
          most = std::max(most, l.block_x * l.block_y);
        }
      CHECK(most == bound);
      CHECK(check_program(p) == "");
    }
  }
}

TEST_CASE("cuda codegen: a reduction of a few long rows or columns splits across the device") {
  // On 132 multiprocessors: a full sum (one row) and a sum over a tall batch into few columns
  // split in slices, about two blocks a multiprocessor; many rows or columns, or short ones,
  // do not.
  struct Case {
    FusedReduce reduce;
    int64_t outer, inner;
    bool split;
  };
  const Case cases[] = {
      {FusedReduce::Inner, 1, 1 << 24, true},  {FusedReduce::Inner, 4, 100000, true},
      {FusedReduce::Inner, 1, 3000, false},    {FusedReduce::Inner, 4096, 100000, false},
      {FusedReduce::Outer, 1 << 20, 16, true}, {FusedReduce::Outer, 65536, 1024, true},
      {FusedReduce::Outer, 300, 16, false},    {FusedReduce::Outer, 65536, 8192, false},
  };
  for (const Case& c : cases) {
    INFO(int(c.reduce) << ": " << c.outer << " x " << c.inner);
    const FusedProgram p = every_op(DType::f32, c.reduce, OpId::Sum);
    kernels::DuetFusedArgs a{};
    a.outer = c.outer;
    a.inner = c.inner;
    const cuda::detail::FusedLaunch l = cuda::detail::fused_launch(p, a, 132);
    CHECK((l.nsplit > 1) == c.split);
    if (!c.split) continue;
    const int64_t results = c.reduce == FusedReduce::Inner ? c.outer : c.inner;
    const int64_t blocks =
        c.reduce == FusedReduce::Inner ? int64_t(l.grid) : int64_t(l.grid) * l.grid_y;
    CHECK(blocks >= 132);
    CHECK(l.results == results);
    CHECK(l.partials == results * l.nsplit);
    // Every partial is written once: the strides tile [0, partials).
    std::vector<int> hit(static_cast<size_t>(l.partials));
    for (int64_t r = 0; r < l.results; ++r)
      for (int64_t k = 0; k < l.nsplit; ++k) ++hit[r * l.part_stride + k * l.split_stride];
    CHECK(std::count(hit.begin(), hit.end(), 1) == l.partials);
  }
}

namespace {

// What the host needs of CUDA to run a generated kernel. A block's threads are fibers
// (ucontext) on the calling thread: each runs until it waits at a barrier (__syncthreads, or its
// warp's half of a shuffle), then the next runnable one goes on. One block runs at a time.
constexpr const char* kShim = R"duet_src(#pragma once
#include <ucontext.h>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __launch_bounds__(...)
// A barrier for `count` fibers: the last to arrive starts a new generation, which lets the others
// go on.
struct DuetEmuBarrier {
  unsigned count = 0, arrived = 0, generation = 0;
};
struct DuetEmuFiber {
  ucontext_t ctx;
  dim3 thread;
  const DuetEmuBarrier* waits_on = nullptr;  // null: runnable
  unsigned generation = 0;
  bool done = false;
};
inline ucontext_t duet_emu_scheduler;
inline DuetEmuFiber* duet_emu_current = nullptr;
inline DuetEmuBarrier duet_emu_block, duet_emu_warps[32];
inline double duet_emu_lanes[1024];
inline void duet_emu_wait(DuetEmuBarrier& b) {
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  DuetEmuFiber* f = duet_emu_current;
  f->waits_on = &b;
  f->generation = b.generation;
  swapcontext(&f->ctx, &duet_emu_scheduler);  // the scheduler sets threadIdx on the way back
}
inline void __syncthreads() { duet_emu_wait(duet_emu_block); }
// Lane l gets lane l + off's value within its warp of 32, else its own (CUDA's rule).
template <class T>
T __shfl_down_sync(unsigned, T v, int off) {
  const unsigned tid = threadIdx.x + threadIdx.y * blockDim.x;
  DuetEmuBarrier& warp = duet_emu_warps[tid / 32];
  duet_emu_lanes[tid] = static_cast<double>(v);
  duet_emu_wait(warp);
  const T r = (tid % 32) + off < 32 ? static_cast<T>(duet_emu_lanes[tid + off]) : v;
  duet_emu_wait(warp);
  return r;
}
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }
)duet_src";

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size()))
    s.replace(i, from.size(), to);
  return s;
}

using EmulateFn = bool (*)(int prog, const kernels::DuetFusedArgs* a, unsigned vmask, int vec,
                           int nsplit, unsigned grid, unsigned grid_y, unsigned block_x,
                           unsigned block_y);
// A split reduction's second pass (duet_fused_fold) of program `prog`, on one thread.
using EmulateFoldFn = void (*)(int prog, const void* part, void* out, int64_t n, int nsplit,
                               int64_t ps, int64_t pc);
struct Emulator {
  EmulateFn run = nullptr;
  EmulateFoldFn fold = nullptr;
};

// Compiles the programs' kernels into one host library, each in a namespace of its own, with
// emulate() running program `prog` over a grid one block at a time, and emulate_fold() its second
// pass.
Emulator build_host_kernels(const std::vector<FusedProgram>& progs, std::string* log) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("duet-cuda-emu-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto write = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  write(dir / "shim.h", kShim);
  write(dir / "duet_functors.h", detail::kCodegenFunctorsH);
  write(dir / "duet_fused_abi.h", detail::kCodegenFusedAbiH);
  std::string src = "#include \"duet_fused_abi.h\"\n#include \"duet_functors.h\"\n";
  for (size_t i = 0; i < progs.size(); ++i) {
    std::string k = cuda::detail::fused_source(progs[i]);
    k = replace_all(k, "#include", "// #include");
    k = replace_all(k, "extern \"C\" __global__", "");
    src += fmt::format("#undef DUET_REDUCE\nnamespace prog{} {{\n{}\n}}\n", i, k);
  }
  src += R"EMU(#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
namespace {
int emu_prog, emu_vec, emu_nsplit;
unsigned emu_vmask;
const duet::kernels::DuetFusedArgs* emu_args;
void emu_body() {
  switch (emu_prog) {
)EMU";
  for (size_t i = 0; i < progs.size(); ++i)
    src += fmt::format(
        "    case {0}: prog{0}::duet_fused(*emu_args, emu_vmask, emu_vec, emu_nsplit); break;\n",
        i);
  src += R"EMU(  }
  duet_emu_current->done = true;
}
}  // namespace
// Runs the grid one block at a time; returns false where the block's fibers deadlock (a barrier
// that not all of them reach).
extern "C" bool emulate(int prog, const duet::kernels::DuetFusedArgs* a, unsigned vmask, int vec,
                        int nsplit, unsigned grid, unsigned grid_y, unsigned bx, unsigned by) {
  emu_prog = prog, emu_args = a, emu_vmask = vmask, emu_vec = vec, emu_nsplit = nsplit;
  const unsigned n = bx * by;
  constexpr size_t kStack = 64 << 10;
  std::vector<DuetEmuFiber> fibers(n);
  std::vector<char> stacks(kStack * n);
  gridDim = dim3{grid, grid_y, 1};
  blockDim = dim3{bx, by, 1};
  for (unsigned b = 0; b < grid * grid_y; ++b) {
    blockIdx = dim3{b % grid, b / grid, 0};
    duet_emu_block = DuetEmuBarrier{n};
    for (unsigned w = 0; w * 32 < n; ++w) duet_emu_warps[w] = DuetEmuBarrier{std::min(32u, n - w * 32)};
    for (unsigned t = 0; t < n; ++t) {
      DuetEmuFiber& f = fibers[t];
      f = DuetEmuFiber{};
      f.thread = dim3{t % bx, t / bx, 0};
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = stacks.data() + kStack * t;
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = &duet_emu_scheduler;
      makecontext(&f.ctx, emu_body, 0);
    }
    for (unsigned left = n; left > 0;) {
      bool ran = false;
      for (DuetEmuFiber& f : fibers) {
        if (f.done || (f.waits_on && f.waits_on->generation == f.generation)) continue;
        f.waits_on = nullptr;
        duet_emu_current = &f;
        threadIdx = f.thread;
        swapcontext(&duet_emu_scheduler, &f.ctx);
        ran = true;
        if (f.done) --left;
      }
      if (!ran) return false;
    }
  }
  return true;
}
)EMU";
  src +=
      "extern \"C\" void emulate_fold(int prog, const void* part, void* out, int64_t n, int "
      "nsplit,\n"
      "                             int64_t ps, int64_t pc) {\n"
      "  gridDim = blockDim = dim3{};\n"
      "  blockIdx = threadIdx = dim3{0, 0, 0};\n"
      "  blockDim.x = n > 0 ? static_cast<unsigned>(n) : 1;\n"
      "  for (unsigned t = 0; t < blockDim.x; ++t) {\n"
      "    threadIdx.x = t;\n"
      "    switch (prog) {\n";
  for (size_t i = 0; i < progs.size(); ++i)
    if (progs[i].reduce != FusedReduce::None)
      src += fmt::format(
          "      case {0}: prog{0}::duet_fused_fold(static_cast<const prog{0}::T*>(part), "
          "static_cast<prog{0}::T*>(out), n, nsplit, ps, pc); break;\n",
          i);
  src += "    }\n  }\n}\n";
  write(dir / "emu.cpp", src);
  std::string eigen;
  for (const char* p = detail::kCodegenEigenInclude; *p;) {
    const char* e = std::strchr(p, ';');
    const std::string d = e ? std::string(p, e) : std::string(p);
    if (!d.empty()) eigen += " -isystem " + d;
    p = e ? e + 1 : p + d.size();
  }
  const std::string cmd = fmt::format(
      "{} -std=c++20 -O0 -fPIC -shared -w -I{} {} -include {} {} -o {} > {} 2>&1",
      detail::kCodegenCompiler, dir.string(), eigen, (dir / "shim.h").string(),
      (dir / "emu.cpp").string(), (dir / "emu.so").string(), (dir / "log.txt").string());
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream f(dir / "log.txt");
    *log = cmd + "\n" + std::string(std::istreambuf_iterator<char>(f), {});
    return {};
  }
  void* h = dlopen((dir / "emu.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (!h) {
    *log = dlerror();
    return {};
  }
  return {reinterpret_cast<EmulateFn>(dlsym(h, "emulate")),
          reinterpret_cast<EmulateFoldFn>(dlsym(h, "emulate_fold"))};
}

// One input's layout over [outer, inner]: element (i, j) at base + i * so + j * si.
struct InLayout {
  int64_t so, si;
  int64_t shift = 0;  ///< elements past an aligned base (misaligned rows)
};

}  // namespace

TEST_CASE("cuda codegen: generated kernels run on the host equal the interpreter") {
  // Every op for f32 and f64 in each mode, and the groups of random fusion programs.
  std::vector<FusedProgram> progs;
  for (DType t : {DType::f32, DType::f64})
    for (auto [reduce, op] :
         {std::pair{FusedReduce::None, OpId::Sum}, std::pair{FusedReduce::Inner, OpId::Sum},
          std::pair{FusedReduce::Inner, OpId::Max}, std::pair{FusedReduce::Outer, OpId::Min},
          std::pair{FusedReduce::Outer, OpId::Sum}})
      progs.push_back(every_op(t, reduce, op));
  for (const FusedProgram& g : random_fusion_groups(16)) {
    if (progs.size() >= 24) break;
    progs.push_back(g);
  }
  std::string log;
  const Emulator emu = build_host_kernels(progs, &log);
  const bool built = emu.run != nullptr && emu.fold != nullptr;
  REQUIRE_MESSAGE(built, log);
  Rng rng(77);
  struct Case {
    const char* name;
    int64_t outer, inner;
    std::vector<InLayout> layouts;  // per input (cycled)
    int sms = 1;                    ///< one multiprocessor: grids of a few blocks
    /// A case of split reductions: run for the programs of this mode only, and split there.
    FusedReduce split = FusedReduce::None;
  };
  const std::vector<Case> cases = {
      {"dense, one row (dense path)", 1, 1024, {{0, 1}}},
      {"dense rows and numbers (dense path)", 4, 48, {{48, 1}, {0, 0}, {48, 1}}},
      {"rows, row and column broadcasts, strided (vector path)",
       7,
       36,
       {{0, 1}, {1, 0}, {72, 2}, {36, 1}, {0, 0}}},
      {"odd rows (scalar path)", 5, 33, {{33, 1}, {0, 1}, {1, 0}}},
      {"misaligned rows (vector path, lane loads)", 3, 40, {{40, 1, 1}, {41, 1, 0}}},
      {"transposed", 6, 8, {{1, 6}, {8, 1}}},
      {"long rows", 3, 700, {{700, 1}, {0, 1}, {1, 0}}},
      {"many rows, few columns", 70, 3, {{3, 1}, {0, 1}, {1, 0}}},
      // Reductions split in slices (two passes) on a device of 3 multiprocessors.
      {"one long row, split", 1, 6200, {{6200, 1}, {0, 1}}, 3, FusedReduce::Inner},
      {"two long columns, split", 800, 2, {{2, 1}, {1, 0}}, 3, FusedReduce::Outer},
  };
  int checked = 0;
  for (size_t pi = 0; pi < progs.size(); ++pi) {
    const FusedProgram& p = progs[pi];
    const int ni = p.num_inputs(), no = static_cast<int>(p.outputs.size());
    for (const Case& c : cases) {
      if (c.split != FusedReduce::None && c.split != p.reduce) continue;
      INFO("program " << pi << ", " << c.name << "\n" << p.str());
      // Inputs: buffers large enough for every layout, filled from the domain of each dtype.
      std::vector<Tensor> ins;
      kernels::DuetFusedArgs a{};
      a.outer = c.outer;
      a.inner = c.inner;
      for (int k = 0; k < ni; ++k) {
        // A number of the graph (scalar_inputs) is one element wherever it is read.
        const InLayout l = p.scalar_inputs >> k & 1u
                               ? InLayout{0, 0}
                               : c.layouts[static_cast<size_t>(k) % c.layouts.size()];
        const int64_t extent = l.shift + (c.outer - 1) * l.so + (c.inner - 1) * l.si + 1;
        const DType d = p.in_dtypes[k];
        ins.push_back(make(random_values(extent, Domain{0.1, 2, 0.1, 2}, d, rng), {extent}, d));
        a.in[k] = static_cast<const char*>(ins.back().raw_data()) + l.shift * itemsize(d);
        a.in_so[k] = l.so;
        a.in_si[k] = l.si;
      }
      std::vector<Tensor> got, want;
      for (int o = 0; o < no; ++o) {
        got.push_back(zeros({c.outer * c.inner}, Options().dtype(p.out_dtypes[o])));
        want.push_back(zeros({c.outer * c.inner}, Options().dtype(p.out_dtypes[o])));
      }
      const int64_t nred = p.reduce == FusedReduce::Inner   ? c.outer
                           : p.reduce == FusedReduce::Outer ? c.inner
                                                            : 0;
      Tensor red_got = zeros({nred}, Options().dtype(p.dtype)),
             red_want = zeros({nred}, Options().dtype(p.dtype));
      for (int o = 0; o < no; ++o) a.out[o] = want[o].raw_data();
      a.red_out = red_want.raw_data();
      kernels::FusedKernel k;
      k.program = p;
      kernels::interpret_fused(p, a, 0, k.work(a));
      for (int o = 0; o < no; ++o) a.out[o] = got[o].raw_data();
      a.red_out = red_got.raw_data();
      cuda::detail::FusedLaunch l = cuda::detail::fused_launch(p, a, c.sms);
      REQUIRE_FALSE(l.none);
      // Elementwise grids cover the work in one pass up to 128 blocks a multiprocessor: two
      // blocks here, so that the grid-stride loop goes round (any grid computes the same).
      if (p.reduce == FusedReduce::None) l.grid = std::min(l.grid, 2u);
      // Inputs whole or laid out as the output take the dense step; a transposed input does not.
      const std::string name = c.name;
      if (p.reduce == FusedReduce::None && name.find("dense path") != std::string::npos)
        CHECK(l.vec == 2);
      if (name == "transposed" && !(p.scalar_inputs & 1u)) CHECK(l.vec != 2);
      CHECK((l.nsplit > 1) == (c.split != FusedReduce::None));
      Tensor partials;
      if (l.nsplit > 1) {
        partials = zeros({l.partials}, Options().dtype(p.dtype));
        a.red_out = partials.raw_data();
      }
      const bool ran = emu.run(static_cast<int>(pi), &a, l.vmask, l.vec, l.nsplit, l.grid, l.grid_y,
                               l.block_x, l.block_y);
      REQUIRE_MESSAGE(ran, "the block's threads deadlocked at a barrier");
      if (l.nsplit > 1)
        emu.fold(static_cast<int>(pi), partials.raw_data(), red_got.raw_data(), l.results, l.nsplit,
                 l.part_stride, l.split_stride);
      const double tol = p.dtype == DType::f32 ? 2e-6 : 1e-13;
      for (int o = 0; o < no; ++o) {
        INFO("output " << o << " (vec " << l.vec << ", vmask " << l.vmask << ")");
        const std::string m = differences(values(got[o]), values(want[o]), tol, tol);
        CHECK_MESSAGE(m.empty(), m);
      }
      if (nred) {  // sums in another order
        INFO("reduction (grid " << l.grid << "x" << l.grid_y << ", block " << l.block_x << "x"
                                << l.block_y << ", " << l.nsplit << " slices)");
        const std::string m = differences(values(red_got), values(red_want), tol * 50, tol * 50);
        CHECK_MESSAGE(m.empty(), m);
      }
      ++checked;
    }
  }
  MESSAGE(fmt::format("{} programs, {} runs checked on the host", progs.size(), checked));
}

}  // namespace duet::test
