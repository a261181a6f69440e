// The CUDA op sweep (ggml's test-backend-ops): every row of op_rows.h runs on the CPU and on
// CUDA with the same inputs (the CUDA inputs keep the CPU inputs' layouts: offsets, transposes,
// strides, stride-0 broadcasts), and the CUDA results must match: float32 within rtol 1.3e-5
// and atol 1.5e-5 (or the row's own tolerance when looser), float64 within 1e-7, integers and
// bools exactly. Differentiable rows also compare gradients (duet::grad on CUDA against the
// CPU). Then tables of their own: Scalar operands, NaN and ties in reductions, indexing with
// device indices, cuBLAS matmul with batch broadcasting and TF32 off by default, and Philox draws
// that are bit-identical to the CPU's. Without a usable GPU every case returns at once, gpu()
// calls skip() and the binary exits with 77, which ctest reports as Skipped.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda/cuda.h"
#include "grad_samples.h"
#include "layouts.h"
#include "long_sums.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using L = Layout;
using Ins = std::vector<Tensor>;

// f16 and bf16 compute in f32 on both devices and round once: an f32 result one ulp apart can
// round to neighbouring low-precision values, so they get torch.testing's tolerances.
double rtol_of(DType d, double row32 = 0) {
  return d == DType::f32    ? std::max(1.3e-5, row32)
         : d == DType::f64  ? 1e-7
         : d == DType::bf16 ? 1.6e-2
         : d == DType::f16  ? 1e-3
                            : 0;
}
double atol_of(DType d, double row32 = 0) {
  return d == DType::f32       ? std::max(1.5e-5, row32)
         : d == DType::f64     ? 1e-7
         : is_low_precision(d) ? 1e-5
                               : 0;
}

// The CUDA result against the CPU one: on the GPU, same shape and dtype, values within the
// dtype's tolerance (exact for integers and bools, and when asked).
void check_same(const Tensor& got, const Tensor& want, bool exact = false, double row32 = 0) {
  REQUIRE(got.defined());
  CHECK(got.device().is_cuda());
  CHECK(got.sizes().str() == want.sizes().str());
  CHECK(dtype_name(got.dtype()) == dtype_name(want.dtype()));
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) return;
  const DType d = want.dtype();
  const std::string m = differences(values(got), values(want), exact ? 0 : rtol_of(d, row32),
                                    exact ? 0 : atol_of(d, row32));
  CHECK_MESSAGE(m.empty(), m);
}

// Gradients of fn at `leaves` (CPU values) on both devices, with one random output gradient.
template <class Fn>
void check_grads(const Fn& fn, const Ins& leaves, Rng& rng, double row32 = 0) {
  Ins cpu, dev;
  for (const Tensor& t : leaves) {
    cpu.push_back(t.detach().requires_grad_());
    dev.push_back(cuda_like(t).detach().requires_grad_());
  }
  const Tensor y = fn(cpu);
  const Tensor yd = fn(dev);
  REQUIRE(y.requires_grad());
  const Tensor g =
      make(random_values(y.numel(), Domain{-1, 1}, y.dtype(), rng), y.sizes(), y.dtype());
  const Ins want = grad({y}, cpu, {g});
  const Ins got = grad({yd}, dev, {g.to(Device::cuda())});
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("gradient of input " << i);
    check_same(got[i], want[i], false, row32);
  }
}

// A device error that the row's own CPU constants (an index tensor built into the call) cause;
// those rows run in the tables below with device indices instead.
// Rows that draw from the CPU generator inside the call (dropout) fail the same way.
bool mixes_devices(const Error& e) {
  const std::string m = e.what();
  return m.find("different devices") != std::string::npos ||
         m.find("has no kernels in this build") != std::string::npos;
}

// ---- elementwise ------------------------------------------------------------------------------

std::vector<const ElementwiseRow*> all_elementwise_rows() {
  std::vector<const ElementwiseRow*> rows;
  for (const ElementwiseRow& r : elementwise_rows()) rows.push_back(&r);
  for (const ElementwiseRow& r : special_function_rows()) rows.push_back(&r);
  return rows;
}

}  // namespace

