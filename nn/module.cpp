// duet: nn::Module's registry, traversal, placement, state dicts and the state dict file.
#include "nn/module.h"

#include "trace/tracer.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <sys/stat.h>

#include <filesystem>
#include <typeinfo>
#include <unordered_set>

#include "core/dispatch.h"
#include "core/ops.h"
#include "eager/autograd.h"

namespace duet::nn {

// See Note [Module state].
struct Module::State {
  std::string name;  // empty: the class name of the module (Module::name())
  bool training = true;
  NamedTensors parameters, buffers;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children;

  // Calls f(prefix, state) on this module and then on each descendant, depth first, with the
  // dotted prefix its names take ("", "fc1.", "block.0.").
  template <class F>
  void walk(const std::string& prefix, const F& f) const {
    f(prefix, *this);
    for (const auto& [name, child] : children) child->state_->walk(prefix + name + ".", f);
  }

  // The named parameters (or buffers) of the subtree; with `unique`, each tensor once under
  // the first name that reaches it (a module registered twice shares its tensors).
  NamedTensors collect(NamedTensors State::*which, bool unique) const {
    NamedTensors out;
    std::unordered_set<const detail::TensorImpl*> seen;
    walk("", [&](const std::string& prefix, const State& s) {
      for (const auto& [name, t] : s.*which)
        if (!unique || seen.insert(t.unsafe_impl()).second) out.emplace_back(prefix + name, t);
    });
    return out;
  }

  void set_training(bool on) {
    training = on;
    for (const auto& [name, child] : children) child->state_->set_training(on);
  }

  bool contains(const State* other) const {
    bool found = false;
    walk("", [&](const std::string&, const State& s) { found = found || &s == other; });
    return found;
  }

  // What `name` is already registered as, or null.
  const char* kind_of(const std::string& name) const {
    auto has = [&](const auto& v) {
      return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.first == name; });
    };
    return has(parameters) ? "a parameter"
           : has(buffers)  ? "a buffer"
           : has(children) ? "a module"
                           : nullptr;
  }
};

Module::Module() : state_(std::make_shared<State>()) {}

Module::Module(std::string name) : Module() { state_->name = std::move(name); }

std::string Module::name() const {
  if (!state_->name.empty()) return state_->name;
  // The dynamic class's name without namespaces: "Net" for struct Net : nn::Module.
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string full = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const size_t scope = full.rfind("::", full.find('<'));
  return scope == std::string::npos ? full : full.substr(scope + 2);
}

Tensor Module::forward(const Tensor&) {
  DUET_CHECK(false, "[nn] {} has no forward(Tensor)", name());
  return {};
}

namespace {

// `module` is only asked for its name when a check fails: the name may need demangling.
void check_name(const char* op, const Module& module, const std::string& name, const char* taken) {
  DUET_CHECK_VALUE(!name.empty(), "[{}] {}: the name must not be empty", op, module.name());
  DUET_CHECK_VALUE(name.find('.') == std::string::npos,
                   "[{}] {}: name '{}' contains '.', which separates the names of nested modules",
                   op, module.name(), name);
  DUET_CHECK_VALUE(!taken, "[{}] {}: name '{}' is already registered as {}", op, module.name(),
                   name, taken ? taken : "");
}

}  // namespace

Tensor Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  check_name("register_parameter", *this, name, state_->kind_of(name));
  DUET_CHECK(tensor.defined(), "[register_parameter] {}: parameter '{}' is an undefined tensor",
             this->name(), name);
  DUET_CHECK(tensor.is_leaf(),
             "[register_parameter] {}: parameter '{}' was computed by an op on tensors that "
             "require grad; register a leaf (detach() it)",
             this->name(), name);
  tensor.requires_grad_(requires_grad);
  state_->parameters.emplace_back(std::move(name), tensor);
  return tensor;
}

Tensor Module::register_buffer(std::string name, Tensor tensor) {
  check_name("register_buffer", *this, name, state_->kind_of(name));
  DUET_CHECK(tensor.defined(), "[register_buffer] {}: buffer '{}' is an undefined tensor",
             this->name(), name);
  state_->buffers.emplace_back(std::move(name), tensor);
  return tensor;
}

void Module::add_child(std::string name, std::shared_ptr<Module> child) {
  check_name("register_module", *this, name, state_->kind_of(name));
  DUET_CHECK(child, "[register_module] {}: module '{}' is a null pointer", this->name(), name);
  DUET_CHECK(!child->state_->contains(state_.get()),
             "[register_module] {}: registering {} as '{}' would make the module its own "
             "descendant",
             this->name(), child->name(), name);
  state_->children.emplace_back(std::move(name), std::move(child));
}

