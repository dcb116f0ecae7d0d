#include "common/net.h"

#include <malloc.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace asyncps {

absl::StatusOr<std::vector<std::string>> ParseServerList(const std::string& s,
                                                         int num_shards) {
  if (num_shards < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shard count must be >= 0, got ", num_shards));
  }
  // Patterns first: "{i}" entries expand to one address per shard.
  std::vector<std::string> entries;
  for (absl::string_view part :
       absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (!absl::StrContains(part, "{i}")) {
      entries.emplace_back(part);
      continue;
    }
    if (num_shards == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server address '", part,
          "' has {i}, which needs the shard count (--num_shards)"));
    }
    for (int i = 0; i < num_shards; ++i) {
      entries.push_back(absl::StrReplaceAll(part, {{"{i}", absl::StrCat(i)}}));
    }
  }
  std::vector<std::string> out;
  for (absl::string_view part : entries) {
    absl::Status s = CheckHostPort(part);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("server address ", s.message()));
    }
    out.emplace_back(part);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("server list is empty");
  }
  if (num_shards > 0 && out.size() != static_cast<size_t>(num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the server list has ", out.size(),
        " address(es) but the shard count (--num_shards) is ", num_shards));
  }
  return out;
}

absl::Status CheckHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  bool ok = colon != absl::string_view::npos && colon > 0 &&
            absl::SimpleAtoi(address.substr(colon + 1), &port) && port > 0 &&
            port <= 65535;
  for (size_t i = 0; ok && i < colon; ++i) {
    const unsigned char c = static_cast<unsigned char>(address[i]);
    ok = c > ' ' && c < 0x7f && c != ',';
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", absl::CHexEscape(address.substr(0, 200)),
                   address.size() > 200 ? "..." : "",
                   "' is not host:port with port 1..65535"));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           int connection_id,
                                           const SecurityOptions& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Own subchannel pool + distinguishing arg = own TCP connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("asyncps.connection_id", connection_id);
  // A dead connection (peer gone, network cut) is noticed within about
  // keepalive time + timeout instead of the kernel's TCP timeouts; the
  // shards allow pings this often (server/ps_server.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Reconnect within half a second once a restarted shard listens again,
  // instead of sitting out gRPC's default backoff (up to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // gRPC's name for the connection attempt's timeout (common/net.h).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectTimeoutMs);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  // asyncps retries by itself (client/fanout.h), with its own rules.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      ChannelCredentials(security);
  // Null credentials make gRPC return a channel whose calls all fail.
  std::shared_ptr<grpc::ChannelCredentials> channel_creds =
      creds.ok() ? *std::move(creds) : nullptr;
  if (security.cluster_token.empty()) {
    return grpc::CreateCustomChannel(address, channel_creds, args);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(TokenInterceptorFactory(security.cluster_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, channel_creds, args, std::move(interceptors));
}

void TuneProcess() {
  TuneMallocForLargeMessages();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void TuneMallocForLargeMessages() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

bool StopSignalPending(const sigset_t& signals) {
  sigset_t pending;
  if (sigpending(&pending) != 0) return false;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&signals, sig) == 1 && sigismember(&pending, sig) == 1) {
      return true;
    }
  }
  return false;
}

}  // namespace asyncps
