// asyncps._native: the Python binding of the C++ client (client/ps_client.h).
//
// This file is the only place where C++ and Python meet: it converts Python
// arguments into PsClient calls and the results back, validates every array
// before anything is sent, releases the GIL during every RPC and turns an
// absl::Status into a Python exception. The pure-Python parts of the package
// (asyncps/__init__.py, asyncps/torch.py) build on what it exports.
//
// Error mapping, in one place (ThrowStatus / the Check* helpers):
//   - a bad argument found here (type, dtype, shape, layout, unknown tensor,
//     bad spec or option) raises TypeError or ValueError before any RPC;
//   - a failed RPC raises asyncps.RpcError, a RuntimeError whose `code` is
//     the gRPC status code name (e.g. "NOT_FOUND") and `message` its text.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/executor.h"
#include "common/initializer.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/net.h"
#include "common/row_initializer.h"
#include "common/security.h"
#include "common/tensor_layout.h"
#include "common/version.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/asyncps.pb.h"
#include "store/optimizer.h"
#include "store/sparse_table.h"
#include "tools/status_table.h"

namespace asyncps {
namespace python {
namespace {

namespace py = pybind11;

// Set once when the module is imported; the exception type of failed RPCs.
PyObject* rpc_error_type = nullptr;

// Raises asyncps.RpcError for a failed RPC. REQUIRES: the GIL is held.
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

// ---------------------------------------------------------------- specs

const std::pair<const char*, Initializer> kInits[] = {
    {"zeros", INIT_ZEROS},
    {"constant", INIT_CONSTANT},
    {"uniform", INIT_UNIFORM},
    {"normal", INIT_NORMAL},
    {"glorot_uniform", INIT_GLOROT_UNIFORM},
    {"values", INIT_VALUES},
};
const std::pair<const char*, OptimizerType> kOptimizers[] = {
    {"sgd", OPT_SGD},
    {"momentum", OPT_MOMENTUM},
    {"adam", OPT_ADAM},
    {"adagrad", OPT_ADAGRAD},
};

template <typename Enum, size_t N>
Enum EnumFromName(const std::pair<const char*, Enum> (&table)[N],
                  const std::string& name, const char* what) {
  std::vector<std::string> names;
  for (const auto& [n, value] : table) {
    if (name == n) return value;
    names.push_back(absl::StrCat("'", n, "'"));
  }
  throw py::value_error(absl::StrCat(what, " must be one of ",
                                     absl::StrJoin(names, ", "), ", got '",
                                     name, "'"));
}

template <typename Enum, size_t N>
std::string EnumName(const std::pair<const char*, Enum> (&table)[N],
                     Enum value) {
  for (const auto& [n, v] : table) {
    if (v == value) return n;
  }
  return absl::StrCat(static_cast<int>(value));
}

// Raises ValueError naming `what` when `s` is not OK.
void CheckOk(const absl::Status& s, const std::string& what) {
  if (!s.ok()) throw py::value_error(absl::StrCat(what, ": ", s.message()));
}

// The optimizer fields of a TensorSpec or TableSpec, only those its type
// uses.
OptimizerSpec MakeOptimizer(const std::string& optimizer, double lr,
                            double momentum, double beta1, double beta2,
                            double epsilon, double initial_accumulator) {
  OptimizerSpec o;
  o.set_type(EnumFromName(kOptimizers, optimizer, "optimizer"));
  o.set_learning_rate(static_cast<float>(lr));
  if (o.type() == OPT_MOMENTUM) o.set_momentum(static_cast<float>(momentum));
  if (o.type() == OPT_ADAM) {
    o.set_beta1(static_cast<float>(beta1));
    o.set_beta2(static_cast<float>(beta2));
  }
  if (o.type() == OPT_ADAM || o.type() == OPT_ADAGRAD) {
    o.set_epsilon(static_cast<float>(epsilon));
  }
  if (o.type() == OPT_ADAGRAD) {
    o.set_initial_accumulator(static_cast<float>(initial_accumulator));
  }
  return o;
}

TensorSpec MakeSpec(const std::vector<int64_t>& shape, const std::string& name,
                    const std::string& init, double init_value, uint64_t seed,
                    const std::string& optimizer, double lr, double momentum,
                    double beta1, double beta2, double epsilon,
                    double initial_accumulator, int64_t slice_elems) {
  TensorSpec spec;
  spec.set_name(name);
  for (int64_t d : shape) spec.add_shape(d);
  spec.set_init(EnumFromName(kInits, init, "init"));
  spec.set_init_value(static_cast<float>(init_value));
  spec.set_seed(seed);
  *spec.mutable_optimizer() = MakeOptimizer(
      optimizer, lr, momentum, beta1, beta2, epsilon, initial_accumulator);
  spec.set_slice_elems(slice_elems);
  // The checks the shards apply, so that a bad spec never leaves here.
  CheckOk(TensorLayout::Create(shape, 1).status(), "TensorSpec shape");
  CheckOk(ValidateInitializer(spec), "TensorSpec");
  CheckOk(ValidateOptimizer(spec.optimizer()), "TensorSpec");
  if (slice_elems < 0) {
    throw py::value_error(absl::StrCat(
        "TensorSpec: slice_elems must be >= 0 (0 = the shards' default), got ",
        slice_elems));
  }
  return spec;
}

TableSpec MakeTableSpec(int32_t dim, const std::string& name,
                        const std::string& init, double init_value,
                        uint64_t seed, const std::string& optimizer, double lr,
                        double momentum, double beta1, double beta2,
                        double epsilon, double initial_accumulator) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(dim);
  spec.set_init(EnumFromName(kInits, init, "init"));
  spec.set_init_value(static_cast<float>(init_value));
  spec.set_seed(seed);
  *spec.mutable_optimizer() = MakeOptimizer(
      optimizer, lr, momentum, beta1, beta2, epsilon, initial_accumulator);
  // The checks the shards apply (the name is checked there).
  if (dim < 1 || dim > kMaxTableDim) {
    throw py::value_error(absl::StrCat("TableSpec: dim must be in [1, ",
                                       kMaxTableDim, "], got ", dim));
  }
  CheckOk(ValidateRowInitializer(spec), "TableSpec");
  CheckOk(ValidateOptimizer(spec.optimizer()), "TableSpec");
  return spec;
}

// The optimizer part of a spec's repr.
std::string OptimizerRepr(const OptimizerSpec& o) {
  std::string opt = absl::StrCat("optimizer='", EnumName(kOptimizers, o.type()),
                                 "', lr=", o.learning_rate());
  if (o.type() == OPT_MOMENTUM)
    absl::StrAppend(&opt, ", momentum=", o.momentum());
  if (o.type() == OPT_ADAM) {
    absl::StrAppend(&opt, ", beta1=", o.beta1(), ", beta2=", o.beta2(),
                    ", epsilon=", o.epsilon());
  }
  if (o.type() == OPT_ADAGRAD) {
    absl::StrAppend(&opt, ", epsilon=", o.epsilon(),
                    ", initial_accumulator=", o.initial_accumulator());
  }
  return opt;
}

std::string TableRepr(const TableSpec& s) {
  return absl::StrCat("TableSpec(name='", s.name(), "', dim=", s.dim(),
                      ", init='", EnumName(kInits, s.init()),
                      "', init_value=", s.init_value(), ", seed=", s.seed(),
                      ", ", OptimizerRepr(s.optimizer()), ")");
}

int64_t NumElems(const TensorSpec& spec) {
  int64_t n = 1;
  for (int64_t d : spec.shape()) n *= d;
  return n;
}

py::tuple ShapeOf(const TensorSpec& spec) {
  py::tuple t(spec.shape_size());
  for (int i = 0; i < spec.shape_size(); ++i) t[i] = spec.shape(i);
  return t;
}

std::string SpecRepr(const TensorSpec& s) {
  std::vector<std::string> dims;
  for (int64_t d : s.shape()) dims.push_back(absl::StrCat(d));
  const std::string opt = OptimizerRepr(s.optimizer());
  return absl::StrCat("TensorSpec(name='", s.name(), "', shape=(",
                      absl::StrJoin(dims, ", "), dims.size() == 1 ? ",)" : ")",
                      ", init='", EnumName(kInits, s.init()),
                      "', init_value=", s.init_value(), ", seed=", s.seed(),
                      ", ", opt, ", slice_elems=", s.slice_elems(), ")");
}

// ---------------------------------------------------------------- arrays

// `obj` itself when it is a numpy array; a CPU torch.Tensor's memory as a
// numpy array (no copy: writes reach the tensor); anything else as it is
// (the caller's check names it). TypeError for a tensor on another device.
py::object ArrayView(const py::handle& obj, const std::string& what) {
  if (py::isinstance<py::array>(obj)) {
    return py::reinterpret_borrow<py::object>(obj);
  }
  const py::handle type = py::type::handle_of(obj);
  const std::string module = py::str(type.attr("__module__"));
  if (module.rfind("torch", 0) != 0 || !py::hasattr(obj, "detach")) {
    return py::reinterpret_borrow<py::object>(obj);
  }
  const std::string device = py::str(obj.attr("device").attr("type"));
  if (device != "cpu") {
    throw py::type_error(absl::StrCat(what, " is a torch tensor on ", device,
                                      "; asyncps takes CPU memory"));
  }
  return obj.attr("detach")().attr("numpy")();
}

// True when every value of a float32 array is finite.
bool AllFiniteArray(const py::array& a) {
  return AllFinite(static_cast<const char*>(a.data()),
                   static_cast<size_t>(a.size()), WIRE_F32);
}

// `obj` (a numpy array or CPU torch tensor) as a float32 C-contiguous numpy
// array holding exactly the elements of `spec` in its shape; TypeError /
// ValueError naming the tensor if not.
py::array CheckArray(const py::handle& original, const TensorSpec& spec,
                     bool writeable, const char* method) {
  const std::string& name = spec.name();
  const py::object obj =
      ArrayView(original, absl::StrCat(method, ": tensor '", name, "'"));
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(absl::StrCat(
        method, ": tensor '", name,
        "' must be a numpy.ndarray or a CPU torch.Tensor, got ",
        std::string(py::str(py::type::handle_of(obj).attr("__name__")))));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array_t<float>>(a)) {
    throw py::type_error(absl::StrCat(method, ": tensor '", name,
                                      "' must have dtype float32, got ",
                                      std::string(py::str(a.dtype()))));
  }
  bool same_shape = a.ndim() == spec.shape_size();
  for (int i = 0; same_shape && i < spec.shape_size(); ++i) {
    same_shape = a.shape(i) == spec.shape(i);
  }
  if (!same_shape) {
    std::vector<std::string> got, want;
    for (py::ssize_t i = 0; i < a.ndim(); ++i)
      got.push_back(absl::StrCat(a.shape(i)));
    for (int64_t d : spec.shape()) want.push_back(absl::StrCat(d));
    throw py::value_error(absl::StrCat(
        method, ": tensor '", name, "' has shape (", absl::StrJoin(got, ", "),
        ") but the cluster holds shape (", absl::StrJoin(want, ", "), ")"));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(
        absl::StrCat(method, ": tensor '", name,
                     "' is not C-contiguous (use numpy.ascontiguousarray)"));
  }
  if (writeable && !a.writeable()) {
    throw py::value_error(
        absl::StrCat(method, ": tensor '", name, "' is read-only"));
  }
  return a;
}

// Tensor names: a str (one name) or a sequence of str; TypeError naming
// `method` otherwise.
std::vector<std::string> NameList(const py::object& names, const char* method) {
  if (py::isinstance<py::str>(names)) return {names.cast<std::string>()};
  std::vector<std::string> out;
  if (!py::isinstance<py::sequence>(names)) {
    throw py::type_error(absl::StrCat(
        method, ": names must be a str or a list of str, got ",
        std::string(py::str(py::type::handle_of(names).attr("__name__")))));
  }
  for (const py::handle& n : names) {
    if (!py::isinstance<py::str>(n)) {
      throw py::type_error(absl::StrCat(method,
                                        ": tensor names must be str, got ",
                                        std::string(py::repr(n))));
    }
    out.push_back(n.cast<std::string>());
  }
  return out;
}

// The name of every item of a {name: array} dict, checked to be a str.
std::string KeyName(const py::handle& key, const char* method) {
  if (!py::isinstance<py::str>(key)) {
    throw py::type_error(absl::StrCat(method,
                                      ": tensor names must be str, got ",
                                      std::string(py::repr(key))));
  }
  return key.cast<std::string>();
}

void CheckDict(const py::handle& obj, const char* method) {
  if (!py::isinstance<py::dict>(obj)) {
    throw py::type_error(
        absl::StrCat(method, ": expected a dict {name: array}, got ",
                     std::string(py::repr(py::type::handle_of(obj)))));
  }
}

// ---------------------------------------------------------------- client

// The Python Client. Owns one PsClient (thread-safe); calls from several
// Python threads run concurrently, mu_ (shared) keeps Close from pulling the
// client away under them. RPCs run with the GIL
// released and mu_ held; argument checks read a copy of the known specs
// (known_) instead, so they never wait for another thread's RPC while
// holding the GIL. Thread-safe.
// Python's main thread (threading.main_thread().ident), where signal
// handlers run; set when the module is imported.
unsigned long main_thread = 0;

class Client {
 public:
  Client(const py::object& servers, const py::object& worker_id_arg,
         uint64_t incarnation, const std::string& tls_ca,
         const std::string& tls_cert, const std::string& tls_key,
         const std::string& token_file, double rpc_timeout,
         double call_deadline, int max_attempts, double initial_backoff,
         int connections_per_shard, const std::string& wire_dtype,
         const std::string& run_id) {
    PsClientOptions o;
    servers_ = ServerList(servers);
    o.servers = servers_;
    const int32_t worker_id = WorkerIdOf(worker_id_arg);
    if (worker_id < 0) {
      throw py::value_error(
          absl::StrCat("Client: worker_id must be >= 0, got ", worker_id));
    }
    o.worker_id = worker_id;
    o.incarnation = incarnation;
    if (absl::Status r = CheckRunId(run_id); !r.ok()) {
      throw py::value_error(absl::StrCat("Client: run_id: ", r.message()));
    }
    o.run_id = run_id;
    o.stop = &stop_;
    // Warnings (a shard that cannot be reached, while retries go on; a
    // shard that restarted) on stderr, as they happen.
    absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
        MakeLogger("asyncps", "warn");
    if (logger.ok()) o.logger = *std::move(logger);
    o.stop_ends_pushes = true;  // Ctrl-C ends a Python call, pushes too
    if (!(rpc_timeout > 0) || !std::isfinite(rpc_timeout)) {
      throw py::value_error(absl::StrCat(
          "Client: rpc_timeout must be > 0 seconds, got ", rpc_timeout));
    }
    o.retry.attempt_timeout = absl::Seconds(rpc_timeout);
    if (!(call_deadline > 0) || !std::isfinite(call_deadline)) {
      throw py::value_error(absl::StrCat(
          "Client: call_deadline must be > 0 seconds, got ", call_deadline));
    }
    o.retry.call_deadline = absl::Seconds(call_deadline);
    if (max_attempts < 0) {
      throw py::value_error(absl::StrCat(
          "Client: max_attempts must be >= 0 (0: until the call deadline), "
          "got ",
          max_attempts));
    }
    o.retry.max_attempts = max_attempts;
    if (!(initial_backoff >= 0) || !std::isfinite(initial_backoff)) {
      throw py::value_error(
          absl::StrCat("Client: initial_backoff must be >= 0 seconds, got ",
                       initial_backoff));
    }
    o.retry.initial_backoff = absl::Seconds(initial_backoff);
    o.retry.max_backoff =
        std::max(o.retry.max_backoff, o.retry.initial_backoff);
    if (connections_per_shard < 1 || connections_per_shard > 16) {
      throw py::value_error(
          absl::StrCat("Client: connections_per_shard must be in [1, 16], got ",
                       connections_per_shard));
    }
    o.connections_per_shard = connections_per_shard;
    if (wire_dtype == "bf16") {
      o.push_dtype = o.pull_dtype = WIRE_BF16;
    } else if (wire_dtype != "fp32") {
      throw py::value_error(
          absl::StrCat("Client: wire_dtype must be 'fp32' or 'bf16', got '",
                       wire_dtype, "'"));
    }
    SecurityFlagValues flags;
    flags.tls_ca = tls_ca;
    flags.tls_cert = tls_cert;
    flags.tls_key = tls_key;
    flags.cluster_token_file = token_file;
    absl::StatusOr<SecurityOptions> security =
        SecurityOptionsFromFlagValues(flags, /*server=*/false);
    CheckOk(security.status(), "Client");
    o.security = *std::move(security);
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(std::move(o));
    CheckOk(client.status(), "Client");
    worker_id_ = (*client)->worker_id();
    incarnation_ = (*client)->incarnation();
    absl::MutexLock lock(&mu_);
    client_ = *std::move(client);
  }