TEST_CASE("cuda elementwise rows: every sample and dtype match the CPU") {
  if (!gpu()) return;
  Rng rng(201);
  for (const ElementwiseRow* row : all_elementwise_rows()) {
    for (DType dt : row->dtypes) {
      for (const Sample& s : samples(kCudaSweep)) {
        if (row->arity < s.min_arity) continue;
        INFO(std::string(row->name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s.name));
        const Ins in = build(*row, {dt}, s, rng).in;
        check_same(row->fn(cuda_like(in)), row->fn(in), false, row->rtol32);
      }
    }
  }
}

TEST_CASE("cuda elementwise rows in bf16 and f16 match the CPU") {
  if (!gpu()) return;
  Rng rng(209);
  for (const ElementwiseRow* row : all_elementwise_rows()) {
    if (std::find(row->dtypes.begin(), row->dtypes.end(), DType::f32) == row->dtypes.end())
      continue;
    for (DType dt : {DType::bf16, DType::f16}) {
      for (const Sample& s : samples(kCudaSweep)) {
        if (row->arity < s.min_arity) continue;
        INFO(std::string(row->name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s.name));
        const Ins in = build(*row, {dt}, s, rng).in;
        check_same(row->fn(cuda_like(in)), row->fn(in));
      }
    }
  }
}

TEST_CASE("cuda elementwise rows: Scalar operands (host numbers) and mixed dtypes") {
  if (!gpu()) return;
  Rng rng(202);
  for (const ElementwiseRow* row : all_elementwise_rows()) {
    if (row->arity < 2) continue;
    for (DType dt : row->dtypes) {
      INFO(std::string(row->name) << " on " << dtype_name(dt));
      const Ins in = build(*row, {dt}, sample("broadcast (3,1) (1,4) (4)"), rng).in;
      const double v = random_values(1, row->domains.back(), dt, rng)[0];
      const Scalar sc = dt == DType::b8   ? Scalar(v != 0)
                        : is_integral(dt) ? Scalar(static_cast<int64_t>(v))
                                          : Scalar(v);
      if (row->fn_scalar) {
        const Ins head(in.begin(), in.end() - 1);
        check_same(row->fn_scalar(cuda_like(head), sc), row->fn_scalar(head, sc), false,
                   row->rtol32);
      }
      if (row->fn_lscalar) {
        const Ins tail(in.begin() + 1, in.end());
        check_same(row->fn_lscalar(sc, cuda_like(tail)), row->fn_lscalar(sc, tail), false,
                   row->rtol32);
      }
      // A second operand of another dtype: converted on the device first.
      if (!row->cond_first && dt != DType::f64) {
        Ins mixed = in;
        mixed[1] = mixed[1].to(DType::f64);
        Tensor want;
        try {
          want = row->fn(mixed);
        } catch (const DTypeError&) {
          continue;  // the row takes no such mix on the CPU either
        }
        check_same(row->fn(cuda_like(mixed)), want, false, row->rtol32);
      }
    }
  }
}

TEST_CASE("cuda elementwise rows: gradients match the CPU") {
  if (!gpu()) return;
  Rng rng(203);
  for (const ElementwiseRow* row : all_elementwise_rows()) {
    if (!differentiable(*row)) continue;
    for (const GradSample& s : grad_samples()) {
      if (row->arity < s.min_arity) continue;
      for (DType dt : {DType::f32, DType::f64}) {
        INFO(std::string(row->name)
             << " on " << dtype_name(dt) << ", gradient sample " << std::string(s.name));
        Ins leaves;
        for (int i = 0; i < row->arity; ++i) {
          const DType di = row->cond_first && i == 0 ? DType::b8 : dt;
          const Shape ls = leaf_shape(s, i);
          const std::vector<Domain>& doms = grad_domains(*row);
          leaves.push_back(
              make_layout(random_values(ls.numel(), doms[i], di, rng), ls, di, s.layouts[i]));
        }
        // The condition of where is not differentiable: it stays a constant.
        const int first = row->cond_first ? 1 : 0;
        // The condition goes through the sample's view like the other inputs (transposed, say).
        const Tensor cond = first ? take(leaves[0], s, 0) : Tensor();
        const Ins diff(leaves.begin() + first, leaves.end());
        auto fn = [&](const Ins& x) {
          Ins in;
          if (first) in.push_back(x[0].device().is_cuda() ? cuda_like(cond) : cond);
          for (size_t i = 0; i < x.size(); ++i) in.push_back(take(x[i], s, int(i) + first));
          return row->fn(in);
        };
        check_grads(fn, diff, rng, row->rtol32);
      }
    }
  }
}

