#ifndef ASYNCPS_CLIENT_PS_CLIENT_H_
#define ASYNCPS_CLIENT_PS_CLIENT_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
#include "client/driven_queue.h"
#include "client/fanout.h"
#include "client/pending_call.h"
#include "client/step_sets.h"
#include "common/clock.h"
#include "common/fast_frame.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "common/shard_router.h"
#include "common/tensor_layout.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "spdlog/spdlog.h"

namespace asyncps {

class DataStream;  // client/data_stream.h

struct PsClientOptions {
  // Shard addresses in shard order: servers[i] is shard i of servers.size().
  // With a router: may be empty (filled from the router); if given, as
  // many as the router's shards.
  std::vector<std::string> servers;
  // Follows each shard's primary (a replicated run's shard map in etcd,
  // membership/map_router.h): every attempt of a call to shard s goes to
  // the router's address of s, reconnecting when it moved; while the router
  // knows none, attempts fail UNAVAILABLE and are retried. Null = the fixed
  // `servers`.
  std::shared_ptr<ShardRouter> router;
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
  // With `stop`: called by a waiting thread about every 100 ms while it
  // waits, before it reads `stop`, which it may turn true (RetryPolicy::poll;
  // also between the rounds of WaitForShards and WaitForTensors). Calls
  // answered sooner never call it.
  std::function<void()> poll_stop;
  // Also pushes (and leaving) end with `stop`: for a client whose stop means
  // "abandon", not "drain" (the Python binding's Ctrl-C).
  bool stop_ends_pushes = false;
  // Times the client's waits, deadlines and backoffs (never a date): the
  // monotonic clock, so that a step of the real-time clock neither cuts a
  // call short nor stretches it. Not owned.
  Clock* clock = Clock::Monotonic();
  // A reader (ps_serve): its pulls are read_only (PullRequest.read_only:
  // answered at once, registering nobody and creating no row; row queries
  // must peek), and it cannot register, heartbeat or push
  // (FAILED_PRECONDITION). worker_id and incarnation are unused.
  bool reader = false;
  // nullptr = discard log messages.
  std::shared_ptr<spdlog::logger> logger;
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

// The worker side of the parameter-server protocol: talks to every shard of
// a cluster, cuts full tensors into slices by common/tensor_layout.h and
// routes each slice and row to its home shard by the run's ShardMap
// (common/shard_map.h), whose epoch every pull and push carries.
//
// Example (a worker's life; step types in client/step_sets.h):
//
//   PsClientOptions o;
//   o.servers = {"10.0.0.1:7000", "10.0.0.2:7000"};
//   // or, in a replicated run: o.router = MapRouter::Connect(...) (each
//   // shard's primary from the run's map in etcd, followed on failover)
//   o.worker_id = 3;
//   absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
//   if (!c.ok()) return c.status();
//   PsClient& client = **c;
//   absl::Status s = client.WaitForShards(absl::Minutes(5));
//   if (s.ok()) s = client.CreateTensors(specs);   // or WaitForTensors
//   absl::StatusOr<Registration> reg = client.Register();
//   int64_t clock = reg->resume_clock;
//   for (...) {
//     auto pull = client.StartPull(clock, clock, PullSet{{{"w", w}}, {}});
//     if (s = pull->Wait(); !s.ok()) return s;
//     ... gradients g from w ...
//     auto push = client.StartPush(clock, PushSet{{{"w", g}}, {}},
//                                  pull->read());
//     if (s = push->Wait().status(); !s.ok()) return s;
//     client.ReportTrained(++clock);
//   }
//   client.Heartbeat(clock, /*leaving=*/true);
//
// Data path: pulls and pushes travel on long-lived streams (PullStream /
// PushStream, common/fast_frame.h), several connections per shard, several
// requests in flight; pushed gradients are sent from the caller's memory
// (or a bfloat16 copy) without copies, and pulled values copied once, from
// gRPC's receive buffers into the caller's. Every answer completes on the
// client's DrivenQueue, run by the thread that waits for it (no gRPC
// callback thread and no hand-over per call). Calls fan out
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

  // ---- Set-up.

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

  // Creates sparse tables on every shard (idempotent, as CreateTensors),
  // checks that all shards hold the same specs and remembers them.
  absl::Status CreateTables(const std::vector<TableSpec>& specs);

