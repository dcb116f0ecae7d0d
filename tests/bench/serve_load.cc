// serve_load: an open-loop load generator for ps_serve (or any KServe v2
// gRPC server). Requests leave at Poisson arrival times of the given rate,
// whatever the answers do (no coordinated omission: a request's latency
// runs from its scheduled time), spread over several connections, until a
// fixed count was sent; then it waits for the answers (each has a deadline)
// and prints one CSV row:
//
//   target_rps,achieved_rps,sent,ok,refused,failed,mean_ms,p50_ms,p99_ms,
//   mean_batch_rows
//
// achieved_rps counts answered-OK requests over the time from the first
// send to the last answer; refused counts RESOURCE_EXHAUSTED and
// DEADLINE_EXCEEDED, failed everything else. With --header the column
// names come first.
//
//   serve_load --target=127.0.0.1:8001 --rate=2000 --requests=4000

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/grpc_predict_v2.grpc.pb.h"

ABSL_FLAG(std::string, target, "", "host:port of the gRPC inference server.");
ABSL_FLAG(std::string, model, "mlp", "Model name.");
ABSL_FLAG(double, rate, 1000, "Requests per second (Poisson arrivals).");
ABSL_FLAG(int, requests, 2000, "Requests to send.");
ABSL_FLAG(int, connections, 8, "Separate connections to spread them over.");
ABSL_FLAG(int, rows, 1, "Feature rows per request.");
ABSL_FLAG(int, deadline_ms, 10000, "Deadline of each request.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the arrival times and features.");
ABSL_FLAG(bool, header, false, "Print the CSV header first.");

namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

struct Call {
  grpc::ClientContext ctx;
  ModelInferResponse response;
  absl::Time scheduled;
};

class Results {
 public:
  void Record(const grpc::Status& s, const Call& call) {
    const absl::Time now = absl::Now();
    absl::MutexLock l(&mu_);
    last_ = std::max(last_, now);
    ++answered_;
    if (s.ok()) {
      latencies_ms_.push_back(absl::ToDoubleMilliseconds(now - call.scheduled));
      auto it = call.response.parameters().find("batch_rows");
      if (it != call.response.parameters().end()) {
        batch_rows_ += it->second.int64_param();
      }
    } else if (s.error_code() == grpc::RESOURCE_EXHAUSTED ||
               s.error_code() == grpc::DEADLINE_EXCEEDED) {
      ++refused_;
    } else {
      ++failed_;
      if (first_error_.empty()) first_error_ = s.error_message();
    }
  }
  bool WaitAll(int n, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return answered_ == n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  void Print(double target, int sent, absl::Time first) {
    absl::MutexLock l(&mu_);
    std::vector<double>& v = latencies_ms_;
    std::sort(v.begin(), v.end());
    double mean = 0;
    for (double x : v) mean += x;
    const size_t ok = v.size();
    if (ok > 0) mean /= ok;
    auto q = [&](double p) {
      return ok == 0 ? 0.0 : v[std::min(ok - 1, static_cast<size_t>(p * ok))];
    };
    const double span = std::max(1e-9, absl::ToDoubleSeconds(last_ - first));
    std::printf("%.1f,%.1f,%d,%zu,%d,%d,%.3f,%.3f,%.3f,%.2f\n", target,
                ok / span, sent, ok, refused_, failed_, mean, q(0.5), q(0.99),
                ok == 0 ? 0.0 : static_cast<double>(batch_rows_) / ok);
    if (!first_error_.empty()) {
      std::fprintf(stderr, "serve_load: first error: %s\n",
                   first_error_.c_str());
    }
  }

 private:
  absl::Mutex mu_;
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  int64_t batch_rows_ ABSL_GUARDED_BY(mu_) = 0;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

int Run() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const double rate = absl::GetFlag(FLAGS_rate);
  const int n = absl::GetFlag(FLAGS_requests);
  const int conns = absl::GetFlag(FLAGS_connections);
  const int rows = absl::GetFlag(FLAGS_rows);
  if (target.empty() || !(rate > 0) || n < 1 || conns < 1 || rows < 1) {
    std::fprintf(stderr,
                 "serve_load: need --target, --rate > 0, --requests >= 1, "
                 "--connections >= 1, --rows >= 1\n");
    return 2;
  }
  std::vector<std::unique_ptr<GRPCInferenceService::Stub>> stubs;
  for (int c = 0; c < conns; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("asyncps.serve_load.connection", c);
    stubs.push_back(GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), args)));
  }
  // The model's input width.
  inference::ModelMetadataRequest meta_request;
  meta_request.set_name(absl::GetFlag(FLAGS_model));
  inference::ModelMetadataResponse meta;
  grpc::ClientContext meta_ctx;
  meta_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  meta_ctx.set_wait_for_ready(true);
  grpc::Status s = stubs[0]->ModelMetadata(&meta_ctx, meta_request, &meta);
  if (!s.ok() || meta.inputs_size() != 1 || meta.inputs(0).shape_size() != 2) {
    std::fprintf(stderr, "serve_load: ModelMetadata: %s\n",
                 s.error_message().c_str());
    return 1;
  }
  const int64_t dim = meta.inputs(0).shape(1);
  absl::BitGen gen(std::seed_seq{absl::GetFlag(FLAGS_seed)});
  constexpr int kDistinct = 64;
  std::vector<ModelInferRequest> requests(kDistinct);
  for (ModelInferRequest& r : requests) {
    r.set_model_name(meta.name());
    auto* in = r.add_inputs();
    in->set_name(meta.inputs(0).name());
    in->set_datatype("FP32");
    in->add_shape(rows);
    in->add_shape(dim);
    for (int64_t i = 0; i < rows * dim; ++i) {
      in->mutable_contents()->add_fp32_contents(absl::Uniform(gen, 0.0f, 1.0f));
    }
  }
  // Warm the connections.
  for (auto& stub : stubs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ModelInferResponse response;
    stub->ModelInfer(&ctx, requests[0], &response).IgnoreError();
  }

  Results results;
  const absl::Duration deadline =
      absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms));
  const absl::Time first = absl::Now();
  absl::Time at = first;
  for (int i = 0; i < n; ++i) {
    at += absl::Seconds(absl::Exponential<double>(gen, rate));
    // No spinning: the generator shares the machine with the server. A
    // late wake-up sends the requests due since at once (still counted
    // from their scheduled times).
    const absl::Duration ahead = at - absl::Now();
    if (ahead > absl::ZeroDuration()) absl::SleepFor(ahead);
    auto* call = new Call;
    call->scheduled = at;
    call->ctx.set_deadline(absl::ToChronoTime(at + deadline));
    stubs[i % conns]->async()->ModelInfer(
        &call->ctx, &requests[i % kDistinct], &call->response,
        [call, &results](grpc::Status status) {
          results.Record(status, *call);
          delete call;
        });
  }
  // gRPC's threads may still be inside the last callbacks (unlocking
  // `results`) when the wait ends, so nothing here is destroyed: the
  // process ends without running destructors.
  if (!results.WaitAll(n, deadline + absl::Seconds(30))) {
    std::fprintf(stderr, "serve_load: answers missing after the deadline\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (absl::GetFlag(FLAGS_header)) {
    std::printf(
        "target_rps,achieved_rps,sent,ok,refused,failed,mean_ms,p50_ms,"
        "p99_ms,mean_batch_rows\n");
  }
  results.Print(rate, n, first);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
