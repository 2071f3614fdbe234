// Position-sensitive RoIPool on the CPU: output channel c of bin b = (ph, pw) is
// the mean of input channel c * PH * PW + b over the bin quantized to input pixels.
// As in torchvision, forward bins end at row H - 1 / column W - 1 (the last row and
// column are never pooled); the backward is the gradient of exactly that forward.
// Forward work is split over blocks of input channels; backward over input channels,
// so no two threads add into the same gradient element.

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "../common.h"
#include "parallel_policy.h"
#include "ps_roi_common.h"
#include "roi_grid.h"

namespace opforge::cpu {
namespace {

// One bin of a roi in its input plane: the offset of its first pixel, its rows and columns
// (no pixel when either is 0).
struct BinSpan {
  int64_t offset, rows, cols;
  // At most 2 x 2 pixels, and at least one: most bins of a small roi.
  bool small() const { return rows > 0 && rows <= 2 && cols <= 2; }
};

template <typename acc_t, typename scalar_t>
acc_t sum_span(const scalar_t* p, const BinSpan& span, int64_t width) {
  acc_t sum = 0;
  for (int64_t h = 0; h < span.rows; ++h, p += width) {
    for (int64_t w = 0; w < span.cols; ++w) {
      sum += static_cast<acc_t>(p[w]);
    }
  }
  return sum;
}

// A small bin without branching on its size (the sizes vary bin to bin and mispredict): the
// pixels of the 2 x 2 square outside the bin add zero, in sum_span's order. The square stays
// in the plane: ps_roi_pool's bins end before its last row and column.
template <typename acc_t, typename scalar_t>
acc_t sum_small(const scalar_t* p, const BinSpan& span, int64_t width) {
  const bool two_cols = span.cols == 2, two_rows = span.rows == 2;
  const acc_t v0 = static_cast<acc_t>(p[0]), v1 = static_cast<acc_t>(p[1]);
  const acc_t v2 = static_cast<acc_t>(p[width]), v3 = static_cast<acc_t>(p[width + 1]);
  acc_t sum = 0;
  sum += v0;
  sum += two_cols ? v1 : acc_t(0);
  sum += two_rows ? v2 : acc_t(0);
  sum += two_rows && two_cols ? v3 : acc_t(0);
  return sum;
}

template <typename acc_t>
void add_small(acc_t* p, const BinSpan& span, int64_t width, acc_t value) {
  const bool two_cols = span.cols == 2, two_rows = span.rows == 2;
  p[0] += value;
  p[1] += two_cols ? value : acc_t(0);
  p[width] += two_rows ? value : acc_t(0);
  p[width + 1] += two_rows && two_cols ? value : acc_t(0);
}

inline BinSpan bin_span(const PoolBins& b, int64_t ph, int64_t pw, int64_t width) {
  const int64_t rows = std::max<int64_t>(b.h_end[ph] - b.h_start[ph], 0);
  const int64_t cols = std::max<int64_t>(b.w_end[pw] - b.w_start[pw], 0);
  return {b.h_start[ph] * width + b.w_start[pw], cols > 0 ? rows : 0, rows > 0 ? cols : 0};
}

// The forward walks the input channels in blocks of kChannelBlock, every roi reading one bin of
// each of the block's planes, so that the block's planes stay in cache across the rois (roi by
// roi, every roi read its own bins from all the planes, which came from memory: measured 1.45x
// slower on the bench row, 512 rois, 490 channels). A roi's entries of one block are contiguous
// in the output: input channel c is entry c of the roi, in bin c % (PH * PW).
constexpr int64_t kChannelBlock = 128;

template <typename scalar_t>
void ps_roi_pool_forward_impl(const Tensor& input, const Tensor& rois, Tensor& output,
                              Tensor& channel_mapping, double spatial_scale, int64_t pooled_h,
                              int64_t pooled_w) {
  const int64_t block = kChannelBlock;
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const int64_t plane_size = height * width;
  const int64_t bins = pooled_h * pooled_w;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  int32_t* mapping = channel_mapping.mutable_data_ptr<int32_t>();
  std::vector<BinSpan> spans(bins * num_rois);
  std::vector<int64_t> image_offset(num_rois);
  {
    PoolBins b;
    for (int64_t n = 0; n < num_rois; ++n) {
      compute_pool_bins(b, roi_p + n * 5, spatial_scale, height, width, pooled_h, pooled_w,
                        /*position_sensitive=*/true);
      for (int64_t bin = 0; bin < bins; ++bin) {
        spans[n * bins + bin] = bin_span(b, bin / pooled_w, bin % pooled_w, width);
      }
      image_offset[n] = b.batch_index * channels * plane_size;
    }
  }
  const int64_t pixels = pixels_per_roi(roi_p, num_rois, spatial_scale, height, width);
  const int64_t blocks = (channels + block - 1) / block;
  const int64_t block_work = total_work(num_rois * block, 1 + pixels / bins);
  parallel_for_work(blocks, block_work, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t c0 = blk * block;
      const int64_t c1 = std::min(channels, c0 + block);
      for (int64_t n = 0; n < num_rois; ++n) {
        const BinSpan* sp = spans.data() + n * bins;
        const scalar_t* planes = in + image_offset[n];
        scalar_t* o = out + n * channels;
        int32_t* m = mapping + n * channels;
        int64_t bin = c0 % bins;
        for (int64_t c = c0; c < c1; ++c) {
          const BinSpan& span = sp[bin];
          const scalar_t* p = planes + c * plane_size + span.offset;
          const acc_t sum =
              span.small() ? sum_small<acc_t>(p, span, width) : sum_span<acc_t>(p, span, width);
          o[c] = span.rows == 0
                     ? scalar_t(0)
                     : static_cast<scalar_t>(sum / static_cast<acc_t>(span.rows * span.cols));
          m[c] = static_cast<int32_t>(c);
          bin = bin + 1 == bins ? 0 : bin + 1;
        }
      }
    }
  });
}