  // For workers other than the creator: polls ListTensors on all shards until
  // every named tensor (or sparse table) exists everywhere with the same
  // spec, then remembers the layouts. DEADLINE_EXCEEDED after `timeout`,
  // naming what is missing.
  absl::Status WaitForTensors(const std::vector<std::string>& names,
                              absl::Duration timeout);

  // ---- The data path: one pull and one push per step.

  // Starts pulling the tensors and rows of `what` (client/step_sets.h):
  // one request per shard that owns any of them (ShardMap), concurrently,
  // on the data streams. Rows of a table are de-duplicated, sent to their
  // home shards and copied back to every position of their id; rows that
  // do not exist yet are created (RESOURCE_EXHAUSTED when a shard is full)
  // unless peeked at. `clock` is the steps completed; `for_clock` (>=
  // clock) the step the parameters are for: SSP/BSP shards answer once the
  // slowest worker is within the slack of it. Errors in the arguments
  // (unknown tensor or table: NOT_FOUND; null buffer, a name twice:
  // INVALID_ARGUMENT) come back from Wait with nothing sent.
  std::unique_ptr<PendingPull> StartPull(int64_t clock, int64_t for_clock,
                                         const PullSet& what);

  // Starts pushing the gradients of `what`, tagged with the versions and
  // epochs of `read` (the pull they were computed from), `clock` and a
  // fresh sequence number: one request per shard, each shard's part applied
  // whole or not at all, exactly once across retries. Every shard gets a
  // push, an empty one if it owns none of the keys, so that it sees the
  // clock. A gradient holding NaN or Inf is refused here (INVALID_ARGUMENT
  // from Wait, nothing sent), so that no shard applies part of a push
  // another shard would refuse. Tensor gradients are sent from the
  // caller's memory (or a bfloat16 copy), which stays unchanged until Wait
  // returns; row gradients of repeated ids are summed and copied first.
  std::unique_ptr<PendingPush> StartPush(int64_t clock, const PushSet& what,
                                         const ReadSet& read);

  // Starts assigning values (PushRequest.assign): each slice's or row's
  // values are replaced (missing rows created with them), versions
  // advance, the optimizer's state is kept; exactly once like a push, and
  // checked like one (NaN or Inf, a row id twice in a table:
  // INVALID_ARGUMENT with nothing sent); always float32. An error from Wait
  // may leave some shards assigned: assigning again is harmless.
  std::unique_ptr<PendingPush> StartAssign(int64_t clock, const PushSet& what);

  // A step's push and the next step's pull, started together.
  struct PendingStep {
    std::unique_ptr<PendingPush> push;
    std::unique_ptr<PendingPull> pull;
  };
  // StartPush(clock, push, read) and StartPull(clock + 1, clock + 1, pull)
  // at once, as one request to each shard that gets a part of both
  // (StepStream): the shard serves the pull once the push is acknowledged,
  // so the pull reads the push's updates, as a pull started after the
  // push's Wait would, for one message per shard instead of two. Each half
  // is waited for, retried and refused as if started alone (a retry goes
  // alone, on the push or pull stream); a shard without StepStream (an
  // older asyncps) gets both halves alone, and this client stops pairing.
  PendingStep StartStep(int64_t clock, const PushSet& push, const ReadSet& read,
                        const PullSet& pull);

  // ---- Liveness and progress.

  // Renews this worker's lease on every shard and reports `clock`; `leaving`
  // says goodbye (the shards stop waiting for this worker).
  absl::Status Heartbeat(int64_t clock, bool leaving = false);

  // Sets the data position every later call reports (WorkerRef.trained):
  // the steps of this worker's share whose pushes every shard has
  // acknowledged. Only moves forward. Thread-safe.
  void ReportTrained(int64_t steps);

  // ---- The cluster.

  // Each shard's status, in shard order; the entry of a shard that owns no
  // slot of the map this client routes by is empty (not asked: it may be
  // stopped).
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

