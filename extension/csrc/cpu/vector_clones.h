// Vector width chosen at load time. The kernels are compiled for the baseline x86-64 (SSE2)
// like the rest of the extension; a function marked with one of these macros is also compiled
// for wider vector units (GCC's function multiversioning: an ifunc, which glibc resolves once
// at load time, picks the clone). Elsewhere (other compilers, other platforms) it is the one
// baseline version.
//
//   OPFORGE_VECTOR_CLONES        AVX-512 (x86-64-v4) and AVX2 (x86-64-v3) clones. Both have
//                                FMA, which GCC may fuse multiply-adds into: a rounding-level
//                                difference from the baseline build.
//   OPFORGE_EXACT_VECTOR_CLONES  an AVX2 clone without FMA: each element's arithmetic is the
//                                baseline's, operation for operation, so results are
//                                bit-identical on every machine.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    defined(__GLIBC__)
#define OPFORGE_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define OPFORGE_EXACT_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define OPFORGE_VECTOR_CLONES
#define OPFORGE_EXACT_VECTOR_CLONES
#endif
