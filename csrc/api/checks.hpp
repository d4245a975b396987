// Argument checks shared by every API family: each failure is a ValueError naming the argument.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace mok::api::checks {

inline void require(bool ok, const std::string& message) {
  if (!ok) throw pybind11::value_error(message);
}

// A non-null device address aligned to `alignment` bytes.
inline void address(const char* name, uintptr_t value, uintptr_t alignment) {
  require(value != 0, std::string("`") + name + "` must be a device address, got 0");
  require(value % alignment == 0, std::string("`") + name + "` must be " +
                                      std::to_string(alignment) + "-byte aligned, got address " +
                                      std::to_string(value));
}

inline void in_range(const char* name, int64_t value, int64_t low, int64_t high) {
  require(value >= low && value <= high, std::string("`") + name + "` must be in [" +
                                             std::to_string(low) + ", " + std::to_string(high) +
                                             "], got " + std::to_string(value));
}

}  // namespace mok::api::checks
