// Test tables of the nn layer (nn/): the layers, the optimizers, the learning-rate schedules and
// the losses, each a row that every test of its kind runs. test_nn runs the layer rows as
// gradchecks and eager against compiled, test_optim the optimizer rows against a reference,
// test_lr_scheduler the schedule rows compiled, and test_cuda_nn every table as training steps
// on CUDA, eager and compiled, against the CPU: a new row gets all of these.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/activation.h"
#include "nn/layers.h"
#include "nn/volume.h"
#include "nn/module.h"
#include "nn/optim/optim.h"
#include "nn/optim/schedulers.h"

namespace duet::test {

using ModulePtr = std::shared_ptr<nn::Module>;

/// A maker of fresh modules M(args...), initialized from the current seed.
template <class M, class... A>
std::function<ModulePtr()> maker(A... args) {
  return [=] { return ModulePtr(std::make_shared<M>(args...)); };
}

// ---- The layer table ----

struct LayerRow {
  std::string label;
  std::function<ModulePtr()> make;  // a fresh module, initialized from the current seed
  Shape input;
  int64_t index_high = 0;  // > 0: the input is i64 indices in [0, index_high)
};

const std::vector<LayerRow>& layer_rows();
/// A row's input on the CPU: i64 indices for an index row, else normal values of `dtype`.
Tensor make_input(const LayerRow& row, DType dtype);

// ---- The optimizer table: one row per optimizer and option combination ----

enum class OptimKind { SGD, Adam, AdamW, RMSprop };

struct OptimCase {
  const char* name;
  OptimKind kind;
  double lr;
  double momentum = 0, weight_decay = 0;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double alpha = 0.99;    // RMSprop
  bool centered = false;  // RMSprop
};

const std::vector<OptimCase>& optimizer_cases();
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimCase& c, std::vector<Tensor> params);

// ---- The learning-rate schedules ----

/// Makes a scheduler (and any it sequences) for `opt`; the holder keeps them alive.
using MakeSchedule = std::function<std::unique_ptr<optim::LRScheduler>(
    optim::Optimizer&, std::vector<std::unique_ptr<optim::LRScheduler>>&)>;

struct ScheduleRow {
  const char* name;
  MakeSchedule make;
};
const std::vector<ScheduleRow>& schedule_rows();

// ---- The losses ----

/// A loss of a model's output (N, C) against a target: class indices in [0, C) (i64, (N)),
/// or values of the output's shape and dtype (in [0, 1] where `probabilities`).
struct LossRow {
  const char* name;
  std::function<Tensor(const Tensor& out, const Tensor& target)> loss;
  enum class Target { Classes, Values, Probabilities } target;
};
const std::vector<LossRow>& loss_rows();
/// A target for `row` against outputs (n, c) of `dtype`, on the CPU.
Tensor make_target(const LossRow& row, int64_t n, int64_t c, DType dtype);

}  // namespace duet::test
