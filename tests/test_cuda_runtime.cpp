// The CUDA runtime on a GPU: transfers (every dtype, non-contiguous sources, device to device),
// host reads of device tensors, the caching allocator's counters, the mixed-device error,
// creation functions, copy_, printing, transfers in compiled functions and DUET_CUDA_CHECK.
// Every case needs a usable GPU: without one, each returns at once, gpu() calls skip() and the
// binary exits with 77, which ctest reports as Skipped (a failure still exits with 1). The
// behaviour without a GPU (availability as a query, Device::cuda() errors, the TF32 switch, the
// mixed-device check before any kernel) is tested by test_no_gpu, in every build.
#include <cstdio>
#include <cstring>
#include <vector>

#include "util.h"

#ifdef DUET_WITH_CUDA
#include "cuda/check.h"
#include "cuda/runtime.h"
#endif

namespace duet::test {
namespace {

// A CPU tensor of `dtype` whose bytes are a fixed pattern (every dtype, f16 and bf16 included:
// the CPU does not compute those, but it holds them).
Tensor pattern(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = detail::empty(shape, dtype, Device::cpu());
  auto* p = static_cast<unsigned char*>(t.raw_data());
  const size_t n = static_cast<size_t>(t.numel() * itemsize(dtype));
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed * 7) >> 1);
  if (dtype == DType::b8)
    for (size_t i = 0; i < n; ++i) p[i] &= 1;  // a bool holds 0 or 1
  return t;
}

std::vector<unsigned char> bytes(const Tensor& cpu_contiguous) {
  REQUIRE(cpu_contiguous.device().is_cpu());
  REQUIRE(cpu_contiguous.is_contiguous());
  const auto* p = static_cast<const unsigned char*>(cpu_contiguous.raw_data());
  return {p, p + cpu_contiguous.numel() * itemsize(cpu_contiguous.dtype())};
}

const DType kEveryDType[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                             DType::i32, DType::i64, DType::b8};

}  // namespace

TEST_CASE("cuda: transfers round-trip every dtype exactly, empty and 0-d tensors included") {
  if (!gpu()) return;
  const Shape shapes[] = {Shape{}, Shape{0}, Shape{3, 5}, Shape{1 << 20}};
  unsigned seed = 0;
  for (DType dtype : kEveryDType) {
    for (const Shape& shape : shapes) {
      CAPTURE(dtype);
      CAPTURE(shape);
      Tensor src = pattern(shape, dtype, ++seed);
      Tensor dev = src.to(Device::cuda());
      CHECK(dev.device() == Device::cuda());
      CHECK(dev.dtype() == dtype);
      CHECK(dev.sizes() == shape);
      CHECK(dev.to(Device::cuda()).is_same(dev));  // already there: the tensor itself
      Tensor back = dev.to(Device::cpu());
      CHECK(back.device() == Device::cpu());
      CHECK(bytes(back) == bytes(src));
      if (cuda::device_count() > 1) {
        Tensor other = dev.to(Device::cuda(1));
        CHECK(other.device() == Device::cuda(1));
        CHECK(bytes(other.to(Device::cpu())) == bytes(src));
      }
    }
  }
}

TEST_CASE("cuda: non-contiguous sources are made contiguous on their own device first") {
  if (!gpu()) return;
  std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  for (Layout layout : {Layout::Transposed, Layout::Strided, Layout::Offset}) {
    CAPTURE(layout_name(layout));
    Tensor src = make_layout(v, Shape{3, 4}, DType::f32, layout);
    Tensor dev = src.to(Device::cuda());
    CHECK(dev.is_contiguous());
    check_tensor(dev.to(Device::cpu()), Shape{3, 4}, DType::f32, v);
  }
  // A non-contiguous device tensor goes through the Copy op's CUDA kernel.
  Tensor dev = make(v, Shape{3, 4}).to(Device::cuda());
  Tensor t;
  REQUIRE_NOTHROW(t = permute(dev, {1, 0}).to(Device::cpu()));
  check_tensor(t, Shape{4, 3}, DType::f32, {1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12});
  // The same kernel on its own, the result staying on the device.
  Tensor c;
  REQUIRE_NOTHROW(c = permute(dev, {1, 0}).contiguous());
  CHECK(c.device() == Device::cuda());
  CHECK(c.is_contiguous());
  check_tensor(c.to(Device::cpu()), Shape{4, 3}, DType::f32,
               {1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12});
}

