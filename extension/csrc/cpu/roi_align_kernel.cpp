// RoIAlign on the CPU. For each roi the valid bilinear samples (taps) are
// computed once and reused for every channel. Forward work is split over
// (roi, channel) pairs; backward over channels, so no two threads ever add into
// the same input-gradient element.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../common.h"

namespace opforge::cpu {
namespace {

// Bilinear sampling is separable: a sample at (y, x) is valid when both its row
// and its column are, and its weights are products of row and column weights.
// So each roi keeps, per output row (column), only the sample rows (columns)
// that touch the image: memory is O(pooled * grid) and samples outside the image
// cost nothing, however large the roi.
constexpr int64_t kMaxSamplesPerAxis = int64_t(1) << 24;

template <typename acc_t>
struct AxisSample {
  int64_t low, high;  // neighbouring rows (columns)
  acc_t l, h;  // weights of high and low
};

struct AxisRange {
  int64_t begin, end;  // into the samples vector
};

// One valid bilinear sample: the offsets of its four neighbours in an H*W plane
// and their weights. Built per roi from the axis samples, reused by every channel.
template <typename acc_t>
struct Tap {
  int32_t pos[4];
  acc_t w[4];
};

template <typename acc_t>
struct RoiGrid {
  int64_t batch_index = 0;
  acc_t count = 1;  // samples averaged per bin, valid or not
  std::vector<AxisSample<acc_t>> ys, xs;
  std::vector<AxisRange> y_range, x_range;  // one per output row / column
  std::vector<Tap<acc_t>> taps;
  std::vector<int64_t> bin_begin;  // taps of bin b: [bin_begin[b], bin_begin[b + 1])
};

// Appends the valid samples of one axis, following the Detectron border rule:
// outside [-1, size] a sample is zero; below 0 it clamps to 0; past size-1 to size-1.
template <typename acc_t>
void fill_axis(
    std::vector<AxisSample<acc_t>>& samples,
    std::vector<AxisRange>& ranges,
    acc_t start,
    acc_t bin,
    int64_t pooled,
    int64_t grid,
    int64_t size) {
  samples.clear();
  ranges.resize(pooled);
  for (int64_t p = 0; p < pooled; ++p) {
    ranges[p].begin = static_cast<int64_t>(samples.size());
    for (int64_t i = 0; i < grid; ++i) {
      acc_t v = start + p * bin + static_cast<acc_t>(i + .5f) * bin / static_cast<acc_t>(grid);
      // Written so that NaN and empty planes are invalid too.
      if (!(v >= acc_t(-1) && v <= size) || size == 0) {
        continue;
      }
      v = std::max(v, acc_t(0));
      int64_t low = static_cast<int64_t>(v);
      int64_t high;
      if (low >= size - 1) {
        high = low = size - 1;
        v = static_cast<acc_t>(low);
      } else {
        high = low + 1;
      }
      const acc_t l = v - low;
      samples.push_back({low, high, l, acc_t(1) - l});
    }
    ranges[p].end = static_cast<int64_t>(samples.size());
  }
}

template <typename scalar_t, typename acc_t>
void compute_roi_grid(
    RoiGrid<acc_t>& grid,
    const scalar_t* roi,
    acc_t spatial_scale,
    int64_t height,
    int64_t width,
    int64_t pooled_h,
    int64_t pooled_w,
    int64_t sampling_ratio,
    bool aligned) {
  const acc_t offset = aligned ? acc_t(0.5) : acc_t(0);
  grid.batch_index = static_cast<int64_t>(roi[0]);
  const acc_t start_w = static_cast<acc_t>(roi[1]) * spatial_scale - offset;
  const acc_t start_h = static_cast<acc_t>(roi[2]) * spatial_scale - offset;
  const acc_t end_w = static_cast<acc_t>(roi[3]) * spatial_scale - offset;
  const acc_t end_h = static_cast<acc_t>(roi[4]) * spatial_scale - offset;
  acc_t roi_w = end_w - start_w;
  acc_t roi_h = end_h - start_h;
  if (!aligned) {
    // Legacy behaviour: malformed rois are forced to be at least 1x1.
    roi_w = std::max(roi_w, acc_t(1));
    roi_h = std::max(roi_h, acc_t(1));
  }
  const acc_t bin_h = roi_h / static_cast<acc_t>(pooled_h);
  const acc_t bin_w = roi_w / static_cast<acc_t>(pooled_w);
  // Adaptive sampling: about one sample per input pixel in each bin.
  const double grid_h = sampling_ratio > 0 ? sampling_ratio : std::max(0.0, std::ceil(double(roi_h / pooled_h)));
  const double grid_w = sampling_ratio > 0 ? sampling_ratio : std::max(0.0, std::ceil(double(roi_w / pooled_w)));
  TORCH_CHECK(
      grid_h * pooled_h <= double(kMaxSamplesPerAxis) && grid_w * pooled_w <= double(kMaxSamplesPerAxis),
      "roi_align: a roi of ", double(roi_h), " x ", double(roi_w), " (after spatial_scale) with sampling_ratio ",
      sampling_ratio, " needs more than ", kMaxSamplesPerAxis,
      " samples along one side; check the rois or pass a small positive sampling_ratio");
  grid.count = static_cast<acc_t>(std::max<int64_t>(int64_t(grid_h) * int64_t(grid_w), 1));
  fill_axis(grid.ys, grid.y_range, start_h, bin_h, pooled_h, int64_t(grid_h), height);
  fill_axis(grid.xs, grid.x_range, start_w, bin_w, pooled_w, int64_t(grid_w), width);

  grid.taps.clear();
  grid.bin_begin.assign(1, 0);
  for (int64_t ph = 0; ph < pooled_h; ++ph) {
    const AxisRange yr = grid.y_range[ph];
    for (int64_t pw = 0; pw < pooled_w; ++pw) {
      const AxisRange xr = grid.x_range[pw];
      for (int64_t iy = yr.begin; iy < yr.end; ++iy) {
        const AxisSample<acc_t>& y = grid.ys[iy];
        for (int64_t ix = xr.begin; ix < xr.end; ++ix) {
          const AxisSample<acc_t>& x = grid.xs[ix];
          grid.taps.push_back(
              {{static_cast<int32_t>(y.low * width + x.low), static_cast<int32_t>(y.low * width + x.high),
                static_cast<int32_t>(y.high * width + x.low), static_cast<int32_t>(y.high * width + x.high)},
               {y.h * x.h, y.h * x.l, y.l * x.h, y.l * x.l}});
        }
      }
      grid.bin_begin.push_back(static_cast<int64_t>(grid.taps.size()));
    }
  }
}

// Output bins of `block` consecutive channels of one roi: each tap is loaded once
// and applied to every channel plane of the block.
template <int block, typename scalar_t, typename acc_t>
void pool_channels(
    const RoiGrid<acc_t>& grid,
    const scalar_t* plane,
    int64_t plane_size,
    scalar_t* out,
    int64_t bins) {
  for (int64_t bin = 0; bin < bins; ++bin) {
    acc_t sum[block] = {};
    for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
      const Tap<acc_t>& tap = grid.taps[t];
      for (int k = 0; k < block; ++k) {
        const scalar_t* p = plane + k * plane_size;
        sum[k] += tap.w[0] * static_cast<acc_t>(p[tap.pos[0]]) + tap.w[1] * static_cast<acc_t>(p[tap.pos[1]]) +
            tap.w[2] * static_cast<acc_t>(p[tap.pos[2]]) + tap.w[3] * static_cast<acc_t>(p[tap.pos[3]]);
      }
    }
    for (int k = 0; k < block; ++k) {
      out[k * bins + bin] = static_cast<scalar_t>(sum[k] / grid.count);
    }
  }
}

template <typename scalar_t>
void roi_align_forward_impl(
    const at::Tensor& input,
    const at::Tensor& rois,
    at::Tensor& output,
    double spatial_scale,
    int64_t pooled_h,
    int64_t pooled_w,
    int64_t sampling_ratio,
    bool aligned) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const scalar_t* in = input.data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.data_ptr<scalar_t>();
  scalar_t* out = output.data_ptr<scalar_t>();
  const int64_t bins = pooled_h * pooled_w;
  // Enough work per chunk that a small call (a few rois) runs on one thread: waking the
  // pool costs more than it saves there, and much more on a loaded machine.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, bins * 4));

