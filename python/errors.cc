#include "python/errors.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace python {
namespace {

// Set once when the module is imported; the exception type of failed RPCs.
PyObject* rpc_error_type = nullptr;

}  // namespace

void RegisterRpcError(py::module_& m) {
  rpc_error_type = PyErr_NewExceptionWithDoc(
      "asyncps.RpcError",
      "A call to the shards failed. `code`: the gRPC status code name "
      "(e.g. 'NOT_FOUND', 'UNAVAILABLE'); `grpc_code`: its number; "
      "`message`: the error message (it names the shard).",
      PyExc_RuntimeError, nullptr);
  if (rpc_error_type == nullptr) throw py::error_already_set();
  m.attr("RpcError") = py::handle(rpc_error_type);
}

[[noreturn]] void ThrowStatus(const absl::Status& s) {
  const std::string code = absl::StatusCodeToString(s.code());
  py::object type = py::reinterpret_borrow<py::object>(rpc_error_type);
  py::object error = type(absl::StrCat(code, ": ", s.message()));
  error.attr("code") = code;
  error.attr("grpc_code") = static_cast<int>(s.code());
  error.attr("message") = std::string(s.message());
  PyErr_SetObject(rpc_error_type, error.ptr());
  throw py::error_already_set();
}

void CheckOk(const absl::Status& s, const std::string& what) {
  if (!s.ok()) throw py::value_error(absl::StrCat(what, ": ", s.message()));
}

}  // namespace python
}  // namespace asyncps