  // Where every key lives (common/shard_map.h): the static map of the
  // servers until the shards answer with theirs (CreateTensors,
  // CreateTables and WaitForTensors adopt the newest map the shards serve),
  // then every newer map of the same slots a shard refuses a request with.
  ShardMap map() const {
    absl::MutexLock l(&mu_);
    return map_;
  }
  // Routes every later call by `newer` when it is a newer epoch of this
  // client's slotted map (the same shard and slot counts: slots moved
  // between shards); calls in flight finish by the map they started with
  // (a shard refuses what it no longer owns, and the call routes it
  // again). OK and nothing changes for an epoch not newer than the map's;
  // FAILED_PRECONDITION for a map this client cannot follow (another slot
  // count, a static map: restart the worker). Thread-safe.
  absl::Status FollowMap(const ShardMap& newer);
  // A call gives up after this many map changes under it.
  static constexpr int kMaxMapChanges = 4;
  // Shards a push part may be re-routed from before it is answered
  // (PushRequest.moved_from), as many as a shard takes.
  static constexpr int kMaxPushOrigins = 8;
  int num_shards() const { return num_shards_; }
  int32_t worker_id() const { return options_.worker_id; }
  uint64_t incarnation() const { return options_.incarnation; }
  // The stored spec of a known tensor (slice_elems resolved) or table, or
  // nullptr.
  const TensorSpec* FindSpec(const std::string& name) const;
  const TableSpec* FindTableSpec(const std::string& name) const;
  // "shard 1 (10.0.0.2:7000)", for messages: the address in use now.
  std::string ShardName(int shard) const;

  // ---- Shorthands: one kind of parameter, or synchronous.

  std::unique_ptr<PendingPull> StartPull(
      int64_t clock, int64_t for_clock,
      const std::vector<std::pair<std::string, float*>>& outs) {
    return StartPull(clock, for_clock, PullSet{outs, {}});
  }
  std::unique_ptr<PendingPull> StartPullRows(
      int64_t clock, int64_t for_clock, const std::vector<RowsQuery>& queries) {
    return StartPull(clock, for_clock, PullSet{{}, queries});
  }
  std::unique_ptr<PendingPush> StartPush(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads,
      const ReadSet& read) {
    return StartPush(clock, PushSet{grads, {}}, read);
  }
  std::unique_ptr<PendingPush> StartPushRows(int64_t clock,
                                             const std::vector<RowsGrad>& grads,
                                             const ReadSet& read) {
    return StartPush(clock, PushSet{{}, grads}, read);
  }
  std::unique_ptr<PendingPush> StartAssign(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& values) {
    return StartAssign(clock, PushSet{values, {}});
  }
  std::unique_ptr<PendingPush> StartAssignRows(
      int64_t clock, const std::vector<RowsGrad>& values) {
    return StartAssign(clock, PushSet{{}, values});
  }
  // StartPull(clock, clock, outs)->Wait(), remembering what it read; Push
  // pushes gradients computed from the last Pull; PushThenPull does both of
  // a step boundary with StartStep (the push computed from the last Pull,
  // then the pull for clock + 1, remembered as Pull's).
  absl::Status Pull(int64_t clock,
                    const std::vector<std::pair<std::string, float*>>& outs);
  absl::StatusOr<PushSummary> Push(
      int64_t clock,
      const std::vector<std::pair<std::string, const float*>>& grads);
  absl::StatusOr<PushSummary> PushThenPull(
      int64_t clock, const PushSet& grads,
      const std::vector<std::pair<std::string, float*>>& outs);
  // Versions read by the last synchronous Pull of `name` (empty if none).
  std::vector<uint64_t> PulledVersions(const std::string& name) const;
  // What the last synchronous Pull read (what Push tags its gradients
  // with).
  ReadSet LastRead() const;

 private:
  struct Endpoint;
  struct Shard;
  friend class PendingPull;
  friend class PendingPush;

  // One shard's part of a pull (client/pull.cc) / a push (client/push.cc),
  // one table of a pull, and gRPC's references to pushed memory.
  struct PullShard;
  struct PushShard;
  struct RowsQueryState;
  struct Borrowed;
  class StepPairing;  // client/ps_client_internal.h

  // What the client knows about one sparse table. Const once remembered.
  struct TableState {
    TableSpec spec;
    ShardMap::TableKey key;
  };

  // What the client knows about one tensor, placed by one map. Const once
  // remembered: calls in flight read it without the lock, so a new map
  // replaces it with a new one (the old one is kept until the client goes).
  struct TensorState {
    TensorSpec spec;  // as stored by the shards
    TensorLayout layout;
    std::vector<int> home;            // per slice: its home shard
    std::vector<uint32_t> slices_on;  // per shard: slices it holds
    uint64_t map_epoch = 0;           // of the map it was placed by
  };
  // `spec` placed by `map`.
  static std::unique_ptr<TensorState> Place(const TensorSpec& spec,
                                            const TensorLayout& layout,
                                            const ShardMap& map);

