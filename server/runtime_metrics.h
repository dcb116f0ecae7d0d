#ifndef ASYNCPS_SERVER_RUNTIME_METRICS_H_
#define ASYNCPS_SERVER_RUNTIME_METRICS_H_

// Runtime metrics of a shard for the Prometheus endpoint, kept outside
// the service code:
//   - RpcMetrics: per method, calls started, calls handled per status code
//     and a latency histogram, filled by a server interceptor
//     (InterceptorFactory) on every call. Names follow the widely used
//     go-grpc-prometheus families: grpc_server_started_total,
//     grpc_server_handled_total{grpc_code}, grpc_server_handling_seconds.
//   - AuthRefusals: calls refused for a missing or wrong cluster token
//     (asyncps_auth_refused_total{reason}), with a rate-limited log line.

#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// Thread-safe. Recording a call takes no lock once its method has been
// seen (relaxed atomics); rendering reads a consistent-enough snapshot
// (each number is exact; numbers of one method may be from moments
// microseconds apart).
class RpcMetrics {
 public:
  // Upper bounds (seconds) of the latency buckets; +Inf is implied.
  static const std::vector<double>& BucketBounds();

  RpcMetrics();
  ~RpcMetrics();
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;

  // A factory for ServerBuilder::experimental().SetInterceptorCreators: its
  // interceptors call Started and Handled for every call. The factory must
  // not outlive this object.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  InterceptorFactory();

  // `method` is gRPC's path "/package.Service/Method"; `type` "unary",
  // "client_stream", "server_stream" or "bidi_stream".
  void Started(absl::string_view method, absl::string_view type);
  void Handled(absl::string_view method, absl::string_view type,
               grpc::StatusCode code, absl::Duration elapsed);

  // Appends the three families in Prometheus text format 0.0.4; every
  // sample carries `labels` (already formatted, e.g. `shard="0"`) first.
  void AppendPrometheus(absl::string_view labels, std::string* out) const;

  // One method's numbers (defined in the .cc; used by the interceptor).
  struct Method;

 private:
  Method* Find(absl::string_view method, absl::string_view type);

  mutable absl::Mutex mu_;
  // Entries are never removed, so pointers to them stay valid.
  absl::flat_hash_map<std::string, std::unique_ptr<Method>> methods_
      ABSL_GUARDED_BY(mu_);
};

// Counts calls refused for their cluster token and logs them: the first
// refusal at once, then at most one line per `interval` with the number
// refused since the previous line. Thread-safe.
class AuthRefusals {
 public:
  AuthRefusals(std::shared_ptr<spdlog::logger> logger,
               absl::Duration interval = absl::Seconds(10));

  // `missing`: the call carried no token; otherwise a wrong one.
  void Record(bool missing);

  // asyncps_auth_refused_total{reason="missing_token"|"wrong_token"}.
  void AppendPrometheus(absl::string_view labels, std::string* out) const;

  uint64_t missing() const { return missing_.load(std::memory_order_relaxed); }
  uint64_t wrong() const { return wrong_.load(std::memory_order_relaxed); }

 private:
  const std::shared_ptr<spdlog::logger> logger_;
  const absl::Duration interval_;
  std::atomic<uint64_t> missing_{0};
  std::atomic<uint64_t> wrong_{0};
  absl::Mutex mu_;
  absl::Time last_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t unreported_missing_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unreported_wrong_ ABSL_GUARDED_BY(mu_) = 0;
};

// Metrics of this process, as Prometheus client libraries name them:
// process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds and
// process_start_time_seconds (from /proc; families whose source cannot be
// read are left out). Every sample carries `labels`.
void AppendProcessMetrics(absl::string_view labels, std::string* out);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_RUNTIME_METRICS_H_
