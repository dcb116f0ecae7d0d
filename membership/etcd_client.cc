#include "membership/etcd_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/steady_wait.h"

namespace asyncps {
namespace {

EtcdKeyValue FromProto(const etcdserverpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

absl::Status Annotate(const grpc::Status& s, absl::string_view what) {
  const absl::Status status = FromGrpcStatus(s);
  // etcd's words ("mvcc: database space exceeded") do not say what to do.
  const bool full = absl::IsResourceExhausted(status) &&
                    absl::StrContains(status.message(), "space exceeded");
  return absl::Status(
      status.code(),
      absl::StrCat("etcd ", what, ": ", status.message(),
                   full ? " (etcd's database reached its "
                          "--quota-backend-bytes and takes no write until "
                          "it is compacted and defragmented and its NOSPACE "
                          "alarm disarmed: etcdctl compact, defrag, alarm "
                          "disarm)"
                        : ""));
}

// Whether etcd refused a call for its token (expired: simple tokens lapse
// after etcd's --auth-token-ttl without use; or older than a change of its
// users and roles), so that another token may pass.
bool TokenRefused(const absl::Status& s) {
  return absl::IsUnauthenticated(s) ||
         absl::StrContains(s.message(), "invalid auth token") ||
         absl::StrContains(s.message(), "revision of auth store is old");
}

}  // namespace

std::string EtcdClient::PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  // The smallest key above every key that starts with the prefix: its last
  // byte below 0xff incremented, the bytes after it dropped.
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    EtcdClientOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoints given");
  }
  if (options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd: call_timeout must be > 0");
  }
  if (options.watch_check_every < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "etcd: watch_check_every must be >= 0 (0: never)");
  }
  for (const std::string& e : options.endpoints) {
    if (e.empty() || e.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd: endpoint '", e, "' is not host:port"));
    }
  }
  if (!options.access.tls.cluster_token.empty()) {
    return absl::InvalidArgumentError("etcd: no cluster token is sent to etcd");
  }
  if (options.access.user.empty() != options.access.password.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a user needs a password and a password a user");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(options.access.tls);
  if (!credentials.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd: ", credentials.status().message()));
  }
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(std::move(options), *std::move(credentials)));
}

