// push_pull_bench: end-to-end push and pull throughput through PsClient
// against real ps_server processes on loopback, next to a raw gRPC baseline
// measured in the same run.
//
// For each shard count (--shards) the bench starts that many ps_server
// processes (separate processes, as in production: client and server CPU do
// not mix) and as many raw baseline servers (this same binary with
// --role=raw_server). For each payload size (--sizes, bytes of float32) it
// creates one SGD tensor and measures, interleaved in every repetition:
//   asyncps push  PsClient::Push of the whole tensor (cut into slices of the
//                 servers' --slice_elems, validated, applied, versioned), on
//                 the fast path unless --fast_path=false;
//   raw push      the same bytes in one `bytes` field of a unary call per
//                 server (tests/bench/raw_bench.proto); the server applies
//                 w -= lr*g over them;
//   asyncps pull  PsClient::Pull of the whole tensor into a caller buffer;
//   raw pull      the same bytes returned in one `bytes` field and copied
//                 into a caller buffer.
// Both sides build fresh messages for every call and copy the payload in and
// out exactly as PsClient does; with one server the raw client uses the
// blocking stub, with several it issues one callback call per server and
// waits for all (what PsClient does). MB/s counts payload bytes (1e6) moved
// per second; with 2 shards it is the aggregate over both. Every figure is
// the median of --reps runs of at least --min_seconds (or --max_iters calls).
//
// Output, one line per measurement, then the ratio:
//   shards=1 bytes=1048576 op=push impl=asyncps mb_per_s=1234.5 calls=...
//     client_cpu_s_per_gb=0.61 server_cpu_s_per_gb=0.55
//   shards=1 bytes=1048576 op=push ratio_asyncps_over_raw=0.87

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/port_file.h"
#include "common/net.h"
#include "tests/bench/raw_bench.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "client/ps_client.h"

ABSL_FLAG(std::string, role, "bench",
          "bench, or raw_server (internal: the raw baseline server)");
ABSL_FLAG(std::string, port_file, "",
          "raw_server: write the bound port here once serving");
ABSL_FLAG(std::string, ps_server, "",
          "path of the ps_server binary; empty = server/ps_server from this "
          "binary's runfiles");
ABSL_FLAG(std::string, server_args, "",
          "extra ps_server flags, comma-separated (e.g. --slice_elems=65536)");
ABSL_FLAG(std::string, sizes, "65536,1048576,4194304",
          "comma-separated payload sizes in bytes (multiples of 4)");
ABSL_FLAG(std::string, shards, "1,2", "comma-separated shard counts");
ABSL_FLAG(std::string, ops, "push,pull", "comma-separated: push, pull");
ABSL_FLAG(int, reps, 3, "timed runs per measurement (median reported)");
ABSL_FLAG(double, min_seconds, 1.0, "length of one timed run");
ABSL_FLAG(int, max_iters, 20000, "most calls in one timed run");
ABSL_FLAG(bool, tune_malloc, true,
          "call TuneMallocForLargeMessages() in the client and the raw "
          "servers (ps_server always does)");

namespace asyncps {
namespace {

using Clock = std::chrono::steady_clock;
using bench::Ack;
using bench::Blob;
using bench::PullBlob;
using bench::RawBench;

// ------------------------------------------------------------ raw server

// Holds a float buffer; Push applies w -= lr*g to its prefix, Pull returns
// a prefix. Thread-safe.
class RawService final : public RawBench::CallbackService {
 public:
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx,
                                 const Blob* request, Ack* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    const std::string& data = request->data();
    if (data.size() % sizeof(float) != 0) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "length not a multiple of 4"));
      return reactor;
    }
    const size_t n = data.size() / sizeof(float);
    const float* g = reinterpret_cast<const float*>(data.data());
    std::vector<float> copy;
    if (reinterpret_cast<uintptr_t>(g) % alignof(float) != 0) {
      copy.resize(n);
      std::memcpy(copy.data(), data.data(), data.size());
      g = copy.data();
    }
    {
      absl::MutexLock l(&mu_);
      if (w_.size() < n) w_.resize(n, 0.0f);
      float* w = w_.data();
      const float lr = 1e-6f;
      for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
    }
    response->set_bytes(data.size());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx,
                                 const PullBlob* request,
                                 Blob* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    const size_t n = request->bytes() / sizeof(float);
    if (n > static_cast<size_t>(kMaxMessageBytes / sizeof(float))) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "too large"));
      return reactor;
    }
    {
      absl::ReaderMutexLock l(&mu_);
      if (w_.size() >= n) {
        response->mutable_data()->assign(
            reinterpret_cast<const char*>(w_.data()), n * sizeof(float));
        reactor->Finish(grpc::Status::OK);
        return reactor;
      }
    }
    absl::MutexLock l(&mu_);
    if (w_.size() < n) w_.resize(n, 0.0f);
    response->mutable_data()->assign(reinterpret_cast<const char*>(w_.data()),
                                     n * sizeof(float));
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  absl::Mutex mu_;
  std::vector<float> w_ ABSL_GUARDED_BY(mu_);
};

