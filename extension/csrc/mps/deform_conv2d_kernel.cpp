// deform_conv2d forward and backward on MPS.  The sampling steps are Metal
// kernels (csrc/metal/deform_conv2d.metal); the GEMMs between them are ATen's
// bmm on MPS (abi.h), encoded on the same stream.  Images are processed in chunks so
// the column buffer stays below max_column_elements().
#include <opforge_metal/deform_conv2d.h>

#include "common.h"
#include "metal/deform_conv2d.h"
#include "mps/metal_host.h"

namespace opforge::mps {
namespace {

// Column buffer cap per chunk: 64 Mi elements (256 MB of float) unless
// OPFORGE_MPS_DEFORM_MAX_COLUMNS says otherwise (tests use it to force chunks).
int64_t max_column_elements() {
  if (const char* v = std::getenv("OPFORGE_MPS_DEFORM_MAX_COLUMNS")) {
    const long long n = std::strtoll(v, nullptr, 10);
    if (n > 0)
      return n;
  }
  return int64_t(1) << 26;
}

OPFORGE_KERNEL_LIBRARY(deform_conv2d)

using Shape = DeformConv2dGeometry;

// The shared checks (common.h: the same rules and messages as the CPU and CUDA kernels).
Shape check_inputs(const Tensor& input, const Tensor& weight, const Tensor& offset,
                   const Tensor& mask, const Tensor& bias, int64_t stride_h, int64_t stride_w,
                   int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                   int64_t groups, int64_t offset_groups, bool use_mask) {
  return check_deform_conv2d_args(kMpsDeviceType, input, weight, offset, mask, bias, stride_h,
                                  stride_w, pad_h, pad_w, dilation_h, dilation_w, groups,
                                  offset_groups, use_mask);
}

OpfDeformParams make_params(const Shape& s, int64_t chunk, int64_t stride_h, int64_t stride_w,
                            int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                            int64_t offset_groups, bool use_mask) {
  OpfDeformParams p{};
  p.batch = chunk;
  p.channels = s.channels;
  p.height = s.height;
  p.width = s.width;
  p.out_h = s.out_h;
  p.out_w = s.out_w;
  p.kernel_h = s.kernel_h;
  p.kernel_w = s.kernel_w;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.pad_h = pad_h;
  p.pad_w = pad_w;
  p.dilation_h = dilation_h;
  p.dilation_w = dilation_w;
  p.offset_groups = offset_groups;
  p.use_mask = use_mask ? 1 : 0;
  return p;
}

int64_t chunk_size(const Shape& s) {
  const int64_t per_image = s.channels * s.kernel_h * s.kernel_w * s.out_h * s.out_w;
  return std::max<int64_t>(
      1, std::min<int64_t>(s.batch, max_column_elements() / std::max<int64_t>(per_image, 1)));
}

// columns[C*KH*KW, nb*OH*OW] of images [b0, b0 + nb).
Tensor im2col(const char* type, const Tensor& input, const Tensor& offset, const Tensor& mask,
              OpfDeformParams p, int64_t b0) {
  const int64_t nb = p.batch;
  Tensor columns =
      alloc_empty(input, {p.channels * p.kernel_h * p.kernel_w, nb * p.out_h * p.out_w});
  p.total = metal::deform_im2col_items(p);
  const Tensor in = narrowed(input, 0, b0, nb);
  const Tensor off = narrowed(offset, 0, b0, nb);
  const Tensor msk = p.use_mask ? narrowed(mask, 0, b0, nb) : off;  // bound, never read
  Pipeline pso = deform_conv2d_library().pipeline(std::string("deform_im2col_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(p.total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, in, OPF_DEFORM_IM2COL_BUF_INPUT);
    bind(enc, off, OPF_DEFORM_IM2COL_BUF_OFFSET);
    bind(enc, msk, OPF_DEFORM_IM2COL_BUF_MASK);
    bind(enc, columns, OPF_DEFORM_IM2COL_BUF_COLUMNS);
    bind_params(enc, p, OPF_DEFORM_IM2COL_BUF_PARAMS);
    dispatch(enc, d);
  });
  return columns;
}

Tensor deform_conv2d_mps(const Tensor& input, const Tensor& weight, const Tensor& offset,
                         const Tensor& mask, const Tensor& bias, int64_t stride_h, int64_t stride_w,
                         int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                         int64_t groups, int64_t offset_groups, bool use_mask) {
  const Shape s = check_inputs(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                               dilation_h, dilation_w, groups, offset_groups, use_mask);
  const char* type = metal_type(input, "deform_conv2d");
  const int64_t out_numel = s.batch * s.out_channels * s.out_h * s.out_w;
  if (out_numel == 0) {
    return alloc_zeros(input, {s.batch, s.out_channels, s.out_h, s.out_w});
  }
  if (metal::route_to_cpu(metal::kDeformConv2dCrossover, out_numel)) {
    return call_cpu<1>(input, "opforge::deform_conv2d", input, weight, offset, mask, bias, stride_h,
                       stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups,
                       use_mask)[0];
  }
  const Tensor input_ = as_contiguous(input);
  const Tensor offset_ = as_contiguous(offset);
  const Tensor mask_ = use_mask ? as_contiguous(mask) : offset_;
  const Tensor weight_g = viewed(as_contiguous(weight), {groups, s.out_channels / groups, -1});
  Tensor output = alloc_empty(input, {s.batch, s.out_channels, s.out_h, s.out_w});
  const int64_t chunk = chunk_size(s);
  for (int64_t b0 = 0; b0 < s.batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, s.batch - b0);
    const OpfDeformParams p = make_params(s, nb, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                          dilation_w, offset_groups, use_mask);
    const Tensor columns = im2col(type, input_, offset_, mask_, p, b0);
    const Tensor out_g = batched_matmul(weight_g, viewed(columns, {groups, -1, columns.size(1)}));
    copy_into(narrowed(output, 0, b0, nb),
              transposed(viewed(out_g, {s.out_channels, nb, s.out_h, s.out_w}), 0, 1));
  }
  add_into(output, viewed(bias, {1, s.out_channels, 1, 1}));
  return output;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_mps(
    const Tensor& grad, const Tensor& input, const Tensor& weight, const Tensor& offset,
    const Tensor& mask, const Tensor& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups,
    bool use_mask) {
  const char* op = "deform_conv2d_backward";
  const Shape s = check_inputs(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                               dilation_h, dilation_w, groups, offset_groups, use_mask);
  check_deform_conv2d_grad(kMpsDeviceType, grad, input, s);
  const char* type = metal_type(input, op);
  const int64_t out_numel = grad.numel();
  if (metal::route_to_cpu(metal::kDeformConv2dCrossover, out_numel)) {
    const auto out = call_cpu<5>(input, "opforge::_deform_conv2d_backward", grad, input, weight,
                                 offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                 dilation_w, groups, offset_groups, use_mask);
    return {out[0], out[1], out[2], out[3], out[4]};
  }
  const Tensor grad_ = as_contiguous(grad);
  const Tensor input_ = as_contiguous(input);
  const Tensor offset_ = as_contiguous(offset);
  const Tensor mask_ = use_mask ? as_contiguous(mask) : offset_;
  const Tensor weight_g = viewed(as_contiguous(weight), {groups, s.out_channels / groups, -1});
  Tensor grad_input = alloc_zeros(input_, sizes_of(input_), ScalarType::Float);
  Tensor grad_offset = alloc_zeros(offset_, sizes_of(offset_));
  Tensor grad_mask =
      use_mask ? alloc_zeros(mask_, sizes_of(mask_)) : alloc_zeros(mask, sizes_of(mask));
  Tensor grad_weight =
      alloc_zeros(input, {groups, s.out_channels / groups, weight_g.size(2)}, ScalarType::Float);

  Pipeline col2im_pso = deform_conv2d_library().pipeline(std::string("deform_col2im_") + type);
  Pipeline coord_pso = deform_conv2d_library().pipeline(std::string("deform_col2im_coord_") + type);
  const int64_t chunk = chunk_size(s);
  for (int64_t b0 = 0; b0 < s.batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, s.batch - b0);
    OpfDeformParams p = make_params(s, nb, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                                    offset_groups, use_mask);
    // grad of this chunk as [groups, OC/groups, nb*OH*OW].
    const Tensor g_out = reshaped(
        transposed(reshaped(narrowed(grad_, 0, b0, nb), {nb, s.out_channels, s.out_h * s.out_w}), 0,
                   1),
        {groups, s.out_channels / groups, nb * s.out_h * s.out_w});
    const Tensor grad_columns = as_contiguous(
        reshaped(batched_matmul(transposed(weight_g, 1, 2), g_out), {-1, nb * s.out_h * s.out_w}));
    const Tensor off = narrowed(offset_, 0, b0, nb);
    const Tensor msk = use_mask ? narrowed(mask_, 0, b0, nb) : off;
    const Tensor in = narrowed(input_, 0, b0, nb);
    const Tensor gin = narrowed(grad_input, 0, b0, nb);
    const Tensor goff = narrowed(grad_offset, 0, b0, nb);
    const Tensor gmsk = use_mask ? narrowed(grad_mask, 0, b0, nb) : goff;  // bound, never written
    OpfDeformParams col2im_p = p;
    col2im_p.total = metal::deform_col2im_items(p);
    OpfDeformParams coord_p = p;
    coord_p.total = metal::deform_coord_items(p);
    const Dispatch col2im_d =
        metal::dispatch_1d(static_cast<uint64_t>(col2im_p.total), max_threads(col2im_pso));
    const Dispatch coord_d =
        metal::dispatch_1d(static_cast<uint64_t>(coord_p.total), max_threads(coord_pso));
    encode(col2im_pso, [&](Encoder enc) {
      set_pipeline(enc, col2im_pso);
      bind(enc, grad_columns, OPF_DEFORM_COL2IM_BUF_COLUMNS);
      bind(enc, off, OPF_DEFORM_COL2IM_BUF_OFFSET);
      bind(enc, msk, OPF_DEFORM_COL2IM_BUF_MASK);
      bind(enc, gin, OPF_DEFORM_COL2IM_BUF_GRAD_INPUT);
      bind_params(enc, col2im_p, OPF_DEFORM_COL2IM_BUF_PARAMS);
      dispatch(enc, col2im_d);
      set_pipeline(enc, coord_pso);
      bind(enc, grad_columns, OPF_DEFORM_COORD_BUF_COLUMNS);
      bind(enc, in, OPF_DEFORM_COORD_BUF_INPUT);
      bind(enc, off, OPF_DEFORM_COORD_BUF_OFFSET);
      bind(enc, msk, OPF_DEFORM_COORD_BUF_MASK);
      bind(enc, goff, OPF_DEFORM_COORD_BUF_GRAD_OFFSET);
      bind(enc, gmsk, OPF_DEFORM_COORD_BUF_GRAD_MASK);
      bind_params(enc, coord_p, OPF_DEFORM_COORD_BUF_PARAMS);
      dispatch(enc, coord_d);
    });
    const Tensor columns = im2col(type, input_, offset_, mask_, p, b0);
    add_into(grad_weight,
             to_dtype(batched_matmul(
                          g_out, transposed(viewed(columns, {groups, -1, columns.size(1)}), 1, 2)),
                      ScalarType::Float));
  }
  const auto dtype = input.scalar_type();
  return {to_dtype(grad_input, dtype), to_dtype(viewed(grad_weight, sizes_of(weight)), dtype),
          grad_offset, grad_mask, to_dtype(sum_over(grad_, {0, 2, 3}), dtype)};
}

}  // namespace

// opforge::<op> on the MPS key; see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("deform_conv2d", OPFORGE_KERNEL(deform_conv2d_mps));
  m.impl("_deform_conv2d_backward", OPFORGE_KERNEL(deform_conv2d_backward_mps));
}

}  // namespace opforge::mps
