// RoIAlign on quantized tensors (QuantizedCPU: quint8, qint8, qint32), with the
// results torchvision gives: the rois are dequantized, each bin averages its
// bilinear samples of the raw integer values, the sum is dequantized once
// (scale * (sum - zero_point * sum of weights)), and the average is
// requantized with the input's scale and zero point (round half to even,
// clamped to the dtype). As in torchvision, a quantized input holds one image:
// batch indices are not representable in every quantization.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../../common.h"
#include "../../cpu/channels_last.h"
#include "../../cpu/parallel_policy.h"
#include "../../cpu/roi_grid.h"

namespace opforge::quantized_cpu {
namespace {

// Per bin, the sum of its taps' weights, in the order the taps are summed: what the zero
// point contributes to the bin's sum of raw values. (A sample outside the image has no tap:
// its weights are zero and adding them changes nothing.)
inline void bin_weights(const cpu::RoiGrid<float>& grid, float* sum_w, int64_t bins) {
  for (int64_t bin = 0; bin < bins; ++bin) {
    float w = 0.f;
    for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
      const cpu::Tap<float>& tap = grid.taps[t];
      w += tap.w[0] + tap.w[1] + tap.w[2] + tap.w[3];
    }
    sum_w[bin] = w;
  }
}

// The bin's output from its sum over raw integer values and the sum of its weights:
// dequantized once, averaged, requantized (round half to even, clamped to the dtype).
template <typename int_t>
inline int_t requantize(float sum, float sum_w, float scale, float inv_scale, int64_t zero_point,
                        float count) {
  constexpr int64_t qmin = std::numeric_limits<int_t>::min();
  constexpr int64_t qmax = std::numeric_limits<int_t>::max();
  float value = scale * (sum - static_cast<float>(zero_point) * sum_w);
  value /= count;
  const int64_t q = static_cast<int64_t>(zero_point + std::nearbyint(value * inv_scale));
  return static_cast<int_t>(std::min(std::max(q, qmin), qmax));
}

// Channels-first, one channel plane at a time: each tap's four raw values.
template <typename int_t>
void roi_align_planes(const int_t* values, const float* rois, int_t* out, int64_t num_rois,
                      int64_t channels, int64_t height, int64_t width, float spatial_scale,
                      int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio, bool aligned,
                      float scale, int64_t zero_point) {
  const int64_t bins = pooled_h * pooled_w;
  const float inv_scale = 1.0f / scale;
  cpu::RoiGrid<float> grid;
  std::vector<float> sum_w(bins);
  for (int64_t n = 0; n < num_rois; ++n) {
    cpu::compute_roi_grid<float, float>("roi_align", grid, rois + n * 5, spatial_scale, height,
                                        width, pooled_h, pooled_w, sampling_ratio, aligned);
    bin_weights(grid, sum_w.data(), bins);
    for (int64_t c = 0; c < channels; ++c) {
      const int_t* plane = values + c * height * width;
      int_t* out_c = out + (n * channels + c) * bins;
      for (int64_t bin = 0; bin < bins; ++bin) {
        float sum = 0.f;
        for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
          const cpu::Tap<float>& tap = grid.taps[t];
          sum += tap.w[0] * static_cast<float>(plane[tap.pos[0]]) +
                 tap.w[1] * static_cast<float>(plane[tap.pos[1]]) +
                 tap.w[2] * static_cast<float>(plane[tap.pos[2]]) +
                 tap.w[3] * static_cast<float>(plane[tap.pos[3]]);
        }
        out_c[bin] = requantize<int_t>(sum, sum_w[bin], scale, inv_scale, zero_point, grid.count);
      }
    }
  }
}

// Channels-last: `image` is the raw values as float, (H, W, C). A roi's bins are summed as
// vectors of channels (cpu/channels_last.h), each channel in the order of the planes' loop.
template <typename int_t>
void roi_align_channels_last(const float* image, const float* rois, int_t* out, int64_t num_rois,
                             int64_t channels, int64_t height, int64_t width, float spatial_scale,
                             int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio,
                             bool aligned, float scale, int64_t zero_point, int64_t samples) {
  const int64_t bins = pooled_h * pooled_w;
  const float inv_scale = 1.0f / scale;
  cpu::parallel_for_work(num_rois, samples * channels, [&](int64_t begin, int64_t end) {
    cpu::RoiGrid<float> grid;
    std::vector<float> sums(bins * channels);
    std::vector<float> sum_w(bins);
    for (int64_t n = begin; n < end; ++n) {
      cpu::compute_roi_grid<float, float>("roi_align", grid, rois + n * 5, spatial_scale, height,
                                          width, pooled_h, pooled_w, sampling_ratio, aligned);
      bin_weights(grid, sum_w.data(), bins);
      cpu::zero_fill(sums.data(), bins * channels);
      for (int64_t bin = 0; bin < bins; ++bin) {
        float* sum = sums.data() + bin * channels;
        for (int64_t t = grid.bin_begin[bin]; t < grid.bin_begin[bin + 1]; ++t) {
          const cpu::Tap<float>& tap = grid.taps[t];
          cpu::add_bilinear(sum, image + tap.pos[0] * channels, image + tap.pos[1] * channels,
                            image + tap.pos[2] * channels, image + tap.pos[3] * channels, tap.w,
                            channels);
        }
      }
      int_t* o = out + n * channels * bins;
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t bin = 0; bin < bins; ++bin) {
          o[c * bins + bin] = requantize<int_t>(sums[bin * channels + c], sum_w[bin], scale,
                                                inv_scale, zero_point, grid.count);
        }
      }
    }
  });
}

