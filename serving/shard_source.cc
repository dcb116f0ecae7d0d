// ParameterSource of the live shards (parameter_source.h).
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serving/parameter_source.h"

namespace asyncps {
namespace {

class ShardSource : public ParameterSource {
 public:
  ShardSource(std::unique_ptr<PsClient> client, std::string description)
      : client_(std::move(client)), description_(std::move(description)) {}

  absl::StatusOr<ListTensorsResponse> List() override {
    return client_->ListTensors();
  }

  absl::Status ReadRows(const std::string& table,
                        absl::Span<const uint64_t> ids, float* out) override {
    if (client_->FindTableSpec(table) == nullptr) {
      absl::Status s = client_->WaitForTensors({table}, absl::Seconds(10));
      if (!s.ok()) return s;
    }
    RowsQuery query;
    query.table = table;
    query.ids = ids;
    query.out = out;
    query.peek = true;
    return client_->StartPullRows(0, 0, {query})->Wait();
  }

  absl::Status Read(const std::vector<std::pair<std::string, float*>>& outs,
                    std::vector<uint64_t>* versions) override {
    std::vector<std::string> unknown;
    for (const auto& out : outs) {
      if (client_->FindSpec(out.first) == nullptr) unknown.push_back(out.first);
    }
    if (!unknown.empty()) {
      // Learns the layouts (once): the shards already hold the tensors.
      absl::Status s = client_->WaitForTensors(unknown, absl::Seconds(10));
      if (!s.ok()) return s;
    }
    auto pull = client_->StartPull(0, 0, outs);
    absl::Status s = pull->Wait();
    if (!s.ok()) return s;
    versions->clear();
    for (const auto& out : outs) {
      const std::vector<uint64_t>& v = pull->read().versions.at(out.first);
      versions->push_back(std::accumulate(v.begin(), v.end(), uint64_t{0}));
    }
    return absl::OkStatus();
  }

  std::string Describe() const override { return description_; }

 private:
  const std::unique_ptr<PsClient> client_;
  const std::string description_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterSource>> MakeShardSource(
    PsClientOptions options) {
  options.reader = true;
  const std::string description = absl::StrCat(
      options.router != nullptr ? "the shard map's primaries, at start "
                                : "shards ",
      absl::StrJoin(options.servers, ","));
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(std::move(options));
  if (!client.ok()) return client.status();
  return std::unique_ptr<ParameterSource>(
      new ShardSource(*std::move(client), description));
}

}  // namespace asyncps
