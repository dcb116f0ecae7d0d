#ifndef ASYNCPS_MEMBERSHIP_ETCD_CLIENT_H_
#define ASYNCPS_MEMBERSHIP_ETCD_CLIENT_H_

// A small client of etcd's v3 API (proto/etcd_v3.proto) for the cluster's
// membership: keys and prefixes, compare-and-swap on a key's revision,
// leases that expire with the process that holds them, and watches. etcd is
// the coordinator (DESIGN.md, "membership lives in etcd"): this client adds
// no state of its own beyond the channel.
//
// Example:
//
//   EtcdClientOptions o;
//   o.endpoints = {"127.0.0.1:2379"};
//   absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Connect(o);
//   if (!etcd.ok()) return etcd.status();
//   absl::StatusOr<int64_t> lease = (*etcd)->GrantLease(absl::Seconds(5));
//   // Becomes the owner of the key only if nobody holds it (revision 0).
//   absl::StatusOr<EtcdClient::Swap> won = (*etcd)->CompareAndSwap(
//       "/asyncps/run1/primary/0", /*expected_mod_revision=*/0,
//       "10.0.0.5:7000", *lease);
//   if (won.ok() && won->swapped) { ... renew the lease every TTL / 3 ... }
//
// Every call has a deadline (EtcdClientOptions::call_timeout); etcd's errors
// come back as absl::Status (UNAVAILABLE while no endpoint answers).
// Thread-safe.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "proto/etcd_v3.grpc.pb.h"

namespace asyncps {

// How a client reaches etcd: over TLS or not, and as which user where etcd
// has authentication enabled (its RBAC: `etcdctl auth enable`).
struct EtcdAccess {
  // Plain TCP by default; TLS when tls_ca (the roots etcd's certificate is
  // checked with, and its name against the endpoint's host) or
  // tls_cert/tls_key (the client certificate an etcd started with
  // --client-cert-auth requires) is set. Paths of PEM files, read at
  // Connect. No cluster token (etcd has none).
  SecurityOptions tls;
  // With a user, every call carries a token etcd gave for the user and
  // password (Auth.Authenticate, asked at the first call and again when
  // etcd says the token is no longer valid). Empty: no authentication
  // (or, over TLS, etcd takes the client certificate's common name as the
  // user).
  std::string user;
  std::string password;
};

struct EtcdClientOptions {
  // "host:port" of etcd's client URLs, one per member: calls go to one
  // member at a time, each member over a channel of its own (connected from
  // the start), and move to the next member when a call to the one in use
  // fails as an unreachable, silent or leaderless member fails
  // (UNAVAILABLE, DEADLINE_EXCEEDED), as etcd's own client moves between
  // endpoints; a member whose channel cannot connect is passed over. A
  // write that failed is not repeated on the next member (one that timed
  // out may have been applied): its caller's own retry goes there. A read
  // (Get, List) that failed UNAVAILABLE is, within its deadline. With one
  // endpoint a call waits for a connection (etcd restarting) up to its
  // deadline; with several, one to a member that is down fails at once.
  std::vector<std::string> endpoints;
  EtcdAccess access;  // how every member is reached
  absl::Duration call_timeout = absl::Seconds(5);
  // A watch that has heard nothing from etcd for this long asks it how far
  // the watch got (a progress request on the watch's stream, which etcd
  // answers at once and at no cost beyond the answer), and one whose
  // question goes unanswered for call_timeout ends (UNAVAILABLE): a stream
  // on a connection that died silently, or on an etcd that stopped
  // answering, would otherwise deliver nothing, never end, and leave its
  // caller's view as old as its last event. Zero: never ask.
  absl::Duration watch_check_every = absl::Seconds(1);
};

// One key as etcd holds it.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;  // the store revision of its last put
  int64_t version = 0;       // puts since it was created
  int64_t lease = 0;         // 0 = none
};

// One change a watch saw.
struct EtcdEvent {
  bool deleted = false;  // else a put
  EtcdKeyValue kv;       // a delete's has the key and mod_revision only
};

class EtcdClient {
 public:
  class LeaseStream;
  class Watcher;

  // Validates the options and opens the members' channels (which connect
  // in the background; nothing waits for them).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      EtcdClientOptions options);

  // The key, or nullopt when it does not exist.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(absl::string_view key);

  // Every key under `prefix` (in key order) and the store revision they
  // were read at (a watch from revision + 1 misses nothing).
  struct Listing {
    std::vector<EtcdKeyValue> kvs;
    int64_t revision = 0;
  };
  absl::StatusOr<Listing> List(absl::string_view prefix);

