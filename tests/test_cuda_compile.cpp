// The compiled face on CUDA: fused groups as NVRTC kernels (cuda/fused.h) and plans replayed as
// CUDA graphs (Note [CUDA graph replay] in trace/plan/executor.h). Every compiled function here
// runs at least four times: the first call runs the plan kernel by kernel (and builds its kernels),
// the second captures the graph, later ones replay it; each call is compared with eager on CUDA
// with new input values. Tables: the elementwise rows of op_rows.h in fusable chains ending in
// reductions; random programs of the fusion and mixed mixes; a training step on CUDA against
// the same step on the CPU over 20 steps; output ownership (a held result is never overwritten
// by a later replay); and the graph's bookkeeping. Without a usable GPU every case returns at
// once, gpu() calls skip() and the binary exits with 77, which ctest reports as Skipped.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>

#include <unistd.h>

#include "cuda/cuda.h"
#include "nn/layers.h"
#include "nn/optim/optim.h"
#include "nn/optim/schedulers.h"
#include "nn/parallel.h"
#include "nn/utils.h"
#include "op_rows.h"
#include "random_program.h"
#include "trace/check.h"
#include "trace/compare.h"
#include "trace/compile.h"
#include "trace/plan/codegen.h"
#include "trace/program.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;

// Eager on CUDA against compiled on CUDA: f32 within 1e-5 relative (plus 1e-5 absolute, and the
// row's own looser tolerance), f64 within 1e-9, others exactly. Fused kernels round each op as
// eager does (Add, Sub and Mul are never contracted) but sum reductions in another order.
void check_close(const Tensor& got, const Tensor& want, double row32 = 0) {
  REQUIRE(got.defined());
  CHECK(got.device() == want.device());
  CHECK(got.sizes().str() == want.sizes().str());
  CHECK(dtype_name(got.dtype()) == dtype_name(want.dtype()));
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) return;
  const DType d = want.dtype();
  const double tol = d == DType::f32 ? std::max(1e-5, row32) : d == DType::f64 ? 1e-9 : 0;
  const std::string m = differences(values(got), values(want), tol, tol);
  CHECK_MESSAGE(m.empty(), m);
}

// fn compiled, called `calls` times on fresh CUDA inputs from make(); each result against eager.
template <class Fn, class Make>
CompileStats check_calls(const Fn& fn, const Make& make, int calls = 4, double row32 = 0) {
  auto c = compile([&fn](const Ins& x) { return fn(x); });
  for (int i = 0; i < calls; ++i) {
    INFO("call " << i + 1);
    const Ins in = make();
    const Tensor want = fn(in);
    const Tensor got = c(in);
    check_close(got, want, row32);
  }
  CHECK(c.stats().traces == 1);
  return c.stats();
}

// fn compiled on CUDA leaves (values from make()): its output and, through duet::grad, the
// gradients of a random output gradient, against eager, over `calls` calls.
template <class Fn, class Make>
void check_grads_compiled(const Fn& fn, const Make& make, Rng& rng, double row32 = 0) {
  auto c = compile([&fn](const Ins& x) { return fn(x); });
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call + 1 << ", gradients");
    Ins leaves;
    for (const Tensor& t : make()) leaves.push_back(cuda_like(t).detach().requires_grad_());
    const Tensor want = fn(leaves);
    const Tensor got = c(leaves);
    check_close(got, want, row32);
    const Tensor g =
        cuda_like(make_layout(random_values(want.numel(), Domain{-1, 1}, want.dtype(), rng),
                              want.sizes(), want.dtype(), Layout::Contiguous));
    const Ins gw = grad({want}, leaves, {g});
    const Ins gg = grad({got}, leaves, {g});
    REQUIRE(gg.size() == gw.size());
    for (size_t i = 0; i < gw.size(); ++i) {
      INFO("gradient of input " << i);
      check_close(gg[i], gw[i], row32);
    }
  }
}

bool mixes_devices(const Error& e) {
  const std::string m = e.what();
  return m.find("different devices") != std::string::npos;
}

}  // namespace

TEST_CASE("cuda compiled: op, reduce, view and matmul rows equal eager, with gradients") {
  if (!gpu()) return;
  Rng rng(311);
  int rows = 0, cpu_constants = 0;
  for (const OpRow& row : op_rows()) {
    if (row.shapes.empty()) continue;  // random draws: the random programs cover them
    for (DType dt : row.dtypes) {
      INFO(std::string(row.name) << " on " << dtype_name(dt));
      auto make_in = [&] {
        Ins in;
        for (size_t i = 0; i < row.shapes.size(); ++i) {
          const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
          in.push_back(make_layout(random_values(row.shapes[i].numel(), d, dt, rng), row.shapes[i],
                                   dt, Layout::Contiguous));
        }
        return in;
      };
      try {
        (void)row.fn(cuda_like(make_in()));
      } catch (const DeviceError& e) {
        if (!mixes_devices(e)) throw;
        ++cpu_constants;  // index tensors built on the CPU inside the call
        break;
      }
      check_calls(
          row.fn, [&] { return cuda_like(make_in()); }, 4, row.tol32);
      if (row.grad && !row.index_result && (dt == DType::f32 || dt == DType::f64))
        check_grads_compiled(row.fn, make_in, rng, row.tol32);
      ++rows;
    }
  }
  for (const ReduceRow& row : reduce_rows())
    for (DType dt : row.dtypes) {
      if (dt != DType::f32 && dt != DType::f64) continue;
      for (const std::vector<int64_t>& dims : {std::vector<int64_t>{1}, {0}, {0, 2}, {}}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << " over " << dims.size() << " dims");
        auto make_in = [&] {
          return Ins{
              make_layout(random_values(60, Domain{}, dt, rng), {3, 4, 5}, dt, Layout::Transposed)};
        };
        auto fn = [&row, dims](const Ins& x) { return row.fn(x[0], Dims(dims), false); };
        check_calls(fn, [&] { return cuda_like(make_in()); });
        check_grads_compiled(fn, make_in, rng);
        ++rows;
      }
    }
  for (const ViewRow& row : view_rows()) {
    if (!row.in.numel()) continue;
    INFO(std::string(row.name));
    auto make_in = [&] {
      return Ins{make_layout(random_values(row.in.numel(), Domain{}, DType::f32, rng), row.in,
                             DType::f32, Layout::Contiguous)};
    };
    // A view alone is returned as a view of the argument: multiply, so the plan computes.
    auto fn = [&row](const Ins& x) { return row.fn(x[0] * 2.0) + 1.0; };
    check_calls(fn, [&] { return cuda_like(make_in()); });
    ++rows;
  }
  for (const MatmulRow& row : matmul_rows())
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(std::string(row.name) << " on " << dtype_name(dt));
      auto make_in = [&] {
        return Ins{make_layout(random_values(row.a.numel(), Domain{}, dt, rng), row.a, dt, row.la),
                   make_layout(random_values(row.b.numel(), Domain{}, dt, rng), row.b, dt, row.lb)};
      };
      auto fn = [](const Ins& x) { return matmul(x[0], x[1]); };
      check_calls(
          fn, [&] { return cuda_like(make_in()); }, 4, 1e-4);
      if (row.a.numel() && row.b.numel()) check_grads_compiled(fn, make_in, rng, 1e-4);
      ++rows;
    }
  MESSAGE(fmt::format("{} rows compiled on CUDA; {} op rows build CPU constants (skipped)", rows,
                      cpu_constants));
}

