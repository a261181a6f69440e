// The generated-C++ tier of fused kernels: the source generator, then the background builder
// with its disk cache (Note [Codegen cache]).
#include "trace/codegen.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "kernels/jit.h"

extern char** environ;

namespace duet::detail {

// Written by CMakeLists.txt into the build tree: the compiler and flags of duet's own kernels,
// Eigen's include directory, and the texts of the headers the generated code includes.
extern const char* const kCodegenCompiler;
extern const char* const kCodegenFlags;
extern const char* const kCodegenEigenInclude;
extern const char* const kCodegenEigenVersion;
extern const char* const kCodegenFunctorsH;
extern const char* const kCodegenFusedAbiH;

}  // namespace duet::detail

// ---- building, caching and loading -----------------------------------------------------------

namespace duet::codegen {
namespace {

namespace fs = std::filesystem;

std::atomic<int> g_enabled{-1};          // -1: DUET_CODEGEN not read yet
std::atomic<int> g_threshold{-1};        // -1: DUET_CODEGEN_THRESHOLD not read yet (default 3)
std::atomic<bool> g_worker_gone{false};  // set by ~Worker: a kernel run during exit queues nothing

std::string default_cache_dir() {
  if (const char* d = std::getenv("DUET_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/duet/kernels";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/duet/kernels";
  return fmt::format("/tmp/duet-kernels-{}", getuid());
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(sep, i);
    if (j == std::string_view::npos) j = s.size();
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// Starts argv[0] (looked up in PATH) with no shell: stdin from /dev/null, stdout and stderr to
// out_fd. Returns the pid, or -1.
pid_t spawn(const std::vector<std::string>& argv, int out_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// The compiler with its flags; `identity` (its path, flags and `--version`) enters the key.
struct Toolchain {
  std::vector<std::string> argv;  // compiler, flags; the output and the source are appended
  std::string identity;
};

// One worker thread builds the queued kernels, one at a time. The object lives until static
// destruction, which kills a compiler still running and joins the thread.
class Worker {
 public:
  static Worker& get() {
    static Worker w;
    return w;
  }
  ~Worker() {
    g_worker_gone.store(true);
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      queue_.clear();
      if (child_ > 0) kill(child_, SIGKILL);
    }
    work_cv_.notify_all();
    idle_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void enqueue(std::shared_ptr<kernels::FusedKernel> k) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      queue_.push_back(std::move(k));
      ++stats_.queued;
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    work_cv_.notify_one();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return stop_ || (queue_.empty() && !busy_); });
  }
  CodegenStats stats() {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  std::string dir() {
    std::lock_guard<std::mutex> l(mu_);
    return dir_.empty() ? default_cache_dir() : dir_;
  }
  void set_dir(std::string d) {
    std::lock_guard<std::mutex> l(mu_);
    dir_ = std::move(d);
  }

 private:
  Worker() = default;

  void loop() {
    for (;;) {
      std::shared_ptr<kernels::FusedKernel> k;
      {
        std::unique_lock<std::mutex> l(mu_);
        work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        k = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      try {
        build(*k);
      } catch (const std::exception& e) {
        fail(fmt::format("codegen failed: {}", e.what()));
      }
      k.reset();
      {
        std::lock_guard<std::mutex> l(mu_);
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }

  void fail(const std::string& why) {
    fmt::print(stderr, "duet: warning: {}; the interpreter keeps running this fused kernel\n", why);
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.failed;
  }

  // Runs argv to completion, its output to out_fd; the exit status, or -1. The child is waited
  // for without being reaped first, so that ~Worker can kill it by pid with no race on reuse.
  int run(const std::vector<std::string>& argv, int out_fd) {
    pid_t pid = spawn(argv, out_fd);
    if (pid < 0) return -1;
    {
      std::lock_guard<std::mutex> l(mu_);
      child_ = pid;
      if (stop_) kill(pid, SIGKILL);
    }
    siginfo_t info;
    while (waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      child_ = 0;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  Toolchain toolchain() {
    const char* env = std::getenv("DUET_CODEGEN_CXX");
    std::string cxx = env && *env ? env : detail::kCodegenCompiler;
    Toolchain tc;
    tc.argv.push_back(cxx);
    for (std::string& f : split(detail::kCodegenFlags, ' ')) tc.argv.push_back(std::move(f));
    for (const char* f : {"-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden"})
      tc.argv.emplace_back(f);
    for (std::string& d : split(detail::kCodegenEigenInclude, ';')) {
      tc.argv.emplace_back("-isystem");
      tc.argv.push_back(std::move(d));
    }
    auto it = versions_.find(cxx);
    if (it == versions_.end()) it = versions_.emplace(cxx, compiler_version(cxx)).first;
    for (const std::string& a : tc.argv) tc.identity += a + '\n';
    tc.identity += it->second;
    tc.identity += detail::kCodegenEigenVersion;
    return tc;
  }

  std::string compiler_version(const std::string& cxx) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return "";
    int status = -1;
    std::string out;
    {
      pid_t pid = spawn({cxx, "--version"}, fds[1]);
      close(fds[1]);
      char buf[4096];
      ssize_t n;
      while (pid > 0 && ((n = read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0) out.append(buf, n);
      if (pid > 0) waitpid(pid, &status, 0);
    }
    close(fds[0]);
    return fmt::format("{}\nstatus {}\n", out, status);
  }

  void build(kernels::FusedKernel& k) {
    const std::string source = detail::generate_fused_source(k.program);
    const std::string headers =
        std::string(detail::kCodegenFunctorsH) + '\0' + detail::kCodegenFusedAbiH;
    Toolchain tc = toolchain();
    const std::string key = fmt::format(
        "{:016x}",
        kernels::jit::fnv1a(tc.identity,
                            kernels::jit::fnv1a(headers, kernels::jit::fnv1a(source + '\0'))));
    if (failed_.count(key)) return;  // reported once, never retried

    const std::string dir = this->dir();
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string base = fmt::format("{}/duet-fused-{}", dir, key), so = base + ".so";
    const bool hit = access(so.c_str(), F_OK) == 0;
    if (!hit) {
      const std::string inc =
          fmt::format("{}/duet-include-{:016x}", dir, kernels::jit::fnv1a(headers));
      fs::create_directories(inc, ec);
      if (!kernels::jit::write_file_once(inc + "/duet_functors.h", detail::kCodegenFunctorsH) ||
          !kernels::jit::write_file_once(inc + "/duet_fused_abi.h", detail::kCodegenFusedAbiH) ||
          !kernels::jit::write_file_once(base + ".cpp",
                                         source + kernels::jit::sites_comment(k.sites))) {
        failed_.insert(key);
        fail(fmt::format("codegen cannot write to its cache directory {}", dir));
        return;
      }
      const std::string tmp = fmt::format("{}.so.tmp-{}", base, getpid());
      const std::string log = fmt::format("{}.log.tmp-{}", base, getpid());
      std::vector<std::string> argv = tc.argv;
      for (const std::string& a : {std::string("-I"), inc, std::string("-o"), tmp, base + ".cpp"})
        argv.push_back(a);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = fd >= 0 ? run(argv, fd) : -1;
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (fd >= 0) close(fd);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_) {  // killed at exit: leave no partial files
          std::remove(tmp.c_str());
          std::remove(log.c_str());
          return;
        }
        stats_.build_ms += ms;
      }
      if (rc != 0 || std::rename(tmp.c_str(), so.c_str()) != 0) {
        std::remove(tmp.c_str());
        std::rename(log.c_str(), (base + ".log").c_str());
        failed_.insert(key);
        fail(
            fmt::format("codegen could not compile a fused kernel with {} (exit status {}, see {})",
                        tc.argv[0], rc, base + ".log"));
        return;
      }
      std::remove(log.c_str());
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.built;
    }
    // Handles stay open for the life of the process: a kernel may run at any time.
    void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* fn = handle ? dlsym(handle, "duet_fused") : nullptr;
    if (fn == nullptr) {
      const char* err = dlerror();
      failed_.insert(key);
      fail(fmt::format("codegen could not load {}: {}", so, err ? err : "no duet_fused"));
      return;
    }
    k.compiled.store(reinterpret_cast<kernels::DuetFusedFn>(fn), std::memory_order_release);
    std::lock_guard<std::mutex> l(mu_);
    if (hit) ++stats_.cache_hits;
    ++stats_.loaded;
  }

  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<std::shared_ptr<kernels::FusedKernel>> queue_;  // guarded by mu_
  std::thread thread_;
  bool busy_ = false, stop_ = false;  // guarded by mu_
  pid_t child_ = 0;                   // the compiler running, guarded by mu_
  std::string dir_;                   // guarded by mu_; "" is the default
  CodegenStats stats_;                // guarded by mu_
  // The worker thread's own: keys that failed, and each compiler's --version.
  std::unordered_set<std::string> failed_;
  std::unordered_map<std::string, std::string> versions_;
};

}  // namespace

void set_enabled(bool on) { g_enabled.store(on ? 1 : 0, std::memory_order_relaxed); }

bool enabled() {
  int v = g_enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("DUET_CODEGEN");
    int want = env && std::string_view(env) == "0" ? 0 : 1;
    g_enabled.compare_exchange_strong(v, want, std::memory_order_relaxed);
    v = g_enabled.load(std::memory_order_relaxed);
  }
  return v != 0;
}

void set_threshold(int runs) {
  DUET_CHECK_T(runs >= 0, ValueError, "[codegen] threshold must be 0 or more, got {}", runs);
  g_threshold.store(runs, std::memory_order_relaxed);
}
int threshold() {
  int v = g_threshold.load(std::memory_order_relaxed);
  if (v < 0) {
    int want = 3;
    if (const char* env = std::getenv("DUET_CODEGEN_THRESHOLD"); env && *env) {
      char* end = nullptr;
      long n = std::strtol(env, &end, 10);
      if (end && *end == '\0' && n >= 0 && n < (1L << 30)) want = static_cast<int>(n);
    }
    g_threshold.compare_exchange_strong(v, want, std::memory_order_relaxed);
    v = g_threshold.load(std::memory_order_relaxed);
  }
  return v;
}

void set_cache_dir(std::string dir) { Worker::get().set_dir(std::move(dir)); }
std::string cache_dir() { return Worker::get().dir(); }

void clear_cache() {
  std::vector<fs::path> ours;
  std::error_code ec;
  for (fs::directory_iterator it(cache_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("duet-fused-", 0) == 0 || name.rfind("duet-include-", 0) == 0)
      ours.push_back(it->path());
  }
  for (const fs::path& p : ours) fs::remove_all(p, ec);
}

void wait_idle() { Worker::get().wait_idle(); }
CodegenStats stats() { return Worker::get().stats(); }

}  // namespace duet::codegen

namespace duet::detail {

void codegen_consider(const std::shared_ptr<kernels::FusedKernel>& k) {
  if (!codegen::enabled() || !k->codegen_allowed) return;
  if (k->runs.load(std::memory_order_relaxed) < codegen::threshold()) return;
  if (codegen::g_worker_gone.load() || k->codegen_requested.exchange(true)) return;
  codegen::Worker::get().enqueue(k);
}

}  // namespace duet::detail
