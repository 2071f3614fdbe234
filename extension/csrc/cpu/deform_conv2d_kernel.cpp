// CPU kernels for opforge::deform_conv2d and opforge::_deform_conv2d_backward.
//
// Both are "bilinear im2col + GEMM". The forward samples a channels-last copy of the
// input (deform_im2col.h: one set of corners and weights per position and tap, applied
// to a vector of channels) block of positions by block, and multiplies each block with
// the weight permuted to the columns' (tap, channel) order while it is still in cache.
// The backward expands each batch chunk into a channels-first column matrix of shape
// (channels * kh * kw, chunk * out_h * out_w) for its GEMMs and gradient scatters. Every
// sampling loop runs under parallel_for_work (cpu/parallel_policy.h: threads only where
// the work pays for them); tasks are split so that no two tasks ever write the same
// element (no atomics, no per-thread reduction buffers).
//
// Sampling semantics (shared with torchvision.ops.deform_conv2d): a point
// (y, x) with y <= -1, y >= height, x <= -1 or x >= width samples 0; otherwise
// it is the bilinear interpolation of its four neighbours, where neighbours
// outside the image count as 0.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common.h"
#include "channels_last.h"
#include "deform_im2col.h"
#include "parallel_policy.h"
#include "small_gemm.h"

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

// One task of the sampling loops (im2col, the offset and mask gradients): a block of output
// positions [p0, p1) of one kernel tap, offset group and image. Tasks are numbered image-major,
// then offset group, then tap, then block.
struct SamplingTask {
  int64_t local_image, offset_group, tap, p0, p1;
};

