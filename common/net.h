#ifndef ASYNCPS_COMMON_NET_H_
#define ASYNCPS_COMMON_NET_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/security.h"

namespace asyncps {

// Splits "host:port,host:port" into addresses; each must have a non-empty
// host and a port in [1, 65535]. Names the offending entry on error.
// An entry with "{i}" stands for `num_shards` addresses, "{i}" replaced by
// 0 .. num_shards-1 (Kubernetes names: "job-shard-0-{i}.job:7000"); it
// needs num_shards > 0. A num_shards > 0 must equal the number of
// addresses (the list and the shard count are checked against each other).
absl::StatusOr<std::vector<std::string>> ParseServerList(const std::string& s,
                                                         int num_shards = 0);

// OK when `address` is "host:port": a non-empty host of printable
// characters other than spaces and commas, and a port in [1, 65535].
// INVALID_ARGUMENT naming the address (escaped) otherwise.
absl::Status CheckHostPort(absl::string_view address);

// Largest message either side accepts. Large tensors exceed gRPC's 4 MiB
// default; requests larger than this are refused by gRPC itself with
// RESOURCE_EXHAUSTED before reaching asyncps code.
inline constexpr int kMaxMessageBytes = 256 << 20;

// HTTP/2 keepalive of client channels: a ping after this long without
// traffic, and the connection counts as dead when the answer takes longer
// than the timeout.
inline constexpr int kKeepaliveTimeMs = 2000;
inline constexpr int kKeepaliveTimeoutMs = 3000;

// How long one connection attempt of a client channel may take: TCP
// connect, TLS handshake and the server's HTTP/2 SETTINGS. gRPC (1.51)
// takes it from GRPC_ARG_MIN_RECONNECT_BACKOFF_MS; at 100 ms, 1-6 of 1,500
// TLS connections in a row to a shard on a 2-core machine failed
// UNAVAILABLE ("connection attempt timed out before receiving SETTINGS
// frame"), and every one would across a link of 50 ms round trip. A host that
// drops packets is given up after this long; one that refuses at once is
// retried after the backoff (100 ms, up to 500 ms).
inline constexpr int kConnectTimeoutMs = 3000;

// A channel to `address` with asyncps's message limits, keepalive and quick
// reconnects (a restarted shard is found within half a second). Channels made
// with distinct `connection_id`s use separate TCP connections. `security` picks
// plain TCP or TLS (ChannelCredentials) and, with a cluster token, adds it to
// every call through a client interceptor (TokenInterceptorFactory), which,
// unlike gRPC call credentials, also works on plain TCP channels.
// If the TLS files cannot be read the channel fails every call (it never
// falls back to plain TCP); callers check the options first with
// ChannelCredentials() to report such errors (PsClient::Create does).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, int connection_id = 0,
    const SecurityOptions& security = SecurityOptions());

// Keeps large message buffers out of mmap/munmap so every message does not
// page-fault its memory in again (glibc returns >128 KiB blocks to the
// kernel by default). Call once at the start of main().
void TuneMallocForLargeMessages();

// What asyncps's binaries call first thing in main():
// TuneMallocForLargeMessages, and absl::Mutex's lock-cycle detection off.
// Debian's Abseil records a lock-order graph edge on every lock acquisition
// (gRPC's locks included), measured at 2-3% of a shard's CPU on the push path;
// lock order is checked by the clang thread-safety analysis and by the tests,
// which keep the detection on.
void TuneProcess();

// Blocks SIGINT and SIGTERM in the calling thread and in every thread it
// starts afterwards (gRPC's too), and returns that set, for the main thread
// to take a stop request with sigwait. Call in main() before any thread
// starts.
sigset_t BlockStopSignals();

// Whether one of `signals` (blocked) is pending for the process; it stays
// pending, for sigwait.
bool StopSignalPending(const sigset_t& signals);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_NET_H_
