// The compiled library is loaded by opforge_ops._loader with ctypes; its
// TORCH_LIBRARY blocks register the ops. This empty module only makes
// `import opforge_ops._C` work too.
#include <Python.h>

static struct PyModuleDef opforge_c_module = {
    PyModuleDef_HEAD_INIT, "_C", "opforge_ops compiled operators (registered in torch.ops.opforge)",
    -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) {
  return PyModule_Create(&opforge_c_module);
}
