// deform_conv2d forward and backward on MPS.  The sampling steps are Metal
// kernels (csrc/metal/deform_conv2d.metal); the GEMMs between them are ATen
// bmm on MPS, encoded on the same stream.  Images are processed in chunks so
// the column buffer stays below max_column_elements().
#include <opforge_metal/deform_conv2d.h>
#include <torch/library.h>

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
Shape check_inputs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& offset,
                   const at::Tensor& mask, const at::Tensor& bias, int64_t stride_h,
                   int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                   int64_t dilation_w, int64_t groups, int64_t offset_groups, bool use_mask) {
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
at::Tensor im2col(const char* type, const at::Tensor& input, const at::Tensor& offset,
                  const at::Tensor& mask, OpfDeformParams p, int64_t b0) {
  const int64_t nb = p.batch;
  at::Tensor columns =
      at::empty({p.channels * p.kernel_h * p.kernel_w, nb * p.out_h * p.out_w}, input.options());
  p.total = metal::deform_im2col_items(p);
  const at::Tensor in = input.narrow(0, b0, nb);
  const at::Tensor off = offset.narrow(0, b0, nb);
  const at::Tensor msk = p.use_mask ? mask.narrow(0, b0, nb) : off;  // bound, never read
  Pipeline pso = deform_conv2d_library().pipeline(std::string("deform_im2col_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(p.total), max_threads(pso));
  encode([&](Encoder enc) {
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

at::Tensor deform_conv2d_mps(const at::Tensor& input, const at::Tensor& weight,
                             const at::Tensor& offset, const at::Tensor& mask,
                             const at::Tensor& bias, int64_t stride_h, int64_t stride_w,
                             int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                             int64_t groups, int64_t offset_groups, bool use_mask) {
  const Shape s = check_inputs(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                               dilation_h, dilation_w, groups, offset_groups, use_mask);
  const char* type = metal_type(input, "deform_conv2d");
  const int64_t out_numel = s.batch * s.out_channels * s.out_h * s.out_w;
  if (out_numel == 0)
    return at::zeros({s.batch, s.out_channels, s.out_h, s.out_w}, input.options());
  if (metal::route_to_cpu(metal::kDeformConv2dCrossover, out_numel)) {
    auto out = call_cpu("opforge::deform_conv2d",
                        {input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                         dilation_h, dilation_w, groups, offset_groups, use_mask});
    return to_device(out[0], input.device());
  }
  const at::Tensor input_ = input.contiguous();
  const at::Tensor offset_ = offset.contiguous();
  const at::Tensor mask_ = use_mask ? mask.contiguous() : offset_;
  const at::Tensor weight_g = weight.contiguous().view({groups, s.out_channels / groups, -1});
  at::Tensor output = at::empty({s.batch, s.out_channels, s.out_h, s.out_w}, input.options());
  const int64_t chunk = chunk_size(s);
  for (int64_t b0 = 0; b0 < s.batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, s.batch - b0);
    const OpfDeformParams p = make_params(s, nb, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                          dilation_w, offset_groups, use_mask);
    const at::Tensor columns = im2col(type, input_, offset_, mask_, p, b0);
    const at::Tensor out_g = at::bmm(weight_g, columns.view({groups, -1, columns.size(1)}));
    output.narrow(0, b0, nb).copy_(
        out_g.view({s.out_channels, nb, s.out_h, s.out_w}).transpose(0, 1));
  }
  output.add_(bias.view({1, s.out_channels, 1, 1}));
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward_mps(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const at::Tensor& mask, const at::Tensor& bias, int64_t stride_h,
    int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
    int64_t groups, int64_t offset_groups, bool use_mask) {
  const char* op = "deform_conv2d_backward";
  const Shape s = check_inputs(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                               dilation_h, dilation_w, groups, offset_groups, use_mask);
  check_deform_conv2d_grad(kMpsDeviceType, grad, input, s);
  const char* type = metal_type(input, op);
  const int64_t out_numel = grad.numel();
  if (metal::route_to_cpu(metal::kDeformConv2dCrossover, out_numel)) {
    auto out = call_cpu("opforge::_deform_conv2d_backward",
                        {grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                         dilation_h, dilation_w, groups, offset_groups, use_mask});
    const auto dev = input.device();
    return {to_device(out[0], dev), to_device(out[1], dev), to_device(out[2], dev),
            to_device(out[3], dev), to_device(out[4], dev)};
  }
  const at::Tensor grad_ = grad.contiguous();
  const at::Tensor input_ = input.contiguous();
  const at::Tensor offset_ = offset.contiguous();
  const at::Tensor mask_ = use_mask ? mask.contiguous() : offset_;
  const at::Tensor weight_g = weight.contiguous().view({groups, s.out_channels / groups, -1});
  const auto float_opts = input.options().dtype(at::kFloat);
  at::Tensor grad_input = at::zeros_like(input_, float_opts);
  at::Tensor grad_offset = at::zeros_like(offset_);
  at::Tensor grad_mask = use_mask ? at::zeros_like(mask_) : at::zeros_like(mask);
  at::Tensor grad_weight =
      at::zeros({groups, s.out_channels / groups, weight_g.size(2)}, float_opts);

  Pipeline col2im_pso = deform_conv2d_library().pipeline(std::string("deform_col2im_") + type);
  Pipeline coord_pso = deform_conv2d_library().pipeline(std::string("deform_col2im_coord_") + type);
  const int64_t chunk = chunk_size(s);
  for (int64_t b0 = 0; b0 < s.batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, s.batch - b0);
    OpfDeformParams p = make_params(s, nb, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                                    offset_groups, use_mask);
    // grad of this chunk as [groups, OC/groups, nb*OH*OW].
    const at::Tensor g_out =
        grad_.narrow(0, b0, nb)
            .reshape({nb, s.out_channels, s.out_h * s.out_w})
            .transpose(0, 1)
            .reshape({groups, s.out_channels / groups, nb * s.out_h * s.out_w});
    const at::Tensor grad_columns =
        at::bmm(weight_g.transpose(1, 2), g_out).reshape({-1, nb * s.out_h * s.out_w}).contiguous();
    const at::Tensor off = offset_.narrow(0, b0, nb);
    const at::Tensor msk = use_mask ? mask_.narrow(0, b0, nb) : off;
    const at::Tensor in = input_.narrow(0, b0, nb);
    const at::Tensor gin = grad_input.narrow(0, b0, nb);
    const at::Tensor goff = grad_offset.narrow(0, b0, nb);
    const at::Tensor gmsk = use_mask ? grad_mask.narrow(0, b0, nb) : goff;  // bound, never written
    OpfDeformParams col2im_p = p;
    col2im_p.total = metal::deform_col2im_items(p);
    OpfDeformParams coord_p = p;
    coord_p.total = metal::deform_coord_items(p);
    const Dispatch col2im_d =
        metal::dispatch_1d(static_cast<uint64_t>(col2im_p.total), max_threads(col2im_pso));
    const Dispatch coord_d =
        metal::dispatch_1d(static_cast<uint64_t>(coord_p.total), max_threads(coord_pso));
    encode([&](Encoder enc) {
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
    const at::Tensor columns = im2col(type, input_, offset_, mask_, p, b0);
    grad_weight.add_(
        at::bmm(g_out, columns.view({groups, -1, columns.size(1)}).transpose(1, 2)).to(at::kFloat));
  }
  const auto dtype = input.scalar_type();
  return {grad_input.to(dtype), grad_weight.view(weight.sizes()).to(dtype), grad_offset, grad_mask,
          grad_.sum({0, 2, 3}).to(dtype)};
}

}  // namespace

// TORCH_LIBRARY_IMPL(opforge, MPS, m); see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_mps));
  m.impl("_deform_conv2d_backward", TORCH_FN(deform_conv2d_backward_mps));
}

}  // namespace opforge::mps