  PsClient(PsClientOptions options, ShardMap map);

  // A part routed with map epoch `routed` to `shard`, about to be sent:
  // the newer map this client learnt since (from another shard's refusal),
  // when under it `shard` owns no slot (psctl scale drained it, and it may
  // be stopped: retrying it would last until the deadline). The part is
  // then refused here as that shard would have refused it and routed again.
  // Only for what may be sent twice: pulls, and a push part not sent yet.
  std::optional<ShardMapProto> StaleRoute(int shard, uint64_t routed) const;

  // Follows the map of a shard's refusal at once (as the answer completes), so
  // that the call's other parts, still retrying, see it (StaleRoute).
  void LearnMap(const ShardMapProto& newer);

  // The shards a control call goes to: those that own a slot of the map
  // this client routes by (every shard of a static map). A shard that owns
  // none (a standby, or one drained by psctl scale) may be stopped.
  std::vector<int> Parts() const;

  // Unary RPC to every shard of `shards` through one FanOut; responses in
  // shard order (those of the others stay empty). prepare(stub, ctx,
  // request, cq) prepares one attempt (stub->PrepareAsyncMethod).
  template <typename Request, typename Response, typename Prepare>
  absl::Status ToAllShards(const std::vector<int>& shards, const char* method,
                           const Request& request,
                           std::vector<Response>* responses, Prepare prepare,
                           std::function<absl::Status(int shard)> on_ok,
                           const RetryPolicy& policy);

  // ---- What the client knows (client/catalog.cc).
  absl::Status Remember(const TensorSpec& spec);
  absl::Status RememberTable(const TableSpec& spec);
  const TableState* FindTable(const std::string& name) const;
  const TensorState* FindTensor(const std::string& name) const;
  // Checks the specs of one CreateTensors call before anything is sent.
  static absl::Status CheckNewSpecs(const std::vector<TensorSpec>& specs);
  // Remembers the tensors and tables `names` once every shard in
  // `responses` holds each with the same spec; NOT_FOUND naming what is
  // still missing, FAILED_PRECONDITION when shards disagree.
  absl::Status RememberListed(const std::vector<std::string>& names,
                              const std::vector<ListTensorsResponse>& responses,
                              const std::vector<int>& parts);
  // Adopts the newest map the shards answered (maps[s] is shard s's; a
  // slot move may have reached only some of them): FAILED_PRECONDITION
  // when shards serve maps of different slots, different maps of one
  // epoch, a malformed one, or, once tensors or tables are known, a map
  // FollowMap cannot follow.
  absl::Status AdoptMap(const std::vector<const ShardMapProto*>& maps);

  // ---- Calls (client/ps_client.cc).
  WorkerRef MakeWorkerRef(int64_t clock) const;
  // Names the caller of a pull: this worker at `clock` for `for_clock`, or
  // for a reader, nobody (read_only); and the map it was routed with.
  void SetPullCaller(int64_t clock, int64_t for_clock,
                     PullRequest* request) const;
  // FAILED_PRECONDITION naming `what` for a reader, else OK.
  absl::Status CheckNotReader(const char* what) const;
  // options_.retry, ended by options_.stop (for waits).
  RetryPolicy WaitPolicy() const;
  // Whether options_.stop is set, after options_.poll_stop looked.
  bool Stopped() const;
  // Sleeps `d`, in steps of at most 100 ms while options_.stop can end
  // the wait; returns early once Stopped().
  void SleepUnlessStopped(absl::Duration d) const;
  // The policy of every other call: WaitPolicy() when stop_ends_pushes,
  // else options_.retry.
  RetryPolicy CallPolicy() const;
  FanOutEnv Env() const;
  // The endpoint attempts to `shard` use now (null while the router knows
  // no address: the attempt fails UNAVAILABLE and is retried). With a
  // router, follows it first when its generation moved.
  Endpoint* EndpointOf(int shard) const;
  // Opens endpoints for the shards whose router address changed since the
  // router's generation `seen_generation_` (client/ps_client.cc).
  void FollowRouter() const;
  // A new channel, stub and data streams to `address`.
  std::unique_ptr<Endpoint> OpenEndpoint(const std::string& address) const;
  // UNAVAILABLE for an attempt to `shard` while no address is known.
  absl::Status NoAddress(int shard) const;
  // DataStream::ReapFinished on every stream of every endpoint.
  void ReapFinishedStreams() const;
  // A stream request's call to `shard`: each attempt sends on connection
  // `connection` (modulo) of the shard's endpoint at that time, the pull or
  // the push stream, through send(stream, done); *last remembers the
  // stream of the attempt in flight, which the call's cancel ends.
  FanOut::Call StreamCall(
      int shard, bool push, uint32_t connection, std::atomic<DataStream*>* last,
      std::function<void(DataStream* stream, FanOut::Done done)> send) const;
  // Notes a shard's epoch from an answer; logs once when it changed (the
  // shard restarted, and restored older parameters).
  void NoteEpoch(int shard, uint64_t epoch);
  // One round of WaitForShards: every shard's ListTensors answer or error.
  std::vector<absl::Status> ProbeShards(
      std::vector<ListTensorsResponse>* responses);
  // Names why unreachable shards cannot be talked to (a probe connection),
  // the first few of them; logs causes that changed.
  std::vector<bool> NeededShards(
      const std::vector<absl::Status>& results,
      const std::vector<ListTensorsResponse>& responses) const;
  void DiagnoseShards(const std::vector<absl::Status>& results,
                      std::vector<std::string>* causes);