EtcdClient::EtcdClient(EtcdClientOptions options,
                       std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(std::move(options)) {
  for (const std::string& endpoint : options_.endpoints) {
    Member m;
    m.endpoint = endpoint;
    grpc::ChannelArguments args;
    // A member that comes back is connected to within a second (gRPC's
    // default backoff grows to two minutes), so that calls can move to it.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // No retry filter (as every other channel here, common/net.cc): calls
    // are retried by this client and its callers. Debian's gRPC 1.51 also
    // aborts in it on an answer whose trailers carry no grpc-status (its
    // issue 34683): a primary died so at exit, once in 41 runs of
    // deploy/local.sh --tls --replicas 2.
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    m.channel = grpc::CreateCustomChannel(endpoint, credentials, args);
    // Connected before a failure moves calls to it.
    m.channel->GetState(/*try_to_connect=*/true);
    m.kv = etcdserverpb::KV::NewStub(m.channel);
    m.lease = etcdserverpb::Lease::NewStub(m.channel);
    m.watch = etcdserverpb::Watch::NewStub(m.channel);
    m.maintenance = etcdserverpb::Maintenance::NewStub(m.channel);
    m.auth = etcdserverpb::Auth::NewStub(m.channel);
    members_.push_back(std::move(m));
  }
}

const std::string& EtcdClient::current_endpoint() const {
  return members_[Current()].endpoint;
}

bool EtcdClient::Unreachable(size_t m) const {
  const grpc_connectivity_state state =
      members_[m].channel->GetState(/*try_to_connect=*/true);
  return state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
         state == GRPC_CHANNEL_SHUTDOWN;
}

void EtcdClient::MoveFrom(size_t m) {
  const size_t n = members_.size();
  // The next member that is not known to be down (a killed member's
  // channel is in TRANSIENT_FAILURE within a connection attempt), else
  // simply the next one.
  size_t next = (m + 1) % n;
  for (size_t k = 1; k < n; ++k) {
    if (!Unreachable((m + k) % n)) {
      next = (m + k) % n;
      break;
    }
  }
  size_t expected = m;
  current_.compare_exchange_strong(expected, next, std::memory_order_acq_rel);
}

size_t EtcdClient::Pick() {
  const size_t m = Current();
  if (members_.size() > 1 && Unreachable(m)) MoveFrom(m);
  return Current();
}

void EtcdClient::Failed(size_t m, absl::StatusCode code) {
  if (code != absl::StatusCode::kUnavailable &&
      code != absl::StatusCode::kDeadlineExceeded) {
    return;  // the member answered
  }
  MoveFrom(m);
}

template <typename F>
absl::Status EtcdClient::Call(absl::string_view what, F&& call,
                              absl::Duration timeout, bool read) {
  const absl::Time deadline =
      absl::Now() + std::min(timeout, options_.call_timeout);
  absl::Status status;
  // A read goes on to the next member while time is left (a member that
  // is down fails it at once); anything else is tried once.
  const size_t tries = read ? members_.size() : 1;
  for (size_t k = 0; k < tries; ++k) {
    if (k > 0 && deadline <= absl::Now()) break;
    const size_t m = Pick();
    // Twice at most: again with a new token when etcd refused the one sent
    // (expired, or from before a change of etcd's users; a refused call
    // changed nothing).
    for (int attempt = 0; attempt < 2; ++attempt) {
      absl::StatusOr<std::string> token = Token(m, deadline - absl::Now());
      if (!token.ok()) {
        status = token.status();
        break;
      }
      std::unique_ptr<grpc::ClientContext> ctx =
          Context(deadline - absl::Now());
      if (!token->empty()) ctx->AddMetadata("token", *token);
      const grpc::Status s = call(members_[m], ctx.get());
      if (s.ok()) return absl::OkStatus();
      status = Annotate(s, what);
      if (token->empty() || !TokenRefused(status)) break;
      DropToken(*token);
    }
    Failed(m, status.code());
    if (!absl::IsUnavailable(status)) break;
  }
  return status;
}

absl::StatusOr<std::string> EtcdClient::Token(size_t m,
                                              absl::Duration timeout) {
  if (options_.access.user.empty()) return std::string();
  {
    absl::MutexLock l(&token_mu_);
    if (!token_.empty()) return token_;
  }
  etcdserverpb::AuthenticateRequest request;
  request.set_name(options_.access.user);
  request.set_password(options_.access.password);
  etcdserverpb::AuthenticateResponse response;
  const grpc::Status s = members_[m].auth->Authenticate(
      Context(std::min(timeout, options_.call_timeout)).get(), request,
      &response);
  if (!s.ok()) {
    return Annotate(
        s, absl::StrCat("authenticate as '", options_.access.user, "'"));
  }
  absl::MutexLock l(&token_mu_);
  token_ = response.token();
  return token_;
}

void EtcdClient::DropToken(const std::string& token) {
  absl::MutexLock l(&token_mu_);
  if (token_ == token) token_.clear();
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Context(
    absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // The only endpoint: wait for a connection (etcd restarting) up to the
  // deadline. With several, a call to a member that is down fails at once
  // and moves the next call on (Failed), instead of waiting out the
  // deadline on it while the others answer.
  ctx->set_wait_for_ready(members_.size() == 1);
  return ctx;
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(
    absl::string_view key) {
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::RangeResponse response;
  absl::Status s = Call(
      "get",
      [&](const Member& m, grpc::ClientContext* c) {
        return m.kv->Range(c, request, &response);
      },
      absl::InfiniteDuration(), /*read=*/true);
  if (!s.ok()) return s;
  if (response.kvs_size() == 0) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(FromProto(response.kvs(0)));
}

absl::StatusOr<EtcdClient::Listing> EtcdClient::List(absl::string_view prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(prefix));
  request.set_range_end(PrefixEnd(prefix));
  etcdserverpb::RangeResponse response;
  absl::Status s = Call(
      "list",
      [&](const Member& m, grpc::ClientContext* c) {
        return m.kv->Range(c, request, &response);
      },
      absl::InfiniteDuration(), /*read=*/true);
  if (!s.ok()) return s;
  Listing out;
  out.revision = response.header().revision();
  for (const etcdserverpb::KeyValue& kv : response.kvs()) {
    out.kvs.push_back(FromProto(kv));
  }
  return out;
}

absl::StatusOr<std::vector<EtcdClient::Alarm>> EtcdClient::Alarms() {
  etcdserverpb::AlarmRequest request;  // GET, every member, every type
  etcdserverpb::AlarmResponse response;
  absl::Status s = Call(
      "alarm list",
      [&](const Member& m, grpc::ClientContext* c) {
        return m.maintenance->Alarm(c, request, &response);
      },
      absl::InfiniteDuration(), /*read=*/true);
  if (!s.ok()) return s;
  std::vector<Alarm> out;
  for (const etcdserverpb::AlarmMember& a : response.alarms()) {
    std::string type = etcdserverpb::AlarmType_Name(a.alarm());
    if (type.empty()) type = absl::StrCat("type ", a.alarm());
    out.push_back({a.memberid(), std::move(type)});
  }
  return out;
}

absl::StatusOr<int64_t> EtcdClient::Put(absl::string_view key,
                                        absl::string_view value,
                                        int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  absl::Status s = Call("put", [&](const Member& m, grpc::ClientContext* c) {
    return m.kv->Put(c, request, &response);
  });
  if (!s.ok()) return s;
  return response.header().revision();
}

absl::StatusOr<int64_t> EtcdClient::Delete(absl::string_view key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::DeleteRangeResponse response;
  absl::Status s = Call("delete", [&](const Member& m, grpc::ClientContext* c) {
    return m.kv->DeleteRange(c, request, &response);
  });
  if (!s.ok()) return s;
  return response.deleted();
}

absl::StatusOr<EtcdClient::Swap> EtcdClient::CompareAndSwap(
    absl::string_view key, int64_t expected_mod_revision,
    absl::string_view value, int64_t lease) {
  if (expected_mod_revision < 0) {
    return absl::InvalidArgumentError(
        "etcd compare-and-swap: the expected revision must be >= 0");
  }
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* c = request.add_compare();
  c->set_key(std::string(key));
  c->set_target(etcdserverpb::Compare::MOD);
  c->set_result(etcdserverpb::Compare::EQUAL);
  // An absent key's mod_revision compares as 0.
  c->set_mod_revision(expected_mod_revision);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(std::string(key));
  etcdserverpb::TxnResponse response;
  absl::Status s =
      Call("compare-and-swap", [&](const Member& m, grpc::ClientContext* c) {
        return m.kv->Txn(c, request, &response);
      });
  if (!s.ok()) return s;
  Swap out;
  out.swapped = response.succeeded();
  out.revision = response.header().revision();
  if (!out.swapped && response.responses_size() == 1 &&
      response.responses(0).response_range().kvs_size() > 0) {
    out.current = FromProto(response.responses(0).response_range().kvs(0));
  }
  return out;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds =
      absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)));
  if (seconds < 1) {
    return absl::InvalidArgumentError("etcd lease: the TTL must be >= 1 s");
  }
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(seconds);
  etcdserverpb::LeaseGrantResponse response;
  // A grant answered later than its TTL is of no use (its holder's clock
  // starts when it is sent), and one etcd has not answered by then is
  // usually lost: a member that still believes in a leader that died
  // forwards it there and waits. Its caller asks again, on the next member.
  absl::Status s = Call(
      "lease grant",
      [&](const Member& m, grpc::ClientContext* c) {
        return m.lease->LeaseGrant(c, request, &response);
      },
      absl::Seconds(seconds));
  if (!s.ok()) return s;
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd lease grant: ", response.error()));
  }
  return response.id();
}

