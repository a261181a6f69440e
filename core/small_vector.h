// duet: a small vector of trivially copyable values, inline up to N, on the heap beyond.
// Shapes and strides live here so that tensors of rank <= 6 never allocate for metadata.
#pragma once

#include <cassert>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <type_traits>

namespace duet::detail {

template <class T, int N>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  SmallVec(std::initializer_list<T> il) { assign(il.begin(), il.size()); }
  SmallVec(const T* p, int64_t n) { assign(p, n); }
  explicit SmallVec(int64_t n, T v = T()) {
    resize(n);
    std::fill(begin(), end(), v);
  }
  SmallVec(const SmallVec& o) { assign(o.data(), o.size_); }
  SmallVec(SmallVec&& o) noexcept {
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      size_ = o.size_;
      o.heap_ = nullptr;
      o.cap_ = N;
      o.size_ = 0;
    } else {
      assign(o.data(), o.size_);
    }
  }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) assign(o.data(), o.size_);
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this == &o) return *this;
    if (o.heap_) {
      std::free(heap_);
      heap_ = o.heap_;
      cap_ = o.cap_;
      size_ = o.size_;
      o.heap_ = nullptr;
      o.cap_ = N;
      o.size_ = 0;
    } else {
      assign(o.data(), o.size_);
    }
    return *this;
  }
  ~SmallVec() {
    if (heap_) std::free(heap_);
  }

  T* data() { return heap_ ? heap_ : inline_; }
  const T* data() const { return heap_ ? heap_ : inline_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Debug builds (the sanitizer build among them) check the index: an index past the inline
  // storage's live part reads stale values that no sanitizer sees.
  T& operator[](int64_t i) {
    assert(i >= 0 && i < size_);
    return data()[i];
  }
  const T& operator[](int64_t i) const {
    assert(i >= 0 && i < size_);
    return data()[i];
  }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void reserve(int64_t n) {
    if (n <= cap_) return;
    T* p = static_cast<T*>(std::malloc(sizeof(T) * n));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, data(), sizeof(T) * size_);
    std::free(heap_);
    heap_ = p;
    cap_ = static_cast<int32_t>(n);
  }
  void resize(int64_t n) {
    reserve(n);
    size_ = static_cast<int32_t>(n);
  }
  void resize(int64_t n, T v) {
    int64_t old = size_;
    resize(n);
    for (int64_t i = old; i < n; ++i) data()[i] = v;
  }
  void push_back(T v) {
    if (size_ == cap_) reserve(cap_ * 2);
    data()[size_++] = v;
  }
  void insert(int64_t pos, T v) {
    push_back(v);
    T* d = data();
    std::memmove(d + pos + 1, d + pos, sizeof(T) * (size_ - 1 - pos));
    d[pos] = v;
  }
  void erase(int64_t pos) {
    T* d = data();
    std::memmove(d + pos, d + pos + 1, sizeof(T) * (size_ - 1 - pos));
    --size_;
  }
  void clear() { size_ = 0; }

  friend bool operator==(const SmallVec& a, const SmallVec& b) {
    if (a.size_ != b.size_) return false;
    const T *pa = a.data(), *pb = b.data();
    for (int32_t i = 0; i < a.size_; ++i)
      if (!(pa[i] == pb[i])) return false;
    return true;
  }

 private:
  void assign(const T* p, int64_t n) {
    if (!heap_ && n <= N) {  // the common case: short, inline, no libc call
      for (int64_t i = 0; i < n; ++i) inline_[i] = p[i];
      size_ = static_cast<int32_t>(n);
      return;
    }
    if (n > cap_) {
      T* q = static_cast<T*>(std::malloc(sizeof(T) * n));
      if (!q) throw std::bad_alloc();
      std::free(heap_);
      heap_ = q;
      cap_ = static_cast<int32_t>(n);
    }
    // n > N here whenever p is another SmallVec's inline buffer is impossible, but GCC 12
    // cannot relate the two and reports -Warray-bounds / -Wstringop-overread on the source.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overread"
#endif
    if (n) std::memmove(heap_, p, sizeof(T) * n);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    size_ = static_cast<int32_t>(n);
  }

  T* heap_ = nullptr;
  int32_t size_ = 0;
  int32_t cap_ = N;
  T inline_[N];
};

}  // namespace duet::detail
