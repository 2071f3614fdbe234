#include <Python.h>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

using torch::stable::Tensor;

extern "C" {
// an importable module with no Python functions: `import stabops._C` loads the ops
PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
}

// out = a * x + b * y, float32, same shapes
Tensor axpby(const Tensor& x, const Tensor& y, double a, double b) {
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float &&
                      y.scalar_type() == torch::headeronly::ScalarType::Float,
                  "axpby: float32 tensors only");
  STD_TORCH_CHECK(x.numel() == y.numel(), "axpby: x and y differ in size");
  Tensor xc = torch::stable::contiguous(x);
  Tensor yc = torch::stable::contiguous(y);
  Tensor out = torch::stable::empty_like(xc);
  const float* px = static_cast<const float*>(xc.data_ptr());
  const float* py = static_cast<const float*>(yc.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < xc.numel(); i++) po[i] = a * px[i] + b * py[i];
  return out;
}

// the sum of the rows of a 2-D float32 tensor
Tensor row_sum(const Tensor& x) {
  STD_TORCH_CHECK(x.dim() == 2, "row_sum: a 2-D tensor");
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float, "row_sum: float32");
  Tensor xc = torch::stable::contiguous(x);
  Tensor out = torch::stable::new_empty(xc, {xc.size(0)});
  const float* px = static_cast<const float*>(xc.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  for (int64_t r = 0; r < xc.size(0); r++) {
    float acc = 0;
    for (int64_t c = 0; c < xc.size(1); c++) acc += px[r * xc.size(1) + c];
    po[r] = acc;
  }
  return out;
}

STABLE_TORCH_LIBRARY(stabops, m) {
  m.def("axpby(Tensor x, Tensor y, float a, float b) -> Tensor");
  m.def("row_sum(Tensor x) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(stabops, CPU, m) {
  m.impl("axpby", TORCH_BOX(&axpby));
  m.impl("row_sum", TORCH_BOX(&row_sum));
}
