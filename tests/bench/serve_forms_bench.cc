// serve_forms_bench: what a request costs ps_serve in each form: REST with
// JSON values, REST with the binary tensor data extension (binary input and
// output), and gRPC (raw_input_contents). Closed loop: --connections
// threads, each on its own connection, send one request after another for
// --seconds per form and row count; prints one CSV row per point:
//
//   form,rows,requests,requests_per_s,server_cpu_us_per_request,
//   client_cpu_us_per_request
//
// Server CPU is read from /proc/<--server_pid>/stat (user + system) before
// and after; client CPU is this process's. Bodies are built once, so the
// client's figure is sending and receiving. A benchmark, not a test.
//
//   serve_forms_bench --http=127.0.0.1:8000 --grpc=127.0.0.1:8001 \
//       --server_pid=$(pgrep -n ps_serve) --rows=1,64 --seconds=5

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/grpc_predict_v2.grpc.pb.h"

ABSL_FLAG(std::string, http, "", "host:port of ps_serve's REST endpoint.");
ABSL_FLAG(std::string, grpc, "", "host:port of ps_serve's gRPC endpoint.");
ABSL_FLAG(int, server_pid, 0, "ps_serve's pid, for its CPU time.");
ABSL_FLAG(std::vector<std::string>, rows, std::vector<std::string>({"1", "64"}),
          "Rows per request.");
ABSL_FLAG(std::vector<std::string>, forms,
          std::vector<std::string>({"json", "binary", "grpc"}),
          "Forms to measure.");
ABSL_FLAG(int, features, 784, "Input features per row.");
ABSL_FLAG(int, connections, 4, "Concurrent connections.");
ABSL_FLAG(double, seconds, 5, "Measuring time per point.");

namespace {

double ProcessCpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis; utime and stime are
  // the 14th and 15th fields of the line.
  std::vector<std::string> f =
      absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
  double utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) ||
      !absl::SimpleAtod(f[12], &stime)) {
    return 0;
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::vector<float> Features(int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = 0.5f + 0.5f * std::sin(0.37f * i);
  return x;
}

struct Body {
  std::string bytes;
  httplib::Headers headers;
};

Body RestBody(const std::string& form, const std::vector<float>& x, int rows) {
  const std::string head =
      absl::StrCat(R"({"inputs":[{"name":"input","datatype":"FP32","shape":[)",
                   rows, ",", x.size() / rows, "],");
  Body b;
  if (form == "json") {
    std::vector<std::string> v;
    for (float f : x) v.push_back(absl::StrFormat("%.9g", f));
    b.bytes = absl::StrCat(head, R"("data":[)", absl::StrJoin(v, ","), "]}]}");
    return b;
  }
  b.bytes =
      absl::StrCat(head, R"("parameters":{"binary_data_size":)", x.size() * 4,
                   R"(}}],"parameters":{"binary_data_output":true}})");
  b.headers.emplace("Inference-Header-Content-Length",
                    std::to_string(b.bytes.size()));
  b.bytes.append(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  return b;
}

// Requests answered by one connection until `until`; -1 on a failure.
int64_t RestLoop(const std::string& form, const std::vector<float>& x, int rows,
                 absl::Time until) {
  const std::vector<std::string> hp =
      absl::StrSplit(absl::GetFlag(FLAGS_http), ':');
  httplib::Client client(hp[0], std::stoi(hp[1]));
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  client.set_read_timeout(30);
  const Body body = RestBody(form, x, rows);
  const char* type =
      form == "json" ? "application/json" : "application/octet-stream";
  int64_t n = 0;
  while (absl::Now() < until) {
    auto r =
        client.Post("/v2/models/mlp/infer", body.headers, body.bytes, type);
    if (!r || r->status != 200) return -1;
    ++n;
  }
  return n;
}

int64_t GrpcLoop(const std::vector<float>& x, int rows, absl::Time until) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection each
  auto stub =
      inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
          absl::GetFlag(FLAGS_grpc), grpc::InsecureChannelCredentials(), args));
  inference::ModelInferRequest request;
  request.set_model_name("mlp");
  auto* in = request.add_inputs();
  in->set_name("input");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(x.size() / rows);
  request.add_raw_input_contents(reinterpret_cast<const char*>(x.data()),
                                 x.size() * 4);
  int64_t n = 0;
  while (absl::Now() < until) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    inference::ModelInferResponse response;
    if (!stub->ModelInfer(&ctx, request, &response).ok()) return -1;
    ++n;
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int pid = absl::GetFlag(FLAGS_server_pid);
  std::printf(
      "form,rows,requests,requests_per_s,server_cpu_us_per_request,"
      "client_cpu_us_per_request\n");
  for (const std::string& rows_text : absl::GetFlag(FLAGS_rows)) {
    const int rows = std::stoi(rows_text);
    const std::vector<float> x = Features(rows * absl::GetFlag(FLAGS_features));
    for (const std::string& form : absl::GetFlag(FLAGS_forms)) {
      const int k = absl::GetFlag(FLAGS_connections);
      std::vector<int64_t> counts(k);
      const double server0 = ProcessCpuSeconds(pid), self0 = SelfCpuSeconds();
      const absl::Time start = absl::Now();
      const absl::Time until =
          start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
      std::vector<std::thread> threads;
      for (int t = 0; t < k; ++t) {
        threads.emplace_back([&, t] {
          counts[t] = form == "grpc" ? GrpcLoop(x, rows, until)
                                     : RestLoop(form, x, rows, until);
        });
      }
      for (std::thread& t : threads) t.join();
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
      const double server = ProcessCpuSeconds(pid) - server0;
      const double self = SelfCpuSeconds() - self0;
      int64_t n = 0;
      for (int64_t c : counts) {
        if (c < 0) {
          std::fprintf(stderr, "%s, %d rows: a request failed\n", form.c_str(),
                       rows);
          return 1;
        }
        n += c;
      }
      std::printf("%s,%d,%lld,%.0f,%.1f,%.1f\n", form.c_str(), rows,
                  static_cast<long long>(n), n / elapsed, server / n * 1e6,
                  self / n * 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}
