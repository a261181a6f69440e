// The MPI transport of CPU collectives (core/dist.h). Built where CMake finds MPI; a process
// launched by mpirun initialises MPI in dist::init().
//
// Note [Collective deadlines]
// MPI's blocking collectives wait forever for a rank that never comes. So every collective is
// posted non-blocking (MPI_Iallreduce, ...) and polled against InitOptions::timeout_s. To say
// *which* rank is missing, each rank also posts a one-integer "arrived at collective #k"
// message to every other rank on a second communicator: when the deadline passes, the ranks
// whose message has not come are the ones named. A timed-out collective cannot be cancelled
// (MPI has no cancel for collectives), so the transport is broken from then on: later
// collectives and finalize() refuse, and the process should exit.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dist.h"
#include "core/error.h"

namespace duet::dist::detail {
namespace {

MPI_Datatype mpi_type(DType t, bool reduce, const char* op) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::b8:
      return MPI_UINT8_T;
    case DType::f16:
    case DType::bf16:
      DUET_CHECK_DTYPE(!reduce,
                       "[{}] MPI has no {} arithmetic: cast the tensor to f32 for a CPU "
                       "reduction",
                       op, dtype_name(t));
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

void check_mpi(int rc, const char* what, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw DistError(fmt::format("[{}] {} failed: {}", op, what, std::string(msg, len)));
}

class MpiComm;
MpiComm* g_mpi = nullptr;  // the process's MPI transport (owned by the world), for NCCL's id

class MpiComm final : public Comm {
 public:
  explicit MpiComm(bool owns) : owns_(owns) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_dup(MPI_COMM_WORLD, &arrive_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  std::string name() const override { return "mpi"; }

  void run(const CollectiveCall& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(c.name);
    if (options().check_consistency) check_consistency(c);
    const bool reduce = c.op == OpId::AllReduce || c.op == OpId::ReduceScatter;
    const MPI_Datatype t = mpi_type(c.dtype, reduce, c.name);
    const MPI_Op mop = c.reduce == ReduceOp::Max ? MPI_MAX : MPI_SUM;
    const int n = static_cast<int>(c.count);
    DUET_CHECK_VALUE(c.count <= INT32_MAX, "[{}] {} elements per rank is more than MPI's int count",
                     c.name, c.count);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    switch (c.op) {
      case OpId::AllReduce:
        rc = MPI_Iallreduce(c.src, c.dst, n, t, mop, comm_, &req);
        break;
      case OpId::Broadcast:
        if (rank_ == c.root && c.dst != c.src)
          std::memcpy(c.dst, c.src, static_cast<size_t>(c.count) * itemsize(c.dtype));
        rc = MPI_Ibcast(c.dst, n, t, c.root, comm_, &req);
        break;
      case OpId::AllGather:
        rc = MPI_Iallgather(c.src, n, t, c.dst, n, t, comm_, &req);
        break;
      case OpId::ReduceScatter:
        rc = MPI_Ireduce_scatter_block(c.src, c.dst, n, t, mop, comm_, &req);
        break;
      default:
        DUET_ASSERT(false, "{} is not a collective", op_name(c.op));
    }
    check_mpi(rc, "posting the collective", c.name);
    wait(req, c.name);
  }

  // An all-reduce in place in c.dst, posted and left in flight (Note [Overlapped collectives]).
  void start(const CollectiveCall& c) override {
    if (c.op != OpId::AllReduce) return run(c);
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(c.name);
    if (options().check_consistency) check_consistency(c);
    const MPI_Datatype t = mpi_type(c.dtype, true, c.name);
    DUET_CHECK_VALUE(c.count <= INT32_MAX, "[{}] {} elements per rank is more than MPI's int count",
                     c.name, c.count);
    if (c.dst != c.src) std::memcpy(c.dst, c.src, static_cast<size_t>(c.count) * itemsize(c.dtype));
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, c.dst, static_cast<int>(c.count), t,
                             c.reduce == ReduceOp::Max ? MPI_MAX : MPI_SUM, comm_, &req),
              "posting the collective", c.name);
    in_flight_[c.dst] = post_arrivals(req, c.name);
    g_started.fetch_add(1, std::memory_order_relaxed);
  }

  void wait(const void* dst, const char* op) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(dst);
    if (it == in_flight_.end()) return;
    std::unique_ptr<InFlight> f = std::move(it->second);
    in_flight_.erase(it);
    g_started.fetch_sub(1, std::memory_order_relaxed);
    check_usable(op);
    wait_for(*f);
  }

