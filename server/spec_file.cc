#include "server/spec_file.h"

#include <google/protobuf/util/message_differencer.h>

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "store/lr_schedule.h"

namespace asyncps {

const RecordFileFormat kSpecFileFormat = {
    /*magic=*/absl::string_view("APSSPEC\n", 8), /*version=*/1,
    /*oldest_readable=*/1, /*what=*/"spec file"};

std::string SpecFilePath(absl::string_view dir, int shard_index,
                         int num_shards) {
  return ShardFilePath(dir, shard_index, num_shards, "specs");
}

absl::Status WriteSpecFile(const std::string& path,
                           const SpecFileContents& contents, FileSystem* fs) {
  std::vector<std::string> records;
  CheckpointRecord record;
  *record.mutable_identity() = contents.identity;
  records.push_back(record.SerializeAsString());
  for (const TensorSpec& spec : contents.tensors) {
    *record.mutable_tensor() = spec;
    records.push_back(record.SerializeAsString());
  }
  for (const TableSpec& spec : contents.tables) {
    *record.mutable_table() = spec;
    records.push_back(record.SerializeAsString());
  }
  CheckpointEnd* end = record.mutable_end();
  end->set_tensors(static_cast<int32_t>(contents.tensors.size()));
  end->set_tables(static_cast<int32_t>(contents.tables.size()));
  records.push_back(record.SerializeAsString());
  return WriteRecordFile(path, kSpecFileFormat, records, fs).status();
}

absl::StatusOr<SpecFileContents> ReadSpecFile(const std::string& path,
                                              FileSystem* fs) {
  SpecFileContents out;
  bool ended = false;
  CheckpointRecord record;
  auto corrupt = [&path](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("spec file ", path, ": ", why));
  };
  absl::StatusOr<RecordFileInfo> file = ReadRecordFile(
      path, kSpecFileFormat,
      [&](absl::string_view bytes, int64_t n) -> absl::Status {
        if (!record.ParseFromArray(bytes.data(),
                                   static_cast<int>(bytes.size()))) {
          return corrupt(absl::StrCat("record ", n, " does not parse"));
        }
        if (ended) return corrupt("records follow the end record");
        if ((n == 0) != record.has_identity()) {
          return corrupt("the identity must be the first record, once");
        }
        switch (record.record_case()) {
          case CheckpointRecord::kIdentity:
            out.identity = record.identity();
            return absl::OkStatus();
          case CheckpointRecord::kTensor:
            out.tensors.push_back(record.tensor());
            return absl::OkStatus();
          case CheckpointRecord::kTable:
            out.tables.push_back(record.table());
            return absl::OkStatus();
          case CheckpointRecord::kEnd:
            ended = true;
            if (record.end().tensors() !=
                    static_cast<int32_t>(out.tensors.size()) ||
                record.end().tables() !=
                    static_cast<int32_t>(out.tables.size())) {
              return corrupt("the end record's counts do not match");
            }
            return absl::OkStatus();
          default:
            return corrupt(absl::StrCat("record ", n,
                                        " is of a kind a spec "
                                        "file does not hold"));
        }
      },
      fs);
  if (!file.ok()) return file.status();
  if (!ended) return corrupt("no end record (truncated?)");
  return out;
}