std::unique_ptr<EtcdClient::LeaseStream> EtcdClient::OpenLeaseStream() {
  return std::unique_ptr<LeaseStream>(new LeaseStream(this, Pick()));
}

EtcdClient::LeaseStream::LeaseStream(EtcdClient* client, size_t member)
    : client_(client), member_(member) {
  // No deadline of its own (each renewal has one). With one endpoint it
  // waits for a connection (etcd restarting) until a renewal gives up on
  // it; with several, a member that is down fails it at once (as Context).
  context_.set_wait_for_ready(client->members_.size() == 1);
}

EtcdClient::LeaseStream::~LeaseStream() {
  if (!started_) return;
  context_.TryCancel();
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(&done_));
}

absl::StatusOr<absl::Duration> EtcdClient::LeaseStream::Renew(
    int64_t id, absl::Duration timeout) {
  const absl::Time deadline = Clock::Monotonic()->Now() +
                              std::min(timeout, client_->options_.call_timeout);
  const auto left = [&] { return deadline - Clock::Monotonic()->Now(); };
  {
    absl::MutexLock l(&mu_);
    // The write of the renewal before may complete after its answer.
    const auto writable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !writing_ || !ended_.ok();
    };
    if (!AwaitSteadily(&mu_, &changed_, left(), writable)) {
      End(absl::DeadlineExceededError(
          "etcd lease renewal: the last renewal's write never completed"));
    }
    if (!ended_.ok()) return ended_;
    answer_.reset();
    writing_ = true;
  }
  request_.set_id(id);
  // Not under mu_: a reaction may run inline.
  if (started_) {
    StartWrite(&request_);
  } else {
    started_ = true;
    client_->members_[member_].lease->async()->LeaseKeepAlive(&context_, this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }
  etcdserverpb::LeaseKeepAliveResponse answer;
  absl::Status ended;
  {
    absl::MutexLock l(&mu_);
    const auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return answer_.has_value() || !ended_.ok();
    };
    AwaitSteadily(&mu_, &changed_, left(), settled);
    if (answer_.has_value()) {
      answer = *std::move(answer_);
      answer_.reset();
    } else {
      End(absl::DeadlineExceededError(absl::StrCat(
          "etcd lease renewal: no answer from ",
          client_->members_[member_].endpoint, " by its deadline")));
      ended = ended_;
    }
  }
  if (!ended.ok()) {
    context_.TryCancel();  // outside mu_: OnDone may run inline
    client_->Failed(member_, ended.code());
    return ended;
  }
  if (answer.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd lease ", id, " expired (its keys are gone)"));
  }
  return absl::Seconds(answer.ttl());
}

