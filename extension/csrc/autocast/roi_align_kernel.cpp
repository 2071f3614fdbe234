#include "../ops/roi_align.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

// Computes in float32 and returns the input's dtype.
template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor roi_align_autocast(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                              c10::SymInt pooled_height, c10::SymInt pooled_width,
                              int64_t sampling_ratio, bool aligned) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return ops::roi_align(to_float<device>(input), to_float<device>(rois), spatial_scale,
                        std::move(pooled_height), std::move(pooled_width), sampling_ratio, aligned)
      .to(input.scalar_type());
}

}  // namespace

OPFORGE_AUTOCAST_IMPL("roi_align", roi_align_autocast)

}  // namespace opforge::autocast