TEST_CASE("cuda compiled: elementwise rows in fused chains and reductions equal eager") {
  if (!gpu()) return;
  Rng rng(301);
  const CudaGraphStats before = cuda_graph_stats();
  int fused = 0, graphs = 0;
  for (const ElementwiseRow& row : elementwise_rows()) {
    for (DType dt : {DType::f32, DType::f64}) {
      if (std::find(row.dtypes.begin(), row.dtypes.end(), dt) == row.dtypes.end()) continue;
      for (const Shape& shape : {Shape{3, 5}, Shape{300, 257}, Shape{64, 1024}}) {
        INFO(std::string(row.name) << " " << dtype_name(dt) << " " << shape.str());
        auto make = [&] {
          Ins in;
          for (int i = 0; i < row.arity; ++i) {
            const DType di = row.cond_first && i == 0 ? DType::b8 : dt;
            std::vector<double> v = random_values(shape.numel(), row.domains[i], di, rng);
            // Input 1 transposed: the fused kernel's strided loads.
            in.push_back(cuda_like(make_sample(v, shape, shape, di,
                                               i == 1 ? Layout::Transposed : Layout::Contiguous)));
          }
          return in;
        };
        // The row's op inside a chain (one fused kernel), its values kept, and a row reduction
        // and a column reduction of the chain (a reduction closing the group).
        auto chain = [&row](const Ins& x) {
          Tensor y = row.fn(x);
          if (!is_floating(y.dtype())) y = y.to(x.back().dtype());
          const Tensor z = tanh(y * 0.5 + 0.25) + y;
          return cat({reshape(z, {-1}), sum(z * z, {1}), max(z, {0}), sum(z, {0})}, 0);
        };
        const CompileStats s = check_calls(chain, make, 4, row.rtol32);
        fused += s.fused_kernels > 0;
        graphs += s.cuda_graph_plans > 0;
      }
    }
  }
  CHECK(fused > 0);
  CHECK(graphs > 0);
  const CudaGraphStats after = cuda_graph_stats();
  CHECK(after.captured > before.captured);
  CHECK(after.replays > before.replays);
  MESSAGE(fmt::format(
      "{} functions with fused kernels, {} as CUDA graphs; {} captures failed "
      "({}); NVRTC: {} built, {} from disk, {:.1f} s",
      fused, graphs, after.failed - before.failed, after.last_failure, cuda::codegen_stats().built,
      cuda::codegen_stats().disk_hits, cuda::codegen_stats().build_ms / 1e3));
}

TEST_CASE("cuda compiled: fused reductions of one long row or a few long columns, in slices") {
  // Too few rows or column blocks to fill the device: each is folded in slices by blocks of
  // their own, then the partials in order (two passes). The eager sums do the same in their own
  // kernels; f32 sums of a million terms agree within 1e-4.
  if (!gpu()) return;
  Rng rng(311);
  struct Case {
    Shape shape;
    std::function<Tensor(const Tensor&)> fn;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{1 << 20}, [](const Tensor& x) { return sum(tanh(x) * x); }, "a full sum"},
      {{3, 200000}, [](const Tensor& x) { return max(exp(x) - x, {1}); }, "three long rows (max)"},
      {{100000, 8}, [](const Tensor& x) { return sum(x * x + 1.0, {0}); }, "eight long columns"},
      {{20000, 40}, [](const Tensor& x) { return min(x - 2.0, {0}); }, "40 columns (min)"},
  };
  for (const Case& c : cases)
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(std::string(c.what) << " " << dtype_name(dt));
      auto make = [&] {
        return Ins{cuda_like(make_layout(random_values(c.shape.numel(), Domain{-2, 2}, dt, rng),
                                         c.shape, dt, Layout::Contiguous))};
      };
      const CompileStats s = check_calls([&c](const Ins& x) { return c.fn(x[0]); }, make, 4, 1e-4);
      CHECK(s.fused_kernels > 0);
    }
}

