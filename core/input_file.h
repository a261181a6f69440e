// duet: reading a file a user names (a saved program, a .npy file).
//
// Note [Reading user files]
// A reader opens the path without blocking and refuses anything that is not a regular file: a
// device (/dev/zero, /dev/urandom) never ends, so reading it whole grows until memory runs out,
// and opening a FIFO for reading blocks until a writer comes, which may be never. The size is
// taken when the file is opened, and nothing past it is ever read. The readers read the magic
// and header first, and refuse a foreign file from them alone; read_npy then reads exactly the
// bytes its header declares, once they are checked against that size. (nn/module.cpp's state
// dict reader and nn/data.cpp's IDX reader follow the same rule.)
#pragma once

#include <cstddef>
#include <string>

namespace duet::detail {

/// A regular file open for reading (Note [Reading user files]).
class InputFile {
 public:
  /// Opens `path`. `op` names the reader in messages ("load", "read_npy") and `kind` what the
  /// file should be ("a duet program file"). A path that cannot be opened, a directory, a
  /// device, a pipe or a socket raises a ValueError naming the path; nothing blocks.
  InputFile(const std::string& path, std::string op, std::string kind);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// The file's size when it was opened: the most that is ever read.
  size_t size() const { return size_; }
  /// What is left of size() to read.
  size_t left() const { return size_ - pos_; }
  /// The next min(n, left()) bytes. A file that shrinks while it is read raises a ValueError.
  std::string read(size_t n);

 private:
  std::string path_, op_;
  int fd_ = -1;
  size_t size_ = 0;
  size_t pos_ = 0;
};

}  // namespace duet::detail