  // An integer environment variable; nullopt when unset or empty,
  // ValueError naming it when not an integer >= 0.
  static std::optional<int32_t> EnvInt(const char* name) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return std::nullopt;
    int32_t value = 0;
    if (!absl::SimpleAtoi(text, &value) || value < 0) {
      throw py::value_error(absl::StrCat("Client: ", name, "='", text,
                                         "' is not an integer >= 0"));
    }
    return value;
  }

  // The worker id: the argument, or (None) torchrun's RANK, or its
  // GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK, or LOCAL_RANK on one node;
  // 0 only when no WORLD_SIZE says several processes run (two processes
  // that both default to 0 would fence each other).
  static int32_t WorkerIdOf(const py::object& arg) {
    if (!arg.is_none()) return arg.cast<int32_t>();
    if (std::optional<int32_t> rank = EnvInt("RANK")) return *rank;
    const std::optional<int32_t> world = EnvInt("WORLD_SIZE");
    if (std::optional<int32_t> local = EnvInt("LOCAL_RANK")) {
      const std::optional<int32_t> group = EnvInt("GROUP_RANK");
      const std::optional<int32_t> per_node = EnvInt("LOCAL_WORLD_SIZE");
      if (group && per_node) return *group * *per_node + *local;
      if (!world || *world <= 1 || (per_node && *world == *per_node)) {
        return *local;
      }
      throw py::value_error(absl::StrCat(
          "Client: LOCAL_RANK=", *local, " with WORLD_SIZE=", *world,
          " but no RANK, GROUP_RANK or LOCAL_WORLD_SIZE to tell the nodes "
          "apart: give each process its worker_id"));
    }
    if (world && *world > 1) {
      throw py::value_error(absl::StrCat(
          "Client: WORLD_SIZE=", *world,
          " but no RANK and no worker_id: give each process its worker_id "
          "(or run under torchrun, which sets RANK)"));
    }
    return 0;
  }

