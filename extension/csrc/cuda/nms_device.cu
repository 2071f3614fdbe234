// CUDA kernel for opforge::nms (dispatch key CUDA).
//
// 1. Sort boxes by score on the device.
// 2. nms_mask_kernel: block (r, c) compares the 64 boxes of row block r with the 64 boxes
//    of column block c (c >= r) and writes one 64-bit word per row box: bit k is set when
//    IoU(row box, column box c*64+k) > iou_threshold and the column box comes later.
// 3. nms_reduce_kernel: ONE block walks the sorted boxes in order, keeping the
//    "removed" bitmask in shared memory, and writes the kept indices and their count on
//    the device. The N x N/64 mask never leaves the device.
// 4. The host reads the 8-byte count (the one device->host sync of this op, needed to
//    size the result tensor) and returns a view of the first `count` indices.
#include "device.cuh"

namespace opforge::cuda {
namespace {

constexpr int kBoxesPerBlock = kNmsBoxesPerBlock;  // one bit per box in a 64-bit word

// Products that nvcc must not fuse into an FMA, so that IoU rounds like the CPU kernel's.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}

// IoU of boxes a and b (x1, y1, x2, y2), computed in T (float for half types), with the
// same operations as the CPU kernel.
template <typename T>
__device__ __forceinline__ T iou(const T* a, const T* b) {
  const T left = a[0] > b[0] ? a[0] : b[0];
  const T top = a[1] > b[1] ? a[1] : b[1];
  const T right = a[2] < b[2] ? a[2] : b[2];
  const T bottom = a[3] < b[3] ? a[3] : b[3];
  const T w = right - left > T(0) ? right - left : T(0);
  const T h = bottom - top > T(0) ? bottom - top : T(0);
  const T inter = mul_rn(w, h);
  const T area_a = mul_rn(a[2] - a[0], a[3] - a[1]);
  const T area_b = mul_rn(b[2] - b[0], b[3] - b[1]);
  return inter / (area_a + area_b - inter);
}

template <typename scalar_t>
__global__ void nms_mask_kernel(
    int64_t n_boxes, double iou_threshold,
    const scalar_t* __restrict__ boxes,     // sorted by score, (n_boxes, 4) contiguous
    unsigned long long* __restrict__ mask,  // (n_boxes, col_blocks)
    int64_t col_blocks) {
  using opmath_t = ::opforge::opmath_t<scalar_t>;
  const int64_t row_block = blockIdx.y;
  const int64_t col_block = blockIdx.x;
  // Only the upper triangle is needed: a box is suppressed only by higher-scored ones.
  if (row_block > col_block) {
    return;
  }
  const int row_size =
      static_cast<int>(min(n_boxes - row_block * kBoxesPerBlock, int64_t(kBoxesPerBlock)));
  const int col_size =
      static_cast<int>(min(n_boxes - col_block * kBoxesPerBlock, int64_t(kBoxesPerBlock)));

  __shared__ opmath_t col_boxes[kBoxesPerBlock * 4];
  if (threadIdx.x < col_size) {
    const int64_t src = (col_block * kBoxesPerBlock + threadIdx.x) * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      col_boxes[threadIdx.x * 4 + k] = static_cast<opmath_t>(boxes[src + k]);
    }
  }
  __syncthreads();

  if (threadIdx.x < row_size) {
    const int64_t row = row_block * kBoxesPerBlock + threadIdx.x;
    opmath_t row_box[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      row_box[k] = static_cast<opmath_t>(boxes[row * 4 + k]);
    }
    unsigned long long bits = 0;
    const int start = (row_block == col_block) ? threadIdx.x + 1 : 0;
    // Compared in opmath_t, like the CPU kernel.
    const opmath_t threshold = static_cast<opmath_t>(iou_threshold);
    for (int k = start; k < col_size; ++k) {
      if (iou(row_box, col_boxes + k * 4) > threshold) {
        bits |= 1ULL << k;
      }
    }
    mask[row * col_blocks + col_block] = bits;
  }
}

// One block. For each group of 64 sorted boxes: load the group's diagonal mask words,
// let thread 0 resolve which boxes of the group survive (a serial walk over 64 bits in
// shared memory), write their indices, then OR the rows of the kept boxes into the
// shared "removed" words of all later groups, in parallel over the words.
__global__ void nms_reduce_kernel(
    int64_t n_boxes, int64_t col_blocks, const unsigned long long* __restrict__ mask,
    const int64_t* __restrict__ order,  // sorted position -> original box index
    int64_t* __restrict__ keep,         // (n_boxes,), the first *num_kept entries are written
    int64_t* __restrict__ num_kept) {
  extern __shared__ unsigned long long removed[];  // col_blocks words
  __shared__ unsigned long long diag[kBoxesPerBlock];
  __shared__ unsigned long long kept_word;

  for (int64_t j = threadIdx.x; j < col_blocks; j += blockDim.x) {
    removed[j] = 0;
  }
  __syncthreads();

  int64_t written = 0;  // identical in every thread
  for (int64_t block = 0; block < col_blocks; ++block) {
    const int64_t base = block * kBoxesPerBlock;
    const int size = static_cast<int>(min(n_boxes - base, int64_t(kBoxesPerBlock)));
    if (threadIdx.x < size) {
      diag[threadIdx.x] = mask[(base + threadIdx.x) * col_blocks + block];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long gone = removed[block];
      unsigned long long kept = 0;
      for (int b = 0; b < size; ++b) {
        if (!((gone >> b) & 1ULL)) {
          kept |= 1ULL << b;
          gone |= diag[b];
        }
      }
      kept_word = kept;
    }
    __syncthreads();
    const unsigned long long kept = kept_word;
    if (threadIdx.x < size && ((kept >> threadIdx.x) & 1ULL)) {
      const unsigned long long below = kept & ((1ULL << threadIdx.x) - 1ULL);
      keep[written + __popcll(below)] = order[base + threadIdx.x];
    }
    written += __popcll(kept);
    // Each later word j is owned by one thread during this group: no races.
    for (int64_t j = block + 1 + threadIdx.x; j < col_blocks; j += blockDim.x) {
      unsigned long long acc = removed[j];
      unsigned long long todo = kept;
      while (todo) {
        const int b = __ffsll(static_cast<long long>(todo)) - 1;
        todo &= todo - 1ULL;
        acc |= mask[(base + b) * col_blocks + j];
      }
      removed[j] = acc;
    }
    // The next group's first __syncthreads orders these writes before thread 0 reads.
  }
  if (threadIdx.x == 0) {
    *num_kept = written;
  }
}

}  // namespace

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const NmsMask<scalar_t>& a) {
  nms_mask_kernel<scalar_t><<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
      a.n_boxes, a.iou_threshold, a.boxes, a.mask, a.col_blocks);
  return cudaGetLastError();
}

cudaError_t launch(const Grid& grid, const NmsReduce& a) {
  if (grid.shared_bytes > 48 * 1024) {
    const cudaError_t raised =
        cudaFuncSetAttribute(nms_reduce_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(grid.shared_bytes));
    if (raised != cudaSuccess) {
      return raised;
    }
  }
  nms_reduce_kernel<<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
      a.n_boxes, a.col_blocks, a.mask, a.order, a.keep, a.num_kept);
  return cudaGetLastError();
}

OPFORGE_INSTANTIATE_LAUNCH(NmsMask);

}  // namespace opforge::cuda
