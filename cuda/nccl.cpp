// The NCCL transport of CUDA collectives (core/dist.h). Built where the CUDA toolkit ships NCCL.
//
// Note [NCCL communicators]
// One communicator per CUDA device a process uses, made at that device's first collective (every
// rank reaches it at the same point of its program). Rank 0 makes NCCL's unique id and hands it
// out over MPI under mpirun, else through the TCP rendezvous at MASTER_ADDR:MASTER_PORT; a world
// of one needs neither. Collectives are enqueued on duet's stream of the device, in program
// order, so they order with duet's kernels, and a compiled step that holds them can be captured
// into a CUDA graph (NCCL supports capture since 2.9). The host cannot put a deadline on work
// it does not wait for: InitOptions::timeout_s bounds the rendezvous, barrier(), and, with
// InitOptions::check_consistency, each collective, whose check the host waits for (Note [NCCL
// deadlines]).
//
// Note [NCCL deadlines]
// Where the host waits for the stream (barrier(), the consistency check), it polls the stream
// until timeout_s. At the deadline it aborts the communicator (ncclCommAbort ends the kernels
// that wait for the missing ranks) and throws "[all_reduce] timed out after N s ...". NCCL does
// not say which rank is missing. The transport is then unusable, as MPI's is after a timeout:
// every later collective throws the same error. A collective without the check runs on the
// stream and is not waited for, so a missing rank shows as a stream that does not finish.
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dist.h"
#include "cuda/check.h"
#include "cuda/runtime.h"

namespace duet::dist::detail {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::b8:
    case DType::u8:
      return ncclUint8;
    case DType::i8:
      return ncclInt8;
    case DType::i16:
      throw DTypeError("[dist] NCCL has no 16-bit integer type: cast an i16 tensor to i32 first");
  }
  return ncclUint8;
}

void check_nccl(ncclResult_t r, const char* what, const char* op) {
  if (r == ncclSuccess) return;
  throw DistError(fmt::format("[{}] {} failed: {} ({})", op, what, ncclGetErrorString(r),
                              ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : ""));
}

class NcclComm final : public Comm {
 public:
  std::string name() const override { return "nccl"; }

  void run(const CollectiveCall& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable(c.name);
    ncclComm_t comm = get(c.device, c.name);
    cuda::detail::set_device(c.device);
    cudaStream_t s = cuda::detail::stream(c.device);
    int64_t desc[kCallDescLen];
    describe_call(c, ++calls_[c.device.index], desc);
    if (options().check_consistency) check_consistency(c.name, desc, c.device, comm, s);
    const ncclDataType_t t = nccl_type(c.dtype);
    const ncclRedOp_t op = c.reduce == ReduceOp::Max ? ncclMax : ncclSum;
    const size_t n = static_cast<size_t>(c.count);
    switch (c.op) {
      case OpId::AllReduce:
        check_nccl(ncclAllReduce(c.src, c.dst, n, t, op, comm, s), "ncclAllReduce", c.name);
        break;
      case OpId::Broadcast:
        check_nccl(ncclBroadcast(c.src, c.dst, n, t, c.root, comm, s), "ncclBroadcast", c.name);
        break;
      case OpId::AllGather:
        check_nccl(ncclAllGather(c.src, c.dst, n, t, comm, s), "ncclAllGather", c.name);
        break;
      case OpId::ReduceScatter:
        check_nccl(ncclReduceScatter(c.src, c.dst, n, t, op, comm, s), "ncclReduceScatter", c.name);
        break;
      default:
        DUET_ASSERT(false, "{} is not a collective", op_name(c.op));
    }
  }