  // ---- Pulls (client/pull.cc).
  // Adds the tensors / rows of a pull to the shards' requests.
  // Tensors placed by another map than `map` (it changed meanwhile):
  // ABORTED, plan again.
  absl::Status PlanTensorPull(
      const std::vector<std::pair<std::string, float*>>& outs,
      const ShardMap& map, PendingPull* p,
      std::vector<std::unique_ptr<PullShard>>* shards) const;
  absl::Status PlanRowsPull(
      const std::vector<RowsQuery>& queries, const ShardMap& map,
      PendingPull* p, std::vector<std::unique_ptr<PullShard>>* shards) const;
  // Plans p's pull (p->what_) by the map now: p->shards_ and the calls to
  // them (none: nothing to pull). The parts of an earlier plan move to
  // p->earlier_.
  // The first plan of a step's pull pairs its parts with the push's
  // (p->pairing_, then cleared).
  absl::StatusOr<std::vector<FanOut::Call>> PlanPull(PendingPull* p);
  // StartPull, its parts paired with a step's push when `pairing` is set.
  std::unique_ptr<PendingPull> StartPullPaired(
      int64_t clock, int64_t for_clock, const PullSet& what,
      std::shared_ptr<StepPairing> pairing);
  // After p's attempts ended with `s`: while shards refused their part for
  // the map it was routed with, follows their map and pulls again (the
  // whole pull: pulls are repeatable), at most kMaxMapChanges times.
  absl::Status RepullRefused(PendingPull* p, absl::Status s);
  // Checks one shard's answer and copies its slices and rows into the
  // caller's buffers (on the answer's thread).
  absl::Status ReadPull(const grpc::ByteBuffer& answer, PullShard* ps);
  static absl::Status ReadSlices(const PullResponse& header, FrameReader* frame,
                                 PullShard* ps);
  static absl::Status ReadRows(const PullResponse& header, FrameReader* frame,
                               PullShard* ps);

  // ---- Steps (client/step.cc).
  // Sends pull part `ps` together with the push part `pairing` holds for
  // its shard, as one StepStream request; false when none is held (or the
  // shard has no step stream): the pull goes alone. `pull_answered` is
  // moved from only when sent.
  // (A stream request's answer callback, as DataStream::Done.)
  using StreamDone = std::function<void(absl::Status, grpc::ByteBuffer*)>;
  bool SendStep(StepPairing* pairing, PullShard* ps, uint32_t connection,
                StreamDone* pull_answered);
  // Hands a StepStream answer (or the stream's failure) to both halves:
  // the push part's callback gets its PushResponse, the pull part's the
  // frame.
  void SplitStepAnswer(absl::Status st, grpc::ByteBuffer* answer,
                       const StreamDone& push_answered,
                       const StreamDone& pull_answered);