  // Accepts "h:p,h:p" or a sequence of "h:p".
  static std::vector<std::string> ServerList(const py::object& servers) {
    std::string joined;
    if (py::isinstance<py::str>(servers)) {
      joined = servers.cast<std::string>();
    } else if (py::isinstance<py::sequence>(servers)) {
      std::vector<std::string> parts;
      for (const py::handle& s : servers) {
        if (!py::isinstance<py::str>(s)) {
          throw py::type_error(
              absl::StrCat("Client: servers must be str addresses, got ",
                           std::string(py::repr(s))));
        }
        parts.push_back(s.cast<std::string>());
      }
      joined = absl::StrJoin(parts, ",");
    } else {
      throw py::type_error(
          "Client: servers must be a list of 'host:port' or one "
          "'host:port,host:port' string");
    }
    absl::StatusOr<std::vector<std::string>> list = ParseServerList(joined);
    CheckOk(list.status(), "Client: servers");
    return *std::move(list);
  }

  py::dict Create(const py::object& specs, const py::object& values) {
    const std::vector<TensorSpec> list =
        SpecList<TensorSpec>(specs, "create", "TensorSpec");
    // The arrays of the init='values' tensors, checked against their specs
    // (kept alive, and read, during the call).
    std::vector<py::array> arrays;
    std::vector<std::pair<std::string, const float*>> given;
    if (!values.is_none()) {
      if (!py::isinstance<py::dict>(values)) {
        throw py::type_error("create: values must be a dict {name: array}");
      }
      for (const auto& [key, array] : values.cast<py::dict>()) {
        const std::string name = py::str(key);
        const TensorSpec* spec = nullptr;
        for (const TensorSpec& t : list) {
          if (t.name() == name) spec = &t;
        }
        if (spec == nullptr || spec->init() != INIT_VALUES) {
          throw py::value_error(absl::StrCat(
              "create: values given for '", name,
              "', which is not a TensorSpec of this call with init='values'"));
        }
        arrays.push_back(
            CheckArray(array, *spec, /*writeable=*/false, "create"));
        given.emplace_back(name,
                           static_cast<const float*>(arrays.back().data()));
      }
    }
    for (const TensorSpec& t : list) {
      bool found = false;
      for (const auto& [name, data] : given) found = found || name == t.name();
      if (t.init() == INIT_VALUES && !found) {
        throw py::value_error(absl::StrCat("create: TensorSpec '", t.name(),
                                           "' has init='values' but values= "
                                           "holds no array for it"));
      }
    }
    const absl::Status s = Call([&](PsClient& client) {
      absl::Status st = client.CreateTensors(list, given);
      if (st.ok()) Learn(client, Names(list));
      return st;
    });
    if (!s.ok()) ThrowStatus(s);
    return Known(Names(list));
  }

  py::dict WaitFor(const py::object& names_arg, double timeout) {
    const std::vector<std::string> names = NameList(names_arg, "wait_for");
    if (!(timeout >= 0) || !std::isfinite(timeout)) {
      throw py::value_error(absl::StrCat(
          "wait_for: timeout must be >= 0 seconds, got ", timeout));
    }
    for (const std::string& name : names) {
      if (name.empty()) throw py::value_error("wait_for: empty tensor name");
    }
    const absl::Status s = Call([&](PsClient& client) {
      absl::Status st = client.WaitForTensors(names, absl::Seconds(timeout));
      if (st.ok()) Learn(client, names);
      return st;
    });
    if (!s.ok()) ThrowStatus(s);
    return Known(names);
  }

  py::tuple ListTensors() {
    std::vector<ListTensorsResponse> all;
    const absl::Status s = Call([&](PsClient& client) {
      absl::StatusOr<ListTensorsResponse> r = client.ListTensors();
      if (r.ok()) all.push_back(*std::move(r));
      return r.status();
    });
    if (!s.ok()) ThrowStatus(s);
    py::dict tensors, tables;
    for (const TensorSpec& t : all[0].tensors()) tensors[py::str(t.name())] = t;
    for (const TableSpec& t : all[0].tables()) tables[py::str(t.name())] = t;
    return py::make_tuple(tensors, tables);
  }

  py::dict SetLr(const py::dict& rates, int64_t step) {
    if (step < 1) {
      throw py::value_error(
          absl::StrCat("set_lr: step must be >= 1, got ", step));
    }
    if (rates.empty()) throw py::value_error("set_lr: no rates given");
    std::vector<LearningRate> asked;
    for (const auto& [key, value] : rates) {
      if (!py::isinstance<py::str>(key)) {
        throw py::type_error("set_lr: names must be str");
      }
      LearningRate rate;
      rate.set_name(key.cast<std::string>());
      if (!py::isinstance<py::float_>(value) &&
          !py::isinstance<py::int_>(value)) {
        throw py::type_error(absl::StrCat(
            "set_lr: the rate of '", rate.name(), "' must be a number, got ",
            std::string(py::repr(py::type::handle_of(value)))));
      }
      const double lr = value.cast<double>();
      if (!(lr > 0) || !std::isfinite(lr)) {
        throw py::value_error(absl::StrCat("set_lr: the rate of '", rate.name(),
                                           "' must be > 0, got ", lr));
      }
      rate.set_learning_rate(static_cast<float>(lr));
      rate.set_step(step);
      asked.push_back(std::move(rate));
    }
    std::vector<LearningRate> now;
    const absl::Status s = Call([&](PsClient& client) {
      absl::StatusOr<std::vector<LearningRate>> r =
          client.SetLearningRates(asked);
      if (r.ok()) now = *std::move(r);
      return r.status();
    });
    if (!s.ok()) ThrowStatus(s);
    py::dict out;
    for (const LearningRate& r : now) {
      out[py::str(r.name())] = py::make_tuple(r.learning_rate(), r.step());
    }
    return out;
  }

  std::optional<TensorSpec> Spec(const std::string& name) {
    CheckOpen();
    absl::MutexLock lock(&specs_mu_);
    auto it = known_.find(name);
    if (it == known_.end()) return std::nullopt;
    return *it->second;
  }

