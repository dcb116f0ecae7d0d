#ifndef ASYNCPS_CLIENT_STEP_SETS_H_
#define ASYNCPS_CLIENT_STEP_SETS_H_

// What one training step reads and writes through PsClient: a PullSet names
// the dense tensors and table rows a pull reads and where they go; a
// PushSet the gradients (or values) a push sends; a ReadSet says what a
// pull read (versions, shard epochs), so that the push computed from it is
// measured for staleness against it; a PushSummary says what the shards did.
//
// Example (one step of a model with a dense tensor and an embedding table):
//
//   PullSet in;
//   in.tensors = {{"fc/w", w.data()}};
//   in.rows = {{"emb", ids, emb.data()}};
//   std::unique_ptr<PsClient::PendingPull> pull =
//       client->StartPull(clock, clock, in);
//   if (absl::Status s = pull->Wait(); !s.ok()) return s;
//   ... compute gw and gemb from w and emb ...
//   PushSet out;
//   out.tensors = {{"fc/w", gw.data()}};
//   out.rows = {{"emb", ids, gemb.data()}};
//   absl::StatusOr<PushSummary> done =
//       client->StartPush(clock, out, pull->read())->Wait();
//
// The step's pull is one request per shard and its push one request per
// shard, with one sequence number: each shard applies its part of the step,
// tensors and rows, whole or not at all.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace asyncps {

// One table's rows to pull: `out` receives ids.size() x dim floats, row i
// for ids[i] (duplicates included). The ids and `out` must stay valid and
// untouched until the pull's Wait returns.
struct RowsQuery {
  std::string table;
  absl::Span<const uint64_t> ids;
  float* out = nullptr;
  // Read only (TableIds.peek): rows that do not exist are answered with
  // their initial values and not created.
  bool peek = false;
};

// One table's row gradients (or values) to push: grads holds ids.size() x
// dim floats, row i for ids[i]; the gradients of repeated ids are summed
// (on the client, before sending). Read only while the push starts.
struct RowsGrad {
  std::string table;
  absl::Span<const uint64_t> ids;
  const float* grads = nullptr;
};

// What one pull reads: whole tensors into the caller's buffers (each the
// tensor's num_elems floats) and rows of tables. A tensor or table at most
// once.
struct PullSet {
  std::vector<std::pair<std::string, float*>> tensors;
  std::vector<RowsQuery> rows;
};

// What one push sends: whole-tensor gradients (or values, for an assign)
// from the caller's memory, which stays unchanged until the push's Wait
// returns, and row gradients, copied before StartPush returns.
struct PushSet {
  std::vector<std::pair<std::string, const float*>> tensors;
  std::vector<RowsGrad> rows;
  // Set by a caller that has itself refused tensors holding NaN or Inf
  // (the Python binding, with its own error): the push does not scan them
  // a second time. Rows are checked either way.
  bool tensors_checked_finite = false;
};

// What a pull read, tensors and rows alike: every tensor slice's version,
// per table the version of every distinct row id, and every shard's epoch.
// A push names the read its gradients were computed from, so that shards
// measure staleness from it (a row id it does not hold counts as read at
// version 0) and refuse gradients read before they restarted.
struct ReadSet {
  struct Table {
    absl::flat_hash_map<uint64_t, uint32_t> index;  // id -> versions index
    std::vector<uint64_t> versions;
  };
  // Tensor name -> version of each slice.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> versions;
  // Table name -> its rows' versions; immutable once read, shared between
  // copies.
  absl::flat_hash_map<std::string, std::shared_ptr<const Table>> tables;
  // Per shard read: the shard epoch it answered with (absent or 0: not
  // read).
  absl::flat_hash_map<int, uint64_t> epochs;
  uint64_t VersionOf(const std::string& table, uint64_t id) const;
  // Takes what `newer` read over what this one holds (a later pull of
  // some of the same tensors or tables).
  void Update(const ReadSet& newer);
};

// What the shards did with the slices of one tensor of a push.
struct TensorPushOutcome {
  int64_t applied = 0;
  int64_t refused_stale = 0;
  int64_t refused_restored = 0;
  uint64_t max_staleness = 0;
  double mean_staleness = 0;  // over applied and stale-refused slices
};

// What the shards did with the rows of a push, summed over its tables.
struct RowsPushOutcome {
  int64_t applied = 0;
  int64_t refused_stale = 0;
  int64_t refused_restored = 0;
};

// What the shards did with one push. The totals count slice updates and
// row updates alike (a push of only tensors counts slices, one of only rows
// counts distinct rows).
struct PushSummary {
  int64_t applied = 0;           // updates applied
  int64_t refused_stale = 0;     // refused as too stale
  int64_t refused_restored = 0;  // refused: read before a shard restarted
  int64_t duplicates = 0;        // shards that answered duplicate=true (a
                                 // retry of a push they had already applied)
  uint64_t max_staleness = 0;    // over the results returned
  double mean_staleness = 0;     // over applied and stale-refused updates
  // Per tensor (tensors whose shards answered duplicate=true have no
  // results, so they are missing or partial here).
  absl::flat_hash_map<std::string, TensorPushOutcome> tensors;
  RowsPushOutcome rows;      // the rows' part of the totals
  int64_t rows_created = 0;  // sparse rows the push created
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_STEP_SETS_H_
