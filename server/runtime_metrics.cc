#include "server/runtime_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/accept_guard.h"
#include "common/request_guard.h"

namespace asyncps {

namespace {

constexpr int kNumCodes = 17;  // grpc::StatusCode 0..16

// Code names as go-grpc-prometheus writes them, so existing dashboards work.
const char* const kCodeNames[kNumCodes] = {"OK",
                                           "Canceled",
                                           "Unknown",
                                           "InvalidArgument",
                                           "DeadlineExceeded",
                                           "NotFound",
                                           "AlreadyExists",
                                           "PermissionDenied",
                                           "ResourceExhausted",
                                           "FailedPrecondition",
                                           "Aborted",
                                           "OutOfRange",
                                           "Unimplemented",
                                           "Internal",
                                           "Unavailable",
                                           "DataLoss",
                                           "Unauthenticated"};

const char* TypeName(grpc::experimental::ServerRpcInfo::Type type) {
  using Type = grpc::experimental::ServerRpcInfo::Type;
  switch (type) {
    case Type::UNARY:
      return "unary";
    case Type::CLIENT_STREAMING:
      return "client_stream";
    case Type::SERVER_STREAMING:
      return "server_stream";
    case Type::BIDI_STREAMING:
      return "bidi_stream";
  }
  return "unknown";
}

std::string Number(double v) { return absl::StrFormat("%.9g", v); }

}  // namespace

struct RpcMetrics::Method {
  std::string service;
  std::string name;
  std::string type;
  std::atomic<uint64_t> started{0};
  std::array<std::atomic<uint64_t>, kNumCodes> handled{};
  // buckets[i] counts calls with latency <= BucketBounds()[i] and above the
  // previous bound; the last one everything above the largest bound.
  std::vector<std::atomic<uint64_t>> buckets;
  std::atomic<uint64_t> sum_ns{0};

  explicit Method(size_t num_buckets) : buckets(num_buckets + 1) {}

  void Handled(grpc::StatusCode code, std::chrono::nanoseconds elapsed) {
    const int c = static_cast<int>(code);
    handled[c >= 0 && c < kNumCodes ? c : 2].fetch_add(
        1, std::memory_order_relaxed);
    const double seconds = elapsed.count() * 1e-9;
    const std::vector<double>& bounds = BucketBounds();
    size_t i = 0;
    while (i < bounds.size() && seconds > bounds[i]) ++i;
    buckets[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(
        static_cast<uint64_t>(std::max<int64_t>(0, elapsed.count())),
        std::memory_order_relaxed);
  }
};

// Times one call: from its creation (the call was matched to its method)
// to the moment its status is sent.
class RpcTimingInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit RpcTimingInterceptor(RpcMetrics::Method* method)
      : method_(method), start_(std::chrono::steady_clock::now()) {
    method_->started.fetch_add(1, std::memory_order_relaxed);
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      method_->Handled(methods->GetSendStatus().error_code(),
                       std::chrono::steady_clock::now() - start_);
    }
    methods->Proceed();
  }

 private:
  RpcMetrics::Method* const method_;
  const std::chrono::steady_clock::time_point start_;
};

namespace {

class RpcTimingFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  using Finder =
      std::function<RpcMetrics::Method*(absl::string_view, absl::string_view)>;
  explicit RpcTimingFactory(Finder find) : find_(std::move(find)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const char* method = info->method();
    if (method == nullptr) return nullptr;
    return new RpcTimingInterceptor(find_(method, TypeName(info->type())));
  }

 private:
  const Finder find_;
};

}  // namespace

RpcMetrics::RpcMetrics() = default;
RpcMetrics::~RpcMetrics() = default;