  py::dict Pull(const py::object& names_arg, std::optional<int64_t> clock) {
    const std::vector<std::string> names = NameList(names_arg, "pull");
    py::dict out;
    for (const std::string& name : names) {
      const std::shared_ptr<const TensorSpec> spec = KnownSpec(name, "pull");
      if (out.contains(name)) {
        throw py::value_error(
            absl::StrCat("pull: tensor '", name, "' named twice"));
      }
      std::vector<py::ssize_t> shape(spec->shape().begin(),
                                     spec->shape().end());
      out[py::str(name)] = py::array_t<float>(shape);
    }
    PullInto(out, clock);
    return out;
  }

  void PullInto(const py::object& arrays, std::optional<int64_t> clock) {
    Buffers out = CheckedBuffers(arrays, "pull_into", /*writeable=*/true);
    const int64_t c = clock.value_or(clock_);
    const absl::Status s =
        Call([&](PsClient& client) { return client.Pull(c, out.pointers); });
    if (!s.ok()) ThrowStatus(s);
  }

  PushSummary Push(const py::object& grads, std::optional<int64_t> clock) {
    return Send(grads, clock, /*assign=*/false);
  }

  PushSummary Assign(const py::object& values, std::optional<int64_t> clock) {
    return Send(values, clock, /*assign=*/true);
  }

  py::dict CreateTables(const py::object& specs) {
    const std::vector<TableSpec> list =
        SpecList<TableSpec>(specs, "create_tables", "TableSpec");
    const absl::Status s = Call([&](PsClient& client) {
      absl::Status st = client.CreateTables(list);
      if (st.ok()) Learn(client, Names(list));
      return st;
    });
    if (!s.ok()) ThrowStatus(s);
    return Known(Names(list));
  }

