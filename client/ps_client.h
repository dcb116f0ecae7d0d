#ifndef ASYNCPS_CLIENT_PS_CLIENT_H_
#define ASYNCPS_CLIENT_PS_CLIENT_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/fanout.h"
#include "client/pending_call.h"
#include "common/clock.h"
#include "common/fast_frame.h"
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
  // Identifies this process's run of `worker_id`; pushes are de-duplicated
  // per (worker_id, incarnation), and a new incarnation replaces (fences) the
  // old one on every shard. 0 = pick a random nonzero one (the normal case:
  // every process start is a new incarnation).
  uint64_t incarnation = 0;
  // Retries, backoff and the per-call deadline (client/fanout.h).
  RetryPolicy retry;
  // Separate TCP connections per shard; pulls and pushes are spread over
  // them, so that two cores can receive and send at once.
  int connections_per_shard = 2;
  // Wire type of pushed gradients and of pulled parameters on the data
  // streams; the shards keep float32 either way.
  WireDtype push_dtype = WIRE_F32;
  WireDtype pull_dtype = WIRE_F32;
  // TLS and the cluster token for every shard (common/security.h); default
  // = plain TCP, no token.
  SecurityOptions security;
  // The run this worker belongs to: sent with every heartbeat; shards of
  // another run (ps_server --run_id) refuse the worker, and WaitForShards
  // fails at once on one (FAILED_PRECONDITION naming it).
  std::string run_id;
  // When set, every wait ends within about 100 ms of *stop turning true,
  // with CANCELLED: WaitForShards, WaitForTensors, Register and pulls (also
  // those held back by slower workers). Pushes and leaving are not cut
  // short: a stopping worker drains them. Not owned.
  const std::atomic<bool>* stop = nullptr;
  // Also pushes (and leaving) end with `stop`: for a client whose stop means
  // "abandon", not "drain" (the Python binding's Ctrl-C).
  bool stop_ends_pushes = false;
  Clock* clock = Clock::Real();  // not owned
  // A reader (ps_serve): its pulls are read_only (PullRequest.read_only:
  // answered at once, registering nobody and creating no row; row queries
  // must peek), and it cannot register, heartbeat or push
  // (FAILED_PRECONDITION). worker_id and incarnation are unused.
  bool reader = false;
  // nullptr = discard log messages.
  std::shared_ptr<spdlog::logger> logger;
};

// What the shards did with the slices of one tensor of a push.
struct TensorPushOutcome {
  int64_t applied = 0;
  int64_t refused_stale = 0;
  int64_t refused_restored = 0;
  uint64_t max_staleness = 0;
  double mean_staleness = 0;  // over applied and stale-refused slices
};

// What the shards did with one push, summed over all slices.
struct PushSummary {
  int64_t applied = 0;           // slice updates applied
  int64_t refused_stale = 0;     // refused as too stale
  int64_t refused_restored = 0;  // refused: read before a shard restarted
  int64_t duplicates = 0;        // shards that answered duplicate=true (a
                                 // retry of a push they had already applied)
  uint64_t max_staleness = 0;    // over the slice results returned
  double mean_staleness = 0;
  // The same per tensor (tensors whose shards answered duplicate=true have
  // no results, so they are missing or partial here).
  absl::flat_hash_map<std::string, TensorPushOutcome> tensors;
  int64_t rows_created = 0;  // sparse rows the push created
};

// Where this worker stands on the shards after Register().
struct Registration {
  // The clock to continue from: the largest any shard answered (a new
  // process of a known worker id resumes where its predecessor was, and no
  // worker starts behind the slowest live one).
  int64_t resume_clock = 0;
  // The clock the previous process of this worker id reached (0 when none).
  int64_t previous_clock = 0;
  // The worker id's data position: the largest any shard recorded
  // (ReportTrained of this or an earlier process): the steps of its share
  // every shard acknowledged. A restarted worker continues its share here,
  // whatever clock it resumes at.
  int64_t trained = 0;
};

// One table's rows to pull: `out` receives ids.size() x dim floats, row i
// for ids[i] (duplicates included). The ids and `out` must stay valid and
// untouched until the pull's Wait returns.
struct RowsQuery {
  std::string table;
  absl::Span<const uint64_t> ids;
  float* out = nullptr;
  // Read only (TableIds.peek): rows that do not exist are answered with
  // their initial values and not created.
  bool peek = false;
};