TEST_CASE("cuda in-place ops: outputs that are views (transposed, strided, offset, broadcast in)") {
  if (!gpu()) return;
  Rng rng(211);
  struct Row {
    const char* name;
    std::function<void(Tensor& self, const Tensor& other)> fn;
  };
  const std::vector<Row> rows = {
      {"add_", [](Tensor& a, const Tensor& b) { a.add_(b); }},
      {"mul_", [](Tensor& a, const Tensor& b) { a.mul_(b); }},
      {"add_ Scalar", [](Tensor& a, const Tensor&) { a.add_(Scalar(2.5)); }},
      {"copy_", [](Tensor& a, const Tensor& b) { a.copy_(b); }},
      {"copy_ row broadcast", [](Tensor& a, const Tensor& b) { a.copy_(slice(b, 0, 0, 1)); }},
  };
  for (const Row& r : rows)
    for (Layout ls : {L::Contiguous, L::Transposed, L::Strided, L::Offset})
      for (Layout lo : {L::Contiguous, L::Transposed})
        for (DType dt : {DType::f32, DType::f64}) {
          INFO(std::string(r.name) << " into " << std::string(layout_name(ls)) << " from "
                                   << std::string(layout_name(lo)) << ", " << dtype_name(dt));
          Tensor a = make_layout(random_values(20, Domain{}, dt, rng), {4, 5}, dt, ls);
          const Tensor b = make_layout(random_values(20, Domain{}, dt, rng), {4, 5}, dt, lo);
          Tensor ad = cuda_like(a);
          r.fn(a, b);
          r.fn(ad, cuda_like(b));
          check_same(ad, a);
        }
}

TEST_CASE("cuda conversion rows: every dtype pair and layout") {
  if (!gpu()) return;
  Rng rng(204);
  const std::vector<DType> dts = kAllDTypes;
  for (const ConversionRow& row : conversion_rows())
    for (DType from : dts)
      for (DType to : dts)
        for (Layout l : {L::Contiguous, L::Transposed, L::Strided, L::Offset}) {
          INFO(std::string(row.name) << " " << dtype_name(from) << " -> " << dtype_name(to) << ", "
                                     << std::string(layout_name(l)));
          const Tensor x = make_layout(random_values(20, Domain{}, from, rng), {4, 5}, from, l);
          check_same(row.fn(cuda_like(x), to), row.fn(x, to), true);
        }
}

// ---- reductions -------------------------------------------------------------------------------