  // {table: ids} -> {table: float32 array (len(ids), dim)}. Remembers what
  // was read (row versions, shard epochs) for push_rows.
  py::dict PullRows(const py::object& ids, std::optional<int64_t> clock,
                    bool peek) {
    CheckDict(ids, "pull_rows");
    std::vector<py::array_t<uint64_t>> keep;
    std::vector<RowsQuery> queries;
    py::dict out;
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(ids)) {
      const std::string name = KeyName(key, "pull_rows");
      const std::shared_ptr<const TableSpec> spec =
          KnownTable(name, "pull_rows");
      keep.push_back(CheckIds(value, name, "pull_rows"));
      const py::ssize_t n = keep.back().shape(0);
      py::array_t<float> rows({n, static_cast<py::ssize_t>(spec->dim())});
      RowsQuery q;
      q.table = name;
      q.ids = absl::MakeConstSpan(keep.back().data(), n);
      q.out = rows.mutable_data();
      q.peek = peek;
      queries.push_back(std::move(q));
      out[py::str(name)] = std::move(rows);
    }
    const int64_t c = clock.value_or(clock_);
    const absl::Status s = Call([&](PsClient& client) {
      std::unique_ptr<PsClient::PendingRowsPull> pull =
          client.StartPullRows(c, c, queries);
      absl::Status st = pull->Wait();
      if (st.ok() && !peek) Remember(pull->read());
      return st;
    });
    if (!s.ok()) ThrowStatus(s);
    return out;
  }

  // {table: (ids, grads)} with grads float32 (len(ids), dim), computed from
  // the rows the last pull_rows read.
  PushSummary PushRows(const py::object& grads, std::optional<int64_t> clock) {
    return SendRows(grads, clock, /*assign=*/false);
  }

  PushSummary AssignRows(const py::object& values,
                         std::optional<int64_t> clock) {
    return SendRows(values, clock, /*assign=*/true);
  }

  // PushRows (gradients) or AssignRows (values): checked whole before
  // anything is sent.
  PushSummary SendRows(const py::object& grads, std::optional<int64_t> clock,
                       bool assign) {
    const char* method = assign ? "assign_rows" : "push_rows";
    const char* what = assign ? "values" : "gradients";
    CheckDict(grads, method);
    std::vector<py::array> keep;
    std::vector<RowsGrad> list;
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(grads)) {
      const std::string name = KeyName(key, method);
      const std::shared_ptr<const TableSpec> spec = KnownTable(name, method);
      if (!py::isinstance<py::tuple>(value) || py::len(value) != 2) {
        throw py::type_error(
            absl::StrCat(method, ": the value for table '", name,
                         "' must be a tuple (ids, ", what, "), got ",
                         std::string(py::repr(py::type::handle_of(value)))));
      }
      const py::tuple pair = py::reinterpret_borrow<py::tuple>(value);
      py::array_t<uint64_t> ids = CheckIds(pair[0], name, method);
      py::array g =
          CheckRowGrads(pair[1], name, ids.shape(0), spec->dim(), method, what);
      if (assign) {
        absl::flat_hash_set<uint64_t> distinct;
        distinct.reserve(ids.shape(0));
        for (py::ssize_t i = 0; i < ids.shape(0); ++i) {
          if (!distinct.insert(ids.data()[i]).second) {
            throw py::value_error(
                absl::StrCat(method, ": row ", ids.data()[i], " of table '",
                             name, "' given twice; nothing was sent"));
          }
        }
      }
      if (!AllFiniteArray(g)) {
        throw py::value_error(absl::StrCat(method, ": the ", what,
                                           " of table '", name,
                                           "' contain NaN or Inf; nothing "
                                           "was sent"));
      }
      RowsGrad rg;
      rg.table = name;
      rg.ids = absl::MakeConstSpan(ids.data(), ids.shape(0));
      rg.grads = static_cast<const float*>(g.data());
      list.push_back(std::move(rg));
      keep.push_back(std::move(ids));
      keep.push_back(std::move(g));
    }
    const int64_t c = clock.value_or(clock_);
    const absl::StatusOr<PushSummary> summary =
        Call([&](PsClient& client) -> absl::StatusOr<PushSummary> {
          if (assign) return client.StartAssignRows(c, list)->Wait();
          ReadSet read;
          {
            absl::MutexLock lock(&rows_mu_);
            read = rows_read_;
          }
          return client.StartPushRows(c, list, read)->Wait();
        });
    if (!summary.ok()) ThrowStatus(summary.status());
    return *summary;
  }

  void Heartbeat(std::optional<int64_t> clock, bool leaving) {
    const int64_t c = clock.value_or(clock_);
    const absl::Status s =
        Call([&](PsClient& client) { return client.Heartbeat(c, leaving); });
    if (!s.ok()) ThrowStatus(s);
  }

  py::object Status() {
    absl::StatusOr<std::vector<StatusResponse>> status =
        Call([](PsClient& client) { return client.Status(); });
    if (!status.ok()) ThrowStatus(status.status());
    std::vector<ShardResult> shards;
    for (size_t i = 0; i < status->size(); ++i) {
      ShardResult r;
      r.index = static_cast<int>(i);
      r.address = servers_[i];
      r.up = true;
      r.status = std::move((*status)[i]);
      shards.push_back(std::move(r));
    }
    return py::module_::import("json").attr("loads")(RenderJson(shards));
  }

  std::vector<uint64_t> Versions(const std::string& name) {
    KnownSpec(name, "versions");
    return Call([&](PsClient& client) { return client.PulledVersions(name); });
  }

  void Close() {
    closed_ = true;
    // Waits for a call in flight on another thread; the channels close
    // with the GIL released as well.
    py::gil_scoped_release release;
    std::unique_ptr<PsClient> gone;
    {
      absl::MutexLock lock(&mu_);
      gone = std::move(client_);
    }
  }

  bool closed() const { return closed_; }
  int64_t clock() const { return clock_; }
  void set_clock(int64_t clock) {
    if (clock < 0) {
      throw py::value_error(absl::StrCat("clock must be >= 0, got ", clock));
    }
    clock_ = clock;
  }
  int32_t worker_id() const { return worker_id_; }
  uint64_t incarnation() const { return incarnation_; }
  const std::vector<std::string>& servers() const { return servers_; }

 private:
  // Checked arrays of a {name: array} dict and their data pointers; `keep`
  // holds the arrays (and so their buffers) while an RPC uses them.
  struct Buffers {
    std::vector<py::array> keep;
    std::vector<std::pair<std::string, float*>> pointers;
  };

  // Push (gradients) or Assign (values): checked whole before anything is
  // sent.
  PushSummary Send(const py::object& arrays, std::optional<int64_t> clock,
                   bool assign) {
    const char* method = assign ? "assign" : "push";
    Buffers in = CheckedBuffers(arrays, method, /*writeable=*/false);
    for (size_t i = 0; i < in.keep.size(); ++i) {
      if (!AllFiniteArray(in.keep[i])) {
        throw py::value_error(
            absl::StrCat(method, ": the ", assign ? "values" : "gradient",
                         " of tensor '", in.pointers[i].first, "' contain",
                         assign ? "" : "s", " NaN or Inf; nothing was sent"));
      }
    }
    std::vector<std::pair<std::string, const float*>> sources(
        in.pointers.begin(), in.pointers.end());
    const int64_t c = clock.value_or(clock_);
    const absl::StatusOr<PushSummary> summary =
        Call([&](PsClient& client) -> absl::StatusOr<PushSummary> {
          if (assign) return client.StartAssign(c, sources)->Wait();
          return client.Push(c, sources);
        });
    if (!summary.ok()) ThrowStatus(summary.status());
    return *summary;
  }

  Buffers CheckedBuffers(const py::object& arrays, const char* method,
                         bool writeable) {
    CheckDict(arrays, method);
    Buffers b;
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(arrays)) {
      const std::string name = KeyName(key, method);
      py::array a =
          CheckArray(value, *KnownSpec(name, method), writeable, method);
      // Written only by pulls, which checked that the array is writeable.
      b.pointers.emplace_back(name,
                              static_cast<float*>(const_cast<void*>(a.data())));
      b.keep.push_back(std::move(a));
    }
    return b;
  }

  void CheckOpen() const {
    if (closed_) throw py::value_error("Client is closed");
  }

  // Runs rpc(client) with the GIL released and mu_ held; returns its
  // result. ValueError once closed.
  //
  // On Python's main thread the RPC runs on caller_ while this thread
  // looks for signals every 50 ms: a Ctrl-C (any Python signal handler
  // that raises) stops the call (the client's stop flag ends its waits and
  // retries within about 100 ms, cancelling what is on the wire) and its
  // exception, e.g. KeyboardInterrupt, is raised here.
  template <typename Rpc>
  auto Call(Rpc rpc) -> decltype(rpc(std::declval<PsClient&>())) {
    using Result = decltype(rpc(std::declval<PsClient&>()));
    CheckOpen();
    auto run = [this, &rpc]() -> Result {
      // Shared: calls of several threads run together (PsClient is
      // thread-safe); Close takes it exclusively.
      absl::ReaderMutexLock lock(&mu_);
      // Closed by another thread while this one waited for mu_. The
      // exception is a plain C++ object until the GIL is back.
      if (client_ == nullptr) throw py::value_error("Client is closed");
      return rpc(*client_);
    };
    if (PyThread_get_thread_ident() != main_thread) {
      py::gil_scoped_release release;
      return run();
    }
    std::optional<Result> result;
    std::exception_ptr failure;
    absl::Mutex done_mu;
    bool done = false;
    bool interrupted = false;
    {
      py::gil_scoped_release release;
      caller_.Run([&] {
        try {
          result.emplace(run());
        } catch (...) {
          failure = std::current_exception();
        }
        absl::MutexLock l(&done_mu);
        done = true;
      });
      for (;;) {
        {
          absl::MutexLock l(&done_mu);
          if (done_mu.AwaitWithTimeout(absl::Condition(&done),
                                       absl::Milliseconds(50))) {
            break;
          }
        }
        py::gil_scoped_acquire acquire;
        if (PyErr_CheckSignals() != 0) {
          interrupted = true;
          break;
        }
      }
      if (interrupted) {
        stop_.store(true);
        absl::MutexLock l(&done_mu);
        done_mu.Await(absl::Condition(&done));
        stop_.store(false);
      }
    }
    if (interrupted) throw py::error_already_set();  // the handler's error
    if (failure) std::rethrow_exception(failure);
    return *std::move(result);
  }

  // Copies the specs the client now knows for `names` into known_.
  // Called inside Call (mu_ held, GIL released).
  void Learn(PsClient& client, const std::vector<std::string>& names) {
    absl::MutexLock lock(&specs_mu_);
    for (const std::string& name : names) {
      if (const TensorSpec* spec = client.FindSpec(name)) {
        known_[name] = std::make_shared<const TensorSpec>(*spec);
      }
      if (const TableSpec* spec = client.FindTableSpec(name)) {
        known_tables_[name] = std::make_shared<const TableSpec>(*spec);
      }
    }
  }

  // The stored spec of a known tensor; ValueError before any RPC otherwise.
  // Does not wait for a call in flight (mu_), so that a thread holding the
  // GIL is never held up by another thread's RPC.
  std::shared_ptr<const TensorSpec> KnownSpec(const std::string& name,
                                              const char* method) {
    CheckOpen();
    absl::MutexLock lock(&specs_mu_);
    auto it = known_.find(name);
    if (it == known_.end()) {
      throw py::value_error(
          absl::StrCat(method, ": unknown tensor '", name,
                       "' (create() it or wait_for() it first)"));
    }
    return it->second;
  }

  // The stored spec of a known sparse table; ValueError otherwise.
  std::shared_ptr<const TableSpec> KnownTable(const std::string& name,
                                              const char* method) {
    CheckOpen();
    absl::MutexLock lock(&specs_mu_);
    auto it = known_tables_.find(name);
    if (it == known_tables_.end()) {
      throw py::value_error(
          absl::StrCat(method, ": unknown table '", name,
                       "' (create_tables() it or wait_for() it first)"));
    }
    return it->second;
  }

  // {name: TensorSpec or TableSpec} of known names.
  py::dict Known(const std::vector<std::string>& names) {
    py::dict out;
    for (const std::string& name : names) {
      {
        absl::MutexLock lock(&specs_mu_);
        auto it = known_tables_.find(name);
        if (it != known_tables_.end()) {
          out[py::str(name)] = *it->second;
          continue;
        }
      }
      out[py::str(name)] = *KnownSpec(name, "create");
    }
    return out;
  }

  template <typename Spec>
  static std::vector<std::string> Names(const std::vector<Spec>& specs) {
    std::vector<std::string> names;
    for (const Spec& s : specs) names.push_back(s.name());
    return names;
  }

  // Merges what a rows pull read into rows_read_: its tables replace those
  // of earlier pulls, its shard epochs those it read.
  void Remember(const ReadSet& read) {
    absl::MutexLock lock(&rows_mu_);
    for (const auto& [table, versions] : read.tables) {
      rows_read_.tables[table] = versions;
    }
    rows_read_.epochs.resize(
        std::max(rows_read_.epochs.size(), read.epochs.size()), 0);
    for (size_t i = 0; i < read.epochs.size(); ++i) {
      if (read.epochs[i] != 0) rows_read_.epochs[i] = read.epochs[i];
    }
  }

  // Row ids: a 1-D sequence or array of non-negative integers, as uint64.
  static py::array_t<uint64_t> CheckIds(const py::handle& obj,
                                        const std::string& table,
                                        const char* method) {
    py::array a = py::module_::import("numpy").attr("asarray")(obj);
    if (a.ndim() != 1) {
      throw py::value_error(absl::StrCat(method, ": ids of table '", table,
                                         "' must be 1-D, got ", a.ndim(),
                                         " dimensions"));
    }
    const char kind = a.dtype().kind();
    if (a.size() > 0 && kind != 'i' && kind != 'u') {
      throw py::type_error(absl::StrCat(method, ": ids of table '", table,
                                        "' must be integers, got dtype ",
                                        std::string(py::str(a.dtype()))));
    }
    if (kind == 'i' && a.size() > 0 && a.attr("min")().cast<int64_t>() < 0) {
      throw py::value_error(
          absl::StrCat(method, ": ids of table '", table, "' must be >= 0"));
    }
    return py::array_t<uint64_t, py::array::c_style | py::array::forcecast>(a);
  }

  // Row gradients (or values): float32, C-contiguous, shape (n, dim); not
  // converted.
  static py::array CheckRowGrads(const py::handle& original,
                                 const std::string& table, py::ssize_t n,
                                 int32_t dim, const char* method,
                                 const char* what) {
    const std::string whose =
        absl::StrCat(method, ": ", what, " of table '", table, "'");
    const py::object obj = ArrayView(original, whose);
    if (!py::isinstance<py::array>(obj)) {
      throw py::type_error(absl::StrCat(
          whose, " must be a numpy array or a CPU torch.Tensor, got ",
          std::string(py::repr(py::type::handle_of(obj)))));
    }
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().is(py::dtype::of<float>()) ||
        !(a.flags() & py::array::c_style)) {
      throw py::type_error(absl::StrCat(whose,
                                        " must be C-contiguous float32, got "
                                        "dtype ",
                                        std::string(py::str(a.dtype()))));
    }
    if (a.ndim() != 2 || a.shape(0) != n || a.shape(1) != dim) {
      std::vector<std::string> dims;
      for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        dims.push_back(absl::StrCat(a.shape(i)));
      }
      throw py::value_error(absl::StrCat(whose, " must have shape (", n, ", ",
                                         dim, "), got (",
                                         absl::StrJoin(dims, ", "), ")"));
    }
    return a;
  }

  // {name: Spec} (the key names it) or [Spec] (each names itself);
  // `method` and `type` (the Python class name) for messages.
  template <typename Spec>
  static std::vector<Spec> SpecList(const py::object& specs, const char* method,
                                    const char* type) {
    std::vector<Spec> list;
    std::vector<std::string> seen;
    auto add = [&](Spec spec) {
      if (spec.name().empty()) {
        throw py::value_error(
            absl::StrCat(method, ": a ", type, " has no name"));
      }
      for (const std::string& n : seen) {
        if (n == spec.name()) {
          throw py::value_error(
              absl::StrCat(method, ": '", n, "' given twice"));
        }
      }
      seen.push_back(spec.name());
      list.push_back(std::move(spec));
    };
    if (py::isinstance<py::dict>(specs)) {
      for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(specs)) {
        const std::string name = KeyName(key, method);
        if (!py::isinstance<Spec>(value)) {
          throw py::type_error(absl::StrCat(method, ": the value for '", name,
                                            "' must be a ", type, ", got ",
                                            std::string(py::repr(value))));
        }
        Spec spec = value.template cast<Spec>();
        if (!spec.name().empty() && spec.name() != name) {
          throw py::value_error(absl::StrCat(method, ": key '", name,
                                             "' holds a ", type, " named '",
                                             spec.name(), "'"));
        }
        spec.set_name(name);
        add(std::move(spec));
      }
    } else if (py::isinstance<py::sequence>(specs) &&
               !py::isinstance<py::str>(specs)) {
      for (const py::handle& value : specs) {
        if (!py::isinstance<Spec>(value)) {
          throw py::type_error(absl::StrCat(method, ": expected ", type,
                                            " items, got ",
                                            std::string(py::repr(value))));
        }
        add(value.template cast<Spec>());
      }
    } else {
      throw py::type_error(absl::StrCat(method, ": expected {name: ", type,
                                        "} or a list of named ", type));
    }
    return list;
  }

  // Lock order: mu_ before specs_mu_. Neither is held while waiting for
  // the GIL; mu_ is only taken with the GIL released.
  // Set while a call of the main thread is being stopped by a signal;
  // the PsClient's stop flag (PsClientOptions::stop), so declared first.
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;  // held shared during every RPC, exclusive by Close
  std::unique_ptr<PsClient> client_ ABSL_GUARDED_BY(mu_);  // null once closed
  // Runs the main thread's RPCs, so that the main thread can watch for
  // signals meanwhile (Call).
  Executor caller_{1};
  absl::Mutex specs_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const TensorSpec>> known_
      ABSL_GUARDED_BY(specs_mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const TableSpec>>
      known_tables_ ABSL_GUARDED_BY(specs_mu_);
  // What the rows pulls read, for push_rows. Taken inside Call (mu_ held).
  absl::Mutex rows_mu_;
  ReadSet rows_read_ ABSL_GUARDED_BY(rows_mu_);
  std::atomic<bool> closed_{false};

  // Const after construction.
  std::vector<std::string> servers_;
  int32_t worker_id_ = 0;
  uint64_t incarnation_ = 0;

  int64_t clock_ = 0;  // only touched with the GIL held
};

