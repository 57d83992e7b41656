// The Python module edsc_ext._C: importing it loads this binary, whose static initializers register
// the ops (src/registration.cpp); its one function reports how the binary was built. A plain
// CPython module on the limited API (abi3): no pybind11 and no libtorch_python, whose C++ ABI
// changes with every torch release. EDSC_EXT_NO_PYTHON (the CMake build): a plain shared library
// for torch.ops.load_library, without this module.
#ifndef EDSC_EXT_NO_PYTHON
#include <Python.h>
#include <torch/headeronly/version.h>

#include "torch_stable.h"  // EDSC_EXT_STRINGIFY

#ifdef EDSC_EXT_WITH_CUDA
#include <cuda.h>  // CUDA_VERSION of the toolkit this binary was built with
#endif

// The build passes the architectures as underscore-separated integers, e.g. 80_90a
// (edsc_ext/_build_support.py: arch_macros).
#define EDSC_EXT_CONCAT_(a, b) a##b
#define EDSC_EXT_CONCAT(a, b) EDSC_EXT_CONCAT_(a, b)

namespace {

// Sets info[key] = value (a new reference, consumed); false on a Python error.
bool set_item(PyObject* info, const char* key, PyObject* value) {
  if (value == nullptr) return false;
  const int status = PyDict_SetItemString(info, key, value);
  Py_DECREF(value);
  return status == 0;
}

// build_info() -> dict: the torch headers the binary was compiled with, the stable-ABI version it
// targets (the oldest torch it runs with), and its CUDA toolkit and architectures.
PyObject* build_info(PyObject* /*self*/, PyObject* /*args*/) {
  PyObject* info = PyDict_New();
  if (info == nullptr) return nullptr;
  const unsigned long long target = TORCH_TARGET_VERSION;
  bool ok = set_item(info, "torch_version",
                     PyUnicode_FromFormat("%d.%d.%d", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH)) &&
            set_item(info, "torch_floor",
                     PyUnicode_FromFormat("%d.%d", static_cast<int>((target >> 56) & 0xff),
                                          static_cast<int>((target >> 48) & 0xff)));
#ifdef EDSC_EXT_WITH_CUDA
  ok = ok && set_item(info, "with_cuda", PyBool_FromLong(1)) &&
       set_item(info, "cuda_version", PyUnicode_FromFormat("%d.%d", CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10)) &&
       set_item(info, "cuda_sass_archs", PyUnicode_FromString(EDSC_EXT_STRINGIFY(EDSC_EXT_CUDA_SASS))) &&
       set_item(info, "cuda_ptx_archs", PyUnicode_FromString(EDSC_EXT_STRINGIFY(EDSC_EXT_CUDA_PTX)));
#else
  Py_INCREF(Py_None);
  ok = ok && set_item(info, "with_cuda", PyBool_FromLong(0)) && set_item(info, "cuda_version", Py_None) &&
       set_item(info, "cuda_sass_archs", PyUnicode_FromString("")) &&
       set_item(info, "cuda_ptx_archs", PyUnicode_FromString(""));
#endif
  if (!ok) {
    Py_DECREF(info);
    return nullptr;
  }
  return info;
}

PyMethodDef methods[] = {
    {"build_info", build_info, METH_NOARGS, "How this binary was built (a dict)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    EDSC_EXT_STRINGIFY(TORCH_EXTENSION_NAME),
    "edsc_ext compiled ops (registered under torch.ops.edsc_ext) and build facts",
    -1,
    methods,
};

}  // namespace

// PyInit_<module name>: _C for setup.py's build, another name for the JIT's.
extern "C" PyMODINIT_FUNC EDSC_EXT_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module_def); }
#endif  // EDSC_EXT_NO_PYTHON
