// Bounds shared by the host checks (common.h) and device code that cannot include common.h
// (csrc/cuda/<op>_device.cu, see cuda/launch.h). Plain C++, no torch header.
#pragma once

#include <cstdint>

namespace opforge {

// A fixed sampling_ratio bounds every roi's bilinear samples without reading the rois.
inline constexpr int64_t kMaxSamplesPerRoi = int64_t(1) << 24;

}  // namespace opforge