// Random programs of the fusion and mixed mixes, compiled, against eager on the device that
// `to_device` moves their inputs to. Inputs the program captures (parameters, and state buffers
// it writes in place) are the same tensors at every call, one set for eager and one for the
// compiled function, given each call's values in place; the rest are arguments. Results within
// 1e-4 (as test_fusion's random programs): an f64 value may depend on an f32 sum that a fused
// kernel adds in another order, which moves it by an f32 ulp. Returns {compared, skipped}.
std::pair<int, int> random_programs(const std::function<Ins(const Ins&)>& to_device) {
  int run = 0, skipped = 0;
  for (Mix mix : {Mix::Fusion, Mix::Mixed}) {
    for (uint64_t seed = 0; seed < 40; ++seed) {
      Program p;
      p.seed = seed;
      Generator gen(p, seed, mix);
      if (!gen.build()) continue;
      INFO("seed " << seed << "\n" << program_text(p));
      Rng r = rng_for(seed, 9);
      std::vector<Tensor> cap_eager(p.inputs.size()), cap_compiled(p.inputs.size());
      auto all_inputs = [&p](const std::vector<Tensor>& caps, const Ins& args) {
        Ins in;
        size_t a = 0;
        for (size_t i = 0; i < p.inputs.size(); ++i)
          in.push_back(p.inputs[i].captured ? caps[i] : args[a++]);
        return in;
      };
      auto c =
          compile([&](const Ins& args) { return run_program(p, all_inputs(cap_compiled, args)); });
      bool ok = true;
      for (int call = 0; call < 4 && ok; ++call) {
        const Values vals = call == 0 ? gen.first_values() : gen.sample_values(r);
        const Ins fresh = to_device(build_inputs(p, vals, false));
        Ins args;
        for (size_t i = 0; i < p.inputs.size(); ++i) {
          if (!p.inputs[i].captured) {
            args.push_back(fresh[i]);
            continue;
          }
          for (std::vector<Tensor>* caps : {&cap_eager, &cap_compiled}) {
            if (!(*caps)[i].defined()) {
              (*caps)[i] = fresh[i].clone();
            } else {
              NoGradGuard ng;
              (*caps)[i].copy_(fresh[i]);
            }
          }
        }
        manual_seed(kRandSeed);
        std::vector<Tensor> want;
        try {
          want = run_program(p, all_inputs(cap_eager, args));
        } catch (const DeviceError&) {
          ok = false;  // a program building CPU tensors inside (an index table): CPU-only
          ++skipped;
          break;
        }
        manual_seed(kRandSeed);
        const std::vector<Tensor> got = c(args);
        REQUIRE(got.size() == want.size());
        auto same = [](const Tensor& g, const Tensor& w) {
          CHECK(g.device() == w.device());
          CHECK(g.sizes().str() == w.sizes().str());
          CHECK(std::string(dtype_name(g.dtype())) == std::string(dtype_name(w.dtype())));
          if (g.sizes() != w.sizes() || g.dtype() != w.dtype()) return;
          if (floating(w) && max_abs(w) > 1e4) return;  // ill-conditioned
          const std::string m = differences(values(g), values(w), 1e-4, 1e-4);
          CHECK_MESSAGE(m.empty(), m);
        };
        for (size_t k = 0; k < got.size(); ++k) {
          INFO("call " << call + 1 << ", output " << k);
          same(got[k], want[k]);
        }
        for (size_t i = 0; i < p.inputs.size(); ++i)
          if (p.inputs[i].buffer) {
            INFO("call " << call + 1 << ", buffer %" << i << " after the call");
            same(cap_compiled[i], cap_eager[i]);
          }
      }
      run += ok;
    }
  }
  return {run, skipped};
}

TEST_CASE("cuda compiled: random programs of the fusion and mixed mixes equal eager") {
  if (!gpu()) return;
  const auto [run, skipped] = random_programs([](const Ins& in) { return cuda_like(in); });
  CHECK(run >= 40);
  MESSAGE(fmt::format("{} programs compared, {} CPU-only", run, skipped));
}

TEST_CASE("cuda compiled: print copies a device value to the host at each call") {
  if (!gpu()) return;
  static std::vector<std::string> lines;
  const detail::PrintSink prev =
      detail::set_print_sink([](const std::string& l) { lines.push_back(l); });
  auto f = compile([](Tensor x) {
    Tensor y = x * 2;
    print(y, "y {}");
    return y + 1;
  });
  const Tensor a = cuda_like(make({1, 2}, {2}));
  for (int i = 0; i < 3; ++i) CHECK(values(f(a)) == std::vector<double>{3, 5});
  detail::set_print_sink(prev);
  REQUIRE(lines.size() == 3);
  CHECK(lines[2] == fmt::format("y {}\n", make({2, 4}, {2})));
}

TEST_CASE("cuda compiled: a training step on CUDA matches the CPU over 20 steps") {
  if (!gpu()) return;
  auto make_model = [] {
    manual_seed(7);
    return nn::Sequential(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 64), nn::Tanh(),
                          nn::Linear(64, 10));
  };
  nn::Sequential cpu_model = make_model(), cuda_model = make_model();
  cuda_model.to(Device::cuda());
  optim::Adam cpu_opt(cpu_model.parameters()), cuda_opt(cuda_model.parameters());
  auto step_of = [](nn::Sequential& m, optim::Adam& opt) {
    return compile([&m, &opt](Tensor x, Tensor y) {
      opt.zero_grad();
      Tensor loss = cross_entropy(m(x), y);
      loss.backward();
      opt.step();
      return loss;
    });
  };
  auto cpu_step = step_of(cpu_model, cpu_opt);
  auto cuda_step = step_of(cuda_model, cuda_opt);
  manual_seed(8);
  for (int i = 0; i < 20; ++i) {
    INFO("step " << i + 1);
    const Tensor x = randn({16, 32});
    const Tensor y = randint(10, {16});
    const double lc = cpu_step(x, y).item<double>();
    const double lg = cuda_step(x.to(Device::cuda()), y.to(Device::cuda())).item<double>();
    CHECK(lg == doctest::Approx(lc).epsilon(1e-4));
  }
  const auto pc = cpu_model.parameters(), pg = cuda_model.parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t k = 0; k < pc.size(); ++k) {
    CHECK(pg[k].device() == Device::cuda());
    const std::string m = differences(values(pg[k]), values(pc[k]), 1e-3, 1e-4);
    CHECK_MESSAGE(m.empty(), "parameter " << k << ": " << m);
  }
  CHECK(cuda_step.stats().traces == 1);
  CHECK(cuda_step.stats().cuda_graph_plans >= 1);
  // Built and replayed: gather (forward) and scatter_add (backward) check their indices on the
  // device, so nothing in the step synchronizes the host and fails the capture.
  CHECK(cuda_step.stats().cuda_graph_replays >= 18);
}

