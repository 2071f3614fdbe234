#include "../ops/roi_pool.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

// Computes in float32; the pooled output returns in the input's dtype, argmax stays int32.
template <c10::DispatchKey key, c10::DeviceType device>
std::tuple<at::Tensor, at::Tensor> roi_pool_autocast(const at::Tensor& input,
                                                     const at::Tensor& rois, double spatial_scale,
                                                     c10::SymInt pooled_height,
                                                     c10::SymInt pooled_width) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  auto [output, argmax] =
      ops::roi_pool(to_float<device>(input), to_float<device>(rois), spatial_scale,
                    std::move(pooled_height), std::move(pooled_width));
  return {output.to(input.scalar_type()), argmax};
}

}  // namespace

OPFORGE_AUTOCAST_IMPL("roi_pool", roi_pool_autocast)

}  // namespace opforge::autocast