// One table's row gradients to push: grads holds ids.size() x dim floats,
// row i for ids[i]; the gradients of repeated ids are summed (on the
// client, before sending). Read only during StartPushRows.
struct RowsGrad {
  std::string table;
  absl::Span<const uint64_t> ids;
  const float* grads = nullptr;
};

// What a pull read, tensors and rows alike: every tensor slice's version,
// per table the version of every distinct row id, and every shard's epoch.
// A push names the read its gradients were computed from, so that shards
// measure staleness from it (a row id it does not hold counts as read at
// version 0) and refuse gradients read before they restarted.
struct ReadSet {
  struct Table {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // id -> versions index
    std::vector<uint64_t> versions;
  };
  // Tensor name -> version of each slice.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> versions;
  // Table name -> its rows' versions; immutable once read, shared between
  // copies.
  absl::flat_hash_map<std::string, std::shared_ptr<const Table>> tables;
  std::vector<uint64_t> epochs;  // per shard; 0 = not read
  uint64_t VersionOf(const std::string& table, uint64_t id) const;
};

// The worker side of the parameter-server protocol: talks to every shard of
// a cluster, cuts full tensors into slices by common/tensor_layout.h and
// routes each slice to its home shard (common/sharding.h).
//
// Data path: pulls and pushes travel on long-lived streams (PullStream /
// PushStream, common/fast_frame.h), several connections per shard, several
// requests in flight; pushed gradients are sent from the caller's memory
// (or a bfloat16 copy) without copies, and pulled values copied once, from
// gRPC's receive buffers into the caller's, on gRPC's threads. Calls fan out
// to all shards at once and retry transient failures (a shard restarting,
// a connection lost) with backoff until the call deadline; a push keeps its
// sequence number across retries, so it is applied at most once.
//
// Thread-safe: pulls and pushes may be in flight together (StartPull /
// StartPush), e.g. the next step's pull while this step computes.
class PsClient {
 public:
  class PendingPull;
  class PendingPush;

  // Validates the options and opens the channels. Does not contact the
  // shards.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      PsClientOptions options);

  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Waits until every shard answers, logging every few seconds which ones
  // it still waits for: workers may start before their shards.
  // DEADLINE_EXCEEDED after `timeout`, naming the missing shards.
  absl::Status WaitForShards(absl::Duration timeout);

  // Registers this process (its incarnation) with every shard.
  absl::StatusOr<Registration> Register();

  // Creates `specs` on every shard (idempotent: identical existing tensors are
  // fine, conflicting ones are ALREADY_EXISTS), checks that all shards
  // resolved the same slice_elems, and remembers the layouts. `values`
  // gives the values of every spec with init INIT_VALUES (name -> all its
  // elements, row-major; read during the call); the first creation's values
  // win. A missing or extra entry, or NaN/Inf, is INVALID_ARGUMENT with
  // nothing sent.
  absl::Status CreateTensors(
      const std::vector<TensorSpec>& specs,
      const std::vector<std::pair<std::string, const float*>>& values = {});

  // For workers other than the creator: polls ListTensors on all shards until
  // every named tensor (or sparse table) exists everywhere with the same
  // spec, then remembers the layouts. DEADLINE_EXCEEDED after `timeout`,
  // naming what is missing.
  absl::Status WaitForTensors(const std::vector<std::string>& names,
                              absl::Duration timeout);

  // Starts pulling the full tensors named in `outs` into the caller's
  // buffers (each the tensor's num_elems floats, left untouched by the
  // caller until Wait returns). `clock` is the steps completed; `for_clock`
  // (>= clock) the step the parameters are for: SSP/BSP shards answer once
  // the slowest worker is within the slack of it. Errors in the arguments
  // (unknown tensor: NOT_FOUND; null buffer, a name twice: INVALID_ARGUMENT)
  // come back from Wait with nothing sent.
  std::unique_ptr<PendingPull> StartPull(
      int64_t clock, int64_t for_clock,
      const std::vector<std::pair<std::string, float*>>& outs);