size_t Module::num_children() const { return state_->children.size(); }

Module& Module::child(size_t i) const { return *child_ptr(i); }

const std::shared_ptr<Module>& Module::child_ptr(size_t i) const {
  DUET_CHECK_VALUE(i < state_->children.size(), "[nn] {}: child {} is out of range ({} children)",
                   name(), i, state_->children.size());
  return state_->children[i].second;
}

std::shared_ptr<Module> Module::child_named(const std::string& name) const {
  for (const auto& [n, c] : state_->children)
    if (n == name) return c;
  return nullptr;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

NamedTensors Module::named_parameters() const { return state_->collect(&State::parameters, true); }

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers()) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers() const { return state_->collect(&State::buffers, true); }

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, c] : state_->children) out.push_back(c);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return state_->children;
}

void Module::train(bool on) { state_->set_training(on); }

bool Module::is_training() const {
  // A trace that reads the flag depends on it (Note [Flags a trace read] in trace/compile.cpp).
  if (detail::Tracer::current())
    detail::guard_flag(state_, &state_->training,
                       [&] { return fmt::format("module {}'s training flag", name()); });
  return state_->training;
}

namespace {

// Gives `t` the data of `src` (same shape, possibly another device or dtype) in place: the
// TensorImpl that every handle points to keeps its identity, requires_grad and .grad. The new
// storage takes a newer version than the old one, so a graph that saved `t` before the move
// refuses to backward through stale data (as after any in-place write).
void adopt(const Tensor& t, const Tensor& src) {
  detail::TensorImpl* d = t.impl();
  const detail::TensorImpl* s = src.impl();
  DUET_ASSERT(d->shape == s->shape, "adopt: shapes {} and {} differ", d->shape, s->shape);
  const uint32_t version = d->storage ? d->storage->version_.load() : 0;
  s->storage->version_.store(std::max(version + 1, s->storage->version_.load()));
  d->storage = s->storage;
  d->offset = s->offset;
  d->strides = s->strides;
  d->dtype = s->dtype;
  d->is_view = false;
  d->refresh_contiguous();
}

// Converts every tensor (and gradient) that `convert` changes, all before adopting any, so that
// a conversion that throws leaves the module as it was.
template <class F>
void convert_in_place(const std::vector<Tensor>& tensors, const F& convert) {
  NoGradGuard no_grad;
  std::vector<std::pair<Tensor, Tensor>> moves;
  auto plan = [&](const Tensor& t) {
    Tensor c = convert(t);
    if (!c.is_same(t)) moves.emplace_back(t, c);
  };
  for (const Tensor& t : tensors) {
    plan(t);
    if (Tensor g = t.grad(); g.defined()) plan(g);
  }
  for (const auto& [t, c] : moves) adopt(t, c);
}

}  // namespace

void Module::to(Device device) {
  std::vector<Tensor> all = parameters();
  for (const Tensor& b : buffers()) all.push_back(b);
  convert_in_place(all, [&](const Tensor& t) { return t.to(device); });
}

void Module::to(DType dtype) {
  DUET_CHECK_DTYPE(is_floating(dtype), "[to] {}: modules convert to floating dtypes only, got {}",
                   name(), dtype);
  std::vector<Tensor> all = parameters();
  for (const Tensor& b : buffers()) all.push_back(b);
  convert_in_place(all, [&](const Tensor& t) { return is_floating(t.dtype()) ? t.to(dtype) : t; });
}

void Module::zero_grad() {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters())
    if (Tensor g = p.grad(); g.defined()) g.zero_();
}

StateDict Module::state_dict() const {
  StateDict out;
  state_->walk("", [&](const std::string& prefix, const State& s) {
    for (const auto& [name, t] : s.parameters) out.emplace(prefix + name, t.detach());
    for (const auto& [name, t] : s.buffers) out.emplace(prefix + name, t.detach());
  });
  return out;
}

namespace {

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s;
}

