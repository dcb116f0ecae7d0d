#ifndef ASYNCPS_PYTHON_CLIENT_BINDINGS_H_
#define ASYNCPS_PYTHON_CLIENT_BINDINGS_H_

// The Python classes asyncps.Client (client.h) and asyncps.PushResult (what
// a push returns, PushSummary of client/ps_client.h), with their docstrings:
// the documented face of the client.

#include <pybind11/pybind11.h>

namespace asyncps {
namespace python {

namespace py = pybind11;

// Add the classes PushResult and Client to `m`. REQUIRES: TensorSpec,
// TableSpec (specs.h) and PushResult are added before Client: the
// signatures in the docstrings of Client's methods name them.
void RegisterPushResult(py::module_& m);
void RegisterClient(py::module_& m);

}  // namespace python
}  // namespace asyncps

#endif  // ASYNCPS_PYTHON_CLIENT_BINDINGS_H_
