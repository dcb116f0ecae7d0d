#ifndef ASYNCPS_SERVING_INFERENCE_HANDLER_H_
#define ASYNCPS_SERVING_INFERENCE_HANDLER_H_

// One inference request's way through ps_serve, whichever protocol it came
// in: decoded and checked (inference_protocol.h), queued on the batcher
// with its deadline, its answer encoded, its outcome and latency counted.
// The gRPC service and the REST endpoint are thin layers over it.

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/grpc_predict_v2.pb.h"
#include "serving/batcher.h"
#include "serving/inference_protocol.h"
#include "serving/serving_metrics.h"
#include "serving/snapshot.h"

namespace asyncps {

class InferenceHandler {
 public:
  using Done =
      std::function<void(absl::StatusOr<inference::ModelInferResponse>)>;

  // Nothing is owned; all must outlive the handler.
  InferenceHandler(ModelSignature model, Batcher* batcher,
                   const SnapshotKeeper* snapshots, ServingMetrics* metrics)
      : model_(std::move(model)),
        batcher_(batcher),
        snapshots_(snapshots),
        metrics_(metrics) {}

  // Answers `request` through `done` (called once, maybe inline). The
  // deadline is the earlier of `deadline` and the request's timeout_ms.
  // `request` must stay valid until `done` is called.
  void Infer(const inference::ModelInferRequest& request, absl::Time deadline,
             Done done);

  // Has a snapshot to compute with.
  bool Ready() const { return snapshots_->Current() != nullptr; }
  const ModelSignature& model() const { return model_; }
  ServingMetrics* metrics() const { return metrics_; }

 private:
  const ModelSignature model_;
  Batcher* const batcher_;
  const SnapshotKeeper* const snapshots_;
  ServingMetrics* const metrics_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_INFERENCE_HANDLER_H_