// Loads `dict` into the tensors of `own` (a module's state_dict(): detached handles that share
// storage with the parameters). `what` starts the messages: "[load_state_dict] Net".
void load_into(const StateDict& own, const StateDict& dict, bool strict, const std::string& what) {
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, t] : own)
    if (!dict.count(name)) missing.push_back(name);
  for (const auto& [name, t] : dict)
    if (!own.count(name)) unexpected.push_back(name);
  if (strict && (!missing.empty() || !unexpected.empty())) {
    std::string problems;
    if (!missing.empty()) problems += "missing keys " + quoted_list(missing);
    if (!unexpected.empty())
      problems += (problems.empty() ? "" : "; ") + std::string("unexpected keys ") +
                  quoted_list(unexpected);
    DUET_CHECK(false, "{}: {}", what, problems);
  }
  for (const auto& [name, t] : own) {
    auto it = dict.find(name);
    if (it == dict.end()) continue;
    const Tensor& src = it->second;
    DUET_CHECK(src.defined(), "{}: the value for '{}' is an undefined tensor", what, name);
    DUET_CHECK_SHAPE(src.sizes() == t.sizes(),
                     "{}: shape mismatch for '{}': the state dict has {}, the module has {}", what,
                     name, src.sizes(), t.sizes());
    DUET_CHECK_DTYPE(src.dtype() == t.dtype(),
                     "{}: dtype mismatch for '{}': the state dict has {}, the module has {}", what,
                     name, src.dtype(), t.dtype());
  }
  NoGradGuard no_grad;
  for (const auto& [name, t] : own) {
    auto it = dict.find(name);
    if (it != dict.end()) Tensor(t).copy_(it->second);
  }
}

}  // namespace

void Module::load_state_dict(const StateDict& dict, bool strict) {
  load_into(state_dict(), dict, strict, "[load_state_dict] " + name());
}

void Module::save(const std::string& path) const { write_state_dict(state_dict(), path); }

void Module::load(const std::string& path) {
  const StateDict dict = read_state_dict(path);
  load_into(state_dict(), dict, true, fmt::format("[load] '{}' does not fit {}", path, name()));
}

// ---- The state dict file (Note [State dict file]) ----

namespace {

constexpr char kMagic[8] = {'D', 'U', 'E', 'T', 'D', 'I', 'C', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 8;  // magic, version, file size, entry count
constexpr uint32_t kMaxRank = 64;

// dtype codes in the file: fixed here, independent of the order of the DType enum.
constexpr std::pair<DType, uint8_t> kDTypeCodes[] = {
    {DType::f32, 1}, {DType::f64, 2}, {DType::f16, 3}, {DType::bf16, 4}, {DType::i32, 5},
    {DType::i64, 6}, {DType::b8, 7},  {DType::i8, 8},  {DType::u8, 9},   {DType::i16, 10}};

uint8_t dtype_code(DType d) {
  for (auto [dt, code] : kDTypeCodes)
    if (dt == d) return code;
  DUET_ASSERT(false, "no file code for dtype {}", d);
  return 0;
}

uLong crc_update(uLong crc, const unsigned char* p, size_t n) {
  // zlib's crc32 takes a 32-bit length: feed large buffers in chunks.
  constexpr size_t kChunk = size_t(1) << 30;
  for (size_t done = 0; done < n; done += kChunk)
    crc = crc32(crc, p + done, static_cast<uInt>(std::min(kChunk, n - done)));
  return crc;
}

void check_little_endian(const char* op) {
  DUET_CHECK(std::endian::native == std::endian::little,
             "[{}] the state dict format stores little-endian data; this host is big-endian", op);
}

// Writes bytes to a file while keeping a running CRC-32 of them.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    DUET_CHECK(f_, "[save] cannot open '{}' for writing: {}", path, std::strerror(errno));
  }
  ~FileWriter() {
    if (f_) std::fclose(f_);
  }
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    DUET_CHECK(std::fwrite(p, 1, n, f_) == n, "[save] error writing '{}': {}", path_,
               std::strerror(errno));
    crc_ = crc_update(crc_, static_cast<const unsigned char*>(p), n);
  }
  template <class T>
  void integer(T v) {  // little-endian whatever the host
    unsigned char b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i)
      b[i] = static_cast<unsigned char>(uint64_t(v) >> (8 * i));
    bytes(b, sizeof(T));
  }
  void finish() {
    integer(static_cast<uint32_t>(crc_));
    std::FILE* f = std::exchange(f_, nullptr);
    DUET_CHECK(std::fclose(f) == 0, "[save] error writing '{}': {}", path_, std::strerror(errno));
  }

 private:
  std::string path_;
  std::FILE* f_;
  uLong crc_ = crc32(0, nullptr, 0);
};

