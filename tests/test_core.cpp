// Core types: Shape, Dims, Scalar, DType and promotion, broadcasting, the caching allocator's
// counters, the dispatch mode stack and the op table.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "util.h"

namespace duet::test {

TEST_CASE("Shape: sizes, numel, text, editing, rank above the inline capacity") {
  Shape s{2, 3};
  CHECK(s.size() == 2);
  CHECK(s[1] == 3);
  CHECK(s.numel() == 6);
  CHECK(s.str() == "(2, 3)");
  CHECK(Shape{}.size() == 0);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{}.str() == "()");
  CHECK(Shape{4, 0, 2}.numel() == 0);
  CHECK(Shape(std::vector<int64_t>{2, 3}) == s);
  CHECK(Shape{2, 3} != Shape{3, 2});
  CHECK(s.vec() == std::vector<int64_t>{2, 3});
  s.push_back(5);
  s.insert(0, 7);
  CHECK(s.str() == "(7, 2, 3, 5)");
  s.erase(1);
  CHECK(s.str() == "(7, 3, 5)");
  // Rank 9 lives on the heap; copies and moves keep the values.
  Shape big{1, 2, 3, 4, 5, 6, 7, 8, 9};
  Shape copy = big;
  Shape moved = std::move(copy);
  CHECK(moved.size() == 9);
  CHECK(moved.numel() == 362880);
  CHECK(moved == big);
  Shape assigned{1};
  assigned = big;
  CHECK(assigned == big);
  assigned = Shape{2};
  CHECK(assigned.str() == "(2)");
  // A tensor of rank 8 works end to end.
  Tensor t = ones({1, 2, 1, 2, 1, 2, 1, 2});
  CHECK(sum(t * 2).item<float>() == 32);
  CHECK(reshape(t, {16}).numel() == 16);
}

TEST_CASE("Dims: all, one dim, lists") {
  CHECK(Dims{}.empty());
  CHECK(Dims(1).size() == 1);
  CHECK(Dims(int64_t{-1})[0] == -1);
  Dims d{0, -1};
  CHECK(d.size() == 2);
  CHECK(d.str() == "(0, -1)");
  CHECK(Dims(std::vector<int64_t>{2, 0}) == Dims{2, 0});
}

TEST_CASE("Scalar keeps its kind") {
  CHECK(Scalar(1).is_integral());
  CHECK(Scalar(int64_t{1} << 40).to<int64_t>() == int64_t{1} << 40);
  CHECK(Scalar(1.5).is_floating());
  CHECK(Scalar(1.5f).is_floating());
  CHECK(Scalar(true).is_bool());
  CHECK(Scalar(2.75).to<int>() == 2);
  CHECK(Scalar(3).to<double>() == 3.0);
  CHECK(Scalar(1).default_dtype() == DType::i64);
  CHECK(Scalar(1.0).default_dtype() == DType::f32);
  CHECK(Scalar(false).default_dtype() == DType::b8);
  CHECK(Scalar(1) == Scalar(1));
  CHECK(!(Scalar(1) == Scalar(1.0)));
  CHECK(Scalar(std::nan("")) == Scalar(std::nan("")));
}

TEST_CASE("DType: names, sizes, promote_types") {
  CHECK(dtype_name(DType::f32) == "f32");
  CHECK(dtype_name(DType::bf16) == "bf16");
  CHECK(itemsize(DType::f64) == 8);
  CHECK(itemsize(DType::f16) == 2);
  CHECK(itemsize(DType::b8) == 1);
  CHECK(promote_types(DType::i32, DType::i64) == DType::i64);
  CHECK(promote_types(DType::b8, DType::i32) == DType::i32);
  CHECK(promote_types(DType::i64, DType::f32) == DType::f32);
  CHECK(promote_types(DType::i64, DType::f16) == DType::f16);
  CHECK(promote_types(DType::f32, DType::f64) == DType::f64);
  CHECK(promote_types(DType::f16, DType::bf16) == DType::f32);
  CHECK(promote_types(DType::bf16, DType::f32) == DType::f32);
  CHECK(promote_types(DType::b8, DType::b8) == DType::b8);
}

