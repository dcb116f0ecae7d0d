#include "server/entry_wire.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fast_frame.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace asyncps {
namespace {

// FollowFeed.entry (field 2) and LogEntry.grads (8) / rows (9), each a
// length-delimited field: the tag's byte.
constexpr uint8_t kEntryTag = (2 << 3) | 2;
constexpr uint8_t kGradTag = (8 << 3) | 2;
constexpr uint8_t kRowsTag = (9 << 3) | 2;

// Appends a protobuf varint.
void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t SizeOf(const std::vector<grpc::Slice>& payload) {
  size_t n = 0;
  for (const grpc::Slice& piece : payload) n += piece.size();
  return n;
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("a replication feed message is malformed: ", why));
}

// Reads a varint, appending its bytes to *raw when given.
absl::Status ReadVarint(FrameReader& in, uint64_t* v, std::string* raw) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    char c;
    if (!in.CopyNext(1, &c).ok()) return Malformed("a varint runs past it");
    if (raw != nullptr) raw->push_back(c);
    const auto byte = static_cast<uint8_t>(c);
    *v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return absl::OkStatus();
  }
  return Malformed("a varint is longer than 10 bytes");
}

// Appends the value of a field of wire type `type`, as it is, to *out.
absl::Status CopyValue(FrameReader& in, uint64_t type, std::string* out) {
  uint64_t n = 0;
  switch (type) {
    case 0:
      return ReadVarint(in, &n, out);
    case 1:
      n = 8;
      break;
    case 5:
      n = 4;
      break;
    case 2:
      if (absl::Status s = ReadVarint(in, &n, out); !s.ok()) return s;
      break;
    default:
      return Malformed(absl::StrCat("wire type ", type, " is not read here"));
  }
  if (n > in.remaining()) return Malformed("a field runs past it");
  const size_t at = out->size();
  out->resize(at + n);
  return in.CopyNext(n, out->data() + at);
}

// The entry's fields in the next n bytes: grads and rows to *payloads, the
// others, as they are, to *fields.
absl::Status ReadEntry(FrameReader& in, uint64_t n, std::string* fields,
                       EntryPayloads* payloads) {
  if (n > in.remaining()) return Malformed("its entry runs past it");
  const uint64_t end = in.remaining() - n;  // what is left after the entry
  while (in.remaining() > end) {
    std::string field;
    uint64_t tag = 0;
    absl::Status s = ReadVarint(in, &tag, &field);
    if (s.ok() && (tag == kGradTag || tag == kRowsTag)) {
      uint64_t bytes = 0;
      s = ReadVarint(in, &bytes, nullptr);
      if (s.ok() && (in.remaining() < end || bytes > in.remaining() - end)) {
        s = Malformed("a payload runs past its entry");
      }
      Payload payload;
      if (s.ok()) s = in.Next(bytes, &payload);
      if (!s.ok()) return s;
      (tag == kGradTag ? payloads->grads : payloads->rows)
          .push_back(in.Keep(payload));
      continue;
    }
    if (s.ok()) s = CopyValue(in, tag & 7, &field);
    if (!s.ok()) return s;
    if (in.remaining() < end) return Malformed("a field runs past its entry");
    fields->append(field);
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t KeptBytes(const KeptEntry& kept) {
  uint64_t bytes = kept.feed->ByteSizeLong();
  if (kept.payloads != nullptr) {
    for (const auto* part : {&kept.payloads->grads, &kept.payloads->rows}) {
      for (const std::vector<grpc::Slice>& p : *part) bytes += SizeOf(p);
    }
  }
  return bytes;
}

Payload PayloadOf(const std::vector<grpc::Slice>& payload, WireDtype dtype) {
  Payload out;
  out.set_dtype(dtype);
  for (const grpc::Slice& piece : payload) {
    out.Append(absl::string_view(reinterpret_cast<const char*>(piece.begin()),
                                 piece.size()));
  }
  return out;
}

grpc::ByteBuffer EntryWire(const KeptEntry& kept) {
  if (kept.payloads == nullptr) return SerializeToByteBuffer(*kept.feed);
  // FollowFeed.entry is the feed's only field; each payload follows the
  // entry's own fields as a grads or rows field: a tag, a length, the
  // bytes (fields may come in any order).
  const LogEntry& entry = kept.feed->entry();
  std::vector<std::string> heads;  // each payload's tag and length
  uint64_t entry_bytes = entry.ByteSizeLong();
  for (const auto& [tag, part] : {std::pair{kGradTag, &kept.payloads->grads},
                                  std::pair{kRowsTag, &kept.payloads->rows}}) {
    for (const std::vector<grpc::Slice>& payload : *part) {
      std::string& head = heads.emplace_back(1, static_cast<char>(tag));
      const size_t n = SizeOf(payload);
      PutVarint(n, &head);
      entry_bytes += head.size() + n;
    }
  }
  std::string first(1, static_cast<char>(kEntryTag));
  PutVarint(entry_bytes, &first);
  entry.AppendToString(&first);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(first);
  size_t h = 0;
  for (const auto* part : {&kept.payloads->grads, &kept.payloads->rows}) {
    for (const std::vector<grpc::Slice>& payload : *part) {
      slices.emplace_back(heads[h++]);
      slices.insert(slices.end(), payload.begin(), payload.end());
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status ReadFeedWire(grpc::ByteBuffer* wire, FollowFeed* feed,
                          std::shared_ptr<const EntryPayloads>* payloads) {
  payloads->reset();
  FrameReader in;
  if (absl::Status s = in.OpenBytes(*wire); !s.ok()) return s;
  // Anything but an entry (a snapshot's pieces, sent once per catch-up)
  // parses in place as protobuf reads a stream.
  char first = 0;
  if (in.remaining() == 0 ||
      (in.CopyNext(1, &first).IgnoreError(), first != kEntryTag)) {
    grpc::Status s =
        grpc::SerializationTraits<FollowFeed>::Deserialize(wire, feed);
    if (!s.ok()) return Malformed(s.error_message());
    return absl::OkStatus();
  }
  std::string top, fields;
  auto out = std::make_shared<EntryPayloads>();
  for (bool first_field = true; first_field || in.remaining() > 0;
       first_field = false) {
    uint64_t tag = kEntryTag;  // the first field's, read above
    std::string raw;
    if (!first_field) {
      if (absl::Status s = ReadVarint(in, &tag, &raw); !s.ok()) return s;
    }
    absl::Status s;
    if (tag == kEntryTag) {
      uint64_t n = 0;
      s = ReadVarint(in, &n, nullptr);
      if (s.ok()) s = ReadEntry(in, n, &fields, out.get());
    } else {
      top.append(raw);
      s = CopyValue(in, tag & 7, &top);
    }
    if (!s.ok()) return s;
  }
  wire->Clear();
  // Parsed as gRPC's protobuf reader parses the other messages, without
  // ParseBounded's cost check: what the primary logged passed its own
  // checks, and a backup that refused one of its entries could not follow.
  if (!feed->ParseFromString(top)) return Malformed("it does not parse");
  if (!feed->mutable_entry()->ParseFromString(fields)) {
    return Malformed("its entry does not parse");
  }
  if (!out->grads.empty() || !out->rows.empty()) *payloads = std::move(out);
  return absl::OkStatus();
}

}  // namespace asyncps
