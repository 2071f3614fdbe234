// Bilinear sampling of one (height, width) plane with the Detectron border rule,
// shared by the roi_align and ps_roi_align CUDA kernels (forward and backward).
#pragma once

#include <cstdint>

namespace opforge::cuda {

// The four neighbours of a sample and their weights. A sample outside
// [-1, height] x [-1, width] (or at a NaN position) has all offsets -1 and weights 0.
template <typename acc_t>
struct BilinearCorners {
  int64_t o1, o2, o3, o4;  // offsets into the plane: (low, low), (low, high), (high, low), (high, high)
  acc_t w1, w2, w3, w4;
};

template <typename acc_t>
__device__ __forceinline__ BilinearCorners<acc_t> bilinear_corners(
    int64_t height, int64_t width, acc_t y, acc_t x) {
  BilinearCorners<acc_t> c;
  // Written so that NaN positions land here too.
  if (!(y >= acc_t(-1) && y <= acc_t(height) && x >= acc_t(-1) && x <= acc_t(width))) {
    c.o1 = c.o2 = c.o3 = c.o4 = -1;
    c.w1 = c.w2 = c.w3 = c.w4 = acc_t(0);
    return c;
  }
  if (y <= acc_t(0)) y = acc_t(0);
  if (x <= acc_t(0)) x = acc_t(0);
  int64_t y_low = static_cast<int64_t>(y);
  int64_t x_low = static_cast<int64_t>(x);
  int64_t y_high = y_low + 1;
  int64_t x_high = x_low + 1;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<acc_t>(y_low);
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<acc_t>(x_low);
  }
  const acc_t ly = y - static_cast<acc_t>(y_low);
  const acc_t lx = x - static_cast<acc_t>(x_low);
  const acc_t hy = acc_t(1) - ly;
  const acc_t hx = acc_t(1) - lx;
  c.w1 = hy * hx;
  c.w2 = hy * lx;
  c.w3 = ly * hx;
  c.w4 = ly * lx;
  c.o1 = y_low * width + x_low;
  c.o2 = y_low * width + x_high;
  c.o3 = y_high * width + x_low;
  c.o4 = y_high * width + x_high;
  return c;
}

// The sample's value; 0 outside the plane.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t bilinear_sample(
    const scalar_t* __restrict__ plane, int64_t height, int64_t width, acc_t y, acc_t x) {
  const BilinearCorners<acc_t> c = bilinear_corners<acc_t>(height, width, y, x);
  if (c.o1 < 0) {
    return acc_t(0);
  }
  return c.w1 * static_cast<acc_t>(plane[c.o1]) + c.w2 * static_cast<acc_t>(plane[c.o2]) +
      c.w3 * static_cast<acc_t>(plane[c.o3]) + c.w4 * static_cast<acc_t>(plane[c.o4]);
}

// Scatters `grad` over the sample's four neighbours (nothing outside the plane).
template <typename acc_t>
__device__ __forceinline__ void bilinear_scatter(
    acc_t* plane, int64_t height, int64_t width, acc_t y, acc_t x, acc_t grad) {
  const BilinearCorners<acc_t> c = bilinear_corners<acc_t>(height, width, y, x);
  if (c.o1 < 0) {
    return;
  }
  gpuAtomicAdd(plane + c.o1, grad * c.w1);
  gpuAtomicAdd(plane + c.o2, grad * c.w2);
  gpuAtomicAdd(plane + c.o3, grad * c.w3);
  gpuAtomicAdd(plane + c.o4, grad * c.w4);
}

}  // namespace opforge::cuda