TEST_CASE("cuda reduce rows: dims sets, keepdim, layouts, dtypes") {
  if (!gpu()) return;
  Rng rng(205);
  struct Case {
    Shape shape;
    Layout layout;
    std::vector<Dims> dims;
  };
  const std::vector<Case> cases = {
      {{}, L::Contiguous, {Dims{}}},
      {{7}, L::Contiguous, {Dims{}, Dims{0}}},
      {{3, 4}, L::Transposed, {Dims{}, Dims{0}, Dims{1}, Dims{0, 1}}},
      {{2, 3, 4}, L::Strided, {Dims{}, Dims{1}, Dims{0, 2}, Dims{-1}}},
      {{2, 0, 3}, L::Contiguous, {Dims{0}, Dims{2}}},
      {{5, 3000}, L::Offset, {Dims{}, Dims{0}, Dims{1}}},  // block-per-output path
      {{1000, 300}, L::Transposed, {Dims{}, Dims{0}, Dims{1}}},
      {{64, 2048}, L::Contiguous, {Dims{0}}},        // thread per output (outer dims reduced)
      {{400000}, L::Contiguous, {Dims{}}},           // split across blocks, then folded
      {{3, 150001}, L::Strided, {Dims{1}, Dims{}}},  // a few outputs, split
      {{4096, 1024}, L::Contiguous, {Dims{0}}},      // thread per output, split in slices
  };
  for (const ReduceRow& row : reduce_rows())
    for (DType dt : row.dtypes)
      for (const Case& c : cases)
        for (const Dims& dims : c.dims)
          for (bool keepdim : {false, true}) {
            if (c.shape.numel() == 0 && row.kind != ReduceKind::Sum) continue;
            INFO(std::string(row.name)
                 << " on " << dtype_name(dt) << ", shape " << c.shape.str() << ", "
                 << std::string(layout_name(c.layout)) << ", keepdim " << keepdim);
            const Tensor x = make_layout(random_values(c.shape.numel(), Domain{}, dt, rng), c.shape,
                                         dt, c.layout);
            // Large f32 sums add in another order: allow for it.
            const double tol = c.shape.numel() > 100000 ? 1e-3 : c.shape.numel() > 1000 ? 1e-4 : 0;
            check_same(row.fn(cuda_like(x), dims, keepdim), row.fn(x, dims, keepdim), false, tol);
          }
}

TEST_CASE("cuda long f32 sums stay within a few ulps: eager, and compiled as fused kernels") {
  if (!gpu()) return;
  for (const LongSum& c : long_sums()) {
    INFO(c.name);
    const Tensor x = long_sum_input(c).to(Device::cuda());
    const std::vector<double> want = long_sum_reference(c);
    const Dims dims(c.dims);
    const std::string e = long_sum_errors(c, want, sum(x, dims), false);
    CHECK_MESSAGE(e.empty(), e);
    const std::string em = long_sum_errors(c, want, mean(x, dims), true);
    CHECK_MESSAGE(em.empty(), em);
  }
  check_long_sums_compiled(Device::cuda(), false);
}

TEST_CASE("cuda reductions: NaN propagates, integers sum in i64, argmax takes the first") {
  if (!gpu()) return;
  const double nan = std::nan("");
  struct Row {
    const char* name;
    std::vector<double> v;
    Shape shape;
    DType dtype;
    std::function<Tensor(const Tensor&)> fn;
  };
  const std::vector<Row> rows = {
      {"max with NaN", {1, nan, 3, 2}, {4}, DType::f32, [](const Tensor& x) { return max(x); }},
      {"min with NaN",
       {1, 2, nan, 0},
       {2, 2},
       DType::f64,
       [](const Tensor& x) { return min(x, Dims{1}); }},
      {"sum of i32 overflows i32",
       {2e9, 2e9, 2e9},
       {3},
       DType::i32,
       [](const Tensor& x) { return sum(x); }},
      {"sum of b8", {1, 0, 1, 1}, {4}, DType::b8, [](const Tensor& x) { return sum(x); }},
      {"argmax ties",
       {1, 5, 5, 2, 5, 0},
       {2, 3},
       DType::f32,
       [](const Tensor& x) { return argmax(x, 1); }},
      {"argmax NaN first",
       {1, nan, 9, nan},
       {4},
       DType::f32,
       [](const Tensor& x) { return argmax(x, 0); }},
      {"argmax along dim 0",
       {1, 7, 7, 3, 7, 9},
       {3, 2},
       DType::i64,
       [](const Tensor& x) { return argmax(x, 0, true); }},
      {"argmax long row",
       std::vector<double>(5000, 1.0),
       {5000},
       DType::f32,
       [](const Tensor& x) { return argmax(x, 0); }},
  };
  for (const Row& r : rows) {
    INFO(std::string(r.name));
    const Tensor x = make(r.v, r.shape, r.dtype);
    check_same(r.fn(cuda_like(x)), r.fn(x), true);
  }
}

