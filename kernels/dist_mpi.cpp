// The MPI transport of CPU collectives (core/dist.h). Built where CMake finds MPI; a process
// launched by mpirun initialises MPI in dist::init().
//
// Note [Collective deadlines]
// MPI's blocking collectives wait forever for a rank that never comes. So every collective is
// posted non-blocking (MPI_Iallreduce, ...) and polled against InitOptions::timeout_s. To say
// *which* rank is missing, each rank also posts a one-integer "arrived at collective #k"
// message to every other rank on a second communicator, with the collective's fingerprint
// exchange (below): when the deadline passes, the ranks whose message has not come are the ones
// named. A timed-out collective cannot be cancelled (MPI has no cancel for collectives), so the
// transport is broken from then on: later collectives and finalize() refuse, and the process
// should exit. The wait backs off as it goes (spins, then sleeps of 20 us, 200 us, and 5 ms
// after a second), so that a rank waiting for a slow peer does not burn a core.
//
// Note [Departed ranks]
// A rank that ends (dist::finalize(), which also runs at exit) tells every other rank, on a
// third communicator, how many collectives it made and which was the last. Each rank keeps a
// receive for that message posted from the start, and a waiting collective looks at it while it
// waits: a rank that waits for a peer that has left throws at once, "[all_reduce] rank 1 has
// left (dist::finalize) after 26 collectives, the last all_reduce(f32 (4, 3), sum); this rank
// waits in its collective #27, all_reduce(f32 (4, 3), sum)", instead of waiting out timeout_s.
// That is also how a rank that skipped one of a run of identical collectives shows: the calls
// pair up one off (nothing in them differs), and the rank with one more is told at the end. A
// rank that dies without finalize() (a crash, a signal, _exit) is seen when it shares this
// machine (and process namespace): at start the ranks exchange their host, namespace and process
// id, and a waiting rank looks every 100 ms whether such a peer's process still runs; one that
// is gone (or a zombie) on two looks in a row, and has not said goodbye, is reported as died.
// mpirun also ends the job when one of its processes ends without finalize().
//
// Note [Collective fingerprints]
// Every collective (barrier() and NCCL's id included) first all-reduces a fingerprint of its
// call: the hash h of its description (op, dtype, reduction, root, count, shape and sequence
// number; core/dist.h), sent as the pair (h, ~h) under MPI_MAX, so that every rank gets the
// largest h and the complement of the smallest in one 16-byte all-reduce. They are equal on every
// rank or on none; where they differ, every rank all-gathers the whole descriptions and throws
// the same DistError naming each rank's call, before any data has moved, and the group stays
// usable. Only then are the data posted, so two different calls never pair up inside MPI (where
// mismatched counts and operations are undefined: a wrong sum on one rank, MPI_ERR_IN_STATUS on
// the other). A barrier is the fingerprint exchange alone. The check costs one small all-reduce
// per collective, on every call; InitOptions::check_consistency does not change it.
#include <mpi.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
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
    case DType::u8:
      return MPI_UINT8_T;
    case DType::i8:
      return MPI_INT8_T;
    case DType::i16:
      return MPI_INT16_T;
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

using Desc = std::array<int64_t, kCallDescLen>;

class MpiComm final : public Comm {
 public:
  explicit MpiComm(bool owns) : owns_(owns) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_dup(MPI_COMM_WORLD, &arrive_);
    MPI_Comm_dup(MPI_COMM_WORLD, &bye_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Note [Departed ranks]: who runs where, then one receive per peer, posted for the whole run.
    const Identity me = identity();
    ids_.resize(static_cast<size_t>(size_));
    MPI_Allgather(&me, 3, MPI_INT64_T, ids_.data(), 3, MPI_INT64_T, bye_);
    bye_in_.resize(static_cast<size_t>(size_));
    bye_req_.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    left_.assign(static_cast<size_t>(size_), 0);
    gone_looks_.assign(static_cast<size_t>(size_), 0);
    for (int r = 0; r < size_; ++r)
      if (r != rank_)
        MPI_Irecv(bye_in_[static_cast<size_t>(r)].data(), kByeLen, MPI_INT64_T, r, 0, bye_,
                  &bye_req_[static_cast<size_t>(r)]);
  }
  std::string name() const override { return "mpi"; }

