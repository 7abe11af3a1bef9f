#include "output_alloc.h"

#include <string>

namespace py = pybind11;

namespace rn {
namespace {

// The NumPy dtype name cupy stores each dtype as.
const char* array_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "uint16";  // bf16 bit patterns: cupy has no bfloat16
    case DType::I32:
      return "int32";
    case DType::U8:
    case DType::FP8:  // E4M3 codes: cupy has no fp8
      return "uint8";
    case DType::I8:
      return "int8";
    case DType::F64:
      return "float64";
  }
  return "float32";
}

// cupy.empty, imported on first use and kept (py::module_::import per call goes through __import__). Runs under
// the GIL, which serialises the first call.
const py::object& cupy_empty(const char* name) {
  static const py::object* empty = nullptr;
  if (empty == nullptr) {
    py::object cupy;
    try {
      cupy = py::module_::import("cupy");
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_ImportError)) throw;
      throw py::import_error(std::string(name) +
                             ": allocating the output needs cupy (pip install cupy-cuda13x or cupy-cuda12x); "
                             "or pass the output array in");
    }
    empty = new py::object(cupy.attr("empty"));  // never freed: cupy outlives every op
  }
  return *empty;
}

}  // namespace

py::object new_device_array(const std::vector<int64_t>& shape, DType dtype, const char* name) {
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = shape[i];
  return cupy_empty(name)(t, py::arg("dtype") = array_dtype(dtype));
}

}  // namespace rn