  void progress() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || !broken_.empty()) return;
    for (auto& [dst, f] : in_flight_) {
      int done = 0;
      MPI_Testall(static_cast<int>(f->reqs.size()), f->reqs.data(), &done, MPI_STATUSES_IGNORE);
    }
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("barrier");
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", "barrier");
    wait(req, "barrier");
  }

  void finalize() override {
    std::lock_guard<std::mutex> lock(mu_);
    g_mpi = nullptr;
    // A timed-out or never-waited collective is still posted: MPI_Finalize would hang.
    if (!broken_.empty() || !in_flight_.empty()) return;
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&arrive_);
    int done = 0;
    MPI_Finalized(&done);
    if (owns_ && !done) MPI_Finalize();
  }

  // Rank 0's bytes on every rank (NCCL's unique id).
  void broadcast_bytes(std::string& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("dist.init");
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, comm_, &req),
              "MPI_Ibcast", "dist.init");
    wait(req, "dist.init");
  }

 private:
  void check_usable(const char* op) const {
    DUET_CHECK_T(broken_.empty(), DistError,
                 "[{}] the process group is unusable after an earlier failure ({}): exit this "
                 "process",
                 op, broken_);
  }

  // One posted collective and its arrival messages (Note [Collective deadlines]); kept at one
  // address while MPI writes into it.
  struct InFlight {
    std::vector<MPI_Request> reqs;  // [0] the collective, then per peer: a receive, a send
    std::vector<int> peers;
    std::vector<int> got;
    int me = 0;
    const char* op = "";
  };

  std::unique_ptr<InFlight> post_arrivals(MPI_Request req, const char* op) {
    auto f = std::make_unique<InFlight>();
    const int tag = static_cast<int>(seq_++ % 32768);
    f->op = op;
    f->me = rank_;
    f->reqs.push_back(req);
    f->got.assign(static_cast<size_t>(size_), 0);
    f->reqs.reserve(1 + 2 * static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      f->peers.push_back(r);
      f->reqs.emplace_back();
      MPI_Irecv(&f->got[static_cast<size_t>(r)], 1, MPI_INT, r, tag, arrive_, &f->reqs.back());
      f->reqs.emplace_back();
      MPI_Isend(&f->me, 1, MPI_INT, r, tag, arrive_, &f->reqs.back());
    }
    return f;
  }

  // Waits for `req` and this collective's arrival messages, or throws at the deadline
  // (Note [Collective deadlines]).
  void wait(MPI_Request req, const char* op) { wait_for(*post_arrivals(req, op)); }

  void wait_for(InFlight& f) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline =
        start + std::chrono::microseconds(static_cast<int64_t>(options().timeout_s * 1e6));
    int done = 0;
    for (int spins = 0;; ++spins) {
      check_mpi(
          MPI_Testall(static_cast<int>(f.reqs.size()), f.reqs.data(), &done, MPI_STATUSES_IGNORE),
          "waiting for the collective", f.op);
      if (done) {
        g_blocked_ns.fetch_add(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - start).count(),
            std::memory_order_relaxed);
        return;
      }
      if (clock::now() >= deadline) break;
      // Spin briefly (small collectives finish in microseconds), then sleep a little.
      if (spins > 100)
        std::this_thread::sleep_for(std::chrono::microseconds(spins > 2000 ? 200 : 20));
    }
    std::string missing;
    for (size_t k = 0; k < f.peers.size(); ++k) {
      int arrived = 0;
      if (f.reqs[1 + 2 * k] == MPI_REQUEST_NULL)
        arrived = 1;
      else
        MPI_Test(&f.reqs[1 + 2 * k], &arrived, MPI_STATUS_IGNORE);
      if (!arrived) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", f.peers[k]);
    }
    const std::string what =
        missing.empty()
            ? fmt::format(
                  "[{}] timed out after {:g} s: every rank arrived, but the transport did "
                  "not finish",
                  f.op, options().timeout_s)
            : fmt::format("[{}] timed out after {:g} s waiting for rank {}", f.op,
                          options().timeout_s, missing);
    broken_ = what;
    throw DistError(what);
  }

  // Gathers every rank's description of this call and compares (InitOptions::check_consistency).
  void check_consistency(const CollectiveCall& c) {
    int64_t mine[kCallDescLen];
    describe_call(c, mine);
    std::vector<int64_t> all(static_cast<size_t>(kCallDescLen * size_));
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(mine, kCallDescLen, MPI_INT64_T, all.data(), kCallDescLen, MPI_INT64_T,
                             comm_, &req),
              "the consistency check", c.name);
    wait(req, c.name);
    check_descriptions(c.name, mine, rank_, size_, all.data());
  }

  bool owns_;
  MPI_Comm comm_ = MPI_COMM_NULL, arrive_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  uint64_t seq_ = 0;
  std::map<const void*, std::unique_ptr<InFlight>> in_flight_;
  std::string broken_;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(std::string* why) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      *why = "MPI_Init_thread failed";
      return nullptr;
    }
  }
  // Errors come back as codes (check_mpi), not as an abort of the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  auto c = std::make_unique<MpiComm>(!inited);
  g_mpi = c.get();
  return c;
}

bool mpi_broadcast_bytes(std::string& bytes) {
  if (!g_mpi) return false;
  g_mpi->broadcast_bytes(bytes);
  return true;
}

}  // namespace duet::dist::detail
