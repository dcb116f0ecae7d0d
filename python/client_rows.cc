// Client's calls on sparse embedding tables: create_tables, pull_rows,
// push_rows, assign_rows, and what the rows pulls read (for push_rows).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "python/arrays.h"
#include "python/client.h"
#include "python/errors.h"
#include "python/specs.h"

namespace asyncps {
namespace python {

py::dict Client::CreateTables(const py::object& specs) {
  const std::vector<TableSpec> list =
      SpecList<TableSpec>(specs, "create_tables", "TableSpec");
  const absl::Status s = Call([&](PsClient& client) {
    absl::Status st = client.CreateTables(list);
    if (st.ok()) Learn(client, Names(list));
    return st;
  });
  if (!s.ok()) ThrowStatus(s);
  return Known(Names(list));
}

py::dict Client::PullRows(const py::object& ids, std::optional<int64_t> clock,
                          bool peek) {
  CheckDict(ids, "pull_rows");
  std::vector<py::array_t<uint64_t>> keep;
  std::vector<RowsQuery> queries;
  py::dict out;
  for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(ids)) {
    const std::string name = KeyName(key, "pull_rows");
    const std::shared_ptr<const TableSpec> spec = KnownTable(name, "pull_rows");
    keep.push_back(CheckIds(value, name, "pull_rows"));
    const py::ssize_t n = keep.back().shape(0);
    py::array_t<float> rows({n, static_cast<py::ssize_t>(spec->dim())});
    RowsQuery q;
    q.table = name;
    q.ids = absl::MakeConstSpan(keep.back().data(), n);
    q.out = rows.mutable_data();
    q.peek = peek;
    queries.push_back(std::move(q));
    out[py::str(name)] = std::move(rows);
  }
  const int64_t c = clock.value_or(clock_);
  const absl::Status s = Call([&](PsClient& client) {
    std::unique_ptr<PsClient::PendingPull> pull =
        client.StartPullRows(c, c, queries);
    absl::Status st = pull->Wait();
    if (st.ok() && !peek) Remember(pull->read());
    return st;
  });
  if (!s.ok()) ThrowStatus(s);
  return out;
}

PushSummary Client::PushRows(const py::object& grads,
                             std::optional<int64_t> clock) {
  return SendRows(grads, clock, /*assign=*/false);
}

PushSummary Client::AssignRows(const py::object& values,
                               std::optional<int64_t> clock) {
  return SendRows(values, clock, /*assign=*/true);
}

PushSummary Client::SendRows(const py::object& grads,
                             std::optional<int64_t> clock, bool assign) {
  const char* method = assign ? "assign_rows" : "push_rows";
  const char* what = assign ? "values" : "gradients";
  CheckDict(grads, method);
  std::vector<py::array> keep;
  std::vector<RowsGrad> list;
  for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(grads)) {
    const std::string name = KeyName(key, method);
    const std::shared_ptr<const TableSpec> spec = KnownTable(name, method);
    if (!py::isinstance<py::tuple>(value) || py::len(value) != 2) {
      throw py::type_error(absl::StrCat(
          method, ": the value for table '", name, "' must be a tuple (ids, ",
          what, "), got ", std::string(py::repr(py::type::handle_of(value)))));
    }
    const py::tuple pair = py::reinterpret_borrow<py::tuple>(value);
    py::array_t<uint64_t> ids = CheckIds(pair[0], name, method);
    py::array g =
        CheckRowGrads(pair[1], name, ids.shape(0), spec->dim(), method, what);
    if (assign) {
      absl::flat_hash_set<uint64_t> distinct;
      distinct.reserve(ids.shape(0));
      for (py::ssize_t i = 0; i < ids.shape(0); ++i) {
        if (!distinct.insert(ids.data()[i]).second) {
          throw py::value_error(
              absl::StrCat(method, ": row ", ids.data()[i], " of table '", name,
                           "' given twice; nothing was sent"));
        }
      }
    }
    if (!AllFiniteArray(g)) {
      throw py::value_error(absl::StrCat(method, ": the ", what, " of table '",
                                         name,
                                         "' contain NaN or Inf; nothing "
                                         "was sent"));
    }
    RowsGrad rg;
    rg.table = name;
    rg.ids = absl::MakeConstSpan(ids.data(), ids.shape(0));
    rg.grads = static_cast<const float*>(g.data());
    list.push_back(std::move(rg));
    keep.push_back(std::move(ids));
    keep.push_back(std::move(g));
  }
  const int64_t c = clock.value_or(clock_);
  const absl::StatusOr<PushSummary> summary =
      Call([&](PsClient& client) -> absl::StatusOr<PushSummary> {
        if (assign) return client.StartAssignRows(c, list)->Wait();
        ReadSet read;
        {
          absl::MutexLock lock(&rows_mu_);
          read = rows_read_;
        }
        return client.StartPushRows(c, list, read)->Wait();
      });
  if (!summary.ok()) ThrowStatus(summary.status());
  return *summary;
}

std::shared_ptr<const TableSpec> Client::KnownTable(const std::string& name,
                                                    const char* method) {
  CheckOpen();
  absl::MutexLock lock(&specs_mu_);
  auto it = known_tables_.find(name);
  if (it == known_tables_.end()) {
    throw py::value_error(
        absl::StrCat(method, ": unknown table '", name,
                     "' (create_tables() it or wait_for() it first)"));
  }
  return it->second;
}

void Client::Remember(const ReadSet& read) {
  absl::MutexLock lock(&rows_mu_);
  for (const auto& [table, versions] : read.tables) {
    rows_read_.tables[table] = versions;
  }
  for (const auto& [shard, epoch] : read.epochs) {
    if (epoch != 0) rows_read_.epochs[shard] = epoch;
  }
}

}  // namespace python
}  // namespace asyncps
