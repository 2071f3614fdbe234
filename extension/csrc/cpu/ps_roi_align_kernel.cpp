// Position-sensitive RoIAlign on the CPU. Output channel c of bin b = (ph, pw)
// averages the bilinear samples of input channel c * PH * PW + b inside that bin.
// A roi's sampling grid (cpu/roi_grid.h) is built once and reused by every output
// channel. Forward work is split over (roi, output channel) pairs; backward over
// input channels, so no two threads ever add into the same gradient element. (Going
// plane by plane, as ps_roi_pool's forward does, measured 1.4x-1.9x slower here: each
// plane then walks every roi's grid.)

#include <cmath>
#include <limits>
#include <tuple>

#include "../common.h"
#include "parallel_policy.h"
#include "ps_roi_common.h"
#include "roi_grid.h"

namespace opforge::cpu {
namespace {

// torchvision divides by the raw adaptive grid product: a roi whose adaptive grid is
// 0 along a side (its size in (-PH, 0]) averages 0 samples over 0, which is NaN.
template <typename acc_t>
bool averages_nothing(const RoiGrid<acc_t>& grid, int64_t pooled_h, int64_t pooled_w,
                      int64_t sampling_ratio) {
  if (sampling_ratio > 0) {
    return false;
  }
  return std::ceil(double(grid.roi_h / pooled_h)) == 0.0 ||
         std::ceil(double(grid.roi_w / pooled_w)) == 0.0;
}

template <typename scalar_t>
void ps_roi_align_forward_impl(const Tensor& input, const Tensor& rois, Tensor& output,
                               Tensor& channel_mapping, double spatial_scale, int64_t pooled_h,
                               int64_t pooled_w, int64_t sampling_ratio) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const int64_t bins = pooled_h * pooled_w;
  const int64_t channels_out = channels / bins;
  const int64_t plane_size = height * width;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  int32_t* mapping = channel_mapping.mutable_data_ptr<int32_t>();
  // Each (roi, output channel) samples every bin once.
  const int64_t samples =
      samples_per_roi(roi_p, rois.size(0), spatial_scale, pooled_h, pooled_w, sampling_ratio);

  parallel_for_work(rois.size(0) * channels_out, 4 * samples, [&](int64_t begin, int64_t end) {
    RoiGrid<acc_t> grid;
    int64_t current = -1;
    bool nan_roi = false;
    for (int64_t index = begin; index < end; ++index) {
      const int64_t n = index / channels_out;
      const int64_t c_out = index % channels_out;
      if (n != current) {
        compute_roi_grid<scalar_t, acc_t>("ps_roi_align", grid, roi_p + n * 5,
                                          static_cast<acc_t>(spatial_scale), height, width,
                                          pooled_h, pooled_w, sampling_ratio, /*aligned=*/true);
        nan_roi = averages_nothing(grid, pooled_h, pooled_w, sampling_ratio);
        current = n;
      }
      const int64_t c_first = c_out * bins;
      const scalar_t* planes = in + (grid.batch_index * channels + c_first) * plane_size;
      // Each bin reads another plane: ask for a bin's first sample kAhead bins on (the next
      // output channel's planes follow this one's).
      const int64_t ahead_end = (c_out + 1 < channels_out ? 2 : 1) * bins;
      for (int64_t bin = 0; bin < bins; ++bin) {
        const int64_t next = bin + kAhead;
        if (next < ahead_end) {
          const int64_t t = grid.bin_begin[next % bins];
          if (t < grid.bin_begin[next % bins + 1]) {
            prefetch(planes + next * plane_size + grid.taps[t].pos[0]);
            prefetch(planes + next * plane_size + grid.taps[t].pos[3]);
          }
        }
        const scalar_t* p = planes + bin * plane_size;
        acc_t sum = 0;
        for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
          const Tap<acc_t>& tap = grid.taps[t];
          sum += tap.w[0] * static_cast<acc_t>(p[tap.pos[0]]) +
                 tap.w[1] * static_cast<acc_t>(p[tap.pos[1]]) +
                 tap.w[2] * static_cast<acc_t>(p[tap.pos[2]]) +
                 tap.w[3] * static_cast<acc_t>(p[tap.pos[3]]);
        }
        out[index * bins + bin] = static_cast<scalar_t>(
            nan_roi ? std::numeric_limits<acc_t>::quiet_NaN() : sum / grid.count);
        mapping[index * bins + bin] = static_cast<int32_t>(c_first + bin);
      }
    }
  });
}

