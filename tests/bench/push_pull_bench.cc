// push_pull_bench: push and pull throughput of asyncps (PsClient against
// real ps_server processes on loopback) next to two ceilings measured in the
// same run:
//   tcp   a plain TCP socket server and client written here, moving the same
//         bytes with the same SGD apply (w -= lr * g) on the server, one
//         connection per client and server, one request at a time;
//   grpc  gRPC streams of raw ByteBuffers in asyncps's shape (DataStream on
//         a DrivenQueue, callback reactors on the server, --inflight calls,
//         --connections per server) with the
//         same apply and nothing else (grpc_ceiling.h).
// asyncps / grpc is what asyncps's own code costs; grpc / tcp is gRPC's.
//
// For each shard count (--shards) the bench starts that many ps_server
// processes and as many TCP and gRPC ceiling servers (this binary,
// --role=tcp_server and --role=grpc_server). For
// each payload size (--sizes, bytes of float32 per call, split evenly over
// the shards) and client count (--clients: separate client processes, this
// binary with --role=client, all at once), it measures, alternating in every
// repetition:
//   asyncps push  PsClient::StartPush of the whole tensor (cut into slices of
//                 the shards' --slice_elems, validated, applied, versioned),
//                 --inflight pushes in flight;
//   tcp push      the same bytes to each TCP server, which receives them into
//                 a buffer, applies w -= lr * g and answers one byte;
//   asyncps pull  PsClient::StartPull of the whole tensor into the caller's
//                 buffers, --inflight pulls in flight;
//   tcp pull      the same bytes from each TCP server into a caller buffer;
//   grpc push/pull  the same over the gRPC ceiling.
// The clients of one measurement start their timed loops together (after
// connecting); MB/s counts payload bytes (1e6) moved by all clients
// together over the time from the first client's start to the last one's end.
// CPU seconds per GB moved are the clients' (summed) and the servers';
// CPU microseconds per call the same CPU over the calls made (the servers'
// figure: every shard's part of one call together).
//
// Every implementation works on a model of --model_bytes per payload size
// (default 64 MiB): asyncps's shards hold it as payload-sized tensors, each
// ceiling server its share as one vector all its connections use, and each
// call addresses the next part in turn, so that parameters come from
// memory, not cache, as on a shard of a real model (asyncps's at most 4096
// tensors: small calls stay in cache there). --model_bytes=0 gives
// each connection one payload-sized vector (tensor) that stays in cache:
// the most generous ceiling.
// Every figure is the median of --reps runs of --seconds each.
//
// With --baseline, asyncps is measured on a second set of shards too
// (--baseline_ps_server, --baseline_server_args: the shard binary before a
// change, or a static map beside a slotted one), alternating with the
// others, and ratio_asyncps_over_baseline is printed.
//
// Output, one line per measurement, then the ratio:
//   shards=1 clients=1 bytes=1048576 op=push impl=asyncps mb_per_s=1234.5
//     calls_per_s=1177 client_cpu_s_per_gb=0.41 server_cpu_s_per_gb=0.38
//     client_cpu_us_per_call=429.9 server_cpu_us_per_call=398.5
//   shards=1 clients=1 bytes=1048576 op=push ratio_asyncps_over_tcp=0.57
//     ratio_asyncps_over_grpc=0.91 ratio_grpc_over_tcp=0.63

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/ps_client.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/port_file.h"
#include "tests/bench/ceiling_model.h"
#include "tests/bench/grpc_ceiling.h"
#include "tests/testing/subprocess.h"

ABSL_FLAG(std::string, role, "bench",
          "bench; tcp_server, grpc_server and client are the processes it "
          "starts; create makes the model of --sizes on --servers (to run "
          "clients against shards started by hand)");
ABSL_FLAG(std::string, port_file, "", "tcp_server: bound port goes here");
ABSL_FLAG(std::string, ps_server, "",
          "ps_server binary; empty = server/ps_server from the runfiles");
ABSL_FLAG(std::string, server_args, "",
          "extra ps_server flags, comma-separated");
