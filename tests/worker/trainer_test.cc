// Spec for the MLP's training loop (worker/trainer.h) beyond what the
// multi-process training tests cover: how it ends on a backend error.

#include "worker/trainer.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/logging.h"
#include "data/idx_reader.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/faulty_backend.h"
#include "worker/local_store.h"
#include "worker/parameter_store.h"

namespace asyncps {
namespace {

TEST_CASE("training fails with the backend's error", "[mlp][errors]") {
  // The whole worker loop (worker/trainer.h) on an in-process store: a
  // device error in the third step ends training with that error.
  Dataset data;
  data.n = 64;
  data.dim = 6;
  data.images.assign(data.n * data.dim, 0.5f);
  for (int64_t i = 0; i < data.n; ++i) data.labels.push_back(i % 3);
  TrainerOptions o;
  o.layer_sizes = {6, 5, 3};
  o.batch_size = 8;
  o.epochs = 1;
  o.optimizer.set_type(OPT_SGD);
  o.optimizer.set_learning_rate(0.1f);
  o.evaluate = false;
  o.logger = NullLogger();
  std::FILE* progress = std::tmpfile();
  REQUIRE(progress != nullptr);
  o.progress = progress;
  FaultyBackend backend(
      "Gemm", 2 * 2 + 2 * 3 + 1,  // 2 forward + 3 backward GEMMs per step
      absl::InternalError("Gemm: cublasSgemm: CUBLAS_STATUS_EXECUTION_FAILED"));
  absl::StatusOr<std::unique_ptr<ParameterStore>> store = MakeLocalStore();
  REQUIRE(store.ok());
  absl::StatusOr<TrainResult> r = Train(o, data, data, store->get(), &backend);
  std::fclose(progress);
  INFO(r.status().ToString());
  CHECK(backend.calls() == 11);
  CHECK(absl::IsInternal(r.status()));
  CHECK(r.status().message() ==
        "Mlp forward layer 0: Gemm: cublasSgemm: "
        "CUBLAS_STATUS_EXECUTION_FAILED");
}

}  // namespace
}  // namespace asyncps
