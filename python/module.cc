// asyncps._native: the Python binding of the C++ client (client/ps_client.h).
//
// The C++ files of python/ are the only place where C++ and Python meet:
// they convert Python arguments into PsClient calls and the results back,
// validate every array before anything is sent, release the GIL during
// every RPC and turn an absl::Status into a Python exception. The
// pure-Python parts of the package (asyncps/__init__.py, asyncps/torch.py)
// build on what this module exports. One concept a file:
//
//   module.cc           the module: its attributes, in the order they are
//                       added
//   errors.h            asyncps.RpcError; how errors become exceptions
//   specs.h             TensorSpec and TableSpec
//   arrays.h            numpy arrays and CPU torch tensors as arguments,
//                       checked before anything is sent
//   client.h            Client: one PsClient, and how its calls run
//                       (client.cc: construction and dense tensors,
//                       client_rows.cc: sparse tables)
//   client_bindings.h   the classes Client and PushResult, with their docs

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/net.h"
#include "common/version.h"
#include "python/client.h"
#include "python/client_bindings.h"
#include "python/errors.h"
#include "python/specs.h"

namespace asyncps {
namespace python {
namespace {

const char kModuleDoc[] = R"doc(Native asyncps client (C++ PsClient).

Use the `asyncps` package, which re-exports everything here.)doc";

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = kModuleDoc;
  main_thread = py::module_::import("threading")
                    .attr("main_thread")()
                    .attr("ident")
                    .cast<unsigned long>();
  m.attr("__version__") = kVersion;

  RegisterRpcError(m);

  m.def("tune_malloc_for_large_messages", &TuneProcess,
        "Keeps large message buffers out of mmap/munmap (glibc mallopt) so "
        "that every large pull or push does not page-fault its memory in "
        "again, and turns off Abseil's lock-cycle detection; what ps_server "
        "and ps_worker do at start. Process-wide; call once, early.");

  RegisterTensorSpec(m);
  RegisterTableSpec(m);
  RegisterPushResult(m);
  RegisterClient(m);

  // Shown as asyncps.X (the package re-exports them) in help() and repr().
  for (const char* name : {"TensorSpec", "TableSpec", "PushResult", "Client"}) {
    m.attr(name).attr("__module__") = "asyncps";
  }
}

}  // namespace python
}  // namespace asyncps
