// The sampling grid of a roi and bilinear sampling of one (height, width) plane with
// the Detectron border rule, shared by the roi_align and ps_roi_align CUDA kernels
// (forward and backward).
#pragma once

#include "device.cuh"

#include <cstdint>

namespace opforge::cuda {

// The four neighbours of a sample and their weights. A sample outside
// [-1, height] x [-1, width] (or at a NaN position) has all offsets -1 and weights 0.
template <typename acc_t>
struct BilinearCorners {
  int64_t o1, o2, o3,
      o4;  // offsets into the plane: (low, low), (low, high), (high, low), (high, high)
  acc_t w1, w2, w3, w4;
};

template <typename acc_t>
__device__ __forceinline__ BilinearCorners<acc_t> bilinear_corners(int64_t height, int64_t width,
                                                                   acc_t y, acc_t x) {
  BilinearCorners<acc_t> c;
  // Written so that NaN positions land here too.
  if (!(y >= acc_t(-1) && y <= acc_t(height) && x >= acc_t(-1) && x <= acc_t(width))) {
    c.o1 = c.o2 = c.o3 = c.o4 = -1;
    c.w1 = c.w2 = c.w3 = c.w4 = acc_t(0);
    return c;
  }
  if (y <= acc_t(0))
    y = acc_t(0);
  if (x <= acc_t(0))
    x = acc_t(0);
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
__device__ __forceinline__ acc_t bilinear_sample(const scalar_t* __restrict__ plane, int64_t height,
                                                 int64_t width, acc_t y, acc_t x) {
  const BilinearCorners<acc_t> c = bilinear_corners<acc_t>(height, width, y, x);
  if (c.o1 < 0) {
    return acc_t(0);
  }
  return c.w1 * static_cast<acc_t>(plane[c.o1]) + c.w2 * static_cast<acc_t>(plane[c.o2]) +
         c.w3 * static_cast<acc_t>(plane[c.o3]) + c.w4 * static_cast<acc_t>(plane[c.o4]);
}

// Scatters `grad` over the sample's four neighbours (nothing outside the plane).
template <typename acc_t>
__device__ __forceinline__ void bilinear_scatter(acc_t* plane, int64_t height, int64_t width,
                                                 acc_t y, acc_t x, acc_t grad) {
  const BilinearCorners<acc_t> c = bilinear_corners<acc_t>(height, width, y, x);
  if (c.o1 < 0) {
    return;
  }
  OPFORGE_ATOMIC_ADD(plane + c.o1, grad * c.w1);
  OPFORGE_ATOMIC_ADD(plane + c.o2, grad * c.w2);
  OPFORGE_ATOMIC_ADD(plane + c.o3, grad * c.w3);
  OPFORGE_ATOMIC_ADD(plane + c.o4, grad * c.w4);
}

// Adaptive sampling of a huge roi would keep the GPU busy for hours: past kMaxSamplesPerRoi
// (common.h; a fixed sampling_ratio past it is refused up front) the roi contributes 0.

// The regular grid of bilinear samples inside each bin of one roi.
template <typename acc_t>
struct RoiGeometry {
  bool valid;  // batch index in range, finite coordinates, a bounded sample count
  int64_t batch;
  acc_t start_y, start_x, bin_h, bin_w;
  int64_t grid_h, grid_w;  // samples per bin side (0 for an empty adaptive grid)
  acc_t count;             // what a bin's sum is divided by
};

// aligned: boxes shift by -0.5 pixel (else they are at least 1x1, the legacy rule).
// empty_is_nan: ps_roi_align divides by the raw adaptive grid product, as torchvision
// does, so a grid of 0 along a side averages to NaN; roi_align divides by at least 1.
template <typename scalar_t, typename acc_t>
__device__ RoiGeometry<acc_t> roi_geometry(const scalar_t* __restrict__ roi, int64_t batch_size,
                                           acc_t spatial_scale, int64_t pooled_height,
                                           int64_t pooled_width, int64_t sampling_ratio,
                                           bool aligned, bool empty_is_nan) {
  RoiGeometry<acc_t> g;
  g.valid = roi_is_valid<scalar_t, acc_t>(roi, batch_size);
  if (!g.valid) {
    return g;
  }
  g.batch = static_cast<int64_t>(static_cast<acc_t>(roi[0]));
  const acc_t offset = aligned ? acc_t(0.5) : acc_t(0);
  g.start_x = static_cast<acc_t>(roi[1]) * spatial_scale - offset;
  g.start_y = static_cast<acc_t>(roi[2]) * spatial_scale - offset;
  const acc_t end_x = static_cast<acc_t>(roi[3]) * spatial_scale - offset;
  const acc_t end_y = static_cast<acc_t>(roi[4]) * spatial_scale - offset;
  acc_t roi_w = end_x - g.start_x;
  acc_t roi_h = end_y - g.start_y;
  if (!aligned) {
    // Legacy behaviour: malformed rois are forced to be 1x1.
    roi_w = roi_w > acc_t(1) ? roi_w : acc_t(1);
    roi_h = roi_h > acc_t(1) ? roi_h : acc_t(1);
  }
  g.bin_h = roi_h / static_cast<acc_t>(pooled_height);
  g.bin_w = roi_w / static_cast<acc_t>(pooled_width);
  // Adaptive sampling: about one sample per input pixel in each bin. Counted in double
  // first, so a huge roi is refused before any integer conversion.
  const double raw_h =
      sampling_ratio > 0 ? double(sampling_ratio) : ceil(static_cast<double>(g.bin_h));
  const double raw_w =
      sampling_ratio > 0 ? double(sampling_ratio) : ceil(static_cast<double>(g.bin_w));
  const double grid_h = fmax(0.0, raw_h);
  const double grid_w = fmax(0.0, raw_w);
  g.valid =
      grid_h * grid_w * double(pooled_height) * double(pooled_width) <= double(kMaxSamplesPerRoi);
  if (!g.valid) {
    return g;
  }
  g.grid_h = static_cast<int64_t>(grid_h);
  g.grid_w = static_cast<int64_t>(grid_w);
  const int64_t samples = g.grid_h * g.grid_w;
  g.count = static_cast<acc_t>(samples > 1 ? samples : 1);
  if (empty_is_nan && (raw_h == 0.0 || raw_w == 0.0)) {
    g.count = acc_t(0);
  }
  return g;
}

// Calls fn(y, x) for every sample of bin (ph, pw).
template <typename acc_t, typename Fn>
__device__ __forceinline__ void for_each_sample(const RoiGeometry<acc_t>& g, int64_t ph, int64_t pw,
                                                Fn&& fn) {
  for (int64_t iy = 0; iy < g.grid_h; ++iy) {
    const acc_t y = g.start_y + static_cast<acc_t>(ph) * g.bin_h +
                    (static_cast<acc_t>(iy) + acc_t(0.5)) * g.bin_h / static_cast<acc_t>(g.grid_h);
    for (int64_t ix = 0; ix < g.grid_w; ++ix) {
      const acc_t x =
          g.start_x + static_cast<acc_t>(pw) * g.bin_w +
          (static_cast<acc_t>(ix) + acc_t(0.5)) * g.bin_w / static_cast<acc_t>(g.grid_w);
      fn(y, x);
    }
  }
}

}  // namespace opforge::cuda
