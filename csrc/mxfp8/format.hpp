// MXFP8 layout constants shared by host checks and device code (plain C++, no CUDA keywords).
#pragma once

namespace mok::mxfp8 {

constexpr int kTile = 128;                               // rows and columns of one scale tile
constexpr int kBlock = 32;                               // elements sharing one E8M0 scale
constexpr int kTileScaleBytes = kTile * kTile / kBlock;  // 512 swizzled scale bytes per tile
constexpr int kMaxExponent = 127;                        // E8M0 exponent range is [-127, 127]

}  // namespace mok::mxfp8
