// Fused CUDA kernels: the source generator, NVRTC, the caches and the launcher (Note [Fused CUDA
// kernels] and Note [CUDA kernel cache] in cuda/fused.h).
#include "cuda/fused.h"

#include <cuda_runtime.h>
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "core/error.h"
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

// How each fusable op reads in scalar code over T registers (b8 values are 1 or 0 in T;
// ordered comparisons of NaN give 0, != gives 1), as the interpreter computes them.
struct OpCode {
  OpId op;
  int arity;
  const char* expr;
};
constexpr OpCode kOpCodes[] = {
    {OpId::Neg, 1, "duet::fn::Neg{{}}({0})"},
    {OpId::Exp, 1, "duet::fn::Exp{{}}({0})"},
    {OpId::Log, 1, "duet::fn::Log{{}}({0})"},
    {OpId::Sqrt, 1, "duet::fn::Sqrt{{}}({0})"},
    {OpId::Rsqrt, 1, "duet::fn::Rsqrt{{}}({0})"},
    {OpId::Abs, 1, "duet::fn::Abs{{}}({0})"},
    {OpId::Sin, 1, "duet::fn::Sin{{}}({0})"},
    {OpId::Cos, 1, "duet::fn::Cos{{}}({0})"},
    {OpId::Tanh, 1, "duet::fn::Tanh{{}}({0})"},
    {OpId::Sigmoid, 1, "duet::fn::Sigmoid{{}}({0})"},
    {OpId::Relu, 1, "duet::fn::Relu{{}}({0})"},
    {OpId::Erf, 1, "duet::fn::Erf{{}}({0})"},
    {OpId::LogSigmoid, 1, "duet::fn::LogSigmoid{{}}({0})"},
    {OpId::Add, 2, "duet::fn::Add{{}}({0}, {1})"},
    {OpId::Sub, 2, "duet::fn::Sub{{}}({0}, {1})"},
    {OpId::Mul, 2, "duet::fn::Mul{{}}({0}, {1})"},
    {OpId::Div, 2, "duet::fn::Div{{}}({0}, {1})"},
    {OpId::Pow, 2, "duet::fn::Pow{{}}({0}, {1})"},
    {OpId::Maximum, 2, "duet::fn::Maximum{{}}({0}, {1})"},
    {OpId::Minimum, 2, "duet::fn::Minimum{{}}({0}, {1})"},
    {OpId::Lt, 2, "({0} < {1} ? T(1) : T(0))"},
    {OpId::Le, 2, "({0} <= {1} ? T(1) : T(0))"},
    {OpId::Gt, 2, "({1} < {0} ? T(1) : T(0))"},
    {OpId::Ge, 2, "({1} <= {0} ? T(1) : T(0))"},
    {OpId::Eq, 2, "({0} == {1} ? T(1) : T(0))"},
    {OpId::Ne, 2, "({0} != {1} ? T(1) : T(0))"},
    {OpId::Where, 3, "({0} != T(0) ? {1} : {2})"},
};

const OpCode* find_op_code(OpId op) {
  for (const OpCode& c : kOpCodes)
    if (c.op == op) return &c;
  return nullptr;
}

// The fixed part of every kernel; a program adds T, its tables, load_in/store_out, compute()
// and the reducer before it.
constexpr const char* kKernels = R"duet_src(
// Block-wide fold of v (blockDim.x a multiple of 32); the result is valid in thread 0.
__device__ __forceinline__ T block_reduce(T v, T* sh) {
  for (int off = 16; off > 0; off >>= 1) v = Red::op(v, __shfl_down_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // sh may still be read for the previous row
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : Red::id();
    for (int off = 16; off > 0; off >>= 1) v = Red::op(v, __shfl_down_sync(0xffffffffu, v, off));
  }
  return v;
}

struct alignas(16) Vec {
  T v[V];
};

