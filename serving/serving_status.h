#ifndef ASYNCPS_SERVING_SERVING_STATUS_H_
#define ASYNCPS_SERVING_SERVING_STATUS_H_

// What a ps_serve process reports about itself: the Prometheus text of
// /metrics (the request, batch and latency families of ServingMetrics plus
// snapshot age, id and version, refresh failures, readiness, queue length
// and the batch timeout in effect) and a one-line status (GET /status).

#include <string>

#include "serving/batcher.h"
#include "serving/inference_handler.h"
#include "serving/parameter_source.h"
#include "serving/snapshot.h"

namespace asyncps {

class ServingStatus {
 public:
  // Nothing is owned; all must outlive this.
  ServingStatus(const InferenceHandler* handler, const Batcher* batcher,
                const SnapshotKeeper* snapshots, const ParameterSource* source)
      : handler_(handler),
        batcher_(batcher),
        snapshots_(snapshots),
        source_(source) {}

  std::string Metrics() const;
  // "ready model mlp snapshot 12 (version 3456, age 0.8 s) from shards ...;
  //  queue 0, timeout 120us, requests ok 900 ..., p50 1.2 ms p99 4.1 ms"
  std::string Line() const;

 private:
  const InferenceHandler* const handler_;
  const Batcher* const batcher_;
  const SnapshotKeeper* const snapshots_;
  const ParameterSource* const source_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_SERVING_STATUS_H_