void EtcdClient::LeaseStream::End(absl::Status why) {
  if (ended_.ok()) ended_ = std::move(why);
}

void EtcdClient::LeaseStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) End(absl::UnavailableError("etcd lease renewal: stream ended"));
    changed_.notify_all();
  }
}

void EtcdClient::LeaseStream::OnReadDone(bool ok) {
  {
    absl::MutexLock l(&mu_);
    if (ok) answer_ = response_;
    if (!ok) End(absl::UnavailableError("etcd lease renewal: stream ended"));
    changed_.notify_all();
  }
  if (ok) StartRead(&response_);
}

void EtcdClient::LeaseStream::OnDone(const grpc::Status& s) {
  {
    absl::MutexLock l(&mu_);
    End(s.ok() ? absl::UnavailableError("etcd lease renewal: stream ended")
               : Annotate(s, "lease renewal"));
    done_ = true;
    // Under mu_: once it is released the destructor may go on and free
    // changed_ (a notify after that was a use after free).
    changed_.notify_all();
  }
}

absl::Status EtcdClient::RevokeLease(int64_t id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  return Call("lease revoke", [&](const Member& m, grpc::ClientContext* c) {
    return m.lease->LeaseRevoke(c, request, &response);
  });
}

std::unique_ptr<EtcdClient::Watcher> EtcdClient::WatchPrefix(
    absl::string_view prefix, int64_t start_revision,
    std::function<void(const std::vector<EtcdEvent>&, int64_t)> on_events,
    std::function<void(const absl::Status&)> on_end) {
  std::unique_ptr<Watcher> w(new Watcher());
  w->context_.AddMetadata("hasleader", "true");
  etcdserverpb::WatchRequest create;
  create.mutable_create_request()->set_key(std::string(prefix));
  create.mutable_create_request()->set_range_end(PrefixEnd(prefix));
  create.mutable_create_request()->set_start_revision(start_revision);
  Watcher* raw = w.get();
  w->thread_ = std::thread([this, raw, member = Pick(), create,
                            on_events = std::move(on_events),
                            on_end = std::move(on_end)] {
    raw->Read(this, member, create, on_events, on_end);
  });
  return w;
}