// Element (i, j): loads its inputs, runs the program, stores its outputs at i * inner + j, and
// returns the value a reduction folds.
__device__ __forceinline__ T element(const DuetFusedArgs& a, int64_t i, int64_t j) {
  T x[NIA], y[NOA], r;
#pragma unroll
  for (int k = 0; k < NI; ++k) x[k] = load_in(a, k, i * a.in_so[k] + j * a.in_si[k]);
  compute(x, y, r);
#pragma unroll
  for (int o = 0; o < NO; ++o) store_out(a, o, i * a.inner + j, y[o]);
  return r;
}

extern "C" __global__ void duet_fused(DuetFusedArgs a, unsigned vmask, int vec) {
#if DUET_REDUCE == 0
  const int64_t n = a.outer * a.inner;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (int64_t q = t; q * V < n; q += stride) {
      const int64_t e = q * V;
      const int64_t i = a.outer == 1 ? 0 : e / a.inner, j = e - i * a.inner;
      T x[V][NIA], y[V][NOA], r;
#pragma unroll
      for (int k = 0; k < NI; ++k) {
        const int64_t off = i * a.in_so[k] + j * a.in_si[k];
        if (a.in_si[k] == 0) {
          const T b = load_in(a, k, off);
#pragma unroll
          for (int l = 0; l < V; ++l) x[l][k] = b;
        } else if (kInT[k] && (vmask >> k & 1u)) {
          const Vec w = *reinterpret_cast<const Vec*>(static_cast<const T*>(a.in[k]) + off);
#pragma unroll
          for (int l = 0; l < V; ++l) x[l][k] = w.v[l];
        } else {
#pragma unroll
          for (int l = 0; l < V; ++l) x[l][k] = load_in(a, k, off + l * a.in_si[k]);
        }
      }
#pragma unroll
      for (int l = 0; l < V; ++l) compute(x[l], y[l], r);
#pragma unroll
      for (int o = 0; o < NO; ++o) {
        if (kOutT[o]) {
          Vec w;
#pragma unroll
          for (int l = 0; l < V; ++l) w.v[l] = y[l][o];
          *reinterpret_cast<Vec*>(static_cast<T*>(a.out[o]) + e) = w;
        } else {
#pragma unroll
          for (int l = 0; l < V; ++l) store_out(a, o, e + l, y[l][o]);
        }
      }
    }
  } else {
    for (int64_t e = t; e < n; e += stride) {
      const int64_t i = a.outer == 1 ? 0 : e / a.inner;
      element(a, i, e - i * a.inner);
    }
  }
#elif DUET_REDUCE == 1
  __shared__ T sh[32];
  for (int64_t i = blockIdx.x; i < a.outer; i += gridDim.x) {
    T acc = Red::id();
    for (int64_t j = threadIdx.x; j < a.inner; j += blockDim.x) acc = Red::op(acc, element(a, i, j));
    acc = block_reduce(acc, sh);
    if (threadIdx.x == 0) static_cast<T*>(a.red_out)[i] = acc;
  }
#else
  __shared__ T sh[32][33];
  for (int64_t j0 = int64_t(blockIdx.x) * 32; j0 < a.inner; j0 += int64_t(gridDim.x) * 32) {
    const int64_t j = j0 + threadIdx.x;
    T acc = Red::id();
    if (j < a.inner) {
      for (int64_t i = threadIdx.y; i < a.outer; i += blockDim.y) acc = Red::op(acc, element(a, i, j));
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < a.inner) {
      T v = sh[0][threadIdx.x];
      for (unsigned y = 1; y < blockDim.y; ++y) v = Red::op(v, sh[y][threadIdx.x]);
      static_cast<T*>(a.red_out)[j] = v;
    }
    __syncthreads();
  }
#endif
}
)duet_src";

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