inline SamplingTask sampling_task(int64_t t, int64_t blocks, int64_t kk, int64_t offset_groups,
                                  int64_t out_size) {
  const int64_t block = t % blocks;
  t /= blocks;
  const int64_t tap = t % kk;
  t /= kk;
  const int64_t p0 = block * kPositionBlock;
  return {t / offset_groups, t % offset_groups, tap, p0, std::min(out_size, p0 + kPositionBlock)};
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

  // A task samples one block of positions for every channel of its offset group.
  cpu::parallel_for_work(
      tasks, 6 * cpg * std::min(out_size, kPositionBlock), [&](int64_t begin, int64_t end) {
        std::vector<Corners<scalar_t>> corners(kPositionBlock);
        std::vector<scalar_t> masks(kPositionBlock);
        for (int64_t t = begin; t < end; ++t) {
          const SamplingTask task = sampling_task(t, blocks, kk, g.offset_groups, out_size);
          const int64_t tap = task.tap, og = task.offset_group, local = task.local_image;
          const int64_t image = first_image + local;
          const int64_t p0 = task.p0, p1 = task.p1;
          compute_block_corners(g, offset, mask, image, og, tap, p0, p1, corners.data(),
                                masks.data());
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
              col[p] = cr.inside
                           ? masks[p - p0] * v
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
  const int64_t want = 4 * static_cast<int64_t>(num_threads());
  const int64_t base = n_images * g.offset_groups;
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(cpg, ceil_div(want, base)));
  const int64_t per_split = ceil_div(cpg, splits);
  const int64_t tasks = base * splits;

  cpu::parallel_for_work(tasks, 6 * per_split * kk * out_size, [&](int64_t begin, int64_t end) {
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

  cpu::parallel_for_work(
      tasks, 16 * cpg * std::min(out_size, kPositionBlock), [&](int64_t begin, int64_t end) {
        std::vector<Corners<scalar_t>> corners(kPositionBlock);
        std::vector<scalar_t> masks(kPositionBlock);
        std::vector<scalar_t> acc_y(kPositionBlock), acc_x(kPositionBlock), acc_v(kPositionBlock);
        for (int64_t t = begin; t < end; ++t) {
          const SamplingTask task = sampling_task(t, blocks, kk, g.offset_groups, out_size);
          const int64_t tap = task.tap, og = task.offset_group, local = task.local_image;
          const int64_t image = first_image + local;
          const int64_t p0 = task.p0, p1 = task.p1;
          const int64_t n = p1 - p0;
          compute_block_corners(g, offset, mask, image, og, tap, p0, p1, corners.data(),
                                masks.data());
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
              acc_v[p - p0] +=
                  gc * (cr.w[0] * v[0] + cr.w[1] * v[1] + cr.w[2] * v[2] + cr.w[3] * v[3]);
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

bool is_reduced_float(ScalarType t) {
  return t == ScalarType::Half || t == ScalarType::BFloat16;
}

// total[i] += part[i]: one chunk's weight gradient into the running sum.
template <typename scalar_t>
void accumulate(scalar_t* total, const scalar_t* part, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    total[i] += part[i];
  }
}

// out = a @ b, (groups, M, K) @ (groups, K, N), N split into column blocks that the work
// policy hands out, each block's product computed by the thread that takes it (inside the
// policy's parallel region, torch runs it on that thread). torch's own threading splits a
// product evenly between its threads up front, so on a busy machine the call waits for the
// slowest one; a block costs about 2 * M * K * kColumnBlock units. Below the policy's
// threshold, one product on the calling thread.
constexpr int64_t kColumnBlock = 128;

template <typename scalar_t>
void matmul_by_columns(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t rows = a.size(0) * a.size(1);  // out is contiguous (groups, M, N)
  const int64_t n_cols = b.size(2);
  const int64_t blocks = ceil_div(n_cols, kColumnBlock);
  const int64_t block_work = cpu::total_work(2 * a.size(0) * a.size(1) * a.size(2), kColumnBlock);
  if (!cpu::worth_threads(blocks, block_work)) {
    batched_matmul_out(out, a, b);
    return;
  }
  scalar_t* dst = out.mutable_data_ptr<scalar_t>();
  cpu::parallel_for_work(blocks, block_work, [&](int64_t begin, int64_t end) {
    const int64_t c0 = begin * kColumnBlock;
    const int64_t width = std::min(n_cols, end * kColumnBlock) - c0;
    // Copied by hand: a worker thread may run with grad mode on, where copying into a view
    // of `out` would be refused.
    const Tensor part = batched_matmul(a, narrowed(b, 2, c0, width));
    const scalar_t* src = part.const_data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(src + r * width, src + (r + 1) * width, dst + r * n_cols + c0);
    }
  });
}

// Weight viewed as (groups, out_channels / groups, in_channels / groups * kk).
Tensor grouped_weight(const Tensor& weight, const Geometry& g) {
  return reshaped(weight,
                  {g.groups, g.out_channels / g.groups, g.channels / g.groups * g.kernel_size()});
}

// The forward's sampling loop, compiled once per vector width (deform_im2col.h).
OPFORGE_VECTOR_CLONES void im2col_run(const cpu::DeformIm2colArgs<float>& args) {
  if (args.mask) {
    cpu::deform_im2col_run<true>(args);
  } else {
    cpu::deform_im2col_run<false>(args);
  }
}
OPFORGE_VECTOR_CLONES void im2col_run(const cpu::DeformIm2colArgs<double>& args) {
  if (args.mask) {
    cpu::deform_im2col_run<true>(args);
  } else {
    cpu::deform_im2col_run<false>(args);
  }
}

// One NCHW image into the padded copy, compiled once per vector width.
OPFORGE_VECTOR_CLONES void pad_image(const float* src, float* dst, const cpu::DeformPadding& pad,
                                     int64_t height, int64_t width) {
  cpu::pad_image_from_nchw(src, dst, pad, height, width);
}
OPFORGE_VECTOR_CLONES void pad_image(const double* src, double* dst, const cpu::DeformPadding& pad,
                                     int64_t height, int64_t width) {
  cpu::pad_image_from_nchw(src, dst, pad, height, width);
}

// A block's product into the output (deform_im2col.h's transpose_block), compiled once per
// vector width.
OPFORGE_VECTOR_CLONES void write_output(const float* src, int64_t src_ld, float* dst,
                                        int64_t dst_ld, int64_t rows, int64_t cols,
                                        const float* bias) {
  cpu::transpose_block<false>(src, src_ld, dst, dst_ld, rows, cols, bias);
}
OPFORGE_VECTOR_CLONES void write_output(const double* src, int64_t src_ld, double* dst,
                                        int64_t dst_ld, int64_t rows, int64_t cols,
                                        const double* bias) {
  cpu::transpose_block<false>(src, src_ld, dst, dst_ld, rows, cols, bias);
}

// A block's product with cpu/small_gemm.h, group by group: columns (groups, block, kk * cg)
// read in place (n positions of each group's slab), weight (groups, kk * cg, out_c / groups)
// dense, out (groups, n, out_c / groups) as bmm would return it. float32 only: never reached
// for double.
void multiply_block(const float* columns, const float* weight, const Geometry& g, int64_t block,
                    int64_t n, float* out) {
  const int64_t depth = g.kernel_size() * (g.channels / g.groups);
  const int64_t cols = g.out_channels / g.groups;
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    cpu::small_gemm(columns + grp * block * depth, depth, weight + grp * depth * cols, n, depth,
                    cols, out + grp * n * cols);
  }
}
void multiply_block(const double*, const double*, const Geometry&, int64_t, int64_t, double*) {}

// Positions sampled and multiplied together: one block's columns (positions x kk * channels)
// stay in a core's L2 between the sampling that writes them and the GEMM that reads them,
// beside the padded copy of the image being sampled. At least 128 positions: each bmm packs
// the whole weight again (kk * channels x out_channels, 2.4 MB at 256 -> 256 channels), and
// with fewer rows that packing was a sixth of the forward (b1 c256 28x28: 48-row blocks
// 8% slower than 128-row ones). small_gemm.h packs nothing, but was no faster with smaller
// blocks either (b8 c64 56x56: the same at 96 positions as at 224, 3% slower at 48).
constexpr int64_t kForwardColumnBytes = int64_t(1) << 19;

int64_t forward_block(const Geometry& g, int64_t element_size) {
  const int64_t row_bytes = std::max<int64_t>(1, g.kernel_size() * g.channels * element_size);
  const int64_t fit = kForwardColumnBytes / row_bytes / 16 * 16;
  return std::clamp<int64_t>(fit, 128, 1024);
}

// weight (out_c, in_c / groups, kh, kw) -> (groups, out_c / groups, kh * kw * in_c / groups):
// the reduction order of the channels-last columns.
template <typename scalar_t>
Tensor permuted_weight(const Tensor& weight, const Geometry& g) {
  const int64_t kk = g.kernel_size();
  const int64_t cg = g.channels / g.groups;
  Tensor out = alloc_empty(weight, {g.groups, g.out_channels / g.groups, kk * cg});
  const scalar_t* src = weight.const_data_ptr<scalar_t>();
  scalar_t* dst = out.mutable_data_ptr<scalar_t>();
  for (int64_t oc = 0; oc < g.out_channels; ++oc) {
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t tap = 0; tap < kk; ++tap) {
        dst[(oc * kk + tap) * cg + c] = src[(oc * cg + c) * kk + tap];
      }
    }
  }
  return out;
}

// The forward: positions (image-major) in blocks that the work policy hands out. The thread
// that takes a block copies the block's image into its padded channels-last buffer (once per
// image it meets), samples the block into channels-last columns (deform_im2col.h) and
// multiplies them with the permuted weight, one GEMM per block; the product
// (positions x out_c) is written to the NCHW output with the bias added.
Tensor forward_impl(const Tensor& input_, const Tensor& weight_, const Tensor& offset_,
                    const Tensor& mask_, const Tensor& bias_, const Geometry& g) {
  const Tensor weight = as_contiguous(weight_);
  const Tensor offset = as_contiguous(offset_);
  const Tensor mask = g.use_mask ? as_contiguous(mask_) : mask_;
  const Tensor bias = as_contiguous(bias_);

  if (g.batch == 0) {
    return alloc_zeros(input_, {g.batch, g.out_channels, g.out_h, g.out_w});
  }
  Tensor output = alloc_empty(input_, {g.batch, g.out_channels, g.out_h, g.out_w});
  const int64_t out_size = g.out_size();
  const int64_t kk = g.kernel_size();
  const int64_t cg = g.channels / g.groups;
  const int64_t ocg = std::max<int64_t>(1, g.out_channels / g.groups);
  const cpu::DeformPadding pad = cpu::deform_padding(g);

  OPFORGE_DISPATCH_FLOAT_AND_DOUBLE(input_.scalar_type(), "opforge_deform_conv2d_forward", [&] {
    // The input as it is when channels-last, else dense NCHW: each image is copied from it.
    const bool channels_last = cpu::is_channels_last(input_);
    const Tensor input = channels_last ? input_ : as_contiguous(input_);
    const scalar_t* in_ptr = input.const_data_ptr<scalar_t>();
    const int64_t image_elems = g.channels * g.height * g.width;
    const Tensor w = permuted_weight<scalar_t>(weight, g);
    const Tensor w_t = transposed(w, 1, 2);
    // float32 with whole vectors of output channels: cpu/small_gemm.h's product, which reads
    // the columns in place, on (groups, kk * cg, out_c / groups) dense.
    const bool own_gemm =
        std::is_same_v<scalar_t, float> && cpu::small_gemm_available(g.out_channels / g.groups);
    const Tensor w_kn = own_gemm ? as_contiguous(w_t) : w_t;
    const scalar_t* bias_ptr = bias.const_data_ptr<scalar_t>();
    scalar_t* out_ptr = output.mutable_data_ptr<scalar_t>();

    const int64_t total = g.batch * out_size;
    const int64_t block = std::min(total, forward_block(g, sizeof(scalar_t)));
    const int64_t blocks = ceil_div(total, block);
    // Per position: kk * channels samples (4 units each) and a 2 * out_c * kk * cg GEMM column.
    const int64_t block_work =
        cpu::total_work(block, kk * g.channels * 4 + 2 * g.out_channels * kk * cg);
    cpu::parallel_for_work(blocks, block_work, [&](int64_t begin, int64_t end) {
      Tensor columns = alloc_empty(w, {g.groups, block, kk * cg});
      Tensor product = alloc_empty(w, {own_gemm ? g.groups : 0, block, ocg});
      // The padded image, then the sampling tables.
      const int64_t table_elems = (2 + 4 * kk) * cpu::kDeformRun;
      Tensor scratch = alloc_empty(w, {pad.elements() + table_elems});
      std::vector<int64_t> corners(kk * cpu::kDeformRun);
      scalar_t* padded = scratch.mutable_data_ptr<scalar_t>();
      cpu::zero_padding_border(padded, pad, g.height, g.width);
      scalar_t* tables = padded + pad.elements();
      cpu::DeformIm2colArgs<scalar_t> args{&g,
                                           pad,
                                           padded + pad.origin(),
                                           offset.const_data_ptr<scalar_t>(),
                                           g.use_mask ? mask.const_data_ptr<scalar_t>() : nullptr,
                                           -1,
                                           0,
                                           0,
                                           nullptr,
                                           block * kk * cg,
                                           tables,
                                           tables + cpu::kDeformRun,
                                           tables + 2 * cpu::kDeformRun,
                                           corners.data()};
      scalar_t* cols = columns.mutable_data_ptr<scalar_t>();
      for (int64_t blk = begin; blk < end; ++blk) {
        const int64_t q0 = blk * block;
        const int64_t n = std::min(total, q0 + block) - q0;
        for (int64_t q = q0; q < q0 + n;) {
          const int64_t image = q / out_size, p = q % out_size;
          const int64_t run = std::min({q0 + n - q, out_size - p, cpu::kDeformRun});
          if (image != args.image_index) {
            const scalar_t* src = in_ptr + image * image_elems;
            if (channels_last) {
              cpu::pad_image_from_nhwc(src, padded, pad, g.height, g.width);
            } else {
              pad_image(src, padded, pad, g.height, g.width);
            }
            args.image_index = image;
          }
          args.p0 = p;
          args.p1 = p + run;
          args.columns = cols + (q - q0) * kk * cg;
          im2col_run(args);
          q += run;
        }
        // (groups, n, kk * cg) @ (groups, kk * cg, out_c / groups): positions x out_c, the
        // orientation in which the columns need no transposing inside the GEMM.
        if (own_gemm) {
          multiply_block(cols, w_kn.const_data_ptr<scalar_t>(), g, block, n,
                         product.mutable_data_ptr<scalar_t>());
        }
        const Tensor part = own_gemm ? product : batched_matmul(narrowed(columns, 1, 0, n), w_t);
        const scalar_t* src = part.const_data_ptr<scalar_t>();
        // The block's positions, split where they cross into the next image: (positions, out_c
        // of the group) -> (out_c of the group, positions) in the output, plus the bias.
        for (int64_t q = q0; q < q0 + n;) {
          const int64_t image = q / out_size, p = q % out_size;
          const int64_t run = std::min(q0 + n - q, out_size - p);
          for (int64_t grp = 0; grp < g.groups; ++grp) {
            write_output(src + (grp * n + (q - q0)) * ocg, ocg,
                         out_ptr + (image * g.out_channels + grp * ocg) * out_size + p, out_size,
                         run, g.out_channels / g.groups, bias_ptr + grp * ocg);
          }
          q += run;
        }
      }
    });
  });
  return output;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> backward_impl(
    const Tensor& grad_, const Tensor& input_, const Tensor& weight_, const Tensor& offset_,
    const Tensor& mask_, const Tensor& bias_, const Geometry& g) {
  const Tensor grad = as_contiguous(grad_);
  const Tensor input = as_contiguous(input_);
  const Tensor weight = as_contiguous(weight_);
  const Tensor offset = as_contiguous(offset_);
  const Tensor mask = g.use_mask ? as_contiguous(mask_) : mask_;

  Tensor grad_input = alloc_zeros(input, sizes_of(input));
  Tensor grad_weight = alloc_zeros(weight, sizes_of(weight));
  Tensor grad_offset = alloc_zeros(offset, sizes_of(offset));
  Tensor grad_mask = alloc_zeros(mask, sizes_of(mask));
  Tensor grad_bias = alloc_zeros(bias_, sizes_of(bias_));
  if (g.batch == 0) {
    return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
  }
  const Tensor w = grouped_weight(weight, g);
  const Tensor w_t = transposed(w, 1, 2);
  Tensor grad_w = viewed(
      grad_weight, {g.groups, g.out_channels / g.groups, g.channels / g.groups * g.kernel_size()});
  const int64_t chunk = chunk_images(g);
  const int64_t rows = g.channels * g.kernel_size();
  const int64_t out_size = g.out_size();

  OPFORGE_DISPATCH_FLOAT_AND_DOUBLE(input.scalar_type(), "opforge_deform_conv2d_backward", [&] {
    Tensor columns = alloc_empty(input, {rows, chunk * out_size});
    Tensor grad_columns = alloc_empty(input, {rows, chunk * out_size});
    for (int64_t b0 = 0; b0 < g.batch; b0 += chunk) {
      const int64_t n = std::min(chunk, g.batch - b0);
      const int64_t n_cols = n * out_size;
      // (n, out_c, out_size) -> (groups, out_c / groups, n * out_size)
      const Tensor go =
          viewed(as_contiguous(transposed(
                     viewed(narrowed(grad, 0, b0, n), {n, g.out_channels, out_size}), 0, 1)),
                 {g.groups, g.out_channels / g.groups, n_cols});
      Tensor gcols = viewed(narrowed(viewed(grad_columns, {-1}), 0, 0, rows * n_cols),
                            {g.groups, rows / g.groups, n_cols});
      matmul_by_columns<scalar_t>(gcols, w_t, go);
      const scalar_t* gcols_ptr = gcols.mutable_data_ptr<scalar_t>();
      const scalar_t* mask_ptr = g.use_mask ? mask.mutable_data_ptr<scalar_t>() : nullptr;
      deformable_col2im<scalar_t>(g, gcols_ptr, offset.mutable_data_ptr<scalar_t>(), mask_ptr, b0,
                                  n, grad_input.mutable_data_ptr<scalar_t>());
      deformable_col2im_coord<scalar_t>(
          g, gcols_ptr, input.mutable_data_ptr<scalar_t>(), offset.mutable_data_ptr<scalar_t>(),
          mask_ptr, b0, n, grad_offset.mutable_data_ptr<scalar_t>(),
          g.use_mask ? grad_mask.mutable_data_ptr<scalar_t>() : nullptr);

      Tensor cols = viewed(narrowed(viewed(columns, {-1}), 0, 0, rows * n_cols), {rows, n_cols});
      deformable_im2col<scalar_t>(g, input.mutable_data_ptr<scalar_t>(),
                                  offset.mutable_data_ptr<scalar_t>(), mask_ptr, b0, n,
                                  cols.mutable_data_ptr<scalar_t>());
      const Tensor chunk_grad_w =
          batched_matmul(go, transposed(viewed(cols, {g.groups, rows / g.groups, n_cols}), 1, 2));
      accumulate(grad_w.mutable_data_ptr<scalar_t>(), chunk_grad_w.const_data_ptr<scalar_t>(),
                 chunk_grad_w.numel());
    }
  });
  copy_into(grad_bias, sum_over(grad, {0, 2, 3}));
  return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
}

Tensor deform_conv2d_forward_kernel(const Tensor& input, const Tensor& weight, const Tensor& offset,
                                    const Tensor& mask, const Tensor& bias, int64_t stride_h,
                                    int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                    int64_t dilation_h, int64_t dilation_w, int64_t groups,
                                    int64_t offset_groups, bool use_mask) {
  const Geometry g = check_deform_conv2d_args(DeviceType::CPU, input, weight, offset, mask, bias,
                                              stride_h, stride_w, pad_h, pad_w, dilation_h,
                                              dilation_w, groups, offset_groups, use_mask);
  if (is_reduced_float(input.scalar_type())) {
    // Sampling and accumulation in float32, like the autocast path.
    return to_dtype(
        forward_impl(to_dtype(input, ScalarType::Float), to_dtype(weight, ScalarType::Float),
                     to_dtype(offset, ScalarType::Float), to_dtype(mask, ScalarType::Float),
                     to_dtype(bias, ScalarType::Float), g),
        input.scalar_type());
  }
  return forward_impl(input, weight, offset, mask, bias, g);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_kernel(
    const Tensor& grad, const Tensor& input, const Tensor& weight, const Tensor& offset,
    const Tensor& mask, const Tensor& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups,
    bool use_mask) {
  const Geometry g = check_deform_conv2d_args(DeviceType::CPU, input, weight, offset, mask, bias,
                                              stride_h, stride_w, pad_h, pad_w, dilation_h,
                                              dilation_w, groups, offset_groups, use_mask);
  check_deform_conv2d_grad(DeviceType::CPU, grad, input, g);
  if (is_reduced_float(input.scalar_type())) {
    const auto t = input.scalar_type();
    auto [gi, gw, go, gm, gb] =
        backward_impl(to_dtype(grad, ScalarType::Float), to_dtype(input, ScalarType::Float),
                      to_dtype(weight, ScalarType::Float), to_dtype(offset, ScalarType::Float),
                      to_dtype(mask, ScalarType::Float), to_dtype(bias, ScalarType::Float), g);
    return {to_dtype(gi, t), to_dtype(gw, t), to_dtype(go, t), to_dtype(gm, t), to_dtype(gb, t)};
  }
  return backward_impl(grad, input, weight, offset, mask, bias, g);
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("deform_conv2d", OPFORGE_KERNEL(deform_conv2d_forward_kernel));
  m.impl("_deform_conv2d_backward", OPFORGE_KERNEL(deform_conv2d_backward_kernel));
}

}  // namespace opforge::ops