void EtcdClient::Watcher::Read(
    EtcdClient* client, size_t member, const etcdserverpb::WatchRequest& create,
    const std::function<void(const std::vector<EtcdEvent>&, int64_t)>&
        on_events,
    const std::function<void(const absl::Status&)>& on_end) {
  const EtcdClientOptions& options = client->options_;
  absl::Status probed;
  if (!options.access.user.empty()) {
    // A read of the prefix first, which replaces a token that lapsed: etcd
    // cancels a watch opened with one.
    etcdserverpb::RangeRequest probe;
    probe.set_key(create.create_request().key());
    probe.set_range_end(create.create_request().range_end());
    probe.set_limit(1);
    probe.set_keys_only(true);
    etcdserverpb::RangeResponse response;
    probed = client->Call(
        "watch's token check",
        [&](const Member& m, grpc::ClientContext* c) {
          return m.kv->Range(c, probe, &response);
        },
        absl::InfiniteDuration(), /*read=*/true);
  }
  absl::StatusOr<std::string> token =
      probed.ok() ? client->Token(member, options.call_timeout) : probed;
  if (!token.ok()) {
    if (cancelled_.load()) return;
    client->Failed(member, token.status().code());
    if (on_end) on_end(token.status());
    return;
  }
  if (!token->empty()) context_.AddMetadata("token", *token);
  std::unique_ptr<Stream> stream =
      client->members_[member].watch->Watch(&context_);
  absl::Status end;
  if (!stream->Write(create)) {
    end = absl::UnavailableError("etcd watch: cannot start the stream");
  }
  std::thread checker;
  etcdserverpb::WatchResponse response;
  while (end.ok() && stream->Read(&response)) {
    Heard();
    if (response.compact_revision() != 0 || response.canceled()) {
      end = absl::OutOfRangeError(absl::StrCat(
          "etcd watch cancelled (compacted to revision ",
          response.compact_revision(), "): ", response.cancel_reason()));
      break;
    }
    // Progress requests only once the watch exists: etcd answers one on a
    // stream that watches nothing yet too.
    if (response.created() && !checker.joinable() &&
        options.watch_check_every > absl::ZeroDuration()) {
      checker = std::thread([this, s = stream.get(), &options] {
        Check(s, options.watch_check_every, options.call_timeout);
      });
    }
    if (response.events_size() == 0) continue;  // created, progress
    std::vector<EtcdEvent> events;
    for (const etcdserverpb::Event& e : response.events()) {
      events.push_back(
          {e.type() == etcdserverpb::Event::DELETE, FromProto(e.kv())});
    }
    on_events(events, response.header().revision());
  }
  context_.TryCancel();  // a write the checker has posted returns
  {
    absl::MutexLock l(&mu_);
    closing_ = true;
    closed_.notify_all();  // under mu_: the checker may not be waiting yet
    if (silent_) {
      end = absl::UnavailableError(absl::StrCat(
          "etcd watch: nothing heard for ", absl::FormatDuration(silent_for_),
          ", a progress request unanswered for ",
          absl::FormatDuration(options.call_timeout)));
    }
  }
  if (checker.joinable()) checker.join();
  const grpc::Status s = stream->Finish();
  if (cancelled_.load()) return;  // the owner ended it
  if (end.ok()) end = Annotate(s, "watch");
  if (end.ok()) end = absl::UnavailableError("etcd watch: stream ended");
  // etcd cancels a watch whose token lapsed as not permitted.
  if (!token->empty() &&
      (TokenRefused(end) || absl::StrContains(end.message(), "permission"))) {
    client->DropToken(*token);
  }
  client->Failed(member, end.code());  // the owner's next watch goes on
  if (on_end) on_end(end);
}

void EtcdClient::Watcher::Heard() {
  absl::MutexLock l(&mu_);
  heard_ = Clock::Monotonic()->Now();
}

void EtcdClient::Watcher::Check(Stream* stream, absl::Duration every,
                                absl::Duration answer_within) {
  etcdserverpb::WatchRequest progress;
  progress.mutable_progress_request();
  absl::Time asked = absl::InfinitePast();  // the last question's time
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      for (;;) {
        if (closing_) return;
        const absl::Time now = Clock::Monotonic()->Now();
        const bool waiting = asked > heard_;  // no answer since the question
        if (waiting && now - asked >= answer_within) {
          silent_ = true;
          silent_for_ = now - heard_;
          context_.TryCancel();  // the reader reports it
          return;
        }
        if (!waiting && now - heard_ >= every) break;
        AwaitSteadily(
            &mu_, &closed_,
            (waiting ? asked + answer_within : heard_ + every) - now,
            [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_; });
      }
    }
    asked = Clock::Monotonic()->Now();
    if (!stream->Write(progress)) return;  // ended: the reader reports why
  }
}

EtcdClient::Watcher::~Watcher() {
  cancelled_.store(true);
  context_.TryCancel();
  if (thread_.joinable()) thread_.join();
}

}  // namespace asyncps
