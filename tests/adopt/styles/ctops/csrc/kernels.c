#include <stdint.h>

/* out[i] = a * x[i] + y[i] */
void cfloat_saxpy(const float* x, const float* y, float* out, float a, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a * x[i] + y[i];
}

/* x[i] = min(max(x[i], lo), hi), in place */
void cfloat_clamp_(float* x, float lo, float hi, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}