  // Starts pushing full-tensor gradients, cut into slices, tagged with the
  // versions and epochs of `read` (the pull they were computed from), `clock`
  // and a fresh sequence number. A gradient holding NaN or Inf is refused
  // here (INVALID_ARGUMENT from Wait, nothing sent), so that no shard applies
  // part of a push another shard would refuse. Every shard gets a push, an
  // empty one if it holds none of the slices, so that it sees the clock. The
  // gradients are sent from the caller's memory: it stays unchanged until Wait
  // returns (Wait also waits until gRPC has released every reference to it).
  std::unique_ptr<PendingPush> StartPush(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read);

  // Starts assigning values to whole tensors (PushRequest.assign: each
  // slice's values are replaced, its version advances, the optimizer's
  // state is kept), with `clock` and a fresh sequence number, so a retry is
  // applied at most once. Checked as StartPush checks gradients (NaN or
  // Inf: INVALID_ARGUMENT with nothing sent); always sent as float32, from
  // the caller's memory, which stays unchanged until Wait returns. Every
  // shard is asked (each assigns its slices all-or-nothing); an error from
  // Wait may leave some shards assigned: assigning again is harmless.
  std::unique_ptr<PendingPush> StartAssign(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& values);

  // Synchronous forms: Pull(clock, outs) = StartPull(clock, clock,
  // outs)->Wait(), remembering what it read; Push pushes gradients computed
  // from the last Pull.
  absl::Status Pull(int64_t clock,
                    const std::vector<std::pair<std::string, float*>>& outs);
  absl::StatusOr<PushSummary> Push(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads);

  // ---- Sparse tables (proto/asyncps.proto, "rows").

  class PendingRowsPull;
  class PendingRowsPush;

  // Creates `specs` on every shard (idempotent, as CreateTensors), checks
  // that all shards hold the same specs and remembers them.
  absl::Status CreateTables(const std::vector<TableSpec>& specs);
  // The stored spec of a known table, or nullptr. WaitForTensors also waits
  // for (and remembers) tables of the names it is given.
  const TableSpec* FindTableSpec(const std::string& name) const;

  // Starts pulling rows of known tables (NOT_FOUND for others; a table
  // twice, a null `out`: INVALID_ARGUMENT, from Wait with nothing sent).
  // The ids of a table are de-duplicated, routed to their home shards
  // (common::RowHome) and sent there (one request per shard for all
  // tables, on the data streams, concurrently); the rows come back into
  // `out` at every position of their id. Clocks as StartPull. Rows that do
  // not exist yet are created by the shards; RESOURCE_EXHAUSTED when a
  // shard is full.
  std::unique_ptr<PendingRowsPull> StartPullRows(
      int64_t clock, int64_t for_clock, const std::vector<RowsQuery>& queries);

  // Starts pushing row gradients of known tables, tagged with the versions
  // and epochs of `read`, `clock` and a fresh sequence number (shared with
  // dense pushes). Repeated ids of a table are summed first. Every shard
  // gets a push, an empty one if none of the rows live there, so that it
  // sees the clock. The gradients are copied before this returns.
  std::unique_ptr<PendingRowsPush> StartPushRows(
      int64_t clock, const std::vector<RowsGrad>& grads, const ReadSet& read);

  // Starts assigning rows of known tables (PushRequest.assign: each row's
  // values replaced, missing rows created with them, versions advanced,
  // optimizer state kept), exactly once like a push. An id given twice in
  // a table is INVALID_ARGUMENT with nothing sent; always float32. The
  // values are copied before this returns.
  std::unique_ptr<PendingRowsPush> StartAssignRows(
      int64_t clock, const std::vector<RowsGrad>& values);

  // Renews this worker's lease on every shard and reports `clock`; `leaving`
  // says goodbye (the shards stop waiting for this worker).
  absl::Status Heartbeat(int64_t clock, bool leaving = false);

  // Sets the data position every later call reports (WorkerRef.trained):
  // the steps of this worker's share whose pushes every shard has
  // acknowledged. Only moves forward. Thread-safe.
  void ReportTrained(int64_t steps);

  // Each shard's status, in shard order.
  absl::StatusOr<std::vector<StatusResponse>> Status();

  // The tensors and tables the cluster holds (every shard holds every
  // spec; a spec some shard lacks is left out, as it is still being
  // created).
  absl::StatusOr<ListTensorsResponse> ListTensors();

