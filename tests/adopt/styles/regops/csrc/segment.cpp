#include <torch/script.h>

#include "cpu/segment_cpu.h"
#ifdef WITH_CUDA
#include "cuda/segment_cuda.h"
#endif

// sum of src over the segments ptr delimits: out[i] = src[ptr[i]:ptr[i+1]].sum(0)
torch::Tensor segment_sum(torch::Tensor src, torch::Tensor ptr) {
  if (src.device().is_cuda()) {
#ifdef WITH_CUDA
    return segment_sum_cuda(src, ptr);
#else
    AT_ERROR("Not compiled with CUDA support");
#endif
  }
  return segment_sum_cpu(src, ptr);
}

torch::Tensor gather_rows(torch::Tensor src, torch::Tensor index) {
  return src.index_select(0, index);
}

int64_t cuda_version() {
#ifdef WITH_CUDA
  return 13000;
#else
  return -1;
#endif
}

static auto registry =
    torch::RegisterOperators()
        .op("regops::segment_sum", &segment_sum)
        .op("regops::gather_rows(Tensor src, Tensor index) -> Tensor", &gather_rows)
        .op("regops::cuda_version", &cuda_version);
