// The transports a build lacks (core/dist.h): CMake compiles this file with DUET_WITH_MPI and
// DUET_WITH_NCCL set to what it found, and kernels/dist_mpi.cpp or cuda/nccl.cpp define the rest.
#include "core/dist.h"

namespace duet::dist::detail {

#if !DUET_WITH_MPI
std::unique_ptr<Comm> make_mpi_comm(std::string* why) {
  *why = "this build of duet has no MPI (CMake did not find it: install libopenmpi-dev)";
  return nullptr;
}
bool mpi_broadcast_bytes(std::string&) { return false; }
#endif

#if !DUET_WITH_NCCL
std::unique_ptr<Comm> make_nccl_comm(std::string* why) {
  *why = "this build of duet has no NCCL (it needs the CUDA backend and the toolkit's NCCL)";
  return nullptr;
}
#endif

}  // namespace duet::dist::detail
