// Fused CUDA kernels: the source generator, NVRTC, the caches and the launcher (Note [Fused CUDA
// kernels] and Note [CUDA kernel cache] in cuda/fused.h).
#include "cuda/fused.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/runtime.h"
#include "kernels/jit.h"

namespace duet::detail {
// The headers the generated code includes, embedded by CMakeLists.txt (duet_codegen_config.cpp),
// and the CUDA toolkit's include directories (duet_cuda_config.cpp).
extern const char* const kCodegenFunctorsH;
extern const char* const kCodegenFusedAbiH;
extern const char* const kNvrtcIncludeDirs;
}  // namespace duet::detail

namespace duet::cuda {
namespace detail {
namespace {

using kernels::FusedInstr;
using kernels::FusedProgram;
using kernels::FusedReduce;

// ---- NVRTC ------------------------------------------------------------------------------------

#define DUET_NVRTC_CHECK(call)                                                  \
  do {                                                                          \
    const nvrtcResult duet_r_ = (call);                                         \
    DUET_CHECK_DEVICE(duet_r_ == NVRTC_SUCCESS, "[nvrtc] {} failed: {}", #call, \
                      nvrtcGetErrorString(duet_r_));                            \
  } while (0)

std::vector<std::string> include_options() {
  std::string dirs = duet::detail::kNvrtcIncludeDirs;
  if (const char* env = std::getenv("DUET_NVRTC_INCLUDE"); env && *env) dirs = env;
  std::vector<std::string> out;
  std::stringstream ss(dirs);
  for (std::string d; std::getline(ss, d, ';');) {
    if (d.empty()) continue;
    out.push_back("-I" + d);
    // libcu++ (cuda/std/...) lives under include/cccl in CUDA 13.
    if (std::filesystem::exists(d + "/cccl/cuda/std")) out.push_back("-I" + d + "/cccl");
  }
  return out;
}

struct NvrtcOutput {
  std::string log;    // empty on success
  std::string image;  // CUBIN, or PTX (NUL-terminated) when `ptx`
  bool ptx = false;
};

// NVRTC loads its builtins library (libnvrtc-builtins.so.<major>.<minor>) with dlopen by name
// at its first compilation, which searches the loader's paths, not where libnvrtc itself was
// found. duet's binaries find libnvrtc through their run path, so where the toolkit's directory
// is not in the loader's configuration (a toolkit unpacked or mounted, not installed) NVRTC
// failed with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. Loading the builtins first from libnvrtc's
// own directory makes NVRTC's dlopen find them already loaded (by their soname). Where that file
// does not exist, NVRTC's own lookup runs and reports as before.
void preload_nvrtc_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info;
    int major = 0, minor = 0;
    if (!dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) || !info.dli_fname ||
        nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
      return;
    const std::string lib = info.dli_fname;
    const std::string dir = lib.substr(0, lib.rfind('/') + 1);
    for (const char* kind : {"", ".alt"}) {  // the .alt variant serves some options
      const std::string builtins =
          fmt::format("{}libnvrtc-builtins{}.so.{}.{}", dir, kind, major, minor);
      if (std::filesystem::exists(builtins)) dlopen(builtins.c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
  });
}

NvrtcOutput nvrtc_build(const std::string& source, const std::vector<NvrtcHeader>& headers,
                        const NvrtcOptions& o, const std::string& name) {
  preload_nvrtc_builtins();
  std::vector<const char*> argv, texts, names;
  for (const std::string& s : o.options) argv.push_back(s.c_str());
  for (const NvrtcHeader& h : headers) {
    texts.push_back(h.text.c_str());
    names.push_back(h.name.c_str());
  }
  nvrtcProgram prog;
  DUET_NVRTC_CHECK(nvrtcCreateProgram(&prog, source.c_str(), name.c_str(),
                                      static_cast<int>(headers.size()), texts.data(),
                                      names.data()));
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  NvrtcOutput out;
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    if (n) nvrtcGetProgramLog(prog, log.data());
    out.log = fmt::format("{}\n{}", nvrtcGetErrorString(r), log);
    return out;
  }
  size_t n = 0;
  if (o.cubin) {
    DUET_NVRTC_CHECK(nvrtcGetCUBINSize(prog, &n));
    out.image.resize(n);
    DUET_NVRTC_CHECK(nvrtcGetCUBIN(prog, out.image.data()));
  } else {
    DUET_NVRTC_CHECK(nvrtcGetPTXSize(prog, &n));
    out.image.resize(n);
    DUET_NVRTC_CHECK(nvrtcGetPTX(prog, out.image.data()));
    out.ptx = true;
  }
  return out;
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return !out->empty();
}

// A loaded build: the kernel, and a reduction's second pass (null for elementwise programs).
// FusedKernel::device_code points at one of these.
struct Loaded {
  cudaKernel_t main = nullptr, fold = nullptr;
};
struct Cache {
  std::mutex mu;
  std::unordered_map<uint64_t, std::unique_ptr<Loaded>> kernels;  // by key, for the process
};
Cache& cache() {
  static Cache* c = new Cache;  // kernels stay loaded until exit
  return *c;
}

std::atomic<int64_t> g_built{0}, g_disk_hits{0}, g_memory_hits{0};
std::atomic<int64_t> g_build_us{0};

struct DeviceInfo {
  int arch = 0;
  int sms = 0;
};
// Read once per device; every launch asks for the multiprocessor count (no lock after that).
const DeviceInfo& device_info(Device device) {
  static std::once_flag once[64];
  static DeviceInfo infos[64];
  DeviceInfo& d = infos[device.index];
  std::call_once(once[device.index], [&] {
    int major = 0, minor = 0;
    DUET_CUDA_CHECK(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
    DUET_CUDA_CHECK(
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index));
    DUET_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device.index));
    d.arch = major * 10 + minor;
  });
  return d;
}

