// duet::dist: the world (who this process is, from its launcher), the transports of each device
// type, and the TCP rendezvous that hands NCCL's id to every rank (core/dist.h).
#include "core/dist.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"

namespace duet::dist {
namespace detail {
namespace {

struct World {
  std::mutex m;
  bool initialized = false;
  int rank = 0, size = 1, local = 0;
  std::string launcher;
  InitOptions opts;
  std::unique_ptr<Comm> comm[kNumDeviceTypes];
  std::string why[kNumDeviceTypes];  ///< why a device type has no transport
};

// Leaked: collectives may run while statics are destroyed at exit.
World& world() {
  static auto* w = new World;
  return *w;
}

World& initialized_world(const char* op) {
  World& w = world();
  DUET_CHECK(w.initialized, "[{}] no process group: call duet::dist::init() first", op);
  return w;
}

// A world of one process: every collective is a copy.
class LocalComm final : public Comm {
 public:
  std::string name() const override { return "local"; }
  void run(const CollectiveCall& c) override {
    const size_t n = static_cast<size_t>(c.count) * static_cast<size_t>(itemsize(c.dtype));
    if (n == 0 || c.src == c.dst) return;
    if (c.device.is_cpu()) {
      std::memcpy(c.dst, c.src, n);
      return;
    }
    const DeviceBackend* b = duet::detail::device_backend(c.device.type);
    DUET_CHECK_DEVICE(b, "[{}] no backend for {} in this build", c.name, c.device);
    b->copy(c.dst, c.device, c.src, c.device, n);
  }
  void barrier() override {}
};

// An integer from the environment, or `fallback` when unset; a value that is not a
// non-negative integer is an error naming the variable.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  DUET_CHECK_VALUE(*end == 0 && x >= 0 && x < (1L << 30),
                   "[dist.init] the environment variable {}={} is not a non-negative integer", name,
                   v);
  return static_cast<int>(x);
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void finalize_at_exit() { finalize(); }

// Sends or receives exactly n bytes before the deadline; false on a closed peer or timeout.
bool io_all(int fd, char* p, size_t n, bool send_side,
            std::chrono::steady_clock::time_point deadline) {
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, static_cast<short>(send_side ? POLLOUT : POLLIN), 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) return false;
    if (r <= 0) continue;
    const ssize_t k = send_side ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k <= 0) {
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool is_collective(OpId op) {
  return op == OpId::AllReduce || op == OpId::Broadcast || op == OpId::AllGather ||
         op == OpId::ReduceScatter || op == OpId::CollectiveWait;
}

std::atomic<int> g_started{0};
std::atomic<int64_t> g_blocked_ns{0};

void progress() {
  World& w = world();
  for (auto& c : w.comm)
    if (c) c->progress();
}

const InitOptions& options() { return world().opts; }

Comm& comm_for(Device device, const char* op) {
  World& w = initialized_world(op);
  const int t = static_cast<int>(device.type);
  DUET_CHECK_DEVICE(w.comm[t], "[{}] no transport for {} tensors: {}", op, device, w.why[t]);
  return *w.comm[t];
}

void describe_call(const CollectiveCall& c, int64_t seq, int64_t* d) {
  std::fill(d, d + kCallDescLen, 0);
  d[0] = static_cast<int64_t>(c.op);
  d[1] = static_cast<int64_t>(c.dtype);
  d[2] = static_cast<int64_t>(c.reduce);
  d[3] = c.root;
  d[4] = c.count;
  d[5] = c.shape.size();
  for (int64_t i = 0; i < c.shape.size() && i < 6; ++i) d[6 + i] = c.shape[i];
  d[12] = seq;
}

void describe_barrier(int64_t seq, int64_t* d) {
  std::fill(d, d + kCallDescLen, 0);
  d[0] = kBarrierDesc;
  d[12] = seq;
}

uint64_t fingerprint(const int64_t* d) {
  // FNV-1a over the bytes, then a final mix (splitmix64's) so that near descriptions spread.
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < kCallDescLen; ++i) {
    const auto v = static_cast<uint64_t>(d[i]);
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::string call_str(const int64_t* d) {
  if (d[0] == kBarrierDesc) return "barrier()";
  std::string shape = "(";
  const int64_t nd = d[5];
  for (int64_t i = 0; i < nd && i < 6; ++i) shape += fmt::format("{}{}", i ? ", " : "", d[6 + i]);
  if (nd > 6) shape += ", ...";
  shape += nd == 1 ? ",)" : ")";
  const auto op = static_cast<OpId>(d[0]);
  const char* reduce = d[2] == static_cast<int64_t>(ReduceOp::Max)    ? "max"
                       : d[2] == static_cast<int64_t>(ReduceOp::Mean) ? "mean"
                                                                      : "sum";
  return fmt::format(
      "{}({} {}{}{})", op_name(op), dtype_name(static_cast<DType>(d[1])), shape,
      op == OpId::Broadcast ? fmt::format(", root {}", d[3]) : "",
      op == OpId::AllReduce || op == OpId::ReduceScatter ? fmt::format(", {}", reduce) : "");
}

namespace {
std::string call_str_seq(const int64_t* d) {
  return d[12] > 0 ? fmt::format("{} as its collective #{}", call_str(d), d[12]) : call_str(d);
}
}  // namespace

void check_descriptions(const char* op, const int64_t* mine, int rank, int world,
                        const int64_t* all) {
  std::string diff;
  for (int r = 0; r < world; ++r) {
    const int64_t* d = all + static_cast<ptrdiff_t>(kCallDescLen) * r;
    if (!std::equal(d, d + kCallDescLen, mine))
      diff += fmt::format("; rank {} calls {}", r, call_str_seq(d));
  }
  if (!diff.empty())
    throw DistError(fmt::format(
        "[{}] the ranks disagree: rank {} calls {}{} (every rank must call the same collectives "
        "in the same order, with the same shapes and dtypes)",
        op, rank, call_str_seq(mine), diff));
}

void tcp_broadcast(std::string& bytes, int rank, int world, const std::string& addr, int port,
                   double timeout_s) {
  if (world <= 1) return;
  using clock = std::chrono::steady_clock;
  const auto deadline =
      clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const std::string where = fmt::format("{}:{}", addr, port);
  const uint64_t n = bytes.size();
  if (rank == 0) {
    Fd listener;
    listener.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    DUET_CHECK(listener.fd >= 0, "[dist.init] socket(): {}", std::strerror(errno));
    const int one = 1;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    DUET_CHECK(::bind(listener.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0,
               "[dist.init] rank 0 cannot listen on port {} (MASTER_PORT): {}", port,
               std::strerror(errno));
    DUET_CHECK(::listen(listener.fd, world) == 0, "[dist.init] listen(): {}", std::strerror(errno));
    std::vector<bool> seen(static_cast<size_t>(world), false);
    for (int joined = 1; joined < world;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0) {
        std::string missing;
        for (int r = 1; r < world; ++r)
          if (!seen[static_cast<size_t>(r)])
            missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
        throw DistError(
            fmt::format("[dist.init] timed out after {} s at the rendezvous {} waiting for rank {}",
                        timeout_s, where, missing));
      }
      pollfd pfd{listener.fd, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
      Fd peer;
      peer.fd = ::accept(listener.fd, nullptr, nullptr);
      if (peer.fd < 0) continue;
      int32_t r = -1;
      uint64_t their_n = 0;
      if (!io_all(peer.fd, reinterpret_cast<char*>(&r), sizeof r, false, deadline) ||
          !io_all(peer.fd, reinterpret_cast<char*>(&their_n), sizeof their_n, false, deadline))
        continue;
      DUET_CHECK_VALUE(r > 0 && r < world && !seen[static_cast<size_t>(r)] && their_n == n,
                       "[dist.init] the rendezvous {} got a bad or repeated rank {} (world {}), "
                       "or another message size ({} bytes, expected {})",
                       where, r, world, their_n, n);
      DUET_CHECK(io_all(peer.fd, bytes.data(), n, true, deadline),
                 "[dist.init] rank {} left the rendezvous {} before it got the id", r, where);
      seen[static_cast<size_t>(r)] = true;
      ++joined;
    }
    return;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port_s = std::to_string(port);
  const int gai = ::getaddrinfo(addr.c_str(), port_s.c_str(), &hints, &res);
  DUET_CHECK_VALUE(gai == 0, "[dist.init] MASTER_ADDR {} does not resolve: {}", addr,
                   ::gai_strerror(gai));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  while (true) {
    Fd s;
    s.fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    DUET_CHECK(s.fd >= 0, "[dist.init] socket(): {}", std::strerror(errno));
    if (::connect(s.fd, res->ai_addr, res->ai_addrlen) == 0) {
      const int32_t r = rank;
      DUET_CHECK(io_all(s.fd, const_cast<char*>(reinterpret_cast<const char*>(&r)), sizeof r, true,
                        deadline) &&
                     io_all(s.fd, const_cast<char*>(reinterpret_cast<const char*>(&n)), sizeof n,
                            true, deadline) &&
                     io_all(s.fd, bytes.data(), n, false, deadline),
                 "[dist.init] rank {} lost the rendezvous {} before it got the id", rank, where);
      return;
    }
    if (clock::now() >= deadline)
      throw DistError(
          fmt::format("[dist.init] timed out after {} s connecting to rank 0 at the rendezvous {} "
                      "(MASTER_ADDR:MASTER_PORT)",
                      timeout_s, where));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace detail

using detail::world;

void init(const InitOptions& options) {
  detail::World& w = world();
  std::lock_guard<std::mutex> lock(w.m);
  DUET_CHECK_VALUE(options.timeout_s > 0, "[dist.init] timeout_s must be positive, got {}",
                   options.timeout_s);
  if (w.initialized) {
    w.opts = options;
    return;
  }
  w.opts = options;
  const int t_cpu = static_cast<int>(DeviceType::CPU), t_cuda = static_cast<int>(DeviceType::CUDA);
  std::string why;
  if (!detail::env_str("OMPI_COMM_WORLD_SIZE").empty()) {
    w.launcher = "mpirun";
    w.rank = detail::env_int("OMPI_COMM_WORLD_RANK", 0);
    w.size = detail::env_int("OMPI_COMM_WORLD_SIZE", 1);
    w.local = detail::env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.comm[t_cpu] = detail::make_mpi_comm(&why);
    DUET_CHECK(w.comm[t_cpu],
               "[dist.init] launched by mpirun (rank {} of {}), but MPI is not usable: {}", w.rank,
               w.size, why);
  } else if (!detail::env_str("WORLD_SIZE").empty()) {
    w.launcher = "env";
    w.size = detail::env_int("WORLD_SIZE", 1);
    w.rank = detail::env_int("RANK", 0);
    w.local = detail::env_int("LOCAL_RANK", w.rank);
    DUET_CHECK_VALUE(w.size >= 1 && w.rank < w.size,
                     "[dist.init] RANK={} is not below WORLD_SIZE={}", w.rank, w.size);
    if (w.size == 1) {
      w.comm[t_cpu] = std::make_unique<detail::LocalComm>();
    } else {
      DUET_CHECK_VALUE(
          !detail::env_str("MASTER_ADDR").empty() && !detail::env_str("MASTER_PORT").empty(),
          "[dist.init] WORLD_SIZE={} needs MASTER_ADDR and MASTER_PORT (rank 0's "
          "address and a free port) for the rendezvous",
          w.size);
      w.why[t_cpu] = fmt::format(
          "CPU collectives in a world of {} processes need MPI: launch with mpirun (this "
          "process was started by RANK/WORLD_SIZE from the environment)",
          w.size);
    }
  } else {
    w.launcher = "single";
    w.comm[t_cpu] = std::make_unique<detail::LocalComm>();
  }
  w.comm[t_cuda] = detail::make_nccl_comm(&why);
  if (!w.comm[t_cuda]) {
    if (w.size == 1 && duet::detail::device_backend(DeviceType::CUDA))
      w.comm[t_cuda] = std::make_unique<detail::LocalComm>();
    else
      w.why[t_cuda] = why;
  }
  w.initialized = true;
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit(detail::finalize_at_exit);
  }
}

bool is_initialized() { return world().initialized; }
int rank() { return detail::initialized_world("dist.rank").rank; }
int world_size() { return detail::initialized_world("dist.world_size").size; }
int local_rank() { return detail::initialized_world("dist.local_rank").local; }
std::string launcher() { return detail::initialized_world("dist.launcher").launcher; }

std::string backend(DeviceType device) {
  detail::World& w = detail::initialized_world("dist.backend");
  const auto& c = w.comm[static_cast<int>(device)];
  return c ? c->name() : "none";
}

void barrier() {
  detail::World& w = detail::initialized_world("barrier");
  for (auto& c : w.comm)
    if (c) {
      c->barrier();
      return;
    }
}

void finalize() {
  detail::World& w = world();
  std::lock_guard<std::mutex> lock(w.m);
  if (!w.initialized) return;
  // NCCL first: its communicators may have been set up over MPI.
  for (int t = kNumDeviceTypes - 1; t >= 0; --t)
    if (w.comm[t]) {
      try {
        w.comm[t]->finalize();
      } catch (const std::exception&) {
      }
      w.comm[t].reset();
    }
  w.initialized = false;
}

}  // namespace duet::dist
