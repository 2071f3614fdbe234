// What the position-sensitive kernels (ps_roi_align, ps_roi_pool) share on the CPU: the
// argument handling of their forward and backward, and the backward's walk by input channel.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "../common.h"
#include "contiguous.h"
#include "roi_grid.h"

namespace opforge::cpu {

// Whether channel_mapping is the one the forward returns: entry e = c_out * bins + bin of
// every roi names input channel e.
inline bool is_forward_mapping(const int32_t* mapping, int64_t num_rois, int64_t per_roi) {
  for (int64_t n = 0; n < num_rois; ++n) {
    for (int64_t e = 0; e < per_roi; ++e) {
      if (mapping[n * per_roi + e] != e) {
        return false;
      }
    }
  }
  return true;
}

// Calls add(n, e, bin, c_in) for every grad entry g[n * per_roi + e] that the backward's chunk
// of input channels [c_begin, c_end) owns, each gradient element receiving its sums in roi
// order. Under the forward's mapping, channel c's entries are e = c of every roi: the walk
// goes plane by plane (the plane stays in cache while every roi adds into it), asking for the
// grad values kAhead rois on. Under any other mapping it goes roi by roi, every chunk reading
// every entry's channel.
constexpr int64_t kAhead = 4;

template <typename T, typename F>
void for_each_owned_entry(const int32_t* mapping, bool forward_mapping, const T* g,
                          int64_t num_rois, int64_t per_roi, int64_t bins, int64_t c_begin,
                          int64_t c_end, const F& add) {
  if (forward_mapping) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int64_t bin = c % bins;
      for (int64_t n = 0; n < num_rois; ++n) {
        if (n + kAhead < num_rois) {
          prefetch(g + (n + kAhead) * per_roi + c);
        }
        add(n, c, bin, c);
      }
    }
    return;
  }
  for (int64_t n = 0; n < num_rois; ++n) {
    const int32_t* m = mapping + n * per_roi;
    for (int64_t e0 = 0; e0 < per_roi; e0 += bins) {
      for (int64_t bin = 0; bin < bins; ++bin) {
        const int64_t c_in = m[e0 + bin];
        if (c_in >= c_begin && c_in < c_end) {
          add(n, e0 + bin, bin, c_in);
        }
      }
    }
  }
}

// Checks the forward's arguments (then sampling_ratio: 0 for ps_roi_pool), allocates its output and
// channel mapping (rois, C / (PH * PW), PH, PW), and calls impl(input, rois, output,
// channel_mapping) with the scalar type dispatched, unless the output is empty.
template <typename Impl>
std::tuple<Tensor, Tensor> ps_roi_forward(const char* op, const Tensor& input, const Tensor& rois,
                                          int64_t pooled_height, int64_t pooled_width,
                                          int64_t sampling_ratio, const Impl& impl) {
  check_ps_roi_inputs(op, input, rois, pooled_height, pooled_width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  const int64_t channels_out = input.size(1) / (pooled_height * pooled_width);
  const std::vector<int64_t> shape{rois.size(0), channels_out, pooled_height, pooled_width};
  Tensor output = alloc_empty(input, shape);
  Tensor channel_mapping = alloc_empty(input, shape, ScalarType::Int);
  if (output.numel() == 0) {
    return {output, channel_mapping};
  }
  const Tensor input_c = contiguous_planes(input);
  const Tensor rois_c = as_contiguous(rois);
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), op, [&] {
    check_rois_values(op, rois_c.const_data_ptr<scalar_t>(), rois_c.size(0), input.size(0));
    impl(scalar_t(), input_c, rois_c, output, channel_mapping);
  });
  return {output, channel_mapping};
}

// Checks the backward's arguments (then sampling_ratio: 0 for ps_roi_pool) and calls impl(grad,
// rois, channel_mapping, grad_input) with the scalar type dispatched, grad_input of the opmath
// type: zeros, or (impl_zeroes) uninitialized for impl to zero every element before adding into
// it; returns it in grad's type.
template <typename Impl>
Tensor ps_roi_backward(const char* op, const Tensor& grad, const Tensor& rois,
                       const Tensor& channel_mapping, int64_t pooled_height, int64_t pooled_width,
                       int64_t batch_size, int64_t channels, int64_t height, int64_t width,
                       int64_t sampling_ratio, const Impl& impl, bool impl_zeroes = false) {
  check_ps_roi_backward_inputs(op, grad, rois, channel_mapping, pooled_height, pooled_width,
                               batch_size, channels, height, width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  const auto acc_dtype = opmath_dtype(grad.scalar_type());
  const std::vector<int64_t> shape{batch_size, channels, height, width};
  if (grad.numel() == 0 || batch_size == 0 || channels == 0 || height == 0 || width == 0) {
    return to_dtype(alloc_zeros(grad, shape, acc_dtype), grad.scalar_type());
  }
  Tensor grad_input =
      impl_zeroes ? alloc_empty(grad, shape, acc_dtype) : alloc_zeros(grad, shape, acc_dtype);
  const Tensor grad_c = contiguous_planes(grad);
  const Tensor rois_c = as_contiguous(rois);
  const Tensor mapping_c = contiguous_planes(channel_mapping);
  check_channel_mapping_values(op, mapping_c, channels);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), op, [&] {
    check_rois_values(op, rois_c.const_data_ptr<scalar_t>(), rois_c.size(0), batch_size);
    impl(scalar_t(), grad_c, rois_c, mapping_c, grad_input);
  });
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace opforge::cpu
