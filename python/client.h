#ifndef ASYNCPS_PYTHON_CLIENT_H_
#define ASYNCPS_PYTHON_CLIENT_H_

// Client, what asyncps.Client is in C++: one PsClient, the argument checks
// of its calls and how a call runs (Call: the GIL released once, Ctrl-C
// watched on the main thread while a call waits). Its calls are defined in
// client.cc (construction, dense tensors, status) and client_rows.cc (sparse
// tables); the Python class is bound in client_bindings.cc.
//
// Every call has the same shape: check the arguments with the GIL held
// (arrays.h, KnownSpec), run the RPC through Call, and turn a failed
// absl::Status into asyncps.RpcError (errors.h):
//   const absl::Status s =
//       Call([&](PsClient& client) { return client.Heartbeat(c, leaving); });
//   if (!s.ok()) ThrowStatus(s);

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "proto/asyncps.pb.h"

namespace asyncps {
namespace python {

namespace py = pybind11;

// Python's main thread (threading.main_thread().ident), where signal
// handlers run; set when the module is imported.
extern unsigned long main_thread;

// The Python Client. Owns one PsClient (thread-safe); calls from several
// Python threads run concurrently, mu_ (shared) keeps Close from pulling the
// client away under them. RPCs run with the GIL
// released and mu_ held; argument checks read a copy of the known specs
// (known_) instead, so they never wait for another thread's RPC while
// holding the GIL. Thread-safe.
class Client {
 public:
  // The arguments of asyncps.Client(...); TypeError or ValueError for a bad
  // one, before anything connects.
  Client(const py::object& servers, const py::object& worker_id_arg,
         uint64_t incarnation, const std::string& tls_ca,
         const std::string& tls_cert, const std::string& tls_key,
         const std::string& token_file, double rpc_timeout,
         double call_deadline, int max_attempts, double initial_backoff,
         int connections_per_shard, const std::string& wire_dtype,
         const std::string& run_id);

  // An integer environment variable; nullopt when unset or empty,
  // ValueError naming it when not an integer >= 0.
  static std::optional<int32_t> EnvInt(const char* name);

  // The worker id: the argument, or (None) torchrun's RANK, or its
  // GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK, or LOCAL_RANK on one node;
  // 0 only when no WORLD_SIZE says several processes run (two processes
  // that both default to 0 would fence each other).
  static int32_t WorkerIdOf(const py::object& arg);

  // Accepts "h:p,h:p" or a sequence of "h:p".
  static std::vector<std::string> ServerList(const py::object& servers);

  // The calls of asyncps.Client, documented where they are bound
  // (client_bindings.cc). Each raises ValueError once the Client is closed.
  py::dict Create(const py::object& specs, const py::object& values);
  py::dict WaitFor(const py::object& names_arg, double timeout);
  py::tuple ListTensors();
  py::dict SetLr(const py::dict& rates, int64_t step);
  std::optional<TensorSpec> Spec(const std::string& name);
  py::dict Pull(const py::object& names_arg, std::optional<int64_t> clock);
  void PullInto(const py::object& arrays, std::optional<int64_t> clock);
  PushSummary Push(const py::object& grads, std::optional<int64_t> clock);
  PushSummary PushPullInto(const py::object& grads, const py::object& arrays,
                           std::optional<int64_t> clock);
  PushSummary Assign(const py::object& values, std::optional<int64_t> clock);

  // Sparse tables (client_rows.cc).
  py::dict CreateTables(const py::object& specs);
  // {table: ids} -> {table: float32 array (len(ids), dim)}. Remembers what
  // was read (row versions, shard epochs) for push_rows.
  py::dict PullRows(const py::object& ids, std::optional<int64_t> clock,
                    bool peek);
  // {table: (ids, grads)} with grads float32 (len(ids), dim), computed from
  // the rows the last pull_rows read.
  PushSummary PushRows(const py::object& grads, std::optional<int64_t> clock);
  PushSummary AssignRows(const py::object& values,
                         std::optional<int64_t> clock);
  // PushRows (gradients) or AssignRows (values): checked whole before
  // anything is sent.
  PushSummary SendRows(const py::object& grads, std::optional<int64_t> clock,
                       bool assign);

  void Heartbeat(std::optional<int64_t> clock, bool leaving);
  py::object Status();
  std::vector<uint64_t> Versions(const std::string& name);
  void Close();

  bool closed() const { return closed_; }
  int64_t clock() const { return clock_; }
  void set_clock(int64_t clock);
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
                   bool assign);
  // The push of checked arrays `in`, after refusing NaN or Inf in any of
  // them (ValueError naming the tensor, nothing sent).
  static PushSet FiniteSet(const Buffers& in, const char* method, bool assign);