  // ---- Pushes (client/push.cc).
  struct RowsSend;
  // Checks the tensors / rows of a push before anything is sent (the rows
  // are also summed per distinct id).
  // Tensors placed by another map than `map`: ABORTED, check again.
  absl::Status CheckTensorSend(bool assign, const PushSet& what,
                               const ShardMap& map,
                               std::vector<const TensorState*>* states) const;
  absl::Status CheckRowsSend(bool assign, const PushSet& what,
                             std::vector<RowsSend>* tables) const;
  // Adds the tensors' slices (borrowed from the caller's memory, or p's
  // bfloat16 copy) / the rows to the shards' headers and payloads, which
  // are indexed by the shards' positions in map.serving_shards(). Returns
  // the number of pieces of memory handed to gRPC.
  int64_t AddTensorPayloads(
      const PushSet& what, const std::vector<const TensorState*>& states,
      const ReadSet& read, WireDtype dtype, const ShardMap& map, PendingPush* p,
      std::vector<PushRequest>* headers,
      std::vector<std::vector<grpc::Slice>>* payloads) const;
  void AddRowPayloads(const std::vector<RowsSend>& tables, const ReadSet& read,
                      WireDtype dtype, const ShardMap& map,
                      std::vector<PushRequest>* headers,
                      std::vector<std::vector<grpc::Slice>>* payloads) const;
  // StartPush (assign false) or StartAssign; with `pairing`, the parts'
  // first attempts wait there for the step's pull (StartStep).
  std::unique_ptr<PendingPush> StartSend(
      bool assign, int64_t clock, const PushSet& what, const ReadSet& read,
      std::shared_ptr<StepPairing> pairing = nullptr);
  // One push header per shard of `shards`, in order: worker, clock, seq,
  // request id, wire type, `map_epoch` and the epoch `epochs` read from
  // each shard.
  std::vector<PushRequest> PushHeaders(
      int64_t clock, uint64_t seq, uint64_t map_epoch,
      const std::vector<int>& shards,
      const absl::flat_hash_map<int, uint64_t>& epochs);
  // Part `ps`'s frame, made on first use (a step's part may never need
  // one).
  static const grpc::ByteBuffer& FrameOf(PushShard* ps);
  // The call that sends part `ps` (its frame) on connection `connection`.
  FanOut::Call PushCall(PushShard* ps, uint32_t connection);
  // After p's attempts ended with `s`: while shards refused their part for
  // the map it was routed with, or a part sent to a shard a newer map
  // drained could not be answered there (PushShard::moved), follows the
  // newer map and sends exactly those parts again, split by it
  // (client/push_split.h), under a fresh seq (one per set of origins), at
  // most kMaxMapChanges times; the parts applied are not sent again.
  absl::Status ResendRefused(PendingPush* p, absl::Status s,
                             const char* method);
  // A part for `shard` is tried again (its last attempt failed) and no map
  // newer than the client's is known: asks another shard that serves the
  // client's map for its own (ListTensors, on the queue, answered
  // whenever) and follows it, at most one ask at a time and one per 500 ms,
  // slotted maps only. So a part whose shard a scale drained and that was
  // stopped since finds the slots' new owner even when no other answer
  // brings the newer map.
  void AskForNewerMap(int shard);
  // `refused` came from `shard`, which serves an older map than the one the
  // part was routed with (common/shard_map_proto.h ServedMapEpoch): in a
  // run without a router, hands the shard this client's map (AdoptMap, on
  // the queue, answered whenever), as psctl adopt does, at most one
  // hand-out at a time and one per shard per 500 ms. So a shard restarted
  // on files older than the run's map (a move it missed, or a move out of
  // it since) serves the map again at the first request that reaches it,
  // instead of refusing every request until someone runs psctl adopt. (A
  // shard adopts no map that gives it slots; with a router, the shard
  // reads the run's map in etcd itself.)
  void HandMapIfBehind(int shard, const absl::Status& refused);
  // Shared with the asks' and hand-outs' callbacks (client/ps_client.cc).
  struct MapAsks;

  // The parts of p to send again (refused or moved; taken out of p),
  // grouped by the origins their pieces must name, and the maps that sent
  // them back (client/push.cc).
  struct Resend;
  static absl::StatusOr<Resend> TakeResends(PendingPush* p);
  // Sends each group of `resend` split by `map` under a fresh seq, as new
  // parts of p; their outcome.
  absl::Status SendAgain(PendingPush* p, Resend resend, const ShardMap& map,
                         const char* method);

  // Const after construction (the Shard objects; their endpoints change,
  // see Shard).
  const PsClientOptions options_;
  const int num_shards_;
  std::vector<std::unique_ptr<Shard>> shards_;