TEST_CASE("cuda: item() and to_vector() read device tensors (the copy waits for the device)") {
  if (!gpu()) return;
  Tensor d = make({1.5, -2.25, 3}, {3}).to(Device::cuda());
  CHECK(d.to_vector<float>() == std::vector<float>{1.5f, -2.25f, 3.0f});
  CHECK(d.to_vector<double>() == std::vector<double>{1.5, -2.25, 3.0});
  CHECK(make({7}, {}, DType::i64).to(Device::cuda()).item<int64_t>() == 7);
  CHECK(make({0.125}, {}, DType::f64).to(Device::cuda()).item<double>() == 0.125);
  CHECK(make({1, 0}, {2}, DType::b8).to(Device::cuda()).to_vector<bool>() ==
        std::vector<bool>{true, false});
}

TEST_CASE("cuda: a device transfer is differentiable (the gradient goes back)") {
  if (!gpu()) return;
  Tensor x = make({1, 2, 3}, {3});
  x.requires_grad_(true);
  Tensor y = x.to(Device::cuda());
  CHECK(y.requires_grad());
  Tensor z = y.to(Device::cpu());
  sum(z * 3.0).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == Device::cpu());
  check_tensor(x.grad(), Shape{3}, DType::f32, {3, 3, 3});
  {
    NoGradGuard g;
    CHECK_FALSE(x.to(Device::cuda()).requires_grad());
  }
}

TEST_CASE("cuda: a MemoryProfile counts GPU storages apart, with their ops") {
  if (!gpu()) return;
  const Tensor x = randn({256, 256});
  MemoryProfile prof;
  {
    Tensor a = x.to(Device::cuda());  // 256 KiB on the GPU
    Tensor b = tanh(a);               // 256 KiB more, made by tanh
    CHECK(prof.cuda_peak_bytes() >= 2 * 256 * 256 * 4);
  }
  CHECK(prof.cuda_peak_bytes() >= 2 * 256 * 256 * 4);
  CHECK(prof.peak_bytes() < 256 * 256 * 4);  // nothing of that size on the CPU
  bool tanh_here = false;
  for (const MemoryProfile::Buffer& b : prof.cuda_live_at_peak())
    tanh_here = tanh_here || b.op == "tanh";
  CHECK(tanh_here);
  CHECK(prof.str().find("on the GPU") != std::string::npos);
}

TEST_CASE("cuda: the caching allocator counts, reuses and returns blocks") {
  if (!gpu()) return;
#ifdef DUET_WITH_CUDA
  const Device dev = Device::cuda();
  CHECK(cuda::detail::stream(dev) != nullptr);
  CHECK(cuda::detail::stream(dev) == cuda::detail::stream(dev));
  const int64_t bytes4m = int64_t(4) << 20;
  cuda::empty_cache();
  const MemoryStats s0 = cuda::memory_stats();
  cuda::reset_peak_memory_stats();
  {
    Tensor a = detail::empty(Shape{1 << 20}, DType::f32, dev);
    CHECK(a.impl()->storage->allocator == &cuda::detail::allocator(dev));
    const MemoryStats s1 = cuda::memory_stats();
    CHECK(s1.current == s0.current + bytes4m);
    CHECK(s1.peak >= s1.current);
    CHECK(s1.reserved == s0.reserved + bytes4m);  // the cache was empty: a cudaMalloc
  }
  const MemoryStats s2 = cuda::memory_stats();
  CHECK(s2.current == s0.current);              // freed...
  CHECK(s2.peak == s0.current + bytes4m);       // ...after reaching this
  CHECK(s2.reserved == s0.reserved + bytes4m);  // ...into the cache
  const int64_t hits = cuda::cache_hits();
  CHECK(hits == cuda::detail::cache_hits(dev));
  {
    Tensor b = detail::empty(Shape{1 << 20}, DType::i32, dev);  // the same 4 MiB
    CHECK(cuda::cache_hits() == hits + 1);
    CHECK(cuda::memory_stats().reserved == s2.reserved);
  }
  cuda::empty_cache();
  CHECK(cuda::memory_stats().reserved == s0.reserved);
  CHECK(cuda::memory_stats().reserved <= s2.reserved - bytes4m);
  // A device that does not exist.
  std::string e = error_of<DeviceError>(
      [] { detail::empty(Shape{2}, DType::f32, Device::cuda(cuda::device_count())); });
  CHECK(contains(e, "does not exist"));
#endif
}

