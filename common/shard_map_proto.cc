#include "common/shard_map_proto.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {

void ShardMapToProto(const ShardMap& map, ShardMapProto* out) {
  out->Clear();
  out->set_epoch(map.epoch());
  out->set_num_shards(map.num_shards());
  out->set_num_slots(map.num_slots());
  std::string* owners = out->mutable_owners();
  owners->resize(2 * static_cast<size_t>(map.num_slots()));
  size_t i = 0;
  for (const uint16_t owner : map.owners()) {
    (*owners)[i++] = static_cast<char>(owner & 0xff);
    (*owners)[i++] = static_cast<char>(owner >> 8);
  }
}

absl::Status CheckRouted(const ShardMap& map, uint64_t routed) {
  absl::Status s = map.CheckRouted(routed);
  if (absl::IsUnavailable(s)) return WithServedMapEpoch(s, map.epoch());
  if (!absl::IsFailedPrecondition(s)) return s;
  ShardMapProto wire;
  ShardMapToProto(map, &wire);
  return WithRefusalMap(std::move(s), wire);
}

absl::Status WithRefusalMap(absl::Status status, const ShardMapProto& map) {
  status.SetPayload(kRoutedMapPayload, absl::Cord(map.SerializeAsString()));
  return status;
}

std::optional<ShardMapProto> RefusalMap(const absl::Status& status) {
  if (!absl::IsFailedPrecondition(status)) return std::nullopt;
  auto bytes = status.GetPayload(kRoutedMapPayload);
  if (!bytes.has_value()) return std::nullopt;
  ShardMapProto map;
  if (!map.ParseFromString(std::string(*bytes))) return std::nullopt;
  return map;
}

absl::Status WithServedMapEpoch(absl::Status status, uint64_t epoch) {
  status.SetPayload(kServedEpochPayload, absl::Cord(absl::StrCat(epoch)));
  return status;
}

std::optional<uint64_t> ServedMapEpoch(const absl::Status& status) {
  if (!absl::IsUnavailable(status)) return std::nullopt;
  auto text = status.GetPayload(kServedEpochPayload);
  uint64_t epoch = 0;
  if (!text.has_value() || !absl::SimpleAtoi(std::string(*text), &epoch) ||
      epoch == 0) {
    return std::nullopt;
  }
  return epoch;
}

absl::StatusOr<ShardMap> ShardMapFromProto(const ShardMapProto& proto) {
  if (proto.num_slots() == 0) {
    if (!proto.owners().empty() || proto.epoch() != ShardMap::kStaticEpoch) {
      return absl::InvalidArgumentError(
          absl::StrCat("a static shard map has epoch ", ShardMap::kStaticEpoch,
                       " and no owners; got epoch ", proto.epoch(), " and ",
                       proto.owners().size(), " bytes of owners"));
    }
    return ShardMap::Static(proto.num_shards());
  }
  if (proto.num_slots() < 0 || proto.num_slots() > ShardMap::kMaxSlots ||
      proto.owners().size() != 2 * static_cast<size_t>(proto.num_slots())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shard map of ", proto.num_slots(), " slots needs ",
                     2 * static_cast<int64_t>(proto.num_slots()),
                     " bytes of owners (at most ", ShardMap::kMaxSlots,
                     " slots); got ", proto.owners().size()));
  }
  std::vector<uint16_t> owners(static_cast<size_t>(proto.num_slots()));
  const std::string& bytes = proto.owners();
  for (size_t s = 0; s < owners.size(); ++s) {
    owners[s] = static_cast<uint16_t>(
        static_cast<uint8_t>(bytes[2 * s]) |
        static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * s + 1])) << 8);
  }
  return ShardMap::Slotted(proto.num_shards(), std::move(owners),
                           proto.epoch());
}

absl::StatusOr<ShardMap> ShardMapOr(const ShardMapProto& proto,
                                    int num_shards) {
  if (proto.num_shards() == 0 && proto.num_slots() == 0 &&
      proto.owners().empty()) {
    return ShardMap::Static(num_shards);
  }
  return ShardMapFromProto(proto);
}

