#ifndef ASYNCPS_SERVER_STATE_DIGEST_H_
#define ASYNCPS_SERVER_STATE_DIGEST_H_

// A digest of a shard's state, equal on two replicas exactly when they hold
// the same state: tensor and table specs, every slice (values, version,
// optimizer state), every row (id, version, last use, values, optimizer
// state) and every worker record (identity, clock, data position,
// de-duplication window), whatever order a capture lists them in (rows come
// in hash-table order, which differs between processes): each item is
// hashed on its own (FNV-1a, then mixed) and the hashes are summed. The
// capture's time and the checkpoint's identity record are left out.
//
// Example:
//   const uint64_t d = StateDigest(CaptureCheckpoint(store, workers, now));

#include <cstdint>

#include "server/checkpoint.h"

namespace asyncps {

uint64_t StateDigest(const CheckpointImage& image);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_STATE_DIGEST_H_