// Note [Parallel NVRTC builds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A plan's first run prepares all its CUDA kernels at once (prepare_many). Those in neither cache
// are built side by side, one NVRTC program per thread (NVRTC compiles separate programs
// concurrently), on up to nvrtc_threads() threads: a training step's dozen programs cost about
// the longest one instead of their sum. Time goes to NVVM and ptxas, which grow with the
// program; the front end reads only the two embedded headers (about a tenth of a small build).
// Loading is serial, under the cache's lock, which NVRTC never holds: two threads preparing
// plans at once build side by side too, and where both built one key the first load stays.
// build_ms counts a batch's wall time once.
struct Job {
  std::vector<kernels::FusedKernel*> ks;  // the kernels of one key
  std::string source, base, image, log;
  uint64_t key = 0;
  bool from_disk = false, ptx = false;
};

int nvrtc_threads() {
  if (const char* e = std::getenv("DUET_NVRTC_THREADS"); e && *e) {
    const int n = std::atoi(e);
    if (n >= 1) return n;
  }
  return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 16));
}

// Builds each job's source (the image, or NVRTC's log), `threads` at once.
void build_jobs(const std::vector<Job*>& jobs, const std::vector<NvrtcHeader>& headers,
                const NvrtcOptions& options, int threads) {
  if (jobs.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  run_side_by_side(jobs.size(), threads, [&](size_t i) {
    Job& j = *jobs[i];
    NvrtcOutput out =
        nvrtc_build(j.source, headers, options, fmt::format("duet-cuda-{:016x}.cu", j.key));
    j.log = std::move(out.log);
    j.image = std::move(out.image);
    j.ptx = out.ptx;
  });
  g_build_us +=
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  for (Job* j : jobs) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(j->base).parent_path(), ec);
    kernels::jit::write_file_once(j->base + ".cu",
                                  j->source + kernels::jit::sites_comment(j->ks[0]->sites));
    if (!j->log.empty()) {
      kernels::jit::write_file_once(j->base + ".log", j->log);
      throw InternalError(fmt::format(
          "[fused] NVRTC could not compile a generated kernel ({}.cu) for the ops of {}: "
          "{}\nprogram:\n{}",
          j->base, j->ks[0]->sites, j->log, j->ks[0]->program.str()));
    }
    kernels::jit::write_file_once(j->base + (j->ptx ? ".ptx" : ".cubin"), j->image);
    ++g_built;
  }
}

