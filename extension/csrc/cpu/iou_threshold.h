// The IoU threshold of the CPU nms kernels (float and quantized), as the loop compares it.
#pragma once

#include <cmath>
#include <limits>

namespace opforge::cpu {

// The largest acc_t at or below `threshold`: an acc_t IoU is above it exactly when the IoU is
// above `threshold` compared as a double, as torchvision's CPU kernel compares (0.2 as a
// float is above 0.2: an IoU of exactly 1/5 is suppressed). The loop stays in acc_t: comparing
// in double there made it 7x slower.
template <typename acc_t>
acc_t threshold_at_or_below(double threshold) {
  acc_t t = static_cast<acc_t>(threshold);
  if (static_cast<double>(t) > threshold) {
    t = std::nextafter(t, -std::numeric_limits<acc_t>::infinity());
  }
  return t;
}

}  // namespace opforge::cpu