  void run(const CollectiveCall& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(c.name);
    const Desc desc = agree(c);
    const bool reduce = c.op == OpId::AllReduce || c.op == OpId::ReduceScatter;
    const MPI_Datatype t = mpi_type(c.dtype, reduce, c.name);
    const MPI_Op mop = c.reduce == ReduceOp::Max ? MPI_MAX : MPI_SUM;
    const int n = static_cast<int>(c.count);
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
    wait_for(in_flight(req, c.name, desc));
  }

  // An all-reduce in place in c.dst, posted and left in flight (Note [Overlapped collectives]).
  void start(const CollectiveCall& c) override {
    if (c.op != OpId::AllReduce) return run(c);
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(c.name);
    const Desc desc = agree(c);
    const MPI_Datatype t = mpi_type(c.dtype, true, c.name);
    if (c.dst != c.src) std::memcpy(c.dst, c.src, static_cast<size_t>(c.count) * itemsize(c.dtype));
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, c.dst, static_cast<int>(c.count), t,
                             c.reduce == ReduceOp::Max ? MPI_MAX : MPI_SUM, comm_, &req),
              "posting the collective", c.name);
    in_flight_[c.dst] = in_flight(req, c.name, desc);
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
    wait_for(std::move(f));
  }

  void progress() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || !broken_.empty()) return;
    for (auto& [dst, f] : in_flight_) {
      int done = 0;
      MPI_Testall(static_cast<int>(f->reqs.size()), f->reqs.data(), &done, MPI_STATUSES_IGNORE);
    }
  }

  // The fingerprint exchange alone: it completes when every rank has reached it.
  void barrier() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("barrier");
    Desc desc;
    describe_barrier(++calls_, desc.data());
    agree("barrier", desc);
  }

  void finalize() override {
    std::lock_guard<std::mutex> lock(mu_);
    g_mpi = nullptr;
    say_goodbye();
    // Started collectives that nobody waited for (Note [Overlapped collectives]) complete with
    // the peers, which are finalizing too; a few seconds bound the wait. One still posted, or a
    // timed-out collective, would hang MPI_Finalize, so it is skipped, and the process says
    // why: mpirun reports such a rank as "exiting improperly", which alone names no cause.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (broken_.empty() && !in_flight_.empty()) {
      for (auto it = in_flight_.begin(); it != in_flight_.end();) {
        int done = 0;
        MPI_Testall(static_cast<int>(it->second->reqs.size()), it->second->reqs.data(), &done,
                    MPI_STATUSES_IGNORE);
        it = done ? in_flight_.erase(it) : std::next(it);
      }
      if (in_flight_.empty() || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!broken_.empty() || !in_flight_.empty()) {
      std::string why = broken_;
      for (const auto& [dst, f] : in_flight_)
        why += fmt::format("{}collective #{}, {}, started and never waited for",
                           why.empty() ? "" : "; ", f->desc[kCallDescLen - 1],
                           call_str(f->desc.data()));
      fmt::print(stderr, "duet: warning: [dist.finalize] rank {} leaves MPI unfinalized: {}\n",
                 rank_, why);
      return;
    }
    for (MPI_Request& r : bye_req_)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
    MPI_Comm_free(&comm_);
    MPI_Comm_free(&arrive_);
    MPI_Comm_free(&bye_);
    int done = 0;
    MPI_Finalized(&done);
    if (owns_ && !done) MPI_Finalize();
  }

  // Rank 0's bytes on every rank (NCCL's unique id): a broadcast of b8 like any other.
  void broadcast_bytes(std::string& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("dist.init");
    const auto n = static_cast<int64_t>(bytes.size());
    const CollectiveCall c{OpId::Broadcast, "dist.init", bytes.data(),  bytes.data(), n, DType::b8,
                           ReduceOp::Sum,   0,           Device::cpu(), Shape{n}};
    const Desc desc = agree(c);
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, comm_, &req), "MPI_Ibcast",
              "dist.init");
    wait_for(in_flight(req, "dist.init", desc));
  }

 private:
  // A departing rank's message: its collective count, then its last call's description.
  static constexpr int kByeLen = 1 + kCallDescLen;

  // Where a rank's process runs: a hash of the host name, the process namespace (0 where it
  // cannot be read), the process id.
  struct Identity {
    int64_t host = 0, pid_ns = 0, pid = 0;
  };
  static Identity identity() {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    int64_t desc[kCallDescLen] = {};
    std::memcpy(desc, host, std::min(sizeof desc, std::strlen(host)));
    struct stat ns {};
    return {static_cast<int64_t>(fingerprint(desc)),
            stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<int64_t>(ns.st_ino) : 0,
            static_cast<int64_t>(getpid())};
  }
  // Whether a process of this machine has ended: no such process, or a zombie.
  static bool process_gone(int64_t pid) {
    if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
    std::ifstream stat_file(fmt::format("/proc/{}/stat", pid));
    std::string line;
    std::getline(stat_file, line);
    const size_t paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() &&
           (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
  }

  void check_usable(const char* op) const {
    DUET_CHECK_T(broken_.empty(), DistError,
                 "[{}] the process group is unusable after an earlier failure ({}): exit this "
                 "process",
                 op, broken_);
  }

  // One posted collective, with its arrival messages when it is a fingerprint exchange (Note
  // [Collective deadlines]); kept at one address while MPI writes into it.
  struct InFlight {
    std::vector<MPI_Request> reqs;  // [0] the collective, then per peer: a receive, a send
    std::vector<int> peers;
    std::vector<int> got;
    int me = 0;
    const char* op = "";
    Desc desc{};
    int64_t pair[2] = {0, 0}, reduced[2] = {0, 0};  // the fingerprint exchange's buffers
  };

  std::unique_ptr<InFlight> in_flight(MPI_Request req, const char* op, const Desc& desc) {
    auto f = std::make_unique<InFlight>();
    f->op = op;
    f->desc = desc;
    f->reqs.push_back(req);
    return f;
  }

  void post_arrivals(InFlight& f) {
    const int tag = static_cast<int>(f.desc[kCallDescLen - 1] % 32768);
    f.me = rank_;
    f.got.assign(static_cast<size_t>(size_), 0);
    f.reqs.reserve(1 + 2 * static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      f.peers.push_back(r);
      f.reqs.emplace_back();
      MPI_Irecv(&f.got[static_cast<size_t>(r)], 1, MPI_INT, r, tag, arrive_, &f.reqs.back());
      f.reqs.emplace_back();
      MPI_Isend(&f.me, 1, MPI_INT, r, tag, arrive_, &f.reqs.back());
    }
  }

  Desc agree(const CollectiveCall& c) {
    DUET_CHECK_VALUE(c.count <= INT32_MAX, "[{}] {} elements per rank is more than MPI's int count",
                     c.name, c.count);
    Desc desc;
    describe_call(c, ++calls_, desc.data());
    agree(c.name, desc);
    return desc;
  }

  // The fingerprint exchange (Note [Collective fingerprints]); throws on every rank when the
  // ranks' calls differ.
  void agree(const char* op, const Desc& desc) {
    last_ = desc;
    auto f = in_flight(MPI_REQUEST_NULL, op, desc);
    const uint64_t h = fingerprint(desc.data());
    f->pair[0] = static_cast<int64_t>(h);
    f->pair[1] = static_cast<int64_t>(~h);
    check_mpi(MPI_Iallreduce(f->pair, f->reduced, 2, MPI_INT64_T, MPI_MAX, comm_, &f->reqs[0]),
              "the fingerprint exchange", op);
    post_arrivals(*f);
    InFlight& done = wait_for(std::move(f));
    if (done.reduced[0] == ~done.reduced[1]) return;
    std::vector<int64_t> all(static_cast<size_t>(kCallDescLen) * static_cast<size_t>(size_));
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(desc.data(), kCallDescLen, MPI_INT64_T, all.data(), kCallDescLen,
                             MPI_INT64_T, comm_, &req),
              "gathering the calls", op);
    wait_for(in_flight(req, op, desc));
    check_descriptions(op, desc.data(), rank_, size_, all.data());
  }

  // Waits for f's requests, or throws at the deadline (Note [Collective deadlines]) or when a
  // rank it waits for has left (Note [Departed ranks]). Returns f, which it keeps while MPI may
  // still write into it.
  InFlight& wait_for(std::unique_ptr<InFlight> owned) {
    InFlight& f = *owned;
    done_ = std::move(owned);
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
        return f;
      }
      if (spins <= 100) continue;  // small collectives finish in microseconds
      check_departed(f);
      const auto now = clock::now();
      if (now >= deadline) break;
      int64_t sleep_us = 20;
      if (spins >= 2000) sleep_us = now - start < std::chrono::seconds(1) ? 200 : 5000;
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
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
    const std::string where = fmt::format("this rank's collective #{}, {}",
                                          f.desc[kCallDescLen - 1], call_str(f.desc.data()));
    const std::string what =
        missing.empty()
            ? fmt::format(
                  "[{}] timed out after {:g} s: every rank arrived, but the transport did "
                  "not finish ({})",
                  f.op, options().timeout_s, where)
            : fmt::format("[{}] timed out after {:g} s waiting for rank {} ({})", f.op,
                          options().timeout_s, missing, where);
    fail(what);
  }

  // Note [Departed ranks]: throws when a rank has left before making the collective f waits in.
  // One that left after making it has its data on the way: the wait goes on.
  void check_departed(const InFlight& f) {
    const int64_t seq = f.desc[kCallDescLen - 1];
    for (int r = 0; r < size_; ++r) {
      const auto k = static_cast<size_t>(r);
      if (!left_[k]) {
        if (bye_req_[k] == MPI_REQUEST_NULL) continue;
        int arrived = 0;
        MPI_Test(&bye_req_[k], &arrived, MPI_STATUS_IGNORE);
        if (!arrived) continue;
        left_[k] = 1;
      }
      const auto& bye = bye_in_[k];
      if (bye[0] >= seq) continue;
      fail(fmt::format(
          "[{}] rank {} has left (dist::finalize) after {} collectives{}; this rank waits in its "
          "collective #{}, {} (every rank must call the same collectives: one skipped a "
          "collective or stopped early)",
          f.op, r, bye[0], bye[0] > 0 ? ", the last " + call_str(bye.data() + 1) : "", seq,
          call_str(f.desc.data())));
    }
    check_alive(f);
  }

  // The peers of this machine that have not said goodbye: is each one's process still there?
  void check_alive(const InFlight& f) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_look_ < std::chrono::milliseconds(100)) return;
    last_look_ = now;
    const Identity& me = ids_[static_cast<size_t>(rank_)];
    for (int r = 0; r < size_; ++r) {
      const auto k = static_cast<size_t>(r);
      const Identity& peer = ids_[k];
      if (r == rank_ || left_[k] || peer.host != me.host || peer.pid_ns != me.pid_ns ||
          me.pid_ns == 0)
        continue;
      if (!process_gone(peer.pid)) {
        gone_looks_[k] = 0;
        continue;
      }
      // Gone on one look: data it sent may still be landing; on two, it is dead.
      if (++gone_looks_[k] < 2) continue;
      fail(fmt::format(
          "[{}] rank {} (process {} on this machine) has died without dist::finalize (a crash, "
          "a signal or _exit); this rank waits in its collective #{}, {}",
          f.op, r, peer.pid, f.desc[kCallDescLen - 1], call_str(f.desc.data())));
    }
  }

  [[noreturn]] void fail(const std::string& what) {
    broken_ = what;
    // MPI may still write into the posted requests' buffers: keep them.
    if (done_) abandoned_.push_back(std::move(done_));
    throw DistError(what);
  }

  // Tells every other rank that this one leaves (Note [Departed ranks]), waiting up to a second
  // for the messages to go out; one that has not by then (its peer is gone) is cancelled.
  void say_goodbye() {
    bye_out_[0] = calls_;
    std::copy(last_.begin(), last_.end(), bye_out_.begin() + 1);
    std::vector<MPI_Request> sends(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r)
      if (r != rank_)
        MPI_Isend(bye_out_.data(), kByeLen, MPI_INT64_T, r, 0, bye_,
                  &sends[static_cast<size_t>(r)]);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (MPI_Request& send : sends) {
      int done = 0;
      while (send != MPI_REQUEST_NULL && MPI_Test(&send, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
             !done && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (!done && send != MPI_REQUEST_NULL) {
        MPI_Cancel(&send);
        MPI_Request_free(&send);
      }
    }
  }

  bool owns_;
  MPI_Comm comm_ = MPI_COMM_NULL, arrive_ = MPI_COMM_NULL, bye_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int64_t calls_ = 0;  // collectives made, the sequence number of the last
  Desc last_{};        // the last collective's description
  std::map<const void*, std::unique_ptr<InFlight>> in_flight_;
  std::unique_ptr<InFlight> done_;  // the last waited-for collective
  std::vector<std::unique_ptr<InFlight>> abandoned_;
  std::vector<std::array<int64_t, kByeLen>> bye_in_;
  std::vector<MPI_Request> bye_req_;
  std::vector<char> left_;  // the ranks whose goodbye has come
  std::vector<Identity> ids_;
  std::vector<int> gone_looks_;  // looks in a row that found a peer's process gone
  std::chrono::steady_clock::time_point last_look_{};
  std::array<int64_t, kByeLen> bye_out_{};
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
