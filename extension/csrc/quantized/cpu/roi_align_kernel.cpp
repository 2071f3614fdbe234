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

namespace opforge::quantized_cpu {
namespace {

// One bilinear sample of a bin: four neighbours in the H*W plane and their weights
// (all zero for a sample outside the image).
struct Sample {
  int64_t pos[4];
  float w[4];
};

// Detectron's border rule: outside [-1, size] a sample is zero; below 0 it clamps
// to 0; past size - 1 it reads the last row (column).
Sample bilinear(float y, float x, int64_t height, int64_t width) {
  if (y < -1.0f || y > height || x < -1.0f || x > width) {
    return {{0, 0, 0, 0}, {0.f, 0.f, 0.f, 0.f}};
  }
  y = std::max(y, 0.f);
  x = std::max(x, 0.f);
  int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x);
  int64_t y_high, x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<float>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<float>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const float ly = y - y_low, lx = x - x_low;
  const float hy = 1.f - ly, hx = 1.f - lx;
  return {{y_low * width + x_low, y_low * width + x_high, y_high * width + x_low,
           y_high * width + x_high},
          {hy * hx, hy * lx, ly * hx, ly * lx}};
}

template <typename scalar_t>
void roi_align_impl(const at::Tensor& input, const std::vector<float>& rois, at::Tensor& output,
                    double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                    int64_t sampling_ratio, bool aligned) {
  using int_t = typename scalar_t::underlying;
  const int64_t num_rois = output.size(0), channels = input.size(1);
  const int64_t height = input.size(2), width = input.size(3);
  const at::Tensor values_t = input.int_repr().contiguous();
  const int_t* values = values_t.data_ptr<int_t>();
  int_t* out = reinterpret_cast<int_t*>(output.data_ptr<scalar_t>());
  const float scale = static_cast<float>(input.q_scale());
  const int64_t zero_point = input.q_zero_point();
  const float inv_scale = 1.0f / scale;
  const float fscale = static_cast<float>(spatial_scale);
  constexpr int64_t qmin = std::numeric_limits<int_t>::min();
  constexpr int64_t qmax = std::numeric_limits<int_t>::max();

  std::vector<Sample> samples;
  for (int64_t n = 0; n < num_rois; ++n) {
    const float* roi = rois.data() + n * 5;
    const float offset = aligned ? 0.5f : 0.f;
    const float start_w = roi[1] * fscale - offset, start_h = roi[2] * fscale - offset;
    const float end_w = roi[3] * fscale - offset, end_h = roi[4] * fscale - offset;
    float roi_w = end_w - start_w, roi_h = end_h - start_h;
    if (!aligned) {
      roi_w = std::max(roi_w, 1.f);
      roi_h = std::max(roi_h, 1.f);
    }
    const float bin_h = roi_h / pooled_h, bin_w = roi_w / pooled_w;
    const int64_t grid_h =
        sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(roi_h / pooled_h));
    const int64_t grid_w =
        sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(roi_w / pooled_w));
    const float count = static_cast<float>(std::max<int64_t>(grid_h * grid_w, 1));

    // The samples of every bin, shared by all channels, in bin then row-major order.
    samples.clear();
    for (int64_t ph = 0; ph < pooled_h; ++ph) {
      for (int64_t pw = 0; pw < pooled_w; ++pw) {
        for (int64_t iy = 0; iy < grid_h; ++iy) {
          const float y = start_h + ph * bin_h +
                          static_cast<float>(iy + .5f) * bin_h / static_cast<float>(grid_h);
          for (int64_t ix = 0; ix < grid_w; ++ix) {
            const float x = start_w + pw * bin_w +
                            static_cast<float>(ix + .5f) * bin_w / static_cast<float>(grid_w);
            samples.push_back(bilinear(y, x, height, width));
          }
        }
      }
    }
    for (int64_t c = 0; c < channels; ++c) {
      const int_t* plane = values + c * height * width;
      int_t* out_c = out + (n * channels + c) * pooled_h * pooled_w;
      const Sample* s = samples.data();
      for (int64_t bin = 0; bin < pooled_h * pooled_w; ++bin) {
        float sum = 0.f, sum_w = 0.f;
        for (int64_t k = 0; k < grid_h * grid_w; ++k, ++s) {
          sum += s->w[0] * static_cast<float>(plane[s->pos[0]]) +
                 s->w[1] * static_cast<float>(plane[s->pos[1]]) +
                 s->w[2] * static_cast<float>(plane[s->pos[2]]) +
                 s->w[3] * static_cast<float>(plane[s->pos[3]]);
          sum_w += s->w[0] + s->w[1] + s->w[2] + s->w[3];
        }
        float value = scale * (sum - static_cast<float>(zero_point) * sum_w);
        value /= count;
        int64_t q = static_cast<int64_t>(zero_point + std::nearbyint(value * inv_scale));
        out_c[bin] = static_cast<int_t>(std::min(std::max(q, qmin), qmax));
      }
    }
  }
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
