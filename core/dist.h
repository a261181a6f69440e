// duet::dist: processes that compute together (data-parallel training), on proven transports:
// MPI for CPU tensors, NCCL for CUDA tensors. docs/distributed.md is the guide.
//
// Note [Collectives are ops]
// all_reduce, broadcast, all_gather and reduce_scatter are rows of the op table (core/ops.def),
// with shape, symbolic and gradient rules like any op, so they run eagerly, record on the tape,
// and trace into a compiled graph. Their kernel (kernels/collective.cpp) hands contiguous
// buffers to the transport of the tensor's device (detail::Comm). Every rank must call the same
// collectives in the same order, with the same shapes and dtypes: each rank traces its own code,
// so a compiled step holds its collectives in one fixed order, and the graph passes treat them as
// effects (never removed, merged, folded or reordered past one another; detail::has_effect), and
// a plan never runs two of them side by side. Every MPI collective compares a fingerprint of its
// call across ranks before it moves data, and throws on every rank when they differ (Note
// [Collective fingerprints] in kernels/dist_mpi.cpp); on NCCL, InitOptions::check_consistency
// does so (a debugging aid: the host waits for it).
//
// Note [Overlapped collectives]
// A collective normally completes inside its kernel. all_reduce_start() posts it and returns:
// its result may be read only through wait() (the CollectiveWait op), which the caller places
// as late as it can, so that the transport moves data while the caller computes. On MPI the
// kernel copies the input into the result buffer and posts the reduction in place, so only the
// result buffer is in flight (a compiled plan keeps it alive until the wait, its last reader),
// and the executor calls progress() between steps, since MPI moves data only inside its calls.
// NCCL's collectives run in stream order, so waiting there is a no-op. DistributedDataParallel
// starts each bucket's all-reduce when backward completes the bucket, and waits for them all at
// the end of backward.
//
// The gradient of a collective is a collective: all_reduce(sum) -> all_reduce(sum), all_gather
// -> reduce_scatter(sum), reduce_scatter(sum) -> all_gather, broadcast -> all_reduce(sum) kept
// on the root. So a backward also calls collectives, on every rank whose input needs a gradient:
// the ranks must agree on that too.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/call_site.h"
#include "core/op_table.h"

namespace duet::dist {

/// How all_reduce and reduce_scatter combine the ranks' values. Mean divides the sum by the
/// world size (floating dtypes only).
enum class ReduceOp : uint8_t { Sum, Mean, Max };

struct InitOptions {
  /// How long a collective (or barrier) waits for the other ranks before it throws a DistError
  /// "[all_reduce] timed out after N s waiting for rank 1". CPU collectives (MPI) honour it; a
  /// rank that has left (dist::finalize, or a dead process on the same machine) is reported at
  /// once instead (Note [Departed ranks] in kernels/dist_mpi.cpp). NCCL's run on the GPU's stream,
  /// which the host does not wait for: there it bounds the rendezvous, barrier() and, with
  /// check_consistency, each collective's check (Note [NCCL deadlines] in cuda/nccl.cpp).
  double timeout_s = 300;
  /// Before each NCCL collective, compare its op, dtype and shape across ranks and throw a
  /// DistError naming the collective and the ranks that differ (off by default: the host waits
  /// for it, so compiled plans with collectives are not captured as CUDA graphs while it is on).
  /// MPI collectives are always checked, whatever this says (Note [Collective fingerprints] in
  /// kernels/dist_mpi.cpp).
  bool check_consistency = false;
};

/// Joins the job this process was launched into, reading the launcher's environment:
/// - mpirun (Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK): MPI for CPU tensors, and
///   NCCL's id handed out over MPI;
/// - torchrun-style RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: NCCL for CUDA tensors,
///   its id handed out through a TCP rendezvous at MASTER_ADDR:MASTER_PORT; CPU collectives need
///   mpirun in a world of more than one, and say so;
/// - neither: a world of one process (collectives copy; CUDA ones still go through NCCL).
/// Calling it again with the same world is a no-op.
void init(const InitOptions& options = {});
bool is_initialized();
/// This process's rank in [0, world_size()), the number of processes, and the rank among the
/// processes on this machine (which GPU to use). Throw an Error before init().
int rank();
int world_size();
int local_rank();
/// "mpirun", "env" or "single": how init() found the world.
std::string launcher();
/// The transport of a device type's collectives: "mpi", "nccl", "local" (a world of one), or
/// "none" (with why in the error a collective would raise).
std::string backend(DeviceType device);
/// Waits until every rank has called it (within the timeout).
void barrier();
/// Ends the job's transports (also at exit). A DistError before (a timeout) leaves them
/// unusable: then this process should exit.
void finalize();

/// The collectives (Note [Collectives are ops]). Each returns a new tensor on the input's device.
/// The reduction of x over every rank's x (same shape on every rank).
Tensor all_reduce(const Tensor& x, ReduceOp op = ReduceOp::Sum, DUET_HERE);
/// Rank root's x, on every rank (same shape and dtype on every rank).
Tensor broadcast(const Tensor& x, int root = 0, DUET_HERE);
/// The ranks' x joined along dim in rank order: dim grows world_size() times.
Tensor all_gather(const Tensor& x, int64_t dim = 0, DUET_HERE);
/// The reduction over ranks of x, cut into world_size() equal parts along dim; rank r keeps
/// part r (dim must divide by the world size).
Tensor reduce_scatter(const Tensor& x, ReduceOp op = ReduceOp::Sum, int64_t dim = 0, DUET_HERE);

}  // namespace duet::dist