TEST_CASE("type promotion follows PyTorch") {
  Tensor i64 = make({1, 2}, {2}, DType::i64);
  Tensor i32 = make({1, 2}, {2}, DType::i32);
  Tensor f32 = make({1, 2}, {2}, DType::f32);
  Tensor f64 = make({1, 2}, {2}, DType::f64);
  Tensor b8 = make({1, 0}, {2}, DType::b8);
  Tensor f64_0d = make({0.5}, {}, DType::f64);
  Tensor i64_0d = make({3}, {}, DType::i64);
  Tensor f32_0d = make({0.5}, {}, DType::f32);
  auto dt = [](const Tensor& t) { return std::string(dtype_name(t.dtype())); };

  // Scalars contribute only their kind.
  CHECK(dt(i64 + 1) == "i64");
  CHECK(dt(i32 + 1) == "i32");
  CHECK(dt(i64 + 1.0) == "f32");
  CHECK(values(i64 + 1.5) == std::vector<double>{2.5, 3.5});
  CHECK(dt(f32 * 2.0) == "f32");
  CHECK(dt(f64 * 2.0) == "f64");
  CHECK(dt(b8 + 1) == "i64");
  CHECK(dt(b8 * 1.5) == "f32");
  CHECK(dt(b8 + true) == "b8");
  CHECK(dt(2 * i32) == "i32");
  // Tensors with dims promote among themselves.
  CHECK(dt(i32 + i64) == "i64");
  CHECK(dt(i64 + f32) == "f32");
  CHECK(dt(f32 + f64) == "f64");
  CHECK(dt(b8 + b8) == "b8");
  CHECK(values(b8 + b8) == std::vector<double>{1, 0});  // True + True is True
  CHECK(dt(b8 + i32) == "i32");
  // A 0-d tensor counts only when it brings a higher category.
  CHECK(dt(f32 + f64_0d) == "f32");
  CHECK(dt(i64 + f64_0d) == "f64");  // torch.tensor([1]) + torch.tensor(1.0, dtype=float64)
  CHECK(values(i64 + f64_0d) == std::vector<double>{1.5, 2.5});
  CHECK(dt(i32 + i64_0d) == "i32");
  CHECK(dt(b8 + i64_0d) == "i64");
  CHECK(dt(f32_0d + f64_0d) == "f64");
  CHECK(dt(i64_0d + 1.5) == "f32");
  CHECK(dt(f64_0d + 1) == "f64");
  CHECK(dt(i64_0d + f32_0d) == "f32");
  // Division is true division; comparisons give b8.
  CHECK(dt(i32 / i32) == "f32");
  CHECK(values(make({1, 3}, {2}, DType::i64) / 2) == std::vector<double>{0.5, 1.5});
  CHECK(dt(f64 / 2) == "f64");
  CHECK(dt(i64 < 1.5) == "b8");
  CHECK(values(i64 < 1.5) == std::vector<double>{1, 0});
  // Mixed-dtype comparisons compare in the promoted type.
  CHECK(values(make({1, 2}, {2}, DType::i32) == make({1.0, 2.5}, {2}, DType::f64)) ==
        std::vector<double>{1, 0});
  // where promotes its two value operands, not the condition.
  CHECK(dt(where(b8, i32, f64)) == "f64");
  CHECK(dt(where(b8, i64, 0.5)) == "f32");
  CHECK(dt(where(b8, 2, i32)) == "i32");
  CHECK(values(where(b8, 2, i32)) == std::vector<double>{2, 2});
  // Unary float math on integers gives the default float dtype.
  CHECK(dt(exp(i64)) == "f32");
  CHECK(dt(abs(i32)) == "i32");
}

