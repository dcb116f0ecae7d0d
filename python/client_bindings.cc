#include "python/client_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "python/client.h"

namespace asyncps {
namespace python {
namespace {

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

const char kPushPullIntoDoc[] =
    R"doc(A step boundary in one message per shard: pushes `grads` as push()
does (at `clock`, default self.clock), then pulls into `arrays` as
pull_into() at clock + 1, the pull served by each shard once it has
acknowledged the push, so the values include it. Returns the push's
PushResult. What push() and pull_into() do as two calls to every shard,
in one; a failure of either raises (the push may have been applied:
its retry is de-duplicated).)doc";

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

// Client's calls: the RPCs, create() to versions().
void AddClientCalls(py::class_<Client>& client) {
  client
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
      .def("push_pull_into", &Client::PushPullInto, py::arg("grads"),
           py::arg("arrays"), py::arg("clock") = py::none(), kPushPullIntoDoc)
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
           "Per slice, the version read by the last pull of `name`.");
}

// Client's state (closed, clock, worker_id, ...) and its life: close() and
// the with block.
void AddClientLifecycle(py::class_<Client>& client) {
  client
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
}

}  // namespace

void RegisterPushResult(py::module_& m) {
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
}

void RegisterClient(py::module_& m) {
  py::class_<Client> client(m, "Client", kClientDoc);
  client.def(
      py::init<const py::object&, const py::object&, uint64_t,
               const std::string&, const std::string&, const std::string&,
               const std::string&, double, double, int, double, int,
               const std::string&, const std::string&>(),
      py::arg("servers"), py::arg("worker_id") = py::none(), py::kw_only(),
      py::arg("incarnation") = 0, py::arg("tls_ca") = "",
      py::arg("tls_cert") = "", py::arg("tls_key") = "",
      py::arg("token_file") = "", py::arg("rpc_timeout") = 120.0,
      py::arg("call_deadline") = 300.0, py::arg("max_attempts") = 0,
      py::arg("initial_backoff") = 0.05, py::arg("connections_per_shard") = 2,
      py::arg("wire_dtype") = "fp32", py::arg("run_id") = "");
  AddClientCalls(client);
  AddClientLifecycle(client);
}

}  // namespace python
}  // namespace asyncps
