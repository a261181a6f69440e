// The profiler (Note [Profiler] in core/profiler.h): its JSON parses as Chrome-trace JSON (read
// here by a small parser of its own), a compiled call's event encloses its steps' events, and
// the figures are right: a 64^3 matmul reports 2 * 64^3 FLOPs, an add of n f32 values 12n bytes.
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <variant>

#include "util.h"

namespace duet::test {
namespace {

// A JSON value: null, bool, number, string, array or object.
struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<Json>,
               std::map<std::string, Json>>
      v;
  const Json& operator[](const std::string& k) const {
    return std::get<std::map<std::string, Json>>(v).at(k);
  }
  const std::vector<Json>& array() const { return std::get<std::vector<Json>>(v); }
  double number() const { return std::get<double>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  bool has(const std::string& k) const {
    const auto* m = std::get_if<std::map<std::string, Json>>(&v);
    return m && m->count(k);
  }
};

// Parses JSON text strictly (RFC 8259, no extensions); throws std::runtime_error on bad input.
class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Json parse() {
    Json j = value();
    ws();
    if (i_ != s_.size()) fail("text after the value");
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  char peek() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected ") + c);
    ++i_;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = s_[i_++];
      if (e == 'u') {
        out += static_cast<char>(std::stoi(s_.substr(i_, 4), nullptr, 16));
        i_ += 4;
      } else if (std::string("\"\\/bfnrt").find(e) != std::string::npos) {
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        fail("bad escape");
      }
    }
  }
  Json value() {
    const char c = peek();
    if (c == '{') {
      ++i_;
      std::map<std::string, Json> m;
      if (peek() == '}') return ++i_, Json{m};
      while (true) {
        std::string k = string();
        expect(':');
        m[k] = value();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return Json{m};
      }
    }
    if (c == '[') {
      ++i_;
      std::vector<Json> a;
      if (peek() == ']') return ++i_, Json{a};
      while (true) {
        a.push_back(value());
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return Json{a};
      }
    }
    if (c == '"') return Json{string()};
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, std::strlen(lit), lit) == 0) {
        i_ += std::strlen(lit);
        return lit[0] == 'n' ? Json{nullptr} : Json{lit[0] == 't'};
      }
    size_t used = 0;
    double d = 0;
    try {
      d = std::stod(s_.substr(i_, 32), &used);
    } catch (const std::exception&) {
      fail("bad value");
    }
    i_ += used;
    return Json{d};
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::vector<Json> events_of(const std::string& json) {
  const Json j = Parser(json).parse();
  return j["traceEvents"].array();
}

const Json* find_event(const std::vector<Json>& ev, const std::string& name) {
  for (const Json& e : ev)
    if (e["name"].str() == name) return &e;
  return nullptr;
}

TEST_CASE("profiler: eager ops report shapes, bytes and FLOPs; the JSON parses") {
  Profiler prof;
  const int64_t n = 1000;
  const Tensor a = ones({n}), b = ones({n});
  const int line = __LINE__ + 1;
  (void)(a + b);
  const Tensor m = ones({64, 64});
  (void)matmul(m, m);
  const std::vector<Json> ev = events_of(prof.json());
  const Json* add = find_event(ev, "add");
  REQUIRE(add != nullptr);
  CHECK((*add)["ph"].str() == "X");
  CHECK((*add)["args"]["bytes"].number() == 12.0 * n);
  CHECK((*add)["args"]["flops"].number() == n);
  CHECK((*add)["args"]["output"].str() == "f32 (1000)");
  CHECK((*add)["dur"].number() >= 0);
  CHECK((*add)["args"]["site"].str() == fmt::format("test_profiler.cpp:{}", line));
  const Json* mm = find_event(ev, "matmul");
  REQUIRE(mm != nullptr);
  CHECK((*mm)["args"]["flops"].number() == 2.0 * 64 * 64 * 64);
  CHECK((*mm)["args"]["bytes"].number() == 3.0 * 64 * 64 * 4);
  CHECK((*mm)["args"]["inputs"].array().size() == 2);
}

TEST_CASE("profiler: the products of addmm, addmv and lstm_step count as FLOPs") {
  Profiler prof;
  const Tensor x = ones({8, 16}), w = ones({32, 16}), b = ones({32});
  (void)linear(x, w, b);           // addmm: (8, 16) @ (16, 32)
  (void)linear(ones({16}), w, b);  // addmv: (32, 16) @ (16)
  const Tensor h = ones({8, 4}), c = ones({8, 4});
  (void)lstm_step(x, h, c, ones({16, 16}), ones({16, 4}), ones({16}), ones({16}));
  const std::vector<Json> ev = events_of(prof.json());
  const Json* mm = find_event(ev, "addmm");
  const Json* mv = find_event(ev, "addmv");
  const Json* st = find_event(ev, "lstm_step");
  REQUIRE((mm && mv && st));
  CHECK((*mm)["args"]["flops"].number() == 2.0 * 8 * 16 * 32);
  CHECK((*mv)["args"]["flops"].number() == 2.0 * 32 * 16);
  CHECK((*st)["args"]["flops"].number() == 2.0 * 8 * 16 * (16 + 4));
}

