#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace duet::detail {

InputFile::InputFile(const std::string& path, std::string op, std::string kind)
    : path_(path), op_(std::move(op)) {
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  DUET_CHECK_VALUE(fd_ >= 0, "[{}] cannot open {}: {}", op_, path, std::strerror(errno));
  struct stat st;
  const bool ok = ::fstat(fd_, &st) == 0;
  const int err = errno;
  const char* what = !ok                   ? nullptr
                     : S_ISDIR(st.st_mode) ? "a directory"
                     : S_ISREG(st.st_mode) ? nullptr
                                           : "not a regular file (a device, pipe or socket)";
  if (!ok || what) {
    ::close(fd_);
    fd_ = -1;
    DUET_CHECK_VALUE(ok, "[{}] cannot read {}: {}", op_, path, std::strerror(err));
    DUET_CHECK_VALUE(false, "[{}] cannot read {}: it is {}, expected {}", op_, path, what, kind);
  }
  size_ = static_cast<size_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::read(size_t n) {
  n = std::min(n, left());
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, out.data() + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    DUET_CHECK_VALUE(r >= 0, "[{}] cannot read {}: {}", op_, path_, std::strerror(errno));
    DUET_CHECK_VALUE(r > 0, "[{}] {} is truncated: it shrank to {} bytes while it was read", op_,
                     path_, pos_ + got);
    got += static_cast<size_t>(r);
  }
  pos_ += n;
  return out;
}

}  // namespace duet::detail