TEST_CASE("cuda: inputs on the CPU and a GPU raise the mixed-device error; scalars mix") {
  if (!gpu()) return;
  Tensor c = make({1, 2}, {2});
  Tensor g = c.to(Device::cuda());
  std::string e = error_of<DeviceError>([&] { (void)add(c, g); });
  // The message, then where the call was made (every error names the user's call site).
  CHECK(e ==
        "[add] inputs are on different devices: cpu (input 0) and cuda:0 (input 1); move them "
        "with .to(...) (at test_cuda_runtime.cpp:167)");
  // A C++ number is a wrapped 0-d CPU tensor: it goes with a tensor on any device.
  Tensor r = g * 2.0;
  CHECK(r.device() == Device::cuda());
  CHECK(r.to_vector<float>() == std::vector<float>{2, 4});
}

TEST_CASE("cuda: a 0-d CPU tensor meets CUDA tensors as a number, its gradient on the CPU") {
  // Note [CPU scalars beside device tensors] in core/dispatch.cpp: batch norm's unbiased
  // variance divided by (n - 1), a 0-d CPU tensor computed from a size, and failed on CUDA.
  if (!gpu()) return;
  Tensor s = make({3}, {});  // 0-d, on the CPU
  Tensor c = make({1, 2, 4}, {3});
  Tensor g = c.to(Device::cuda());
  s.requires_grad_();
  g.requires_grad_();
  Tensor r = g * s + s / 2.0;
  CHECK(r.device() == Device::cuda());
  CHECK(r.to_vector<float>() == std::vector<float>{4.5f, 7.5f, 13.5f});
  r.sum().backward();
  CHECK(s.grad().device() == Device::cpu());
  CHECK(s.grad().item<float>() == 7 + 1.5f);
  CHECK(g.grad().device() == Device::cuda());
  CHECK(g.grad().to_vector<float>() == std::vector<float>{3, 3, 3});
  // Compiled, the same.
  auto f = compile([](const Tensor& a, const Tensor& b) { return a * b + b / 2.0; });
  CHECK(f(g.detach(), s.detach()).to_vector<float>() == std::vector<float>{4.5f, 7.5f, 13.5f});
  // Not a number: a 1-element tensor of rank 1, or an op that is not elementwise.
  CHECK(contains(error_of<DeviceError>([&] { (void)(g * make({3}, {1})); }), "different devices"));
  CHECK(contains(error_of<DeviceError>([&] {
                   (void)matmul(g.reshape({3, 1}), make({1}, {1, 1}));
                 }),
                 "different devices"));
}

TEST_CASE("cuda: batch norm trains on the GPU as on the CPU, eager and compiled") {
  if (!gpu()) return;
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    auto make_model = [] {
      manual_seed(41);
      return std::make_shared<nn::Sequential>(nn::Conv2d(3, 4, 3), nn::BatchNorm2d(4), nn::ReLU(),
                                              nn::Flatten(), nn::Linear(4 * 6 * 6, 5));
    };
    auto cm = make_model(), gm = make_model();
    gm->to(Device::cuda());
    optim::SGD co(cm->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::SGD go(gm->parameters(), {.lr = 0.05, .momentum = 0.9});
    manual_seed(42);
    const Tensor x = randn({6, 3, 8, 8}), y = randint(5, {6});
    const Tensor xg = x.to(Device::cuda()), yg = y.to(Device::cuda());
    const auto step = classifier_step;
    auto cf = compile([&](const Tensor& in, const Tensor& t) { return step(*cm, co, in, t); });
    auto gf = compile([&](const Tensor& in, const Tensor& t) { return step(*gm, go, in, t); });
    for (int s = 0; s < 3; ++s) {
      const Tensor lc = compiled ? cf(x, y) : step(*cm, co, x, y);
      const Tensor lg = compiled ? gf(xg, yg) : step(*gm, go, xg, yg);
      CHECK(close(lg.to(Device::cpu()), lc, 1e-4));
    }
    const auto pc = cm->parameters(), pg = gm->parameters();
    for (size_t i = 0; i < pc.size(); ++i) CHECK(close(pg[i].to(Device::cpu()), pc[i], 1e-4));
  }
}