  // The data streams' operations complete here, driven by the threads that
  // wait for them; declared before the endpoints, which it outlives.
  mutable DrivenQueue queue_;
  // Serialises following the router (opening endpoints).
  mutable absl::Mutex route_mu_;
  // Every endpoint opened, those in use and those replaced; appended only.
  mutable std::vector<std::unique_ptr<Endpoint>> endpoints_
      ABSL_GUARDED_BY(route_mu_);
  // The router generation the endpoints follow.
  mutable std::atomic<uint64_t> seen_generation_{0};

  mutable absl::Mutex mu_;
  ShardMap map_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> map_epoch_;  // map_.epoch(), read without mu_
  // Entries are never removed or changed once added.
  absl::flat_hash_map<std::string, std::unique_ptr<TensorState>> tensors_
      ABSL_GUARDED_BY(mu_);
  // Tensor states replaced by a newer map's, which calls in flight may
  // still read.
  std::vector<std::unique_ptr<TensorState>> replaced_ ABSL_GUARDED_BY(mu_);
  // Entries are never removed or changed once added.
  absl::flat_hash_map<std::string, std::unique_ptr<TableState>> row_tables_
      ABSL_GUARDED_BY(mu_);
  ReadSet last_read_ ABSL_GUARDED_BY(mu_);  // of the last synchronous Pull
  std::vector<uint64_t> epochs_ ABSL_GUARDED_BY(mu_);  // per shard, last seen

  std::atomic<int64_t> trained_{0};  // ReportTrained
  std::atomic<uint64_t> next_seq_{1};
  std::atomic<uint64_t> next_request_id_{1};
  std::atomic<uint32_t> next_connection_{0};
  // A shard answered StepStream UNIMPLEMENTED: steps go as two messages.
  std::atomic<bool> steps_unsupported_{false};
  const std::shared_ptr<MapAsks> map_asks_;  // AskForNewerMap, HandMapIfBehind
};

// A pull in flight. Wait() returns when every shard answered (or the call
// failed); the destructor waits too.
class PsClient::PendingPull {
 public:
  ~PendingPull();  // waits
  // OK once every buffer holds its tensor's values or rows.
  absl::Status Wait() { return call_.Wait(); }
  // What was read (valid after Wait returned OK).
  const ReadSet& read() const { return read_; }
  // Rows the shards created for it (valid after Wait returned OK), as their
  // last answers said: rows created by an attempt that failed and was
  // retried are not counted.
  int64_t rows_created() const { return rows_created_; }

 private:
  friend class PsClient;
  PendingPull();
  // Repeated ids' rows and the read set (after every attempt ended OK).
  absl::Status Finish(absl::Status s);

  ReadSet read_;
  int64_t rows_created_ = 0;
  // What is pulled (pulled again when a shard refused it for its map).
  PullSet what_;
  int64_t clock_ = 0;
  int64_t for_clock_ = 0;
  // The step's push to pair the first plan's parts with (StartStep).
  std::shared_ptr<StepPairing> pairing_;
  std::vector<std::unique_ptr<RowsQueryState>> queries_;
  // Per shard asked: the request sent and where the answer goes; owned
  // here because attempts refer to them.
  std::vector<std::unique_ptr<PullShard>> shards_;
  // The parts and tables of plans pulled again (their attempts ended).
  std::vector<std::unique_ptr<PullShard>> earlier_shards_;
  std::vector<std::unique_ptr<RowsQueryState>> earlier_queries_;
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
  PendingPush();
  // The summary of the shards' answers (after every attempt ended with `s`).
  absl::StatusOr<PushSummary> Finish(absl::Status s);

  std::vector<std::unique_ptr<PushShard>> shards_;
  // References gRPC holds to the gradient memory (slices not yet released).
  std::shared_ptr<Borrowed> borrowed_;
  // Deletes the client's ended streams (PsClient::ReapFinishedStreams),
  // which release what they held, while Finish waits for the memory.
  std::function<void()> reap_;
  // The client's stream queue, driven while Finish waits for the memory
  // (a write's completion releases its request).
  DrivenQueue* queue_ = nullptr;
  std::vector<uint16_t> bf16_;  // the gradients as bfloat16, when asked
  PendingCall<absl::StatusOr<PushSummary>> call_;  // last: waited first
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PS_CLIENT_H_
