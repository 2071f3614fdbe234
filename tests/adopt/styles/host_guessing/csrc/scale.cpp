#include <torch/extension.h>

at::Tensor scale_cpu(const at::Tensor& x, double a) { return x * a; }

TORCH_LIBRARY(host_guessing, m) { m.def("scale(Tensor x, float a) -> Tensor"); }

TORCH_LIBRARY_IMPL(host_guessing, CPU, m) { m.impl("scale", &scale_cpu); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