// Note [Device time in profiles]: host times of GPU work measure launches, so ops and steps on
// a GPU also get "device" events from CUDA events, on a track named after the device; a
// compiled call under a profiler runs its plan step by step, not as its graph.
TEST_CASE("cuda: a profile gives eager ops and compiled steps their device time") {
  if (!gpu()) return;
  manual_seed(3);
  const Tensor a = randn({512, 512}).to(Device::cuda());
  auto f = compile([](Tensor x) { return relu(matmul(x, x)) * 2.0; });
  for (int i = 0; i < 3; ++i) f(a);  // built, captured and replayed before the profile
  std::string js;
  {
    Profiler p;
    const Tensor y = matmul(a, a);
    const Tensor z = f(a);
    cuda::synchronize();
    js = p.json();
  }
  auto count = [&js](const std::string& needle) {
    int n = 0;
    for (size_t at = js.find(needle); at != std::string::npos; at = js.find(needle, at + 1)) ++n;
    return n;
  };
  // The eager matmul, and the compiled plan's matmul and fused steps, each on the device track.
  CHECK(count("\"cat\": \"device\"") >= 3);
  CHECK(count("\"cat\": \"step\"") >= 2);
  CHECK(count("\"name\": \"thread_name\"") == 1);
  CHECK(js.find("\"name\": \"cuda:0\"") != std::string::npos);
  // The eager matmul's device time: 2 * 512^3 FLOPs take microseconds on any GPU.
  const size_t at = js.find("{\"name\": \"matmul\", \"cat\": \"device\"");
  REQUIRE(at != std::string::npos);
  const size_t dur = js.find("\"dur\": ", at);
  REQUIRE(dur != std::string::npos);
  const double us = std::stod(js.substr(dur + 7, 20));
  CHECK(us > 0.5);
  CHECK(us < 1e5);
}