// Adds value to every pixel of a bin (p: its first pixel).
template <typename acc_t>
inline void add_span(acc_t* p, const BinSpan& span, int64_t width, acc_t value) {
  if (span.small()) {
    add_small(p, span, width, value);
    return;
  }
  for (int64_t h = 0; h < span.rows; ++h, p += width) {
    for (int64_t w = 0; w < span.cols; ++w) {
      p[w] += value;
    }
  }
}

// grad_input arrives uninitialized (ps_roi_backward's impl_zeroes): each input channel's
// planes (of every image) are zeroed by the chunk that owns the channel, right before its
// first add into them, so the zeros are written into cache instead of in a pass of their own.
// No chunk adds into a channel it does not own.
template <typename scalar_t>
void ps_roi_pool_backward_impl(const Tensor& grad, const Tensor& rois,
                               const Tensor& channel_mapping, Tensor& grad_input,
                               double spatial_scale, int64_t pooled_h, int64_t pooled_w) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t batch = grad_input.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t height = grad_input.size(2);
  const int64_t width = grad_input.size(3);
  const int64_t plane_size = height * width;
  const int64_t image_size = channels * plane_size;
  const int64_t bins = pooled_h * pooled_w;
  const int64_t per_roi = grad.size(1) * bins;
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  acc_t* gi = grad_input.mutable_data_ptr<acc_t>();

  // Every roi's bins once, bin-major: the entries of one input channel (one bin, under the
  // forward's mapping) read their spans in roi order.
  std::vector<BinSpan> spans(bins * num_rois);
  std::vector<int64_t> image_offset(num_rois);
  {
    PoolBins b;
    for (int64_t n = 0; n < num_rois; ++n) {
      compute_pool_bins(b, roi_p + n * 5, spatial_scale, height, width, pooled_h, pooled_w,
                        /*position_sensitive=*/true);
      for (int64_t bin = 0; bin < bins; ++bin) {
        spans[bin * num_rois + n] = bin_span(b, bin / pooled_w, bin % pooled_w, width);
      }
      image_offset[n] = b.batch_index * image_size;
    }
  }
  const auto zero_channels = [&](int64_t c_begin, int64_t c_end) {
    for (int64_t b = 0; b < batch; ++b) {
      acc_t* planes = gi + b * image_size + c_begin * plane_size;
      std::fill(planes, planes + (c_end - c_begin) * plane_size, acc_t(0));
    }
  };
  const int32_t* mapping = channel_mapping.const_data_ptr<int32_t>();
  const bool forward_mapping = is_forward_mapping(mapping, num_rois, per_roi);
  const int64_t pixels = pixels_per_roi(roi_p, num_rois, spatial_scale, height, width);
  const int64_t work = total_work(total_work(num_rois, per_roi), 1 + pixels / bins);
  const int64_t channel_work = work / std::max<int64_t>(channels, 1) + batch * plane_size;
  parallel_for_work(channels, channel_work, [&](int64_t c_begin, int64_t c_end) {
    if (!forward_mapping) {
      // Any mapping: every chunk reads every entry, adding those of its own channels.
      zero_channels(c_begin, c_end);
      for_each_owned_entry(
          mapping, false, g, num_rois, per_roi, bins, c_begin, c_end,
          [&](int64_t n, int64_t e, int64_t bin, int64_t c_in) {
            const BinSpan& span = spans[bin * num_rois + n];
            if (span.rows == 0) {
              return;
            }
            const acc_t value =
                static_cast<acc_t>(g[n * per_roi + e]) / static_cast<acc_t>(span.rows * span.cols);
            add_span(gi + image_offset[n] + c_in * plane_size + span.offset, span, width, value);
          });
      return;
    }
    // The forward's mapping: channel c's entries are entry c of every roi. Plane by plane: the
    // channel's planes stay in cache while every roi adds into them.
    for (int64_t c = c_begin; c < c_end; ++c) {
      zero_channels(c, c + 1);
      const BinSpan* sp = spans.data() + (c % bins) * num_rois;
      const scalar_t* gc = g + c;
      acc_t* gi_c = gi + c * plane_size;
      for (int64_t n = 0; n < num_rois; ++n) {
        if (n + kAhead < num_rois) {
          prefetch(gc + (n + kAhead) * per_roi);
        }
        const BinSpan& span = sp[n];
        if (span.rows == 0) {
          continue;
        }
        const acc_t value =
            static_cast<acc_t>(gc[n * per_roi]) / static_cast<acc_t>(span.rows * span.cols);
        add_span(gi_c + image_offset[n] + span.offset, span, width, value);
      }
    }
  });
}