TEST_CASE("profiler: a compiled call's event encloses its steps' events") {
  auto f = compile([](Tensor x, Tensor w) { return sum(tanh(matmul(x, w)) * 2.0); });
  const Tensor x = ones({8, 16}), w = ones({16, 4});
  f(x, w);  // traced outside the profile
  Profiler prof;
  f(x, w);
  const std::vector<Json> ev = events_of(prof.json());
  const Json* plan = nullptr;
  for (const Json& e : ev)
    if (e["cat"].str() == "compiled") plan = &e;
  REQUIRE(plan != nullptr);
  CHECK(contains((*plan)["name"].str(), "plan of compiled function at test_profiler.cpp:"));
  const double t0 = (*plan)["ts"].number(), t1 = t0 + (*plan)["dur"].number();
  int steps = 0, sited = 0;
  bool fused = false;
  for (const Json& e : ev) {
    if (e["cat"].str() != "step") continue;
    ++steps;
    fused |= contains(e["name"].str(), "fused(");
    sited += starts_with(e["args"]["site"].str(), "test_profiler.cpp:");  // the lambda's line
    // Inside the call's event, on the same thread (times are rounded to nanoseconds).
    CHECK(e["ts"].number() >= t0 - 1e-3);
    CHECK(e["ts"].number() + e["dur"].number() <= t1 + 1e-3);
    CHECK(e["tid"].number() == (*plan)["tid"].number());
  }
  CHECK(steps >= 2);
  CHECK(sited == steps);
  CHECK(fused);
  CHECK(find_event(ev, "add") == nullptr);  // no eager ops ran in the call
}

TEST_CASE("profiler: nothing is recorded outside it; a path gets the JSON when it ends") {
  const std::string path = "duet_profile_test.json";
  {
    Profiler prof(path);
    (void)(ones({3}) * 2.0);
    CHECK(prof.size() >= 2);  // ones, mul
  }
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<Json> ev = events_of(ss.str());
  CHECK(find_event(ev, "mul") != nullptr);
  std::remove(path.c_str());
  Profiler later;
  CHECK(later.size() == 0);
  CHECK(events_of(later.json()).empty());
}

TEST_CASE("profiler: a path that cannot be written fails when the profiler is made") {
  // Before the work it would profile, with the path and the reason, not a warning at its end.
  CHECK_THROWS_WITH_AS(Profiler("no_such_folder_for_duet/profile.json"),
                       doctest::Contains("no_such_folder_for_duet/profile.json"), Error);
  CHECK(detail::g_profilers.load() == 0);  // nothing registered by the failed one
  (void)(ones({3}) * 2.0);                 // and ops still run
}

TEST_CASE("profiler: the parser used here rejects bad JSON") {
  for (const char* bad : {"{", "{\"a\": }", "[1, 2", "{\"a\": 1} x", "\"\\q\""})
    CHECK_THROWS_AS(Parser(bad).parse(), std::runtime_error);
  CHECK(Parser("{\"a\": [1, true, null, \"x\\n\"]}").parse()["a"].array().size() == 4);
}

}  // namespace
}  // namespace duet::test

