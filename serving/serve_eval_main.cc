// ps_serve_eval: classifies the Fashion-MNIST test set through a serving
// process (inference.GRPCInferenceService, e.g. ps_serve) and prints the
// served accuracy, once or every --every_s while the model trains:
//
//   served accuracy 0.7712 (snapshot 14, version 90211, age 0.6 s)
//   ...
//   served test accuracy: 0.8474 (snapshot age 0 s)
//
// The last line (the only one with --every_s=0) is printed when --final_after
// names a file: the pass waits until that file exists (the launcher creates
// it when training ends) and for a snapshot read after that, so that it
// classifies with the final parameters.
//
// Exit status: 0 after the final pass (or SIGTERM during periodic passes),
// 1 when the server cannot be reached or answers with an error, 2 for bad
// flags.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cli.h"
#include "common/version.h"
#include "data/idx_reader.h"
#include "proto/grpc_predict_v2.grpc.pb.h"

ABSL_FLAG(std::string, target, "", "host:port of the serving process.");
ABSL_FLAG(std::string, model, "mlp", "Model name.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST directory (the test split is used).");
ABSL_FLAG(double, every_s, 0,
          "Seconds between passes while waiting for --final_after; 0 = no "
          "periodic passes.");
ABSL_FLAG(std::string, final_after, "",
          "Make the final pass once this file exists, with a snapshot read "
          "after it appeared; empty = one pass now.");
ABSL_FLAG(int, batch_rows, 64, "Rows per request.");
ABSL_FLAG(double, timeout_s, 120,
          "Give up (exit 1) when the final pass cannot be made within this.");

namespace asyncps {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

std::atomic<bool> g_stop{false};

struct Pass {
  double accuracy = 0;
  int64_t snapshot = 0;
  int64_t version = 0;
  double age_s = 0;
  absl::Time taken;  // when the last answer's snapshot was read
};

int64_t Param(const ModelInferResponse& r, const char* name) {
  auto it = r.parameters().find(name);
  return it == r.parameters().end() ? -1 : it->second.int64_param();
}

absl::StatusOr<Pass> Classify(GRPCInferenceService::Stub* stub,
                              const Dataset& test, int batch_rows) {
  int64_t correct = 0;
  Pass pass;
  for (int64_t start = 0; start < test.n; start += batch_rows) {
    const int64_t rows = std::min<int64_t>(batch_rows, test.n - start);
    ModelInferRequest request;
    request.set_model_name(absl::GetFlag(FLAGS_model));
    auto* in = request.add_inputs();
    in->set_name("input");
    in->set_datatype("FP32");
    in->add_shape(rows);
    in->add_shape(test.dim);
    request.add_raw_input_contents(
        reinterpret_cast<const char*>(test.images.data() + start * test.dim),
        rows * test.dim * sizeof(float));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ctx.set_wait_for_ready(true);
    ModelInferResponse response;
    grpc::Status s = stub->ModelInfer(&ctx, request, &response);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("ModelInfer: ", s.error_message()));
    }
    if (response.raw_output_contents_size() != 1) {
      return absl::InternalError("answer without raw output");
    }
    const std::string& out = response.raw_output_contents(0);
    const int64_t classes = out.size() / sizeof(float) / rows;
    const float* p = reinterpret_cast<const float*>(out.data());
    for (int64_t r = 0; r < rows; ++r) {
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (p[r * classes + c] > p[r * classes + best]) best = c;
      }
      correct += best == test.labels[start + r];
    }
    pass.snapshot = Param(response, "snapshot_id");
    pass.version = Param(response, "snapshot_version");
    const int64_t age_ms = Param(response, "snapshot_age_ms");
    pass.age_s = age_ms / 1e3;
    pass.taken = absl::Now() - absl::Milliseconds(age_ms);
  }
  pass.accuracy = static_cast<double>(correct) / test.n;
  return pass;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

int Main(int argc, char** argv) {
  ProgramInfo program;
  program.name = "ps_serve_eval";
  program.version = kVersion;
  program.flags_only = true;
  program.usage =
      "ps_serve_eval: classifies the Fashion-MNIST test set through a\n"
      "serving process and prints the served accuracy.\n\n"
      "  ps_serve_eval --target=127.0.0.1:8001\n"
      "  ps_serve_eval --target=h:p --every_s=5 --final_after=FILE";
  const ParseResult parsed = ParseProgramCommandLine(argc, argv, program);
  if (!parsed.command_line.has_value()) return parsed.exit_code;
  const std::string target = absl::GetFlag(FLAGS_target);
  const int batch_rows = absl::GetFlag(FLAGS_batch_rows);
  const double every = absl::GetFlag(FLAGS_every_s);
  if (target.empty() || batch_rows < 1 || !(every >= 0)) {
    std::fprintf(stderr,
                 "ps_serve_eval: need --target, --batch_rows >= 1 and "
                 "--every_s >= 0\n");
    return 2;
  }
  absl::StatusOr<Dataset> test =
      LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), Split::kTest);
  if (!test.ok()) {
    std::fprintf(stderr, "ps_serve_eval: %s\n",
                 test.status().ToString().c_str());
    return 2;
  }
  signal(SIGTERM, [](int) { g_stop.store(true); });
  auto stub = GRPCInferenceService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  const std::string final_after = absl::GetFlag(FLAGS_final_after);
  absl::Time next = absl::Now();
  while (!final_after.empty() && !Exists(final_after)) {
    if (g_stop.load()) return 0;
    if (every > 0 && absl::Now() >= next) {
      absl::StatusOr<Pass> p = Classify(stub.get(), *test, batch_rows);
      if (p.ok()) {
        std::printf(
            "served accuracy %.4f (snapshot %ld, version %ld, age %.1f s)\n",
            p->accuracy, static_cast<long>(p->snapshot),
            static_cast<long>(p->version), p->age_s);
        std::fflush(stdout);
      }
      next = absl::Now() + absl::Seconds(every);
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // The final pass: with a snapshot read after training ended.
  const absl::Time ended = absl::Now();
  const absl::Time give_up =
      ended + absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  for (;;) {
    absl::StatusOr<Pass> p = Classify(stub.get(), *test, batch_rows);
    if (!p.ok()) {
      std::fprintf(stderr, "ps_serve_eval: %s\n",
                   p.status().ToString().c_str());
      return 1;
    }
    if (final_after.empty() || p->taken >= ended) {
      std::printf("served test accuracy: %.4f (snapshot age %.0f s)\n",
                  p->accuracy, p->age_s);
      return 0;
    }
    if (absl::Now() >= give_up || g_stop.load()) {
      std::fprintf(stderr,
                   "ps_serve_eval: no snapshot newer than the end of training "
                   "within --timeout_s\n");
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) { return asyncps::Main(argc, argv); }