// The architecture NVRTC builds for: sm_<arch> when it supports it (a CUBIN), else PTX for the
// newest architecture it knows below it (the driver compiles that).
NvrtcOutput nvrtc_build(const std::string& source, int arch, const std::string& name) {
  int num = 0;
  DUET_NVRTC_CHECK(nvrtcGetNumSupportedArchs(&num));
  std::vector<int> archs(static_cast<size_t>(num));
  if (num) DUET_NVRTC_CHECK(nvrtcGetSupportedArchs(archs.data()));
  const bool cubin = std::find(archs.begin(), archs.end(), arch) != archs.end();
  int target = arch;
  if (!cubin) {
    target = 0;
    for (int a : archs)
      if (a <= arch) target = std::max(target, a);
    DUET_CHECK_DEVICE(target > 0, "[nvrtc] no architecture at or below sm_{} is supported", arch);
  }
  std::vector<std::string> opts = {
      fmt::format("--gpu-architecture={}_{}", cubin ? "sm" : "compute", target), "-std=c++17",
      "--fmad=false", "-DNDEBUG"};
  for (std::string& i : include_options()) opts.push_back(std::move(i));
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const char* headers[] = {duet::detail::kCodegenFusedAbiH, duet::detail::kCodegenFunctorsH};
  const char* header_names[] = {"duet_fused_abi.h", "duet_functors.h"};
  nvrtcProgram prog;
  DUET_NVRTC_CHECK(
      nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), 2, headers, header_names));
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
  if (cubin) {
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

struct Cache {
  std::mutex mu;
  std::unordered_map<uint64_t, cudaKernel_t> kernels;  // by key, for the process
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

void prepare(kernels::FusedKernel& k, Device device, const std::string& dir) {
  if (k.device_code.load(std::memory_order_acquire)) return;
  const DeviceInfo& info = device_info(device);
  const std::string source = fused_source(k.program);
  int nv_major = 0, nv_minor = 0;
  nvrtcVersion(&nv_major, &nv_minor);
  const uint64_t key =
      kernels::jit::fnv1a(fmt::format("nvrtc {}.{} sm_{} {} --fmad=false\n", nv_major, nv_minor,
                                      info.arch, duet::detail::kNvrtcIncludeDirs),
                          kernels::jit::fnv1a(source));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);  // one build at a time; a hit is a lookup
  if (auto it = c.kernels.find(key); it != c.kernels.end()) {
    ++g_memory_hits;
    k.device_code.store(reinterpret_cast<const void*>(it->second), std::memory_order_release);
    return;
  }
  const std::string base = fmt::format("{}/duet-cuda-{:016x}", dir, key);
  auto build = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    NvrtcOutput out = nvrtc_build(source, info.arch, fmt::format("duet-cuda-{:016x}.cu", key));
    g_build_us +=
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    kernels::jit::write_file_once(base + ".cu", source);
    if (!out.log.empty()) {
      kernels::jit::write_file_once(base + ".log", out.log);
      throw InternalError(fmt::format(
          "[fused] NVRTC could not compile a generated kernel ({}.cu): {}\nprogram:\n{}", base,
          out.log, k.program.str()));
    }
    kernels::jit::write_file_once(base + (out.ptx ? ".ptx" : ".cubin"), out.image);
    ++g_built;
    return std::move(out.image);
  };
  std::string image;
  bool from_disk = false;
  for (const char* ext : {".cubin", ".ptx"})
    if (read_file(base + ext, &image)) {
      from_disk = true;
      break;
    }
  if (!from_disk) image = build();
  set_device(device);
  cudaLibrary_t lib;
  cudaError_t e = cudaLibraryLoadData(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (e != cudaSuccess && from_disk) {
    // A damaged or foreign file in the cache: build again and replace it.
    cudaGetLastError();
    std::error_code ec;
    for (const char* ext : {".cubin", ".ptx"}) std::filesystem::remove(base + ext, ec);
    from_disk = false;
    image = build();
    e = cudaLibraryLoadData(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  }
  DUET_CUDA_CHECK(e);
  if (from_disk) ++g_disk_hits;
  cudaKernel_t kern;
  DUET_CUDA_CHECK(cudaLibraryGetKernel(&kern, lib, "duet_fused"));
  c.kernels.emplace(key, kern);
  k.device_code.store(reinterpret_cast<const void*>(kern), std::memory_order_release);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void run(kernels::FusedKernel& k, const kernels::DuetFusedArgs& a, Device device) {
  k.runs.fetch_add(1, std::memory_order_relaxed);
  const void* fn = k.device_code.load(std::memory_order_acquire);
  DUET_ASSERT(fn != nullptr, "[fused] a CUDA kernel ran before prepare()");
  FusedLaunch l = fused_launch(k.program, a, device_info(device).sms);
  if (l.none) return;
  kernels::DuetFusedArgs args = a;
  void* params[] = {&args, &l.vmask, &l.vec};
  set_device(device);
  DUET_CUDA_CHECK(
      cudaLaunchKernel(fn, dim3(l.grid), dim3(l.block_x, l.block_y), params, 0, stream(device)));
}

}  // namespace

std::string fused_source(const FusedProgram& p) {
  DUET_CHECK_T(p.dtype == DType::f32 || p.dtype == DType::f64, DTypeError,
               "[fused] fused programs compute in f32 or f64, not {}", dtype_name(p.dtype));
  const int nin = p.num_inputs(), nout = static_cast<int>(p.outputs.size());
  DUET_ASSERT(nin <= DUET_FUSED_MAX_INPUTS && nout <= DUET_FUSED_MAX_OUTPUTS);
  DUET_ASSERT(p.out_dtypes.size() == p.outputs.size());
  DUET_ASSERT(p.num_regs >= nin);
  std::string s = fmt::format(
      "// duet: generated fused CUDA kernel (cuda/fused.cpp), T = {}\n"
      "#include \"duet_fused_abi.h\"\n#include \"duet_functors.h\"\n"
      "#include <cuda/std/limits>\n\n"
      "typedef {} T;\nusing duet::kernels::DuetFusedArgs;\n"
      "#define DUET_REDUCE {}\n"
      "constexpr int NI = {}, NO = {}, NIA = {}, NOA = {}, V = 16 / sizeof(T);\n",
      dtype_name(p.dtype), kernels::jit::c_type(p.dtype), static_cast<int>(p.reduce), nin, nout,
      std::max(nin, 1), std::max(nout, 1));
  std::string in_t, out_t;
  for (int k = 0; k < nin; ++k)
    in_t += fmt::format("{}{}", k ? ", " : "", p.in_dtypes[k] == p.dtype);
  for (int k = 0; k < nout; ++k)
    out_t += fmt::format("{}{}", k ? ", " : "", p.out_dtypes[k] == p.dtype);
  s += fmt::format("constexpr bool kInT[NIA] = {{{}}};\nconstexpr bool kOutT[NOA] = {{{}}};\n",
                   nin ? in_t : "false", nout ? out_t : "false");
  // Loads convert to T; stores write T, or b8 as != 0.
  s += "__device__ __forceinline__ T load_in(const DuetFusedArgs& a, int k, int64_t off) {\n"
       "  switch (k) {\n";
  for (int k = 0; k < nin; ++k) {
    const char* ct = kernels::jit::c_type(p.in_dtypes[k]);
    DUET_CHECK_T(ct != nullptr, DTypeError, "[fused] cannot load an input of dtype {}",
                 dtype_name(p.in_dtypes[k]));
    s += fmt::format("    case {}: return static_cast<T>(static_cast<const {}*>(a.in[{}])[off]);\n",
                     k, ct, k);
  }
  s += "  }\n  return T(0);\n}\n";
  s += "__device__ __forceinline__ void store_out(const DuetFusedArgs& a, int o, int64_t e, T v) "
       "{\n  switch (o) {\n";
  for (int k = 0; k < nout; ++k) {
    DUET_ASSERT(p.out_dtypes[k] == p.dtype || p.out_dtypes[k] == DType::b8);
    if (p.out_dtypes[k] == DType::b8)
      s += fmt::format("    case {}: static_cast<bool*>(a.out[{}])[e] = v != T(0); break;\n", k, k);
    else
      s += fmt::format("    case {}: static_cast<T*>(a.out[{}])[e] = v; break;\n", k, k);
  }
  s += "  }\n}\n";

  // The program, with registers renamed to SSA values (Copy and Cast to T only rename).
  std::vector<std::string> reg(static_cast<size_t>(p.num_regs));
  for (int k = 0; k < nin; ++k) reg[k] = fmt::format("x[{}]", k);
  auto read = [&](int r) -> const std::string& {
    DUET_ASSERT(r >= 0 && r < p.num_regs && !reg[r].empty(), "[fused] r{} read before written", r);
    return reg[r];
  };
  std::string body;
  for (size_t n = 0; n < p.code.size(); ++n) {
    const FusedInstr& in = p.code[n];
    DUET_ASSERT(in.dst >= 0 && in.dst < p.num_regs, "[fused] bad destination r{}", in.dst);
    if (in.op == OpId::Copy || (in.op == OpId::Cast && in.to == p.dtype)) {
      reg[in.dst] = read(in.src[0]);
      continue;
    }
    std::string expr;
    if (in.op == OpId::Cast) {
      DUET_CHECK_T(in.to == DType::b8, DTypeError,
                   "[fused] a fused cast converts to T or b8, not {}", dtype_name(in.to));
      expr = fmt::format("({} != T(0) ? T(1) : T(0))", read(in.src[0]));
    } else {
      const OpCode* c = find_op_code(in.op);
      DUET_CHECK_T(c != nullptr, ValueError, "[fused] op {} does not fuse", op_name(in.op));
      std::string a[3];
      for (int k = 0; k < c->arity; ++k) a[k] = read(in.src[k]);
      expr = fmt::format(fmt::runtime(c->expr), a[0], a[1], a[2]);
    }
    body += fmt::format("  const T t{} = static_cast<T>({});  // r{} = {}\n", n, expr, in.dst,
                        op_name(in.op));
    reg[in.dst] = fmt::format("t{}", n);
  }
  for (int k = 0; k < nout; ++k) body += fmt::format("  y[{}] = {};\n", k, read(p.outputs[k]));
  const char* red_op = "Add";
  const char* red_id = "T(0)";
  if (p.reduce != FusedReduce::None) {
    body += fmt::format("  r = {};\n", read(p.reduce_src));
    switch (p.reduce_op) {
      case OpId::Sum:
        break;
      case OpId::Max:
        red_op = "Maximum";
        red_id = "-cuda::std::numeric_limits<T>::infinity()";
        break;
      case OpId::Min:
        red_op = "Minimum";
        red_id = "cuda::std::numeric_limits<T>::infinity()";
        break;
      default:
        DUET_CHECK_T(false, ValueError, "[fused] {} is not a fused reduction",
                     op_name(p.reduce_op));
    }
  } else {
    body += "  r = T(0);\n";
  }
  s += "__device__ __forceinline__ void compute(const T* x, T* y, T& r) {\n" + body + "}\n";
  s += fmt::format(
      "struct Red {{\n"
      "  static __device__ __forceinline__ T op(T a, T b) {{ return duet::fn::{}{{}}(a, b); }}\n"
      "  static __device__ __forceinline__ T id() {{ return {}; }}\n}};\n",
      red_op, red_id);
  s += kKernels;
  return s;
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
    const int64_t work = l.vec ? n / V : n;
    const int64_t blocks = std::min<int64_t>((work + 255) / 256, int64_t(sms) * 16);
    l.grid = static_cast<unsigned>(std::max<int64_t>(blocks, 1));
    l.block_x = 256;
  } else if (p.reduce == FusedReduce::Inner) {
    if (a.outer <= 0) {
      l.none = true;
      return l;
    }
    int threads = 32;
    while (threads < 512 && threads < a.inner) threads *= 2;
    l.grid = static_cast<unsigned>(std::min<int64_t>(a.outer, 65535));
    l.block_x = static_cast<unsigned>(threads);
  } else {
    if (a.inner <= 0) {
      l.none = true;
      return l;
    }
    const int64_t col_blocks = (a.inner + 31) / 32;
    l.grid = static_cast<unsigned>(std::min<int64_t>(col_blocks, 65535));
    l.block_x = 32;
    l.block_y = col_blocks < sms ? 32 : 8;  // few columns: more threads down the rows
  }
  return l;
}

std::string nvrtc_check(const std::string& source, int arch) {
  return nvrtc_build(source, arch, "duet-check.cu").log;
}

void register_fused_runner() {
  kernels::FusedDeviceRunner r;
  r.prepare = prepare;
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