// Loads a job's image; false when it does not load (a damaged or foreign file from the disk).
bool load_job(Job& j, Device device, const FusedReduce reduce) {
  set_device(device);
  cudaLibrary_t lib;
  const cudaError_t e =
      cudaLibraryLoadData(&lib, j.image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e != cudaSuccess && j.from_disk) {
    cudaGetLastError();
    return false;
  }
  DUET_CUDA_CHECK(e);
  auto loaded = std::make_unique<Loaded>();
  DUET_CUDA_CHECK(cudaLibraryGetKernel(&loaded->main, lib, "duet_fused"));
  if (reduce != FusedReduce::None)
    DUET_CUDA_CHECK(cudaLibraryGetKernel(&loaded->fold, lib, "duet_fused_fold"));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto [it, fresh] = c.kernels.emplace(j.key, nullptr);
  if (fresh)
    it->second = std::move(loaded);
  else
    cudaLibraryUnload(lib);  // another thread loaded this key first: use that
  for (kernels::FusedKernel* k : j.ks)
    k->device_code.store(it->second.get(), std::memory_order_release);
  if (j.from_disk) ++g_disk_hits;
  return true;
}

void prepare_many(kernels::FusedKernel* const* ks, size_t n, Device device,
                  const std::string& dir) {
  const DeviceInfo& info = device_info(device);
  // What NVRTC reads is what the key hashes: the same headers and options build the kernel.
  const std::vector<NvrtcHeader> headers = fused_headers();
  const NvrtcOptions options = nvrtc_options(info.arch);
  std::vector<std::unique_ptr<Job>> jobs;
  Cache& c = cache();
  for (size_t i = 0; i < n; ++i) {
    kernels::FusedKernel& k = *ks[i];
    if (k.device_code.load(std::memory_order_acquire)) continue;
    std::string source = fused_source(k.program);
    const uint64_t key = kernel_cache_key(source, headers, options.options);
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (auto it = c.kernels.find(key); it != c.kernels.end()) {
        ++g_memory_hits;
        k.device_code.store(it->second.get(), std::memory_order_release);
        continue;
      }
    }
    auto same =
        std::find_if(jobs.begin(), jobs.end(), [&](const auto& j) { return j->key == key; });
    if (same != jobs.end()) {
      (*same)->ks.push_back(&k);
      continue;
    }
    auto j = std::make_unique<Job>();
    j->ks = {&k};
    j->source = std::move(source);
    j->key = key;
    j->base = fmt::format("{}/duet-cuda-{:016x}", dir, key);
    jobs.push_back(std::move(j));
  }
  std::vector<Job*> to_build;
  for (auto& j : jobs) {
    for (const char* ext : {".cubin", ".ptx"})
      if (read_file(j->base + ext, &j->image)) {
        j->from_disk = true;
        break;
      }
    if (!j->from_disk) to_build.push_back(j.get());
  }
  build_jobs(to_build, headers, options, nvrtc_threads());
  for (auto& j : jobs) {
    const FusedReduce reduce = j->ks[0]->program.reduce;
    if (load_job(*j, device, reduce)) continue;
    // A damaged or foreign file in the cache: build again and replace it.
    std::error_code ec;
    for (const char* ext : {".cubin", ".ptx"}) std::filesystem::remove(j->base + ext, ec);
    j->from_disk = false;
    build_jobs({j.get()}, headers, options, 1);
    load_job(*j, device, reduce);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void run(kernels::FusedKernel& k, const kernels::DuetFusedArgs& a, Device device) {
  k.runs.fetch_add(1, std::memory_order_relaxed);
  const Loaded* fn = static_cast<const Loaded*>(k.device_code.load(std::memory_order_acquire));
  DUET_ASSERT(fn != nullptr, "[fused] a CUDA kernel ran before prepare()");
  FusedLaunch l = fused_launch(k.program, a, device_info(device).sms);
  if (l.none) return;
  kernels::DuetFusedArgs args = a;
  set_device(device);
  cudaStream_t s = stream(device);
  // A split reduction's partials: freed after the launches, the caching allocator reuses the
  // block in stream order.
  Tensor scratch;
  if (l.nsplit > 1) {
    scratch = duet::detail::empty(Shape{l.partials}, k.program.dtype, device);
    args.red_out = scratch.raw_data();
  }
  void* params[] = {&args, &l.vmask, &l.vec, &l.nsplit};
  DUET_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(fn->main), dim3(l.grid, l.grid_y),
                                   dim3(l.block_x, l.block_y), params, 0, s));
  if (l.nsplit > 1) {
    const void* part = scratch.raw_data();
    void* out = a.red_out;
    void* fold_params[] = {&part, &out, &l.results, &l.nsplit, &l.part_stride, &l.split_stride};
    const int64_t blocks = (l.results + kFusedFoldBlock - 1) / kFusedFoldBlock;
    DUET_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(fn->fold),
                                     dim3(static_cast<unsigned>(std::min<int64_t>(blocks, 65535))),
                                     dim3(kFusedFoldBlock), fold_params, 0, s));
  }
}