  at::parallel_for(0, num_rois * channels, grain, [&](int64_t begin, int64_t end) {
    RoiGrid<acc_t> grid;
    const int64_t plane_size = height * width;
    int64_t index = begin;
    while (index < end) {
      const int64_t n = index / channels;
      const int64_t c = index % channels;
      compute_roi_grid<scalar_t, acc_t>(
          grid, roi_p + n * 5, static_cast<acc_t>(spatial_scale), height, width, pooled_h, pooled_w,
          sampling_ratio, aligned);
      // The channels of roi n that fall in this thread's range.
      const int64_t c_end = std::min(channels, c + (end - index));
      const scalar_t* plane = in + (grid.batch_index * channels + c) * plane_size;
      scalar_t* out_plane = out + index * bins;
      int64_t k = c;
      for (; k + 4 <= c_end; k += 4, plane += 4 * plane_size, out_plane += 4 * bins) {
        pool_channels<4>(grid, plane, plane_size, out_plane, bins);
      }
      for (; k < c_end; ++k, plane += plane_size, out_plane += bins) {
        pool_channels<1>(grid, plane, plane_size, out_plane, bins);
      }
      index += c_end - c;
    }
  });
}

template <typename scalar_t>
void roi_align_backward_impl(
    const at::Tensor& grad,
    const at::Tensor& rois,
    at::Tensor& grad_input,
    double spatial_scale,
    int64_t pooled_h,
    int64_t pooled_w,
    int64_t sampling_ratio,
    bool aligned) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t height = grad_input.size(2);
  const int64_t width = grad_input.size(3);
  const scalar_t* g = grad.data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.data_ptr<scalar_t>();
  acc_t* gi = grad_input.data_ptr<acc_t>();
  const int64_t bins = pooled_h * pooled_w;

  // Each thread owns a range of channels: every roi adds only into its own channel planes.
  at::parallel_for(0, channels, 1, [&](int64_t c_begin, int64_t c_end) {
    RoiGrid<acc_t> grid;
    for (int64_t n = 0; n < num_rois; ++n) {
      compute_roi_grid<scalar_t, acc_t>(
          grid, roi_p + n * 5, static_cast<acc_t>(spatial_scale), height, width,
          pooled_h, pooled_w, sampling_ratio, aligned);
      for (int64_t c = c_begin; c < c_end; ++c) {
        const scalar_t* g_plane = g + (n * channels + c) * bins;
        acc_t* gi_plane = gi + (grid.batch_index * channels + c) * height * width;
        for (int64_t bin = 0; bin < bins; ++bin) {
          const acc_t value = static_cast<acc_t>(g_plane[bin]) / grid.count;
          for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
            const Tap<acc_t>& tap = grid.taps[t];
            for (int q = 0; q < 4; ++q) {
              gi_plane[tap.pos[q]] += tap.w[q] * value;
            }
          }
        }
      }
    }
  });
}