  // Sets the key (with `lease`, 0 = none); returns the new store revision.
  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                              int64_t lease = 0);

  // Deletes the key; returns how many keys went (0 or 1).
  absl::StatusOr<int64_t> Delete(absl::string_view key);

  // Sets the key to `value` only if its mod_revision is
  // `expected_mod_revision` (0: only if the key does not exist), in one
  // atomic step of etcd. `current` is what the key held when the swap did
  // not happen (nullopt: absent).
  struct Swap {
    bool swapped = false;
    int64_t revision = 0;  // the store revision after the transaction
    std::optional<EtcdKeyValue> current;
  };
  absl::StatusOr<Swap> CompareAndSwap(absl::string_view key,
                                      int64_t expected_mod_revision,
                                      absl::string_view value,
                                      int64_t lease = 0);

  // A lease of `ttl` (whole seconds, at least 1); returns its id. Waits at
  // most the TTL for etcd's answer (DEADLINE_EXCEEDED).
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // A keep-alive stream that renews leases (LeaseStream::Renew); opened
  // by its first renewal. Destroy it before this client.
  std::unique_ptr<LeaseStream> OpenLeaseStream();
  // Ends the lease now and deletes its keys.
  absl::Status RevokeLease(int64_t id);

  // The alarms raised in the cluster ("NOSPACE": its database reached its
  // quota and it refuses writes; "CORRUPT"), each with the member that
  // raised it. Empty when none is.
  struct Alarm {
    uint64_t member = 0;
    std::string type;
  };
  absl::StatusOr<std::vector<Alarm>> Alarms();

  // Watches every key under `prefix` from `start_revision` (0: from now);
  // `on_events` runs on the watcher's thread with each batch, in revision
  // order; `on_end` once when the watch ends by itself (etcd unreachable or
  // silent past EtcdClientOptions::watch_check_every and call_timeout, the
  // member serving it without a leader, the revision compacted: the caller
  // lists again and watches anew). Ends when the Watcher is destroyed,
  // which must happen before this client is.
  std::unique_ptr<Watcher> WatchPrefix(
      absl::string_view prefix, int64_t start_revision,
      std::function<void(const std::vector<EtcdEvent>&, int64_t revision)>
          on_events,
      std::function<void(const absl::Status&)> on_end);

  // The range end that makes [prefix, end) every key under `prefix`.
  static std::string PrefixEnd(absl::string_view prefix);

  // The endpoint calls go to now (for messages and tests).
  const std::string& current_endpoint() const;

 private:
  // One etcd member's channel and stubs.
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };

  EtcdClient(EtcdClientOptions options,
             std::shared_ptr<grpc::ChannelCredentials> credentials);
  // A call's context, with its deadline `timeout` from now.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) const;
  // The token to send as options_.access.user ("" without one), asked of
  // member `m` when none is held (within `timeout`).
  absl::StatusOr<std::string> Token(size_t m, absl::Duration timeout);
  // Forgets `token` (etcd said it is no longer valid) unless a newer one
  // replaced it already: the next call asks for another.
  void DropToken(const std::string& token);
  // The index of the member calls go to now.
  size_t Current() const { return current_.load(std::memory_order_acquire); }
  // The member for a new call: the current one, unless its channel says it
  // is down and another's does not.
  size_t Pick();
  // Whether member m's channel failed to connect (TRANSIENT_FAILURE).
  bool Unreachable(size_t m) const;
  // Moves later calls from member m to the next one that is not
  // Unreachable (unless another failure moved them on already).
  void MoveFrom(size_t m);
  // A call to member `m` ended with `code`: when that says the member is
  // unreachable, silent or without a leader, later calls go to the next
  // member (unless another failure moved them on already).
  void Failed(size_t m, absl::StatusCode code);
  // Runs `call(member, context)` on the member Pick gives, with a deadline
  // of `timeout` or the call timeout, whichever is shorter; its error,
  // annotated with `what`, moves later calls on as Failed says. A `read`
  // that fails UNAVAILABLE is run again on the next member, each member
  // at most once, within the same deadline (a read is safe to repeat; a
  // write that failed may have been applied).
  template <typename F>
  absl::Status Call(absl::string_view what, F&& call,
                    absl::Duration timeout = absl::InfiniteDuration(),
                    bool read = false);

  absl::Mutex token_mu_;
  std::string token_ ABSL_GUARDED_BY(token_mu_);
  const EtcdClientOptions options_;
  std::vector<Member> members_;  // one per endpoint, in order
  std::atomic<size_t> current_{0};
};