  // Sets learning rates on every shard (SetLearningRateRequest's rules: a
  // step above the shards' applies, the same step and rate is a no-op, the
  // same step with another rate is ALREADY_EXISTS). Returns the rates in
  // effect, in request order (the highest step any shard reports).
  absl::StatusOr<std::vector<LearningRate>> SetLearningRates(
      const std::vector<LearningRate>& rates);

  int num_shards() const { return static_cast<int>(shards_.size()); }
  int32_t worker_id() const { return options_.worker_id; }
  uint64_t incarnation() const { return options_.incarnation; }
  // The stored spec of a known tensor (slice_elems resolved), or nullptr.
  const TensorSpec* FindSpec(const std::string& name) const;
  // Versions read by the last synchronous Pull of `name` (empty if none).
  std::vector<uint64_t> PulledVersions(const std::string& name) const;
  // "shard 1 (10.0.0.2:7000)", for messages.
  std::string ShardName(int shard) const;

 private:
  struct Shard;
  friend class PendingPull;
  friend class PendingPush;

  // One shard's part of a pull / a push, and gRPC's references to pushed
  // memory (see ps_client.cc).
  struct PullShard;
  struct PushShard;
  struct Borrowed;
  struct RowsPullShard;
  struct RowsQueryState;

  // What the client knows about one sparse table. Const once remembered.
  struct TableState {
    TableSpec spec;
    uint64_t key = 0;  // common::RowTableKey(name)
  };

  // What the client knows about one tensor. Const once remembered.
  struct TensorState {
    TensorSpec spec;  // as stored by the shards
    TensorLayout layout;
    std::vector<int> home;            // per slice: its home shard
    std::vector<uint32_t> slices_on;  // per shard: slices it holds
  };

  explicit PsClient(PsClientOptions options);

  // Unary RPC to every shard through one FanOut; responses in shard order.
  // issue(stub, ctx, request, response, done) starts one attempt.
  template <typename Request, typename Response, typename Issue>
  absl::Status ToAllShards(const char* method, const Request& request,
                           std::vector<Response>* responses, Issue issue,
                           std::function<absl::Status(int shard)> on_ok,
                           const RetryPolicy& policy);

  absl::Status Remember(const TensorSpec& spec);
  absl::Status RememberTable(const TableSpec& spec);
  const TableState* FindTable(const std::string& name) const;
  // Checks one shard's answer to a rows pull and copies its rows into the
  // callers' buffers (on the answer's thread).
  absl::Status ReadRowsPull(const grpc::ByteBuffer& answer, RowsPullShard* ps);
  const TensorState* FindTensor(const std::string& name) const;
  WorkerRef MakeWorkerRef(int64_t clock) const;
  // Names the caller of a pull: this worker at `clock` for `for_clock`, or
  // for a reader, nobody (read_only).
  void SetPullCaller(int64_t clock, int64_t for_clock,
                     PullRequest* request) const;
  // FAILED_PRECONDITION naming `what` for a reader, else OK.
  absl::Status CheckNotReader(const char* what) const;
  // options_.retry, ended by options_.stop (for waits).
  RetryPolicy WaitPolicy() const;
  // The policy of every other call: WaitPolicy() when stop_ends_pushes,
  // else options_.retry.
  RetryPolicy CallPolicy() const;
  FanOutEnv Env() const;
  // Notes a shard's epoch from an answer; logs once when it changed (the
  // shard restarted, and restored older parameters).
  void NoteEpoch(int shard, uint64_t epoch);
  // Checks one shard's pull answer and copies its slices into the caller's
  // buffers (on the answer's thread).
  absl::Status ReadPull(const grpc::ByteBuffer& answer, PullShard* ps);
  // Opens a PullStream answer of `shard`: its header (status, epoch noted,
  // wire type checked) and a reader for its payload.
  absl::Status OpenPullAnswer(const grpc::ByteBuffer& answer, int shard,
                              PullResponse* header, FrameReader* frame);
  // StartPushRows (assign false) or StartAssignRows.
  std::unique_ptr<PendingRowsPush> StartSendRows(
      bool assign, int64_t clock, const std::vector<RowsGrad>& grads,
      const ReadSet& read);
  // StartPush (assign false) or StartAssign.
  std::unique_ptr<PendingPush> StartSend(
      bool assign, int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read);
  // One push header per shard: worker, clock, seq, request id, wire type
  // and the epoch `epochs` read from each shard.
  std::vector<PushRequest> PushHeaders(int64_t clock, uint64_t seq,
                                       const std::vector<uint64_t>& epochs);