// Reads a file's bytes, bounds-checked, with messages that name the file.
class ByteReader {
 public:
  ByteReader(const std::string& path, const unsigned char* data, size_t size)
      : path_(path), data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  const unsigned char* take(size_t n, const char* what) {
    DUET_CHECK_VALUE(n <= left(), "[load] '{}' is corrupt: {} at byte {} needs {} bytes, {} left",
                     path_, what, pos_, n, left());
    const unsigned char* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  template <class T>
  T integer(const char* what) {
    const unsigned char* b = take(sizeof(T), what);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(b[i]) << (8 * i);
    return static_cast<T>(v);
  }

 private:
  const std::string& path_;
  const unsigned char* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A state dict file open for reading. Only a regular file is read, and never more than its size
// (taken when it is opened): a device (/dev/zero, /dev/urandom), a pipe or a socket would be
// read without end, or block.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);  // before opening: opening a pipe blocks
    DUET_CHECK(st.type() != fs::file_type::directory,
               "[load] cannot read '{}': it is a directory, expected a state dict file", path);
    DUET_CHECK_VALUE(ec || st.type() == fs::file_type::not_found || fs::is_regular_file(st),
                     "[load] cannot read '{}': it is not a regular file (a device, pipe or "
                     "socket), expected a state dict file",
                     path);
    f_ = std::fopen(path.c_str(), "rb");
    DUET_CHECK(f_, "[load] cannot open '{}': {}", path, std::strerror(errno));
    struct stat sb;
    DUET_CHECK(::fstat(::fileno(f_), &sb) == 0, "[load] cannot read '{}': {}", path,
               std::strerror(errno));
    DUET_CHECK_VALUE(S_ISREG(sb.st_mode),
                     "[load] cannot read '{}': it is not a regular file (a device, pipe or "
                     "socket), expected a state dict file",
                     path);
    size_ = static_cast<size_t>(sb.st_size);
  }
  ~FileReader() { std::fclose(f_); }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  /// The file's size when it was opened: the most that is ever read.
  size_t size() const { return size_; }
  /// Reads exactly n bytes (n <= what is left of size()), or throws.
  void read(unsigned char* p, size_t n) {
    DUET_ASSERT(n <= size_ - pos_, "read past the size of '{}'", path_);
    const size_t got = n ? std::fread(p, 1, n, f_) : 0;
    DUET_CHECK(!std::ferror(f_), "[load] cannot read '{}': {}", path_, std::strerror(errno));
    DUET_CHECK_VALUE(got == n, "[load] '{}' is truncated: it shrank to {} bytes while read", path_,
                     pos_ + got);
    pos_ += n;
  }

 private:
  const std::string& path_;
  std::FILE* f_ = nullptr;
  size_t size_ = 0;
  size_t pos_ = 0;
};

// The first bytes of a file, printable, for a message about a wrong magic.
std::string shown(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s += p[i] >= 32 && p[i] < 127 ? std::string(1, char(p[i])) : fmt::format("\\x{:02x}", p[i]);
  return s;
}

}  // namespace

void write_state_dict(const StateDict& dict, const std::string& path) {
  check_little_endian("save");
  NoGradGuard no_grad;
  // Contiguous CPU copies first: the header holds the file size.
  std::vector<Tensor> data;
  uint64_t size = kHeaderBytes + 4;
  for (const auto& [name, t] : dict) {
    DUET_CHECK(t.defined(), "[save] the value for '{}' is an undefined tensor", name);
    // A traced tensor (of a running trace, or one that escaped its trace) has no values.
    if (__builtin_expect(t.impl()->trace.get() != nullptr, 0))
      detail::throw_traced_use(t, "write_state_dict");
    Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
    size += 4 + name.size() + 1 + 4 + 8 * c.dim() + c.numel() * itemsize(c.dtype());
    data.push_back(c);
  }
  FileWriter w(path);
  w.bytes(kMagic, sizeof(kMagic));
  w.integer<uint32_t>(kVersion);
  w.integer<uint64_t>(size);
  w.integer<uint64_t>(dict.size());
  size_t i = 0;
  for (const auto& [name, t] : dict) {
    const Tensor& c = data[i++];
    w.integer<uint32_t>(static_cast<uint32_t>(name.size()));
    w.bytes(name.data(), name.size());
    w.integer<uint8_t>(dtype_code(c.dtype()));
    w.integer<uint32_t>(static_cast<uint32_t>(c.dim()));
    for (int64_t d : c.sizes()) w.integer<int64_t>(d);
    w.bytes(c.raw_data(), static_cast<size_t>(c.numel() * itemsize(c.dtype())));
  }
  w.finish();
}

