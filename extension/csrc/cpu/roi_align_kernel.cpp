// RoIAlign on the CPU. For each roi the bilinear sample positions and weights
// are computed once and reused for every channel. Forward work is split over
// (roi, channel) pairs; backward over channels, so no two threads ever add into
// the same input-gradient element.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../common.h"

namespace opforge::cpu {
namespace {

constexpr int64_t kMaxSamplesPerRoi = int64_t(1) << 24;

template <typename acc_t>
struct Sample {
  // Offsets of the four neighbours in an H*W plane and their bilinear weights.
  int64_t pos[4];
  acc_t w[4];
  bool valid;
};

template <typename acc_t>
struct RoiGrid {
  int64_t batch_index = 0;
  int64_t grid_h = 0;
  int64_t grid_w = 0;
  acc_t count = 1;  // samples averaged per bin
  std::vector<Sample<acc_t>> samples;  // [pooled_h][pooled_w][grid_h][grid_w]
};

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
      grid_h * grid_w * pooled_h * pooled_w <= double(kMaxSamplesPerRoi),
      "roi_align: a roi of ", double(roi_h), " x ", double(roi_w), " (after spatial_scale) with sampling_ratio ",
      sampling_ratio, " needs more than ", kMaxSamplesPerRoi, " samples; pass a small positive sampling_ratio");
  grid.grid_h = static_cast<int64_t>(grid_h);
  grid.grid_w = static_cast<int64_t>(grid_w);
  grid.count = static_cast<acc_t>(std::max<int64_t>(grid.grid_h * grid.grid_w, 1));
  grid.samples.resize(pooled_h * pooled_w * grid.grid_h * grid.grid_w);

  Sample<acc_t>* s = grid.samples.data();
  for (int64_t ph = 0; ph < pooled_h; ++ph) {
    for (int64_t pw = 0; pw < pooled_w; ++pw) {
      for (int64_t iy = 0; iy < grid.grid_h; ++iy) {
        const acc_t y0 = start_h + ph * bin_h +
            static_cast<acc_t>(iy + .5f) * bin_h / static_cast<acc_t>(grid.grid_h);
        for (int64_t ix = 0; ix < grid.grid_w; ++ix, ++s) {
          acc_t y = y0;
          acc_t x = start_w + pw * bin_w +
              static_cast<acc_t>(ix + .5f) * bin_w / static_cast<acc_t>(grid.grid_w);
          // Written so that NaN and empty planes also land here.
          if (!(y >= acc_t(-1) && y <= height && x >= acc_t(-1) && x <= width) ||
              height == 0 || width == 0) {
            s->valid = false;
            continue;
          }
          y = std::max(y, acc_t(0));
          x = std::max(x, acc_t(0));
          int64_t y_low = static_cast<int64_t>(y);
          int64_t x_low = static_cast<int64_t>(x);
          int64_t y_high, x_high;
          if (y_low >= height - 1) {
            y_high = y_low = height - 1;
            y = static_cast<acc_t>(y_low);
          } else {
            y_high = y_low + 1;
          }
          if (x_low >= width - 1) {
            x_high = x_low = width - 1;
            x = static_cast<acc_t>(x_low);
          } else {
            x_high = x_low + 1;
          }
          const acc_t ly = y - y_low, lx = x - x_low;
          const acc_t hy = acc_t(1) - ly, hx = acc_t(1) - lx;
          s->valid = true;
          s->pos[0] = y_low * width + x_low;
          s->pos[1] = y_low * width + x_high;
          s->pos[2] = y_high * width + x_low;
          s->pos[3] = y_high * width + x_high;
          s->w[0] = hy * hx;
          s->w[1] = hy * lx;
          s->w[2] = ly * hx;
          s->w[3] = ly * lx;
        }
      }
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
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, bins * 4));

  at::parallel_for(0, num_rois * channels, grain, [&](int64_t begin, int64_t end) {
    RoiGrid<acc_t> grid;
    int64_t current = -1;
    for (int64_t index = begin; index < end; ++index) {
      const int64_t n = index / channels;
      const int64_t c = index % channels;
      if (n != current) {
        compute_roi_grid<scalar_t, acc_t>(
            grid, roi_p + n * 5, static_cast<acc_t>(spatial_scale), height, width,
            pooled_h, pooled_w, sampling_ratio, aligned);
        current = n;
      }
      const scalar_t* plane = in + (grid.batch_index * channels + c) * height * width;
      scalar_t* out_plane = out + index * bins;
      const int64_t per_bin = grid.grid_h * grid.grid_w;
      const Sample<acc_t>* s = grid.samples.data();
      for (int64_t bin = 0; bin < bins; ++bin) {
        acc_t sum = 0;
        for (int64_t k = 0; k < per_bin; ++k, ++s) {
          if (s->valid) {
            sum += s->w[0] * static_cast<acc_t>(plane[s->pos[0]]) +
                s->w[1] * static_cast<acc_t>(plane[s->pos[1]]) +
                s->w[2] * static_cast<acc_t>(plane[s->pos[2]]) +
                s->w[3] * static_cast<acc_t>(plane[s->pos[3]]);
          }
        }
        out_plane[bin] = static_cast<scalar_t>(sum / grid.count);
      }
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
      const int64_t per_bin = grid.grid_h * grid.grid_w;
      for (int64_t c = c_begin; c < c_end; ++c) {
        const scalar_t* g_plane = g + (n * channels + c) * bins;
        acc_t* gi_plane = gi + (grid.batch_index * channels + c) * height * width;
        const Sample<acc_t>* s = grid.samples.data();
        for (int64_t bin = 0; bin < bins; ++bin) {
          const acc_t value = static_cast<acc_t>(g_plane[bin]) / grid.count;
          for (int64_t k = 0; k < per_bin; ++k, ++s) {
            if (s->valid) {
              for (int q = 0; q < 4; ++q) {
                gi_plane[s->pos[q]] += s->w[q] * value;
              }
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
