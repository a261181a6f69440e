// Fashion-MNIST, the main demo: debug eagerly, compile the hot function, compare the two.
//
// The W4 MLP of docs/benchmarks.md (784-1024-1024-10, batch 256) is trained on the full training
// set twice from the same initialization and in the same batch order: once eagerly, once with
// the training step compiled. The demo prints a progress bar, then a table: time per step, the
// speed-up, peak tensor memory, the test accuracy of each, and how far apart the two runs are
// (losses at every step, parameters at the end). Both loss curves go to an SVG image.
//
//   fashion_mnist [--epochs N] [--optimizer adam|sgd] [--lr X] [--batch B] [--seed S]
//                 [--limit STEPS] [--svg PATH] [--data DIR] [--no-codegen] [--autocast bf16|f16]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "duet.h"
#include "trace/plan/codegen.h"

using namespace duet;

namespace {

struct Args {
  int epochs = 1;
  std::string optimizer = "adam";
  double lr = -1;  // the optimizer's default: 1e-3 for Adam, 0.05 for SGD
  int64_t batch = 256;
  uint64_t seed = 0;
  int64_t limit = 0;  // steps per epoch, 0 for all
  std::string svg = "fashion_mnist_loss.svg";
  std::string data = data::kFashionMnistDir;
  // Generated C++ kernels for fused groups: g++ builds them in the background once a group has
  // run a few times, and caches them on disk. The demo waits for that one-time build outside the
  // timed steps and reports it in the table (a build on 2 cores would otherwise take a core
  // from a 3-second epoch). --no-codegen runs fused groups on the interpreter instead.
  bool codegen = true;
  // --autocast bf16|f16: the forward pass and the loss in an Autocast scope (the linear layers
  // in the low dtype, the loss in f32); the parameters stay f32.
  std::string autocast;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      DUET_CHECK_VALUE(i + 1 < argc, "[fashion_mnist] {} needs a value", k);
      return argv[++i];
    };
    if (k == "--epochs")
      a.epochs = std::stoi(value());
    else if (k == "--optimizer")
      a.optimizer = value();
    else if (k == "--lr")
      a.lr = std::stod(value());
    else if (k == "--batch")
      a.batch = std::stoll(value());
    else if (k == "--seed")
      a.seed = std::stoull(value());
    else if (k == "--limit")
      a.limit = std::stoll(value());
    else if (k == "--svg")
      a.svg = value();
    else if (k == "--data")
      a.data = value();
    else if (k == "--autocast")
      a.autocast = value();
    else if (k == "--no-codegen")
      a.codegen = false;
    else
      DUET_CHECK_VALUE(
          false,
          "[fashion_mnist] unknown option {}; the options are --epochs, "
          "--optimizer adam|sgd, --lr, --batch, --seed, --limit, --svg, --data, --no-codegen, "
          "--autocast bf16|f16",
          k);
  }
  DUET_CHECK_VALUE(a.optimizer == "adam" || a.optimizer == "sgd",
                   "[fashion_mnist] --optimizer is adam or sgd, got {}", a.optimizer);
  DUET_CHECK_VALUE(a.epochs >= 1 && a.batch >= 1, "[fashion_mnist] --epochs and --batch are >= 1");
  DUET_CHECK_VALUE(a.autocast.empty() || a.autocast == "bf16" || a.autocast == "f16",
                   "[fashion_mnist] --autocast is bf16 or f16, got {}", a.autocast);
  return a;
}

// W4: 784-1024-1024-10 with ReLU, initialized from the seed (the same seed, the same model).
nn::Sequential make_model(uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                        nn::Linear(1024, 10));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Args& a, const nn::Module& m) {
  if (a.optimizer == "sgd")
    return std::make_unique<optim::SGD>(
        m.parameters(), optim::SGDOptions{a.lr > 0 ? a.lr : 0.05, /*momentum=*/0.9});
  optim::AdamOptions o;
  if (a.lr > 0) o.lr = a.lr;
  return std::make_unique<optim::Adam>(m.parameters(), o);
}

// What one face did.
struct Run {
  std::string face;
  std::vector<double> losses;
  std::vector<double> step_ms;  // each step's time
  double seconds = 0;
  double kernel_build_s = 0;  // compiled: waiting for the generated kernels, once
  int64_t steps = 0;
  int64_t peak_bytes = 0;
  double accuracy = 0;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A progress bar redrawn in place on a terminal; elsewhere (a log, CI), its last state only.
void progress(const Run& r, int epoch, int epochs, int64_t step, int64_t steps, double loss,
              double samples_per_s) {
  static const bool tty = isatty(fileno(stdout));
  if (!tty && step != steps) return;
  const int width = 30;
  const int filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  std::printf("%s%-8s epoch %d/%d [%s] %4lld/%lld  loss %.4f  %5.0f samples/s", tty ? "\r" : "",
              r.face.c_str(), epoch, epochs, bar.c_str(), static_cast<long long>(step),
              static_cast<long long>(steps), loss, samples_per_s);
  if (step == steps) std::printf("\n");
  std::fflush(stdout);
}

double accuracy(nn::Module& model, const data::Dataset& test) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0;
  const int64_t n = test.inputs.size(0), chunk = 1000;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t end = std::min(n, i + chunk);
    Tensor pred = argmax(model(slice(test.inputs, 0, i, end)), 1);
    correct += sum(eq(pred, slice(test.targets, 0, i, end))).item<int64_t>();
  }
  model.train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

