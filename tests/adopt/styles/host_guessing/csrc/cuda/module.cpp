#include <torch/extension.h>

at::Tensor scale_cuda(const at::Tensor& x, double a);

TORCH_LIBRARY_IMPL(host_guessing, CUDA, m) { m.impl("scale", &scale_cuda); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale_cuda); }