// ---- op rows: indexing, joining, images, normalizations, losses ------------------------------

TEST_CASE("cuda op rows: every dtype and layout, and gradients") {
  if (!gpu()) return;
  Rng rng(206);
  std::vector<std::string> cpu_constants;
  for (const OpRow& row : op_rows()) {
    if (row.shapes.empty()) continue;  // random draws: see the Philox table below
    for (DType dt : row.dtypes)
      for (Layout l : {L::Contiguous, L::Transposed, L::Strided, L::Offset}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", " << std::string(layout_name(l)));
        Ins in;
        for (size_t i = 0; i < row.shapes.size(); ++i) {
          const Shape& s = row.shapes[i];
          const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
          in.push_back(make_layout(random_values(s.numel(), d, dt, rng), s, dt,
                                   s.numel() ? l : L::Contiguous));
        }
        const Tensor want = row.fn(in);
        Tensor got;
        try {
          got = row.fn(cuda_like(in));
        } catch (const DeviceError& e) {
          if (!mixes_devices(e)) throw;
          cpu_constants.push_back(row.name);
          break;
        }
        check_same(got, want, false, row.tol32);
      }
    if (!row.grad || row.index_result) continue;
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(std::string(row.name) << " on " << dtype_name(dt) << ", gradient");
      Ins leaves;
      for (size_t i = 0; i < row.shapes.size(); ++i) {
        const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
        leaves.push_back(make(random_values(row.shapes[i].numel(), d, dt, rng), row.shapes[i], dt));
      }
      try {
        check_grads(row.fn, leaves, rng, row.tol32);
      } catch (const DeviceError& e) {
        if (!mixes_devices(e)) throw;
      }
    }
  }
  std::sort(cpu_constants.begin(), cpu_constants.end());
  cpu_constants.erase(std::unique(cpu_constants.begin(), cpu_constants.end()), cpu_constants.end());
  std::string names;
  for (const std::string& n : cpu_constants) names += "\n  " + n;
  MESSAGE(cpu_constants.size() << " rows build CPU constants into the call (their ops run in the "
                                  "device-index tables):"
                               << names);
}

TEST_CASE("cuda slice_scatter rows") {
  if (!gpu()) return;
  Rng rng(207);
  for (const ScatterRow& row : scatter_rows())
    for (DType dt : {DType::f32, DType::i64, DType::b8})
      for (Layout l : {L::Contiguous, L::Transposed}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", " << std::string(layout_name(l)));
        const Tensor base = make_layout(random_values(row.base.numel(), Domain{}, dt, rng),
                                        row.base, dt, row.base.numel() ? l : L::Contiguous);
        const Tensor src = make(random_values(row.src.numel(), Domain{}, dt, rng), row.src, dt);
        check_same(
            slice_scatter(cuda_like(base), cuda_like(src), row.dim, row.start, row.end, row.step),
            slice_scatter(base, src, row.dim, row.start, row.end, row.step), true);
      }
}