ABSL_FLAG(bool, baseline, false,
          "also measure asyncps on shards of --baseline_ps_server started "
          "with --baseline_server_args, alternating with the others in every "
          "repetition (e.g. the shard binary before a change, or another "
          "map), and print asyncps / baseline");
ABSL_FLAG(std::string, baseline_ps_server, "",
          "with --baseline: its ps_server binary; empty = --ps_server");
ABSL_FLAG(std::string, baseline_server_args, "",
          "with --baseline: its shards' extra flags, comma-separated");
ABSL_FLAG(std::string, sizes, "1048576,4194304",
          "payload bytes per call (multiples of 4), comma-separated");
ABSL_FLAG(std::string, shards, "1,2", "shard counts, comma-separated");
ABSL_FLAG(std::string, clients, "1,2", "client process counts");
ABSL_FLAG(std::string, ops, "push,pull", "push and/or pull");
ABSL_FLAG(int, reps, 3, "timed runs per figure (median reported)");
ABSL_FLAG(double, seconds, 1.5, "length of one timed run");
ABSL_FLAG(int, inflight, 2, "asyncps: calls in flight per client");
ABSL_FLAG(int, connections, 2, "asyncps: connections per shard");
ABSL_FLAG(int64_t, model_bytes, int64_t{64} << 20,
          "the model every implementation works on, per payload size: "
          "asyncps holds it as payload-sized tensors, the ceiling servers "
          "as one vector shared by their connections, and each call "
          "addresses the next payload-sized part in turn (out of cache, as "
          "a real model); 0 = one payload-sized tensor or vector per "
          "connection (in cache: the most generous ceiling)");
// --role=client
ABSL_FLAG(std::string, impl, "asyncps", "client: asyncps, tcp or grpc");
ABSL_FLAG(std::string, servers, "",
          "client, create: addresses, comma-separated");
ABSL_FLAG(std::string, op, "push", "client: push or pull");
ABSL_FLAG(int64_t, bytes, 1 << 20, "client: payload bytes per call");
ABSL_FLAG(int, worker_id, 0, "client: worker id");
ABSL_FLAG(int64_t, start_at_ns, 0,
          "client: steady-clock time (ns) at which the timed loop starts");