  Buffers CheckedBuffers(const py::object& arrays, const char* method,
                         bool writeable);

  void CheckOpen() const;

  // Runs rpc(client) with the GIL released and mu_ held; returns its
  // result. ValueError once closed.
  //
  // The RPC runs on the calling thread. On Python's main thread, a call
  // that waits longer than about 100 ms looks for signals every 100 ms
  // (PollSignals): a Ctrl-C (any Python signal handler that raises) stops
  // the call (the client's stop flag ends its waits and retries, cancelling
  // what is on the wire) and its exception, e.g. KeyboardInterrupt, is
  // raised here. A call answered sooner costs no thread hop and no GIL
  // hand-off beyond releasing the GIL once.
  template <typename Rpc>
  auto Call(Rpc rpc) -> decltype(rpc(std::declval<PsClient&>()));

  // PsClientOptions::poll_stop: on Python's main thread during Call, runs
  // the Python signal handlers (GIL taken); one that raises sets stop_ and
  // leaves its exception for Call. Nothing on other threads.
  void PollSignals();

  // Copies the specs the client now knows for `names` into known_.
  // Called inside Call (mu_ held, GIL released).
  void Learn(PsClient& client, const std::vector<std::string>& names);

  // The stored spec of a known tensor; ValueError before any RPC otherwise.
  // Does not wait for a call in flight (mu_), so that a thread holding the
  // GIL is never held up by another thread's RPC.
  std::shared_ptr<const TensorSpec> KnownSpec(const std::string& name,
                                              const char* method);

  // The stored spec of a known sparse table; ValueError otherwise.
  std::shared_ptr<const TableSpec> KnownTable(const std::string& name,
                                              const char* method);

  // {name: TensorSpec or TableSpec} of known names.
  py::dict Known(const std::vector<std::string>& names);

  template <typename Spec>
  static std::vector<std::string> Names(const std::vector<Spec>& specs) {
    std::vector<std::string> names;
    for (const Spec& s : specs) names.push_back(s.name());
    return names;
  }

  // Merges what a rows pull read into rows_read_: its tables replace those
  // of earlier pulls, its shard epochs those it read.
  void Remember(const ReadSet& read);

  // Lock order: mu_ before specs_mu_. mu_ is only taken with the GIL
  // released, and specs_mu_ is held only briefly, never while waiting for
  // the GIL or an RPC. The main thread may take the GIL while it holds mu_
  // shared (PollSignals, during a wait): no thread waits for mu_ while
  // holding the GIL.
  // Set while a call of the main thread is being stopped by a signal;
  // the PsClient's stop flag (PsClientOptions::stop), so declared first.
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;  // held shared during every RPC, exclusive by Close
  std::unique_ptr<PsClient> client_ ABSL_GUARDED_BY(mu_);  // null once closed
  // Touched only by Python's main thread: a Call of it is running, and a
  // signal handler raised during it (its exception is pending).
  bool main_calling_ = false;
  bool interrupted_ = false;
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

template <typename Rpc>
auto Client::Call(Rpc rpc) -> decltype(rpc(std::declval<PsClient&>())) {
  using Result = decltype(rpc(std::declval<PsClient&>()));
  CheckOpen();
  auto run = [this, &rpc]() -> Result {
    py::gil_scoped_release release;
    // Shared: calls of several threads run together (PsClient is
    // thread-safe); Close takes it exclusively.
    absl::ReaderMutexLock lock(&mu_);
    // Closed by another thread while this one waited for mu_. The
    // exception is a plain C++ object until the GIL is back.
    if (client_ == nullptr) throw py::value_error("Client is closed");
    return rpc(*client_);
  };
  if (PyThread_get_thread_ident() != main_thread) return run();
  std::optional<Result> result;
  std::exception_ptr failure;
  // A call made by a signal handler that a waiting call ran leaves that
  // one still watching.
  const bool outer = main_calling_;
  main_calling_ = true;
  try {
    result.emplace(run());
  } catch (...) {
    failure = std::current_exception();
  }
  main_calling_ = outer;
  if (interrupted_) {
    interrupted_ = false;
    stop_.store(false);
    throw py::error_already_set();  // the handler's error (PollSignals)
  }
  if (failure) std::rethrow_exception(failure);
  return *std::move(result);
}

}  // namespace python
}  // namespace asyncps

#endif  // ASYNCPS_PYTHON_CLIENT_H_
