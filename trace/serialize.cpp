#include "trace/serialize.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "core/dispatch.h"
#include "core/ops.h"
#include "core/tensor_impl.h"
#include "trace/control_flow.h"

namespace duet::detail {
namespace {

constexpr char kMagic[8] = {'D', 'U', 'E', 'T', 'P', 'R', 'O', 'G'};
constexpr size_t kHeader = 32;
constexpr int kMaxDepth = 64;  // nested control flow

uint32_t crc(const char* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    c = crc32(c, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

// ---- writing ----

struct Writer {
  std::string out;
  template <class T>
  void raw(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  void u8(uint8_t v) { raw(v); }
  void u32(uint32_t v) { raw(v); }
  void i64(int64_t v) { raw(v); }
  void f64(double v) { raw(v); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void sym(const SymInt& s) { str(s.str()); }
  void opt_sym(const std::optional<SymInt>& s) {
    u8(s.has_value());
    if (s) sym(*s);
  }
  void device(Device d) {
    u8(static_cast<uint8_t>(d.type));
    raw(d.index);
  }
  void shape(const Shape& s) {
    u32(static_cast<uint32_t>(s.size()));
    for (int64_t d : s) i64(d);
  }
  void meta(const TensorMeta& m) {
    shape(m.shape);
    u8(static_cast<uint8_t>(m.dtype));
    device(m.device);
    u32(static_cast<uint32_t>(m.sym.size()));
    for (const SymInt& s : m.sym) sym(s);
  }
  void scalar(const Scalar& s) {
    u8(static_cast<uint8_t>(s.kind()));
    if (s.is_floating())
      f64(s.to<double>());
    else
      i64(s.to<int64_t>());
  }
  void tensor(const Tensor& t) {
    SuspendModes eager;
    const Tensor c = t.detach().to(Device::cpu()).contiguous();
    u8(static_cast<uint8_t>(t.dtype()));
    device(t.device());
    shape(t.sizes());
    u8(t.unsafe_impl()->wrapped_number);
    const size_t bytes = static_cast<size_t>(c.numel()) * itemsize(c.dtype());
    raw(static_cast<uint64_t>(bytes));
    out.append(static_cast<const char*>(c.raw_data()), bytes);
  }
  void attrs(OpId op, const Attrs& a) {
    u32(static_cast<uint32_t>(a.ints.size()));
    for (int64_t v : a.ints) i64(v);
    // Print's dim is an index into this process's format strings: the string is written.
    if (op == OpId::Print)
      str(interned_format(a.dim));
    else
      i64(a.dim);
    i64(a.start);
    i64(a.end);
    i64(a.step);
    u8(a.keepdim);
    u8(static_cast<uint8_t>(a.dtype));
    device(a.device);
    scalar(a.value);
    u8(a.sym != nullptr);
    if (a.sym) {
      u32(static_cast<uint32_t>(a.sym->ints.size()));
      for (const SymInt& s : a.sym->ints) sym(s);
      opt_sym(a.sym->start);
      opt_sym(a.sym->end);
      opt_sym(a.sym->value);
    }
  }
  void graph(const Graph& g) {
    str(g.label);
    i64(g.num_runtime_inputs);
    u32(static_cast<uint32_t>(g.scopes.size()));
    for (const std::string& s : g.scopes) str(s);
    u32(static_cast<uint32_t>(g.captured.size()));
    for (const Tensor& t : g.captured) tensor(t);
    u32(static_cast<uint32_t>(g.nodes.size()));
    for (const GraphNode& n : g.nodes) node(n);
    u32(static_cast<uint32_t>(g.outputs.size()));
    for (int32_t o : g.outputs) i64(o);
    u32(static_cast<uint32_t>(g.writebacks.size()));
    for (const WriteBack& w : g.writebacks) {
      i64(w.value);
      i64(w.target);
    }
  }
  void node(const GraphNode& n) {
    u8(static_cast<uint8_t>(n.kind));
    meta(n.meta);
    u32(static_cast<uint32_t>(n.inputs.size()));
    for (int32_t i : n.inputs) i64(i);
    str(n.name);
    i64(n.scope);
    str(n.site ? file_basename(n.site.file) : "");
    u32(n.site.line);
    switch (n.kind) {
      case NodeKind::Input:
        u8(static_cast<uint8_t>(n.role));
        i64(n.index);
        break;
      case NodeKind::Constant:
        tensor(n.constant);
        break;
      case NodeKind::Op:
        str(std::string(op_name(n.op)));
        attrs(n.op, n.attrs);
        break;
      case NodeKind::Project:
        i64(n.index);
        break;
      case NodeKind::Control: {
        const ControlFlow& cf = *n.control;
        u8(static_cast<uint8_t>(cf.kind));
        i64(cf.num_carry);
        i64(cf.num_xs);
        u8(cf.reverse);
        u32(static_cast<uint32_t>(cf.results.size()));
        for (const TensorMeta& m : cf.results) meta(m);
        u32(static_cast<uint32_t>(cf.graphs.size()));
        for (const Graph& sub : cf.graphs) graph(sub);
        break;
      }
    }
  }
};

// ---- reading ----

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw ValueError(
      fmt::format("[load] {} is corrupt: {} (the checksums matched, so it was written wrong, or "
                  "by a build that encodes differently)",
                  path, what));
}

// File names of call sites, kept for the process's life (CallSite holds a const char*).
const char* intern_file(const std::string& f) {
  static std::mutex m;
  static auto* files = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(m);
  return files->insert(f).first->c_str();
}

struct Reader {
  const char* p;
  size_t left;
  const std::string& path;
  int depth = 0;

  void need(size_t n, const char* what) {
    if (n > left) corrupt(path, fmt::format("{} runs past the end of the payload", what));
  }
  template <class T>
  T raw(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    left -= sizeof(T);
    return v;
  }
  uint8_t u8(const char* what) { return raw<uint8_t>(what); }
  uint32_t u32(const char* what) { return raw<uint32_t>(what); }
  int64_t i64(const char* what) { return raw<int64_t>(what); }
  double f64(const char* what) { return raw<double>(what); }
  // A count of items of at least `min_bytes` each: never more than what is left can hold.
  size_t count(const char* what, size_t min_bytes) {
    const uint32_t n = u32(what);
    if (min_bytes > 0 && n > left / min_bytes)
      corrupt(path, fmt::format("{} counts {} items, more than the payload holds", what, n));
    return n;
  }
  std::string str(const char* what) {
    const uint32_t n = u32(what);
    need(n, what);
    std::string s(p, n);
    p += n;
    left -= n;
    return s;
  }
  int32_t index(const char* what, int64_t limit) {
    const int64_t v = i64(what);
    if (v < 0 || v >= limit)
      corrupt(path, fmt::format("{} is {}, out of range [0, {})", what, v, limit));
    return static_cast<int32_t>(v);
  }
  SymInt sym(const char* what) {
    const std::string s = str(what);
    std::optional<SymInt> v = parse_sym(s);
    if (!v) corrupt(path, fmt::format("{} \"{}\" is not a size expression", what, s));
    return *v;
  }
  std::optional<SymInt> opt_sym(const char* what) {
    if (!u8(what)) return std::nullopt;
    return sym(what);
  }
  DType dtype(const char* what) {
    const uint8_t d = u8(what);
    if (d >= kNumDTypes) corrupt(path, fmt::format("{} has no dtype {}", what, d));
    return static_cast<DType>(d);
  }
  Device device(const char* what) {
    const uint8_t t = u8(what);
    const int8_t i = raw<int8_t>(what);
    if (t >= kNumDeviceTypes || i < 0) corrupt(path, fmt::format("{} names no device", what));
    return {static_cast<DeviceType>(t), i};
  }
  Shape shape(const char* what) {
    const size_t n = count(what, 8);
    if (n > 64) corrupt(path, fmt::format("{} has rank {}", what, n));
    Shape s;
    int64_t span = 1;  // the product of max(size, 1): what strides reach
    for (size_t i = 0; i < n; ++i) {
      const int64_t d = i64(what);
      if (d < 0) corrupt(path, fmt::format("{} has a negative size {}", what, d));
      if (d > (int64_t(1) << 48) || span > (int64_t(1) << 48) / std::max<int64_t>(d, 1))
        corrupt(path, fmt::format("{} has sizes over 2^48 elements", what));
      span *= std::max<int64_t>(d, 1);
      s.push_back(d);
    }
    return s;
  }
  TensorMeta meta(const char* what) {
    TensorMeta m;
    m.shape = shape(what);
    m.dtype = dtype(what);
    m.device = device(what);
    const size_t n = count(what, 4);
    if (n != 0 && n != static_cast<size_t>(m.shape.size()))
      corrupt(path, fmt::format("{} has {} symbolic dims for rank {}", what, n, m.shape.size()));
    for (size_t i = 0; i < n; ++i) m.sym.push_back(sym(what));
    return m;
  }
  Scalar scalar(const char* what) {
    const uint8_t k = u8(what);
    if (k > 2) corrupt(path, fmt::format("{} has no scalar kind {}", what, k));
    const auto kind = static_cast<Scalar::Kind>(k);
    if (kind == Scalar::Kind::Float) return Scalar(f64(what));
    const int64_t v = i64(what);
    return kind == Scalar::Kind::Bool ? Scalar(v != 0) : Scalar(v);
  }
  Tensor tensor(const char* what) {
    const DType dt = dtype(what);
    const Device dev = device(what);
    const Shape s = shape(what);
    const bool wrapped = u8(what) != 0;
    const uint64_t bytes = raw<uint64_t>(what);
    int64_t numel = 1;
    for (int64_t d : s) {
      if (d != 0 && numel > (int64_t(1) << 40) / d)
        corrupt(path, fmt::format("{} of shape {} is too large", what, s));
      numel *= d;
    }
    if (bytes != static_cast<uint64_t>(numel) * itemsize(dt))
      corrupt(path, fmt::format("{} of shape {} {} holds {} bytes", what, s, dt, bytes));
    need(bytes, what);
    SuspendModes eager;
    Tensor t = empty(s, dt);
    if (bytes) std::memcpy(t.raw_data(), p, bytes);
    p += bytes;
    left -= bytes;
    t.unsafe_impl()->wrapped_number = wrapped;
    if (!dev.is_cpu()) t = t.to(dev);
    return t;
  }
  Attrs attrs(OpId op) {
    Attrs a;
    const size_t n = count("attribute ints", 8);
    int64_t span = 1;  // shapes and dim lists: far below 2^48 elements
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = i64("attribute ints");
      const int64_t m = v < 0 ? (v < -(int64_t(1) << 48) ? int64_t(1) << 49 : -v) : v;
      if (m > (int64_t(1) << 48) || span > (int64_t(1) << 48) / std::max<int64_t>(m, 1))
        corrupt(path, "an op's sizes are over 2^48 elements");
      span *= std::max<int64_t>(m, 1);
      a.ints.push_back(v);
    }
    if (op == OpId::Print) {
      const std::string format = str("print format");
      const std::string why = print_format_error(format);
      if (!why.empty())
        corrupt(path, fmt::format("a print's format \"{}\" does not format one tensor ({})", format,
                                  why));
      a.dim = intern_format(format);
    } else
      a.dim = i64("attribute dim");
    a.start = i64("attribute start");
    a.end = i64("attribute end");
    a.step = i64("attribute step");
    a.keepdim = u8("attribute keepdim") != 0;
    a.dtype = dtype("attribute dtype");
    a.device = device("attribute device");
    a.value = scalar("attribute value");
    if (u8("symbolic attributes")) {
      auto s = std::make_shared<SymAttrs>();
      const size_t k = count("symbolic ints", 4);
      for (size_t i = 0; i < k; ++i) s->ints.push_back(sym("symbolic ints"));
      s->start = opt_sym("symbolic start");
      s->end = opt_sym("symbolic end");
      s->value = opt_sym("symbolic value");
      a.sym = std::move(s);
    }
    return a;
  }
  Graph graph() {
    if (++depth > kMaxDepth) corrupt(path, "control flow nests too deep");
    Graph g;
    g.label = str("graph label");
    const int64_t inputs = i64("runtime inputs");
    if (inputs < 0 || inputs > int64_t(left)) corrupt(path, "the count of runtime inputs");
    g.num_runtime_inputs = static_cast<int32_t>(inputs);
    const size_t ns = count("scopes", 4);
    for (size_t i = 0; i < ns; ++i) g.scopes.push_back(str("scope"));
    const size_t nc = count("captured tensors", 20);
    for (size_t i = 0; i < nc; ++i) g.captured.push_back(tensor("a captured tensor"));
    const size_t nn = count("nodes", 30);
    for (size_t i = 0; i < nn; ++i) g.nodes.push_back(node(g, static_cast<int32_t>(i)));
    const auto nodes = static_cast<int64_t>(g.nodes.size());
    const size_t no = count("outputs", 8);
    for (size_t i = 0; i < no; ++i) g.outputs.push_back(index("an output", nodes));
    const size_t nw = count("write-backs", 16);
    for (size_t i = 0; i < nw; ++i) {
      WriteBack w;
      w.value = index("a write-back's value", nodes);
      w.target = index("a write-back's target", static_cast<int64_t>(g.captured.size()));
      g.writebacks.push_back(w);
    }
    --depth;
    return g;
  }
  GraphNode node(const Graph& g, int32_t at) {
    GraphNode n;
    const uint8_t kind = u8("node kind");
    if (kind > static_cast<uint8_t>(NodeKind::Project))
      corrupt(path, fmt::format("node {} has no kind {}", at, kind));
    n.kind = static_cast<NodeKind>(kind);
    n.meta = meta("a node's type");
    const size_t ni = count("node inputs", 8);
    for (size_t i = 0; i < ni; ++i) n.inputs.push_back(index("a node input", at));
    n.name = str("node name");
    const int64_t scope = i64("node scope");
    if (scope < -1 || scope >= static_cast<int64_t>(g.scopes.size()))
      corrupt(path, fmt::format("node {} has scope {}", at, scope));
    n.scope = static_cast<int32_t>(scope);
    const std::string file = str("call site");
    const uint32_t line = u32("call site line");
    if (!file.empty()) n.site = CallSite{intern_file(file), line};
    switch (n.kind) {
      case NodeKind::Input: {
        const uint8_t role = u8("input role");
        if (role > static_cast<uint8_t>(InputRole::Saved))
          corrupt(path, fmt::format("node {} has no input role {}", at, role));
        n.role = static_cast<InputRole>(role);
        const int64_t limit = n.role == InputRole::Captured
                                  ? static_cast<int64_t>(g.captured.size())
                                  : static_cast<int64_t>(g.num_runtime_inputs);
        n.index = index("an input's index", limit);
        break;
      }
      case NodeKind::Constant:
        n.constant = tensor("a constant");
        break;
      case NodeKind::Op: {
        const std::string name = str("op name");
        bool found = false;
        for (int i = 0; i < kNumOps && !found; ++i)
          if (op_name(OpId(i)) == name) {
            n.op = OpId(i);
            found = true;
          }
        if (!found) corrupt(path, fmt::format("node {} calls no op named \"{}\"", at, name));
        const int arity = op_def(n.op).arity;
        if (arity >= 0 && static_cast<int>(n.inputs.size()) != arity)
          corrupt(path, fmt::format("node {} ({}) has {} inputs, not {}", at, name, n.inputs.size(),
                                    arity));
        n.attrs = attrs(n.op);
        break;
      }
      case NodeKind::Project:
        if (n.inputs.size() != 1 || g.nodes[n.inputs[0]].kind != NodeKind::Control)
          corrupt(path, fmt::format("node {} projects from no construct", at));
        n.index = index("a projection",
                        static_cast<int64_t>(g.nodes[n.inputs[0]].control->results.size()));
        break;
      case NodeKind::Control: {
        auto cf = std::make_shared<ControlFlow>();
        const uint8_t k = u8("construct kind");
        if (k > static_cast<uint8_t>(ControlKind::WhileLoop))
          corrupt(path, fmt::format("node {} has no construct kind {}", at, k));
        cf->kind = static_cast<ControlKind>(k);
        cf->num_carry = static_cast<int32_t>(index("carries", 1 << 20));
        cf->num_xs = static_cast<int32_t>(index("scanned tensors", 1 << 20));
        cf->reverse = u8("reverse") != 0;
        const size_t nr = count("construct results", 16);
        for (size_t i = 0; i < nr; ++i) cf->results.push_back(meta("a construct result"));
        const size_t ng = count("construct functions", 16);
        const size_t want = cf->kind == ControlKind::Scan ? 1 : 2;
        if (ng != want) corrupt(path, fmt::format("node {} has {} functions", at, ng));
        for (size_t i = 0; i < ng; ++i) cf->graphs.push_back(graph());
        n.control = std::move(cf);
        break;
      }
    }
    return n;
  }
};

// ---- size expressions: the text of SymInt::str() ----

struct SymParser {
  const std::string& s;
  size_t i = 0;
  bool ok = true;
  int depth = 0;

  void space() {
    while (i < s.size() && s[i] == ' ') ++i;
  }
  bool eat(const char* t) {
    space();
    const size_t n = std::strlen(t);
    if (s.compare(i, n, t) != 0) return false;
    i += n;
    return true;
  }
  std::optional<int64_t> number() {
    space();
    size_t j = i;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j == i || j - i > 18) return std::nullopt;
    const int64_t v = std::stoll(s.substr(i, j - i));
    i = j;
    return v;
  }
  SymInt expr() {
    if (++depth > 64) {
      ok = false;
      return 0;
    }
    SymInt r = term();
    for (;;) {
      if (eat("+"))
        r = r + term();
      else if (eat("-"))
        r = r - term();
      else
        break;
    }
    --depth;
    return r;
  }
  SymInt term() {
    SymInt r = factor();
    while (ok && eat("*")) r = r * factor();
    return r;
  }
  SymInt factor() {
    if (!ok) return 0;
    if (eat("-")) return -factor();
    if (eat("(")) {
      SymInt r = expr();
      if (!eat(")")) ok = false;
      return r;
    }
    for (const char* f : {"floordiv(", "mod("}) {
      if (!eat(f)) continue;
      SymInt a = expr();
      if (!eat(",")) ok = false;
      SymInt b = expr();
      if (!eat(")")) ok = false;
      if (!ok || b == SymInt(0)) {
        ok = false;
        return 0;
      }
      return f[0] == 'f' ? floordiv(a, b) : mod(a, b);
    }
    if (eat("s")) {
      const std::optional<int64_t> id = number();
      if (!id || *id > (1 << 20)) {
        ok = false;
        return 0;
      }
      SymInt r = SymInt::symbol(static_cast<int32_t>(*id));
      if (eat("**")) {
        const std::optional<int64_t> e = number();
        if (!e || *e < 1 || *e > 64) {
          ok = false;
          return 0;
        }
        SymInt base = r;
        for (int64_t k = 1; k < *e; ++k) r = r * base;
      }
      return r;
    }
    const std::optional<int64_t> v = number();
    if (!v) ok = false;
    return v ? SymInt(*v) : SymInt(0);
  }
};

}  // namespace

std::optional<SymInt> parse_sym(const std::string& text) {
  SymParser p{text};
  try {
    SymInt v = p.expr();
    p.space();
    if (!p.ok || p.i != text.size() || v.str() != text) return std::nullopt;
    return v;
  } catch (const Error&) {  // overflow, division by zero
    return std::nullopt;
  }
}

std::string encode_program(const SavedProgram& prog) {
  Writer w;
  w.str(prog.label);
  w.u32(static_cast<uint32_t>(prog.inputs.size()));
  for (const SavedInput& in : prog.inputs) {
    w.str(in.name);
    w.u8(static_cast<uint8_t>(in.dtype));
    w.device(in.device);
    w.u32(static_cast<uint32_t>(in.sizes.size()));
    for (size_t d = 0; d < in.sizes.size(); ++d) {
      w.i64(in.sizes[d]);
      w.i64(in.syms[d]);
    }
  }
  w.i64(prog.num_symbols);
  for (int64_t h : prog.hints) w.i64(h);
  w.u32(static_cast<uint32_t>(prog.guards.size()));
  for (const SavedGuard& g : prog.guards) {
    w.sym(g.a);
    w.u8(static_cast<uint8_t>(g.rel));
    w.sym(g.b);
    w.str(g.why);
  }
  w.u32(static_cast<uint32_t>(prog.outputs.size()));
  for (const std::string& o : prog.outputs) w.str(o);
  w.u32(static_cast<uint32_t>(prog.captured_names.size()));
  for (const std::string& c : prog.captured_names) w.str(c);
  w.graph(prog.graph);

  Writer h;
  h.out.append(kMagic, sizeof kMagic);
  h.u32(kFormatVersion);
  h.u32(0);
  h.out.append(16, '\0');  // the size and checksums: reseal_program
  std::string bytes = h.out + w.out;
  reseal_program(bytes);
  return bytes;
}

void reseal_program(std::string& bytes) {
  DUET_ASSERT(bytes.size() >= kHeader, "reseal_program of {} bytes", bytes.size());
  const uint64_t size = bytes.size() - kHeader;
  std::memcpy(bytes.data() + 16, &size, 8);
  const uint32_t payload = crc(bytes.data() + kHeader, size);
  std::memcpy(bytes.data() + 24, &payload, 4);
  const uint32_t header = crc(bytes.data(), 28);
  std::memcpy(bytes.data() + 28, &header, 4);
}

SavedProgram decode_program(const std::string& bytes, const std::string& path) {
  DUET_CHECK_VALUE(bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, 8) == 0,
                   "[load] {} is not a duet program file (it does not start with \"DUETPROG\")",
                   path);
  DUET_CHECK_VALUE(bytes.size() >= kHeader,
                   "[load] {} is truncated: {} bytes, shorter than the 32-byte header", path,
                   bytes.size());
  uint32_t version, header_crc;
  uint64_t size;
  uint32_t payload_crc;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&size, bytes.data() + 16, 8);
  std::memcpy(&payload_crc, bytes.data() + 24, 4);
  std::memcpy(&header_crc, bytes.data() + 28, 4);
  DUET_CHECK_VALUE(crc(bytes.data(), 28) == header_crc,
                   "[load] {} is corrupt: the header's checksum does not match", path);
  DUET_CHECK_VALUE(version <= kFormatVersion,
                   "[load] {} has format version {}, newer than this build reads (version {}): "
                   "load it with a newer duet",
                   path, version, kFormatVersion);
  DUET_CHECK_VALUE(version >= 1, "[load] {} has format version 0, which no duet wrote", path);
  DUET_CHECK_VALUE(bytes.size() - kHeader >= size,
                   "[load] {} is truncated: the header announces {} bytes of payload, the file "
                   "holds {}",
                   path, size, bytes.size() - kHeader);
  DUET_CHECK_VALUE(bytes.size() - kHeader == size,
                   "[load] {} has {} bytes after the payload the header announces", path,
                   bytes.size() - kHeader - size);
  DUET_CHECK_VALUE(crc(bytes.data() + kHeader, size) == payload_crc,
                   "[load] {} is corrupt: the payload's checksum does not match", path);

