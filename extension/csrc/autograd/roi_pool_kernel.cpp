// roi_pool's Autograd kernel: the gradient flows to the input only; argmax is an index output
// (not differentiable) that the backward reads (index_pool.h, shared with ps_roi_pool).
#include <torch/library.h>

#include "../ops/roi_pool.h"
#include "index_pool.h"

namespace opforge::autograd {
namespace {

struct RoIPool {
  static constexpr const char* name = "roi_pool";
  static constexpr const char* backward_name = "opforge::_roi_pool_backward";
  static constexpr auto forward = &ops::roi_pool;
  static constexpr auto backward = &ops::_roi_pool_backward;
};

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("roi_pool", TORCH_FN(IndexPool<RoIPool>::forward_kernel));
  m.impl("_roi_pool_backward", TORCH_FN(IndexPool<RoIPool>::backward_kernel));
}

}  // namespace opforge::autograd
