// Can a Hopper GEMM gather its A rows by index as it loads them? A probe (docs/overlap.md).
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/probe_tma_gather benchmarks/probe_tma_gather.cu
//     /tmp/probe_tma_gather
//
// Loader warps fill 128 x 64 bf16 stages (16 KiB, 128-byte swizzle, six stages) of row tiles; a
// consumer warp waits for each stage, reads one word of it and frees it. Five ways to fill one:
//   0 tile:    one 2D TMA box {64, 128} of a contiguous [M, H] buffer (what the GEMM does now)
//   1 rows:    128 TMA boxes {64, 1} of the same buffer from one warp (the instruction count)
//   2 gather:  128 TMA boxes {64, 1} of x [T, H] at rows idx[m], from one warp
//   3 gather:  the same from four warps, a row a lane
//   4 gather:  cp.async, 16 bytes a copy, four warps, the swizzle applied by hand
// Both sources are 16 MiB, so they stay in L2 as a GEMM's A tiles mostly do (each is read once
// per N tile): the probe measures what filling a stage costs, not HBM. First a check: a stage
// gathered row by row with TMA holds the bytes the tile load of the pre-gathered rows holds (the
// swizzle follows the shared-memory address, so a row loaded at +128 B lands where the tile puts
// it). The cp.async fill's bytes are not checked: it is timed only.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kTileM = 128, kTileK = 64, kStages = 6, kH = 4096, kT = 2048, kM = 2048;
constexpr int kRepeats = 64;  // passes over the M rows per launch
constexpr int kStageBytes = kTileM * kTileK * 2;

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));      \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

__device__ __forceinline__ uint32_t smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(b)), "r"(count));
}
__device__ __forceinline__ void bar_expect(uint64_t* b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(b)),
               "r"(bytes));
}
__device__ __forceinline__ void bar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(b)));
}
__device__ __forceinline__ void bar_wait(uint64_t* b, int phase) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W;\n}\n" ::"r"(smem(b)),
      "r"(phase));
}
__device__ __forceinline__ void tma_2d(const CUtensorMap* map, uint64_t* bar, void* dst, int x,
                                       int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%3, %4}], [%2];" ::"r"(smem(dst)),
      "l"(map), "r"(smem(bar)), "r"(x), "r"(y)
      : "memory");
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem(b)) : "memory");
}

enum Mode { kTile = 0, kRows = 1, kGather = 2, kGather4Warps = 3, kGatherCpAsync = 4 };
constexpr int kProducerWarps = 4;

struct Maps {
  CUtensorMap tile;  // box {64, 128} over the contiguous [M, H]
  CUtensorMap row;   // box {64, 1} over the contiguous [M, H]
  CUtensorMap x;     // box {64, 1} over x [T, H]
};