  // Const after construction.
  const PsClientOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;

  mutable absl::Mutex mu_;
  // Entries are never removed or changed once added.
  absl::flat_hash_map<std::string, std::unique_ptr<TensorState>> tensors_
      ABSL_GUARDED_BY(mu_);
  // Entries are never removed or changed once added.
  absl::flat_hash_map<std::string, std::unique_ptr<TableState>> row_tables_
      ABSL_GUARDED_BY(mu_);
  ReadSet last_read_ ABSL_GUARDED_BY(mu_);  // of the last synchronous Pull
  std::vector<uint64_t> epochs_ ABSL_GUARDED_BY(mu_);  // per shard, last seen

  std::atomic<int64_t> trained_{0};  // ReportTrained
  std::atomic<uint64_t> next_seq_{1};
  std::atomic<uint64_t> next_request_id_{1};
  std::atomic<uint32_t> next_connection_{0};
};

// A pull in flight. Wait() returns when every shard answered (or the call
// failed); the destructor waits too.
class PsClient::PendingPull {
 public:
  ~PendingPull();  // waits
  // OK once every buffer holds the tensors' values.
  absl::Status Wait() { return call_.Wait(); }
  // What was read (valid after Wait returned OK).
  const ReadSet& read() const { return read_; }

 private:
  friend class PsClient;
  PendingPull() = default;
  // The read set (after every attempt ended OK).
  absl::Status Finish(absl::Status s);

  ReadSet read_;
  // Per shard: the request sent and where the answer goes; owned here
  // because attempts refer to them.
  std::vector<std::unique_ptr<PullShard>> shards_;
  PendingCall<absl::Status> call_;  // last: destroyed (and waited) first
};

// A push in flight. Wait() returns when every shard answered (or the call
// failed) and gRPC released the gradient memory; the destructor waits too.
class PsClient::PendingPush {
 public:
  ~PendingPush();  // waits
  absl::StatusOr<PushSummary> Wait() { return call_.Wait(); }

 private:
  friend class PsClient;
  PendingPush() = default;
  // The summary of the shards' answers (after every attempt ended with `s`).
  absl::StatusOr<PushSummary> Finish(absl::Status s);

  std::vector<std::unique_ptr<PushShard>> shards_;
  // References gRPC holds to the gradient memory (slices not yet released).
  std::shared_ptr<Borrowed> borrowed_;
  std::vector<uint16_t> bf16_;  // the gradients as bfloat16, when asked
  PendingCall<absl::StatusOr<PushSummary>> call_;  // last: waited first
};

// A rows pull in flight. Wait() returns when every shard answered (or the
// call failed); the destructor waits too.
class PsClient::PendingRowsPull {
 public:
  ~PendingRowsPull();
  // OK once every `out` holds its rows.
  absl::Status Wait() { return call_.Wait(); }
  // What was read (valid after Wait returned OK).
  const ReadSet& read() const { return read_; }

 private:
  friend class PsClient;
  PendingRowsPull();
  // Repeated ids' rows and the read set (after every attempt ended OK).
  absl::Status Finish(absl::Status s);

  ReadSet read_;
  std::vector<std::unique_ptr<RowsQueryState>> queries_;
  std::vector<std::unique_ptr<RowsPullShard>> shards_;
  PendingCall<absl::Status> call_;  // last: destroyed (and waited) first
};

// A rows push in flight. Wait() returns when every shard answered (or the
// call failed); the destructor waits too.
class PsClient::PendingRowsPush {
 public:
  absl::StatusOr<PushSummary> Wait() { return call_.Wait(); }

 private:
  friend class PsClient;
  PendingRowsPush() = default;
  // The summary of the shards' answers (after every attempt ended with `s`).
  absl::StatusOr<PushSummary> Finish(absl::Status s);

  std::vector<grpc::ByteBuffer> frames_;  // per shard, sent by every attempt
  std::vector<PushResponse> responses_;   // per shard
  PendingCall<absl::StatusOr<PushSummary>> call_;  // last: waited first
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PS_CLIENT_H_