TEST_CASE("cuda indexing with device indices: gather, scatter_add, cat, unfold, fold") {
  if (!gpu()) return;
  Rng rng(208);
  const Tensor x = make(random_values(24, Domain{}, DType::f32, rng), {2, 3, 4});
  struct Row {
    const char* name;
    std::function<Tensor(const Tensor& x, Device d)> fn;
  };
  auto idx = [](std::vector<double> v, Shape s, Device d) { return make(v, s, DType::i64).to(d); };
  const std::vector<Row> rows = {
      {"gather dim 1",
       [&](const Tensor& t, Device d) {
         return gather(t, 1, idx({2, 0, 1, 1, 0, 2, 2, 1}, {2, 1, 4}, d));
       }},
      {"gather dim -1 transposed",
       [&](const Tensor& t, Device d) {
         return gather(transpose(t, 1, 2), -1, idx({0, 2, 1, 1, 0, 2}, {2, 1, 3}, d));
       }},
      {"scatter_add with repeats",
       [&](const Tensor& t, Device d) {
         const Tensor src = slice(t, 1, 0, 2);
         return scatter_add(t, 1, idx(std::vector<double>(16, 1), {2, 2, 4}, d), src);
       }},
      {"cat dim 1",
       [&](const Tensor& t, Device) {
         return cat({t, transpose(t, 0, 0) * 2}, 1);
       }},
      {"cat dim 2 mixed dtypes",
       [&](const Tensor& t, Device) {
         return cat({t, t.to(DType::f64)}, 2);
       }},
      {"unfold 2x2 pad 1",
       [&](const Tensor& t, Device) {
         return unfold(reshape(t, {1, 2, 3, 4}), 2, 1, 1);
       }},
      {"unfold 3x3 stride 2 transposed",
       [&](const Tensor& t, Device) {
         return unfold(transpose(reshape(t, {2, 1, 3, 4}), 2, 3), 3, 2, 1);
       }},
      {"fold of unfold",
       [&](const Tensor& t, Device) {
         return fold(unfold(reshape(t, {1, 2, 3, 4}), 2, 1, 1), 3, 4, 2, 1, 1);
       }},
      {"conv2d",
       [&](const Tensor& t, Device) {
         const Tensor w = reshape(t, {3, 2, 2, 2});
         return conv2d(reshape(t, {1, 2, 3, 4}), w, {}, 1, 1);
       }},
  };
  for (const Row& r : rows) {
    INFO(std::string(r.name));
    check_same(r.fn(cuda_like(x), Device::cuda()), r.fn(x, Device::cpu()));
  }
  // Indices are checked on the device: the error shows at the next host read (no sync at the
  // op), names the op, the index, the dim and its size, and is raised once.
  Tensor bad;
  CHECK_NOTHROW(bad = gather(cuda_like(x), 1, idx({0, 3}, {1, 1, 2}, Device::cuda())));
  const std::string e = error_of<ValueError>([&] { (void)bad.to(Device::cpu()); });
  CHECK(e.find("[gather] index 3 is out of range for dim 1 of size") != std::string::npos);
  CHECK_NOTHROW((void)bad.to(Device::cpu()));
  const std::string es = error_of<ValueError>([&] {
    (void)scatter_add(cuda_like(x), 1, idx({0, -1}, {1, 1, 2}, Device::cuda()),
                      make({1.5, 2.5}, {1, 1, 2}).to(Device::cuda()));
    cuda::synchronize();
  });
  CHECK(es.find("[scatter_add] index -1 is out of range") != std::string::npos);
  // In a compiled function, whose plan is a CUDA graph: the same error, at the result's read.
  auto f = compile([](Tensor a, Tensor i) { return gather(a * 2.0, 1, i); });
  const Tensor good = idx({0, 1}, {1, 1, 2}, Device::cuda());
  for (int call = 0; call < 3; ++call)
    check_same(f(cuda_like(x), good), gather(x * 2.0, 1, idx({0, 1}, {1, 1, 2}, Device::cpu())));
  const std::string ec = error_of<ValueError>([&] {
    (void)f(cuda_like(x), idx({0, 5}, {1, 1, 2}, Device::cuda())).to(Device::cpu());
  });
  CHECK(ec.find("[gather] index 5 is out of range") != std::string::npos);
  CHECK(f.stats().cuda_graph_plans == 1);
}

// ---- sources ----------------------------------------------------------------------------------

TEST_CASE("cuda sources: full and arange on every dtype") {
  if (!gpu()) return;
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8}) {
    INFO(dtype_name(dt));
    const Options o = Options().dtype(dt).device(Device::cuda());
    check_same(full({3, 5}, Scalar(1), o), full({3, 5}, Scalar(1), Options().dtype(dt)), true);
    check_same(full({0, 2}, Scalar(0), o), full({0, 2}, Scalar(0), Options().dtype(dt)), true);
    if (dt != DType::b8) check_same(arange(1000, o), arange(1000, Options().dtype(dt)), true);
  }
}