// A reduction splits each result's range when its results alone give fewer blocks than the
// device has multiprocessors and each slice keeps enough work: about two blocks per
// multiprocessor in all.
int split_count(int64_t blocks, int64_t length, int64_t min_slice, int sms) {
  if (blocks >= sms || length < 2 * min_slice) return 1;
  const int64_t want = (2 * int64_t(sms) + blocks - 1) / blocks;
  const int64_t n = std::min<int64_t>({want, length / min_slice, 1024});
  return n < 2 ? 1 : static_cast<int>(n);
}

}  // namespace

void run_side_by_side(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t extra = std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1))) - 1;
  for (size_t t = 0; t < extra; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

FusedLaunch fused_launch(const FusedProgram& p, const kernels::DuetFusedArgs& a, int sms) {
  FusedLaunch l;
  const int64_t esize = p.dtype == DType::f64 ? 8 : 4;
  const int64_t V = 16 / esize;
  if (p.reduce == FusedReduce::None) {
    const int64_t n = a.outer * a.inner;
    if (n <= 0) {
      l.none = true;
      return l;
    }
    l.vec = a.inner % V == 0;
    for (size_t o = 0; l.vec && o < p.outputs.size(); ++o) l.vec = aligned16(a.out[o]);
    for (int i = 0; i < p.num_inputs(); ++i)
      if (p.in_dtypes[i] == p.dtype && a.in_si[i] == 1 && aligned16(a.in[i]) &&
          (a.outer == 1 || (a.in_so[i] * esize) % 16 == 0))
        l.vmask |= 1u << i;
    // Dense (vec 2): every input whole or dense at the output's offsets, and 32-bit offsets.
    bool dense = l.vec && n % V == 0 && n <= int64_t(INT32_MAX);
    for (int i = 0; dense && i < p.num_inputs(); ++i) {
      const bool whole = a.in_si[i] == 0 && (a.outer == 1 || a.in_so[i] == 0);
      const bool at_out = a.in_si[i] == 1 && (a.outer == 1 || a.in_so[i] == a.inner) &&
                          (p.in_dtypes[i] != p.dtype || aligned16(a.in[i]));
      dense = whole || at_out;
    }
    if (dense) l.vec = 2;
    const int64_t work = l.vec ? n / V : n;
    const int64_t threads = kFusedElementwiseBlock;
    // A thread per V elements up to 128 blocks a multiprocessor (W2's 2^22 floats in one pass),
    // then grid-stride: one pass keeps more loads in flight than two shorter ones.
    const int64_t blocks = std::min<int64_t>((work + threads - 1) / threads, int64_t(sms) * 128);
    l.grid = static_cast<unsigned>(std::max<int64_t>(blocks, 1));
    l.block_x = kFusedElementwiseBlock;
  } else if (p.reduce == FusedReduce::Inner) {
    if (a.outer <= 0) {
      l.none = true;
      return l;
    }
    unsigned threads = 32;
    while (threads < kFusedInnerMaxBlock && threads < a.inner) threads *= 2;
    l.nsplit = split_count(a.outer, a.inner, 2048, sms);
    l.grid = static_cast<unsigned>(std::min<int64_t>(a.outer * l.nsplit, 65535));
    l.block_x = threads;
    if (l.nsplit > 1) {  // partial c of row i at i * nsplit + c
      l.results = a.outer;
      l.partials = a.outer * l.nsplit;
      l.part_stride = l.nsplit;
      l.split_stride = 1;
    }
  } else {
    if (a.inner <= 0) {
      l.none = true;
      return l;
    }
    const int64_t col_blocks = (a.inner + kFusedOuterColumns - 1) / kFusedOuterColumns;
    l.grid = static_cast<unsigned>(std::min<int64_t>(col_blocks, 65535));
    l.block_x = kFusedOuterColumns;
    // Few columns: more threads down the rows, and row slices in blocks of their own.
    l.block_y = col_blocks < sms ? kFusedOuterRows : kFusedOuterRowsMany;
    l.nsplit = split_count(col_blocks, a.outer, 256, sms);
    l.grid_y = static_cast<unsigned>(l.nsplit);
    if (l.nsplit > 1) {  // partial c of column j at c * inner + j
      l.results = a.inner;
      l.partials = a.inner * l.nsplit;
      l.part_stride = 1;
      l.split_stride = a.inner;
    }
  }
  return l;
}

std::vector<NvrtcHeader> fused_headers() {
  return {{"duet_fused_abi.h", duet::detail::kCodegenFusedAbiH},
          {"duet_functors.h", duet::detail::kCodegenFunctorsH}};
}

// sm_<arch> when NVRTC supports it (a CUBIN), else PTX for the newest architecture it knows
// below it (the driver compiles that).
NvrtcOptions nvrtc_options(int arch) {
  int num = 0;
  DUET_NVRTC_CHECK(nvrtcGetNumSupportedArchs(&num));
  std::vector<int> archs(static_cast<size_t>(num));
  if (num) DUET_NVRTC_CHECK(nvrtcGetSupportedArchs(archs.data()));
  NvrtcOptions o;
  o.cubin = std::find(archs.begin(), archs.end(), arch) != archs.end();
  int target = arch;
  if (!o.cubin) {
    target = 0;
    for (int a : archs)
      if (a <= arch) target = std::max(target, a);
    DUET_CHECK_DEVICE(target > 0, "[nvrtc] no architecture at or below sm_{} is supported", arch);
  }
  o.options = {fmt::format("--gpu-architecture={}_{}", o.cubin ? "sm" : "compute", target),
               "-std=c++17", "-DNDEBUG"};
  // -minimal (NVRTC 12.4 on) leaves out the texture, surface and device-runtime declarations,
  // which no generated kernel calls: about 4% of a small program's build.
  int major = 0, minor = 0;
  DUET_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  if (major > 12 || (major == 12 && minor >= 4)) o.options.push_back("-minimal");
  for (std::string& i : include_options()) o.options.push_back(std::move(i));
  return o;
}

uint64_t kernel_cache_key(const std::string& source, const std::vector<NvrtcHeader>& headers,
                          const std::vector<std::string>& options) {
  int major = 0, minor = 0;
  DUET_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  uint64_t h = kernels::jit::fnv1a(fmt::format("duet cuda kernel, nvrtc {}.{}\n", major, minor));
  // Each part after its length, so no two different lists hash the same bytes (text moved from
  // one header or option to the next changes the key).
  auto part = [&h](std::string_view s) {
    h = kernels::jit::fnv1a(s, kernels::jit::fnv1a(fmt::format("\n{}:", s.size()), h));
  };
  part(source);
  part(fmt::format("{} headers", headers.size()));
  for (const NvrtcHeader& hd : headers) {
    part(hd.name);
    part(hd.text);
  }
  part(fmt::format("{} options", options.size()));
  for (const std::string& o : options) part(o);
  return h;
}

std::string nvrtc_check(const std::string& source, int arch) {
  return nvrtc_build(source, fused_headers(), nvrtc_options(arch), "duet-check.cu").log;
}

std::vector<NvrtcBuilt> nvrtc_build_all(const std::vector<std::string>& sources, int arch,
                                        int threads) {
  const std::vector<NvrtcHeader> headers = fused_headers();
  const NvrtcOptions options = nvrtc_options(arch);
  std::vector<NvrtcBuilt> out(sources.size());
  run_side_by_side(sources.size(), threads, [&](size_t i) {
    NvrtcOutput o = nvrtc_build(sources[i], headers, options, fmt::format("duet-check-{}.cu", i));
    out[i].log = std::move(o.log);
    out[i].image = std::move(o.image);
  });
  return out;
}

void register_fused_runner() {
  kernels::FusedDeviceRunner r;
  r.prepare = prepare_many;
  r.run = run;
  kernels::set_fused_device_runner(DeviceType::CUDA, r);
}

}  // namespace detail

CodegenStats codegen_stats() {
  CodegenStats s;
  s.built = detail::g_built.load();
  s.disk_hits = detail::g_disk_hits.load();
  s.memory_hits = detail::g_memory_hits.load();
  s.build_ms = static_cast<double>(detail::g_build_us.load()) / 1000.0;
  return s;
}

}  // namespace duet::cuda