  Reader r{bytes.data() + kHeader, size, path};
  SavedProgram p;
  p.label = r.str("label");
  const size_t ni = r.count("inputs", 10);
  for (size_t i = 0; i < ni; ++i) {
    SavedInput in;
    in.name = r.str("an input's name");
    in.dtype = r.dtype("an input's dtype");
    in.device = r.device("an input's device");
    const size_t rank = r.count("an input's rank", 16);
    if (rank > 64) corrupt(path, "an input has a rank over 64");
    for (size_t d = 0; d < rank; ++d) {
      const int64_t size_d = r.i64("an input's size");
      const int64_t sym = r.i64("an input's symbol");
      if (size_d < 0 || sym < -1 || sym >= (1 << 20)) corrupt(path, "an input's dims");
      in.sizes.push_back(size_d);
      in.syms.push_back(static_cast<int32_t>(sym));
    }
    p.inputs.push_back(std::move(in));
  }
  const int64_t ns = r.i64("symbol count");
  if (ns < 0 || ns > int64_t(r.left / 8)) corrupt(path, "the symbol count");
  p.num_symbols = static_cast<int32_t>(ns);
  for (int64_t i = 0; i < ns; ++i) p.hints.push_back(r.i64("a symbol's size"));
  for (const SavedInput& in : p.inputs)
    for (int32_t s : in.syms)
      if (s >= p.num_symbols) corrupt(path, fmt::format("input {} uses symbol s{}", in.name, s));
  const size_t ng = r.count("guards", 14);
  for (size_t i = 0; i < ng; ++i) {
    SavedGuard g;
    g.a = r.sym("a guard");
    const uint8_t rel = r.u8("a guard's relation");
    if (rel > static_cast<uint8_t>(SymRel::Le)) corrupt(path, "a guard's relation");
    g.rel = static_cast<SymRel>(rel);
    g.b = r.sym("a guard");
    g.why = r.str("a guard's reason");
    p.guards.push_back(std::move(g));
  }
  const size_t no = r.count("output names", 4);
  for (size_t i = 0; i < no; ++i) p.outputs.push_back(r.str("an output name"));
  const size_t nc = r.count("parameter names", 4);
  for (size_t i = 0; i < nc; ++i) p.captured_names.push_back(r.str("a parameter name"));
  p.graph = r.graph();
  if (r.left != 0) corrupt(path, fmt::format("{} bytes after the graph", r.left));
  if (p.graph.num_runtime_inputs != static_cast<int32_t>(p.inputs.size()))
    corrupt(path, fmt::format("the graph has {} inputs, the file lists {}",
                              p.graph.num_runtime_inputs, p.inputs.size()));
  if (p.outputs.size() != p.graph.outputs.size())
    corrupt(path, "the output names and the graph's outputs differ");
  if (p.captured_names.size() != p.graph.captured.size())
    corrupt(path, "the parameter names and the graph's parameters differ");
  try {
    p.graph.verify();
  } catch (const Error& e) {
    corrupt(path, fmt::format("its graph does not check: {}", e.what()));
  }
  return p;
}

}  // namespace duet::detail
