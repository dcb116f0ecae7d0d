// PsClient's catalog: the tensors and tables it knows, how they are created
// on every shard, and how a worker waits for those another one creates.
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
#include "client/ps_client_internal.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/shard_map_proto.h"

namespace asyncps {

namespace {

constexpr absl::Duration kMaxListPollInterval = absl::Seconds(1);
constexpr absl::Duration kWaitReport = absl::Seconds(5);

using google::protobuf::util::MessageDifferencer;

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

// Adds the initial values of the INIT_VALUES tensors of `specs` to
// `request`; INVALID_ARGUMENT for a missing, extra or non-finite entry.
absl::Status AddInitialValues(
    const std::vector<TensorSpec>& specs,
    const std::vector<std::pair<std::string, const float*>>& values,
    CreateTensorRequest* request) {
  absl::flat_hash_set<std::string> given;
  for (const auto& [name, data] : values) {
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& t : specs) {
      if (t.name() == name) spec = &t;
    }
    if (spec == nullptr || spec->init() != INIT_VALUES || data == nullptr ||
        !given.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTensors: values given for ", QuoteName(name),
          ", which is not a tensor of this call with init INIT_VALUES (or "
          "given twice, or null)"));
    }
    const int64_t elems =
        TensorLayout::Create(
            std::vector<int64_t>(spec->shape().begin(), spec->shape().end()), 1)
            ->num_elems();
    if (!AllFinite(reinterpret_cast<const char*>(data),
                   static_cast<size_t>(elems), WIRE_F32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensors: the values of tensor ", QuoteName(name),
                       " contain NaN or Inf; nothing was sent"));
    }
    TensorValues* v = request->add_values();
    v->set_tensor(name);
    EncodeFloats(data, static_cast<size_t>(elems), v->mutable_values());
  }
  for (const TensorSpec& spec : specs) {
    if (spec.init() == INIT_VALUES && !given.contains(spec.name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensors: tensor ", QuoteName(spec.name()),
                       " has init INIT_VALUES but no values were given"));
    }
  }
  return absl::OkStatus();
}

// One shard's answer to CreateTensor: the specs asked, in order, with a
// slice size resolved.
absl::Status CheckCreated(const std::vector<TensorSpec>& specs,
                          const CreateTensorResponse& r) {
  if (r.tensors_size() != static_cast<int>(specs.size())) {
    return absl::InternalError(absl::StrCat("answered ", r.tensors_size(),
                                            " specs for ", specs.size(),
                                            " requested"));
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    const TensorSpec& got = r.tensors(static_cast<int>(k));
    if (got.name() != specs[k].name() || got.slice_elems() <= 0 ||
        (specs[k].slice_elems() != 0 &&
         got.slice_elems() != specs[k].slice_elems())) {
      return absl::InternalError(
          absl::StrCat("answered spec {", got.ShortDebugString(),
                       "} for requested tensor ", QuoteName(specs[k].name())));
    }
  }
  return absl::OkStatus();
}

// The map each shard of `parts` answered with, in shard order (null for
// the shards not asked).
template <typename Response>
std::vector<const ShardMapProto*> MapsOf(const std::vector<Response>& r,
                                         const std::vector<int>& parts) {
  std::vector<const ShardMapProto*> maps(r.size(), nullptr);
  for (const int s : parts) maps[s] = &r[s].map();
  return maps;
}

// Prepares one ListTensors attempt (for ToAllShards).
std::unique_ptr<grpc::ClientAsyncResponseReader<ListTensorsResponse>>
PrepareListTensors(ParameterServer::Stub* stub, grpc::ClientContext* ctx,
                   const ListTensorsRequest& req, grpc::CompletionQueue* cq) {
  return stub->PrepareAsyncListTensors(ctx, req, cq);
}

}  // namespace

// ---------------------------------------------------------------- known

absl::Status PsClient::Remember(const TensorSpec& spec) {
  absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
  if (!layout.ok()) {
    return Annotate(layout.status(),
                    absl::StrCat("tensor ", QuoteName(spec.name())));
  }
  absl::MutexLock l(&mu_);
  return RememberOnce(&tensors_, Place(spec, *layout, map_), "tensor");
}

