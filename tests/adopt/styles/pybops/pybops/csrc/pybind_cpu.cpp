#include "iou.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pairwise_iou", &pairwise_iou_cpu, "IoU of every pair of boxes (CPU)",
        py::arg("boxes1"), py::arg("boxes2"));
  m.def("count_above", &count_above_cpu, "how many scores exceed the threshold",
        py::arg("scores"), py::arg("threshold") = 0.5);
}
