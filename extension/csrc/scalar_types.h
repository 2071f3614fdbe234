// The element types every kernel file names, host and device alike, with no other torch header:
// opforge::Half, opforge::BFloat16 and opmath_t<T>, the type a kernel computes T in. abi.h
// includes it for the host code; csrc/cuda/launch.h for the CUDA device code, which nvcc
// parses once per arch and so must stay light (see launch.h).
#pragma once

#if __has_include(<torch/headeronly/util/Half.h>)
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#else  // a torch older than headeronly's types (legacy ABI only)
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#endif

namespace opforge {

using Half = c10::Half;
using BFloat16 = c10::BFloat16;

// Half and bfloat16 compute in float, as at::opmath_type.
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<Half> {
  using type = float;
};
template <>
struct OpMath<BFloat16> {
  using type = float;
};
template <typename T>
using opmath_t = typename OpMath<T>::type;

}  // namespace opforge
