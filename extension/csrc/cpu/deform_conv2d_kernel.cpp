// CPU kernels for opforge::deform_conv2d and opforge::_deform_conv2d_backward.
//
// The forward is "bilinear im2col + GEMM": each batch chunk is expanded into a
// column matrix of shape (channels * kh * kw, chunk * out_h * out_w), which one
// batched GEMM per chunk multiplies with the (grouped) weight. The backward
// reuses the same column layout. Every sampling loop runs under
// at::parallel_for; tasks are split so that no two tasks ever write the same
// element (no atomics, no per-thread reduction buffers).
//
// Sampling semantics (shared with torchvision.ops.deform_conv2d): a point
// (y, x) with y <= -1, y >= height, x <= -1 or x >= width samples 0; otherwise
// it is the bilinear interpolation of its four neighbours, where neighbours
// outside the image count as 0.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "../ops/deform_conv2d.h"

namespace opforge::ops {
namespace {

// Positions processed together by one task: small enough for the per-block
// sampling tables to stay in L1/L2.
constexpr int64_t kPositionBlock = 256;
// Upper bound on elements of one column buffer; a chunk holds at least one image.
constexpr int64_t kColumnBudget = int64_t(1) << 23;

using Geometry = DeformConv2dGeometry;

int64_t chunk_images(const Geometry& g) {
  const int64_t per_image = std::max<int64_t>(1, g.channels * g.kernel_size() * g.out_size());
  return std::max<int64_t>(1, std::min<int64_t>(g.batch, kColumnBudget / per_image));
}

// The four bilinear neighbours of one sampling point: plane indices (-1 when the
// neighbour is outside the image) and their weights, mask not included.
template <typename scalar_t>
struct Corners {
  int64_t idx[4];
  scalar_t w[4];
  // Fractional parts, needed for coordinate gradients.
  scalar_t ly, lx;
  bool inside;  // false when the point samples 0 as a whole
  bool nan;     // a coordinate is NaN: the sample and its coordinate gradients are NaN
};

template <typename scalar_t>
inline void compute_corners(scalar_t y, scalar_t x, int64_t height, int64_t width,
                            Corners<scalar_t>& c) {
  // Written so that NaN coordinates fail it: floor(NaN) has no integer value.
  c.inside = y > -1 && y < height && x > -1 && x < width;
  c.nan = std::isnan(y) || std::isnan(x);
  if (!c.inside) {
    for (int q = 0; q < 4; ++q) {
      c.idx[q] = -1;
      c.w[q] = 0;
    }
    c.ly = c.lx = 0;
    return;
  }
  const int64_t y0 = static_cast<int64_t>(std::floor(y));
  const int64_t x0 = static_cast<int64_t>(std::floor(x));
  const int64_t y1 = y0 + 1;
  const int64_t x1 = x0 + 1;
  const scalar_t ly = y - static_cast<scalar_t>(y0);
  const scalar_t lx = x - static_cast<scalar_t>(x0);
  const scalar_t hy = 1 - ly;
  const scalar_t hx = 1 - lx;
  const bool vy0 = y0 >= 0, vy1 = y1 <= height - 1;
  const bool vx0 = x0 >= 0, vx1 = x1 <= width - 1;
  c.idx[0] = (vy0 && vx0) ? y0 * width + x0 : -1;
  c.idx[1] = (vy0 && vx1) ? y0 * width + x1 : -1;
  c.idx[2] = (vy1 && vx0) ? y1 * width + x0 : -1;
  c.idx[3] = (vy1 && vx1) ? y1 * width + x1 : -1;
  c.w[0] = hy * hx;
  c.w[1] = hy * lx;
  c.w[2] = ly * hx;
  c.w[3] = ly * lx;
  c.ly = ly;
  c.lx = lx;
}

// Sampling tables for one (image, offset group, kernel tap) and a block of
// output positions [p_begin, p_end).
template <typename scalar_t>
void compute_block_corners(const Geometry& g, const scalar_t* offset, const scalar_t* mask,
                           int64_t image, int64_t offset_group, int64_t tap, int64_t p_begin,
                           int64_t p_end, Corners<scalar_t>* corners, scalar_t* masks) {
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t i = tap / g.kernel_w;
  const int64_t j = tap % g.kernel_w;
  const scalar_t* off_y =
      offset + ((image * g.offset_groups + offset_group) * 2 * kk + 2 * tap) * out_size;
  const scalar_t* off_x = off_y + out_size;
  const scalar_t* msk =
      g.use_mask ? mask + ((image * g.offset_groups + offset_group) * kk + tap) * out_size
                 : nullptr;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t oh = p / g.out_w;
    const int64_t ow = p % g.out_w;
    const scalar_t y =
        static_cast<scalar_t>(oh * g.stride_h - g.pad_h + i * g.dilation_h) + off_y[p];
    const scalar_t x =
        static_cast<scalar_t>(ow * g.stride_w - g.pad_w + j * g.dilation_w) + off_x[p];
    compute_corners(y, x, g.height, g.width, corners[p - p_begin]);
    masks[p - p_begin] = msk ? msk[p] : scalar_t(1);
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// columns[(c * kk + tap), local_image * out_size + p] =
//     mask * bilinear(input[image, c], y(p, tap), x(p, tap))
template <typename scalar_t>
void deformable_im2col(const Geometry& g, const scalar_t* input, const scalar_t* offset,
                       const scalar_t* mask, int64_t first_image, int64_t n_images,
                       scalar_t* columns) {
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t plane = g.height * g.width;
  const int64_t n_cols = n_images * out_size;
  const int64_t cpg = g.channels_per_offset_group();
  const int64_t blocks = ceil_div(out_size, kPositionBlock);
  const int64_t tasks = n_images * g.offset_groups * kk * blocks;

  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Corners<scalar_t>> corners(kPositionBlock);
    std::vector<scalar_t> masks(kPositionBlock);
    for (int64_t t = begin; t < end; ++t) {
      int64_t rest = t;
      const int64_t block = rest % blocks;
      rest /= blocks;
      const int64_t tap = rest % kk;
      rest /= kk;
      const int64_t og = rest % g.offset_groups;
      const int64_t local = rest / g.offset_groups;
      const int64_t image = first_image + local;
      const int64_t p0 = block * kPositionBlock;
      const int64_t p1 = std::min(out_size, p0 + kPositionBlock);
      compute_block_corners(g, offset, mask, image, og, tap, p0, p1, corners.data(), masks.data());
      for (int64_t c = og * cpg; c < (og + 1) * cpg; ++c) {
        const scalar_t* in = input + (image * g.channels + c) * plane;
        scalar_t* col = columns + (c * kk + tap) * n_cols + local * out_size;
        for (int64_t p = p0; p < p1; ++p) {
          const Corners<scalar_t>& cr = corners[p - p0];
          scalar_t v = 0;
          for (int q = 0; q < 4; ++q) {
            if (cr.idx[q] >= 0) {
              v += cr.w[q] * in[cr.idx[q]];
            }
          }
          col[p] = cr.inside ? masks[p - p0] * v
                             : (cr.nan ? std::numeric_limits<scalar_t>::quiet_NaN() : scalar_t(0));
        }
      }
    }
  });
}

// grad_input[image, c] += sum over taps and positions of
//     mask * bilinear weight * grad_columns.
// One task owns a set of whole (image, channel) planes, so writes never race.
template <typename scalar_t>
void deformable_col2im(const Geometry& g, const scalar_t* grad_columns, const scalar_t* offset,
                       const scalar_t* mask, int64_t first_image, int64_t n_images,
                       scalar_t* grad_input) {
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t plane = g.height * g.width;
  const int64_t n_cols = n_images * out_size;
  const int64_t cpg = g.channels_per_offset_group();
  // Split each offset group's channels so that there are enough tasks to keep
  // every thread busy, while each task still reuses its sampling tables.
  const int64_t want = 4 * static_cast<int64_t>(at::get_num_threads());
  const int64_t base = n_images * g.offset_groups;
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(cpg, ceil_div(want, base)));
  const int64_t per_split = ceil_div(cpg, splits);
  const int64_t tasks = base * splits;

  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Corners<scalar_t>> corners(kPositionBlock);
    std::vector<scalar_t> masks(kPositionBlock);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t split = t % splits;
      const int64_t og = (t / splits) % g.offset_groups;
      const int64_t local = t / (splits * g.offset_groups);
      const int64_t image = first_image + local;
      const int64_t c_begin = og * cpg + split * per_split;
      const int64_t c_end = std::min(og * cpg + cpg, c_begin + per_split);
      if (c_begin >= c_end) {
        continue;
      }
      for (int64_t tap = 0; tap < kk; ++tap) {
        for (int64_t p0 = 0; p0 < out_size; p0 += kPositionBlock) {
          const int64_t p1 = std::min(out_size, p0 + kPositionBlock);
          compute_block_corners(g, offset, mask, image, og, tap, p0, p1, corners.data(),
                                masks.data());
          for (int64_t c = c_begin; c < c_end; ++c) {
            scalar_t* gin = grad_input + (image * g.channels + c) * plane;
            const scalar_t* gcol = grad_columns + (c * kk + tap) * n_cols + local * out_size;
            for (int64_t p = p0; p < p1; ++p) {
              const Corners<scalar_t>& cr = corners[p - p0];
              if (!cr.inside) {
                continue;
              }
              const scalar_t gm = masks[p - p0] * gcol[p];
              for (int q = 0; q < 4; ++q) {
                if (cr.idx[q] >= 0) {
                  gin[cr.idx[q]] += cr.w[q] * gm;
                }
              }
            }
          }
        }
      }
    }
  });
}