// ---- matmul -----------------------------------------------------------------------------------

TEST_CASE("cuda matmul rows and batch broadcasts through cuBLAS, with gradients") {
  if (!gpu()) return;
  Rng rng(209);
  std::vector<MatmulRow> rows = matmul_rows();
  for (const MatmulRow& extra : std::vector<MatmulRow>{
           {"batch broadcast (2,1,3,4) (5,4,6)", {2, 1, 3, 4}, {5, 4, 6}},
           {"batch broadcast (1,3,4) (7,4,2) transposed",
            {1, 3, 4},
            {7, 4, 2},
            L::Transposed,
            L::Transposed},
           {"strided batches (4,6,5) (4,5,3)", {4, 6, 5}, {4, 5, 3}, L::Strided, L::Strided},
           {"k = 0", {3, 0}, {0, 4}},
           {"tall (513,65) (65,257)", {513, 65}, {65, 257}, L::Transposed},
       })
    rows.push_back(extra);
  for (const MatmulRow& row : rows)
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
      INFO(std::string(row.name) << " on " << dtype_name(dt));
      const Tensor a = make_layout(random_values(row.a.numel(), Domain{-1, 1}, dt, rng), row.a, dt,
                                   row.a.numel() ? row.la : L::Contiguous);
      const Tensor b = make_layout(random_values(row.b.numel(), Domain{-1, 1}, dt, rng), row.b, dt,
                                   row.b.numel() ? row.lb : L::Contiguous);
      const double tol = row.a.size() ? 1e-5 * std::sqrt(double(row.a[row.a.size() - 1])) : 0;
      check_same(matmul(cuda_like(a), cuda_like(b)), matmul(a, b), false, tol);
      if (is_floating(dt) && row.a.numel() && row.b.numel() && row.a.numel() < 5000)
        check_grads([](const Ins& x) { return matmul(x[0], x[1]); }, {a, b}, rng, tol);
    }
}

TEST_CASE("cuda matmul: TF32 is off by default (full f32 accuracy), and can be turned on") {
  if (!gpu()) return;
  Rng rng(210);
  const int64_t m = 128, k = 1024, n = 96;
  const Tensor a = make(random_values(m * k, Domain{-1, 1}, DType::f64, rng), {m, k}, DType::f64);
  const Tensor b = make(random_values(k * n, Domain{-1, 1}, DType::f64, rng), {k, n}, DType::f64);
  const std::vector<double> want = values(matmul(a, b));
  auto max_err = [&] {
    const Tensor c =
        matmul(a.to(DType::f32).to(Device::cuda()), b.to(DType::f32).to(Device::cuda()));
    REQUIRE(c.device() == Device::cuda());
    const std::vector<double> got = values(c.to(Device::cpu()));  // values() reads host memory
    double e = 0;
    for (size_t i = 0; i < want.size(); ++i) e = std::max(e, std::abs(got[i] - want[i]));
    return e;
  };
  REQUIRE_FALSE(cuda::allow_tf32());
  // f32 inputs rounded once (2^-24 each) over k = 1024 terms of size ~1/3: ~1e-5 at most.
  const double full = max_err();
  CHECK(full < 1e-4);
  cuda::set_allow_tf32(true);
  const double tf32 = max_err();  // 10-bit mantissas: errors near 1e-2
  cuda::set_allow_tf32(false);
  CHECK(tf32 < 0.2);
  // The switch changes the result: inputs rounded to 10 mantissa bits (2^-11 relative) instead
  // of 23 make errors a hundred times larger or more, so TF32 must at least be ten times worse.
  CHECK(tf32 > 10 * full);
  MESSAGE("max error f32 " << full << ", TF32 " << tf32);
}

// ---- random draws -----------------------------------------------------------------------------

