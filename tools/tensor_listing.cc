#include "tools/tensor_listing.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/util/message_differencer.h"
#include "tools/doc.h"
#include "tools/status_table.h"

namespace asyncps {
namespace {

std::string Shape(const TensorSpec& spec) {
  return absl::StrCat("[", absl::StrJoin(spec.shape(), ","), "]");
}

// "INIT_GLOROT_UNIFORM" -> "glorot_uniform".
std::string ShortEnumName(const std::string& name, absl::string_view prefix) {
  absl::string_view n = name;
  if (absl::StartsWith(n, prefix)) n.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(n);
}

Doc ShardRow(int index, const std::string& address, bool ok,
             const std::string& error) {
  Doc row = Doc::Object();
  row.Set("index", Doc::Int(index))
      .Set("address", Doc::String(address))
      .Set("up", Doc::Bool(ok));
  if (!ok) row.Set("error", Doc::String(error));
  return row;
}

// A spec (TensorSpec or TableSpec) as first seen, the shards listing it and
// whether any shard's spec differs.
template <typename Spec>
struct Seen {
  Spec spec;
  int shards = 0;
  bool mismatch = false;
};

template <typename Spec>
void Note(const Spec& spec, std::map<std::string, Seen<Spec>>* seen) {
  auto [it, fresh] = seen->try_emplace(spec.name());
  if (fresh) {
    it->second.spec = spec;
  } else if (!google::protobuf::util::MessageDifferencer::Equals(
                 it->second.spec, spec)) {
    it->second.mismatch = true;
  }
  ++it->second.shards;
}

template <typename Spec>
Doc SeenRows(const std::map<std::string, Seen<Spec>>& seen) {
  Doc rows = Doc::Array();
  for (const auto& [name, s] : seen) {
    Doc row = Doc::Object();
    row.Set("spec", DocFromMessage(s.spec))
        .Set("shards", Doc::Int(s.shards))
        .Set("consistent", Doc::Bool(!s.mismatch));
    rows.Add(std::move(row));
  }
  return rows;
}

// The columns tensors and tables share: init, optimizer, and (wide) the
// init value, seed, learning rate and momentum.
std::vector<std::string> SpecColumns(Initializer init, float init_value,
                                     uint64_t seed, const OptimizerSpec& opt,
                                     bool wide, int shards, int up,
                                     bool mismatch,
                                     std::vector<std::string> middle) {
  std::vector<std::string> row = {
      ShortEnumName(Initializer_Name(init), "INIT_"),
      ShortEnumName(OptimizerType_Name(opt.type()), "OPT_")};
  for (std::string& m : middle) row.push_back(std::move(m));
  row.push_back(absl::StrCat(shards, "/", up, mismatch ? " MISMATCH" : ""));
  if (wide) {
    row.push_back(absl::StrFormat("%g", init_value));
    row.push_back(absl::StrCat(seed));
    row.push_back(absl::StrFormat("%g", opt.learning_rate()));
    row.push_back(absl::StrFormat("%g", opt.momentum()));
  }
  return row;
}

std::vector<std::string> Header(std::vector<std::string> columns, bool wide) {
  if (wide) {
    for (const char* h : {"INIT_VALUE", "SEED", "LR", "MOMENTUM"}) {
      columns.push_back(h);
    }
  }
  return columns;
}

}  // namespace

int PrintTensors(const std::vector<TensorListResult>& results, Format format) {
  int code = 0;
  int up = 0;
  std::map<std::string, Seen<TensorSpec>> tensors;
  std::map<std::string, Seen<TableSpec>> tables;
  for (const TensorListResult& r : results) {
    if (!r.up) {
      code = kExitDown;
      continue;
    }
    ++up;
    for (const TensorSpec& spec : r.tensors.tensors()) Note(spec, &tensors);
    for (const TableSpec& spec : r.tensors.tables()) Note(spec, &tables);
  }
  if (format == Format::kJson || format == Format::kYaml) {
    Doc shards = Doc::Array();
    for (const TensorListResult& r : results) {
      shards.Add(ShardRow(r.index, r.address, r.up, r.error));
    }
    Doc doc = Doc::Object();
    doc.Set("shards", std::move(shards))
        .Set("tensors", SeenRows(tensors))
        .Set("tables", SeenRows(tables));
    Print(Render(doc, format));
    return code;
  }
  std::string out = absl::StrCat(up, "/", results.size(), " shards answered\n");
  for (const TensorListResult& r : results) {
    if (!r.up) {
      absl::StrAppend(&out, "  shard ", r.index, " ", r.address, " DOWN  ",
                      r.error, "\n");
    }
  }
  const bool wide = format == Format::kWide;
  // Words left-aligned, numbers right-aligned.
  TextTable table(Header({"NAME", "SHAPE", "INIT", "OPTIMIZER", "ELEMS",
                          "SLICE_ELEMS", "SHARDS"},
                         wide),
                  /*left_columns=*/4);
  for (const auto& [name, seen] : tensors) {
    int64_t elems = 1;
    for (int64_t d : seen.spec.shape()) elems *= d;
    std::vector<std::string> row = {name, Shape(seen.spec)};
    for (std::string& col : SpecColumns(
             seen.spec.init(), seen.spec.init_value(), seen.spec.seed(),
             seen.spec.optimizer(), wide, seen.shards, up, seen.mismatch,
             {absl::StrCat(elems), absl::StrCat(seen.spec.slice_elems())})) {
      row.push_back(std::move(col));
    }
    table.AddRow(std::move(row));
  }
  absl::StrAppend(&out, table.Render());
  // Sparse tables: rows live on the shard their id hashes to, so every
  // shard lists every table.
  if (!tables.empty()) {
    TextTable rows(
        Header({"TABLE", "INIT", "OPTIMIZER", "DIM", "SHARDS"}, wide),
        /*left_columns=*/3);
    for (const auto& [name, seen] : tables) {
      std::vector<std::string> row = {name};
      for (std::string& col : SpecColumns(
               seen.spec.init(), seen.spec.init_value(), seen.spec.seed(),
               seen.spec.optimizer(), wide, seen.shards, up, seen.mismatch,
               {absl::StrCat(seen.spec.dim())})) {
        row.push_back(std::move(col));
      }
      rows.AddRow(std::move(row));
    }
    absl::StrAppend(&out, "\n", rows.Render());
  }
  Print(out);
  return code;
}

}  // namespace asyncps