  // An all-reduce of one element on the process's GPU, waited for; with the consistency check,
  // the check's all-gather of a barrier's description instead, so that a barrier against
  // another collective is named as one.
  void barrier() override {
    const Device d = Device::cuda(local_rank() % device_count());
    std::lock_guard<std::mutex> lock(mu_);
    check_usable("barrier");
    ncclComm_t comm = get(d, "barrier");
    cuda::detail::set_device(d);
    cudaStream_t s = cuda::detail::stream(d);
    int64_t desc[kCallDescLen];
    describe_barrier(++calls_[d.index], desc);
    if (options().check_consistency) return check_consistency("barrier", desc, d, comm, s);
    float* buf = nullptr;
    DUET_CUDA_CHECK(cudaMallocAsync(&buf, sizeof(float), s));
    DUET_CUDA_CHECK(cudaMemsetAsync(buf, 0, sizeof(float), s));
    check_nccl(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s), "ncclAllReduce",
               "barrier");
    DUET_CUDA_CHECK(cudaFreeAsync(buf, s));
    wait_stream(d, comm, s, "barrier", "");
  }

  void finalize() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [dev, comm] : comms_) ncclCommDestroy(comm);
    comms_.clear();
  }

 private:
  static int device_count() {
    int n = 0;
    DUET_CUDA_CHECK(cudaGetDeviceCount(&n));
    DUET_CHECK_DEVICE(n > 0, "[barrier] no CUDA device");
    return n;
  }

  void check_usable(const char* op) const {
    if (!broken_.empty())
      throw DistError(fmt::format("[{}] the NCCL transport is unusable after an earlier error: {}",
                                  op, broken_));
  }

  // Waits for the stream's work until the deadline (Note [NCCL deadlines]).
  void wait_stream(Device d, ncclComm_t comm, cudaStream_t s, const char* op, const char* what) {
    using clock = std::chrono::steady_clock;
    const auto deadline =
        clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options().timeout_s * 1e3));
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(s);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) DUET_CUDA_CHECK(e);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", op);
      check_nccl(async, "a collective", op);
      if (clock::now() >= deadline) {
        ncclCommAbort(comm);
        comms_.erase(d.index);
        broken_ = fmt::format(
            "[{}] timed out after {:g} s{}: a rank did not take part (NCCL does not say which)", op,
            options().timeout_s, what);
        throw DistError(broken_);
      }
      if (spins > 100)
        std::this_thread::sleep_for(std::chrono::microseconds(spins > 2000 ? 200 : 20));
    }
  }

  // Gathers every rank's description of this call through NCCL and compares them on the host
  // (InitOptions::check_consistency): the call waits for the stream, so a plan whose steps
  // call collectives is not captured into a CUDA graph while the check is on.
  void check_consistency(const char* op, const int64_t* mine, Device d, ncclComm_t comm,
                         cudaStream_t s) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    DUET_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
    if (capturing != cudaStreamCaptureStatusNone)
      throw DistError(fmt::format(
          "[{}] the consistency check waits on the host, which a CUDA graph capture cannot: "
          "turn InitOptions::check_consistency on before compiling (its plans are then not "
          "captured)",
          op));
    const int w = world_size();
    std::vector<int64_t> all(static_cast<size_t>(kCallDescLen) * w);
    const size_t one = sizeof(int64_t) * kCallDescLen;
    int64_t* buf = nullptr;
    DUET_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), one * (w + 1), s));
    DUET_CUDA_CHECK(cudaMemcpyAsync(buf, mine, one, cudaMemcpyHostToDevice, s));
    check_nccl(ncclAllGather(buf, buf + kCallDescLen, kCallDescLen, ncclInt64, comm, s),
               "ncclAllGather", op);
    DUET_CUDA_CHECK(
        cudaMemcpyAsync(all.data(), buf + kCallDescLen, one * w, cudaMemcpyDeviceToHost, s));
    DUET_CUDA_CHECK(cudaFreeAsync(buf, s));
    wait_stream(d, comm, s, op, " in the consistency check");
    check_descriptions(op, mine, rank(), w, all.data());
  }

  // The communicator of a device (Note [NCCL communicators]).
  ncclComm_t get(Device d, const char* op) {
    auto it = comms_.find(d.index);
    if (it != comms_.end()) return it->second;
    const int r = rank(), w = world_size();
    ncclUniqueId id{};
    if (r == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", op);
    std::string bytes(reinterpret_cast<const char*>(&id), sizeof id);
    if (w > 1 && !mpi_broadcast_bytes(bytes)) {
      const char* addr = std::getenv("MASTER_ADDR");
      const char* port = std::getenv("MASTER_PORT");
      DUET_CHECK_VALUE(addr && port,
                       "[{}] NCCL's rendezvous needs MASTER_ADDR and MASTER_PORT (or mpirun)", op);
      // One port per device a process uses: the id of cuda:k goes through MASTER_PORT + k.
      tcp_broadcast(bytes, r, w, addr, std::atoi(port) + d.index, options().timeout_s);
    }
    std::memcpy(&id, bytes.data(), sizeof id);
    cuda::detail::set_device(d);
    ncclComm_t comm = nullptr;
    check_nccl(ncclCommInitRank(&comm, w, id, r), "ncclCommInitRank", op);
    comms_.emplace(d.index, comm);
    return comm;
  }

  std::map<int, ncclComm_t> comms_;
  std::map<int, int64_t> calls_;  // collectives made per device, the sequence number of the last
  std::string broken_;            // why the transport is unusable (a timeout), or ""
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(std::string*) { return std::make_unique<NcclComm>(); }

}  // namespace duet::dist::detail
