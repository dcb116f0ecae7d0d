#include "python/client.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/net.h"
#include "common/security.h"
#include "python/arrays.h"
#include "python/errors.h"
#include "python/specs.h"
#include "tools/status_table.h"

namespace asyncps {
namespace python {

unsigned long main_thread = 0;

Client::Client(const py::object& servers, const py::object& worker_id_arg,
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
  o.poll_stop = [this] { PollSignals(); };
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
    throw py::value_error(absl::StrCat(
        "Client: initial_backoff must be >= 0 seconds, got ", initial_backoff));
  }
  o.retry.initial_backoff = absl::Seconds(initial_backoff);
  o.retry.max_backoff = std::max(o.retry.max_backoff, o.retry.initial_backoff);
  if (connections_per_shard < 1 || connections_per_shard > 16) {
    throw py::value_error(
        absl::StrCat("Client: connections_per_shard must be in [1, 16], got ",
                     connections_per_shard));
  }
  o.connections_per_shard = connections_per_shard;
  if (wire_dtype == "bf16") {
    o.push_dtype = o.pull_dtype = WIRE_BF16;
  } else if (wire_dtype != "fp32") {
    throw py::value_error(absl::StrCat(
        "Client: wire_dtype must be 'fp32' or 'bf16', got '", wire_dtype, "'"));
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

std::optional<int32_t> Client::EnvInt(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  int32_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0) {
    throw py::value_error(
        absl::StrCat("Client: ", name, "='", text, "' is not an integer >= 0"));
  }
  return value;
}

int32_t Client::WorkerIdOf(const py::object& arg) {
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

std::vector<std::string> Client::ServerList(const py::object& servers) {
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

py::dict Client::Create(const py::object& specs, const py::object& values) {
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
      arrays.push_back(CheckArray(array, *spec, /*writeable=*/false, "create"));
      given.emplace_back(name, static_cast<const float*>(arrays.back().data()));
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

py::dict Client::WaitFor(const py::object& names_arg, double timeout) {
  const std::vector<std::string> names = NameList(names_arg, "wait_for");
  if (!(timeout >= 0) || !std::isfinite(timeout)) {
    throw py::value_error(
        absl::StrCat("wait_for: timeout must be >= 0 seconds, got ", timeout));
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

py::tuple Client::ListTensors() {
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

py::dict Client::SetLr(const py::dict& rates, int64_t step) {
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

std::optional<TensorSpec> Client::Spec(const std::string& name) {
  CheckOpen();
  absl::MutexLock lock(&specs_mu_);
  auto it = known_.find(name);
  if (it == known_.end()) return std::nullopt;
  return *it->second;
}

py::dict Client::Pull(const py::object& names_arg,
                      std::optional<int64_t> clock) {
  const std::vector<std::string> names = NameList(names_arg, "pull");
  py::dict out;
  for (const std::string& name : names) {
    const std::shared_ptr<const TensorSpec> spec = KnownSpec(name, "pull");
    if (out.contains(name)) {
      throw py::value_error(
          absl::StrCat("pull: tensor '", name, "' named twice"));
    }
    std::vector<py::ssize_t> shape(spec->shape().begin(), spec->shape().end());
    out[py::str(name)] = py::array_t<float>(shape);
  }
  PullInto(out, clock);
  return out;
}

void Client::PullInto(const py::object& arrays, std::optional<int64_t> clock) {
  Buffers out = CheckedBuffers(arrays, "pull_into", /*writeable=*/true);
  const int64_t c = clock.value_or(clock_);
  const absl::Status s =
      Call([&](PsClient& client) { return client.Pull(c, out.pointers); });
  if (!s.ok()) ThrowStatus(s);
}

PushSummary Client::Push(const py::object& grads,
                         std::optional<int64_t> clock) {
  return Send(grads, clock, /*assign=*/false);
}

PushSummary Client::Assign(const py::object& values,
                           std::optional<int64_t> clock) {
  return Send(values, clock, /*assign=*/true);
}

void Client::Heartbeat(std::optional<int64_t> clock, bool leaving) {
  const int64_t c = clock.value_or(clock_);
  const absl::Status s =
      Call([&](PsClient& client) { return client.Heartbeat(c, leaving); });
  if (!s.ok()) ThrowStatus(s);
}

py::object Client::Status() {
  absl::StatusOr<std::vector<StatusResponse>> status =
      Call([](PsClient& client) { return client.Status(); });
  if (!status.ok()) ThrowStatus(status.status());
  std::vector<ShardResult> shards;
  for (size_t i = 0; i < status->size(); ++i) {
    ShardResult r;
    r.index = static_cast<int>(i);
    r.address = servers_[i];
    // A shard that owns no slot was not asked (PsClient::Status).
    r.up = (*status)[i].num_shards() > 0;
    if (!r.up) r.error = "owns no slot of the map: not asked";
    r.status = std::move((*status)[i]);
    shards.push_back(std::move(r));
  }
  return py::module_::import("json").attr("loads")(RenderJson(shards));
}

std::vector<uint64_t> Client::Versions(const std::string& name) {
  KnownSpec(name, "versions");
  return Call([&](PsClient& client) { return client.PulledVersions(name); });
}

void Client::Close() {
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

void Client::set_clock(int64_t clock) {
  if (clock < 0) {
    throw py::value_error(absl::StrCat("clock must be >= 0, got ", clock));
  }
  clock_ = clock;
}

PushSummary Client::PushPullInto(const py::object& grads,
                                 const py::object& arrays,
                                 std::optional<int64_t> clock) {
  Buffers in = CheckedBuffers(grads, "push_pull_into", /*writeable=*/false);
  const PushSet set = FiniteSet(in, "push_pull_into", /*assign=*/false);
  Buffers out = CheckedBuffers(arrays, "push_pull_into", /*writeable=*/true);
  const int64_t c = clock.value_or(clock_);
  const absl::StatusOr<PushSummary> summary =
      Call([&](PsClient& client) -> absl::StatusOr<PushSummary> {
        return client.PushThenPull(c, set, out.pointers);
      });
  if (!summary.ok()) ThrowStatus(summary.status());
  return *summary;
}

PushSummary Client::Send(const py::object& arrays, std::optional<int64_t> clock,
                         bool assign) {
  const char* method = assign ? "assign" : "push";
  Buffers in = CheckedBuffers(arrays, method, /*writeable=*/false);
  const PushSet set = FiniteSet(in, method, assign);
  const int64_t c = clock.value_or(clock_);
  const absl::StatusOr<PushSummary> summary =
      Call([&](PsClient& client) -> absl::StatusOr<PushSummary> {
        if (assign) return client.StartAssign(c, set)->Wait();
        return client.StartPush(c, set, client.LastRead())->Wait();
      });
  if (!summary.ok()) ThrowStatus(summary.status());
  return *summary;
}

PushSet Client::FiniteSet(const Buffers& in, const char* method, bool assign) {
  for (size_t i = 0; i < in.keep.size(); ++i) {
    if (!AllFiniteArray(in.keep[i])) {
      throw py::value_error(
          absl::StrCat(method, ": the ", assign ? "values" : "gradient",
                       " of tensor '", in.pointers[i].first, "' contain",
                       assign ? "" : "s", " NaN or Inf; nothing was sent"));
    }
  }
  PushSet set;
  set.tensors.assign(in.pointers.begin(), in.pointers.end());
  set.tensors_checked_finite = true;  // just above
  return set;
}

Client::Buffers Client::CheckedBuffers(const py::object& arrays,
                                       const char* method, bool writeable) {
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

void Client::PollSignals() {
  if (PyThread_get_thread_ident() != main_thread || !main_calling_ ||
      interrupted_) {
    return;
  }
  py::gil_scoped_acquire acquire;
  if (PyErr_CheckSignals() != 0) {
    interrupted_ = true;
    stop_.store(true);
  }
}

void Client::CheckOpen() const {
  if (closed_) throw py::value_error("Client is closed");
}

void Client::Learn(PsClient& client, const std::vector<std::string>& names) {
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

std::shared_ptr<const TensorSpec> Client::KnownSpec(const std::string& name,
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

py::dict Client::Known(const std::vector<std::string>& names) {
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

}  // namespace python
}  // namespace asyncps