at::Tensor roi_align_forward_kernel(
    const at::Tensor& input,
    const at::Tensor& rois,
    double spatial_scale,
    int64_t pooled_height,
    int64_t pooled_width,
    int64_t sampling_ratio,
    bool aligned) {
  check_roi_inputs("roi_align", input, rois, pooled_height, pooled_width);
  TORCH_CHECK(
      input.size(2) * input.size(3) <= std::numeric_limits<int32_t>::max(),
      "roi_align: input planes (H * W) of more than 2^31 - 1 elements are not supported on the CPU");
  at::Tensor output = at::empty(
      {rois.size(0), input.size(1), pooled_height, pooled_width}, input.options());
  if (output.numel() == 0) {
    return output;
  }
  const at::Tensor input_c = input.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "opforge_roi_align_forward_cpu", [&] {
        check_rois_values("roi_align", rois_c.data_ptr<scalar_t>(), rois_c.size(0), input.size(0));
        roi_align_forward_impl<scalar_t>(
            input_c, rois_c, output, spatial_scale, pooled_height, pooled_width,
            sampling_ratio, aligned);
      });
  return output;
}

at::Tensor roi_align_backward_kernel(
    const at::Tensor& grad,
    const at::Tensor& rois,
    double spatial_scale,
    int64_t pooled_height,
    int64_t pooled_width,
    int64_t batch_size,
    int64_t channels,
    int64_t height,
    int64_t width,
    int64_t sampling_ratio,
    bool aligned) {
  TORCH_CHECK(
      height * width <= std::numeric_limits<int32_t>::max(),
      "_roi_align_backward: input planes (height * width) of more than 2^31 - 1 elements are not supported on the CPU");
  check_roi_backward_inputs(
      "_roi_align_backward", grad, rois, pooled_height, pooled_width, batch_size,
      channels, height, width);
  TORCH_CHECK(
      is_supported_float(grad),
      "_roi_align_backward: grad must be a floating point tensor, got ", grad.scalar_type());
  const auto acc_dtype = at::toOpMathType(grad.scalar_type());
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_dtype));
  if (grad.numel() == 0 || grad_input.numel() == 0) {
    return grad_input.to(grad.scalar_type());
  }
  const at::Tensor grad_c = grad.contiguous();
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "opforge_roi_align_backward_cpu", [&] {
        check_rois_values("_roi_align_backward", rois_c.data_ptr<scalar_t>(), rois_c.size(0), batch_size);
        roi_align_backward_impl<scalar_t>(
            grad_c, rois_c, grad_input, spatial_scale, pooled_height, pooled_width,
            sampling_ratio, aligned);
      });
  return grad_input.to(grad.scalar_type());
}

} // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_kernel));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_kernel));
}

} // namespace opforge::cpu
