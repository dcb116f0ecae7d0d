#ifndef ASYNCPS_PYTHON_SPECS_H_
#define ASYNCPS_PYTHON_SPECS_H_

// TensorSpec and TableSpec as Python classes (made from keyword arguments
// and checked as the shards check them, so that a bad spec never leaves the
// process), and the spec arguments of Client.create and create_tables.
//
// Example:
//   RegisterTensorSpec(m);  // when the module is imported
//   std::vector<TensorSpec> list =
//       SpecList<TensorSpec>(specs, "create", "TensorSpec");

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "proto/asyncps.pb.h"

namespace asyncps {
namespace python {

namespace py = pybind11;

// Add the classes TensorSpec and TableSpec to `m`.
void RegisterTensorSpec(py::module_& m);
void RegisterTableSpec(py::module_& m);

// {name: Spec} (the key names it) or [Spec] (each names itself);
// `method` and `type` (the Python class name) for messages. TypeError or
// ValueError for anything else, a spec without a name or a name twice.
// Spec: TensorSpec or TableSpec.
template <typename Spec>
std::vector<Spec> SpecList(const py::object& specs, const char* method,
                           const char* type);

}  // namespace python
}  // namespace asyncps

#endif  // ASYNCPS_PYTHON_SPECS_H_