const std::vector<double>& RpcMetrics::BucketBounds() {
  // From 100 us (a small unary call on loopback) to a minute (the longest
  // SSP/BSP pull wait by default).
  static const auto* bounds = new std::vector<double>{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *bounds;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetrics::InterceptorFactory() {
  return std::make_unique<RpcTimingFactory>(
      [this](absl::string_view method, absl::string_view type) {
        return Find(method, type);
      });
}

RpcMetrics::Method* RpcMetrics::Find(absl::string_view path,
                                     absl::string_view type) {
  {
    absl::ReaderMutexLock l(&mu_);
    auto it = methods_.find(path);
    if (it != methods_.end()) return it->second.get();
  }
  absl::MutexLock l(&mu_);
  std::unique_ptr<Method>& m = methods_[path];
  if (m == nullptr) {
    m = std::make_unique<Method>(BucketBounds().size());
    // "/package.Service/Method"
    std::vector<std::string> parts =
        absl::StrSplit(path.substr(path.empty() ? 0 : 1), '/');
    m->service = parts.size() == 2 ? parts[0] : "";
    m->name = parts.size() == 2 ? parts[1] : std::string(path);
    m->type = std::string(type);
  }
  return m.get();
}

void RpcMetrics::Started(absl::string_view method, absl::string_view type) {
  Find(method, type)->started.fetch_add(1, std::memory_order_relaxed);
}

void RpcMetrics::Handled(absl::string_view method, absl::string_view type,
                         grpc::StatusCode code, absl::Duration elapsed) {
  Find(method, type)->Handled(code, absl::ToChronoNanoseconds(elapsed));
}

void RpcMetrics::AppendPrometheus(absl::string_view labels,
                                  std::string* out) const {
  std::vector<const Method*> methods;
  {
    absl::ReaderMutexLock l(&mu_);
    for (const auto& [path, m] : methods_) methods.push_back(m.get());
  }
  std::sort(
      methods.begin(), methods.end(), [](const Method* a, const Method* b) {
        return std::tie(a->service, a->name) < std::tie(b->service, b->name);
      });
  auto method_labels = [&](const Method* m) {
    return absl::StrCat(labels, labels.empty() ? "" : ",", "grpc_type=\"",
                        m->type, "\",grpc_service=\"", m->service,
                        "\",grpc_method=\"", m->name, "\"");
  };
  absl::StrAppend(out,
                  "# HELP grpc_server_started_total Calls started on the "
                  "server, per method.\n"
                  "# TYPE grpc_server_started_total counter\n");
  for (const Method* m : methods) {
    absl::StrAppend(out, "grpc_server_started_total{", method_labels(m), "} ",
                    m->started.load(std::memory_order_relaxed), "\n");
  }
  absl::StrAppend(out,
                  "# HELP grpc_server_handled_total Calls completed on the "
                  "server, per method and status code.\n"
                  "# TYPE grpc_server_handled_total counter\n");
  for (const Method* m : methods) {
    for (int c = 0; c < kNumCodes; ++c) {
      const uint64_t n = m->handled[c].load(std::memory_order_relaxed);
      if (n == 0 && c != 0) continue;
      absl::StrAppend(out, "grpc_server_handled_total{", method_labels(m),
                      ",grpc_code=\"", kCodeNames[c], "\"} ", n, "\n");
    }
  }
  absl::StrAppend(out,
                  "# HELP grpc_server_handling_seconds Time from a call's "
                  "arrival at its method to its status being sent.\n"
                  "# TYPE grpc_server_handling_seconds histogram\n");
  const std::vector<double>& bounds = BucketBounds();
  for (const Method* m : methods) {
    const std::string l = method_labels(m);
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= bounds.size(); ++i) {
      cumulative += m->buckets[i].load(std::memory_order_relaxed);
      absl::StrAppend(out, "grpc_server_handling_seconds_bucket{", l, ",le=\"",
                      i < bounds.size() ? Number(bounds[i]) : "+Inf", "\"} ",
                      cumulative, "\n");
    }
    absl::StrAppend(out, "grpc_server_handling_seconds_sum{", l, "} ",
                    Number(m->sum_ns.load(std::memory_order_relaxed) * 1e-9),
                    "\n", "grpc_server_handling_seconds_count{", l, "} ",
                    cumulative, "\n");
  }
}

AuthRefusals::AuthRefusals(std::shared_ptr<spdlog::logger> logger,
                           absl::Duration interval)
    : logger_(std::move(logger)), interval_(interval) {}

void AuthRefusals::Record(bool missing) {
  (missing ? missing_ : wrong_).fetch_add(1, std::memory_order_relaxed);
  uint64_t report_missing = 0;
  uint64_t report_wrong = 0;
  {
    absl::MutexLock l(&mu_);
    ++(missing ? unreported_missing_ : unreported_wrong_);
    const absl::Time now = absl::Now();
    if (now - last_log_ < interval_) return;
    last_log_ = now;
    report_missing = std::exchange(unreported_missing_, 0);
    report_wrong = std::exchange(unreported_wrong_, 0);
  }
  if (logger_ != nullptr) {
    logger_->warn(
        "refused {} call(s) without a cluster token and {} with a wrong one "
        "(UNAUTHENTICATED; at most one such line per {})",
        report_missing, report_wrong, absl::FormatDuration(interval_));
  }
}

void AuthRefusals::AppendPrometheus(absl::string_view labels,
                                    std::string* out) const {
  const std::string sep = labels.empty() ? "" : ",";
  absl::StrAppend(
      out,
      "# HELP asyncps_auth_refused_total Calls refused UNAUTHENTICATED for "
      "their cluster token.\n"
      "# TYPE asyncps_auth_refused_total counter\n",
      "asyncps_auth_refused_total{", labels, sep, "reason=\"missing_token\"} ",
      missing(), "\n", "asyncps_auth_refused_total{", labels, sep,
      "reason=\"wrong_token\"} ", wrong(), "\n");
}

namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Gauge(std::string* out, absl::string_view name, absl::string_view type,
           absl::string_view help, absl::string_view labels,
           absl::string_view value) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type,
                  "\n", name, "{", labels, "} ", value, "\n");
}

}  // namespace

