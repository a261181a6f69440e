// ONNX external data: the tensors a model keeps in files beside it.
//
// Note [External data]: a TensorProto with data_location EXTERNAL holds no data; its
// external_data entries say where the data is: "location", a file named relative to the folder
// of the model file as its path names it (PyTorch's exporter writes every initializer to one
// file, "model.onnx.data"), "offset", the byte it starts at (default 0), and "length", how many
// bytes it takes (default: to the end of the file). read_model reads that data into the
// tensor's raw_data, so everything after it (tensor_from_proto, the importer) sees a model with
// its data inline.
//
// A model file is untrusted input: its locations are checked before anything is opened, and the
// file before anything is read.
// - A location must be a relative path with no ".." part, so that it names something inside
//   the model's folder: an absolute path or one that climbs out is refused. It is resolved
//   lexically; a symlink inside the folder is followed, as a Hugging Face cache lays models out
//   (model.onnx.data a link into its blobs/), since whoever placed it chose where it points.
// - The file is opened without blocking (a FIFO would otherwise wait for a writer) and must be
//   a regular file, by fstat on the open descriptor, so that what is checked is what is read.
// - offset and length are decimal byte counts; the range must lie inside the file and hold
//   exactly the bytes the tensor's dims and element type take. Only those bytes are read.
// - A tensor marked EXTERNAL that also has inline data, an entry duet does not know, or one
//   given twice is refused: which data is meant would be a guess. "checksum" is accepted and
//   not verified.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include "core/error.h"
#include "trace/onnx/onnx_proto.h"

namespace duet::detail::onnx_io {

namespace {

namespace fs = std::filesystem;
using onnx::TensorProto;

// Where a tensor's data is, as its external_data entries say.
struct Place {
  std::string location;
  std::optional<int64_t> offset, length;
};

// An open data file: its descriptor and size. Checked to be a regular file when opened.
class DataFile {
 public:
  DataFile(const fs::path& path, const std::string& what) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    DUET_CHECK_VALUE(fd_ >= 0, "[import_onnx] {}: cannot open its external data file {}: {}", what,
                     path.string(), std::strerror(errno));
    struct stat st {};
    const bool stated = ::fstat(fd_, &st) == 0;
    const int err = errno;
    if (!stated || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fd_ = -1;
      DUET_CHECK_VALUE(stated, "[import_onnx] {}: cannot stat its external data file {}: {}", what,
                       path.string(), std::strerror(err));
      throw ValueError(
          fmt::format("[import_onnx] {}: its external data file {} is {}, not a regular file", what,
                      path.string(), kind(st.st_mode)));
    }
    size_ = static_cast<int64_t>(st.st_size);
  }
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t size() const { return size_; }
  const fs::path& path() const { return path_; }

  // Exactly `length` bytes from `offset`, which the caller checked lie inside the file.
  std::string read(int64_t offset, int64_t length, const std::string& what) const {
    std::string buf(static_cast<size_t>(length), '\0');
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t r = ::pread(fd_, buf.data() + done, buf.size() - done,
                                static_cast<off_t>(offset + static_cast<int64_t>(done)));
      if (r < 0 && errno == EINTR) continue;
      DUET_CHECK_VALUE(r > 0,
                       "[import_onnx] {}: reading {} bytes at offset {} of its external data "
                       "file {} stopped after {}: {}",
                       what, length, offset, path_.string(), done,
                       r < 0 ? std::strerror(errno) : "the file is shorter than when opened");
      done += static_cast<size_t>(r);
    }
    return buf;
  }

 private:
  static const char* kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
  }
  fs::path path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// A byte count of an external_data entry: decimal digits only.
int64_t byte_count(const std::string& key, const std::string& v, const std::string& what) {
  int64_t x = -1;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, x);
  DUET_CHECK_VALUE(!v.empty() && ec == std::errc() && p == end && x >= 0,
                   "[import_onnx] {}: its external data {} \"{}\" is not a byte count (a "
                   "non-negative decimal integer)",
                   what, key, v);
  return x;
}