int RawServerMain() {
  if (absl::GetFlag(FLAGS_tune_malloc)) TuneMallocForLargeMessages();
  RawService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "raw_server: cannot listen\n");
    return 1;
  }
  if (!WritePortFile(absl::GetFlag(FLAGS_port_file), port).ok()) {
    std::fprintf(stderr, "raw_server: cannot write the port file\n");
    return 1;
  }
  server->Wait();  // until SIGTERM ends the process
  return 0;
}

// ------------------------------------------------------------ processes

struct Server {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;
};

// Starts `binary args... --port_file=F` and waits for F to hold the port.
absl::StatusOr<Server> StartServer(const std::string& binary,
                                   std::vector<std::string> args,
                                   const std::string& stem) {
  const std::string base = testing::UniqueTmpPath(stem);
  const std::string port_file = base + ".port";
  args.push_back(absl::StrCat("--port_file=", port_file));
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> proc =
      testing::Subprocess::Start(binary, args, base + ".log");
  if (!proc.ok()) return proc.status();
  Server server;
  server.process = *std::move(proc);
  int port = 0;
  absl::Status s = testing::WaitFor(
      [&] {
        std::ifstream in(port_file);
        std::string content((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
        const size_t nl = content.find('\n');
        return nl != std::string::npos &&
               absl::SimpleAtoi(
                   absl::StripAsciiWhitespace(content.substr(0, nl)), &port);
      },
      absl::Seconds(30), absl::StrCat(stem, " port file"));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; log:\n",
                                               server.process->LogTail()));
  }
  std::remove(port_file.c_str());
  server.address = absl::StrCat("127.0.0.1:", port);
  return server;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// CPU seconds (user + system) of a process so far.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f =
      absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  // After "pid (comm) ", field 3 (state) is f[0]; utime, stime are 14, 15.
  double utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

// ------------------------------------------------------------ measuring

struct Sample {
  double mb_per_s = 0;
  int64_t calls = 0;
  double client_cpu_s_per_gb = 0;
  double server_cpu_s_per_gb = 0;
};