TEST_CASE("clamp: bounds as Scalars; lo > hi gives hi everywhere, as torch.clamp") {
  CHECK(values(clamp(make({-5, 0, 5}, {3}), -1, 2)) == std::vector<double>{-1, 0, 2});
  CHECK(values(clamp(make({-5, 0, 5}, {3}), 2, 1)) == std::vector<double>{1, 1, 1});
  CHECK(dtype_name(clamp(make({-5, 0, 5}, {3}, DType::i32), 0, 1).dtype()) == "i32");
  CHECK(values(clamp(make({-5, 0, 5}, {3}, DType::i64), -0.5, 2.5)) ==
        std::vector<double>{-0.5, 0, 2.5});
}

TEST_CASE("named comparison functions match the operators") {
  Tensor a = make({1, 2, 3}, {3});
  Tensor b = make({2, 2, 2}, {3});
  CHECK(values(lt(a, b)) == values(a < b));
  CHECK(values(le(a, b)) == std::vector<double>{1, 1, 0});
  CHECK(values(gt(a, 2)) == std::vector<double>{0, 0, 1});
  CHECK(values(ge(2, a)) == std::vector<double>{1, 1, 0});
  CHECK(values(eq(a, b)) == std::vector<double>{0, 1, 0});
  CHECK(values(ne(a, 2.0)) == std::vector<double>{1, 0, 1});
}

TEST_CASE("integer arithmetic wraps like PyTorch; integer pow truncates") {
  Tensor m = make({2147483647}, {1}, DType::i32);
  CHECK(values(m + 1) == std::vector<double>{-2147483648.0});
  Tensor n = make({-2147483648.0}, {1}, DType::i32);
  CHECK(values(abs(n)) == std::vector<double>{-2147483648.0});
  CHECK(values(-n) == std::vector<double>{-2147483648.0});
  // 3e9 * 4e9 = 1.2e19 wraps to 1.2e19 - 2^64.
  CHECK(values(make({3e9}, {1}, DType::i64) * make({4e9}, {1}, DType::i64))[0] ==
        -6446744073709551616.0);
  // torch.pow(tensor([2, 1, -1, -1, 0]), tensor([-1, -2, -1, -2, 0]))
  Tensor base = make({2, 1, -1, -1, 0}, {5}, DType::i64);
  Tensor ex = make({-1, -2, -1, -2, 0}, {5}, DType::i64);
  CHECK(values(pow(base, ex)) == std::vector<double>{0, 1, -1, 1, 1});
  CHECK(values(pow(make({-3, 2}, {2}, DType::i32), 3)) == std::vector<double>{-27, 8});
  CHECK(dtype_name(pow(make({4}, {1}, DType::i64), 0.5).dtype()) == "f32");
  CHECK(values(pow(2, make({0, 1, 3}, {3}, DType::i64))) == std::vector<double>{1, 2, 8});
}

TEST_CASE("broadcasting") {
  auto bs = [](Shape a, Shape b) { return detail::broadcast_shapes("test", a, b).str(); };
  CHECK(bs({3, 1}, {1, 4}) == "(3, 4)");
  CHECK(bs({}, {2, 3}) == "(2, 3)");
  CHECK(bs({5, 1, 3}, {4, 1}) == "(5, 4, 3)");
  CHECK(bs({0, 1}, {1, 3}) == "(0, 3)");
  CHECK(bs({1}, {0}) == "(0)");
  CHECK(error_of<ShapeError>([&] { bs({3}, {4}); }) ==
        "[test] shapes (3) and (4) cannot broadcast");
  Tensor a = make({1, 2, 3}, {3, 1});
  Tensor b = make({10, 20}, {2});
  check_tensor(a + b, {3, 2}, DType::f32, {11, 21, 12, 22, 13, 23});
  check_tensor(a * make({2}, {}), {3, 1}, DType::f32, {2, 4, 6});
  check_tensor(make({1, 2}, {2, 1, 1}) - make({1, 2, 3}, {3}), {2, 1, 3}, DType::f32,
               {0, -1, -2, 1, 0, -1});
}