std::unique_ptr<PsClient::TensorState> PsClient::Place(
    const TensorSpec& spec, const TensorLayout& layout, const ShardMap& map) {
  auto state = std::make_unique<TensorState>(TensorState{
      spec, layout, {}, std::vector<uint32_t>(map.num_shards(), 0), 0});
  state->home.resize(layout.num_slices());
  for (uint32_t i = 0; i < layout.num_slices(); ++i) {
    state->home[i] = map.SliceHome(spec.name(), i);
    ++state->slices_on[state->home[i]];
  }
  state->map_epoch = map.epoch();
  return state;
}

absl::Status PsClient::FollowMap(const ShardMap& newer) {
  absl::MutexLock l(&mu_);
  if (newer.epoch() < map_.epoch() || newer == map_) return absl::OkStatus();
  if (newer.epoch() == map_.epoch() || !newer.slotted() || !map_.slotted() ||
      newer.num_shards() != map_.num_shards() ||
      newer.num_slots() != map_.num_slots()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shards now serve the ", newer.DebugString(),
                     ", which this client, routing by the ", map_.DebugString(),
                     ", cannot follow: restart the "
                     "worker"));
  }
  for (auto& [name, state] : tensors_) {
    std::unique_ptr<TensorState> placed =
        Place(state->spec, state->layout, newer);
    replaced_.push_back(std::move(state));
    state = std::move(placed);
  }
  options_.logger->info("routing by the {} (was epoch {})", newer.DebugString(),
                        map_.epoch());
  map_ = newer;
  map_epoch_.store(newer.epoch(), std::memory_order_release);
  return absl::OkStatus();
}

const PsClient::TensorState* PsClient::FindTensor(
    const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.get();
}

const TensorSpec* PsClient::FindSpec(const std::string& name) const {
  const TensorState* t = FindTensor(name);
  return t == nullptr ? nullptr : &t->spec;
}

std::vector<uint64_t> PsClient::PulledVersions(const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = last_read_.versions.find(name);
  return it == last_read_.versions.end() ? std::vector<uint64_t>() : it->second;
}

absl::Status PsClient::RememberTable(const TableSpec& spec) {
  auto state = std::make_unique<TableState>(
      TableState{spec, ShardMap::KeyOf(spec.name())});
  absl::MutexLock l(&mu_);
  return RememberOnce(&row_tables_, std::move(state), "table");
}

const PsClient::TableState* PsClient::FindTable(const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = row_tables_.find(name);
  return it == row_tables_.end() ? nullptr : it->second.get();
}

const TableSpec* PsClient::FindTableSpec(const std::string& name) const {
  const TableState* t = FindTable(name);
  return t == nullptr ? nullptr : &t->spec;
}

absl::Status PsClient::AdoptMap(const std::vector<const ShardMapProto*>& maps) {
  std::optional<ShardMap> newest;
  int newest_shard = 0;
  for (size_t s = 0; s < maps.size(); ++s) {
    if (maps[s] == nullptr) continue;
    absl::StatusOr<ShardMap> m = ShardMapOr(*maps[s], num_shards());
    if (!m.ok() || m->num_shards() != num_shards()) {
      return absl::FailedPreconditionError(absl::StrCat(
          ShardName(static_cast<int>(s)), " serves a shard map this client ",
          "of ", num_shards(), " servers cannot route by: ",
          m.ok() ? m->DebugString() : m.status().message()));
    }
    // Epochs may differ while a move reaches the shards one by one; the
    // slots may not.
    if (newest.has_value() &&
        (m->num_slots() != newest->num_slots() ||
         (m->epoch() == newest->epoch() && *m != *newest))) {
      return absl::FailedPreconditionError(absl::StrCat(
          ShardName(newest_shard), " serves the ", newest->DebugString(),
          " but ", ShardName(static_cast<int>(s)), " the ", m->DebugString(),
          ": start every shard of a run with the same --num_slots (and "
          "files of one map)"));
    }
    if (!newest.has_value() || m->epoch() > newest->epoch()) {
      newest = *std::move(m);
      newest_shard = static_cast<int>(s);
    }
  }
  if (!newest.has_value()) return absl::OkStatus();
  {
    absl::MutexLock l(&mu_);
    // Never back to an older map (one learnt from a refusal is newer than
    // what a shard behind a move answers).
    if (*newest == map_ || newest->epoch() < map_.epoch()) {
      return absl::OkStatus();
    }
    if (tensors_.empty() && row_tables_.empty()) {
      map_ = *newest;
      map_epoch_.store(newest->epoch(), std::memory_order_release);
      return absl::OkStatus();
    }
  }
  return FollowMap(*newest);
}

