// The arrival counters of a dispatch pull overlapped with the GEMM that reads its rows: what
// both kernels are given (host and device). common/arrivals.cuh has the device side and says how
// they synchronise.
#pragma once

#include <cstdint>

namespace mok::comm {

struct Arrivals {
  uint32_t* counts = nullptr;  // [minibatches]; null: nothing overlapped, nobody waits
  int64_t minibatch_rows = 0;  // schedule rows per counter
  int64_t minibatches = 0;     // counters, ceil(pulled rows / minibatch_rows)
  int* status = nullptr;       // a wait that times out ORs kStatusTimeout here
  uint64_t timeout_ns = 0;
};

}  // namespace mok::comm