StateDict read_state_dict(const std::string& path) {
  check_little_endian("load");
  FileReader file(path);
  const size_t n = file.size();
  // The checks run in the order that names the problem best: a foreign file by its magic, a
  // newer one by its version, then a short or long file by the size in the header, then any
  // damage by the checksum. Only then are entries parsed. The header is read and checked
  // before the rest, so that a foreign or damaged file is not read whole.
  unsigned char head[kHeaderBytes];
  file.read(head, std::min(n, kHeaderBytes));
  const size_t magic_seen = std::min(n, sizeof(kMagic));
  DUET_CHECK_VALUE(magic_seen == 0 || std::memcmp(head, kMagic, magic_seen) == 0,
                   "[load] '{}' is not a duet state dict: expected the magic bytes \"{}\", found "
                   "\"{}\"",
                   path, shown(reinterpret_cast<const unsigned char*>(kMagic), sizeof(kMagic)),
                   shown(head, magic_seen));
  DUET_CHECK_VALUE(n >= kHeaderBytes + 4,
                   "[load] '{}' is truncated: {} bytes, shorter than the {}-byte header and "
                   "checksum",
                   path, n, kHeaderBytes + 4);
  {
    ByteReader h(path, head, kHeaderBytes);
    h.take(sizeof(kMagic), "the magic");
    const auto version = h.integer<uint32_t>("the version");
    DUET_CHECK_VALUE(
        version == kVersion,
        "[load] '{}' has state dict format version {}, but this build reads version {}", path,
        version, kVersion);
    const auto declared = h.integer<uint64_t>("the file size");
    DUET_CHECK_VALUE(declared <= n, "[load] '{}' is truncated: {} bytes, but its header says {}",
                     path, n, declared);
    DUET_CHECK_VALUE(declared == n,
                     "[load] '{}' has trailing data: {} bytes, but its header says {}", path, n,
                     declared);
  }
  // The rest: exactly the size that the header declares and the file has.
  std::vector<unsigned char> data(n);
  std::memcpy(data.data(), head, kHeaderBytes);
  file.read(data.data() + kHeaderBytes, n - kHeaderBytes);
  const size_t body = n - 4;  // the bytes the checksum covers
  ByteReader r(path, data.data(), body);
  r.take(kHeaderBytes - 8, "the header");
  const uint32_t stored = ByteReader(path, data.data() + body, 4).integer<uint32_t>("checksum");
  const auto actual = static_cast<uint32_t>(crc_update(crc32(0, nullptr, 0), data.data(), body));
  DUET_CHECK_VALUE(stored == actual,
                   "[load] '{}' is damaged: its CRC-32 checksum is {:08x}, but the stored one is "
                   "{:08x}",
                   path, actual, stored);

  const auto count = r.integer<uint64_t>("the entry count");
  StateDict out;
  for (uint64_t e = 0; e < count; ++e) {
    const auto name_len = r.integer<uint32_t>("an entry's name length");
    const char* name_p = reinterpret_cast<const char*>(r.take(name_len, "an entry's name"));
    std::string name(name_p, name_len);
    const auto code = r.integer<uint8_t>("an entry's dtype");
    const auto* dt = std::find_if(std::begin(kDTypeCodes), std::end(kDTypeCodes),
                                  [&](auto p) { return p.second == code; });
    DUET_CHECK_VALUE(dt != std::end(kDTypeCodes),
                     "[load] '{}' is corrupt: entry '{}' has dtype code {}", path, name, code);
    const auto rank = r.integer<uint32_t>("an entry's rank");
    DUET_CHECK_VALUE(rank <= kMaxRank, "[load] '{}' is corrupt: entry '{}' has rank {}", path, name,
                     rank);
    Shape shape;
    uint64_t bytes = static_cast<uint64_t>(itemsize(dt->first));
    for (uint32_t d = 0; d < rank; ++d) {
      const auto size = r.integer<int64_t>("an entry's dims");
      DUET_CHECK_VALUE(size >= 0 && !__builtin_mul_overflow(bytes, uint64_t(size), &bytes),
                       "[load] '{}' is corrupt: entry '{}' has dim {} of size {}", path, name, d,
                       size);
      shape.push_back(size);
    }
    const unsigned char* p = r.take(bytes, "an entry's elements");
    DUET_CHECK_VALUE(!out.count(name), "[load] '{}' is corrupt: entry '{}' appears twice", path,
                     name);
    Tensor t = detail::empty(shape, dt->first);
    if (bytes) std::memcpy(t.raw_data(), p, bytes);
    out.emplace(std::move(name), t);
  }
  DUET_CHECK_VALUE(r.pos() == body,
                   "[load] '{}' is corrupt: {} bytes between the last entry and the checksum", path,
                   body - r.pos());
  return out;
}

}  // namespace duet::nn