TEST_CASE("caching allocator counters") {
  // Rounding: multiples of 64 bytes up to 1 KiB, then four classes per power of two up to
  // 256 KiB, then multiples of 16 KiB.
  MemoryStats s0 = cpu_memory_stats();
  {
    Tensor a = zeros({1000});  // 4000 bytes -> the 4096-byte class
    MemoryStats s1 = cpu_memory_stats();
    CHECK(s1.current - s0.current == 4096);
    CHECK(s1.peak >= s1.current);
    CHECK(s1.reserved >= s1.current);
    Tensor b = zeros({3}, Options().dtype(DType::f64));  // 24 bytes -> 64
    CHECK(cpu_memory_stats().current - s0.current == 4096 + 64);
    Tensor c = zeros({300});  // 1200 bytes -> 1280 (1024 + 256)
    CHECK(cpu_memory_stats().current - s0.current == 4096 + 64 + 1280);
  }
  CHECK(cpu_memory_stats().current == s0.current);
  // The peak records the high-water mark until it is reset.
  reset_peak_memory();
  CHECK(cpu_memory_stats().peak == cpu_memory_stats().current);
  {
    Tensor big = zeros({1 << 18});  // 1 MiB
    CHECK(cpu_memory_stats().peak - s0.current == 1 << 20);
  }
  CHECK(cpu_memory_stats().peak - s0.current == 1 << 20);
  CHECK(cpu_memory_stats().current == s0.current);
  reset_peak_memory();
  CHECK(cpu_memory_stats().peak == s0.current);
  // A freed block is cached and reused: a second allocation of the same class reserves nothing.
  { Tensor t = zeros({1 << 18}); }
  int64_t reserved = cpu_memory_stats().reserved;
  { Tensor t = zeros({1 << 18}); }
  CHECK(cpu_memory_stats().reserved == reserved);
  // Large blocks cost at most 16 KiB over their size: W4's first weight, 784 x 1024 floats,
  // is 3,211,264 bytes (four classes per power of two made it 3.5 MiB).
  {
    Tensor w = zeros({784, 1024});
    CHECK(cpu_memory_stats().current - s0.current == 784 * 1024 * 4);
    Tensor v = zeros({70000});  // 280,000 bytes -> 18 x 16 KiB
    CHECK(cpu_memory_stats().current - s0.current == 784 * 1024 * 4 + 18 * 16384);
  }
  { Tensor w = zeros({784, 1024}); }  // the cached block of that exact size is reused
  const int64_t reserved_large = cpu_memory_stats().reserved;
  { Tensor w = zeros({784, 1024}); }
  CHECK(cpu_memory_stats().reserved == reserved_large);
  // A small class keeps at most 1,024 freed blocks: the rest go back to malloc.
  {
    cpu_allocator().empty_cache();
    const int64_t before = cpu_memory_stats().reserved;
    {
      std::vector<Tensor> many;
      for (int i = 0; i < 3000; ++i) many.push_back(zeros({16}));  // 64 bytes each
      CHECK(cpu_memory_stats().reserved - before == 3000 * 64);
    }
    CHECK(cpu_memory_stats().reserved - before == 1024 * 64);
  }
  // empty_cache returns cached blocks to the system.
  cpu_allocator().empty_cache();
  CHECK(cpu_memory_stats().reserved <= reserved - (1 << 20));
}

