// RoIAlign on the CPU. For each roi the valid bilinear samples (taps) are
// computed once and reused for every channel. Forward work is split over
// (roi, channel) pairs; backward over channels, so no two threads ever add into
// the same input-gradient element.

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../common.h"
#include "contiguous.h"
#include "channels_last.h"
#include "parallel_policy.h"
#include "roi_grid.h"
#include "vector_clones.h"

namespace opforge::cpu {
namespace {

// Output bins of `block` consecutive channels of one roi: each tap is loaded once
// and applied to every channel plane of the block.
template <int block, typename scalar_t, typename acc_t>
void pool_channels(const RoiGrid<acc_t>& grid, const scalar_t* plane, int64_t plane_size,
                   scalar_t* out, int64_t bins) {
  for (int64_t bin = 0; bin < bins; ++bin) {
    acc_t sum[block] = {};
    for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
      const Tap<acc_t>& tap = grid.taps[t];
      for (int k = 0; k < block; ++k) {
        const scalar_t* p = plane + k * plane_size;
        sum[k] += tap.w[0] * static_cast<acc_t>(p[tap.pos[0]]) +
                  tap.w[1] * static_cast<acc_t>(p[tap.pos[1]]) +
                  tap.w[2] * static_cast<acc_t>(p[tap.pos[2]]) +
                  tap.w[3] * static_cast<acc_t>(p[tap.pos[3]]);
      }
    }
    for (int k = 0; k < block; ++k) {
      out[k * bins + bin] = static_cast<scalar_t>(sum[k] / grid.count);
    }
  }
}

// Channels-first: output bins of `block` consecutive channels of one roi, each tap loaded
// once and applied to every channel plane of the block.
template <typename scalar_t>
void roi_align_forward_planes(const Tensor& input, const Tensor& rois, Tensor& output,
                              double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                              int64_t sampling_ratio, bool aligned, int64_t samples) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  const int64_t bins = pooled_h * pooled_w;

