// Autocast (Note [Autocast] in core/autocast.h): which ops cast to what, scopes and nesting,
// f32 parameters and gradients, and a compiled step under autocast equal to the eager one.
#include "util.h"

namespace duet::test {
namespace {

Tensor f32(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  return make(random_values(s.numel(), Domain{}, DType::f32, rng), s);
}

// A two-layer classifier's parameters and one SGD step on it, as a user writes them.
struct Net {
  Tensor w1, b1, w2, b2;
  explicit Net(uint64_t seed)
      : w1(f32({16, 8}, seed) * 0.3),
        b1(f32({16}, seed + 1) * 0.1),
        w2(f32({4, 16}, seed + 2) * 0.3),
        b2(f32({4}, seed + 3) * 0.1) {
    for (Tensor* p : params()) p->requires_grad_(true);
  }
  std::vector<Tensor*> params() { return {&w1, &b1, &w2, &b2}; }
  std::vector<Tensor> list() { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor h = relu(linear(x, w1, b1));
    return cross_entropy(linear(h, w2, b2), y);
  }
};

}  // namespace

TEST_CASE("autocast: products run in the low dtype, sensitive ops in f32, the rest as given") {
  const Tensor a = f32({4, 8}, 1), b = f32({8, 3}, 2), w = f32({3, 8}, 3), bias = f32({3}, 4);
  const Tensor low = a.to(DType::bf16);
  {
    Autocast ac(Device::cpu(), DType::bf16);
    CHECK(autocast_enabled(Device::cpu()));
    CHECK(autocast_dtype(Device::cpu()) == DType::bf16);
    CHECK(matmul(a, b).dtype() == DType::bf16);
    CHECK(bitwise_equal(matmul(a, b), matmul(a.to(DType::bf16), b.to(DType::bf16))));
    CHECK(linear(a, w, bias).dtype() == DType::bf16);
    const Tensor img = f32({1, 2, 4, 4}, 5), filters = f32({2, 3, 3, 3}, 6);
    CHECK(conv_transpose2d(img, filters, f32({3}, 7), 2, 1).dtype() == DType::bf16);
    CHECK(bitwise_equal(conv_transpose2d(img, filters, {}, 2, 1),
                        conv_transpose2d(img.to(DType::bf16), filters.to(DType::bf16), {}, 2, 1)));
    CHECK(matmul(a.to(DType::f64), b.to(DType::f64)).dtype() == DType::f64);  // f64 stays
    CHECK(exp(low).dtype() == DType::f32);
    CHECK(log(low).dtype() == DType::f32);
    CHECK(pow(low, 2.0).dtype() == DType::f32);
    CHECK(sum(low).dtype() == DType::f32);
    CHECK(mean(low).dtype() == DType::f32);
    CHECK(softmax(low, -1).dtype() == DType::f32);
    CHECK(log_softmax(low, -1).dtype() == DType::f32);
    CHECK(layer_norm(low, {8}, Tensor(), Tensor()).dtype() == DType::f32);
    CHECK(mse_loss(low, low).dtype() == DType::f32);
    // softmax computes on the f32 values, as on an f32 input.
    CHECK(bitwise_equal(softmax(low, -1), softmax(low.to(DType::f32), -1)));
    // log_softmax reads the bf16 input as it is and gives f32 (Note [log_softmax]): the values
    // of its f32 copy, along the last dim and along another.
    CHECK(bitwise_equal(log_softmax(low, -1), log_softmax(low.to(DType::f32), -1)));
    CHECK(bitwise_equal(log_softmax(low, 0), log_softmax(low.to(DType::f32), 0)));
    CHECK(relu(low).dtype() == DType::bf16);
    CHECK(relu(a).dtype() == DType::f32);
    CHECK((low + a).dtype() == DType::f32);  // promotion as usual
    // A CUDA scope leaves CPU tensors alone.
    Autocast cuda(Device::cuda(), DType::f16);
    CHECK(autocast_enabled(Device::cuda()));
    CHECK(matmul(a, b).dtype() == DType::bf16);
  }
  CHECK_FALSE(autocast_enabled(Device::cpu()));
  CHECK_FALSE(autocast_enabled(Device::cuda()));
  CHECK(matmul(a, b).dtype() == DType::f32);
  CHECK(exp(low).dtype() == DType::bf16);
}

TEST_CASE("autocast: scopes nest, enabled=false turns it off, the state comes back") {
  const Tensor a = f32({2, 3}, 5), b = f32({3, 2}, 6);
  Autocast outer(Device::cpu());  // bf16 on the CPU by default, as PyTorch's
  CHECK(matmul(a, b).dtype() == DType::bf16);
  {
    Autocast inner(Device::cpu(), DType::f16);
    CHECK(matmul(a, b).dtype() == DType::f16);
    {
      Autocast off(Device::cpu(), DType::bf16, /*enabled=*/false);
      CHECK_FALSE(autocast_enabled(Device::cpu()));
      CHECK(matmul(a, b).dtype() == DType::f32);
    }
    CHECK(matmul(a, b).dtype() == DType::f16);
  }
  CHECK(matmul(a, b).dtype() == DType::bf16);
  CHECK(error_of<DTypeError>([] { Autocast bad(Device::cpu(), DType::f32); }) ==
        "[Autocast] the low dtype must be f16 or bf16, got f32 (for cpu)");
}

TEST_CASE("autocast: parameters and their gradients stay f32, close to f32 training") {
  const Tensor x = f32({32, 8}, 7);
  const Tensor y = argmax(f32({32, 4}, 8), 1);
  Net amp(11), ref(11);
  Tensor loss_amp;
  {
    Autocast ac(Device::cpu(), DType::bf16);
    loss_amp = amp.loss(x, y);
    loss_amp.backward();  // also inside the scope: gradient rules run with autocast off
  }
  ref.loss(x, y).backward();
  CHECK(loss_amp.dtype() == DType::f32);
  std::vector<Tensor> pa = amp.list(), pr = ref.list();
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO("parameter " << i);
    CHECK(pa[i].dtype() == DType::f32);
    CHECK(pa[i].grad().dtype() == DType::f32);
    CHECK(close(pa[i].grad(), pr[i].grad(), 5e-2));
  }
}