const char kModuleDoc[] = R"doc(Native asyncps client (C++ PsClient).

Use the `asyncps` package, which re-exports everything here.)doc";

const char kClientDoc[] =
    R"doc(A worker's connection to every shard of an asyncps cluster.

Client(servers, worker_id=None, *, incarnation=0, tls_ca='', tls_cert='',
       tls_key='', token_file='', rpc_timeout=120.0, call_deadline=300.0,
       max_attempts=0, initial_backoff=0.05, connections_per_shard=2,
       wire_dtype='fp32', run_id='')

servers     shard addresses in shard order: ['h:p', 'h:p'] or 'h:p,h:p'.
            Every worker must list the shards in the same order.
worker_id   this worker's id (>= 0); SSP/BSP clocks are kept per id.
            None: torchrun's RANK environment variable, else GROUP_RANK *
            LOCAL_WORLD_SIZE + LOCAL_RANK, else LOCAL_RANK on one node,
            else 0 unless WORLD_SIZE > 1 (then ValueError: two processes
            defaulting to the same id would fence each other).
incarnation this process's run of the worker (0 = a random one); pushes are
            de-duplicated per (worker_id, incarnation).
tls_ca      PEM CA that signs the shards' certificates (turns TLS on).
tls_cert, tls_key  client certificate and key for mutual TLS.
token_file  file holding the cluster token (as ps_server
            --cluster_token_file); sent with every call.
rpc_timeout deadline of one attempt of a unary RPC (heartbeat, create,
            status) in seconds.
call_deadline  every call gives up after this many seconds; meanwhile
            transient failures (a shard restarting, a lost connection) are
            retried with jittered exponential backoff starting at
            initial_backoff seconds, up to max_attempts attempts per shard
            (0 = as many as the deadline allows). Keep it above the shards'
            --pull_wait_timeout_ms under SSP/BSP. A retried push carries the
            same sequence number, so a shard applies it at most once.
connections_per_shard  TCP connections to each shard for the data streams.
wire_dtype  'fp32', or 'bf16' to send gradients and receive parameters as
            bfloat16 (half the bytes; the shards keep float32).
run_id      the run this worker belongs to (ps_server --run_id); shards of
            another run refuse its heartbeats (RpcError FAILED_PRECONDITION).

Tensors are dense float32 arrays cut into slices spread over the shards.
Arrays passed in must be numpy.ndarray, dtype float32, C-contiguous, with
exactly the tensor's shape (a torch CPU tensor's .numpy() view qualifies);
anything else raises TypeError or ValueError before anything is sent, as
does an unknown tensor name. A failed RPC raises asyncps.RpcError, whose
`code` is the gRPC status code name and `message` the shard's message.

The GIL is released during every RPC, so other Python threads run while a
call waits (e.g. an SSP pull held back by a slower worker), and calls from
several threads on one Client run concurrently (a pull and a push in flight
together). A push is tagged with what the most recent pull read.

`clock` is this worker's clock (completed steps) used by pull, push and
heartbeat when their `clock` argument is None; the caller advances it.

The Client is a context manager: leaving the block says goodbye to the
shards (leave()) and closes the connections.)doc";

const char kCreateDoc[] =
    R"doc(Creates tensors on every shard: {name: TensorSpec} or a list of named
TensorSpecs. Idempotent (an identical existing tensor is fine; a different
one raises RpcError ALREADY_EXISTS). Returns {name: TensorSpec} as stored
(slice_elems resolved).

values: {name: float32 array} for every TensorSpec with init='values' (and
none other): the tensor starts with these values (e.g. a pretrained
model's). The first creation's values win; a later creation of the same
spec keeps them (pull to get them). NaN/Inf or a wrong shape raise before
anything is sent.)doc";

const char kWaitForDoc[] =
    R"doc(Waits until every named tensor exists on every shard (created by
another worker), for at most `timeout` seconds (RpcError DEADLINE_EXCEEDED
naming what is missing). Returns {name: TensorSpec}.)doc";

const char kPullDoc[] =
    R"doc(Pulls the named tensors into new float32 arrays: {name: ndarray}.
`clock` (default: self.clock) is this worker's clock; under SSP/BSP a shard
holds the pull until slower workers are within the slack. Records every
slice's version for the next push.)doc";

const char kPullIntoDoc[] =
    R"doc(Pulls tensors straight into the given arrays ({name: ndarray}, each