TEST_CASE("cuda: creation functions make tensors on the device") {
  if (!gpu()) return;
  const Device dev = Device::cuda();
  Tensor z = zeros({2, 3}, Options().device(dev));
  CHECK(z.device() == Device::cuda());
  check_tensor(z.to(Device::cpu()), Shape{2, 3}, DType::f32, {0, 0, 0, 0, 0, 0});
  Tensor f = full({2}, 2.5, Options().device(dev).dtype(DType::f64));
  CHECK(f.to_vector<double>() == std::vector<double>{2.5, 2.5});
  Tensor a = arange(4, Options().device(dev).dtype(DType::i64));
  CHECK(a.device() == Device::cuda());
  CHECK(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  Tensor v = tensor({1.5, -2, 4}, Shape{3}, Options().device(dev).dtype(DType::f64));
  CHECK(v.device() == dev);
  CHECK(v.to_vector<double>() == std::vector<double>{1.5, -2, 4});
  Tensor e = eye(3, Options().device(dev));
  CHECK(e.device() == dev);
  CHECK(e.to_vector<float>() == std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  Tensor r = randn({4}, Options().device(dev));
  CHECK(r.device() == dev);
  Tensor w = ones({3}, Options().device(Device::cuda()).requires_grad(true));
  CHECK(w.requires_grad());
  sum(w * 2.0).backward();
  CHECK(w.grad().device() == Device::cuda());
  CHECK(w.grad().to_vector<float>() == std::vector<float>{2, 2, 2});
}

TEST_CASE("cuda: copy_ between devices, broadcast and into strided destinations") {
  if (!gpu()) return;
  Tensor host = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor dev = zeros({2, 3}, Options().device(Device::cuda()));
  dev.copy_(host);
  CHECK(dev.to_vector<float>() == host.to_vector<float>());
  Tensor back = permute(zeros({3, 2}), {1, 0});  // a strided CPU destination
  back.copy_(dev * 2.0);
  CHECK(back.to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
  Tensor row = make({7, 8, 9}, {3});
  dev.copy_(row);  // broadcast from the CPU
  CHECK(dev.to_vector<float>() == std::vector<float>{7, 8, 9, 7, 8, 9});
  Tensor d64 = zeros({2, 3}, Options().device(Device::cuda()).dtype(DType::f64));
  d64.copy_(host);  // and a conversion
  CHECK(d64.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("cuda: device tensors print their values") {
  if (!gpu()) return;
  Tensor d = make({1.5, -2}, {2}).to(Device::cuda());
  CHECK(d.str() == "tensor([ 1.5000, -2.0000], shape=(2), dtype=f32, device=cuda:0)");
}

TEST_CASE("cuda: transfers inside a compiled function are traced, forward and backward") {
  if (!gpu()) return;
  auto f = compile([](Tensor x, Tensor w) {
    Tensor y = tanh(x.to(Device::cuda()) * w);  // w lives on the GPU
    return sum(y.to(Device::cpu()) * 2.0);
  });
  Tensor w = make({0.5, -1, 2}, {3}).to(Device::cuda());
  for (int i = 0; i < 3; ++i) {
    Tensor x = make({0.1 * i, 0.2, -0.3}, {3});
    const double want = sum(tanh(x.to(Device::cuda()) * w).to(Device::cpu()) * 2.0).item<double>();
    Tensor got = f(x, w);
    CHECK(got.device() == Device::cpu());
    CHECK(got.item<double>() == doctest::Approx(want).epsilon(1e-6));
  }
  CHECK(f.stats().traces == 1);
  CHECK(contains(f.graph().str(), "to_device"));
  // The compiled backward sends the gradient back across both transfers.
  Tensor p = make({1, -2, 3}, {3});
  p.requires_grad_(true);
  auto step = compile([&p](Tensor scale) {
    Tensor pd = p.to(Device::cuda());
    Tensor loss = sum((pd * pd).to(Device::cpu()) * scale);
    loss.backward();
    return loss;
  });
  for (int i = 0; i < 2; ++i) {
    p.set_grad(Tensor());
    CHECK(step(make({1}, {})).item<double>() == 14);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().device() == Device::cpu());
    CHECK(p.grad().to_vector<float>() == std::vector<float>{2, -4, 6});
  }
}

TEST_CASE("cuda: Autobatch on the GPU gives the CPU's eager values and gradients") {
  if (!gpu()) return;
  // An Elman RNN per sentence, sentences of 2 to 6 words: the steps of all sentences batch.
  manual_seed(61);
  const Tensor w = randn({5, 4}) * 0.5, u = randn({5, 5}) * 0.5;
  std::vector<Tensor> xs;
  for (int64_t n : {2, 6, 3, 5, 4, 2}) xs.push_back(randn({n, 4}));
  auto loss = [](const Tensor& wi, const Tensor& ui, const std::vector<Tensor>& sentences) {
    Tensor total;
    for (const Tensor& x : sentences) {
      Tensor h = zeros({5}, Options().device(x.device()));
      for (int64_t t = 0; t < x.sizes()[0]; ++t) h = tanh(matmul(wi, x[t]) + matmul(ui, h));
      total = total.defined() ? total + h.sum() : h.sum();
    }
    return total;
  };
  Tensor wc = w.clone().requires_grad_(), uc = u.clone().requires_grad_();
  const Tensor want = loss(wc, uc, xs);
  want.backward();
  Tensor wg = w.to(Device::cuda()).requires_grad_(), ug = u.to(Device::cuda()).requires_grad_();
  std::vector<Tensor> xg;
  for (const Tensor& x : xs) xg.push_back(x.to(Device::cuda()));
  Tensor got;
  {
    Autobatch scope;
    got = loss(wg, ug, xg);
    got.backward();
  }
  CHECK(autobatch_stats().kernels_launched * 3 < autobatch_stats().ops_recorded);
  CHECK(close(got.to(Device::cpu()), want, 1e-5));
  CHECK(close(wg.grad().to(Device::cpu()), wc.grad(), 1e-4));
  CHECK(close(ug.grad().to(Device::cpu()), uc.grad(), 1e-4));
}

TEST_CASE("cuda: DUET_CUDA_CHECK turns a failed call into a DeviceError") {
  if (!gpu()) return;
#ifdef DUET_WITH_CUDA
  std::string e = error_of<DeviceError>([] { DUET_CUDA_CHECK(cudaSetDevice(1 << 20)); });
  CHECK(contains(e, "[cuda] cudaSetDevice(1 << 20) failed: cudaErrorInvalidDevice"));
  CHECK(contains(e, "test_cuda_runtime.cpp:"));
  float host[4] = {};
  e = error_of<DeviceError>(
      [&] { DUET_CUDA_CHECK(cudaMemcpy(nullptr, host, sizeof(host), cudaMemcpyHostToDevice)); });
  CHECK(contains(e,
                 "[cuda] cudaMemcpy(nullptr, host, sizeof(host), cudaMemcpyHostToDevice) "
                 "failed: cudaError"));
  // The error is cleared: the runtime goes on working.
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(make({5}, {1}).to(Device::cuda()).to_vector<float>() == std::vector<float>{5});
#endif
}

}  // namespace duet::test