namespace duet::dist::detail {

/// One collective on contiguous buffers, as a transport sees it. count: elements per rank
/// (all_gather reads count and writes count * world; reduce_scatter reads count * world and
/// writes count; the others read and write count).
struct CollectiveCall {
  OpId op;
  const char* name;  ///< "all_reduce", ... for messages
  const void* src;
  void* dst;
  int64_t count;
  DType dtype;
  ReduceOp reduce;  ///< Sum or Max (Mean is a Sum, then a division)
  int root;         ///< broadcast
  Device device;
  Shape shape;  ///< the input's shape, for messages and the consistency check
};

/// A transport: MPI, NCCL, or the world of one.
class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;
  virtual void run(const CollectiveCall& call) = 0;
  /// Starts `call` and returns before it completes (Note [Overlapped collectives]); `call.dst`
  /// is then written until wait(call.dst). A transport without asynchronous collectives runs it.
  virtual void start(const CollectiveCall& call) { run(call); }
  /// Waits for the collective started with this dst (nothing when none is pending).
  virtual void wait(const void* /*dst*/, const char* /*op*/) {}
  /// Lets started collectives progress (MPI moves data only inside its calls).
  virtual void progress() {}
  virtual void barrier() = 0;
  virtual void finalize() {}
};

/// Collectives started and not yet waited for, in this process. The executor calls progress()
/// between steps while there are any.
extern std::atomic<int> g_started;
void progress();
/// Nanoseconds this process has spent blocked waiting for collectives to complete (MPI): all of
/// a collective's time when it is waited for at once, what is left of it at the wait when it was
/// started earlier. The data-parallel bench reads it to measure the overlap.
extern std::atomic<int64_t> g_blocked_ns;

/// Starts an all-reduce (sum or max) of x and returns its result at once: a tensor that only
/// wait() may read (Note [Overlapped collectives]). For code that manages the wait itself, as
/// DistributedDataParallel does.
Tensor all_reduce_start(const Tensor& x, ReduceOp op = ReduceOp::Sum);
/// The result of a started collective once it has completed (a copy of its buffer).
Tensor wait(const Tensor& started);

/// The transport of a device's collectives; throws an Error naming `op` when there is none.
Comm& comm_for(Device device, const char* op);
/// The options init() was given.
const InitOptions& options();
/// Whether op is one of the collectives, or the wait for a started one.
bool is_collective(OpId op);

/// A call as kCallDescLen integers: op (kBarrierDesc for a barrier), dtype, reduction, root,
/// count, rank of the shape, up to 6 of its dims, and the call's sequence number in its transport
/// (1 for the first collective, 0 where the transport does not count). What every rank compares
/// (Note [Collective fingerprints] in kernels/dist_mpi.cpp): a fingerprint of it on every MPI
/// collective, the whole of it with InitOptions::check_consistency on NCCL.
inline constexpr int kCallDescLen = 13;
inline constexpr int64_t kBarrierDesc = -1;
void describe_call(const CollectiveCall& c, int64_t seq, int64_t* desc);
void describe_barrier(int64_t seq, int64_t* desc);
/// A hash of a description: equal descriptions, equal fingerprints.
uint64_t fingerprint(const int64_t* desc);
/// A description in words: "all_reduce(f32 (4, 3), sum)", "barrier()".
std::string call_str(const int64_t* desc);
/// Compares what was gathered (`all`, world ranks one after another) with this rank's `mine`, and
/// throws the DistError "[all_reduce] the ranks disagree: rank 0 calls all_reduce(f32 (4, 3),
/// sum) as its collective #3; rank 1 calls all_reduce(f32 (4,), sum) as its collective #3".
void check_descriptions(const char* op, const int64_t* mine, int rank, int world,
                        const int64_t* all);

/// Rank 0 hands `bytes` to every rank through a TCP rendezvous at addr:port (rank 0 listens;
/// the others connect, retrying until timeout_s). bytes has the same size on every rank; the
/// others' contents are replaced with rank 0's. A world of one returns at once.
void tcp_broadcast(std::string& bytes, int rank, int world, const std::string& addr, int port,
                   double timeout_s);

// Transports compiled in where their libraries were found (null elsewhere, with *why set).
std::unique_ptr<Comm> make_mpi_comm(std::string* why);
std::unique_ptr<Comm> make_nccl_comm(std::string* why);
/// Under mpirun: whether MPI was built in and is running, and its broadcast of bytes from rank
/// 0 (NCCL's id). False without MPI.
bool mpi_broadcast_bytes(std::string& bytes);

}  // namespace duet::dist::detail