void AppendProcessMetrics(absl::string_view labels, std::string* out) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // /proc/self/stat: the fields after the command name's closing ')' start
  // with field 3 (state); utime is field 14, stime 15, starttime 22, vsize
  // 23, rss 24 (proc(5)).
  const std::string stat = ReadSmallFile("/proc/self/stat");
  const size_t paren = stat.rfind(')');
  std::vector<absl::string_view> f;
  if (paren != std::string::npos) {
    f = absl::StrSplit(absl::string_view(stat).substr(paren + 2), ' ');
  }
  auto field = [&f](int n, double* v) {
    const size_t i = static_cast<size_t>(n - 3);
    return i < f.size() && absl::SimpleAtod(f[i], v);
  };
  double utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
  if (field(14, &utime) && field(15, &stime) && ticks > 0) {
    Gauge(out, "process_cpu_seconds_total", "counter",
          "User and system CPU time spent, in seconds.", labels,
          Number((utime + stime) / ticks));
  }
  if (field(24, &rss) && page > 0) {
    Gauge(out, "process_resident_memory_bytes", "gauge",
          "Resident memory size in bytes.", labels, Number(rss * page));
  }
  if (field(23, &vsize)) {
    Gauge(out, "process_virtual_memory_bytes", "gauge",
          "Virtual memory size in bytes.", labels, Number(vsize));
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.' ? 1 : 0;
    closedir(dir);
    Gauge(out, "process_open_fds", "gauge",
          "Open file descriptors (sockets included).", labels,
          absl::StrCat(n - 1));  // without the one reading the directory
  }
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    Gauge(out, "process_max_fds", "gauge", "Limit on open file descriptors.",
          labels, Number(static_cast<double>(limit.rlim_cur)));
  }
  Gauge(out, "asyncps_connections_shed_total", "counter",
        "Connections closed unserved to keep descriptors free "
        "(common/accept_guard.h).",
        labels, absl::StrCat(ConnectionsShed()));
  const UnfinishedRequestStats unfinished = UnfinishedRequests();
  Gauge(out, "asyncps_unfinished_request_bytes", "gauge",
        "Bytes callers hold in gRPC calls whose message is not whole yet "
        "(common/request_guard.h).",
        labels, absl::StrCat(unfinished.pending_bytes));
  Gauge(out, "asyncps_request_connections_shut_total", "counter",
        "Connections shut for holding the most unfinished request bytes "
        "past the budget (common/request_guard.h).",
        labels, absl::StrCat(unfinished.connections_shut));
  Gauge(out, "asyncps_flood_connections_shut_total", "counter",
        "Connections shut for resetting more than 1000 calls a second, "
        "sending more than 10000 frames a second that do no call's work, or "
        "a header block over 256 KiB (common/request_guard.h).",
        labels, absl::StrCat(unfinished.floods_shut));
  double boot = 0;
  for (absl::string_view line :
       absl::StrSplit(ReadSmallFile("/proc/stat"), '\n')) {
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtod(line, &boot)) {
      break;
    }
  }
  if (boot > 0 && field(22, &start) && ticks > 0) {
    Gauge(out, "process_start_time_seconds", "gauge",
          "Start time of the process since the Unix epoch, in seconds.", labels,
          absl::StrFormat("%.2f", boot + start / ticks));
  }
}

}  // namespace asyncps