// One training step of `model` with `opt`, its forward under autocast when asked.
std::function<Tensor(const Tensor&, const Tensor&)> step_of(nn::Module& model,
                                                            optim::Optimizer& opt, const Args& a) {
  const bool amp = !a.autocast.empty();
  const DType low = a.autocast == "f16" ? DType::f16 : DType::bf16;
  return [&model, &opt, amp, low](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss;
    {
      Autocast ac(Device::cpu(), low, /*enabled=*/amp);
      loss = cross_entropy(model(x), y);
    }
    loss.backward();
    opt.step();
    return loss;
  };
}

// Trains `model` with the step run eagerly or compiled; the loader's order is the same for both.
Run train(const std::string& face, bool compiled, nn::Module& model, const Args& a,
          const data::Dataset& train_set, const data::Dataset& test_set) {
  Run r;
  r.face = face;
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(a, model);
  data::DataLoader loader(train_set.inputs, train_set.targets, a.batch, /*shuffle=*/true, a.seed);
  const std::function<Tensor(const Tensor&, const Tensor&)> step = step_of(model, *opt, a);
  CompileOptions options;
  if (!a.codegen) options.disable_passes = {"codegen"};
  auto compiled_step = compile(step, options);
  const int64_t steps = a.limit > 0
                            ? std::min<int64_t>(a.limit, static_cast<int64_t>(loader.size()))
                            : static_cast<int64_t>(loader.size());
  const int64_t base = cpu_memory_stats().current;
  reset_peak_memory();
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    loader.set_epoch(epoch);
    int64_t i = 0;
    double stepped = 0, samples = 0;  // the epoch's step time (one-time builds left out)
    for (const data::Batch& b : loader) {
      if (i == steps) break;
      const double t = now_s();
      Tensor loss = compiled ? compiled_step(b.inputs, b.targets) : step(b.inputs, b.targets);
      const double l = loss.item<float>();
      r.seconds += now_s() - t;
      stepped += now_s() - t;
      r.step_ms.push_back(1e3 * (now_s() - t));
      r.losses.push_back(l);
      // Past the codegen threshold the hot fused groups are queued for g++: wait for that
      // one-time build here, outside the timed steps, and report it.
      if (compiled && a.codegen && r.step_ms.size() == size_t(codegen::threshold()) + 1) {
        const double w = now_s();
        codegen::wait_idle();
        r.kernel_build_s = now_s() - w;
      }
      samples += static_cast<double>(b.inputs.size(0));
      ++i;
      if (i % 5 == 0 || i == steps)
        progress(r, epoch + 1, a.epochs, i, steps, l, samples / stepped);
    }
    r.steps += i;
  }
  r.peak_bytes = cpu_memory_stats().peak - base;
  r.accuracy = accuracy(model, test_set);
  if (compiled) {
    const CompileStats s = compiled_step.stats();
    std::printf(
        "compiled step: %d trace(s), %d hits; %lld nodes traced, %lld after the passes, "
        "%lld fused kernels\n",
        s.traces, s.hits, static_cast<long long>(s.nodes_before),
        static_cast<long long>(s.nodes_after), static_cast<long long>(s.fused_kernels));
    for (const std::string& why : s.retrace_reasons) std::printf("  retraced: %s\n", why.c_str());
  }
  return r;
}

