#ifndef ASYNCPS_WORKER_ROW_STORE_H_
#define ASYNCPS_WORKER_ROW_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "proto/asyncps.pb.h"
#include "worker/store_calls.h"

namespace asyncps {

// Where a training loop's sparse embedding tables live: the cluster, or this
// process (the --local baseline), beside its dense tensors (a
// ParameterStore). Both run the same table code (store/table_store.h).
// Pulls and pushes are started and waited for separately, so that a loop
// can overlap them with its computation; semantics as PsClient's
// StartPullRows / StartPushRows.
//
// Thread-compatible: one training loop drives it.
class RowStore {
 public:
  // A pull or push in flight (worker/store_calls.h).
  using PendingPull = StorePull;
  using PendingPush = StorePush;

  virtual ~RowStore() = default;

  // Idempotent creation (the creating worker).
  virtual absl::Status CreateTables(const std::vector<TableSpec>& specs) = 0;
  // Waits until tables created by another worker exist.
  virtual absl::Status WaitForTables(const std::vector<std::string>& names,
                                     absl::Duration timeout) = 0;
  virtual std::unique_ptr<PendingPull> StartPullRows(
      int64_t clock, int64_t for_clock,
      const std::vector<RowsQuery>& queries) = 0;
  virtual std::unique_ptr<PendingPush> StartPushRows(
      int64_t clock, const std::vector<RowsGrad>& grads,
      const ReadSet& read) = 0;
};

// The cluster through `client`, which is not owned and must outlive the
// store (it is usually also the dense ParameterStore's).
std::unique_ptr<RowStore> MakeRemoteRowStore(PsClient* client);

// The tables in this process: one shard of one, no RPC; pulls and pushes
// run to completion when started.
std::unique_ptr<RowStore> MakeLocalRowStore();

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_ROW_STORE_H_
