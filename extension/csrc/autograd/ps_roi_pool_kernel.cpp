// ps_roi_pool's Autograd kernel: the gradient flows to the input only; channel_mapping is an index
// output (not differentiable) that the backward reads (index_pool.h, shared with roi_pool).
#include <torch/library.h>

#include "../ops/ps_roi_pool.h"
#include "index_pool.h"

namespace opforge::autograd {
namespace {

struct PSRoIPool {
  static constexpr const char* name = "ps_roi_pool";
  static constexpr const char* backward_name = "opforge::_ps_roi_pool_backward";
  static constexpr auto forward = &ops::ps_roi_pool;
  static constexpr auto backward = &ops::_ps_roi_pool_backward;
};

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("ps_roi_pool", TORCH_FN(IndexPool<PSRoIPool>::forward_kernel));
  m.impl("_ps_roi_pool_backward", TORCH_FN(IndexPool<PSRoIPool>::backward_kernel));
}

}  // namespace opforge::autograd