std::tuple<Tensor, Tensor> ps_roi_pool_forward_kernel(const Tensor& input, const Tensor& rois,
                                                      double spatial_scale, int64_t pooled_height,
                                                      int64_t pooled_width) {
  return ps_roi_forward("ps_roi_pool", input, rois, pooled_height, pooled_width,
                        /*sampling_ratio=*/0,
                        [&](auto scalar, const Tensor& input_c, const Tensor& rois_c,
                            Tensor& output, Tensor& channel_mapping) {
                          ps_roi_pool_forward_impl<decltype(scalar)>(input_c, rois_c, output,
                                                                     channel_mapping, spatial_scale,
                                                                     pooled_height, pooled_width);
                        });
}

Tensor ps_roi_pool_backward_kernel(const Tensor& grad, const Tensor& rois,
                                   const Tensor& channel_mapping, double spatial_scale,
                                   int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                   int64_t channels, int64_t height, int64_t width) {
  return ps_roi_backward(
      "_ps_roi_pool_backward", grad, rois, channel_mapping, pooled_height, pooled_width, batch_size,
      channels, height, width,
      /*sampling_ratio=*/0,
      [&](auto scalar, const Tensor& grad_c, const Tensor& rois_c, const Tensor& mapping_c,
          Tensor& grad_input) {
        ps_roi_pool_backward_impl<decltype(scalar)>(grad_c, rois_c, mapping_c, grad_input,
                                                    spatial_scale, pooled_height, pooled_width);
      },
      /*impl_zeroes=*/true);
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("ps_roi_pool", OPFORGE_KERNEL(ps_roi_pool_forward_kernel));
  m.impl("_ps_roi_pool_backward", OPFORGE_KERNEL(ps_roi_pool_backward_kernel));
}

}  // namespace opforge::cpu