// Renewals on one LeaseKeepAlive stream, kept open from one renewal to the
// next as etcd's own client keeps it (a stream per renewal cost etcd a new
// HTTP/2 stream and its handler three times a second per process). One
// renewal at a time; each waits for its answer at most the client's call
// timeout. A renewal that fails or times out ends the stream (cancelled):
// every later one fails at once with its error, and the caller opens a new
// stream. The destructor cancels the stream and waits until gRPC is done
// with it. Thread-compatible.
//
//   std::unique_ptr<EtcdClient::LeaseStream> stream = etcd->OpenLeaseStream();
//   absl::StatusOr<absl::Duration> left = stream->Renew(lease);
//   if (absl::IsNotFound(left.status())) ... the lease is gone ...
//   else if (!left.ok()) stream = etcd->OpenLeaseStream();  // next time
class EtcdClient::LeaseStream final
    : public grpc::ClientBidiReactor<etcdserverpb::LeaseKeepAliveRequest,
                                     etcdserverpb::LeaseKeepAliveResponse> {
 public:
  ~LeaseStream() override;
  LeaseStream(const LeaseStream&) = delete;
  LeaseStream& operator=(const LeaseStream&) = delete;

  // Renews the lease; returns the time it has left. NOT_FOUND once it
  // expired (its keys are gone); UNAVAILABLE or DEADLINE_EXCEEDED when etcd
  // did not answer within `timeout` or the client's call timeout, whichever
  // is shorter (the stream has ended, and the client's later calls and
  // streams go to another member). Timed on the monotonic clock
  // (common/steady_wait.h): a step of the real-time clock does not stretch
  // it.
  absl::StatusOr<absl::Duration> Renew(
      int64_t id, absl::Duration timeout = absl::InfiniteDuration());

 private:
  friend class EtcdClient;
  LeaseStream(EtcdClient* client, size_t member);

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;
  // Marks the stream ended with `why` (the first reason stays).
  void End(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EtcdClient* const client_;
  const size_t member_;  // the member it talks to
  grpc::ClientContext context_;
  etcdserverpb::LeaseKeepAliveRequest request_;    // the posted write's
  etcdserverpb::LeaseKeepAliveResponse response_;  // the posted read's
  bool started_ = false;  // only touched by Renew and the destructor

  absl::Mutex mu_;
  // Notified, under mu_, as what Renew awaits changes.
  std::condition_variable_any changed_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a write is posted
  // The answer to the renewal in progress, once read.
  std::optional<etcdserverpb::LeaseKeepAliveResponse> answer_
      ABSL_GUARDED_BY(mu_);
  absl::Status ended_ ABSL_GUARDED_BY(mu_);  // not OK once ended
  bool done_ ABSL_GUARDED_BY(mu_) = false;   // OnDone ran
};

// A watch in progress (EtcdClient::WatchPrefix): one thread reads the
// stream, another (while the stream is open, when checks are on) asks etcd
// for progress when the stream has been silent and cancels it when etcd
// does not answer. The stream carries etcd's "hasleader" metadata (what
// clientv3's WithRequireLeader sends): an etcd member that has lost its
// cluster's leader ends the stream instead of keeping it open with nothing
// to deliver, while answering progress requests from its own stale store.
// The destructor cancels the watch and joins its threads.
// Thread-compatible.
class EtcdClient::Watcher {
 public:
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

 private:
  friend class EtcdClient;
  using Stream = grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                          etcdserverpb::WatchResponse>;
  Watcher() = default;

  // The stream's reader, on member `member` of `client`: creates the
  // watch, delivers its events, reports its end.
  void Read(EtcdClient* client, size_t member,
            const etcdserverpb::WatchRequest& create,
            const std::function<void(const std::vector<EtcdEvent>&, int64_t)>&
                on_events,
            const std::function<void(const absl::Status&)>& on_end);
  // The checks of EtcdClientOptions::watch_check_every, on checker_'s
  // thread until closing_.
  void Check(Stream* stream, absl::Duration every, absl::Duration answer_within)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Heard() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ClientContext context_;
  std::atomic<bool> cancelled_{false};
  std::thread thread_;

  absl::Mutex mu_;
  absl::Time heard_ ABSL_GUARDED_BY(mu_);      // the stream's last answer
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the checks end
  std::condition_variable_any closed_;         // notified when closing_
  // Check cancelled the stream: etcd left a progress request unanswered.
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration silent_for_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_MEMBERSHIP_ETCD_CLIENT_H_