namespace asyncps {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds on the steady clock, which all processes of a host share.
double SteadySeconds(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

double SelfCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

// CPU seconds (user + system) of another process so far.
double ProcessCpuSeconds(pid_t pid) {
  absl::StatusOr<testing::ProcessResources> r =
      testing::ReadProcessResources(pid);
  return r.ok() ? r->cpu_seconds : 0;
}

std::vector<int64_t> Ints(const std::string& csv) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

// The tensors asyncps holds for calls of `bytes`: --model_bytes of them
// (at least one, at most kMaxParts: 4-float calls over 64 MiB would be 4M
// tensors), each one call's payload.
constexpr int64_t kMaxParts = 4096;
std::vector<std::string> ModelParts(int64_t bytes) {
  const int64_t parts = std::clamp<int64_t>(
      absl::GetFlag(FLAGS_model_bytes) / bytes, 1, kMaxParts);
  std::vector<std::string> names;
  for (int64_t i = 0; i < parts; ++i) {
    names.push_back(absl::StrCat("t", bytes, "_", i));
  }
  return names;
}

// ------------------------------------------------------------ TCP ceiling

// The wire of the TCP ceiling: a 16-byte header {op (1 push, 2 pull), 0,
// payload bytes}, then for a push the payload (answered with one byte), for
// a pull the payload from the server.
struct TcpHeader {
  uint32_t op;
  uint32_t reserved;
  uint64_t bytes;
};

bool ReadAll(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_WAITALL);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteAll(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The model part a connection's call works on: of the model the server
// holds, or the connection's own (ceiling_model.h).
void ServeTcp(int fd, bench::CeilingModel* model) {
  std::vector<float> own, g;
  TcpHeader h;
  while (ReadAll(fd, &h, sizeof(h))) {
    const size_t n = h.bytes / sizeof(float);
    float* w = model->Next(n, &own);
    if (h.op == 1) {
      if (g.size() < n) g.resize(n);
      if (!ReadAll(fd, g.data(), h.bytes)) break;
      float* __restrict wp = w;
      const float* __restrict gp = g.data();
      const float lr = 1e-6f;
      for (size_t i = 0; i < n; ++i) wp[i] -= lr * gp[i];
      const char ack = 1;
      if (!WriteAll(fd, &ack, 1)) break;
    } else if (!WriteAll(fd, w, h.bytes)) {
      break;
    }
  }
  close(fd);
}

int TcpServerMain() {
  TuneProcess();
  static bench::CeilingModel model(
      static_cast<size_t>(absl::GetFlag(FLAGS_model_bytes)) / sizeof(float));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ||
      listen(fd, 16) ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)) {
    std::perror("tcp_server");
    return 1;
  }
  if (!WritePortFile(absl::GetFlag(FLAGS_port_file), ntohs(addr.sin_port))
           .ok()) {
    return 1;
  }
  for (;;) {
    const int c = accept(fd, nullptr, nullptr);
    if (c < 0) continue;
    const int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::thread(ServeTcp, c, &model).detach();
  }
}

int Connect(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  absl::SimpleAtoi(address.substr(colon + 1), &port);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// ------------------------------------------------------------ client

// Waits for the common start (--start_at_ns) and returns the time the
// timed loop starts.
Clock::time_point AwaitStart() {
  const Clock::time_point at{
      std::chrono::nanoseconds(absl::GetFlag(FLAGS_start_at_ns))};
  std::this_thread::sleep_until(at);
  return std::max(at, Clock::now());
}

// Runs one client's timed loop of --seconds from the common start; prints
// "bytes=<moved> start=<s> end=<s> cpu_s=<c>" (steady-clock seconds).
int ClientMain() {
  TuneProcess();
  const std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const bool push = absl::GetFlag(FLAGS_op) == "push";
  const auto length = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  const size_t n = static_cast<size_t>(bytes) / sizeof(float);
  const std::string impl = absl::GetFlag(FLAGS_impl);
  int64_t moved = 0;
  double cpu0 = 0;
  Clock::time_point start;

  if (impl == "tcp") {
    // One thread per server, each moving its share of every call.
    const size_t k = servers.size();
    std::vector<int> fds;
    for (const std::string& address : servers) {
      fds.push_back(Connect(address));
      if (fds.back() < 0) return 1;
    }
    std::vector<int64_t> per(k, 0);
    std::vector<std::thread> threads;
    start = AwaitStart();
    cpu0 = SelfCpuSeconds();
    for (size_t s = 0; s < k; ++s) {
      threads.emplace_back([&, s] {
        const int fd = fds[s];
        const size_t share = n / k + (s < n % k ? 1 : 0);
        std::vector<float> buf(share, 0.001f);
        TcpHeader h{push ? 1u : 2u, 0, share * sizeof(float)};
        while (Clock::now() < start + length) {
          if (!WriteAll(fd, &h, sizeof(h))) break;
          if (push) {
            char ack;
            if (!WriteAll(fd, buf.data(), h.bytes) || !ReadAll(fd, &ack, 1)) {
              break;
            }
          } else if (!ReadAll(fd, buf.data(), h.bytes)) {
            break;
          }
          per[s] += static_cast<int64_t>(h.bytes);
        }
        close(fd);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int64_t m : per) moved += m;
  } else if (impl == "grpc") {
    bench::GrpcCeilingLoad load;
    load.servers = servers;
    load.push = push;
    load.bytes = bytes;
    load.inflight = absl::GetFlag(FLAGS_inflight);
    load.connections = absl::GetFlag(FLAGS_connections);
    const Clock::time_point at{
        std::chrono::nanoseconds(absl::GetFlag(FLAGS_start_at_ns))};
    absl::StatusOr<int64_t> m = bench::RunGrpcCeilingClient(
        load, at, at + length, [&](Clock::time_point began) {
          start = began;
          cpu0 = SelfCpuSeconds();
        });
    if (!m.ok()) {
      std::fprintf(stderr, "grpc client: %s\n", m.status().ToString().c_str());
      return 1;
    }
    moved = *m;
  } else {
    PsClientOptions o;
    o.servers = servers;
    o.worker_id = absl::GetFlag(FLAGS_worker_id);
    o.connections_per_shard = absl::GetFlag(FLAGS_connections);
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(std::move(o));
    const std::vector<std::string> parts = ModelParts(bytes);
    if (!client.ok() ||
        !(*client)->WaitForTensors(parts, absl::Seconds(30)).ok()) {
      std::fprintf(stderr, "client: cannot reach the tensors t%ld_*\n",
                   static_cast<long>(bytes));
      return 1;
    }
    const int inflight = std::max(1, absl::GetFlag(FLAGS_inflight));
    std::vector<std::vector<float>> bufs(inflight,
                                         std::vector<float>(n, 0.001f));
    // Every part's versions, for the pushes to name what they read.
    std::vector<float> model(parts.size() * n);
    std::vector<std::pair<std::string, float*>> outs;
    for (size_t i = 0; i < parts.size(); ++i) {
      outs.emplace_back(parts[i], model.data() + i * n);
    }
    std::unique_ptr<PsClient::PendingPull> first =
        (*client)->StartPull(0, 0, outs);
    if (!first->Wait().ok()) return 1;
    const ReadSet read = first->read();
    model = std::vector<float>();
    std::deque<std::unique_ptr<PsClient::PendingPush>> pushes;
    std::deque<std::unique_ptr<PsClient::PendingPull>> pulls;
    start = AwaitStart();
    cpu0 = SelfCpuSeconds();
    // Each client starts at its own part, as the ceilings' shared counter
    // spreads concurrent calls.
    const size_t offset =
        static_cast<size_t>(absl::GetFlag(FLAGS_worker_id)) * 7919;
    for (int64_t k = 0; Clock::now() < start + length; ++k) {
      const std::string& name = parts[(offset + k) % parts.size()];
      if (push) {
        if (pushes.size() >= static_cast<size_t>(inflight)) {
          if (!pushes.front()->Wait().ok()) return 1;
          pushes.pop_front();
          moved += bytes;
        }
        pushes.push_back(
            (*client)->StartPush(0, {{name, bufs[0].data()}}, read));
      } else {
        if (pulls.size() >= static_cast<size_t>(inflight)) {
          if (!pulls.front()->Wait().ok()) return 1;
          pulls.pop_front();
          moved += bytes;
        }
        pulls.push_back(
            (*client)->StartPull(0, 0, {{name, bufs[k % inflight].data()}}));
      }
    }
    for (auto& p : pushes) {
      if (!p->Wait().ok()) return 1;
      moved += bytes;
    }
    for (auto& p : pulls) {
      if (!p->Wait().ok()) return 1;
      moved += bytes;
    }
  }
  std::printf("bytes=%ld start=%.6f end=%.6f cpu_s=%.4f\n",
              static_cast<long>(moved), SteadySeconds(start),
              SteadySeconds(Clock::now()), SelfCpuSeconds() - cpu0);
  return 0;
}

// ------------------------------------------------------------ driver

struct Server {
  std::unique_ptr<testing::Subprocess> process;
  std::string address;
};

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// Starts `binary` with `args` plus --port_file and waits for the port it
// bound (at most 30 s).
absl::StatusOr<Server> StartWithPortFile(const std::string& binary,
                                         std::vector<std::string> args,
                                         const std::string& what) {
  const std::string base = testing::UniqueTmpPath(what);
  args.push_back(absl::StrCat("--port_file=", base, ".port"));
  absl::StatusOr<std::unique_ptr<testing::Subprocess>> p =
      testing::Subprocess::Start(binary, args, base + ".log");
  if (!p.ok()) return p.status();
  int port = 0;
  absl::Status s = testing::WaitFor(
      [&] {
        std::ifstream in(base + ".port");
        std::string line;
        return std::getline(in, line) &&
               absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &port);
      },
      absl::Seconds(30), absl::StrCat(what, " port file"));
  if (!s.ok()) return s;
  return Server{*std::move(p), absl::StrCat("127.0.0.1:", port)};
}

// A TCP or gRPC ceiling server: this binary with --role=<role>.
// It holds its part of the model: --model_bytes / `shards`, as a shard
// holds its slices of the model's tensors.
absl::StatusOr<Server> StartCeilingServer(const std::string& role, int shards) {
  return StartWithPortFile(
      SelfExe(),
      {absl::StrCat("--role=", role),
       absl::StrCat("--model_bytes=",
                    absl::GetFlag(FLAGS_model_bytes) / shards)},
      role);
}

struct Figure {
  double mb_per_s = 0;
  double client_cpu_s_per_gb = 0;
  double server_cpu_s_per_gb = 0;
};

// Runs `clients` client processes at once; sums what they moved.
absl::StatusOr<Figure> RunClients(const std::string& impl,
                                  const std::vector<Server>& servers,
                                  const std::string& op, int64_t bytes,
                                  int clients, int* next_worker) {
  std::vector<std::string> addresses;
  for (const Server& s : servers) addresses.push_back(s.address);
  double server_cpu0 = 0;
  for (const Server& s : servers)
    server_cpu0 += ProcessCpuSeconds(s.process->pid());
  // Time enough for every client to connect (and asyncps's to find the
  // tensor) before the common start.
  const int64_t start_at_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          (Clock::now() + std::chrono::milliseconds(1500)).time_since_epoch())
          .count();
  std::vector<std::unique_ptr<testing::Subprocess>> procs;
  for (int c = 0; c < clients; ++c) {
    absl::StatusOr<std::unique_ptr<testing::Subprocess>> p =
        testing::Subprocess::Start(
            SelfExe(),
            {"--role=client",
             // The baseline's shards run asyncps too.
             absl::StrCat("--impl=", impl == "baseline" ? "asyncps" : impl),
             absl::StrCat("--servers=", absl::StrJoin(addresses, ",")),
             absl::StrCat("--op=", op), absl::StrCat("--bytes=", bytes),
             absl::StrCat("--worker_id=", (*next_worker)++),
             absl::StrCat("--start_at_ns=", start_at_ns),
             absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds)),
             absl::StrCat("--inflight=", absl::GetFlag(FLAGS_inflight)),
             absl::StrCat("--connections=", absl::GetFlag(FLAGS_connections)),
             absl::StrCat("--model_bytes=", absl::GetFlag(FLAGS_model_bytes))});
    if (!p.ok()) return p.status();
    procs.push_back(*std::move(p));
  }
  double moved = 0, first_start = 0, last_end = 0, client_cpu = 0;
  for (auto& p : procs) {
    absl::StatusOr<int> code = p->Wait(absl::Seconds(120));
    if (!code.ok() || *code != 0) {
      return absl::InternalError(
          absl::StrCat(impl, " client failed:\n", p->LogTail()));
    }
    const std::string log = p->ReadLog();
    const size_t at = log.rfind("bytes=");
    double b = 0, start = 0, end = 0, c = 0;
    if (at == std::string::npos ||
        std::sscanf(log.c_str() + at, "bytes=%lf start=%lf end=%lf cpu_s=%lf",
                    &b, &start, &end, &c) != 4) {
      return absl::InternalError(absl::StrCat("no result line:\n", log));
    }
    moved += b;
    first_start = first_start == 0 ? start : std::min(first_start, start);
    last_end = std::max(last_end, end);
    client_cpu += c;
  }
  double server_cpu = -server_cpu0;
  for (const Server& s : servers)
    server_cpu += ProcessCpuSeconds(s.process->pid());
  const double gb = moved / 1e9;
  return Figure{moved / 1e6 / (last_end - first_start), client_cpu / gb,
                server_cpu / gb};
}

