// Division of non-negative int32 values by a divisor fixed for a launch, as one 32 x 32 -> 64
// bit multiply and a shift. The gathering quantizer divides every routed row's source index by
// the top-k; the compiler's signed division took ~25 instructions a row, on the chain from the
// schedule's entry to the row's loads.
//
// Granlund and Montgomery's round-up method for dividends n < 2^31: with l = ceil(log2 d) and
// m = ceil(2^(31 + l) / d) (< 2^32), floor(n * m / 2^(31 + l)) = floor(n / d), because
// m * d - 2^(31 + l) < d makes the error n * (m * d - 2^(31 + l)) / (d * 2^(31 + l)) < 1 / d.
#pragma once

#include <cstdint>

namespace mok {

struct FastDivisor {
  uint32_t magic = 1u << 31;  // divisor 1: n * 2^31 >> 31
  int shift = 31;

  FastDivisor() = default;

  // d >= 1 (the callers check it).
  explicit FastDivisor(int d) {
    int log2_ceil = 0;
    while ((int64_t{1} << log2_ceil) < d) ++log2_ceil;
    shift = 31 + log2_ceil;
    const uint64_t power = uint64_t{1} << shift;
    magic = static_cast<uint32_t>((power + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
  }

  // floor(n / d) for 0 <= n < 2^31.
  __host__ __device__ __forceinline__ uint32_t divide(int32_t n) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * magic) >>
                                 shift);
  }
};

}  // namespace mok