// ---------------------------------------------------------------- create

absl::Status PsClient::CheckNewSpecs(const std::vector<TensorSpec>& specs) {
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& spec : specs) {
    absl::Status s = CheckName("CreateTensors: tensor name", spec.name());
    if (!s.ok()) return s;
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateTensors: tensor ", QuoteName(spec.name()), " given twice"));
    }
    if (spec.slice_elems() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateTensors: tensor ", QuoteName(spec.name()),
                       ": slice_elems must be >= 0, got ", spec.slice_elems()));
    }
    absl::StatusOr<TensorLayout> layout = TensorLayout::Create(
        std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), 1);
    if (!layout.ok()) {
      return Annotate(layout.status(), absl::StrCat("CreateTensors: tensor ",
                                                    QuoteName(spec.name())));
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::CreateTensors(
    const std::vector<TensorSpec>& specs,
    const std::vector<std::pair<std::string, const float*>>& values) {
  absl::Status status = CheckNewSpecs(specs);
  if (!status.ok() || specs.empty()) return status;
  CreateTensorRequest request;
  for (const TensorSpec& spec : specs) *request.add_tensors() = spec;
  status = AddInitialValues(specs, values, &request);
  if (!status.ok()) return status;
  std::vector<CreateTensorResponse> responses;
  const std::vector<int> parts = Parts();
  status = ToAllShards(
      parts, "CreateTensor", request, &responses, PrepareCreateTensor,
      [&specs, &responses](int s) { return CheckCreated(specs, responses[s]); },
      CallPolicy());
  if (!status.ok()) return status;
  status = AdoptMap(MapsOf(responses, parts));
  if (!status.ok()) return status;

  // Every shard must have resolved the same spec.
  const int r = parts[0];
  for (size_t k = 0; k < specs.size(); ++k) {
    const TensorSpec& first = responses[r].tensors(static_cast<int>(k));
    for (const int s : parts) {
      const TensorSpec& other = responses[s].tensors(static_cast<int>(k));
      if (other.slice_elems() != first.slice_elems()) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor ", QuoteName(first.name()), ": ", ShardName(r),
                         " resolved slice_elems=", first.slice_elems(), " but ",
                         ShardName(s), " resolved ", other.slice_elems(),
                         "; start every shard with the same --slice_elems"));
      }
      if (!MessageDifferencer::Equals(first, other)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor ", QuoteName(first.name()), " differs between shards: ",
            ShardName(r), " holds {", first.ShortDebugString(), "}, ",
            ShardName(s), " holds {", other.ShortDebugString(), "}"));
      }
    }
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    absl::Status s = Remember(responses[r].tensors(static_cast<int>(k)));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PsClient::CreateTables(const std::vector<TableSpec>& specs) {
  if (specs.empty()) return absl::OkStatus();
  CreateTensorRequest request;
  for (const TableSpec& spec : specs) *request.add_tables() = spec;
  std::vector<CreateTensorResponse> responses;
  const std::vector<int> parts = Parts();
  absl::Status status = ToAllShards(
      parts, "CreateTensor", request, &responses, PrepareCreateTensor,
      [&request, &responses](int s) -> absl::Status {
        // Every shard stores the specs as given.
        const auto& got = responses[s].tables();
        if (got.size() != request.tables_size() ||
            !std::equal(got.begin(), got.end(), request.tables().begin(),
                        [](const TableSpec& a, const TableSpec& b) {
                          return MessageDifferencer::Equals(a, b);
                        })) {
          return absl::InternalError(
              "answered other table specs than the ones requested");
        }
        return absl::OkStatus();
      },
      CallPolicy());
  if (!status.ok()) return status;
  status = AdoptMap(MapsOf(responses, parts));
  if (!status.ok()) return status;
  for (const TableSpec& spec : specs) {
    absl::Status s = RememberTable(spec);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- wait

absl::Status PsClient::RememberListed(
    const std::vector<std::string>& names,
    const std::vector<ListTensorsResponse>& responses,
    const std::vector<int>& parts) {
  const int n = num_shards();
  if (absl::Status s = AdoptMap(MapsOf(responses, parts)); !s.ok()) return s;
  std::vector<absl::flat_hash_map<std::string, const TensorSpec*>> held(n);
  std::vector<absl::flat_hash_map<std::string, const TableSpec*>> tables(n);
  for (const int s : parts) {
    for (const TensorSpec& spec : responses[s].tensors()) {
      held[s][spec.name()] = &spec;
    }
    for (const TableSpec& spec : responses[s].tables()) {
      tables[s][spec.name()] = &spec;
    }
  }
  const int r = parts[0];  // the reference the others are compared with
  // A name is the same kind everywhere, and a table the same spec.
  for (const std::string& name : names) {
    const bool table = tables[r].contains(name);
    for (const int s : parts) {
      auto it = tables[s].find(name);
      if ((table && held[s].contains(name)) ||
          (!table && it != tables[s].end() && held[r].contains(name))) {
        return absl::FailedPreconditionError(absl::StrCat(
            QuoteName(name), " is a tensor on one of ", ShardName(r), " and ",
            ShardName(s), " and a sparse table on the other"));
      }
      if (table && it != tables[s].end() &&
          !MessageDifferencer::Equals(*tables[r][name], *it->second)) {
        return absl::FailedPreconditionError(
            absl::StrCat("table ", QuoteName(name), " differs between ",
                         ShardName(r), " and ", ShardName(s)));
      }
    }
  }
  std::vector<std::string> absent;
  for (const std::string& name : names) {
    for (const int s : parts) {
      if (!held[s].contains(name) && !tables[s].contains(name)) {
        absent.push_back(absl::StrCat(QuoteName(name), " on ", ShardName(s)));
      }
    }
  }
  if (!absent.empty()) {
    return absl::NotFoundError(
        absl::StrCat("missing: ", absl::StrJoin(absent, ", ")));
  }
  for (const std::string& name : names) {
    if (tables[r].contains(name)) continue;
    const TensorSpec& first = *held[r][name];
    for (const int s : parts) {
      if (!MessageDifferencer::Equals(first, *held[s][name])) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor ", QuoteName(name), " differs between shards: ",
            ShardName(r), " holds {", first.ShortDebugString(), "}, ",
            ShardName(s), " holds {", held[s][name]->ShortDebugString(), "}"));
      }
    }
  }
  for (const std::string& name : names) {
    absl::Status s = tables[r].contains(name) ? RememberTable(*tables[r][name])
                                              : Remember(*held[r][name]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PsClient::WaitForTensors(const std::vector<std::string>& names,
                                      absl::Duration timeout) {
  const absl::Time start = options_.clock->Now();
  const absl::Time deadline = start + timeout;
  absl::Duration interval = options_.retry.initial_backoff;
  std::string missing = "no shard answered";
  std::string last_error;
  absl::Time last_report = start;
  // One attempt per shard per round: polling is the retry.
  RetryPolicy round = WaitPolicy();
  round.call_deadline =
      std::max(absl::Seconds(1), std::min(timeout, absl::Seconds(5)));
  round.report_every = absl::InfiniteDuration();
  for (;;) {
    std::vector<ListTensorsResponse> responses;
    const ListTensorsRequest request;
    const std::vector<int> parts = Parts();
    absl::Status status = ToAllShards(parts, "ListTensors", request, &responses,
                                      PrepareListTensors, nullptr, round);
    if (!status.ok() && !IsRetriable(status)) return status;
    if (status.ok()) {
      status = RememberListed(names, responses, parts);
      if (status.code() != absl::StatusCode::kNotFound) return status;
      missing = std::string(status.message());
      last_error.clear();
    } else {
      last_error = absl::StrCat("; last error: ", status.message());
    }
    if (Stopped()) {
      return absl::CancelledError(
          "stopped while waiting for tensors (the process was asked to "
          "stop)");
    }
    const absl::Time now = options_.clock->Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "tensors [", absl::StrJoin(names, ", "),
          "] not on every shard after ", absl::FormatDuration(timeout), "; ",
          missing, last_error));
    }
    if (now - last_report >= kWaitReport) {
      last_report = now;
      options_.logger->info(
          "waiting for the tensors another worker creates ({} of {}); {}{}",
          absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1))),
          absl::FormatDuration(timeout), missing, last_error);
    }
    SleepUnlessStopped(std::min(interval, deadline - now));
    interval = std::min(interval * 2, kMaxListPollInterval);
  }
}

}  // namespace asyncps
