#ifndef ASYNCPS_PYTHON_ARRAYS_H_
#define ASYNCPS_PYTHON_ARRAYS_H_

// The array arguments of Client's calls: numpy arrays and CPU torch tensors
// (viewed as numpy arrays, without a copy), checked against what the cluster
// holds before anything is sent, and the {name: array} dicts and name lists
// they come in. Every check raises TypeError or ValueError naming the call
// and the tensor or table.
//
// Example:
//   CheckDict(arrays, "push");
//   for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(arrays))
//     py::array a = CheckArray(value, *spec, /*writeable=*/false, "push");

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "proto/asyncps.pb.h"

namespace asyncps {
namespace python {

namespace py = pybind11;

// `obj` itself when it is a numpy array; a CPU torch.Tensor's memory as a
// numpy array (no copy: writes reach the tensor); anything else as it is
// (the caller's check names it). TypeError for a tensor on another device.
py::object ArrayView(const py::handle& obj, const std::string& what);

// True when every value of a float32 array is finite.
bool AllFiniteArray(const py::array& a);

// `obj` (a numpy array or CPU torch tensor) as a float32 C-contiguous numpy
// array holding exactly the elements of `spec` in its shape; TypeError /
// ValueError naming the tensor if not.
py::array CheckArray(const py::handle& original, const TensorSpec& spec,
                     bool writeable, const char* method);

// Tensor names: a str (one name) or a sequence of str; TypeError naming
// `method` otherwise.
std::vector<std::string> NameList(const py::object& names, const char* method);

// The name of every item of a {name: array} dict, checked to be a str.
std::string KeyName(const py::handle& key, const char* method);

// TypeError naming `method` unless `obj` is a dict.
void CheckDict(const py::handle& obj, const char* method);

// Row ids: a 1-D sequence or array of non-negative integers, as uint64.
py::array_t<uint64_t> CheckIds(const py::handle& obj, const std::string& table,
                               const char* method);

// Row gradients (or values): float32, C-contiguous, shape (n, dim); not
// converted.
py::array CheckRowGrads(const py::handle& original, const std::string& table,
                        py::ssize_t n, int32_t dim, const char* method,
                        const char* what);

}  // namespace python
}  // namespace asyncps

#endif  // ASYNCPS_PYTHON_ARRAYS_H_
