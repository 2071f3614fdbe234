// Emulation stub: one thread runs at a time, so an atomic add is a plain add.
#pragma once
template <typename T>
inline T gpuAtomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