  parallel_for_work(num_rois * channels, 4 * samples, [&](int64_t begin, int64_t end) {
    RoiGrid<acc_t> grid;
    const int64_t plane_size = height * width;
    int64_t index = begin;
    while (index < end) {
      const int64_t n = index / channels;
      const int64_t c = index % channels;
      compute_roi_grid<scalar_t, acc_t>("roi_align", grid, roi_p + n * 5,
                                        static_cast<acc_t>(spatial_scale), height, width, pooled_h,
                                        pooled_w, sampling_ratio, aligned);
      // The channels of roi n that fall in this chunk.
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

// One vector of channels of a bilinear sample, add_bilinear's expression. (A function, not a
// lambda: GCC does not inline a lambda into a target clone, even one marked always_inline.)
template <typename V, typename T>
[[gnu::always_inline]] inline V bilinear_sample(const V& w0, const V& w1, const V& w2, const V& w3,
                                                const T* p0, const T* p1, const T* p2,
                                                const T* p3) {
  return w0 * V::loadu(p0) + w1 * V::loadu(p1) + w2 * V::loadu(p2) + w3 * V::loadu(p3);
}

// The taps [tap, end) of one bin applied to kVecs vectors of channels of the channels-last
// image, summed in registers (one store per bin, not a load and a store per tap) and divided
// by the bin's sample count: each lane's operations are add_bilinear's and the channels-first
// loop's division, in the same order, so the means are the same.
template <int kVecs, typename acc_t>
[[gnu::always_inline]] inline void mean_taps(acc_t* out, const acc_t* image, const Tap<acc_t>* tap,
                                             const Tap<acc_t>* end, int64_t channels, acc_t count) {
  static_assert(kVecs >= 1 && kVecs <= 4);
  using V = Vec<acc_t>;
  constexpr int64_t L = V::size();
  // Named accumulators, not an array: GCC keeps an array of vectors on the stack, which makes
  // every tap wait on a store and a load.
  V a0(acc_t(0)), a1(acc_t(0)), a2(acc_t(0)), a3(acc_t(0));
  for (; tap != end; ++tap) {
    const V w0(tap->w[0]), w1(tap->w[1]), w2(tap->w[2]), w3(tap->w[3]);
    const acc_t* p0 = image + tap->pos[0] * channels;
    const acc_t* p1 = image + tap->pos[1] * channels;
    const acc_t* p2 = image + tap->pos[2] * channels;
    const acc_t* p3 = image + tap->pos[3] * channels;
    a0 = a0 + bilinear_sample(w0, w1, w2, w3, p0, p1, p2, p3);
    if constexpr (kVecs > 1) {
      a1 = a1 + bilinear_sample(w0, w1, w2, w3, p0 + L, p1 + L, p2 + L, p3 + L);
    }
    if constexpr (kVecs > 2) {
      a2 = a2 + bilinear_sample(w0, w1, w2, w3, p0 + 2 * L, p1 + 2 * L, p2 + 2 * L, p3 + 2 * L);
    }
    if constexpr (kVecs > 3) {
      a3 = a3 + bilinear_sample(w0, w1, w2, w3, p0 + 3 * L, p1 + 3 * L, p2 + 3 * L, p3 + 3 * L);
    }
  }
  const V n(count);
  (a0 / n).store(out);
  if constexpr (kVecs > 1) {
    (a1 / n).store(out + L);
  }
  if constexpr (kVecs > 2) {
    (a2 / n).store(out + 2 * L);
  }
  if constexpr (kVecs > 3) {
    (a3 / n).store(out + 3 * L);
  }
}

// One roi's bins as vectors of channels: means (bins, C) = the taps of each bin applied to the
// channels-last image (H, W, C), divided by the samples per bin. Same-type images are summed
// four vectors of channels at a time in registers, other types (and the channels after the
// last whole vector) through add_bilinear.
template <typename acc_t, typename elem_t>
[[gnu::always_inline]] inline void mean_roi_bins(acc_t* means, const elem_t* image,
                                                 const RoiGrid<acc_t>& grid, int64_t bins,
                                                 int64_t channels) {
  int64_t c_done = 0;  // channels [0, c_done) summed in registers
  if constexpr (std::is_same_v<acc_t, elem_t>) {
    constexpr int64_t lanes = Vec<acc_t>::size();
    c_done = channels - channels % lanes;
    const Tap<acc_t>* taps = grid.taps.data();
    for (int64_t bin = 0; bin < bins; ++bin) {
      acc_t* mean = means + bin * channels;
      const Tap<acc_t>* begin = taps + grid.bin_begin[bin];
      const Tap<acc_t>* end = taps + grid.bin_begin[bin + 1];
      int64_t c = 0;
      for (; c + 4 * lanes <= c_done; c += 4 * lanes) {
        mean_taps<4>(mean + c, image + c, begin, end, channels, grid.count);
      }
      switch ((c_done - c) / lanes) {
        case 3:
          mean_taps<3>(mean + c, image + c, begin, end, channels, grid.count);
          break;
        case 2:
          mean_taps<2>(mean + c, image + c, begin, end, channels, grid.count);
          break;
        case 1:
          mean_taps<1>(mean + c, image + c, begin, end, channels, grid.count);
          break;
        default:
          break;
      }
    }
    if (c_done == channels) {
      return;
    }
  }
  const int64_t rest = channels - c_done;
  for (int64_t bin = 0; bin < bins; ++bin) {
    acc_t* mean = means + bin * channels + c_done;
    zero_fill(mean, rest);
    for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
      const Tap<acc_t>& tap = grid.taps[t];
      add_bilinear(mean, image + tap.pos[0] * channels + c_done,
                   image + tap.pos[1] * channels + c_done, image + tap.pos[2] * channels + c_done,
                   image + tap.pos[3] * channels + c_done, tap.w, rest);
    }
    for (int64_t c = 0; c < rest; ++c) {
      mean[c] = mean[c] / grid.count;
    }
  }
}

// mean_roi_bins of a half or bfloat16 input's float copy, also compiled for AVX2 (without FMA:
// the same results on every machine, vector_clones.h).
OPFORGE_EXACT_VECTOR_CLONES void mean_roi_bins_wide(float* means, const float* image,
                                                    const RoiGrid<float>& grid, int64_t bins,
                                                    int64_t channels) {
  mean_roi_bins(means, image, grid, bins, channels);
}

// One roi of a float or double image: its bins' means, then written channels-first into `out`
// (C, bins) with register-tile transposes, in one clone (as above).
OPFORGE_EXACT_VECTOR_CLONES void roi_bins_wide(float* out, float* means, const float* image,
                                               const RoiGrid<float>& grid, int64_t bins,
                                               int64_t channels) {
  mean_roi_bins(means, image, grid, bins, channels);
  transpose_block<false>(means, channels, out, bins, bins, channels,
                         static_cast<const float*>(nullptr));
}
OPFORGE_EXACT_VECTOR_CLONES void roi_bins_wide(double* out, double* means, const double* image,
                                               const RoiGrid<double>& grid, int64_t bins,
                                               int64_t channels) {
  mean_roi_bins(means, image, grid, bins, channels);
  transpose_block<false>(means, channels, out, bins, bins, channels,
                         static_cast<const double*>(nullptr));
}

// channels_to_last for float and double, also compiled for AVX2 and AVX-512 (a transpose
// moves values: every clone gives the same result).
OPFORGE_VECTOR_CLONES void channels_to_last_wide(const float* src, float* dst, int64_t channels,
                                                 int64_t plane, int64_t c0, int64_t c1) {
  channels_to_last(src, dst, channels, plane, c0, c1);
}
OPFORGE_VECTOR_CLONES void channels_to_last_wide(const double* src, double* dst, int64_t channels,
                                                 int64_t plane, int64_t c0, int64_t c1) {
  channels_to_last(src, dst, channels, plane, c0, c1);
}

// Channels-last: `in` is (N, H, W, C). A roi's bins are summed as vectors of channels into
// a (bins, C) buffer, then written out channels-first.
template <typename scalar_t, typename elem_t>
void roi_align_forward_channels_last(const elem_t* in, const scalar_t* roi_p, scalar_t* out,
                                     int64_t num_rois, int64_t channels, int64_t height,
                                     int64_t width, double spatial_scale, int64_t pooled_h,
                                     int64_t pooled_w, int64_t sampling_ratio, bool aligned,
                                     int64_t samples) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t bins = pooled_h * pooled_w;
  // Vectors of channels: about one unit per sample and channel (four scalar ones: a quarter).
  parallel_for_work(num_rois, samples * channels, [&](int64_t begin, int64_t end) {
    RoiGrid<acc_t> grid;
    std::vector<acc_t> means(bins * channels);
    for (int64_t n = begin; n < end; ++n) {
      compute_roi_grid<scalar_t, acc_t>("roi_align", grid, roi_p + n * 5,
                                        static_cast<acc_t>(spatial_scale), height, width, pooled_h,
                                        pooled_w, sampling_ratio, aligned);
      const elem_t* image = in + grid.batch_index * height * width * channels;
      scalar_t* o = out + n * channels * bins;
      if constexpr (std::is_same_v<elem_t, acc_t> && std::is_same_v<scalar_t, acc_t>) {
        roi_bins_wide(o, means.data(), image, grid, bins, channels);
      } else {
        if constexpr (std::is_same_v<elem_t, acc_t>) {  // a half / bfloat16 input's float copy
          mean_roi_bins_wide(means.data(), image, grid, bins, channels);
        } else {
          mean_roi_bins(means.data(), image, grid, bins, channels);
        }
        for (int64_t c = 0; c < channels; ++c) {
          for (int64_t bin = 0; bin < bins; ++bin) {
            o[c * bins + bin] = static_cast<scalar_t>(means[bin * channels + c]);
          }
        }
      }
    }
  });
}

template <typename scalar_t>
void roi_align_forward_impl(const Tensor& input, const Tensor& rois, Tensor& output,
                            double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                            int64_t sampling_ratio, bool aligned) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t batch = input.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  const int64_t samples =
      samples_per_roi(roi_p, num_rois, spatial_scale, pooled_h, pooled_w, sampling_ratio);
  const bool vector_wide = channels >= Vec<acc_t>::size();
  if (vector_wide && is_channels_last(input)) {
    roi_align_forward_channels_last(input.const_data_ptr<scalar_t>(), roi_p, out, num_rois,
                                    channels, height, width, spatial_scale, pooled_h, pooled_w,
                                    sampling_ratio, aligned, samples);
    return;
  }
  const Tensor input_c = contiguous_planes(input);
  // Channels-first, a sample's four neighbours are four scattered loads per channel. When the
  // rois sample the images more than a few times over, transposing them to channels-last once
  // (one pass over the input) costs less than it saves.
  if (vector_wide && total_work(num_rois, samples) >= batch * height * width / 2) {
    // uninitialized: the transpose writes every element (a vector would zero it first)
    std::unique_ptr<acc_t[]> transposed(new acc_t[batch * channels * height * width]);
    const auto transpose = [](const scalar_t* src, acc_t* dst, int64_t c, int64_t plane, int64_t c0,
                              int64_t c1) {
      if constexpr (std::is_same_v<scalar_t, acc_t>) {
        channels_to_last_wide(src, dst, c, plane, c0, c1);
      } else {
        channels_to_last(src, dst, c, plane, c0, c1);
      }
    };
    to_channels_last(input_c.const_data_ptr<scalar_t>(), transposed.get(), batch, channels,
                     height * width, transpose);
    roi_align_forward_channels_last<scalar_t>(transposed.get(), roi_p, out, num_rois, channels,
                                              height, width, spatial_scale, pooled_h, pooled_w,
                                              sampling_ratio, aligned, samples);
    return;
  }
  roi_align_forward_planes<scalar_t>(input_c, rois, output, spatial_scale, pooled_h, pooled_w,
                                     sampling_ratio, aligned, samples);
}

template <typename scalar_t>
void roi_align_backward_impl(const Tensor& grad, const Tensor& rois, Tensor& grad_input,
                             double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                             int64_t sampling_ratio, bool aligned) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t height = grad_input.size(2);
  const int64_t width = grad_input.size(3);
  const scalar_t* g = grad.mutable_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.mutable_data_ptr<scalar_t>();
  acc_t* gi = grad_input.mutable_data_ptr<acc_t>();
  const int64_t bins = pooled_h * pooled_w;