// Gradients with respect to the sampling coordinates (hence the offsets) and
// the mask. One task owns one (image, offset group, tap, position block).
template <typename scalar_t>
void deformable_col2im_coord(const Geometry& g, const scalar_t* grad_columns, const scalar_t* input,
                             const scalar_t* offset, const scalar_t* mask, int64_t first_image,
                             int64_t n_images, scalar_t* grad_offset, scalar_t* grad_mask) {
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t plane = g.height * g.width;
  const int64_t n_cols = n_images * out_size;
  const int64_t cpg = g.channels_per_offset_group();
  const int64_t blocks = ceil_div(out_size, kPositionBlock);
  const int64_t tasks = n_images * g.offset_groups * kk * blocks;

  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Corners<scalar_t>> corners(kPositionBlock);
    std::vector<scalar_t> masks(kPositionBlock);
    std::vector<scalar_t> acc_y(kPositionBlock), acc_x(kPositionBlock), acc_v(kPositionBlock);
    for (int64_t t = begin; t < end; ++t) {
      int64_t rest = t;
      const int64_t block = rest % blocks;
      rest /= blocks;
      const int64_t tap = rest % kk;
      rest /= kk;
      const int64_t og = rest % g.offset_groups;
      const int64_t local = rest / g.offset_groups;
      const int64_t image = first_image + local;
      const int64_t p0 = block * kPositionBlock;
      const int64_t p1 = std::min(out_size, p0 + kPositionBlock);
      const int64_t n = p1 - p0;
      compute_block_corners(g, offset, mask, image, og, tap, p0, p1, corners.data(), masks.data());
      std::fill(acc_y.begin(), acc_y.begin() + n, scalar_t(0));
      std::fill(acc_x.begin(), acc_x.begin() + n, scalar_t(0));
      std::fill(acc_v.begin(), acc_v.begin() + n, scalar_t(0));
      for (int64_t c = og * cpg; c < (og + 1) * cpg; ++c) {
        const scalar_t* in = input + (image * g.channels + c) * plane;
        const scalar_t* gcol = grad_columns + (c * kk + tap) * n_cols + local * out_size;
        for (int64_t p = p0; p < p1; ++p) {
          const Corners<scalar_t>& cr = corners[p - p0];
          if (!cr.inside) {
            continue;
          }
          scalar_t v[4];
          for (int q = 0; q < 4; ++q) {
            v[q] = cr.idx[q] >= 0 ? in[cr.idx[q]] : scalar_t(0);
          }
          const scalar_t gc = gcol[p];
          const scalar_t hy = 1 - cr.ly, hx = 1 - cr.lx;
          acc_y[p - p0] += gc * (hx * (v[2] - v[0]) + cr.lx * (v[3] - v[1]));
          acc_x[p - p0] += gc * (hy * (v[1] - v[0]) + cr.ly * (v[3] - v[2]));
          acc_v[p - p0] += gc * (cr.w[0] * v[0] + cr.w[1] * v[1] + cr.w[2] * v[2] + cr.w[3] * v[3]);
        }
      }
      scalar_t* goff_y =
          grad_offset + ((image * g.offset_groups + og) * 2 * kk + 2 * tap) * out_size;
      scalar_t* goff_x = goff_y + out_size;
      for (int64_t p = p0; p < p1; ++p) {
        if (corners[p - p0].nan) {
          acc_y[p - p0] = acc_x[p - p0] = acc_v[p - p0] =
              std::numeric_limits<scalar_t>::quiet_NaN();
        }
        goff_y[p] = masks[p - p0] * acc_y[p - p0];
        goff_x[p] = masks[p - p0] * acc_x[p - p0];
      }
      if (g.use_mask) {
        scalar_t* gmask = grad_mask + ((image * g.offset_groups + og) * kk + tap) * out_size;
        for (int64_t p = p0; p < p1; ++p) {
          gmask[p] = acc_v[p - p0];
        }
      }
    }
  });
}

