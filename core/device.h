// duet: where a tensor lives.
#pragma once

#include <cstdint>
#include <string>

namespace duet {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

/// A device: the CPU, or a CUDA GPU by index.
struct Device {
  DeviceType type = DeviceType::CPU;
  int8_t index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, static_cast<int8_t>(index)}; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  /// "cpu" or "cuda:0".
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

}  // namespace duet
