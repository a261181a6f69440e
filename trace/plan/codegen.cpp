// The generated-C++ tier of fused kernels: the source generator, then the background builder
// with its disk cache (Note [Codegen cache]).
#include "trace/plan/codegen.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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
extern const char* const kCodegenPchDir;

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

// Note [Codegen precompiled header]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A generated kernel is a few hundred lines over duet_functors.h, which includes Eigen: parsing
// Eigen took about three quarters of a kernel's build. duet's build precompiles the headers
// the kernels include (CMakeLists.txt, <build>/codegen-pch/duet_pch.h.gch) with the compiler
// and flags of the kernels, and each kernel build then names it with -include and finds the
// headers beside it. The compiler checks that a precompiled header fits its flags and reads the
// plain header when it does not, so a moved or stale one costs time, never correctness; and the
// kernels' cache keys do not depend on it, since the code is the same either way.
//
// Worker threads build the queued kernels, as many at once as there are cores (at most 4): a
// plan's kernels are queued together at its third run, and building them side by side brings
// a compiled function to its steady speed sooner. The object lives until static destruction,
// which kills the compilers still running and joins the threads.
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
      for (pid_t c : children_) kill(c, SIGKILL);
    }
    work_cv_.notify_all();
    idle_cv_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

  void enqueue(std::shared_ptr<kernels::FusedKernel> k) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      queue_.push_back(std::move(k));
      ++stats_.queued;
      // One more builder while there are queued kernels, up to half the cores (at most 4): the
      // program keeps the other half. On 2 cores one builder had W4's kernels in at 1.1 s where
      // two, each paying the compiler's start and competing with the program's two threads,
      // took 1.3 s (W6: 1.2 s and 1.05 s).
      const size_t cores = std::max(1u, std::min(4u, std::thread::hardware_concurrency() / 2));
      if (threads_.size() < cores && queue_.size() + busy_ > threads_.size())
        threads_.emplace_back([this] { loop(); });
    }
    work_cv_.notify_one();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return stop_ || (queue_.empty() && busy_ == 0); });
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

  // Note [Codegen priority]
  // ~~~~~~~~~~~~~~~~~~~~~~~~
  // The compilers run while the program goes on, on the interpreter, and on a machine with few
  // cores they take CPU time from it. A builder thread sets its own priority (on Linux a nice
  // value belongs to the thread, and the compilers it starts inherit it) to DUET_CODEGEN_NICE
  // (0 to 19; default kDefaultNice = 0, the program's own). Measured with duet_bench's CS on 2
  // cores, W4 (a training step that keeps both cores busy) and W6:
  // - nice 0: the build shares the cores for about a second. W4's steps run 2.3x slower in
  //   that second, W6's 1.2x; then every kernel is in (W4 at 1.1 s, W6 at 1.2 s), and the
  //   steps are at full speed (1.01x and 0.99x the warm-cache median).
  // - nice 19: the builds take only what the program leaves. W4's first second is at 1.02x,
  //   but it leaves nothing: W4's kernels were still not built 8 s later, and its steps stayed
  //   on the interpreter at 1.1x for as long as it ran. W6 was in at 1.2 s.
  // - nice 5: both costs, W4 at 1.6x for 4 s.
  // A program that runs for more than a few seconds gains from the short build, so 0 is the
  // default; DUET_CODEGEN_NICE=19 keeps the builds out of a short program's way.
  static constexpr int kDefaultNice = 0;
  static void lower_priority() {
    int nice = kDefaultNice;
    if (const char* e = std::getenv("DUET_CODEGEN_NICE"); e && *e) {
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      if (end && *end == '\0' && v >= 0 && v <= 19) nice = static_cast<int>(v);
    }
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    const int now = getpriority(PRIO_PROCESS, tid);
    if (nice > now) setpriority(PRIO_PROCESS, tid, nice);
  }

  void loop() {
    lower_priority();
    for (;;) {
      std::vector<std::shared_ptr<kernels::FusedKernel>> batch;
      {
        std::unique_lock<std::mutex> l(mu_);
        work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        // A share of the queue: the builders that are free split it between them.
        const size_t free = std::max<size_t>(1, threads_.size() - busy_);
        const size_t take = std::min(kMaxBatch, (queue_.size() + free - 1) / free);
        for (size_t i = 0; i < take; ++i) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        ++busy_;
      }
      try {
        build(batch);
      } catch (const std::exception& e) {
        fail(fmt::format("codegen failed: {}", e.what()));
      }
      batch.clear();
      {
        std::lock_guard<std::mutex> l(mu_);
        --busy_;
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
      children_.insert(pid);
      if (stop_) kill(pid, SIGKILL);
    }
    siginfo_t info;
    while (waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      children_.erase(pid);
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
    std::string version;
    {
      std::lock_guard<std::mutex> l(tool_mu_);
      auto it = versions_.find(cxx);
      if (it == versions_.end()) it = versions_.emplace(cxx, compiler_version(cxx)).first;
      version = it->second;
    }
    for (const std::string& a : tc.argv) tc.identity += a + '\n';
    tc.identity += version;
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

  // One kernel of a batch: its source and cache key, where its library goes, and whether this
  // builder owns its build (no other builder has the key in flight).
  struct Item {
    kernels::FusedKernel* k;
    std::string source, key, base, so;
    bool owned = false;
  };

  static std::string headers() {
    return std::string(detail::kCodegenFunctorsH) + '\0' + detail::kCodegenFusedAbiH;
  }
  // The cache key of a kernel's source: the source, the headers it includes, the toolchain.
  static std::string key_of(const Toolchain& tc, const std::string& headers,
                            const std::string& source) {
    return fmt::format(
        "{:016x}",
        kernels::jit::fnv1a(tc.identity,
                            kernels::jit::fnv1a(headers, kernels::jit::fnv1a(source + '\0'))));
  }

 public:
  // Note [Codegen warm start]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~
  // A plan looks each of its CPU kernels up in the disk cache as it is built: a kernel built by
  // an earlier run (or process) is loaded there and then, so a compiled function on a warm cache
  // runs generated code from its first call rather than from its threshold()-th plus a load.
  // The lookup costs the source's generation and a hash (tens of microseconds per kernel) and,
  // once per process, the compiler's --version; a kernel not found goes the usual way.
  void probe(const std::shared_ptr<kernels::FusedKernel>& k) {
    Toolchain tc = toolchain();
    Item it{k.get(), detail::generate_fused_source(k->program), "", "", "", false};
    it.key = key_of(tc, headers(), it.source);
    if (failed(it.key)) return;
    it.so = fmt::format("{}/duet-fused-{}.so", dir(), it.key);
    if (access(it.so.c_str(), R_OK) != 0) return;
    if (k->codegen_requested.exchange(true)) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.queued;
    }
    load(it, true);
  }

 private:
  // Builds the kernels of a batch as one translation unit (Note [Codegen batches]), then loads
  // each. Kernels whose library the disk cache holds are only loaded.
  void build(const std::vector<std::shared_ptr<kernels::FusedKernel>>& batch) {
    const std::string headers = this->headers();
    Toolchain tc = toolchain();
    const std::string dir = this->dir();
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::vector<Item> items;
    for (const auto& k : batch) {
      Item it{k.get(), detail::generate_fused_source(k->program), "", "", "", false};
      it.key = key_of(tc, headers, it.source);
      if (failed(it.key)) continue;  // reported once, never retried
      it.base = fmt::format("{}/duet-fused-{}", dir, it.key);
      it.so = it.base + ".so";
      items.push_back(std::move(it));
    }
    // Claim the keys no other builder has in flight; the others are waited for below.
    std::vector<Item*> to_build;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (Item& it : items) {
        if (in_flight_.count(it.key)) continue;
        in_flight_.insert(it.key);
        it.owned = true;
        if (access(it.so.c_str(), F_OK) != 0) to_build.push_back(&it);
      }
    }
    // The owned keys are released once built, before waiting for the others: two builders that
    // each wait for a key the other holds would wait forever.
    struct Release {
      Worker* w;
      std::vector<Item>& items;
      bool done = false;
      void operator()() {
        if (done) return;
        done = true;
        {
          std::lock_guard<std::mutex> l(w->mu_);
          for (Item& it : items)
            if (it.owned) w->in_flight_.erase(it.key);
        }
        w->idle_cv_.notify_all();
      }
      ~Release() { (*this)(); }
    } release{this, items};
    if (!to_build.empty()) compile(tc, headers, dir, to_build);
    release();
    if (stopping()) return;  // the process is exiting: the builds were killed
    for (Item& it : items) {
      if (!it.owned) {
        std::unique_lock<std::mutex> l(mu_);
        idle_cv_.wait(l, [&] { return stop_ || !in_flight_.count(it.key); });
        if (stop_) return;
      }
      if (failed(it.key)) continue;
      const bool hit = std::find_if(to_build.begin(), to_build.end(),
                                    [&](const Item* b) { return b == &it; }) == to_build.end();
      load(it, hit);
    }
  }

  // Compiles the items' sources, as one library, into each item's cache path. When the batch
  // fails, each kernel is built alone, so that one bad kernel costs only itself.
  void compile(const Toolchain& tc, const std::string& headers, const std::string& dir,
               const std::vector<Item*>& items) {
    const std::string inc =
        fmt::format("{}/duet-include-{:016x}", dir, kernels::jit::fnv1a(headers));
    std::error_code ec;
    fs::create_directories(inc, ec);
    bool written =
        kernels::jit::write_file_once(inc + "/duet_functors.h", detail::kCodegenFunctorsH) &&
        kernels::jit::write_file_once(inc + "/duet_fused_abi.h", detail::kCodegenFusedAbiH);
    for (const Item* it : items)
      written =
          written && kernels::jit::write_file_once(
                         it->base + ".cpp", it->source + kernels::jit::sites_comment(it->k->sites));
    if (!written) {
      for (const Item* it : items) mark_failed(it->key);
      fail(fmt::format("codegen cannot write to its cache directory {}", dir));
      return;
    }
    static std::atomic<uint64_t> serial{0};  // builders of one process may build one key
    const uint64_t me = serial++;
    const std::string base =
        items.size() == 1 ? items[0]->base : fmt::format("{}/duet-batch-{}", dir, items[0]->key);
    const std::string src = fmt::format("{}.batch-{}-{}.cpp", base, getpid(), me);
    const std::string tmp = fmt::format("{}.so.tmp-{}-{}", base, getpid(), me);
    const std::string log = fmt::format("{}.log.tmp-{}-{}", base, getpid(), me);
    {
      std::ofstream f(src, std::ios::binary);
      f << batch_source(items);
    }
    std::vector<std::string> argv = tc.argv;
    // With the precompiled header, the kernels' #includes find the headers it was made of.
    const std::string pch = precompiled_header();
    if (!pch.empty())
      for (const std::string& a :
           {std::string("-include"), pch + "/duet_pch.h", std::string("-I"), pch})
        argv.push_back(a);
    for (const std::string& a : {std::string("-I"), inc, std::string("-o"), tmp, src})
      argv.push_back(a);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = fd >= 0 ? run(argv, fd) : -1;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (fd >= 0) close(fd);
    std::remove(src.c_str());
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) {  // killed at exit: leave no partial files
        std::remove(tmp.c_str());
        std::remove(log.c_str());
        return;
      }
      stats_.build_ms += ms;
    }
    if (rc != 0 && items.size() > 1) {
      std::remove(tmp.c_str());
      std::remove(log.c_str());
      for (Item* it : items) compile(tc, headers, dir, {it});
      return;
    }
    // Each kernel's cache entry is a name of the one library (a hard link): a later process
    // finds each by its own key.
    bool ok = rc == 0;
    for (const Item* it : items)
      ok = ok && (link(tmp.c_str(), it->so.c_str()) == 0 || errno == EEXIST);
    std::remove(tmp.c_str());
    if (!ok) {
      std::rename(log.c_str(), (items[0]->base + ".log").c_str());
      mark_failed(items[0]->key);
      fail(fmt::format("codegen could not compile a fused kernel with {} (exit status {}, see {})",
                       tc.argv[0], rc, items[0]->base + ".log"));
      return;
    }
    std::remove(log.c_str());
    std::lock_guard<std::mutex> l(mu_);
    stats_.built += static_cast<int64_t>(items.size());
  }

  // Note [Codegen batches]
  // ~~~~~~~~~~~~~~~~~~~~~~
  // Kernels queued together (a plan's, at its third run) build as one translation unit: each
  // kernel's source, its #includes aside, goes into a namespace of its own, and its entry point
  // is named after its key (duet_fused_<key>). The headers are read once per batch rather than
  // once per kernel, and the library's file gets one name per kernel in the cache. A library of
  // an older duet names its entry point duet_fused; load() looks for both.
  static std::string batch_source(const std::vector<Item*>& items) {
    std::string out = detail::fused_source_includes();
    for (const Item* it : items) {
      std::string body = it->source;
      const size_t start = body.find("\nnamespace {");
      if (start != std::string::npos) body = body.substr(start);
      const std::string entry = "void duet_fused(";
      const size_t at = body.find(entry);
      if (at != std::string::npos)
        body.replace(at, entry.size(), fmt::format("void duet_fused_{}(", it->key));
      out += fmt::format("\nnamespace duet_k_{} {{{}\n}}  // namespace duet_k_{}\n", it->key, body,
                         it->key);
    }
    return out;
  }

  void load(const Item& it, bool hit) {
    // Handles stay open for the life of the process: a kernel may run at any time.
    void* handle = dlopen(it.so.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* fn = handle ? dlsym(handle, fmt::format("duet_fused_{}", it.key).c_str()) : nullptr;
    if (handle && fn == nullptr) fn = dlsym(handle, "duet_fused");
    if (fn == nullptr) {
      const char* err = dlerror();
      mark_failed(it.key);
      fail(fmt::format("codegen could not load {}: {}", it.so, err ? err : "no duet_fused"));
      return;
    }
    it.k->compiled.store(reinterpret_cast<kernels::DuetFusedFn>(fn), std::memory_order_release);
    std::lock_guard<std::mutex> l(mu_);
    if (hit) ++stats_.cache_hits;
    ++stats_.loaded;
  }

  // Kernels one build takes at most.
  static constexpr size_t kMaxBatch = 16;

  // The directory of duet's precompiled kernel header, when this build made one and it is
  // there (Note [Codegen precompiled header]); "" otherwise. DUET_CODEGEN_PCH=0 turns it off.
  static std::string precompiled_header() {
    const std::string dir = detail::kCodegenPchDir;
    if (dir.empty()) return "";
    if (const char* e = std::getenv("DUET_CODEGEN_PCH"); e && std::string_view(e) == "0") return "";
    return access((dir + "/duet_pch.h.gch").c_str(), R_OK) == 0 ? dir : "";
  }
  bool stopping() {
    std::lock_guard<std::mutex> l(mu_);
    return stop_;
  }
  bool failed(const std::string& key) {
    std::lock_guard<std::mutex> l(tool_mu_);
    return failed_.count(key) != 0;
  }
  void mark_failed(const std::string& key) {
    std::lock_guard<std::mutex> l(tool_mu_);
    failed_.insert(key);
  }

  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<std::shared_ptr<kernels::FusedKernel>> queue_;  // guarded by mu_
  std::vector<std::thread> threads_;                         // guarded by mu_
  size_t busy_ = 0;                                          // builds running, guarded by mu_
  bool stop_ = false;                                        // guarded by mu_
  std::unordered_set<pid_t> children_;         // the compilers running, guarded by mu_
  std::unordered_set<std::string> in_flight_;  // keys being built, guarded by mu_
  std::string dir_;                            // guarded by mu_; "" is the default
  CodegenStats stats_;                         // guarded by mu_
  // Keys that failed, and each compiler's --version, guarded by tool_mu_.
  std::mutex tool_mu_;
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

void codegen_probe(const std::shared_ptr<kernels::FusedKernel>& k) {
  if (!codegen::enabled() || !k->codegen_allowed || codegen::g_worker_gone.load()) return;
  if (k->codegen_requested.load(std::memory_order_relaxed)) return;  // queued or loaded already
  try {
    codegen::Worker::get().probe(k);
  } catch (const std::exception&) {
    // Not found, or not loadable: the kernel is built as any other when it runs often enough.
  }
}

void codegen_consider(const std::shared_ptr<kernels::FusedKernel>& k) {
  if (!codegen::enabled() || !k->codegen_allowed) return;
  if (k->runs.load(std::memory_order_relaxed) < codegen::threshold()) return;
  if (codegen::g_worker_gone.load() || k->codegen_requested.exchange(true)) return;
  codegen::Worker::get().enqueue(k);
}

}  // namespace duet::detail