bool is_reduced_float(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

// Weight viewed as (groups, out_channels / groups, in_channels / groups * kk).
at::Tensor grouped_weight(const at::Tensor& weight, const Geometry& g) {
  return weight.reshape(
      {g.groups, g.out_channels / g.groups, g.channels / g.groups * g.kernel_size()});
}

at::Tensor forward_impl(const at::Tensor& input_, const at::Tensor& weight_,
                        const at::Tensor& offset_, const at::Tensor& mask_, const at::Tensor& bias_,
                        const Geometry& g) {
  const at::Tensor input = input_.contiguous();
  const at::Tensor weight = weight_.contiguous();
  const at::Tensor offset = offset_.contiguous();
  const at::Tensor mask = g.use_mask ? mask_.contiguous() : mask_;
  const at::Tensor bias = bias_.contiguous();

  at::Tensor output = at::zeros({g.batch, g.out_channels, g.out_h, g.out_w}, input.options());
  if (g.batch == 0) {
    return output;
  }
  const at::Tensor w = grouped_weight(weight, g);
  const int64_t chunk = chunk_images(g);
  const int64_t rows = g.channels * g.kernel_size();
  const int64_t out_size = g.out_size();

  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_deform_conv2d_forward", [&] {
    at::Tensor columns = at::empty({rows, chunk * out_size}, input.options());
    for (int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
      const int64_t n = std::min(chunk, g.batch - b0);
      // A prefix of the flat buffer, so a short last chunk stays contiguous.
      at::Tensor cols =
          columns.view({-1}).narrow(0, 0, rows * n * out_size).view({rows, n * out_size});
      deformable_im2col<scalar_t>(g, input.data_ptr<scalar_t>(), offset.data_ptr<scalar_t>(),
                                  g.use_mask ? mask.data_ptr<scalar_t>() : nullptr, b0, n,
                                  cols.data_ptr<scalar_t>());
      // (groups, out_c / groups, n * out_size) -> (n, out_c, out_size)
      at::Tensor prod = at::bmm(w, cols.view({g.groups, rows / g.groups, n * out_size}));
      output.narrow(0, b0, n)
          .view({n, g.out_channels, out_size})
          .copy_(prod.view({g.out_channels, n, out_size}).transpose(0, 1));
    }
  });
  output.add_(bias.view({1, g.out_channels, 1, 1}));
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_impl(
    const at::Tensor& grad_, const at::Tensor& input_, const at::Tensor& weight_,
    const at::Tensor& offset_, const at::Tensor& mask_, const at::Tensor& bias_,
    const Geometry& g) {
  const at::Tensor grad = grad_.contiguous();
  const at::Tensor input = input_.contiguous();
  const at::Tensor weight = weight_.contiguous();
  const at::Tensor offset = offset_.contiguous();
  const at::Tensor mask = g.use_mask ? mask_.contiguous() : mask_;

  at::Tensor grad_input = at::zeros(input.sizes(), input.options());
  at::Tensor grad_weight = at::zeros(weight.sizes(), weight.options());
  at::Tensor grad_offset = at::zeros(offset.sizes(), offset.options());
  at::Tensor grad_mask = at::zeros(mask.sizes(), mask.options());
  at::Tensor grad_bias = at::zeros(bias_.sizes(), bias_.options());
  if (g.batch == 0) {
    return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
  }
  const at::Tensor w = grouped_weight(weight, g);
  const at::Tensor w_t = w.transpose(1, 2);
  at::Tensor grad_w = grad_weight.view(
      {g.groups, g.out_channels / g.groups, g.channels / g.groups * g.kernel_size()});
  const int64_t chunk = chunk_images(g);
  const int64_t rows = g.channels * g.kernel_size();
  const int64_t out_size = g.out_size();

  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_deform_conv2d_backward", [&] {
    at::Tensor columns = at::empty({rows, chunk * out_size}, input.options());
    at::Tensor grad_columns = at::empty({rows, chunk * out_size}, input.options());
    for (int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
      const int64_t n = std::min(chunk, g.batch - b0);
      const int64_t n_cols = n * out_size;
      // (n, out_c, out_size) -> (groups, out_c / groups, n * out_size)
      const at::Tensor go = grad.narrow(0, b0, n)
                                .view({n, g.out_channels, out_size})
                                .transpose(0, 1)
                                .contiguous()
                                .view({g.groups, g.out_channels / g.groups, n_cols});
      at::Tensor gcols = grad_columns.view({-1})
                             .narrow(0, 0, rows * n_cols)
                             .view({g.groups, rows / g.groups, n_cols});
      at::bmm_out(gcols, w_t, go);
      const scalar_t* gcols_ptr = gcols.data_ptr<scalar_t>();
      const scalar_t* mask_ptr = g.use_mask ? mask.data_ptr<scalar_t>() : nullptr;
      deformable_col2im<scalar_t>(g, gcols_ptr, offset.data_ptr<scalar_t>(), mask_ptr, b0, n,
                                  grad_input.data_ptr<scalar_t>());
      deformable_col2im_coord<scalar_t>(
          g, gcols_ptr, input.data_ptr<scalar_t>(), offset.data_ptr<scalar_t>(), mask_ptr, b0, n,
          grad_offset.data_ptr<scalar_t>(), g.use_mask ? grad_mask.data_ptr<scalar_t>() : nullptr);

      at::Tensor cols = columns.view({-1}).narrow(0, 0, rows * n_cols).view({rows, n_cols});
      deformable_im2col<scalar_t>(g, input.data_ptr<scalar_t>(), offset.data_ptr<scalar_t>(),
                                  mask_ptr, b0, n, cols.data_ptr<scalar_t>());
      grad_w.baddbmm_(go, cols.view({g.groups, rows / g.groups, n_cols}).transpose(1, 2));
    }
  });
  grad_bias.copy_(grad.sum({0, 2, 3}));
  return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
}