template <typename scalar_t>
void ps_roi_align_backward_impl(const Tensor& grad, const Tensor& rois,
                                const Tensor& channel_mapping, Tensor& grad_input,
                                double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                                int64_t sampling_ratio) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t height = grad_input.size(2);
  const int64_t width = grad_input.size(3);
  const int64_t plane_size = height * width;
  const int64_t bins = pooled_h * pooled_w;
  const int64_t per_roi = grad.size(1) * bins;  // grad entries of one roi
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  acc_t* gi = grad_input.mutable_data_ptr<acc_t>();

  // Every roi's grid once; then its taps bin-major (the entries of one input channel, one bin
  // under the forward's mapping, read them in roi order): bin b of roi n has the taps
  // taps[tap_begin[b * num_rois + n]] .. taps[tap_begin[b * num_rois + n + 1] - 1]. Each chunk
  // of input channels adds its own grad entries (ps_roi_common.h).
  const int64_t samples =
      samples_per_roi(roi_p, num_rois, spatial_scale, pooled_h, pooled_w, sampling_ratio);
  std::vector<Tap<acc_t>> taps;
  std::vector<int64_t> tap_begin(bins * num_rois + 1, 0);
  std::vector<acc_t> count(num_rois);
  std::vector<int64_t> batch_index(num_rois);
  {
    std::vector<RoiGrid<acc_t>> grids(num_rois);
    parallel_for_work(num_rois, 4 * samples, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        compute_roi_grid<scalar_t, acc_t>("_ps_roi_align_backward", grids[n], roi_p + n * 5,
                                          static_cast<acc_t>(spatial_scale), height, width,
                                          pooled_h, pooled_w, sampling_ratio, /*aligned=*/true);
      }
    });
    int64_t total = 0;
    for (int64_t n = 0; n < num_rois; ++n) {
      total += static_cast<int64_t>(grids[n].taps.size());
      count[n] = grids[n].count;
      batch_index[n] = grids[n].batch_index;
    }
    taps.reserve(total);
    for (int64_t bin = 0; bin < bins; ++bin) {
      for (int64_t n = 0; n < num_rois; ++n) {
        const RoiGrid<acc_t>& grid = grids[n];
        taps.insert(taps.end(), grid.taps.begin() + grid.bin_begin[bin],
                    grid.taps.begin() + grid.bin_begin[bin + 1]);
        tap_begin[bin * num_rois + n + 1] = static_cast<int64_t>(taps.size());
      }
    }
  }
  const int32_t* mapping = channel_mapping.const_data_ptr<int32_t>();
  const bool forward_mapping = is_forward_mapping(mapping, num_rois, per_roi);
  const int64_t work = total_work(total_work(num_rois, per_roi), 1 + 4 * samples / bins);
  parallel_for_work(
      channels, work / std::max<int64_t>(channels, 1), [&](int64_t c_begin, int64_t c_end) {
        for_each_owned_entry(mapping, forward_mapping, g, num_rois, per_roi, bins, c_begin, c_end,
                             [&](int64_t n, int64_t e, int64_t bin, int64_t c_in) {
                               const int64_t at = bin * num_rois + n;
                               const acc_t value =
                                   static_cast<acc_t>(g[n * per_roi + e]) / count[n];
                               acc_t* plane = gi + (batch_index[n] * channels + c_in) * plane_size;
                               for (int64_t t = tap_begin[at]; t < tap_begin[at + 1]; ++t) {
                                 const Tap<acc_t>& tap = taps[t];
                                 for (int q = 0; q < 4; ++q) {
                                   plane[tap.pos[q]] += tap.w[q] * value;
                                 }
                               }
                             });
      });
}

std::tuple<Tensor, Tensor> ps_roi_align_forward_kernel(const Tensor& input, const Tensor& rois,
                                                       double spatial_scale, int64_t pooled_height,
                                                       int64_t pooled_width,
                                                       int64_t sampling_ratio) {
  return ps_roi_forward("ps_roi_align", input, rois, pooled_height, pooled_width, sampling_ratio,
                        [&](auto scalar, const Tensor& input_c, const Tensor& rois_c,
                            Tensor& output, Tensor& channel_mapping) {
                          ps_roi_align_forward_impl<decltype(scalar)>(
                              input_c, rois_c, output, channel_mapping, spatial_scale,
                              pooled_height, pooled_width, sampling_ratio);
                        });
}

Tensor ps_roi_align_backward_kernel(const Tensor& grad, const Tensor& rois,
                                    const Tensor& channel_mapping, double spatial_scale,
                                    int64_t pooled_height, int64_t pooled_width,
                                    int64_t sampling_ratio, int64_t batch_size, int64_t channels,
                                    int64_t height, int64_t width) {
  return ps_roi_backward("_ps_roi_align_backward", grad, rois, channel_mapping, pooled_height,
                         pooled_width, batch_size, channels, height, width, sampling_ratio,
                         [&](auto scalar, const Tensor& grad_c, const Tensor& rois_c,
                             const Tensor& mapping_c, Tensor& grad_input) {
                           ps_roi_align_backward_impl<decltype(scalar)>(
                               grad_c, rois_c, mapping_c, grad_input, spatial_scale, pooled_height,
                               pooled_width, sampling_ratio);
                         });
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("ps_roi_align", OPFORGE_KERNEL(ps_roi_align_forward_kernel));
  m.impl("_ps_roi_align_backward", OPFORGE_KERNEL(ps_roi_align_backward_kernel));
}

}  // namespace opforge::cpu
