// Plane-major order for the position-sensitive kernels (ps_roi_align, ps_roi_pool).
// Each output channel of a bin reads its own input channel, so a roi-major loop
// touches a different plane at every bin: one or two cache lines each, nearly all
// misses. Taken plane by plane instead (every roi of an image in one input channel,
// then the next channel), a plane is loaded once and stays in cache while every roi
// reads its bin from it. Writes stay disjoint: an (image, channel) plane is one
// item, and each grad entry maps to one input channel.
#pragma once

#include <cstdint>
#include <vector>

namespace opforge::cpu {

// Items grouped by a key in [0, keys), each group in item order (a stable counting sort):
// group k is order[first[k] .. first[k + 1]).
struct Groups {
  std::vector<int64_t> first, order;
};

template <typename KeyOf>
Groups group_by(int64_t items, int64_t keys, const KeyOf& key_of) {
  Groups g;
  g.first.assign(keys + 1, 0);
  for (int64_t i = 0; i < items; ++i) {
    ++g.first[key_of(i) + 1];
  }
  for (int64_t k = 0; k < keys; ++k) {
    g.first[k + 1] += g.first[k];
  }
  g.order.resize(items);
  std::vector<int64_t> next(g.first.begin(), g.first.end() - 1);
  for (int64_t i = 0; i < items; ++i) {
    g.order[next[key_of(i)]++] = i;
  }
  return g;
}

// The rois of each image, in roi order (batch indices already checked to be in range).
template <typename scalar_t>
Groups rois_by_image(const scalar_t* roi_p, int64_t num_rois, int64_t batch) {
  return group_by(num_rois, batch,
                  [&](int64_t n) { return static_cast<int64_t>(roi_p[n * 5]); });
}

// The grad entries of each input channel, in entry order: the channel mapping inverted
// (its values already checked to be channels).
inline Groups entries_by_channel(const int32_t* mapping, int64_t entries, int64_t channels) {
  return group_by(entries, channels, [&](int64_t i) { return static_cast<int64_t>(mapping[i]); });
}

}  // namespace opforge::cpu
