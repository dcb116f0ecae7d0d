#ifndef ASYNCPS_SERVING_PARAMETER_SOURCE_H_
#define ASYNCPS_SERVING_PARAMETER_SOURCE_H_

// Where ps_serve's parameters come from: the live shards of a training
// cluster, read without changing anything there (PsClientOptions::reader),
// or the checkpoint directory of a finished run.
//
// Example:
//
//   PsClientOptions options;
//   options.servers = {"10.0.0.1:7000", "10.0.0.2:7000"};
//   absl::StatusOr<std::unique_ptr<ParameterSource>> source =
//       MakeShardSource(std::move(options));  // or MakeCheckpointSource(dir)
//   if (!source.ok()) return source.status();
//   absl::StatusOr<ListTensorsResponse> list = (*source)->List();
//   if (!list.ok()) return list.status();
//   std::vector<float> w(784 * 10);  // "w"'s size, as the list says
//   std::vector<uint64_t> versions;
//   absl::Status s = (*source)->Read({{"w", w.data()}}, &versions);
//   std::vector<float> rows(2 * 16);  // two rows of table "emb", dim 16
//   if (s.ok()) s = (*source)->ReadRows("emb", {3, 70001}, rows.data());

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/ps_client.h"
#include "proto/asyncps.pb.h"
#include "server/file_system.h"

namespace asyncps {

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;

  // The dense tensors (slice_elems resolved) and sparse tables the source
  // holds.
  virtual absl::StatusOr<ListTensorsResponse> List() = 0;

  // Reads the full tensors named in `outs` into the caller's buffers (each
  // the tensor's num_elems floats); versions[i] receives the updates applied
  // to outs[i]'s tensor (the sum over its slices). Errors of the source
  // (UNAVAILABLE for shards that cannot be reached) leave the buffers
  // unspecified.
  virtual absl::Status Read(
      const std::vector<std::pair<std::string, float*>>& outs,
      std::vector<uint64_t>* versions) = 0;

  // Reads rows `ids` of sparse table `table` (repeats allowed) into out,
  // ids.size() x the table's dim floats in order, creating none: a row that
  // does not exist reads as its initial values (TableIds.peek). NOT_FOUND
  // for an unknown table; errors of the source.
  virtual absl::Status ReadRows(const std::string& table,
                                absl::Span<const uint64_t> ids, float* out) = 0;

  // "shards a:1,b:2" or "checkpoint DIR (run R)", for logs and status.
  virtual std::string Describe() const = 0;
};

// The live shards: `options.reader` is forced on, so reads register no
// worker and move no clock. Does not contact the shards.
absl::StatusOr<std::unique_ptr<ParameterSource>> MakeShardSource(
    PsClientOptions options);

struct CheckpointSourceOptions {
  std::string dir;  // the checkpoint directory; required
  // Every file is listed, stat'ed and read through it. Not owned; never
  // null; must outlive the source.
  FileSystem* fs = FileSystem::Default();
};

// The shard files of a checkpoint directory (shard_set.h), restored into
// memory here (errors of restoring them, naming the file), and again by a
// later List() when any of them changed (a run in progress wrote a newer
// checkpoint). A failed reload (a file that cannot be listed, stat'ed or
// read, or a corrupt one) is List's error and keeps what was loaded: Read
// and ReadRows go on serving it.
absl::StatusOr<std::unique_ptr<ParameterSource>> MakeCheckpointSource(
    const CheckpointSourceOptions& options);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_PARAMETER_SOURCE_H_