absl::StatusOr<int> ApplySpecFile(const SpecFileContents& specs,
                                  const std::string& path, ShardStore* store,
                                  std::vector<std::string>* without_values) {
  absl::flat_hash_map<std::string, TensorSpec> tensors;
  for (TensorSpec& t : store->ListTensors()) {
    std::string name = t.name();
    tensors.emplace(std::move(name), std::move(t));
  }
  absl::flat_hash_map<std::string, TableSpec> tables;
  for (TableSpec& t : store->tables().List()) {
    std::string name = t.name();
    tables.emplace(std::move(name), std::move(t));
  }
  CreateTensorRequest missing;
  // Schedules are compared apart: the file may hold a later schedule step
  // than the checkpoint (applied below), never a different created spec.
  auto created_spec = [](auto spec) {
    ClearSchedule(spec.mutable_optimizer());
    return spec;
  };
  std::vector<LearningRate> rates;
  absl::flat_hash_set<std::string> skipped;  // INIT_VALUES, no values
  auto add_schedule = [&rates](const auto& listed) {
    LearningRate rate;
    if (ScheduleOf(listed.name(), listed.optimizer(), &rate)) {
      rates.push_back(std::move(rate));
    }
  };
  auto differs = [&path](absl::string_view kind, const std::string& name) {
    return absl::DataLossError(absl::StrCat(
        "spec file ", path, ": ", kind, " ", QuoteName(name),
        " has another spec than the checkpoint's (files of two runs mixed?)"));
  };
  for (const TensorSpec& listed : specs.tensors) {
    add_schedule(listed);
    const TensorSpec spec = created_spec(listed);
    auto it = tensors.find(spec.name());
    if (it == tensors.end()) {
      if (spec.init() == INIT_VALUES) {
        // Its values were only ever in a checkpoint; none holds it.
        if (without_values != nullptr) without_values->push_back(spec.name());
        skipped.insert(spec.name());
        continue;
      }
      *missing.add_tensors() = spec;
    } else if (!google::protobuf::util::MessageDifferencer::Equals(
                   created_spec(it->second), spec)) {
      return differs("tensor", spec.name());
    }
  }
  for (const TableSpec& listed : specs.tables) {
    add_schedule(listed);
    const TableSpec spec = created_spec(listed);
    auto it = tables.find(spec.name());
    if (it == tables.end()) {
      *missing.add_tables() = spec;
    } else if (!google::protobuf::util::MessageDifferencer::Equals(
                   created_spec(it->second), spec)) {
      return differs("table", spec.name());
    }
  }
  int created = 0;
  if (missing.tensors_size() > 0 || missing.tables_size() > 0) {
    absl::StatusOr<CreateTensorResponse> r = store->CreateTensors(missing);
    if (!r.ok()) {
      return absl::Status(
          r.status().code(),
          absl::StrCat("spec file ", path, ": ", r.status().message()));
    }
    created = r->created();
  }
  // The schedules, of the tensors the store now holds (not those left
  // without values).
  SetLearningRateRequest schedule;
  for (LearningRate& rate : rates) {
    if (skipped.contains(rate.name())) continue;
    *schedule.add_rates() = std::move(rate);
  }
  bool changed = false;
  absl::StatusOr<SetLearningRateResponse> applied =
      store->SetLearningRates(schedule, &changed);
  if (!applied.ok()) {
    return absl::DataLossError(
        absl::StrCat("spec file ", path, ": ", applied.status().message()));
  }
  return created;
}

SpecJournal::SpecJournal(std::string path, CheckpointIdentity identity,
                         const ShardStore* store, FileSystem* fs)
    : path_(std::move(path)),
      identity_(std::move(identity)),
      store_(store),
      fs_(fs) {}

namespace {

// Whether `a` and `b` hold the same specs, in any order.
template <typename Spec>
bool SameSpecs(const std::vector<Spec>& a, const std::vector<Spec>& b) {
  if (a.size() != b.size()) return false;
  absl::flat_hash_map<std::string, const Spec*> by_name;
  for (const Spec& spec : b) by_name[spec.name()] = &spec;
  for (const Spec& spec : a) {
    auto it = by_name.find(spec.name());
    if (it == by_name.end() ||
        !google::protobuf::util::MessageDifferencer::Equals(spec,
                                                            *it->second)) {
      return false;
    }
  }
  return true;
}

// Whether `file` holds exactly `contents` (its write time aside).
bool SameContents(SpecFileContents file, const SpecFileContents& contents) {
  file.identity.set_unix_time_ms(contents.identity.unix_time_ms());
  return google::protobuf::util::MessageDifferencer::Equals(
             file.identity, contents.identity) &&
         SameSpecs(file.tensors, contents.tensors) &&
         SameSpecs(file.tables, contents.tables);
}

}  // namespace

void SpecJournal::Known(SpecFileContents on_disk) {
  absl::MutexLock l(&mu_);
  on_disk_ = std::move(on_disk);
}

absl::Status SpecJournal::Sync() {
  absl::MutexLock l(&mu_);
  SpecFileContents contents;
  contents.tensors = store_->ListTensors();
  contents.tables = store_->tables().List();
  // Specs are only ever added and schedules only ever advance, so the
  // count of specs and the sum of schedule steps change whenever the
  // store holds something the file does not.
  uint64_t held = contents.tensors.size() + contents.tables.size();
  for (const TensorSpec& t : contents.tensors) {
    held += static_cast<uint64_t>(t.optimizer().schedule_step());
  }
  for (const TableSpec& t : contents.tables) {
    held += static_cast<uint64_t>(t.optimizer().schedule_step());
  }
  if (held == durable_) return absl::OkStatus();
  contents.identity = identity_;
  contents.identity.set_unix_time_ms(absl::ToUnixMillis(absl::Now()));
  if (on_disk_.has_value()) {
    // A restarted shard's file often holds all it has already: leave it
    // (nothing to write, also on a full disk).
    const bool same = SameContents(*std::move(on_disk_), contents);
    on_disk_.reset();
    if (same) {
      durable_ = held;
      return absl::OkStatus();
    }
  }
  absl::Status s = WriteSpecFile(path_, contents, fs_);
  if (!s.ok()) return s;
  durable_ = held;
  return absl::OkStatus();
}

}  // namespace asyncps