std::string ShardMapToText(const ShardMap& map) {
  std::string out = absl::StrCat(
      "# asyncps shard map: the shard of every slot (psctl reshard --map)\n",
      "epoch ", map.epoch(), "\nshards ", map.num_shards(), "\nslots ",
      map.num_slots(), "\n");
  const absl::Span<const uint16_t> owners = map.owners();
  for (int shard = 0; shard < map.num_shards(); ++shard) {
    absl::StrAppend(&out, "shard ", shard, ":");
    for (size_t s = 0; s < owners.size();) {
      if (owners[s] != shard) {
        ++s;
        continue;
      }
      size_t end = s;
      while (end + 1 < owners.size() && owners[end + 1] == shard) ++end;
      absl::StrAppend(&out, " ", s);
      if (end > s) absl::StrAppend(&out, "-", end);
      s = end + 1;
    }
    out += "\n";
  }
  return out;
}

namespace {

absl::Status BadLine(int line, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("shard map line ", line, ": ", why));
}

// Reads "a" or "a-b" into [first, last].
bool ParseRange(absl::string_view word, int64_t* first, int64_t* last) {
  std::vector<absl::string_view> ends = absl::StrSplit(word, '-');
  if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], first)) return false;
  *last = *first;
  return ends.size() == 1 || absl::SimpleAtoi(ends[1], last);
}

}  // namespace

absl::StatusOr<ShardMap> ShardMapFromText(const std::string& text) {
  int64_t epoch = -1, shards = -1, slots = -1;
  std::vector<int32_t> owners;  // -1 = not listed yet
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t* header = words[0] == "epoch"    ? &epoch
                      : words[0] == "shards" ? &shards
                      : words[0] == "slots"  ? &slots
                                             : nullptr;
    if (header != nullptr) {
      const int64_t most =
          header == &epoch ? (int64_t{1} << 62) : ShardMap::kMaxSlots;
      if (words.size() != 2 || !absl::SimpleAtoi(words[1], header) ||
          *header < 1 || *header > most) {
        return BadLine(line_no, absl::StrCat("expected '", words[0],
                                             " N' with 1 <= N <= ", most));
      }
      if (header == &slots) owners.assign(static_cast<size_t>(slots), -1);
      continue;
    }
    int64_t shard = 0;
    if (words[0] != "shard" || words.size() < 2 || shards < 1 || slots < 1 ||
        !absl::ConsumeSuffix(&words[1], ":") ||
        !absl::SimpleAtoi(words[1], &shard) || shard < 0 || shard >= shards) {
      return BadLine(line_no,
                     "expected 'shard S: FIRST-LAST ...' with S below the "
                     "'shards' count, after the 'shards' and 'slots' lines");
    }
    for (size_t w = 2; w < words.size(); ++w) {
      int64_t first = 0, last = 0;
      if (!ParseRange(words[w], &first, &last) || first < 0 || last < first ||
          last >= slots) {
        return BadLine(
            line_no,
            absl::StrCat("'", words[w], "' is not a slot range within [0, ",
                         slots, ")"));
      }
      for (int64_t s = first; s <= last; ++s) {
        if (owners[s] != -1) {
          return BadLine(line_no, absl::StrCat("slot ", s, " listed twice"));
        }
        owners[s] = static_cast<int32_t>(shard);
      }
    }
  }
  if (epoch < 1 || shards < 1 || slots < 1) {
    return absl::InvalidArgumentError(
        "a shard map file needs 'epoch', 'shards' and 'slots' lines");
  }
  std::vector<uint16_t> owned(owners.size());
  for (size_t s = 0; s < owners.size(); ++s) {
    if (owners[s] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", s, " has no shard in the shard map file"));
    }
    owned[s] = static_cast<uint16_t>(owners[s]);
  }
  return ShardMap::Slotted(static_cast<int>(shards), std::move(owned),
                           static_cast<uint64_t>(epoch));
}

}  // namespace asyncps