TEST_CASE("autocast: a compiled step under autocast equals the eager step bit for bit") {
  const Tensor x = f32({32, 8}, 9);
  const Tensor y = argmax(f32({32, 4}, 10), 1);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    Net eager(21), comp(21);
    optim::SGD opt_e(eager.list(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_c(comp.list(), {.lr = 0.1, .momentum = 0.9});
    auto train = [](Net& net, optim::SGD& opt, const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      Tensor loss = net.loss(x, y);
      loss.backward();
      opt.step();
      return loss;
    };
    auto step = compile([&](Tensor x, Tensor y) { return train(comp, opt_c, x, y); });
    for (int i = 0; i < 4; ++i) {
      Autocast ac(Device::cpu(), low);
      const Tensor le = train(eager, opt_e, x, y);
      const Tensor lc = step(x, y);
      CHECK(bitwise_equal(le, lc));
    }
    for (size_t i = 0; i < 4; ++i) CHECK(bitwise_equal(eager.list()[i], comp.list()[i]));
    CHECK(step.stats().traces == 1);
    // Outside the scope the step traces again: its casts belong to the autocast state.
    const Tensor le = train(eager, opt_e, x, y);
    const Tensor lc = step(x, y);
    CHECK(bitwise_equal(le, lc));
    CHECK(step.stats().traces == 2);
    REQUIRE(!step.stats().retrace_reasons.empty());
    CHECK(step.stats().retrace_reasons.back() ==
          fmt::format("autocast changed cpu {} -> off", dtype_name(low)));
  }
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("GradScaler: power-of-two scaling leaves a clean step exactly the unscaled step") {
  Tensor p = make({1.5, -2, 0.25}, {3}).requires_grad_(true);
  Tensor q = make({1.5, -2, 0.25}, {3}).requires_grad_(true);
  optim::SGD op({p}, {.lr = 0.1, .momentum = 0.9}), oq({q}, {.lr = 0.1, .momentum = 0.9});
  GradScaler scaler;
  CHECK(scaler.get_scale() == 65536);
  const Tensor c = make({0.3, 1, -4}, {3});
  for (int i = 0; i < 3; ++i) {
    op.zero_grad();
    oq.zero_grad();
    Tensor loss = sum(p * p * c);
    Tensor scaled = scaler.scale(loss);
    CHECK(values(scaled)[0] == values(loss)[0] * 65536);
    scaled.backward();
    scaler.step(op);
    scaler.update();
    sum(q * q * c).backward();
    oq.step();
    CHECK(bitwise_equal(p.detach(), q.detach()));
  }
  CHECK(scaler.get_scale() == 65536);
}

TEST_CASE("GradScaler: an inf or a NaN skips the step, state included, and the scale backs off") {
  for (double bad : std::vector<double>{INFINITY, NAN}) {
    Tensor p = make({1, 2}, {2}).requires_grad_(true);
    optim::Adam opt({p}, {.lr = 0.1});
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
    auto step = [&](double v) {
      opt.zero_grad();
      scaler.scale(sum(p * make({v, 1}, {2}))).backward();
      scaler.step(opt);
      scaler.update();
    };
    step(1);
    const Tensor after_one = p.detach().clone();
    const std::vector<Tensor> state = opt.state_tensors();
    std::vector<Tensor> saved;
    for (const Tensor& t : state) saved.push_back(t.clone());
    step(bad);
    CHECK(bitwise_equal(p.detach(), after_one));
    for (size_t i = 0; i < state.size(); ++i) CHECK(bitwise_equal(state[i], saved[i]));
    CHECK(scaler.get_scale() == 512);
    // Two clean steps in a row grow it again.
    step(1);
    CHECK(scaler.get_scale() == 512);
    step(1);
    CHECK(scaler.get_scale() == 1024);
    CHECK_FALSE(bitwise_equal(p.detach(), after_one));
  }
}

TEST_CASE("GradScaler: misuse raises, disabled it passes through") {
  Tensor p = make({1}, {1}).requires_grad_(true);
  optim::SGD opt({p}, {.lr = 0.1});
  GradScaler scaler;
  CHECK(error_of<ValueError>([&] { scaler.update(); }) ==
        "[GradScaler] update() with no step() or unscale_() since the last update()");
  scaler.scale(sum(p)).backward();
  scaler.unscale_(opt);
  CHECK(values(p.grad()) == std::vector<double>{1});
  CHECK(error_of<ValueError>([&] { scaler.unscale_(opt); }) ==
        "[GradScaler] unscale_() was already called on this SGD since the last update()");
  CHECK(contains(error_of<ValueError>([] { GradScaler(GradScalerOptions().growth_factor(0.5)); }),
                 "[GradScaler] growth_factor must be > 1, got 0.5"));
  GradScaler off(GradScalerOptions().enabled(false));
  const Tensor l = sum(p);
  CHECK(off.scale(l).is_same(l));
  CHECK(off.get_scale() == 1);
}

TEST_CASE("GradScaler in a compiled step: one trace through clean and skipped steps, as eager") {
  // The skip is decided on the device: a host read of the flag would guard the trace on it, and
  // the step would trace again when the flag changes.
  auto run = [](bool compiled) {
    Tensor p = make({1, -1, 0.5}, {3}).requires_grad_(true);
    optim::SGD opt({p}, {.lr = 0.05, .momentum = 0.9});
    GradScaler scaler(GradScalerOptions().init_scale(256).growth_interval(2));
    auto body = [&](Tensor c) {
      opt.zero_grad();
      Tensor loss = sum(p * p * c);
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      return loss;
    };
    auto step = compile(body);
    std::vector<double> trail;
    for (double v : std::vector<double>{1.0, 2.0, INFINITY, 1.0, 1.0, NAN, 3.0}) {
      const Tensor c = make({v, 1, 2}, {3});
      compiled ? step(c) : body(c);
      for (double x : values(p)) trail.push_back(x);
      trail.push_back(scaler.get_scale());
    }
    if (compiled) CHECK(step.stats().traces == 1);
    return trail;
  };
  const std::vector<double> eager = run(false), compiled = run(true);
  CHECK(differences(compiled, eager, 0, 0).empty());
}

}  // namespace duet::test