TEST_CASE("cuda: a step that zeroes .grad in place and updates by hand, eager and compiled") {
  if (!gpu()) return;
  // g.zero_() writes a Scalar, which lives on the CPU: on CUDA the copy once read it through a
  // CPU view and threw "[copy_] the result on cpu cannot be written in place into a tensor on
  // cuda:0", eagerly and in the trace (duet_bench's W4 and W6 steps).
  auto losses = [](Device dev, bool compiled) {
    manual_seed(11);
    Tensor w = (randn({8, 4}) * 0.1).to(dev).requires_grad_();
    Tensor b = zeros({4}).to(dev).requires_grad_();
    auto step = [w, b](Tensor x, Tensor y) {
      {
        NoGradGuard ng;
        for (const Tensor& p : {w, b}) {
          Tensor g = p.grad();
          if (g.defined()) g.zero_();
        }
      }
      Tensor loss = cross_entropy(matmul(x, w) + b, y);
      loss.backward();
      {
        NoGradGuard ng;
        for (Tensor p : {w, b}) p.sub_(p.grad() * 0.1);
      }
      return loss;
    };
    auto cstep = compile(step);
    std::vector<double> out;
    manual_seed(12);
    for (int i = 0; i < 4; ++i) {
      const Tensor x = randn({5, 8}).to(dev), y = randint(4, {5}).to(dev);
      out.push_back((compiled ? cstep(x, y) : step(x, y)).item<double>());
    }
    CHECK(w.device() == dev);
    CHECK(w.grad().device() == dev);
    return out;
  };
  const std::vector<double> want = losses(Device::cpu(), false);
  for (bool compiled : {false, true}) {
    INFO((compiled ? "compiled" : "eager"));
    const std::vector<double> got = losses(Device::cuda(), compiled);
    for (size_t i = 0; i < want.size(); ++i)
      CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
  Tensor t = make({1, 2, 3}, {3}).to(Device::cuda());
  t.zero_();
  CHECK(t.device() == Device::cuda());
  CHECK(values(t) == std::vector<double>{0, 0, 0});
}

TEST_CASE("cuda compiled: a copied view of a parameter follows its updates under a CUDA graph") {
  if (!gpu()) return;
  // reshape(w.t()) has no strides: the plan copies it in a hoisted step, which re-runs when w
  // changes. The copy once went to a new buffer each time, while the captured graph kept
  // reading the first one (stale weights, then freed memory).
  Tensor w = make({1, 2, 3, 4, 5, 6}, {2, 3}).to(Device::cuda());
  auto body = [&w](Tensor x) { return x * reshape(transpose(w, 0, 1), {2, 3}) + 1.0; };
  auto f = compile(body);
  const Tensor x = make({1, -1, 2, 0.5, 3, -2}, {2, 3}).to(Device::cuda());
  for (int call = 0; call < 6; ++call) {
    INFO("call " << call + 1);
    check_close(f(x), body(x));
    NoGradGuard ng;
    w.add_(1.0);
  }
  CHECK(f.stats().cuda_graph_plans == 1);
}

TEST_CASE("cuda compiled: another thread's eager work during a capture runs, outside the graph") {
  if (!gpu()) return;
  // Captures once ran on the device's one stream: kernels another thread queued meanwhile were
  // recorded into the graph instead of running, and its synchronizations broke the capture.
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, rounds{0};
  std::thread other([&] {
    const Tensor a = make({1, 2, 3, 4}, {4}).to(Device::cuda());
    while (!stop) {
      try {
        if (values(a * 2.0 + 1.0) != std::vector<double>{3, 5, 7, 9}) ++bad;
      } catch (const std::exception&) {
        ++bad;
      }
      ++rounds;
    }
  });
  for (int k = 0; k < 20; ++k) {
    auto f = compile([](Tensor x) { return tanh(x * 3.0) + x; });  // a capture per function
    const Tensor x = make({0.1, 0.2}, {2}).to(Device::cuda());
    for (int call = 0; call < 4; ++call) check_close(f(x), tanh(x * 3.0) + x);
    CHECK(f.stats().cuda_graph_replays >= 2);
  }
  stop = true;
  other.join();
  CHECK(rounds > 0);
  CHECK(bad == 0);
}

TEST_CASE("cuda compiled: a result held from one call is never overwritten by the next") {
  if (!gpu()) return;
  Tensor w = make({1, 2, 3, 4}, {4}).to(Device::cuda());
  auto f = compile([&w](Tensor x) {
    return std::vector<Tensor>{tanh(x * 2.0) + w, sum(x * w), x * 1.0};
  });
  std::vector<std::vector<Tensor>> held;
  std::vector<std::vector<std::vector<double>>> want;
  for (int call = 0; call < 6; ++call) {
    const Tensor x = make({0.1 * call, -0.2, 0.3, 0.5 * call}, {4}).to(Device::cuda());
    held.push_back(f(x));
    want.emplace_back();
    for (const Tensor& t : held.back()) want.back().push_back(values(t));
    CHECK(values(held.back()[2]) == values(x));
  }
  for (size_t call = 0; call < held.size(); ++call)
    for (size_t k = 0; k < held[call].size(); ++k) {
      INFO("call " << call + 1 << ", output " << k);
      CHECK(values(held[call][k]) == want[call][k]);
    }
  // Writing into a held result changes nothing in the next call.
  held.back()[0].zero_();
  const std::vector<Tensor> again = f(make({1, 1, 1, 1}, {4}).to(Device::cuda()));
  const Tensor expect = tanh(make({2, 2, 2, 2}, {4}).to(Device::cuda())) + w;
  check_close(again[0], expect);
  CHECK(f.stats().cuda_graph_plans == 1);
  // A result that is an argument stays that argument (no graph: a copy would not alias it).
  auto same = compile([](Tensor x) { return std::vector<Tensor>{x, x + 1.0}; });
  for (int call = 0; call < 4; ++call) {
    const Tensor x = make({1.0 * call, 2}, {2}).to(Device::cuda());
    CHECK(same(x)[0].is_same(x));
  }
  CHECK(same.stats().cuda_graph_plans == 0);
}

TEST_CASE("cuda compiled: replays read the inputs in place and hand out their own buffers") {
  if (!gpu()) return;
  auto f = compile([](Tensor x) { return tanh(x) * 2.0 + 1.0; });
  Tensor x = randn({1000}).to(Device::cuda());
  const Tensor want = tanh(x) * 2.0 + 1.0;
  // The same input, results dropped: one graph, no copies in or out.
  CudaGraphStats before = cuda_graph_stats();
  for (int call = 0; call < 6; ++call) check_close(f(x), want);
  CudaGraphStats after = cuda_graph_stats();
  CHECK(after.captured == before.captured + 1);
  CHECK(after.replays == before.replays + 5);
  CHECK(after.input_copies == before.input_copies);
  CHECK(after.ungraphed_runs == before.ungraphed_runs);
  // The input changed in place: the graph reads it where it is.
  {
    NoGradGuard ng;
    x.mul_(0.5);
  }
  check_close(f(x), tanh(x) * 2.0 + 1.0);
  // The previous result held at each call (a loss kept for printing): two graphs alternate.
  before = cuda_graph_stats();
  Tensor last = f(x);
  for (int call = 0; call < 6; ++call) {
    const Tensor now = f(x);
    check_close(last, tanh(x) * 2.0 + 1.0);  // not overwritten by the call that made `now`
    last = now;
  }
  after = cuda_graph_stats();
  CHECK(after.captured == before.captured + 1);
  CHECK(after.replays == before.replays + 7);
  CHECK(after.ungraphed_runs == before.ungraphed_runs);
  // A new input tensor at each call, at addresses that move: a graph with input buffers.
  before = cuda_graph_stats();
  std::vector<Tensor> keep;
  for (int call = 0; call < 6; ++call) {
    keep.push_back(randn({1000}).to(Device::cuda()));  // alive: the next lands elsewhere
    check_close(f(keep.back()), tanh(keep.back()) * 2.0 + 1.0);
  }
  after = cuda_graph_stats();
  CHECK(after.input_copies >= before.input_copies + 4);
  CHECK(after.ungraphed_runs == before.ungraphed_runs);
  // Every result held: four graphs, then calls without one, all correct.
  before = cuda_graph_stats();
  std::vector<Tensor> held;
  for (int call = 0; call < 8; ++call) held.push_back(f(x));
  for (const Tensor& h : held) check_close(h, tanh(x) * 2.0 + 1.0);
  after = cuda_graph_stats();
  CHECK(after.ungraphed_runs > before.ungraphed_runs);
  CHECK(f.stats().traces == 1);
}

TEST_CASE("cuda compiled: running out of memory during a capture leaves the plan without a graph") {
  // The capture allocates its results from a fresh pool, so with the device filled it fails with
  // out of memory. The capture must end cleanly (no empty_cache syncing the captured stream),
  // leave no sticky error for the next kernel, and the call still compute its result, kernel by
  // kernel, from the blocks the main cache kept.
  if (!gpu()) return;
  auto f = compile([](Tensor x) { return x * 2.0 + 1.0; });
  const Tensor x = full({1 << 20}, 3.0, Options().device(Device::cuda()));
  CHECK(f(x).to_vector<float>()[5] == 7.0f);  // the first call: no capture; its block is cached
  cuda::synchronize();
  std::vector<void*> filler;
  for (size_t chunk = size_t(1) << 30; chunk >= (size_t(1) << 20);) {
    void* p = nullptr;
    if (cudaMalloc(&p, chunk) == cudaSuccess) {
      filler.push_back(p);
    } else {
      cudaGetLastError();
      chunk /= 2;
    }
  }
  const CudaGraphStats before = cuda_graph_stats();
  std::vector<float> got;
  try {
    got = f(x).to_vector<float>();
  } catch (const Error& e) {
    const std::string m = std::string("the call failed: ") + e.what();
    FAIL_CHECK(m);
  }
  const CudaGraphStats after = cuda_graph_stats();
  for (void* p : filler) cudaFree(p);
  REQUIRE(got.size() == size_t(1) << 20);
  CHECK(got[0] == 7.0f);
  CHECK(got.back() == 7.0f);
  CHECK(after.failed == before.failed + 1);
  CHECK(after.last_failure.find("out of memory") != std::string::npos);
  // No error left behind: eager kernels and later calls run.
  CHECK((x + 1.0).to_vector<float>()[0] == 4.0f);
  for (int i = 0; i < 3; ++i) CHECK(f(x).to_vector<float>()[7] == 7.0f);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("cuda compiled: graphs update captured tensors, recapture on new storage, can be off") {
  if (!gpu()) return;
  // A captured counter written in place at every call: the version moves and values follow.
  Tensor count = zeros({2}, Options().device(Device::cuda()));
  auto inc = compile([&count](Tensor step) {
    count.add_(step);
    return count * 1.0;
  });
  const CudaGraphStats before = cuda_graph_stats();
  for (int i = 1; i <= 5; ++i) {
    const uint32_t v0 = count.impl()->storage->version_.load();
    const Tensor r = inc(full({2}, 1.0, Options().device(Device::cuda())));
    CHECK(count.to_vector<float>() == std::vector<float>{float(i), float(i)});
    CHECK(r.to_vector<float>() == std::vector<float>{float(i), float(i)});
    CHECK(count.impl()->storage->version_.load() != v0);
  }
  CHECK(cuda_graph_stats().captured == before.captured + 1);
  CHECK(cuda_graph_stats().replays >= before.replays + 4);
  // A module moved away and back gets new storage: the next call captures again.
  nn::Linear lin(4, 3);
  lin.to(Device::cuda());
  auto g = compile([&lin](Tensor x) { return lin(x); });
  const Tensor x = randn({2, 4}).to(Device::cuda());
  for (int i = 0; i < 3; ++i) check_close(g(x), lin(x));
  lin.to(Device::cpu());
  lin.to(Device::cuda());
  const int64_t captured = cuda_graph_stats().captured;
  for (int i = 0; i < 3; ++i) check_close(g(x), lin(x));
  CHECK(cuda_graph_stats().captured >= captured);
  // Off: the "cuda_graph" pass, and plans with a transfer.
  auto off = compile([](Tensor a) { return a * 2.0; }, CompileOptions{{}, {"cuda_graph"}, 8});
  const Tensor a = ones({3}, Options().device(Device::cuda()));
  for (int i = 0; i < 3; ++i) off(a);
  CHECK(off.stats().cuda_graph_plans == 0);
  auto moved = compile([](Tensor a) { return (a * 2.0).to(Device::cpu()); });
  for (int i = 0; i < 3; ++i) CHECK(moved(a).to_vector<float>() == std::vector<float>{2, 2, 2});
  CHECK(moved.stats().cuda_graph_plans == 0);
}

// Note [Parallel NVRTC builds]: the first run builds all of a plan's kernels in one batch, side
// by side. Each must load as its own program (a kernel handed another's image computes the wrong
// thing), and a second function with the same programs finds them loaded.
TEST_CASE("cuda compiled: a plan's first run builds its kernels side by side, each its own") {
  if (!gpu()) return;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("duet-cuda-batch-{}", getpid());
  fs::remove_all(dir);
  const std::string before_dir = codegen::cache_dir();
  codegen::set_cache_dir(dir.string());
  Rng rng(7);
  // A salt no other test uses, so that every program is new to this process too.
  const double salt = 0.123456789;
  auto fn = [salt](const Ins& x) {
    const Tensor a = tanh(x[0] * salt + 0.25);
    const Tensor b = matmul(a, x[1]);
    const Tensor c = sigmoid(b) * b - salt;
    const Tensor d = matmul(c, x[1]);
    return sum(exp(d * salt), {1}) + sum(a * a, {1}) + max(c, {1});
  };
  auto make_in = [&] {
    return Ins{
        cuda_like(make(random_values(8 * 16, Domain{-1, 1}, DType::f32, rng), {8, 16}, DType::f32)),
        cuda_like(
            make(random_values(16 * 16, Domain{-1, 1}, DType::f32, rng), {16, 16}, DType::f32))};
  };
  const cuda::CodegenStats s0 = cuda::codegen_stats();
  const CompileStats st = check_calls(fn, make_in, 3);
  const cuda::CodegenStats s1 = cuda::codegen_stats();
  CHECK(st.fused_kernels >= 3);
  CHECK(s1.built - s0.built >= 3);
  CHECK(s1.built - s0.built <= st.fused_kernels);
  check_calls(fn, make_in, 2);  // another function, the same programs: loaded already
  const cuda::CodegenStats s2 = cuda::codegen_stats();
  CHECK(s2.built == s1.built);
  CHECK(s2.memory_hits - s1.memory_hits >= 3);
  codegen::set_cache_dir(before_dir);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE("cuda compiled: matmul + bias (+ relu) runs as one cuBLASLt call with an epilogue") {
  if (!gpu()) return;
  Rng rng(41);
  for (DType dt : {DType::f32, DType::f64}) {
    for (bool transposed : {false, true}) {
      INFO(dtype_name(dt) << (transposed ? ", transposed weight" : ""));
      const Shape ws = transposed ? Shape{48, 32} : Shape{32, 48};
      const Tensor w = cuda_like(make_layout(random_values(ws.numel(), Domain{-1, 1}, dt, rng), ws,
                                             dt, Layout::Contiguous));
      const Tensor wt = transposed ? permute(w, {1, 0}) : w;
      const Tensor b = cuda_like(make(random_values(48, Domain{-1, 1}, dt, rng), {48}, dt));
      auto make_x = [&] {
        return Ins{cuda_like(make(random_values(16 * 32, Domain{-1, 1}, dt, rng), {16, 32}, dt))};
      };
      const CompileStats a =
          check_calls([&](const Ins& x) { return relu(matmul(x[0], wt) + b); }, make_x, 4, 1e-5);
      const CompileStats c =
          check_calls([&](const Ins& x) { return matmul(x[0], wt) + b; }, make_x, 4, 1e-5);
      CHECK(a.gemm_epilogues == 1);
      CHECK(c.gemm_epilogues == 1);
    }
  }
}

TEST_CASE("cuda compiled: matmul + bias on offset views (x[:, 1:], a chunk of a packed bias)") {
  if (!gpu()) return;
  // Operands 4 bytes past an aligned address: cuBLASLt must be told their alignment, or its
  // heuristic picks a kernel with vector loads that faults; a misaligned bias runs as two
  // kernels.
  Rng rng(43);
  const Tensor packed =
      cuda_like(make(random_values(33 * 40, Domain{-1, 1}, DType::f32, rng), {33, 40}, DType::f32));
  const Tensor w = slice(packed, 0, 1, 33);  // starts 160 bytes in: aligned to 32
  const Tensor bias_pack =
      cuda_like(make(random_values(41, Domain{-1, 1}, DType::f32, rng), {41}, DType::f32));
  for (int64_t boff : {0, 1}) {
    INFO("bias offset " << boff);
    const Tensor b = slice(bias_pack, 0, boff, boff + 40);
    auto make_x = [&] {
      const Tensor big = cuda_like(
          make(random_values(16 * 33, Domain{-1, 1}, DType::f32, rng), {16, 33}, DType::f32));
      return Ins{slice(big, 1, 1, 33)};  // x[:, 1:]: 4 bytes past the start, rows of 33
    };
    check_calls([&](const Ins& x) { return relu(matmul(x[0], w) + b); }, make_x, 4, 1e-5);
  }
}

TEST_CASE("cuda compiled: a mean over a dynamic batch on CUDA (a symbolic count on the device)") {
  if (!gpu()) return;
  auto f = compile([](Tensor x) { return mean(x * 2.0, {0}); }, CompileOptions{{{0, 0}}, {}, 8});
  for (int64_t b : {3, 5, 8, 5}) {
    INFO("batch " << b);
    const Tensor x = randn({b, 4}).to(Device::cuda());
    check_close(f(x), mean(x * 2.0, {0}));
  }
  CHECK(f.stats().traces == 1);
}

TEST_CASE(
    "cuda compiled: a data-parallel step's all-reduce goes through NCCL into the CUDA graph") {
  if (!gpu()) return;
  // A world of one on this machine's GPU: the same step that a job of several GPUs runs, with the
  // gradients averaged over the ranks by NCCL on duet's stream, captured and replayed.
  dist::init();
  if (dist::backend(DeviceType::CUDA) != "nccl") {
    MESSAGE("this build has no NCCL; CUDA collectives copy in a world of one");
  }
  auto make_model = [] {
    manual_seed(11);
    return nn::Sequential(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 10));
  };
  nn::Sequential ref_model = make_model(), model = make_model();
  ref_model.to(Device::cuda());
  model.to(Device::cuda());
  optim::SGD ref_opt(ref_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto plain = [](nn::Sequential& m, optim::SGD& o, const Tensor& x, const Tensor& y) {
    o.zero_grad();
    Tensor loss = cross_entropy(m(x), y);
    loss.backward();
    o.step();
    return loss;
  };
  auto ref_step = compile([&](Tensor x, Tensor y) { return plain(ref_model, ref_opt, x, y); });
  auto step = compile([&](Tensor x, Tensor y) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model(x), y);
    loss.backward();
    for (Tensor& p : model.parameters())
      p.grad().copy_(dist::all_reduce(p.grad(), dist::ReduceOp::Mean));
    opt.step();
    return dist::all_reduce(loss.detach(), dist::ReduceOp::Mean);
  });
  manual_seed(12);
  for (int i = 0; i < 20; ++i) {
    INFO("step " << i + 1);
    const Tensor x = randn({16, 32}).to(Device::cuda());
    const Tensor y = randint(10, {16}).to(Device::cuda());
    const double lr = ref_step(x, y).item<double>();
    const double l = step(x, y).item<double>();
    CHECK(l == doctest::Approx(lr).epsilon(1e-6));
  }
  const auto pr = ref_model.parameters(), p = model.parameters();
  for (size_t k = 0; k < p.size(); ++k) {
    const std::string m = differences(values(p[k]), values(pr[k]), 1e-6, 1e-6);
    CHECK_MESSAGE(m.empty(), "parameter " << k << ": " << m);
  }
  CHECK(step.stats().traces == 1);
  CHECK(step.stats().cuda_graph_plans >= 1);
  CHECK(step.stats().cuda_graph_replays >= 18);
  const std::string g = step.graph().str();
  CHECK(contains(g, "all_reduce"));
  MESSAGE("CUDA transport: " << dist::backend(DeviceType::CUDA) << ", graph replays "
                             << step.stats().cuda_graph_replays);
  // The same with DistributedDataParallel: its bucket all-reduces (NCCL) and their waits in the
  // step's graph, replayed as a CUDA graph.
  nn::Sequential ddp_model = make_model();
  ddp_model.to(Device::cuda());
  nn::DistributedDataParallel ddp(ddp_model);
  optim::SGD ddp_opt(ddp_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  nn::Sequential ref2 = make_model();
  ref2.to(Device::cuda());
  optim::SGD ref2_opt(ref2.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto ddp_step = compile([&](Tensor x, Tensor y) { return plain(ddp_model, ddp_opt, x, y); });
  auto ref2_step = compile([&](Tensor x, Tensor y) { return plain(ref2, ref2_opt, x, y); });
  for (int i = 0; i < 20; ++i) {
    const Tensor x = randn({16, 32}).to(Device::cuda());
    const Tensor y = randint(10, {16}).to(Device::cuda());
    CHECK(ddp_step(x, y).item<double>() == doctest::Approx(ref2_step(x, y).item<double>()));
  }
  for (size_t k = 0; k < ref2.parameters().size(); ++k) {
    const std::string m =
        differences(values(ddp_model.parameters()[k]), values(ref2.parameters()[k]), 1e-6, 1e-6);
    CHECK_MESSAGE(m.empty(), "DDP parameter " << k << ": " << m);
  }
  CHECK(contains(ddp_step.graph().str(), "collective_wait"));
  CHECK(ddp_step.stats().cuda_graph_replays >= 18);
  MESSAGE("DDP on CUDA: " << ddp.buckets().size() << " bucket(s), " << ddp.reductions()
                          << " all-reduces, graph replays " << ddp_step.stats().cuda_graph_replays);
  // Collectives eagerly on the GPU, each checked against its CPU value.
  const Tensor x = randn({4, 6});
  const Tensor xc = x.to(Device::cuda());
  CHECK(bitwise_equal(dist::all_reduce(xc).to(Device::cpu()), x));
  CHECK(bitwise_equal(dist::all_reduce(xc, dist::ReduceOp::Max).to(Device::cpu()), x));
  CHECK(bitwise_equal(dist::broadcast(xc).to(Device::cpu()), x));
  CHECK(bitwise_equal(dist::all_gather(xc, 1).to(Device::cpu()), x));
  CHECK(bitwise_equal(dist::reduce_scatter(xc, dist::ReduceOp::Sum, 1).to(Device::cpu()), x));
  dist::barrier();
}

TEST_CASE(
    "cuda compiled: with the consistency check on, NCCL collectives run checked, uncaptured") {
  if (!gpu()) return;
  // A world of one cannot disagree with itself: this runs the check's gather, its wait with a
  // deadline, and the plan that is not captured because of it (two GPUs test the disagreement,
  // tests/test_dist_mpi.cpp).
  dist::InitOptions o;
  o.timeout_s = 30;
  o.check_consistency = true;
  dist::init(o);
  const Tensor x = randn({4, 6});
  const Tensor xc = x.to(Device::cuda());
  CHECK(bitwise_equal(dist::all_reduce(xc).to(Device::cpu()), x));
  CHECK(bitwise_equal(dist::all_gather(xc, 1).to(Device::cpu()), x));
  auto f = compile([](Tensor t) { return dist::all_reduce(t * 2.0); });
  for (int i = 0; i < 3; ++i) CHECK(bitwise_equal(f(xc).to(Device::cpu()), x * 2.0));
  CHECK(f.stats().cuda_graph_plans == 0);
  dist::barrier();
  o.check_consistency = false;
  dist::init(o);
  auto g = compile([](Tensor t) { return dist::all_reduce(t * 2.0); });
  for (int i = 0; i < 3; ++i) CHECK(bitwise_equal(g(xc).to(Device::cpu()), x * 2.0));
  if (dist::backend(DeviceType::CUDA) == "nccl") CHECK(g.stats().cuda_graph_plans >= 1);
}

TEST_CASE("cuda: a saved program moved to the GPU, and the shadow-eager check of a CUDA step") {
  if (!gpu()) return;
  manual_seed(21);
  nn::Linear fc1(12, 16), fc2(16, 3);
  // softmax: fused reductions whose wrapped numbers (0-d constants) stay on the CPU when the
  // program moves (a bug once handed the kernel their host pointers: an illegal address).
  auto f = compile([&](Tensor x) { return softmax(fc2(relu(fc1(x) * 0.5)), 1); },
                   CompileOptions{{{0, 0}}, {}, 8});  // batch dim 0 symbolic
  const std::string path = "/tmp/duet_cuda_program_" + std::to_string(::getpid()) + ".duet";
  save(f, path, randn({5, 12}));
  duet::Program p = load(path);
  p.to(Device::cuda());
  for (int64_t b : {1, 7, 300}) {
    INFO("batch " << b);
    const Tensor x = randn({b, 12});
    const std::vector<Tensor> out = p({x.to(Device::cuda())});
    REQUIRE(out.size() == 1);
    CHECK(out[0].device() == Device::cuda());
    const std::string m = differences(values(out[0]), values(f(x)), 1e-5, 1e-5);
    CHECK_MESSAGE(m.empty(), m);
  }
  const std::string e = error_of<Error>([&] { (void)p({randn({4, 12})}); });
  CHECK_MESSAGE(contains(e, "cuda"), e);
  std::remove(path.c_str());

  // The check's three runs on CUDA: interpreter, generated kernels (the capture), graph replay.
  nn::Sequential m(nn::Linear(8, 16), nn::Tanh(), nn::Linear(16, 4));
  m.to(Device::cuda());
  optim::Adam opt(m.parameters());
  auto step = compile([&](Tensor x, Tensor y) {
    opt.zero_grad();
    Tensor loss = mse_loss(m(x), y);
    loss.backward();
    opt.step();
    return loss;
  });
  const Tensor x = randn({32, 8}).to(Device::cuda()), y = randn({32, 4}).to(Device::cuda());
  (void)step(x, y);
  CheckReport r = check_against_eager(step, x, y);
  INFO(r.str());
  CHECK(r.ok);
  CHECK(r.runs == 3);
  MESSAGE("check on CUDA: " << r.str());
}

TEST_CASE("cuda compiled: RMSprop, clip_grad_norm_ and OneCycleLR on CUDA match the CPU") {
  if (!gpu()) return;
  // The learning rate is a captured CUDA tensor that the scheduler writes in place between
  // calls: the plan (and its CUDA graph, once captured) must read each new value.
  auto make_model = [] {
    manual_seed(11);
    return nn::Sequential(nn::Linear(16, 32), nn::Tanh(), nn::Linear(32, 5));
  };
  nn::Sequential cpu_model = make_model(), cuda_model = make_model();
  cuda_model.to(Device::cuda());
  const optim::RMSpropOptions o{.lr = 0.01, .momentum = 0.5, .centered = true};
  optim::RMSprop cpu_opt(cpu_model.parameters(), o), cuda_opt(cuda_model.parameters(), o);
  optim::OneCycleLR cpu_sched(cpu_opt, 0.05, 25), cuda_sched(cuda_opt, 0.05, 25);
  auto step_of = [](nn::Sequential& m, optim::RMSprop& opt) {
    return compile([&m, &opt](Tensor x, Tensor y) {
      opt.zero_grad();
      Tensor loss = cross_entropy(m(x), y);
      loss.backward();
      Tensor norm = nn::utils::clip_grad_norm_(m.parameters(), 0.5);
      opt.step();
      return loss + norm * 0;  // the norm stays in the graph either way
    });
  };
  auto cpu_step = step_of(cpu_model, cpu_opt);
  auto cuda_step = step_of(cuda_model, cuda_opt);
  manual_seed(12);
  const Tensor x = randn({12, 16});
  const Tensor y = randint(5, {12});
  const Tensor xg = x.to(Device::cuda()), yg = y.to(Device::cuda());
  for (int i = 0; i < 20; ++i) {
    INFO("step " << i + 1);
    const double lc = cpu_step(x, y).item<double>();
    const double lg = cuda_step(xg, yg).item<double>();
    CHECK(lg == doctest::Approx(lc).epsilon(1e-4));
    cpu_sched.step();
    cuda_sched.step();
  }
  const auto pc = cpu_model.parameters(), pg = cuda_model.parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t k = 0; k < pc.size(); ++k) {
    const std::string m = differences(values(pg[k]), values(pc[k]), 1e-3, 1e-4);
    CHECK_MESSAGE(m.empty(), "parameter " << k << ": " << m);
  }
  CHECK(cuda_step.stats().traces == 1);
  MESSAGE("RMSprop + clipping + OneCycleLR on CUDA: " << cuda_step.stats().cuda_graph_replays
                                                      << " graph replays");
}

TEST_CASE("cuda: compare() of a CUDA training step counts each face's GPU memory") {
  // Note [Comparing the faces]: the plans' CUDA arena counts in the GPU's figure, not the CPU's,
  // and the timed calls wait for the GPU.
  if (!gpu()) return;
  manual_seed(9);
  nn::Sequential m(nn::Linear(256, 512), nn::ReLU(), nn::Linear(512, 10));
  m.to(Device::cuda());
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  const Tensor x = randn({128, 256}).to(Device::cuda());
  const Tensor y = randint(10, {128}).to(Device::cuda());
  auto step = [&](const Tensor& in, const Tensor& t) {
    opt.zero_grad();
    Tensor loss = cross_entropy(m(in), t);
    loss.backward();
    opt.step();
    return loss;
  };
  step(x, y);
  const FacesReport r = compare(step, x, y);
  CAPTURE(r.str());
  const int64_t hidden = 128 * 512 * 4;
  CHECK(r.eager_cuda_peak_bytes >= hidden);
  CHECK(r.compiled_cuda_peak_bytes > 0);
  CHECK(r.compiled_cuda_peak_bytes <= r.eager_cuda_peak_bytes);
  CHECK(r.compiled_peak_bytes < hidden);  // the CPU holds no activation of it
  CHECK(r.max_abs_difference <= 1e-4);
}

}  // namespace duet::test