at::Tensor deform_conv2d_forward_kernel(const at::Tensor& input, const at::Tensor& weight,
                                        const at::Tensor& offset, const at::Tensor& mask,
                                        const at::Tensor& bias, int64_t stride_h, int64_t stride_w,
                                        int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                                        int64_t dilation_w, int64_t groups, int64_t offset_groups,
                                        bool use_mask) {
  const Geometry g = check_deform_conv2d_args(c10::DeviceType::CPU, input, weight, offset, mask,
                                              bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                              dilation_w, groups, offset_groups, use_mask);
  if (is_reduced_float(input.scalar_type())) {
    // Sampling and accumulation in float32, like the autocast path.
    return forward_impl(input.to(at::kFloat), weight.to(at::kFloat), offset.to(at::kFloat),
                        mask.to(at::kFloat), bias.to(at::kFloat), g)
        .to(input.scalar_type());
  }
  return forward_impl(input, weight, offset, mask, bias, g);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
deform_conv2d_backward_kernel(const at::Tensor& grad, const at::Tensor& input,
                              const at::Tensor& weight, const at::Tensor& offset,
                              const at::Tensor& mask, const at::Tensor& bias, int64_t stride_h,
                              int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                              int64_t dilation_w, int64_t groups, int64_t offset_groups,
                              bool use_mask) {
  const Geometry g = check_deform_conv2d_args(c10::DeviceType::CPU, input, weight, offset, mask,
                                              bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                              dilation_w, groups, offset_groups, use_mask);
  check_deform_conv2d_grad(c10::DeviceType::CPU, grad, input, g);
  if (is_reduced_float(input.scalar_type())) {
    const auto t = input.scalar_type();
    auto [gi, gw, go, gm, gb] =
        backward_impl(grad.to(at::kFloat), input.to(at::kFloat), weight.to(at::kFloat),
                      offset.to(at::kFloat), mask.to(at::kFloat), bias.to(at::kFloat), g);
    return {gi.to(t), gw.to(t), go.to(t), gm.to(t), gb.to(t)};
  }
  return backward_impl(grad, input, weight, offset, mask, bias, g);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_forward_kernel));
  m.impl("_deform_conv2d_backward", TORCH_FN(deform_conv2d_backward_kernel));
}

}  // namespace opforge::ops