// Both loss curves, raw and as a moving average, in one SVG.
void write_svg(const std::string& path, const Run& e, const Run& c) {
  const double W = 760, H = 420, L = 60, R = 20, T = 30, B = 50;
  double hi = 0;
  for (const Run* r : {&e, &c})
    for (double v : r->losses) hi = std::max(hi, v);
  hi = std::min(hi, 2.5);
  const size_t n = std::max(e.losses.size(), c.losses.size());
  auto px = [&](size_t i) { return L + (W - L - R) * static_cast<double>(i) / double(n - 1); };
  auto py = [&](double v) { return T + (H - T - B) * (1 - std::min(v, hi) / hi); };
  std::ofstream f(path);
  DUET_CHECK_VALUE(f.good(), "[fashion_mnist] cannot write {}", path);
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n";
  f << "<text x='" << L << "' y='18' font-size='14'>Fashion-MNIST, W4 MLP: training loss per "
    << "step, eager and compiled</text>\n";
  for (int k = 0; k <= 5; ++k) {
    const double v = hi * k / 5, y = py(v);
    f << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y << "' y2='" << y
      << "' stroke='#ddd'/><text x='" << L - 8 << "' y='" << y + 4 << "' text-anchor='end'>"
      << std::round(v * 100) / 100 << "</text>\n";
  }
  f << "<text x='" << (L + W - R) / 2 << "' y='" << H - 12 << "' text-anchor='middle'>step (" << n
    << " in all)</text>\n";
  auto curve = [&](const Run& r, const char* color, double width, double dash) {
    f << "<polyline fill='none' stroke='" << color << "' stroke-width='" << width << "'"
      << (dash > 0 ? " stroke-dasharray='" + std::to_string(dash) + "'" : "") << " points='";
    double avg = r.losses.empty() ? 0 : r.losses[0];
    for (size_t i = 0; i < r.losses.size(); ++i) {
      avg = 0.9 * avg + 0.1 * r.losses[i];
      f << px(i) << "," << py(avg) << " ";
    }
    f << "'/>\n";
  };
  curve(e, "#1f77b4", 3, 0);
  curve(c, "#ff7f0e", 1.5, 6);
  f << "<text x='" << W - R - 200 << "' y='" << T + 20 << "' fill='#1f77b4'>eager (moving "
    << "average)</text>\n<text x='" << W - R - 200 << "' y='" << T + 38
    << "' fill='#ff7f0e'>compiled (dashed)</text>\n</svg>\n";
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  std::printf(
      "duet Fashion-MNIST: W4 MLP 784-1024-1024-10, batch %lld, %s, %d epoch(s) per "
      "face, %d threads%s%s\n",
      static_cast<long long>(a.batch), a.optimizer.c_str(), a.epochs, get_num_threads(),
      a.autocast.empty() ? "" : ", autocast ", a.autocast.c_str());
  const double t_load = now_s();
  data::Dataset train_set = data::load_fashion_mnist(true, a.data);
  data::Dataset test_set = data::load_fashion_mnist(false, a.data);
  // Standardized with the training set's mean and standard deviation, as torchvision's
  // Normalize does.
  const Tensor mu = mean(train_set.inputs),
               sd = sqrt(mean((train_set.inputs - mu) * (train_set.inputs - mu)));
  train_set.inputs = (train_set.inputs - mu) / sd;
  test_set.inputs = (test_set.inputs - mu) / sd;
  std::printf("data: %lld training and %lld test images from %s (%.1f s)\n",
              static_cast<long long>(train_set.inputs.size(0)),
              static_cast<long long>(test_set.inputs.size(0)), a.data.c_str(), now_s() - t_load);

  nn::Sequential eager_model = make_model(a.seed), compiled_model = make_model(a.seed);
  const Run e = train("eager", false, eager_model, a, train_set, test_set);
  const Run c = train("compiled", true, compiled_model, a, train_set, test_set);

  double loss_diff = 0;
  size_t worst = 0;
  for (size_t i = 0; i < std::min(e.losses.size(), c.losses.size()); ++i) {
    const double d = std::abs(e.losses[i] - c.losses[i]) / std::max(std::abs(e.losses[i]), 1e-12);
    if (d > loss_diff) {
      loss_diff = d;
      worst = i;
    }
  }
  double param_diff = 0;
  {
    NoGradGuard no_grad;
    const std::vector<Tensor> pe = eager_model.parameters(), pc = compiled_model.parameters();
    for (size_t i = 0; i < pe.size(); ++i)
      param_diff = std::max(param_diff, max(abs(pe[i] - pc[i])).item<double>());
  }
  std::printf("\n%-30s %12s %12s\n", "", "eager", "compiled");
  std::printf("%-30s %9.2f ms %9.2f ms   (compiled: its traces included)\n", "time per step (mean)",
              1e3 * e.seconds / double(e.steps), 1e3 * c.seconds / double(c.steps));
  std::printf("%-30s %10.1f s %10.1f s   speed-up %.2fx\n", "training time", e.seconds, c.seconds,
              e.seconds / c.seconds);
  std::printf("%-30s %12s %10.1f s   (once: g++ builds the fused kernels, cached on disk)\n",
              "generated kernels built", "", c.kernel_build_s);
  std::printf("%-30s %8.1f MiB %8.1f MiB\n", "peak tensor memory (training)",
              double(e.peak_bytes) / (1 << 20), double(c.peak_bytes) / (1 << 20));
  std::printf("%-30s %10.2f %% %10.2f %%\n", "test accuracy", e.accuracy, c.accuracy);
  std::printf("%-30s %.3g relative (step %zu of %zu)\n", "largest loss difference", loss_diff,
              worst + 1, e.losses.size());
  std::printf("%-30s %.3g\n", "largest parameter difference", param_diff);
  write_svg(a.svg, e, c);
  std::printf("loss curves: %s\n", a.svg.c_str());
  // One step on the first batch, each face from the same state: duet::compare's table.
  nn::Sequential model = make_model(a.seed);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(a, model);
  const Tensor x0 = slice(train_set.inputs, 0, 0, a.batch).contiguous();
  const Tensor y0 = slice(train_set.targets, 0, 0, a.batch).contiguous();
  const FacesReport faces = compare(step_of(model, *opt, a), x0, y0);
  std::printf("\none step, compared (duet::compare):\n%s", faces.str().c_str());
  return 0;
} catch (const Error& err) {
  std::fprintf(stderr, "fashion_mnist: %s\n", err.what());
  return 1;
}
