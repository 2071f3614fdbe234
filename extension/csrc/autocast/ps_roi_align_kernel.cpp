#include "../ops/ps_roi_align.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

// Computes in float32; the output returns in the input's dtype, channel_mapping stays int32.
template <c10::DispatchKey key, c10::DeviceType device>
std::tuple<at::Tensor, at::Tensor> ps_roi_align_autocast(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
    c10::SymInt pooled_height, c10::SymInt pooled_width, int64_t sampling_ratio) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  auto [output, channel_mapping] =
      ops::ps_roi_align(to_float<device>(input), to_float<device>(rois), spatial_scale,
                        std::move(pooled_height), std::move(pooled_width), sampling_ratio);
  return {output.to(input.scalar_type()), channel_mapping};
}

}  // namespace

OPFORGE_AUTOCAST_IMPL("ps_roi_align", ps_roi_align_autocast)

}  // namespace opforge::autocast
