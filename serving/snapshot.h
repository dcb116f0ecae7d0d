#ifndef ASYNCPS_SERVING_SNAPSHOT_H_
#define ASYNCPS_SERVING_SNAPSHOT_H_

// The parameters ps_serve computes with: immutable snapshots read from a
// ParameterSource, refreshed in the background into a second copy that is
// swapped in atomically. A batch takes one snapshot (a shared_ptr) and
// computes every row with it, so no answer mixes two snapshots; a snapshot
// lives until its last batch finishes.
//
// Example:
//
//   SnapshotKeeper snapshots(source, {"w1", "b1"}, absl::Seconds(1), logger);
//   absl::Status s = snapshots.Refresh();  // the first one, before serving
//   if (!s.ok()) return s;
//   snapshots.Start();  // then a refresh every second, in the background
//   ...
//   std::shared_ptr<const Snapshot> now = snapshots.Current();
//   const std::vector<float>& w1 = now->values[0];  // valid while `now` is
//   ...
//   snapshots.Stop();

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "serving/parameter_source.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct Snapshot {
  uint64_t id = 0;                         // 1, 2, ... in the order taken
  absl::Time taken;                        // when the read finished
  std::vector<std::string> names;          // the tensors, in model order
  std::vector<std::vector<float>> values;  // names[i]'s elements
  std::vector<uint64_t> versions;          // updates applied to names[i]
  uint64_t version_sum = 0;  // sum of versions: grows with training
};

// Keeps the current snapshot of tensors `names` and refreshes it every
// `refresh` (0 = read once). A failed refresh keeps the last snapshot (its
// age grows) and is counted and logged; the next refresh tries again. The
// tensors keep the sizes of the first snapshot (the served model is built
// for them): a source whose tensor changed size (another run's files, a
// re-created tensor) fails the refresh with FAILED_PRECONDITION naming it.
// Thread-safe.
class SnapshotKeeper {
 public:
  SnapshotKeeper(ParameterSource* source, std::vector<std::string> names,
                 absl::Duration refresh,
                 std::shared_ptr<spdlog::logger> logger);
  ~SnapshotKeeper();  // Stop()
  SnapshotKeeper(const SnapshotKeeper&) = delete;
  SnapshotKeeper& operator=(const SnapshotKeeper&) = delete;

  // Takes one snapshot now; OK or the source's error.
  absl::Status Refresh();
  // Starts the background refreshes (when `refresh` > 0).
  void Start();
  void Stop();

  // The current snapshot; nullptr before the first successful read.
  std::shared_ptr<const Snapshot> Current() const;
  uint64_t refresh_failures() const { return failures_.load(); }
  // The source's last error ("" after a success).
  std::string last_error() const;

 private:
  void Loop();

  ParameterSource* const source_;  // not owned
  const std::vector<std::string> names_;
  const absl::Duration refresh_;
  const std::shared_ptr<spdlog::logger> logger_;

  absl::Mutex read_mu_;  // one read at a time
  mutable absl::Mutex mu_;
  std::shared_ptr<const Snapshot> current_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(read_mu_) = 1;
  // Elements of names_[i], fixed by the first snapshot (empty before).
  std::vector<int64_t> sizes_ ABSL_GUARDED_BY(read_mu_);
  std::atomic<uint64_t> failures_{0};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_SNAPSHOT_H_