Figure Median(std::vector<Figure> v) {
  auto med = [&](double Figure::*f) {
    std::vector<double> x;
    for (const Figure& s : v) x.push_back(s.*f);
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  return Figure{med(&Figure::mb_per_s), med(&Figure::client_cpu_s_per_gb),
                med(&Figure::server_cpu_s_per_gb)};
}

// The model of each size on the shards at `servers`: SGD tensors of one
// payload each (--sizes).
absl::Status CreateModel(const std::vector<std::string>& servers) {
  PsClientOptions o;
  o.servers = servers;
  o.worker_id = 1000;
  absl::StatusOr<std::unique_ptr<PsClient>> admin = PsClient::Connect(o);
  if (!admin.ok()) return admin.status();
  std::vector<TensorSpec> specs;
  for (int64_t bytes : Ints(absl::GetFlag(FLAGS_sizes))) {
    for (const std::string& name : ModelParts(bytes)) {
      TensorSpec t;
      t.set_name(name);
      t.add_shape(bytes / 4);
      t.mutable_optimizer()->set_learning_rate(1e-6f);
      specs.push_back(t);
    }
  }
  return (*admin)->CreateTensors(specs);
}

// `shards` ps_server processes of `binary` (empty: the runfile) with the
// extra flags `extra` (comma-separated), holding the model.
absl::Status StartShards(int shards, std::string binary,
                         const std::string& extra, std::vector<Server>* out) {
  if (binary.empty()) binary = testing::RunfilePath("server/ps_server");
  for (int i = 0; i < shards; ++i) {
    std::vector<std::string> args = {absl::StrCat("--shard_index=", i),
                                     absl::StrCat("--num_shards=", shards),
                                     "--port=0", "--log_level=warn"};
    for (absl::string_view a : absl::StrSplit(extra, ',', absl::SkipEmpty())) {
      args.emplace_back(a);
    }
    absl::StatusOr<Server> server =
        StartWithPortFile(binary, std::move(args), "ps_server");
    if (!server.ok()) return server.status();
    out->push_back(*std::move(server));
  }
  std::vector<std::string> addresses;
  for (const Server& s : *out) addresses.push_back(s.address);
  return CreateModel(addresses);
}

using Impl = std::pair<const char*, const std::vector<Server>*>;

// One figure per implementation for `op` at `bytes` from `clients`,
// alternating in every repetition, and their ratios.
absl::Status Measure(const std::vector<Impl>& impls, int shards,
                     const std::string& op, int64_t bytes, int64_t clients,
                     int* next_worker) {
  std::vector<std::vector<Figure>> runs(impls.size());
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    for (size_t i = 0; i < impls.size(); ++i) {
      absl::StatusOr<Figure> f = RunClients(impls[i].first, *impls[i].second,
                                            op, bytes, clients, next_worker);
      if (!f.ok()) return f.status();
      runs[i].push_back(*f);
    }
  }
  const std::string what = absl::StrCat("shards=", shards, " clients=", clients,
                                        " bytes=", bytes, " op=", op);
  std::vector<double> mb;
  for (size_t i = 0; i < impls.size(); ++i) {
    const Figure f = Median(runs[i]);
    mb.push_back(f.mb_per_s);
    // CPU per call: a call moves `bytes` (split over the shards); the
    // servers' figure is all shards' CPU for one client call.
    const double us_per_call_per_s_per_gb = static_cast<double>(bytes) / 1e3;
    std::printf(
        "%s impl=%s mb_per_s=%.1f calls_per_s=%.0f client_cpu_s_per_gb=%.3f "
        "server_cpu_s_per_gb=%.3f client_cpu_us_per_call=%.1f "
        "server_cpu_us_per_call=%.1f\n",
        what.c_str(), impls[i].first, f.mb_per_s,
        f.mb_per_s * 1e6 / static_cast<double>(bytes), f.client_cpu_s_per_gb,
        f.server_cpu_s_per_gb, f.client_cpu_s_per_gb * us_per_call_per_s_per_gb,
        f.server_cpu_s_per_gb * us_per_call_per_s_per_gb);
  }
  std::printf(
      "%s ratio_asyncps_over_tcp=%.3f ratio_asyncps_over_grpc=%.3f "
      "ratio_grpc_over_tcp=%.3f",
      what.c_str(), mb[0] / mb[1], mb[0] / mb[2], mb[2] / mb[1]);
  if (impls.size() > 3) {
    std::printf(" ratio_asyncps_over_baseline=%.3f", mb[0] / mb[3]);
  }
  std::printf("\n");
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status RunShards(int shards) {
  std::vector<Server> ps, tcp, grpc, baseline;
  if (absl::Status s = StartShards(shards, absl::GetFlag(FLAGS_ps_server),
                                   absl::GetFlag(FLAGS_server_args), &ps);
      !s.ok()) {
    return s;
  }
  if (absl::GetFlag(FLAGS_baseline)) {
    std::string binary = absl::GetFlag(FLAGS_baseline_ps_server);
    if (binary.empty()) binary = absl::GetFlag(FLAGS_ps_server);
    if (absl::Status s =
            StartShards(shards, binary,
                        absl::GetFlag(FLAGS_baseline_server_args), &baseline);
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < shards; ++i) {
    absl::StatusOr<Server> t = StartCeilingServer("tcp_server", shards);
    if (!t.ok()) return t.status();
    tcp.push_back(*std::move(t));
    absl::StatusOr<Server> g = StartCeilingServer("grpc_server", shards);
    if (!g.ok()) return g.status();
    grpc.push_back(*std::move(g));
  }
  // Alternating in every repetition: asyncps, tcp, grpc (, baseline).
  std::vector<Impl> impls = {{"asyncps", &ps}, {"tcp", &tcp}, {"grpc", &grpc}};
  if (!baseline.empty()) impls.push_back({"baseline", &baseline});
  int next_worker = 0;
  for (int64_t bytes : Ints(absl::GetFlag(FLAGS_sizes))) {
    for (int64_t clients : Ints(absl::GetFlag(FLAGS_clients))) {
      for (absl::string_view op :
           absl::StrSplit(absl::GetFlag(FLAGS_ops), ',', absl::SkipEmpty())) {
        if (absl::Status s = Measure(impls, shards, std::string(op), bytes,
                                     clients, &next_worker);
            !s.ok()) {
          return s;
        }
      }
    }
  }
  return absl::OkStatus();
}

int BenchMain() {
  std::printf(
      "push_pull_bench reps=%d seconds=%.1f inflight=%d connections=%d "
      "model_bytes=%ld server_args='%s' baseline=%d baseline_ps_server='%s' "
      "baseline_server_args='%s'\n",
      absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_seconds),
      absl::GetFlag(FLAGS_inflight), absl::GetFlag(FLAGS_connections),
      static_cast<long>(absl::GetFlag(FLAGS_model_bytes)),
      absl::GetFlag(FLAGS_server_args).c_str(),
      absl::GetFlag(FLAGS_baseline) ? 1 : 0,
      absl::GetFlag(FLAGS_baseline_ps_server).c_str(),
      absl::GetFlag(FLAGS_baseline_server_args).c_str());
  for (int64_t shards : Ints(absl::GetFlag(FLAGS_shards))) {
    absl::Status s = RunShards(static_cast<int>(shards));
    if (!s.ok()) {
      std::fprintf(stderr, "push_pull_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

// --role=create: the model of --sizes on the ps_servers at --servers, so
// that clients (--role=client) can be run against shards started by hand,
// e.g. under a profiler.
int CreateMain() {
  absl::Status s = CreateModel(
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty()));
  if (!s.ok()) {
    std::fprintf(stderr, "push_pull_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "tcp_server") return asyncps::TcpServerMain();
  if (role == "grpc_server") {
    return asyncps::bench::GrpcCeilingServerMain(
        absl::GetFlag(FLAGS_port_file), absl::GetFlag(FLAGS_model_bytes));
  }
  if (role == "client") return asyncps::ClientMain();
  if (role == "create") return asyncps::CreateMain();
  return asyncps::BenchMain();
}