  const int64_t samples =
      samples_per_roi(roi_p, num_rois, spatial_scale, pooled_h, pooled_w, sampling_ratio);
  // Every roi's grid once; then each chunk owns a range of channels and every roi adds only
  // into its own channel planes (a chunk costs no set-up: on a busy machine a thread that
  // starts late takes fewer chunks without repeating work).
  std::vector<RoiGrid<acc_t>> grids(num_rois);
  parallel_for_work(num_rois, 4 * samples, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      compute_roi_grid<scalar_t, acc_t>("_roi_align_backward", grids[n], roi_p + n * 5,
                                        static_cast<acc_t>(spatial_scale), height, width, pooled_h,
                                        pooled_w, sampling_ratio, aligned);
    }
  });
  parallel_for_work(
      channels, 4 * total_work(num_rois, samples), [&](int64_t c_begin, int64_t c_end) {
        for (int64_t n = 0; n < num_rois; ++n) {
          const RoiGrid<acc_t>& grid = grids[n];
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

Tensor roi_align_forward_kernel(const Tensor& input, const Tensor& rois, double spatial_scale,
                                int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                                bool aligned) {
  check_roi_inputs("roi_align", input, rois, pooled_height, pooled_width);
  check_sampling_ratio("roi_align", sampling_ratio, pooled_height, pooled_width);
  Tensor output = alloc_empty(input, {rois.size(0), input.size(1), pooled_height, pooled_width});
  if (output.numel() == 0) {
    return output;
  }
  const Tensor rois_c = as_contiguous(rois);
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_roi_align_forward_cpu", [&] {
    check_rois_values("roi_align", rois_c.mutable_data_ptr<scalar_t>(), rois_c.size(0),
                      input.size(0));
    roi_align_forward_impl<scalar_t>(input, rois_c, output, spatial_scale, pooled_height,
                                     pooled_width, sampling_ratio, aligned);
  });
  return output;
}

Tensor roi_align_backward_kernel(const Tensor& grad, const Tensor& rois, double spatial_scale,
                                 int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                 int64_t channels, int64_t height, int64_t width,
                                 int64_t sampling_ratio, bool aligned) {
  check_roi_backward_inputs("_roi_align_backward", grad, rois, pooled_height, pooled_width,
                            batch_size, channels, height, width);
  check_sampling_ratio("_roi_align_backward", sampling_ratio, pooled_height, pooled_width);
  const auto acc_dtype = opmath_dtype(grad.scalar_type());
  Tensor grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, acc_dtype);
  if (grad.numel() == 0 || grad_input.numel() == 0) {
    return to_dtype(grad_input, grad.scalar_type());
  }
  const Tensor grad_c = contiguous_planes(grad);
  const Tensor rois_c = as_contiguous(rois);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "opforge_roi_align_backward_cpu", [&] {
    check_rois_values("_roi_align_backward", rois_c.mutable_data_ptr<scalar_t>(), rois_c.size(0),
                      batch_size);
    roi_align_backward_impl<scalar_t>(grad_c, rois_c, grad_input, spatial_scale, pooled_height,
                                      pooled_width, sampling_ratio, aligned);
  });
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("roi_align", OPFORGE_KERNEL(roi_align_forward_kernel));
  m.impl("_roi_align_backward", OPFORGE_KERNEL(roi_align_backward_kernel));
}

}  // namespace opforge::cpu