float32, C-contiguous, writeable, of the tensor's shape), with no extra
copy. Otherwise as pull(). On error the arrays may be partly written.)doc";

const char kPushDoc[] =
    R"doc(Pushes gradients ({name: ndarray} of the tensors' shapes, float32,
C-contiguous), tagged with the versions read by the last pull of each
tensor and `clock` (default: self.clock). Retries reuse the push's sequence
number, so each shard applies it exactly once. Returns a PushResult
(applied / refused_stale slice updates, duplicates, staleness).)doc";

const char kAssignDoc[] =
    R"doc(Replaces the values of whole tensors on the shards ({name: ndarray}
of the tensors' shapes, float32, C-contiguous, finite), e.g. to load a saved
model into a run: each slice takes the values as given (no optimizer step;
the optimizer's state is kept) and its version advances by one, so pushes
computed from the older values count it as staleness. Exactly once like a
push (one sequence number, kept by retries); each shard assigns its slices
all-or-nothing. Returns a PushResult (applied = slices assigned).)doc";

const char kStatusDoc[] =
    R"doc(Every shard's Status as one dict, the document `psctl status --json`
prints: {'shards': [{'index', 'address', 'up', 'status': {...}}],
'summary': {...}, 'workers': [...]}. In 'status', 64-bit integers are
strings (protobuf's JSON mapping).)doc";

}  // namespace

// The optimizer fields of a TensorSpec or TableSpec class as read-only
// properties, the same on both.
template <typename Spec>
void AddOptimizerProperties(py::class_<Spec>& c) {
  c.def_property_readonly("optimizer",
                          [](const Spec& s) {
                            return EnumName(kOptimizers, s.optimizer().type());
                          })
      .def_property_readonly(
          "lr", [](const Spec& s) { return s.optimizer().learning_rate(); })
      .def_property_readonly(
          "momentum", [](const Spec& s) { return s.optimizer().momentum(); })
      .def_property_readonly(
          "beta1", [](const Spec& s) { return s.optimizer().beta1(); })
      .def_property_readonly(
          "beta2", [](const Spec& s) { return s.optimizer().beta2(); })
      .def_property_readonly(
          "epsilon", [](const Spec& s) { return s.optimizer().epsilon(); })
      .def_property_readonly(
          "initial_accumulator",
          [](const Spec& s) { return s.optimizer().initial_accumulator(); })
      .def_property_readonly(
          "scheduled_lr",
          [](const Spec& s) { return s.optimizer().scheduled_learning_rate(); },
          "The rate in effect from schedule_step on (Client.set_lr); 0.0 "
          "when no schedule step was applied. Set in what list_tensors() "
          "returns.")
      .def_property_readonly(
          "schedule_step",
          [](const Spec& s) { return s.optimizer().schedule_step(); },
          "The schedule step of scheduled_lr; 0 when none.");
}

