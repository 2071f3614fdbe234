#include <torch/library.h>

#include "../ops/roi_pool.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

// Computes in float32; the pooled output returns in the input's dtype, argmax stays int32.
template <c10::DispatchKey key, c10::DeviceType device>
std::tuple<at::Tensor, at::Tensor> roi_pool_autocast(
    const at::Tensor& input,
    const at::Tensor& rois,
    double spatial_scale,
    c10::SymInt pooled_height,
    c10::SymInt pooled_width) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  auto [output, argmax] = ops::roi_pool(
      to_float<device>(input), to_float<device>(rois), spatial_scale,
      std::move(pooled_height), std::move(pooled_width));
  return {output.to(input.scalar_type()), argmax};
}

} // namespace

TORCH_LIBRARY_IMPL(opforge, AutocastCPU, m) {
  m.impl("roi_pool", TORCH_FN((roi_pool_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>)));
}

#ifdef WITH_CUDA
TORCH_LIBRARY_IMPL(opforge, AutocastCUDA, m) {
  m.impl("roi_pool", TORCH_FN((roi_pool_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>)));
}
#endif

#ifdef WITH_MPS
TORCH_LIBRARY_IMPL(opforge, AutocastMPS, m) {
  m.impl("roi_pool", TORCH_FN((roi_pool_autocast<c10::DispatchKey::AutocastMPS, c10::DeviceType::MPS>)));
}
#endif

} // namespace opforge::autocast
