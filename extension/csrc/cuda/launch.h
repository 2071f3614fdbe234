// The launch interface between an op's host code (csrc/cuda/<op>_kernel.cpp: checks,
// allocation, dtype dispatch and the op's TORCH_LIBRARY_IMPL, against abi.h) and its device
// code (csrc/cuda/<op>_device.cu: the __global__ kernels). Plain C++, no ATen.
//
// Why two files per op: nvcc parses a .cu once for the host and once per arch of the build's
// arch_list (seven times for cu130's six archs), so a kernel file that included abi.h
// (ATen/ATen.h, torch/library.h) spent ~85 s of a cold build re-reading them; a device file
// that includes only this header compiles in ~8 s, and the host .cpp reads ATen once.
//
// Each launch is one argument struct below (its fields are the kernel's parameters, in order)
// and one overload of
//
//   cudaError_t launch(const Grid& grid, const <Args><scalar_t>& args);
//
// defined in the op's device file and instantiated there for double, float, Half and
// BFloat16 (OPFORGE_INSTANTIATE_LAUNCH); it returns cudaGetLastError() after the launch, which
// the host checks with OPFORGE_CUDA_CHECK. Grid-stride kernels take elementwise_grid(total).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../kernel_limits.h"
#include "../scalar_types.h"

namespace opforge::cuda {

// Threads per block for the element-wise kernels (roi_align, roi_pool, deform_conv2d).
constexpr int kThreadsPerBlock = 256;

struct Grid {
  dim3 blocks;
  dim3 threads;
  size_t shared_bytes;  // dynamic shared memory per block
  cudaStream_t stream;
};

// roi_align

template <typename scalar_t>
struct RoiAlignForward {
  int64_t total;
  const scalar_t* input;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width, sampling_ratio;
  bool aligned;
  scalar_t* output;
};

template <typename scalar_t>
struct RoiAlignBackward {
  int64_t total;
  const scalar_t* grad_output;
  int64_t grad_stride_n, grad_stride_c, grad_stride_h, grad_stride_w;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width, sampling_ratio;
  bool aligned;
  opmath_t<scalar_t>* grad_input;
};

// roi_pool

template <typename scalar_t>
struct RoiPoolForward {
  int64_t total;
  const scalar_t* input;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width;
  scalar_t* output;
  int32_t* argmax;
};

template <typename scalar_t>
struct RoiPoolBackward {
  int64_t total;
  const scalar_t* grad_output;
  int64_t grad_stride_n, grad_stride_c, grad_stride_h, grad_stride_w;
  const scalar_t* rois;
  const int32_t* argmax;  // contiguous (K, C, PH, PW)
  int64_t batch_size, channels, height, width, pooled_height, pooled_width;
  opmath_t<scalar_t>* grad_input;
};

// ps_roi_align and ps_roi_pool (ps_roi_pool has no sampling_ratio)

template <typename scalar_t>
struct PsRoiAlignForward {
  int64_t total;
  const scalar_t* input;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width, sampling_ratio, channels_out;
  scalar_t* output;
  int32_t* channel_mapping;
};

template <typename scalar_t>
struct PsRoiAlignBackward {
  int64_t total;
  const scalar_t* grad_output;  // contiguous [K, C_out, PH, PW]
  const int32_t* channel_mapping;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width, sampling_ratio, channels_out;
  opmath_t<scalar_t>* grad_input;
};

template <typename scalar_t>
struct PsRoiPoolForward {
  int64_t total;
  const scalar_t* input;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width, channels_out;
  scalar_t* output;
  int32_t* channel_mapping;
};

template <typename scalar_t>
struct PsRoiPoolBackward {
  int64_t total;
  const scalar_t* grad_output;  // contiguous [K, C_out, PH, PW]
  const int32_t* channel_mapping;
  const scalar_t* rois;
  int64_t batch_size;
  double spatial_scale;
  int64_t channels, height, width, pooled_height, pooled_width, channels_out;
  opmath_t<scalar_t>* grad_input;
};

// nms: a (col_blocks, col_blocks) grid of kNmsBoxesPerBlock threads builds the mask, then one
// block of kNmsReduceThreads threads with col_blocks words of shared memory reduces it.

constexpr int kNmsBoxesPerBlock = 64;  // one bit per box in a 64-bit word
constexpr int kNmsReduceThreads = 512;

template <typename scalar_t>
struct NmsMask {
  int64_t n_boxes;
  double iou_threshold;
  const scalar_t* boxes;     // sorted by score, (n_boxes, 4) contiguous
  unsigned long long* mask;  // (n_boxes, col_blocks)
  int64_t col_blocks;
};

struct NmsReduce {
  int64_t n_boxes, col_blocks;
  const unsigned long long* mask;
  const int64_t* order;  // sorted position -> original box index
  int64_t* keep;         // (n_boxes,), the first *num_kept entries are written
  int64_t* num_kept;
};

// Raises the reduce kernel's dynamic shared memory limit past 48 KiB when grid asks for more.
cudaError_t launch(const Grid& grid, const NmsReduce& args);

// deform_conv2d: the geometry the kernels share, and columns for images b0 .. b0 + images - 1.

struct DeformGeometry {
  int64_t channels, height, width;
  int64_t kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t out_h, out_w;
  int64_t offset_groups, channels_per_offset_group;
  bool use_mask;
};

template <typename scalar_t>
struct DeformIm2col {
  int64_t total;
  DeformGeometry g;
  int64_t b0, images;
  const scalar_t* input;
  const scalar_t* offset;
  const scalar_t* mask;  // nullptr without a mask
  scalar_t* columns;
};

template <typename scalar_t>
struct DeformCol2im {
  int64_t total;
  DeformGeometry g;
  int64_t b0, images;
  const scalar_t* columns_grad;
  const scalar_t* offset;
  const scalar_t* mask;
  opmath_t<scalar_t>* grad_input;
};

template <typename scalar_t>
struct DeformCoordGrad {
  int64_t total;
  DeformGeometry g;
  int64_t b0, images;
  const scalar_t* columns_grad;
  const scalar_t* input;
  const scalar_t* offset;
  const scalar_t* mask;
  scalar_t* grad_offset;
  scalar_t* grad_mask;  // nullptr without a mask
};

// One overload per templated struct above, for every floating type.
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiAlignForward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiAlignBackward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiPoolForward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiPoolBackward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiAlignForward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiAlignBackward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiPoolForward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiPoolBackward<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const NmsMask<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const DeformIm2col<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const DeformCol2im<scalar_t>& args);
template <typename scalar_t>
cudaError_t launch(const Grid& grid, const DeformCoordGrad<scalar_t>& args);

}  // namespace opforge::cuda