// Calls `op` (moving `bytes` payload bytes) for at least min_seconds or
// max_iters calls, after 2 untimed calls.
absl::StatusOr<Sample> Measure(const std::function<absl::Status()>& op,
                               int64_t bytes,
                               const std::vector<pid_t>& servers) {
  for (int i = 0; i < 2; ++i) {
    absl::Status s = op();
    if (!s.ok()) return s;
  }
  const double min_seconds = absl::GetFlag(FLAGS_min_seconds);
  const int max_iters = absl::GetFlag(FLAGS_max_iters);
  double server_cpu0 = 0;
  for (pid_t p : servers) server_cpu0 += ProcessCpuSeconds(p);
  const double client_cpu0 = SelfCpuSeconds();
  const Clock::time_point start = Clock::now();
  double elapsed = 0;
  int64_t calls = 0;
  while (calls < max_iters && elapsed < min_seconds) {
    absl::Status s = op();
    if (!s.ok()) return s;
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  double server_cpu = -server_cpu0;
  for (pid_t p : servers) server_cpu += ProcessCpuSeconds(p);
  const double gb = static_cast<double>(bytes) * calls / 1e9;
  Sample out;
  out.calls = calls;
  out.mb_per_s = gb * 1e3 / elapsed;
  out.client_cpu_s_per_gb = (SelfCpuSeconds() - client_cpu0) / gb;
  out.server_cpu_s_per_gb = server_cpu / gb;
  return out;
}

Sample MedianSample(std::vector<Sample> v) {
  auto med = [&](auto field) {
    std::vector<double> x;
    for (const Sample& s : v) x.push_back(s.*field);
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  Sample out;
  out.mb_per_s = med(&Sample::mb_per_s);
  out.client_cpu_s_per_gb = med(&Sample::client_cpu_s_per_gb);
  out.server_cpu_s_per_gb = med(&Sample::server_cpu_s_per_gb);
  for (const Sample& s : v) out.calls += s.calls;
  return out;
}

// The raw baseline client: one stub per raw server; a payload is split
// evenly (in floats) over the servers.
class RawClient {
 public:
  explicit RawClient(const std::vector<Server>& servers) {
    for (const Server& s : servers) {
      stubs_.push_back(RawBench::NewStub(MakeChannel(s.address)));
    }
  }

  absl::Status Push(const float* g, size_t n) {
    const size_t k = stubs_.size();
    if (k == 1) {
      Blob request;
      request.mutable_data()->assign(reinterpret_cast<const char*>(g),
                                     n * sizeof(float));
      Ack ack;
      grpc::ClientContext ctx;
      return ToAbsl(stubs_[0]->Push(&ctx, request, &ack));
    }
    std::vector<Blob> requests(k);
    std::vector<Ack> acks(k);
    for (size_t j = 0; j < k; ++j) {
      const size_t b = n * j / k, e = n * (j + 1) / k;
      requests[j].mutable_data()->assign(reinterpret_cast<const char*>(g + b),
                                         (e - b) * sizeof(float));
    }
    return FanOut([&](size_t j, grpc::ClientContext* ctx,
                      std::function<void(grpc::Status)> done) {
      stubs_[j]->async()->Push(ctx, &requests[j], &acks[j], std::move(done));
    });
  }

  absl::Status Pull(float* out, size_t n) {
    const size_t k = stubs_.size();
    std::vector<PullBlob> requests(k);
    std::vector<Blob> responses(k);
    for (size_t j = 0; j < k; ++j) {
      requests[j].set_bytes((n * (j + 1) / k - n * j / k) * sizeof(float));
    }
    absl::Status s;
    if (k == 1) {
      grpc::ClientContext ctx;
      s = ToAbsl(stubs_[0]->Pull(&ctx, requests[0], &responses[0]));
    } else {
      s = FanOut([&](size_t j, grpc::ClientContext* ctx,
                     std::function<void(grpc::Status)> done) {
        stubs_[j]->async()->Pull(ctx, &requests[j], &responses[j],
                                 std::move(done));
      });
    }
    if (!s.ok()) return s;
    for (size_t j = 0; j < k; ++j) {
      const size_t b = n * j / k;
      const std::string& data = responses[j].data();
      if (data.size() != requests[j].bytes()) {
        return absl::InternalError("raw pull returned a wrong length");
      }
      std::memcpy(out + b, data.data(), data.size());
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status ToAbsl(const grpc::Status& s) {
    return s.ok() ? absl::OkStatus()
                  : absl::UnknownError(
                        absl::StrCat("raw call failed: ", s.error_message()));
  }

  // Starts one call per server and waits for all of them.
  absl::Status FanOut(
      const std::function<void(size_t, grpc::ClientContext*,
                               std::function<void(grpc::Status)>)>& start) {
    const size_t k = stubs_.size();
    std::vector<grpc::ClientContext> ctx(k);
    absl::Mutex mu;
    size_t pending = k;
    grpc::Status error;
    for (size_t j = 0; j < k; ++j) {
      start(j, &ctx[j], [&](grpc::Status s) {
        absl::MutexLock l(&mu);
        if (!s.ok()) error = s;
        --pending;
      });
    }
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(
        +[](size_t* p) { return *p == 0; }, &pending));
    return ToAbsl(error);
  }

  std::vector<std::unique_ptr<RawBench::Stub>> stubs_;
};

std::vector<std::string> SplitList(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipWhitespace());
}

void PrintSample(int shards, int64_t bytes, const std::string& op,
                 const std::string& impl, const Sample& s) {
  std::printf(
      "shards=%d bytes=%lld op=%s impl=%s mb_per_s=%.1f calls=%lld "
      "client_cpu_s_per_gb=%.2f server_cpu_s_per_gb=%.2f\n",
      shards, static_cast<long long>(bytes), op.c_str(), impl.c_str(),
      s.mb_per_s, static_cast<long long>(s.calls), s.client_cpu_s_per_gb,
      s.server_cpu_s_per_gb);
  std::fflush(stdout);
}

absl::Status RunShards(int shards, const std::vector<int64_t>& sizes,
                       const std::vector<std::string>& ops) {
  std::string ps_server = absl::GetFlag(FLAGS_ps_server);
  if (ps_server.empty()) ps_server = testing::RunfilePath("server/ps_server");
  std::vector<Server> ps, raw;
  std::vector<pid_t> ps_pids, raw_pids;
  for (int i = 0; i < shards; ++i) {
    std::vector<std::string> args = {
        "--host=127.0.0.1", "--port=0", absl::StrCat("--shard_index=", i),
        absl::StrCat("--num_shards=", shards), "--log_level=warn"};
    for (const std::string& a : SplitList(absl::GetFlag(FLAGS_server_args))) {
      args.push_back(a);
    }
    absl::StatusOr<Server> s =
        StartServer(ps_server, args, absl::StrCat("ps_server_", i));
    if (!s.ok()) return s.status();
    ps_pids.push_back(s->process->pid());
    ps.push_back(*std::move(s));
    absl::StatusOr<Server> r = StartServer(
        SelfExe(),
        {"--role=raw_server",
         absl::StrCat("--tune_malloc=", absl::GetFlag(FLAGS_tune_malloc))},
        absl::StrCat("raw_server_", i));
    if (!r.ok()) return r.status();
    raw_pids.push_back(r->process->pid());
    raw.push_back(*std::move(r));
  }

  PsClientOptions options;
  for (const Server& s : ps) options.servers.push_back(s.address);
  options.worker_id = 0;
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
  if (!client.ok()) return client.status();
  std::vector<TensorSpec> specs;
  for (int64_t bytes : sizes) {
    TensorSpec& spec = specs.emplace_back();
    spec.set_name(absl::StrCat("bench/", bytes));
    spec.add_shape(bytes / static_cast<int64_t>(sizeof(float)));
    spec.set_init(INIT_ZEROS);
    spec.mutable_optimizer()->set_type(OPT_SGD);
    spec.mutable_optimizer()->set_learning_rate(1e-6f);
  }
  absl::Status s = (*client)->CreateTensors(specs);
  if (!s.ok()) return s;
  RawClient raw_client(raw);

  int64_t clock = 0;
  for (int64_t bytes : sizes) {
    const std::string name = absl::StrCat("bench/", bytes);
    const size_t n = static_cast<size_t>(bytes) / sizeof(float);
    std::vector<float> grad(n, 1e-3f), params(n, 0.0f);
    for (const std::string& op : ops) {
      std::vector<Sample> mine, theirs;
      for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
        absl::StatusOr<Sample> a, b;
        if (op == "push") {
          a = Measure(
              [&]() -> absl::Status {
                return (*client)->Push(clock++, {{name, grad.data()}}).status();
              },
              bytes, ps_pids);
          b = Measure([&] { return raw_client.Push(grad.data(), n); }, bytes,
                      raw_pids);
        } else {
          a = Measure(
              [&] {
                return (*client)->Pull(clock, {{name, params.data()}});
              },
              bytes, ps_pids);
          b = Measure([&] { return raw_client.Pull(params.data(), n); }, bytes,
                      raw_pids);
        }
        if (!a.ok()) return a.status();
        if (!b.ok()) return b.status();
        mine.push_back(*a);
        theirs.push_back(*b);
      }
      const Sample m = MedianSample(mine), t = MedianSample(theirs);
      PrintSample(shards, bytes, op, "asyncps", m);
      PrintSample(shards, bytes, op, "raw", t);
      std::printf("shards=%d bytes=%lld op=%s ratio_asyncps_over_raw=%.2f\n",
                  shards, static_cast<long long>(bytes), op.c_str(),
                  m.mb_per_s / t.mb_per_s);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

int BenchMain() {
  if (absl::GetFlag(FLAGS_tune_malloc)) TuneMallocForLargeMessages();
  std::vector<int64_t> sizes;
  for (const std::string& s : SplitList(absl::GetFlag(FLAGS_sizes))) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v <= 0 || v % 4 != 0 ||
        v > kMaxMessageBytes / 2) {
      std::fprintf(stderr, "push_pull_bench: bad --sizes entry '%s'\n",
                   s.c_str());
      return 2;
    }
    sizes.push_back(v);
  }
  std::vector<int> shard_counts;
  for (const std::string& s : SplitList(absl::GetFlag(FLAGS_shards))) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < 1 || v > 16) {
      std::fprintf(stderr, "push_pull_bench: bad --shards entry '%s'\n",
                   s.c_str());
      return 2;
    }
    shard_counts.push_back(v);
  }
  const std::vector<std::string> ops = SplitList(absl::GetFlag(FLAGS_ops));
  for (const std::string& op : ops) {
    if (op != "push" && op != "pull") {
      std::fprintf(stderr, "push_pull_bench: unknown op '%s'\n", op.c_str());
      return 2;
    }
  }
  std::printf(
      "push_pull_bench reps=%d min_seconds=%.1f tune_malloc=%d "
      "server_args='%s'\n",
      absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_min_seconds),
      absl::GetFlag(FLAGS_tune_malloc),
      absl::GetFlag(FLAGS_server_args).c_str());
  for (int shards : shard_counts) {
    absl::Status s = RunShards(shards, sizes, ops);
    if (!s.ok()) {
      std::fprintf(stderr, "push_pull_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (absl::GetFlag(FLAGS_role) == "raw_server") {
    return asyncps::RawServerMain();
  }
  if (absl::GetFlag(FLAGS_role) != "bench") {
    std::fprintf(stderr, "push_pull_bench: unknown --role\n");
    return 2;
  }
  return asyncps::BenchMain();
}