Place place_of(const TensorProto& t, const std::string& what) {
  DUET_CHECK_VALUE(!t.has_raw_data() && t.float_data_size() == 0 && t.int32_data_size() == 0 &&
                       t.string_data_size() == 0 && t.int64_data_size() == 0 &&
                       t.double_data_size() == 0 && t.uint64_data_size() == 0,
                   "[import_onnx] {}: its data_location is EXTERNAL, but it holds data inline "
                   "too: one or the other, not both",
                   what);
  Place pl;
  bool located = false;
  std::set<std::string> seen;
  for (const onnx::StringStringEntryProto& kv : t.external_data()) {
    DUET_CHECK_VALUE(seen.insert(kv.key()).second,
                     "[import_onnx] {}: its external data gives \"{}\" twice", what, kv.key());
    if (kv.key() == "location") {
      pl.location = kv.value();
      located = true;
    } else if (kv.key() == "offset") {
      pl.offset = byte_count(kv.key(), kv.value(), what);
    } else if (kv.key() == "length") {
      pl.length = byte_count(kv.key(), kv.value(), what);
    } else {
      DUET_CHECK_VALUE(kv.key() == "checksum",
                       "[import_onnx] {}: its external data has an entry \"{}\" duet does not "
                       "know (location, offset, length, checksum)",
                       what, kv.key());
    }
  }
  DUET_CHECK_VALUE(located && !pl.location.empty(),
                   "[import_onnx] {}: its data_location is EXTERNAL, but its external data "
                   "names no file (no \"location\" entry, or an empty one)",
                   what);
  return pl;
}

// The file a location names in the model's folder; a ValueError when it is not inside it.
fs::path resolve(const std::string& location, const fs::path& folder, const std::string& what) {
  DUET_CHECK_VALUE(location.find('\0') == std::string::npos,
                   "[import_onnx] {}: its external data location holds a NUL byte", what);
  const fs::path rel(location);
  DUET_CHECK_VALUE(!rel.has_root_path(),
                   "[import_onnx] {}: its external data location \"{}\" is an absolute path; "
                   "duet reads external data only from files in the model's folder {}",
                   what, location, folder.string());
  for (const fs::path& part : rel)
    DUET_CHECK_VALUE(part != "..",
                     "[import_onnx] {}: its external data location \"{}\" leaves the model's "
                     "folder {} (a \"..\" part); duet reads external data only from files in it",
                     what, location, folder.string());
  return folder / rel;
}

struct Loader {
  fs::path folder;
  std::string model;
  // The file the last tensor read from, kept open for the next: exporters put every tensor in
  // one file, or each in its own (so one open file at a time, however many there are).
  std::unique_ptr<DataFile> file;

  // Reads t's data when it is external; name() names t in errors.
  template <class Name>
  void load(TensorProto& t, const Name& name) {
    if (t.data_location() != TensorProto::EXTERNAL) return;
    const std::string what = fmt::format("{} of model {}", name(), model);
    const Place pl = place_of(t, what);
    const fs::path path = resolve(pl.location, folder, what);
    const int64_t bytes = data_bytes(t, what);
    if (!file || file->path() != path) {
      file.reset();
      file = std::make_unique<DataFile>(path, what);
    }
    const DataFile& f = *file;
    const int64_t offset = pl.offset.value_or(0);
    DUET_CHECK_VALUE(offset <= f.size(),
                     "[import_onnx] {}: its external data offset {} is past the end of {} ({} "
                     "bytes)",
                     what, offset, path.string(), f.size());
    const int64_t length = pl.length.value_or(f.size() - offset);
    DUET_CHECK_VALUE(length <= f.size() - offset,
                     "[import_onnx] {}: its external data ({} bytes at offset {}) runs past the "
                     "end of {} ({} bytes)",
                     what, length, offset, path.string(), f.size());
    DUET_CHECK_VALUE(length == bytes,
                     "[import_onnx] {}: its external data is {} bytes (at offset {} of {}), but "
                     "its dims ({}) of {} take {}",
                     what, length, offset, path.string(), fmt::join(t.dims(), ", "),
                     elem_type_name(t.data_type()), bytes);
    t.set_raw_data(f.read(offset, length, what));
    t.clear_external_data();
    t.set_data_location(TensorProto::DEFAULT);
  }

  void graph(onnx::GraphProto& g) {
    for (TensorProto& t : *g.mutable_initializer())
      load(t, [&] { return fmt::format("initializer \"{}\"", t.name()); });
    for (onnx::NodeProto& n : *g.mutable_node())
      for (onnx::AttributeProto& a : *n.mutable_attribute()) {
        auto what = [&] {
          return fmt::format("attribute {} of node \"{}\" ({})", a.name(),
                             n.name().empty() && n.output_size() ? n.output(0) : n.name(),
                             n.op_type());
        };
        if (a.has_t()) load(*a.mutable_t(), what);
        for (TensorProto& t : *a.mutable_tensors()) load(t, what);
        if (a.has_g()) graph(*a.mutable_g());
        for (onnx::GraphProto& sub : *a.mutable_graphs()) graph(sub);
      }
  }
};

}  // namespace

void load_external_data(onnx::ModelProto& m, const std::string& model) {
  Loader l;
  l.folder = fs::path(model).parent_path();
  if (l.folder.empty()) l.folder = ".";
  l.model = model;
  l.graph(*m.mutable_graph());
}

}  // namespace duet::detail::onnx_io