TEST_CASE("cuda Philox draws: bit-identical to the CPU for the same state") {
  if (!gpu()) return;
  struct Row {
    const char* name;
    int dist;
    DType dtype;
    int64_t high;
    Shape shape;
    bool exact;  // normals: within 2 ulp (the device's double log, sin and cos)
  };
  const std::vector<Row> rows = {
      {"uniform f32", 0, DType::f32, 0, {1001}, true},
      {"uniform f64", 0, DType::f64, 0, {3, 333}, true},
      {"normal f32", 1, DType::f32, 0, {999}, false},
      {"normal f64", 1, DType::f64, 0, {4, 250}, false},
      {"randint i64", 2, DType::i64, 1000003, {777}, true},
      {"randint i32", 2, DType::i32, 7, {5, 5}, true},
      {"randint f32", 2, DType::f32, 1 << 20, {64}, true},
      {"empty", 0, DType::f32, 0, {0, 3}, true},
  };
  for (const Row& r : rows)
    for (std::vector<double> st : {std::vector<double>{42, 0}, {12345678901, 77}, {-5, 1e6}}) {
      INFO(std::string(r.name) << ", seed " << st[0] << ", offset " << st[1]);
      Attrs a;
      for (int64_t d : r.shape) a.ints.push_back(d);
      a.dim = r.dist;
      a.end = r.high;
      a.dtype = r.dtype;
      const Tensor state = make(st, {2}, DType::i64);
      const Tensor dstate = state.to(Device::cuda());
      const Tensor* cin[] = {&state};
      const Tensor* din[] = {&dstate};
      const Tensor want = detail::call(OpId::Random, TensorRefs(cin, 1), a);
      const Tensor got = detail::call(OpId::Random, TensorRefs(din, 1), a);
      if (r.exact) {
        CHECK(got.device().is_cuda());
        CHECK(element_bytes(got) == element_bytes(want));
      } else {
        const std::vector<double> g = values(got), w = values(want);
        REQUIRE(g.size() == w.size());
        for (size_t i = 0; i < g.size(); ++i) {
          const double ulp = r.dtype == DType::f32
                                 ? std::abs(std::nextafter(float(w[i]), INFINITY) - float(w[i]))
                                 : std::abs(std::nextafter(w[i], INFINITY) - w[i]);
          CHECK_MESSAGE(std::abs(g[i] - w[i]) <= 2 * ulp,
                        "element " << i << ": " << g[i] << " vs " << w[i]);
        }
      }
    }
}

// The fused attention kernels (cuda/kernels/attention.cu) against the CPU's, at head dims that
// fill the warp's lanes and past them, L != S, each mask kind, forward and backward; the op
// rows cover the small shapes and every layout.
TEST_CASE("attention: CUDA against CPU, forward and backward") {
  if (!gpu()) return skip("no GPU");
  manual_seed(13);
  for (int kind = 0; kind < 4; ++kind) {
    const int64_t e = kind == 3 ? 200 : 64, f = kind == 3 ? 40 : 48;
    Tensor q = randn({2, 70, e}), k = randn({2, 90, e}), v = randn({2, 90, f});
    Tensor g = randn({2, 70, f}), mask;
    if (kind == 2) mask = gt(rand({70, 90}), 0.2);
    auto run = [&](const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& m,
                   const Tensor& g0) {
      Tensor a = q0.detach().requires_grad_(), b = k0.detach().requires_grad_(),
             c = v0.detach().requires_grad_();
      Tensor y = scaled_dot_product_attention(a, b, c, m, kind == 1);
      std::vector<Tensor> gs = grad({y}, {a, b, c}, {g0});
      return std::vector<Tensor>{y.detach(), gs[0], gs[1], gs[2]};
    };
    const std::vector<Tensor> want = run(q, k, v, mask, g);
    const std::vector<Tensor> got = run(cuda_like(q), cuda_like(k), cuda_like(v),
                                        mask.defined() ? cuda_like(mask) : mask, cuda_like(g));
    for (int i = 0; i < 4; ++i) {
      INFO("mask kind " << kind << ", result " << i);
      CHECK(close(got[i].to(Device::cpu()), want[i], 1e-4));
    }
  }
}

}  // namespace duet::test