// The sanitizers reserve terabytes of address space, which the test below caps.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DUET_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DUET_TEST_SANITIZED 1
#endif
#endif
#ifndef DUET_TEST_SANITIZED
namespace {
// In a child process: `t`'s block freed once malloc can give nothing more (its address space
// capped just above what it uses, and every size taken down to 16 bytes). The child exits 0
// if that returned.
int free_when_memory_is_exhausted() {
  // A block of a large size no block had before: caching it needs a new free list. (Made
  // before the fork: OpenMP's threads, which zeros() uses, are not in the child.)
  Tensor t = zeros({777777});
  const pid_t pid = fork();
  if (pid != 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) pages = 0;
    std::fclose(f);
  }
  if (pages == 0) _exit(3);
  const rlim_t cap = static_cast<rlim_t>(pages) * 4096 + (rlim_t(16) << 20);
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) != 0) _exit(4);
  lim.rlim_cur = std::min(cap, lim.rlim_max);  // (the soft limit only: a lower hard one stays)
  if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(4);
  void* chain = nullptr;  // the taken blocks, each holding the address of the one before
  for (size_t size = size_t(1) << 20; size >= 16; size /= 2)
    while (void* p = std::malloc(size)) {
      *static_cast<void**>(p) = chain;
      chain = p;
    }
  t = Tensor();  // deallocate: before the fix, a bad_alloc out of a destructor ended the child
  _exit(chain ? 0 : 5);
}
}  // namespace

TEST_CASE("caching allocator: a block freed when memory is exhausted goes back, no throw") {
  // The fuzzer's find (an ONNX Loop that ran out of memory): caching a freed block allocated
  // a free list, threw std::bad_alloc out of ~TensorImpl and ended the program.
  CHECK(free_when_memory_is_exhausted() == 0);
}
#endif

// ---- dispatch modes ---------------------------------------------------------------------------

// Replaces every add by a sub: a mode decides the result of a call.
struct AddToSub : DispatchMode {
  Tensor handle(const OpCall& call) override {
    if (call.op != OpId::Add || call.inplace_out) return detail::redispatch(this, call);
    return detail::call(OpId::Sub, call.inputs, call.attrs);
  }
};

TEST_CASE("dispatch modes see every op call and forward with redispatch") {
  Tensor x = make({1, 2, 3, 4}, {2, 2});
  CountingMode mode;
  CHECK(detail::mode_depth() == 0);
  {
    ModeGuard guard(&mode);
    CHECK(detail::mode_depth() == 1);
    Tensor y = tanh(x * 2 + 1);
    check_tensor(y, {2, 2}, DType::f32,
                 {std::tanh(3.0), std::tanh(5.0), std::tanh(7.0), std::tanh(9.0)}, 1e-6, 1e-6);
    Tensor m = mean(transpose(x, 0, 1), 0);  // composites dispatch their primitives
    check_tensor(m, {2}, DType::f32, {1.5, 3.5});
    x.add_(1);
  }
  CHECK(detail::mode_depth() == 0);
  CHECK(mode.count("mul") == 1);
  CHECK(mode.count("add") == 2);  // one out of place, one in place
  CHECK(mode.count("tanh") == 1);
  CHECK(mode.count("permute") == 1);
  CHECK(mode.count("sum") == 1);
  CHECK(mode.count("div") == 1);
  CHECK(mode.total() == 7);
  CHECK(values(x) == std::vector<double>{2, 3, 4, 5});
  // Outside the guard nothing is counted.
  Tensor z = x + x;
  CHECK(mode.total() == 7);
}

TEST_CASE("dispatch modes nest; the innermost sees calls first") {
  Tensor a = make({5, 7}, {2});
  Tensor b = make({1, 2}, {2});
  CountingMode outer;
  AddToSub inner;
  {
    ModeGuard g1(&outer);
    ModeGuard g2(&inner);
    CHECK(detail::mode_depth() == 2);
    check_tensor(a + b, {2}, DType::f32, {4, 5});  // the inner mode made it a sub
    check_tensor(a * b, {2}, DType::f32, {5, 14});
  }
  // The sub that the inner mode issued went through every mode again, the outer one included.
  CHECK(outer.count("sub") == 1);
  CHECK(outer.count("add") == 0);
  CHECK(outer.count("mul") == 1);
  check_tensor(a + b, {2}, DType::f32, {6, 9});
}

