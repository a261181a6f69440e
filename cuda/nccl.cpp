// The NCCL transport of CUDA collectives (core/dist.h). Built where the CUDA toolkit ships NCCL.
//
// Note [NCCL communicators]
// One communicator per CUDA device a process uses, made at that device's first collective (every
// rank reaches it at the same point of its program). Rank 0 makes NCCL's unique id and hands it
// out over MPI under mpirun, else through the TCP rendezvous at MASTER_ADDR:MASTER_PORT; a world
// of one needs neither. Collectives are enqueued on duet's stream of the device, in program
// order, so they order with duet's kernels, and a compiled step that holds them can be captured
// into a CUDA graph (NCCL supports capture since 2.9). The host cannot put a deadline on work
// that runs on the stream: InitOptions::timeout_s bounds the rendezvous, not the collectives.
#include <nccl.h>

#include <cstdlib>
#include <map>
#include <mutex>

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
      return ncclUint8;
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
    ncclComm_t comm = get(c.device, c.name);
    cuda::detail::set_device(c.device);
    cudaStream_t s = cuda::detail::stream(c.device);
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

  // An all-reduce of one element on the process's GPU, waited for.
  void barrier() override {
    const Device d = Device::cuda(local_rank() % device_count());
    float* buf = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ncclComm_t comm = get(d, "barrier");
      cuda::detail::set_device(d);
      cudaStream_t s = cuda::detail::stream(d);
      DUET_CUDA_CHECK(cudaMallocAsync(&buf, sizeof(float), s));
      DUET_CUDA_CHECK(cudaMemsetAsync(buf, 0, sizeof(float), s));
      check_nccl(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, s), "ncclAllReduce",
                 "barrier");
      DUET_CUDA_CHECK(cudaFreeAsync(buf, s));
      DUET_CUDA_CHECK(cudaStreamSynchronize(s));
    }
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
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(std::string*) { return std::make_unique<NcclComm>(); }

}  // namespace duet::dist::detail
