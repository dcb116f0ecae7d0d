#include "serving/inference_handler.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace asyncps {

void InferenceHandler::Infer(const inference::ModelInferRequest& request,
                             absl::Time deadline, Done done) {
  const absl::Time arrived = absl::Now();
  absl::StatusOr<DecodedRequest> decoded = DecodeInferRequest(model_, request);
  if (!decoded.ok()) {
    metrics_->RecordRequest(decoded.status(), absl::Now() - arrived);
    done(decoded.status());
    return;
  }
  deadline = std::min(deadline, arrived + decoded->timeout);
  const bool raw = decoded->raw_output;
  batcher_->Submit(
      std::move(decoded->x), std::move(decoded->ids), decoded->rows, deadline,
      [this, &request, raw, arrived,
       done = std::move(done)](absl::StatusOr<InferResult> result) {
        if (!result.ok()) {
          metrics_->RecordRequest(result.status(), absl::Now() - arrived);
          done(result.status());
          return;
        }
        inference::ModelInferResponse response;
        EncodeInferResponse(model_, request, *result, raw, &response);
        metrics_->RecordRequest(absl::OkStatus(), absl::Now() - arrived);
        done(std::move(response));
      });
}

}  // namespace asyncps