namespace duet::test {

TEST_CASE("profiler: a counter track of tensor memory follows the events") {
  Profiler prof;
  const Tensor a = ones({1000});
  const Tensor b = a + a;         // 4000 bytes more
  const Tensor c = ones({2000});  // 8000 more
  const std::vector<Json> ev = events_of(prof.json());
  std::vector<double> bytes;
  for (const Json& e : ev)
    if (e["name"].str() == "tensor memory") {
      CHECK(e["ph"].str() == "C");
      bytes.push_back(e["args"]["cpu_bytes"].number());
    }
  REQUIRE(bytes.size() >= 2);
  CHECK(bytes.back() - bytes.front() >= 8000);
}

// Note [Device time in profiles], without a GPU: a backend whose events read a clock that the
// test moves stands in for CUDA's (lent for this case, the real one given back after).
namespace fake_device {
double now_ms = 0;
int live = 0;
void* record(Device) {
  ++live;
  return new double(now_ms);
}
double elapsed(void* a, void* b) { return *static_cast<double*>(b) - *static_cast<double*>(a); }
void destroy(void* e) {
  --live;
  delete static_cast<double*>(e);
}
Allocator& alloc(Device) { return cpu_allocator(); }
}  // namespace fake_device

TEST_CASE("profiler: device spans become device events on the device's track, read late") {
  const DeviceBackend* real = detail::device_backend(DeviceType::CUDA);
  const DeviceBackend saved = real ? *real : DeviceBackend{};
  DeviceBackend b = saved;
  if (!b.allocator) b.allocator = &fake_device::alloc;
  b.record_event = &fake_device::record;
  b.elapsed_ms = &fake_device::elapsed;
  b.destroy_event = &fake_device::destroy;
  detail::set_device_backend(DeviceType::CUDA, b);
  std::string js, outer_js;
  double begun_us = 0;
  {
    Profiler outer;
    {
      Profiler p;
      fake_device::now_ms = 10;
      begun_us = detail::profile_clock_us();
      detail::DeviceSpan s = detail::profile_device_begin(Device::cuda());
      fake_device::now_ms = 12.5;
      detail::profile_device_end(s, "kernel a", "\"k\": 1");
      detail::DeviceSpan t = detail::profile_device_begin(Device::cuda());
      fake_device::now_ms = 13;
      detail::profile_device_end(t, "kernel b", "");
      CHECK(!detail::profile_device_begin(Device::cpu()).start);  // the CPU has no device time
      js = p.json();
      CHECK(p.json() == js);  // read once: the pending spans became events
    }
    outer_js = outer.json();
  }
  detail::set_device_backend(DeviceType::CUDA, saved);
  CHECK(fake_device::live == 0);  // every event freed once read
  for (const std::string* text : {&js, &outer_js}) {
    const std::vector<Json> ev = events_of(*text);
    const Json* a = find_event(ev, "kernel a");
    const Json* k = find_event(ev, "kernel b");
    const Json* track = find_event(ev, "thread_name");
    REQUIRE(a != nullptr);
    REQUIRE(k != nullptr);
    REQUIRE(track != nullptr);
    CHECK((*a)["cat"].str() == "device");
    CHECK((*a)["dur"].number() == doctest::Approx(2500));
    CHECK((*k)["dur"].number() == doctest::Approx(500));
    // On the host clock from the reference: b starts 2.5 ms after a.
    CHECK((*k)["ts"].number() - (*a)["ts"].number() == doctest::Approx(2500));
    CHECK((*a)["ts"].number() >= begun_us - 1e-3);
    CHECK((*a)["args"]["k"].number() == 1);
    CHECK((*track)["args"]["name"].str() == "cuda:0");
    CHECK((*a)["tid"].number() == (*track)["tid"].number());
  }
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("profiler: a loss over several outputs of a compiled call runs one backward plan") {
  // Note [One backward for several outputs]: each output's tape node ran a backward plan of its
  // own, a whole backward through the function per output the loss read.
  manual_seed(3);
  Tensor w = (randn({6, 4}) * 0.5).requires_grad_(), v = (randn({4, 4}) * 0.5).requires_grad_();
  auto vae_like = [&](const Tensor& x) {
    Tensor h = tanh(matmul(x, w));
    return std::vector<Tensor>{matmul(h, v), h * 2, sum(h, Dims{1})};
  };
  auto f = compile([&](Tensor x) { return vae_like(x); });
  const Tensor x = randn({5, 6});
  auto loss = [](const std::vector<Tensor>& o) { return sum(o[0] * o[0]) + sum(o[1]) + sum(o[2]); };
  f(x);  // traced outside the profile
  std::vector<Tensor> got;
  int plans = 0;
  {
    Profiler prof;
    got = grad({loss(f(x))}, {w, v});
    for (const Json& e : events_of(prof.json())) plans += e["cat"].str() == "compiled";
  }
  CHECK(plans == 2);  // the forward and one backward
  const std::vector<Tensor> want = grad({loss(vae_like(x))}, {w, v});
  CHECK(close(got[0], want[0], 1e-5));
  CHECK(close(got[1], want[1], 1e-5));
  // One output alone runs its own backward; two of three, the joint one with zeros for the
  // third.
  CHECK(close(grad({sum(f(x)[1])}, {w})[0], grad({sum(vae_like(x)[1])}, {w})[0], 1e-5));
  auto two = [](const std::vector<Tensor>& o) { return sum(o[0]) + sum(o[2] * o[2]); };
  const std::vector<Tensor> g2 = grad({two(f(x))}, {w, v}), e2 = grad({two(vae_like(x))}, {w, v});
  CHECK(close(g2[0], e2[0], 1e-5));
  CHECK(close(g2[1], e2[1], 1e-5));
  CHECK(f.stats().traces == 1);
}

}  // namespace duet::test