TEST_CASE("a mode guard pops its mode when an op throws") {
  CountingMode mode;
  try {
    ModeGuard guard(&mode);
    Tensor bad = make({1, 2, 3}, {3}) + make({1, 2}, {2});
    FAIL("no error");
  } catch (const ShapeError& e) {
    CHECK(std::string(e.what()).rfind("[add]", 0) == 0);
  }
  CHECK(detail::mode_depth() == 0);
  CHECK(mode.total() == 0);  // the shape rule throws before any mode sees the call
  // redispatch from a mode that is not on the stack is an internal error.
  Tensor x = make({1}, {1});
  Attrs attrs;
  TensorMeta meta{Shape{1}, DType::f32, Device::cpu(), {}};
  const Tensor* in[] = {&x};
  OpCall call{OpId::Neg, TensorRefs(in, 1), attrs, meta, nullptr};
  CHECK(error_of<InternalError>([&] { detail::redispatch(&mode, call); }).rfind("[internal]", 0) ==
        0);
}

TEST_CASE("modes are per thread; ops run concurrently from several threads") {
  CountingMode mode;
  ModeGuard guard(&mode);
  std::vector<std::thread> threads;
  std::vector<double> results(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &results] {
      CHECK(detail::mode_depth() == 0);
      double acc = 0;
      for (int i = 0; i < 50; ++i) {
        Tensor x = full({64, 65}, double(t + 1));
        acc += sum(matmul(x, transpose(x, 0, 1)) / 65.0).item<double>();
      }
      results[t] = acc;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(results[t] == 50.0 * 64 * 64 * (t + 1) * (t + 1));
  CHECK(mode.total() == 0);  // the other threads' calls never reached this thread's mode
}

// ---- the op table -----------------------------------------------------------------------------

TEST_CASE("op table: every op has a name, a shape rule and a CPU kernel or a view rule") {
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& def = detail::op_def(OpId(i));
    INFO("op " << i << " " << std::string(def.name ? def.name : "(null)"));
    CHECK(int(def.id) == i);
    REQUIRE(def.name != nullptr);
    CHECK(std::string(def.name).size() > 0);
    CHECK(op_name(OpId(i)) == def.name);
    CHECK((def.infer != nullptr));
    if (def.cls == OpClass::View)
      CHECK((def.view != nullptr));
    else
      CHECK((def.kernel[int(DeviceType::CPU)] != nullptr));
    CHECK(op_class(OpId(i)) == def.cls);
    // Arity matches the class: sources take nothing, the others at least one tensor.
    CHECK((def.cls == OpClass::Source) == (def.arity == 0));
  }
  CHECK(op_name(OpId::Add) == "add");
  CHECK(op_name(OpId::MatMul) == "matmul");
  CHECK(op_class(OpId::Sum) == OpClass::Reduction);
  CHECK(op_class(OpId::Reshape) == OpClass::View);
  CHECK(detail::op_def(OpId::Where).arity == 3);
}

TEST_CASE("Attrs compare and hash by value") {
  Attrs a, b;
  a.ints.push_back(1);
  b.ints.push_back(1);
  a.value = Scalar(2.5);
  b.value = Scalar(2.5);
  CHECK(a == b);
  CHECK(a.hash() == b.hash());
  b.keepdim = true;
  CHECK(!(a == b));
  b.keepdim = false;
  b.value = Scalar(2);
  CHECK(!(a == b));
}

TEST_CASE("threads: set and get") {
  int old = get_num_threads();
  set_num_threads(1);
  CHECK(get_num_threads() == 1);
  set_num_threads(old);
  CHECK(get_num_threads() == old);
  CHECK(error_of<ValueError>([] { set_num_threads(0); }).rfind("[set_num_threads]", 0) == 0);
}

}  // namespace duet::test