__global__ void __launch_bounds__(160)
    fill(const __grid_constant__ Maps maps, const void* x, const int* idx, int mode, int tiles,
         unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* stages = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  __shared__ uint64_t full[kStages], empty[kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      bar_init(&full[s], mode == kGatherCpAsync ? kProducerWarps * 32 : 1);
      bar_init(&empty[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  const int ksteps = kH / kTileK;
  const bool consumer = warp == kProducerWarps;
  // Warps that load: all four for modes 3 and 4, else warp 0.
  const int loaders = mode >= kGather4Warps ? kProducerWarps : 1;
  const bool loads = warp < loaders;
  unsigned acc = 0;
  int it = 0;
  for (int item = blockIdx.x; item < tiles * kRepeats; item += gridDim.x) {
    const int tile = item % tiles;
    // The rows a lane loads: four in the one-warp modes, one (warp * 32 + lane) in 3 and 4.
    int rows[4];
    for (int j = 0; j < 4; ++j) {
      const int r = loaders == 1 ? lane * 4 + j : warp * 32 + lane;
      const int m = tile * kTileM + r;
      rows[j] = mode == kTile || mode == kRows ? m : idx[m];
    }
    for (int k = 0; k < ksteps; ++k, ++it) {
      const int s = it % kStages, round = it / kStages;
      unsigned char* stage = stages + s * kStageBytes;
      if (loads) {
        if (round > 0) bar_wait(&empty[s], (round - 1) & 1);
        if (mode != kGatherCpAsync && threadIdx.x == 0) bar_expect(&full[s], kStageBytes);
        if (mode == kGatherCpAsync) {
          // row r = warp*32 + lane: its 8 chunks of 16 bytes, chunk c at r*128 + (c ^ r%8)*16
          const int r = warp * 32 + lane;
          const char* src =
              static_cast<const char*>(x) + (size_t(rows[0]) * kH + size_t(k) * kTileK) * 2;
          for (int c = 0; c < 8; ++c) {
            cp_async16(stage + r * 128 + ((c ^ (r % 8)) * 16), src + c * 16);
          }
          cp_async_arrive(&full[s]);
        } else if (mode == kTile) {
          if (lane == 0) tma_2d(&maps.tile, &full[s], stage, k * kTileK, tile * kTileM);
        } else if (mode == kGather4Warps) {
          __syncwarp();
          tma_2d(&maps.x, &full[s], stage + (warp * 32 + lane) * 128, k * kTileK, rows[0]);
        } else {
          __syncwarp();
          const CUtensorMap* map = mode == kGather ? &maps.x : &maps.row;
          for (int j = 0; j < 4; ++j) {
            tma_2d(map, &full[s], stage + (lane * 4 + j) * 128, k * kTileK, rows[j]);
          }
        }
      } else if (consumer) {
        bar_wait(&full[s], round & 1);
        acc += reinterpret_cast<const unsigned*>(stage)[lane];
        __syncwarp();
        if (lane == 0) bar_arrive(&empty[s]);
      }
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

// One stage gathered row by row and one tile load of the pre-gathered rows: mismatched bytes.
__global__ void check(const __grid_constant__ Maps maps, const int* idx, unsigned* mismatches) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* a = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  unsigned char* b = a + kStageBytes;
  __shared__ uint64_t bars[2];
  const int lane = threadIdx.x;
  const int tile = blockIdx.x, k = blockIdx.y;
  if (lane == 0) {
    bar_init(&bars[0], 1);
    bar_init(&bars[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (lane == 0) {
    bar_expect(&bars[0], kStageBytes);
    bar_expect(&bars[1], kStageBytes);
    tma_2d(&maps.tile, &bars[1], b, k * kTileK, tile * kTileM);
  }
  __syncwarp();
  for (int j = 0; j < 4; ++j) {
    const int r = lane * 4 + j;
    tma_2d(&maps.x, &bars[0], a + r * 128, k * kTileK, idx[tile * kTileM + r]);
  }
  bar_wait(&bars[0], 0);
  bar_wait(&bars[1], 0);
  unsigned bad = 0;
  for (int i = lane; i < kStageBytes; i += 32) bad += a[i] != b[i];
  atomicAdd(mismatches, bad);
}

static PFN_cuTensorMapEncodeTiled_v12000 encode() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                         cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

static CUtensorMap map_2d(void* base, uint64_t rows, uint32_t box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {kH, rows};
  const cuuint64_t strides[1] = {kH * 2};
  const cuuint32_t box[2] = {kTileK, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box,
                              elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return m;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<uint16_t> hx(size_t(kT) * kH);
  for (size_t i = 0; i < hx.size(); ++i) hx[i] = uint16_t(0x3c00 + (i * 2654435761u % 977));
  std::vector<int> hidx(kM);
  for (int m = 0; m < kM; ++m) hidx[m] = int((uint64_t(m) * 2654435761u) % kT);
  std::vector<uint16_t> hrouted(size_t(kM) * kH);
  for (int m = 0; m < kM; ++m)
    for (int h = 0; h < kH; ++h) hrouted[size_t(m) * kH + h] = hx[size_t(hidx[m]) * kH + h];
  void *x, *routed;
  int* idx;
  unsigned* sink;
  CHECK(cudaMalloc(&x, hx.size() * 2));
  CHECK(cudaMalloc(&routed, hrouted.size() * 2));
  CHECK(cudaMalloc(&idx, kM * sizeof(int)));
  CHECK(cudaMalloc(&sink, 16));
  CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(routed, hrouted.data(), hrouted.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(idx, hidx.data(), kM * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(sink, 0, 16));
  Maps maps{map_2d(routed, kM, kTileM), map_2d(routed, kM, 1), map_2d(x, kT, 1)};
  const int smem_bytes = kStages * kStageBytes + 1024;
  CHECK(cudaFuncSetAttribute(fill, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  CHECK(cudaFuncSetAttribute(check, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             2 * kStageBytes + 1024));
  check<<<dim3(kM / kTileM, kH / kTileK), 32, 2 * kStageBytes + 1024>>>(maps, idx, sink);
  CHECK(cudaDeviceSynchronize());
  unsigned bad = 0;
  CHECK(cudaMemcpy(&bad, sink, 4, cudaMemcpyDeviceToHost));
  std::printf("check: %u mismatched bytes of %llu (gathered rows against the tile load)\n", bad,
              (unsigned long long)kM * kH * 2);
  const char* names[5] = {"tile (1 TMA a stage)", "rows (128 TMAs, contiguous)",
                          "gather (128 TMAs, x by index)", "gather (128 TMAs from 4 warps)",
                          "gather (cp.async, 4 warps)"};
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int round = 0; round < 2; ++round) {
    for (int mode = 0; mode < 5; ++mode) {
      fill<<<sms, 160, smem_bytes>>>(maps, x, idx, mode, kM / kTileM, sink);
      CHECK(cudaEventRecord(a));
      const int reps = 20;
      for (int r = 0; r < reps; ++r) {
        fill<<<sms, 160, smem_bytes>>>(maps, x, idx, mode, kM / kTileM, sink);
      }
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      ms /= reps;
      const double gbs = double(kM) * kRepeats * kH * 2 / (ms * 1e-3) / 1e9;
      std::printf("round %d %-32s %.3f ms  %.0f GB/s into shared memory (%d SMs)\n", round,
                  names[mode], ms, gbs, sms);
    }
  }
  return 0;
}