PYBIND11_MODULE(_native, m) {
  m.doc() = kModuleDoc;
  main_thread = py::module_::import("threading")
                    .attr("main_thread")()
                    .attr("ident")
                    .cast<unsigned long>();
  m.attr("__version__") = kVersion;

  rpc_error_type = PyErr_NewExceptionWithDoc(
      "asyncps.RpcError",
      "A call to the shards failed. `code`: the gRPC status code name "
      "(e.g. 'NOT_FOUND', 'UNAVAILABLE'); `grpc_code`: its number; "
      "`message`: the error message (it names the shard).",
      PyExc_RuntimeError, nullptr);
  if (rpc_error_type == nullptr) throw py::error_already_set();
  m.attr("RpcError") = py::handle(rpc_error_type);

  m.def("tune_malloc_for_large_messages", &TuneProcess,
        "Keeps large message buffers out of mmap/munmap (glibc mallopt) so "
        "that every large pull or push does not page-fault its memory in "
        "again, and turns off Abseil's lock-cycle detection; what ps_server "
        "and ps_worker do at start. Process-wide; call once, early.");

  py::class_<TensorSpec> tensor_spec(
      m, "TensorSpec",
      R"doc(How a tensor is created on the shards.

TensorSpec(shape, *, name='', init='zeros', init_value=0.0, seed=0,
           optimizer='sgd', lr=0.01, momentum=0.9, beta1=0.9,
           beta2=0.999, epsilon=1e-8, initial_accumulator=0.1,
           slice_elems=0)

shape        dimensions, each > 0.
init         'zeros', 'constant' (= init_value), 'uniform'
             (U(-init_value, init_value)), 'normal' (N(0, init_value^2)),
             'glorot_uniform'; seeded by `seed`. 'values': the values
             Client.create(..., values=) passes (a module's own).
optimizer    'sgd', 'momentum' (uses momentum), 'adam' (beta1, beta2,
             epsilon) or 'adagrad' (epsilon, initial_accumulator), run on
             the shards with learning rate `lr`.
slice_elems  elements per slice (0 = the shards' --slice_elems).
name         optional here; Client.create({name: spec}) names it.

Bad values raise ValueError at once. Creation is idempotent: the same spec
again is a no-op, a different one is RpcError ALREADY_EXISTS.)doc");
  tensor_spec
      .def(py::init(&MakeSpec), py::arg("shape"), py::kw_only(),
           py::arg("name") = "", py::arg("init") = "zeros",
           py::arg("init_value") = 0.0, py::arg("seed") = 0,
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01,
           py::arg("momentum") = 0.9, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("epsilon") = 1e-8,
           py::arg("initial_accumulator") = 0.1, py::arg("slice_elems") = 0)
      .def_property_readonly("name", &TensorSpec::name)
      .def_property_readonly("shape", &ShapeOf)
      .def_property_readonly("num_elems", &NumElems)
      .def_property_readonly(
          "init",
          [](const TensorSpec& s) { return EnumName(kInits, s.init()); })
      .def_property_readonly("init_value", &TensorSpec::init_value)
      .def_property_readonly("seed", &TensorSpec::seed)
      .def_property_readonly("slice_elems", &TensorSpec::slice_elems)
      .def("__eq__",
           [](const TensorSpec& a, const py::object& b) {
             return py::isinstance<TensorSpec>(b) &&
                    google::protobuf::util::MessageDifferencer::Equals(
                        a, b.cast<TensorSpec>());
           })
      .def("__repr__", &SpecRepr);
  AddOptimizerProperties<TensorSpec>(tensor_spec);

  py::class_<TableSpec> table_spec(
      m, "TableSpec",
      R"doc(How a sparse embedding table is created on the shards.

TableSpec(dim, *, name='', init='zeros', init_value=0.0, seed=0,
          optimizer='sgd', lr=0.01, momentum=0.9, beta1=0.9, beta2=0.999,
          epsilon=1e-8, initial_accumulator=0.1)

dim          floats per row, 1..65536. Rows are created on first touch
             (a pull or push of their id) on the shard the id hashes to.
init         'zeros', 'constant', 'uniform' or 'normal' (as TensorSpec;
             no 'glorot_uniform': a table has no fan-in).
optimizer    as TensorSpec, applied per row to the rows a push touches
             ('adam' is lazy: moments per row).
name         optional here; Client.create_tables({name: spec}) names it.

Bad values raise ValueError at once.)doc");
  table_spec
      .def(py::init(&MakeTableSpec), py::arg("dim"), py::kw_only(),
           py::arg("name") = "", py::arg("init") = "zeros",
           py::arg("init_value") = 0.0, py::arg("seed") = 0,
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01,
           py::arg("momentum") = 0.9, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("epsilon") = 1e-8,
           py::arg("initial_accumulator") = 0.1)
      .def_property_readonly("name", &TableSpec::name)
      .def_property_readonly("dim", &TableSpec::dim)
      .def_property_readonly(
          "init", [](const TableSpec& s) { return EnumName(kInits, s.init()); })
      .def_property_readonly("init_value", &TableSpec::init_value)
      .def_property_readonly("seed", &TableSpec::seed)
      .def("__eq__",
           [](const TableSpec& a, const py::object& b) {
             return py::isinstance<TableSpec>(b) &&
                    google::protobuf::util::MessageDifferencer::Equals(
                        a, b.cast<TableSpec>());
           })
      .def("__repr__", &TableRepr);
  AddOptimizerProperties<TableSpec>(table_spec);

  py::class_<PushSummary>(m, "PushResult",
                          "What the shards did with one push, over all "
                          "slices of all pushed tensors.")
      .def_readonly("applied", &PushSummary::applied, "slice updates applied")
      .def_readonly("refused_stale", &PushSummary::refused_stale,
                    "slice updates refused as too stale (--max_staleness)")
      .def_readonly("duplicates", &PushSummary::duplicates,
                    "shards that recognised a retry of a push they had "
                    "already applied (acknowledged, not applied again)")
      .def_readonly("max_staleness", &PushSummary::max_staleness,
                    "largest staleness (current - read version) of a slice")
      .def_readonly("mean_staleness", &PushSummary::mean_staleness,
                    "mean staleness over the slice results")
      .def_readonly("refused_restored", &PushSummary::refused_restored,
                    "slice updates refused because a shard restarted (and "
                    "restored its checkpoint) since the pull")
      .def_property_readonly(
          "tensors",
          [](const PushSummary& r) {
            py::dict out;
            for (const auto& [name, o] : r.tensors) {
              py::dict d;
              d["applied"] = o.applied;
              d["refused_stale"] = o.refused_stale;
              d["refused_restored"] = o.refused_restored;
              d["max_staleness"] = o.max_staleness;
              d["mean_staleness"] = o.mean_staleness;
              out[py::str(name)] = d;
            }
            return out;
          },
          "per pushed tensor: {name: {applied, refused_stale, "
          "refused_restored, max_staleness, mean_staleness}}")
      .def("__repr__", [](const PushSummary& r) {
        return absl::StrCat("PushResult(applied=", r.applied,
                            ", refused_stale=", r.refused_stale,
                            ", duplicates=", r.duplicates,
                            ", max_staleness=", r.max_staleness,
                            ", mean_staleness=", r.mean_staleness, ")");
      });

  py::class_<Client>(m, "Client", kClientDoc)
      .def(py::init<const py::object&, const py::object&, uint64_t,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&, double, double, int, double, int,
                    const std::string&, const std::string&>(),
           py::arg("servers"), py::arg("worker_id") = py::none(), py::kw_only(),
           py::arg("incarnation") = 0, py::arg("tls_ca") = "",
           py::arg("tls_cert") = "", py::arg("tls_key") = "",
           py::arg("token_file") = "", py::arg("rpc_timeout") = 120.0,
           py::arg("call_deadline") = 300.0, py::arg("max_attempts") = 0,
           py::arg("initial_backoff") = 0.05,
           py::arg("connections_per_shard") = 2, py::arg("wire_dtype") = "fp32",
           py::arg("run_id") = "")
      .def("create", &Client::Create, py::arg("specs"),
           py::arg("values") = py::none(), kCreateDoc)
      .def("wait_for", &Client::WaitFor, py::arg("names"),
           py::arg("timeout") = 60.0, kWaitForDoc)
      .def("spec", &Client::Spec, py::arg("name"),
           "The stored TensorSpec of a tensor this client created or waited "
           "for, or None.")
      .def("pull", &Client::Pull, py::arg("names"),
           py::arg("clock") = py::none(), kPullDoc)
      .def("pull_into", &Client::PullInto, py::arg("arrays"),
           py::arg("clock") = py::none(), kPullIntoDoc)
      .def("push", &Client::Push, py::arg("grads"),
           py::arg("clock") = py::none(), kPushDoc)
      .def("assign", &Client::Assign, py::arg("values"),
           py::arg("clock") = py::none(), kAssignDoc)
      .def("create_tables", &Client::CreateTables, py::arg("specs"),
           "Creates sparse tables on every shard ({name: TableSpec} or a "
           "list of named TableSpec; idempotent) and returns {name: "
           "TableSpec} as stored. wait_for() also waits for tables.")
      .def("pull_rows", &Client::PullRows, py::arg("ids"),
           py::arg("clock") = py::none(), py::arg("peek") = false,
           "{table: ids} -> {table: float32 array (len(ids), dim)}: the rows "
           "of those ids (created with their initial values on first touch), "
           "one request per shard for all tables. Repeated ids get the same "
           "row. Waits as pull() does under SSP/BSP. peek=True reads without "
           "creating or marking rows (evaluation): an id never trained gets "
           "its initial values, and nothing is remembered for push_rows.")
      .def("set_lr", &Client::SetLr, py::arg("rates"), py::arg("step"),
           "{name: learning rate}, step -> {name: (rate, step) in effect}: "
           "changes the learning rate of tensors and tables on every shard "
           "from schedule step `step` (>= 1: an epoch number, or the clock "
           "a schedule changed at). A step above the shards' applies; the "
           "same step and rate changes nothing (every worker may ask); the "
           "same step with another rate raises RpcError ALREADY_EXISTS "
           "(workers disagree); a lower step changes nothing and the answer "
           "shows the later rate in effect. Kept in checkpoints and the spec "
           "file; listed in status() and list_tensors().")
      .def("list_tensors", &Client::ListTensors,
           "(tensors, tables): every TensorSpec and TableSpec the shards "
           "hold, by name ({name: spec} each).")
      .def("push_rows", &Client::PushRows, py::arg("grads"),
           py::arg("clock") = py::none(),
           "{table: (ids, grads)}, grads float32 (len(ids), dim): pushes row "
           "gradients computed from what the last pull_rows read (repeated "
           "ids are summed). Returns a PushResult; NaN/Inf or bad shapes "
           "raise before anything is sent.")
      .def("assign_rows", &Client::AssignRows, py::arg("values"),
           py::arg("clock") = py::none(),
           "{table: (ids, values)}, values float32 (len(ids), dim): replaces "
           "those rows on the shards (created with these values where they "
           "do not exist; no optimizer step, one version more each), exactly "
           "once like a push. An id twice in a table, NaN/Inf or bad shapes "
           "raise before anything is sent. Returns a PushResult (applied = "
           "rows assigned).")
      .def("heartbeat", &Client::Heartbeat, py::arg("clock") = py::none(),
           py::arg("leaving") = false,
           "Renews this worker's lease on every shard and reports `clock` "
           "(default: self.clock); leaving=True says goodbye.")
      .def(
          "leave",
          [](Client& c, std::optional<int64_t> clock) {
            c.Heartbeat(clock, /*leaving=*/true);
          },
          py::arg("clock") = py::none(),
          "Tells every shard this worker is done: SSP/BSP stop waiting for "
          "it. A later call rejoins.")
      .def("status", &Client::Status, kStatusDoc)
      .def("versions", &Client::Versions, py::arg("name"),
           "Per slice, the version read by the last pull of `name`.")
      .def("close", &Client::Close,
           "Closes the connections (without saying goodbye; see leave()). "
           "Further calls raise ValueError.")
      .def_property_readonly("closed", &Client::closed,
                             "True once close() ran (or the with block "
                             "ended).")
      .def_property("clock", &Client::clock, &Client::set_clock,
                    "This worker's clock (completed steps), used when a "
                    "call's `clock` is None. The caller advances it.")
      .def_property_readonly("worker_id", &Client::worker_id)
      .def_property_readonly("incarnation", &Client::incarnation,
                             "This process's incarnation (chosen at random "
                             "when 0 was given).")
      .def_property_readonly("servers", &Client::servers,
                             "The shard addresses, in shard order.")
      .def(
          "__enter__", [](Client& c) -> Client& { return c; },
          py::return_value_policy::reference)
      .def(
          "__exit__",
          [](Client& c, const py::object& type, const py::object&,
             const py::object&) {
            if (c.closed()) return false;
            try {
              c.Heartbeat(std::nullopt, /*leaving=*/true);
            } catch (...) {
              c.Close();
              // With an exception already on its way out, do not replace
              // it with this one.
              if (type.is_none()) throw;
              return false;
            }
            c.Close();
            return false;
          },
          py::arg("exc_type"), py::arg("exc_value"), py::arg("traceback"))
      .def("__repr__", [](Client& c) {
        return absl::StrCat("asyncps.Client(servers=[",
                            absl::StrJoin(c.servers(), ", "),
                            "], closed=", c.closed() ? "True" : "False", ")");
      });

  // Shown as asyncps.X (the package re-exports them) in help() and repr().
  for (const char* name : {"TensorSpec", "TableSpec", "PushResult", "Client"}) {
    m.attr(name).attr("__module__") = "asyncps";
  }
}

}  // namespace python
}  // namespace asyncps
