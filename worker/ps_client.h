#ifndef ASYNCPS_WORKER_PS_CLIENT_H_
#define ASYNCPS_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct PsClientOptions {
  // Shard addresses in shard order: servers[i] is shard i of servers.size().
  std::vector<std::string> servers;
  int32_t worker_id = 0;  // >= 0
  // Identifies this process's run of `worker_id`; pushes are de-duplicated per
  // (worker_id, incarnation). 0 = pick a random nonzero one.
  uint64_t incarnation = 0;
  // Deadline of each RPC attempt.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Attempts per shard per call (>= 1); only UNAVAILABLE and
  // DEADLINE_EXCEEDED are retried, after initial_backoff * 2^(attempt-1)
  // (capped at 5 s, +-20% jitter).
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  // Pull and Push over the fast data path (PullFast / PushFast, framing in
  // common/fast_frame.h): gradients are sent straight from the caller's
  // buffers and pulled values copied straight into them, with no protobuf
  // `bytes` copies. false = the protobuf Pull and Push RPCs (same results).
  bool fast_path = true;
  // TLS and the cluster token for every shard (common/security.h); default
  // = plain TCP, no token.
  SecurityOptions security;
  // nullptr = discard log messages.
  std::shared_ptr<spdlog::logger> logger;
};

// What the shards did with one Push, summed over all slices.
struct PushSummary {
  int64_t applied = 0;         // slice updates applied
  int64_t refused_stale = 0;   // slice updates refused as too stale
  int64_t duplicates = 0;      // shards that answered duplicate=true (a retry
                               // of a push they had already applied)
  uint64_t max_staleness = 0;  // over the slice results returned
  double mean_staleness = 0;
};

// The worker side of the parameter-server protocol: talks to every shard of
// a cluster, cuts full tensors into slices by common/tensor_layout.h and
// routes each slice to its home shard (common/sharding.h). Calls fan out to
// all shards concurrently (gRPC callback API) and return when every shard has
// answered; transient failures are retried with exponential backoff.
// Errors name the shard and its address.
//
// Thread-compatible: one training loop drives a PsClient; calls must not
// overlap.
class PsClient {
 public:
  // Validates the options and opens one channel per shard. Does not contact
  // the shards.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      PsClientOptions options);

  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Creates `specs` on every shard (idempotent: identical existing tensors are
  // fine, conflicting ones are ALREADY_EXISTS), checks that all shards
  // resolved the same slice_elems, and remembers the layouts.
  absl::Status CreateTensors(const std::vector<TensorSpec>& specs);

  // For workers other than the creator: polls ListTensors on all shards until
  // every named tensor exists everywhere with the same spec, then remembers
  // the layouts. DEADLINE_EXCEEDED after `timeout`, naming what is missing.
  absl::Status WaitForTensors(const std::vector<std::string>& names,
                              absl::Duration timeout);

  // Pulls the full tensors named in `outs` into the caller's buffers (each of
  // the tensor's num_elems floats) and records every slice's version for the
  // next Push. Names must be known (CreateTensors / WaitForTensors) else
  // NOT_FOUND; null buffers or a repeated name are INVALID_ARGUMENT. On error
  // the buffers may be partly written and the recorded versions are kept.
  // Under SSP/BSP a shard may hold the pull until slower workers catch up:
  // keep rpc_timeout above the shards' --pull_wait_timeout_ms.
  absl::Status Pull(int64_t clock,
                    const std::vector<std::pair<std::string, float*>>& outs);

  // Pushes full-tensor gradients, cut into slices, tagged with the versions
  // read by the last Pull of each tensor (0 if never pulled), `clock` and a
  // fresh sequence number. Every shard gets a push, an empty one if it holds
  // none of the slices, so that it sees the clock; retries reuse the
  // sequence number, so a shard applies a push at most once.
  absl::StatusOr<PushSummary> Push(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads);

  // Renews this worker's lease on every shard and reports `clock`; `leaving`
  // says goodbye (the shards stop waiting for this worker).
  absl::Status Heartbeat(int64_t clock, bool leaving = false);

  // Each shard's status, in shard order.
  absl::StatusOr<std::vector<StatusResponse>> Status();

  int num_shards() const { return static_cast<int>(shards_.size()); }
  int32_t worker_id() const { return options_.worker_id; }
  uint64_t incarnation() const { return options_.incarnation; }
  // The stored spec of a known tensor (slice_elems resolved), or nullptr.
  const TensorSpec* FindSpec(const std::string& name) const;
  // Versions recorded by the last Pull of `name`, per slice (empty if the
  // tensor is unknown).
  std::vector<uint64_t> PulledVersions(const std::string& name) const;

 private:
  struct Shard;
  class FanOut;
  struct FanOutCall;

  // One FanOut call per shard, each sending `request` and answering into
  // (*responses)[s] through issue(stub, ctx, &request, &(*responses)[s],
  // done); on_ok(s), if given, checks a shard's successful answer.
  template <typename Request, typename Response, typename Issue>
  std::vector<FanOutCall> ToAllShards(
      const Request& request, std::vector<Response>* responses, Issue issue,
      std::function<absl::Status(int)> on_ok = nullptr);

  // What the client knows about one tensor.
  struct TensorState {
    TensorSpec spec;  // as stored by the shards
    TensorLayout layout;
    std::vector<int> home;                // per slice: its home shard
    std::vector<uint32_t> slices_on;      // per shard: slices it holds
    std::vector<uint64_t> read_versions;  // per slice: as of the last Pull
  };

  explicit PsClient(PsClientOptions options);

  // Remembers `spec` (already resolved and validated).
  absl::Status Remember(const TensorSpec& spec);
  WorkerRef MakeWorkerRef(int64_t clock) const;
  std::string ShardName(int shard) const;

  // Const after construction.
  const PsClientOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;

  absl::flat_hash_map<std::string, TensorState> tensors_;
  uint64_t next_seq_ = 1;
  absl::BitGen rng_;  // backoff jitter
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PS_CLIENT_H_
