#ifndef ASYNCPS_PYTHON_ERRORS_H_
#define ASYNCPS_PYTHON_ERRORS_H_

// How errors reach Python, in one place:
//   - a bad argument found by the binding (type, dtype, shape, layout,
//     unknown tensor, bad spec or option) raises TypeError or ValueError
//     before any RPC (CheckOk for a check that returns an absl::Status);
//   - a failed RPC raises asyncps.RpcError (ThrowStatus), a RuntimeError
//     whose `code` is the gRPC status code name (e.g. "NOT_FOUND") and
//     `message` its text.

#include <pybind11/pybind11.h>

#include <string>

#include "absl/status/status.h"

namespace asyncps {
namespace python {

namespace py = pybind11;

// Creates the exception type asyncps.RpcError and adds it to `m` as
// RpcError. Called once, when the module is imported.
void RegisterRpcError(py::module_& m);

// Raises asyncps.RpcError for a failed RPC. REQUIRES: the GIL is held.
[[noreturn]] void ThrowStatus(const absl::Status& s);

// Raises ValueError naming `what` when `s` is not OK.
void CheckOk(const absl::Status& s, const std::string& what);

}  // namespace python
}  // namespace asyncps

#endif  // ASYNCPS_PYTHON_ERRORS_H_