template <typename scalar_t>
void roi_align_impl(const at::Tensor& input, const std::vector<float>& rois, at::Tensor& output,
                    double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                    int64_t sampling_ratio, bool aligned) {
  using int_t = typename scalar_t::underlying;
  const int64_t num_rois = output.size(0), channels = input.size(1);
  const int64_t height = input.size(2), width = input.size(3);
  int_t* out = reinterpret_cast<int_t*>(output.data_ptr<scalar_t>());
  const float scale = static_cast<float>(input.q_scale());
  const int64_t zero_point = input.q_zero_point();
  const float fscale = static_cast<float>(spatial_scale);
  const int64_t samples = cpu::samples_per_roi(rois.data(), num_rois, spatial_scale, pooled_h,
                                               pooled_w, sampling_ratio);
  // When the rois sample the image more than a few times over, one pass converting it to
  // channels-last floats costs less than the scattered loads it saves.
  // A contiguous input's integers are read where they are, and converted on the extension's
  // threads: int_repr() and copy_ would each run on torch's OpenMP team, which on a busy
  // machine waits a scheduler time slice for its second thread (issue 28).
  at::Tensor ints;  // a non-contiguous input's integers, made contiguous
  const int_t* raw = nullptr;
  if (input.is_contiguous()) {
    raw = reinterpret_cast<const int_t*>(input.const_data_ptr<scalar_t>());
  } else {
    ints = input.int_repr().contiguous();
    raw = ints.const_data_ptr<int_t>();
  }
  if (cpu::total_work(num_rois, samples) >= height * width / 2) {
    at::Tensor image = at::empty({height, width, channels}, input.options().dtype(at::kFloat));
    cpu::to_channels_last<int_t, float>(raw, image.mutable_data_ptr<float>(), 1, channels,
                                        height * width);
    roi_align_channels_last<int_t>(image.const_data_ptr<float>(), rois.data(), out, num_rois,
                                   channels, height, width, fscale, pooled_h, pooled_w,
                                   sampling_ratio, aligned, scale, zero_point, samples);
    return;
  }
  roi_align_planes<int_t>(raw, rois.data(), out, num_rois, channels, height, width, fscale,
                          pooled_h, pooled_w, sampling_ratio, aligned, scale, zero_point);
}

at::Tensor roi_align_kernel(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                            int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                            bool aligned) {
  check_roi_shapes("roi_align", input, rois);
  TORCH_CHECK(input.is_quantized() && rois.is_quantized() &&
                  input.qscheme() == at::kPerTensorAffine && rois.qscheme() == at::kPerTensorAffine,
              "roi_align: a quantized input needs rois quantized too, both per tensor (affine)");
  TORCH_CHECK(input.scalar_type() == rois.scalar_type(),
              "roi_align: input and rois must have the same dtype, got ", input.scalar_type(),
              " and ", rois.scalar_type());
  TORCH_CHECK(input.size(0) == 1,
              "roi_align: Only one image per batch is allowed when the input is quantized "
              "(as in torchvision), got batch size ",
              input.size(0));
  check_roi_output_size("roi_align", input, pooled_height, pooled_width);
  check_sampling_ratio("roi_align", sampling_ratio, pooled_height, pooled_width);
  at::Tensor output =
      at::_empty_affine_quantized({rois.size(0), input.size(1), pooled_height, pooled_width},
                                  input.options(), input.q_scale(), input.q_zero_point());
  if (output.numel() == 0) {
    return output;
  }
  // Dequantized rois: scale * (q - zero_point), as torch dequantizes one value.
  const at::Tensor rois_int = rois.int_repr().to(at::kLong).contiguous();
  const int64_t* r = rois_int.data_ptr<int64_t>();
  const float rois_scale = static_cast<float>(rois.q_scale());
  const int64_t rois_zero_point = rois.q_zero_point();
  std::vector<float> rois_f(rois.numel());
  for (size_t i = 0; i < rois_f.size(); ++i) {
    rois_f[i] = rois_scale * static_cast<float>(r[i] - rois_zero_point);
  }
  check_rois_values("roi_align", rois_f.data(), rois.size(0), 1);
  AT_DISPATCH_QINT_TYPES(input.scalar_type(), "opforge_roi_align_quantized_cpu", [&] {
    roi_align_impl<scalar_t>(input, rois_f, output, spatial_scale, pooled_height, pooled_width,
                             sampling_ratio, aligned);
  });
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, QuantizedCPU, m) {
  m.impl("roi_align", TORCH_FN(roi_align_kernel));
}

}  // namespace opforge::quantized_cpu
