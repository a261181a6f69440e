// The CUDA API on a machine without a usable GPU, in every build: with the CUDA backend (no
// device, or none visible) and without it (cuda/runtime_none.cpp, as in the sanitizer build).
// Availability is a query, never an error; the TF32 switch; Device::cuda() tensors and draws
// raise a DeviceError naming the op, the device and why; the mixed-device check runs before any
// kernel. The CUDA test binaries (label "cuda") test the machine with a GPU.
//
// ctest runs this binary with CUDA_VISIBLE_DEVICES=-1 (tests/CMakeLists.txt), which hides every
// GPU from the CUDA runtime, so that a machine with a GPU tests the machine without one too. Run
// on a machine with a visible GPU, the cases that need none call skip() instead of passing.
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda.h"
#include "util.h"

#ifdef DUET_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace duet::test {
namespace {

// Whether no GPU is usable; otherwise reports the case as skipped (it would test nothing).
bool no_gpu() {
  if (!cuda::is_available()) return true;
  skip(
      "a CUDA GPU is visible: run with CUDA_VISIBLE_DEVICES=-1 (as ctest does) to test the "
      "machine without one");
  return false;
}

// Why Device::cuda() is refused here, as the error says it.
const char* why_no_cuda() {
#ifdef DUET_WITH_CUDA
  return "no usable CUDA GPU";
#else
  return "this build has no CUDA backend (nvcc was not found when it was configured)";
#endif
}

}  // namespace

TEST_CASE("cuda: availability is a query, never an error") {
  const bool available = cuda::is_available();
  CHECK(available == (cuda::device_count() > 0));
  CHECK_NOTHROW(cuda::synchronize());
  CHECK_NOTHROW(cuda::empty_cache());
  CHECK_NOTHROW(cuda::reset_peak_memory_stats());
  if (!no_gpu()) return;
  CHECK(cuda::device_count() == 0);
  for (int device : {0, 1}) {
    CAPTURE(device);
    const MemoryStats s = cuda::memory_stats(device);
    CHECK(s.current == 0);
    CHECK(s.peak == 0);
    CHECK(s.reserved == 0);
    CHECK(cuda::cache_hits(device) == 0);
  }
}

TEST_CASE("cuda: the TF32 switch is off by default and round-trips") {
  CHECK_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);
  CHECK(cuda::allow_tf32());
#ifdef DUET_WITH_CUDA
  CHECK(cuda::detail::allow_tf32());
#endif
  cuda::set_allow_tf32(false);
  CHECK_FALSE(cuda::allow_tf32());
#ifdef DUET_WITH_CUDA
  CHECK_FALSE(cuda::detail::allow_tf32());
#endif
}

TEST_CASE("cuda: without a usable GPU, Device::cuda() tensors raise a clear DeviceError") {
  if (!no_gpu()) return;
  const std::string why = why_no_cuda();
  std::string e = error_of<DeviceError>([] {
    detail::empty(Shape{2, 3}, DType::f32, Device::cuda());
  });
  CHECK(contains(e, "[alloc] cuda:0"));
  CHECK(contains(e, why));
  e = error_of<DeviceError>([] { make({1, 2}, {2}).to(Device::cuda()); });
  CHECK(contains(e, "[to] cuda:0"));
  CHECK(contains(e, why));
  // Every creation function: sources, tensor(), eye(), random draws.
  e = error_of<DeviceError>([] { zeros({2}, Options().device(Device::cuda())); });
  CHECK(contains(e, "[full] cuda:0"));
  CHECK(contains(e, why));
  e = error_of<DeviceError>([] { tensor({1, 2}, Options().device(Device::cuda())); });
  CHECK(contains(e, "[tensor] cuda:0"));
  CHECK(contains(e, why));
  e = error_of<DeviceError>([] { eye(2, Options().device(Device::cuda())); });
  CHECK(contains(e, "cuda:0"));
  CHECK(contains(e, why));
  e = error_of<DeviceError>([] { randn({2}, Options().device(Device::cuda())); });
  CHECK(contains(e, "cuda:0"));
  CHECK(contains(e, why));
  // Another device index: named as it was asked for.
  e = error_of<DeviceError>([] { detail::empty(Shape{2}, DType::f32, Device::cuda(1)); });
  CHECK(contains(e, "cuda:1"));
  CHECK(contains(e, why));
  // The CPU side of the library is unaffected.
  CHECK(make({1, 2}, {2}).to(Device::cpu()).to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("cuda random: without a usable GPU a draw on CUDA is a DeviceError") {
  if (!no_gpu()) return;
  const Device cuda = Device::cuda();
  const std::vector<std::pair<const char*, std::function<void()>>> draws = {
      {"[rand]",
       [&] {
         rand({2, 3}, Options().device(cuda));
       }},
      {"[randn]", [&] { randn({2}, Options().device(cuda)); }},
      {"[randint]", [&] { randint(5, {4}, Options().device(cuda)); }},
  };
  for (const auto& [name, draw] : draws) {
    INFO(name);
    CHECK_THROWS_AS(draw(), DeviceError);
    const std::string m = error_of<DeviceError>(draw);
    CHECK(contains(m, name));
    CHECK(contains(m, "cuda:0"));
    CHECK(contains(m, why_no_cuda()));
  }
  // The CPU generator is untouched: manual_seed still works and draws as before.
  manual_seed(3);
  const std::vector<double> a = values(rand({5}));
  manual_seed(3);
  CHECK(values(rand({5})) == a);
}

TEST_CASE("cuda: inputs on different devices raise a DeviceError naming the op and devices") {
  // A tensor whose storage claims cuda:0 (over CPU memory owned here) reaches the dispatcher's
  // check, which runs before any kernel, without a GPU.
  std::vector<float> mem(4, 1.0f);
  Tensor fake = detail::empty(Shape{4}, DType::f32, Device::cpu());
  fake.impl()->storage = detail::StoragePtr::adopt(
      new detail::StorageImpl(mem.data(), mem.size() * sizeof(float), Device::cuda(), nullptr));
  CHECK(fake.device() == Device::cuda());
  Tensor cpu = make({1, 2, 3, 4}, {4});
  const int line = __LINE__ + 1;
  std::string e = error_of<DeviceError>([&] { (void)add(cpu, fake); });
  CHECK(e == fmt::format("[add] inputs are on different devices: cpu (input 0) and cuda:0 (input "
                         "1); move them with .to(...) (at test_no_gpu.cpp:{})",
                         line));
  e = error_of<DeviceError>([&] { (void)matmul(reshape(fake, {1, 4}), reshape(cpu, {4, 1})); });
  CHECK(contains(e, "[matmul] inputs are on different devices: cuda:0 (input 0) and cpu"));
  e = error_of<DeviceError>([&] { cpu.add_(fake); });
  CHECK(contains(e, "[add] inputs are on different devices: cpu (input 0) and cuda:0 (input 1)"));
  // Wrapped numbers (C++ scalars) and a second tensor on the same device pass the check; a mode
  // that runs no kernels stands in for the GPU.
  struct NoKernels : DispatchMode {
    int calls = 0;
    Tensor handle(const OpCall& c) override {
      ++calls;
      CHECK(c.meta.device == Device::cuda());
      return detail::empty(c.meta.shape, c.meta.dtype, Device::cpu());
    }
  } mode;
  {
    ModeGuard guard(&mode);
    CHECK_NOTHROW((void)(fake * 2.0));
    CHECK_NOTHROW((void)(1.0 + fake));
    CHECK_NOTHROW((void)add(fake, fake));
  }
  CHECK(mode.calls == 3);
}

}  // namespace duet::test
