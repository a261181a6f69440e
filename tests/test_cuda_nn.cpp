// The nn tables on a GPU (tests/nn_rows.h): every layer row, every optimizer row with gradient
// clipping, every learning-rate schedule and every loss trains a few steps on cuda:0, eagerly and
// under compile, and each run matches the same steps on the CPU: the loss of every step, then
// every parameter and buffer (batch norm's running statistics and count among them). A row added
// to a table gets this column with no code here. Dropout rows draw the same masks on both devices
// (the CUDA generator draws the CPU's bits for the same seed, test_cuda_random). Without a usable
// GPU every case returns at once, gpu() calls skip() and the binary exits with 77, which ctest
// reports as Skipped.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/optim/optim.h"
#include "nn/utils.h"
#include "nn_rows.h"
#include "trace/compile.h"
#include "util.h"

namespace duet::test {
namespace {

// Where the rows train; the CPU's eager run is the reference.
Device target() { return Device::cuda(); }

// A model made on one device with its training step (x, y) -> loss. The step is the same code
// for both faces; make_trainer seeds before it builds anything, so every run starts alike.
struct Trainer {
  std::function<Tensor(const Tensor&, const Tensor&)> step;
  std::function<void()> after_step;            // between steps (a scheduler), or empty
  std::function<std::vector<Tensor>()> state;  // what a run leaves, to compare
  Tensor x, y;                                 // on the CPU
  std::vector<std::shared_ptr<void>> keep;     // the model and optimizer, alive
};
using MakeTrainer = std::function<Trainer(Device)>;

// What a run leaves, on the CPU: each step's loss, then the trainer's state.
struct Run {
  std::vector<double> losses;
  std::vector<Tensor> state;
  int traces = 0;  // compiled runs: the traces of the step
};

// `steps` steps of make(device)'s trainer, eagerly or through compile, each after manual_seed
// of its own (dropout draws one mask per step, the same in every run).
Run run(const MakeTrainer& make, Device device, bool compiled, int steps) {
  Trainer t = make(device);
  const Tensor x = t.x.to(device), y = t.y.to(device);
  auto c = compile([&t](Tensor a, Tensor b) { return t.step(a, b); });
  Run r;
  for (int s = 0; s < steps; ++s) {
    manual_seed(500 + s);
    const Tensor loss = compiled ? c(x, y) : t.step(x, y);
    CHECK(loss.device() == device);
    r.losses.push_back(loss.item<double>());
    if (t.after_step) t.after_step();
  }
  if (compiled) r.traces = c.stats().traces;
  for (const Tensor& v : t.state()) r.state.push_back(v.detach().to(Device::cpu()).clone());
  return r;
}

void check_run(const Run& got, const Run& want, double tol) {
  CHECK_MESSAGE(differences(got.losses, want.losses, tol, tol).empty(),
                "losses: " << differences(got.losses, want.losses, tol, tol));
  REQUIRE(got.state.size() == want.state.size());
  for (size_t k = 0; k < got.state.size(); ++k) {
    INFO("state " << k << " " << want.state[k].sizes().str());
    CHECK(dtype_name(got.state[k].dtype()) == dtype_name(want.state[k].dtype()));
    const std::string m = differences(values(got.state[k]), values(want.state[k]), tol, tol);
    CHECK_MESSAGE(m.empty(), m);
  }
}

// The column: eager and compiled on target() against eager on the CPU.
void check_on_device(const MakeTrainer& make, int steps, double tol = 1e-4) {
  const Run cpu = run(make, Device::cpu(), false, steps);
  {
    INFO("eager on " << target().str());
    check_run(run(make, target(), false, steps), cpu, tol);
  }
  INFO("compiled on " << target().str());
  const Run compiled = run(make, target(), true, steps);
  check_run(compiled, cpu, tol);
  CHECK(compiled.traces == 1);
}

// A module's parameters, then its buffers.
std::vector<Tensor> module_state(const nn::Module& m) {
  std::vector<Tensor> out = m.parameters();
  for (const Tensor& b : m.buffers()) out.push_back(b);
  return out;
}

using LossFn = std::function<Tensor(nn::Module& m, const Tensor& x, const Tensor& y)>;

// m trained by opt (none: the loss alone, for a module without parameters) on loss(m, x, y):
// zero_grad, the loss, backward, `clip` (when given), step; the step returns the loss detached.
// The state is m's parameters and buffers.
Trainer trainer(std::shared_ptr<nn::Module> m, std::shared_ptr<optim::Optimizer> opt, LossFn loss,
                std::function<void(nn::Module&)> clip = {}) {
  Trainer t;
  t.step = [m, opt, loss, clip](const Tensor& x, const Tensor& y) {
    if (opt) opt->zero_grad();
    Tensor l = loss(*m, x, y);
    if (opt) {
      l.backward();
      if (clip) clip(*m);
      opt->step();
    }
    return l.detach();
  };
  t.state = [m] { return module_state(*m); };
  t.keep = {m, opt};
  return t;
}

// The classifier the optimizer and schedule rows train, 6 -> 12 -> tanh -> 3, on a batch of 8
// drawn from `seed`, with cross-entropy.
std::shared_ptr<nn::Module> classifier(Device device) {
  manual_seed(31);
  auto m = std::make_shared<nn::Sequential>(nn::Linear(6, 12), nn::Tanh(), nn::Linear(12, 3));
  m->to(device);
  return m;
}
Tensor cross_entropy_of(nn::Module& m, const Tensor& x, const Tensor& y) {
  return cross_entropy(m(x), y);
}
void classes(Trainer& t, uint64_t seed) {
  manual_seed(seed);
  t.x = randn({8, 6});
  t.y = randint(3, {8});
}

TEST_CASE("cuda nn: every layer row trains 3 steps, eager and compiled, as on the CPU") {
  if (!gpu()) return;
  int rows = 0;
  for (size_t i = 0; i < layer_rows().size(); ++i) {
    const LayerRow& row = layer_rows()[i];
    INFO(row.label);
    const MakeTrainer make = [&row, i](Device device) {
      manual_seed(i + 1);
      ModulePtr m = row.make();
      m->to(device);
      std::shared_ptr<optim::SGD> opt;
      if (!m->parameters().empty())
        opt = std::make_shared<optim::SGD>(m->parameters(),
                                           optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
      // The loss weighs each output by y.
      Trainer t = trainer(m, opt, [](nn::Module& mod, const Tensor& x, const Tensor& y) {
        return sum(mod(x) * y);
      });
      manual_seed(1000 + i);
      t.x = make_input(row, DType::f32);
      Shape out;
      {
        manual_seed(i + 1);
        const ModulePtr probe = row.make();
        NoGradGuard no_grad;
        out = (*probe)(t.x).shape();
      }
      manual_seed(2000 + i);
      t.y = randn(out);
      return t;
    };
    check_on_device(make, 3);
    ++rows;
  }
  MESSAGE(rows << " layer rows trained on " << target().str());
}

// Each optimizer row with a clipping of the gradients before its step: none, clip_grad_norm_
// (2-norm, then inf-norm) or clip_grad_value_, in turn.
TEST_CASE("cuda nn: every optimizer row, with gradient clipping, as on the CPU") {
  if (!gpu()) return;
  const std::vector<OptimCase>& cases = optimizer_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const OptimCase& c = cases[i];
    const int clip = static_cast<int>(i % 4);
    INFO(c.name << ", clipping " << clip);
    const MakeTrainer make = [&c, clip](Device device) {
      auto m = classifier(device);
      auto clip_grads = [clip](nn::Module& mod) {
        if (clip == 1) nn::utils::clip_grad_norm_(mod.parameters(), 0.5);
        if (clip == 2) nn::utils::clip_grad_norm_(mod.parameters(), 0.3, INFINITY);
        if (clip == 3) nn::utils::clip_grad_value_(mod.parameters(), 0.02);
      };
      Trainer t = trainer(m, make_optimizer(c, m->parameters()), cross_entropy_of, clip_grads);
      classes(t, 32);
      return t;
    };
    check_on_device(make, 3);
  }
}

// Six steps, so that every schedule moves the learning rate within the run.
TEST_CASE("cuda nn: every learning-rate schedule row, stepped between steps, as on the CPU") {
  if (!gpu()) return;
  for (const ScheduleRow& row : schedule_rows()) {
    for (bool adam : {false, true}) {
      INFO(row.name << (adam ? ", Adam" : ", SGD momentum"));
      const MakeTrainer make = [&row, adam](Device device) {
        auto m = classifier(device);
        std::shared_ptr<optim::Optimizer> opt;
        if (adam)
          opt = std::make_shared<optim::Adam>(m->parameters(), optim::AdamOptions{.lr = 0.05});
        else
          opt = std::make_shared<optim::SGD>(m->parameters(),
                                             optim::SGDOptions{.lr = 0.2, .momentum = 0.9});
        auto held = std::make_shared<std::vector<std::unique_ptr<optim::LRScheduler>>>();
        std::shared_ptr<optim::LRScheduler> sched = row.make(*opt, *held);
        Trainer t = trainer(m, opt, cross_entropy_of);
        t.after_step = [sched] { sched->step(); };
        t.keep.insert(t.keep.end(), {held, sched});
        classes(t, 33);
        return t;
      };
      check_on_device(make, 6);
    }
  }
}

TEST_CASE("cuda nn: every loss row trains a linear layer 3 steps, as on the CPU") {
  if (!gpu()) return;
  for (const LossRow& row : loss_rows()) {
    INFO(row.name);
    const MakeTrainer make = [&row](Device device) {
      manual_seed(35);
      auto m = std::make_shared<nn::Linear>(5, 4);
      m->to(device);
      auto opt = std::make_shared<optim::SGD>(m->parameters(), optim::SGDOptions{.lr = 0.1});
      Trainer t = trainer(m, opt, [&row](nn::Module& mod, const Tensor& x, const Tensor& y) {
        return row.loss(mod(x), y);
      });
      manual_seed(34);
      t.x = randn({6, 5});
      t.y = make_target(row, 6, 4, DType::f32);
      return t;
    };
    check_on_device(make, 3);
  }
}

}  // namespace
}  // namespace duet::test
