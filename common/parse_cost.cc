#include "common/parse_cost.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace asyncps {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// What one parsed item holds beyond its bytes (measured: 87 bytes per empty
// SliceGradient, a 56-byte object in a heap block, and its pointer).
constexpr int64_t kMessageCost = 96;
constexpr int64_t kStringCost = 48;   // a heap std::string
constexpr int64_t kNumberCost = 8;    // one element of a repeated number
constexpr int64_t kUnknownCost = 32;  // an UnknownField
constexpr int kMaxDepth = 100;        // protobuf's own recursion limit

// The most any wire byte can be charged: an unknown group, 2 bytes of
// tags for an UnknownField and a message. A request smaller than the
// slack over this cannot pass the limit, and is not scanned.
constexpr int64_t kMostPerByte = (kUnknownCost + kMessageCost) / 2;

constexpr int64_t kSlackBytes = int64_t{16} << 20;
constexpr int64_t kTimesSize = 16;
constexpr int64_t kCeilingBytes = int64_t{1} << 30;

// Values in a packed run of `bytes` bytes of `field`'s type.
int64_t PackedCount(const FieldDescriptor& field, absl::string_view bytes) {
  switch (field.type()) {
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return static_cast<int64_t>(bytes.size() / 4);
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return static_cast<int64_t>(bytes.size() / 8);
    default: {  // varints: one per byte without the continuation bit
      int64_t n = 0;
      for (char c : bytes) n += (static_cast<uint8_t>(c) & 0x80) == 0;
      return n;
    }
  }
}

class CostCounter {
 public:
  explicit CostCounter(int64_t stop) : stop_(stop) {}

  // Adds the cost of the fields of one `type` message (nullptr: unknown
  // fields, e.g. in a group) read from `in` until its end or `end_group`.
  // False when the wire data breaks or the count passed stop_.
  bool Message(CodedInputStream* in, const Descriptor* type, int depth,
               uint32_t end_group = 0) {
    if (depth > kMaxDepth) return false;
    for (;;) {
      const uint32_t tag = in->ReadTag();
      if (tag == 0) return end_group == 0;
      if (tag == end_group) return true;
      const int number = WireFormatLite::GetTagFieldNumber(tag);
      const FieldDescriptor* field =
          type != nullptr ? type->FindFieldByNumber(number) : nullptr;
      if (!Field(in, tag, Known(field, WireFormatLite::GetTagWireType(tag)),
                 depth)) {
        return false;
      }
      if (cost_ > stop_) return false;
    }
  }

  int64_t cost() const { return cost_; }

 private:
  // `field` when `wire` is how it is sent (a packable repeated number may
  // come packed), else nullptr: protobuf keeps a field sent with another
  // wire type as an unknown field.
  static const FieldDescriptor* Known(const FieldDescriptor* field,
                                      WireFormatLite::WireType wire) {
    if (field == nullptr) return nullptr;
    const auto expected = WireFormatLite::WireTypeForFieldType(
        static_cast<WireFormatLite::FieldType>(field->type()));
    if (wire == expected) return field;
    if (wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
        field->is_packable()) {
      return field;
    }
    return nullptr;
  }

  bool Field(CodedInputStream* in, uint32_t tag, const FieldDescriptor* field,
             int depth) {
    const auto wire = WireFormatLite::GetTagWireType(tag);
    if (field == nullptr) cost_ += kUnknownCost;
    switch (wire) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v;
        if (!in->ReadVarint64(&v)) return false;
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED32: {
        uint32_t v;
        if (!in->ReadLittleEndian32(&v)) return false;
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED64: {
        uint64_t v;
        if (!in->ReadLittleEndian64(&v)) return false;
        break;
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
        return Delimited(in, field, depth);
      case WireFormatLite::WIRETYPE_START_GROUP: {
        const uint32_t end =
            WireFormatLite::MakeTag(WireFormatLite::GetTagFieldNumber(tag),
                                    WireFormatLite::WIRETYPE_END_GROUP);
        const Descriptor* group =
            field != nullptr && field->type() == FieldDescriptor::TYPE_GROUP
                ? field->message_type()
                : nullptr;
        cost_ += kMessageCost;
        return Message(in, group, depth + 1, end);
      }
      default:
        return false;
    }
    if (field != nullptr && field->is_repeated()) cost_ += kNumberCost;
    return true;
  }

  bool Delimited(CodedInputStream* in, const FieldDescriptor* field,
                 int depth) {
    uint32_t length;
    if (!in->ReadVarint32(&length)) return false;
    if (field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE) {
      cost_ += kMessageCost;
      const CodedInputStream::Limit limit = in->PushLimit(length);
      const bool ok = Message(in, field->message_type(), depth + 1);
      if (!ok || in->BytesUntilLimit() != 0) return false;
      in->PopLimit(limit);
      return true;
    }
    // A packed run of numbers: its values (the stream reads a flat array).
    if (field != nullptr && field->is_repeated() &&
        field->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
      const void* data;
      int size;
      if (!in->GetDirectBufferPointer(&data, &size) ||
          static_cast<uint32_t>(size) < length) {
        return false;
      }
      cost_ += kNumberCost *
               PackedCount(*field, absl::string_view(
                                       static_cast<const char*>(data), length));
      return in->Skip(static_cast<int>(length));
    }
    cost_ += kStringCost + length;
    return in->Skip(static_cast<int>(length));
  }

  const int64_t stop_;
  int64_t cost_ = 0;
};

int64_t Limit(size_t wire_bytes) {
  return std::min(
      kCeilingBytes,
      std::max(kSlackBytes, kTimesSize * static_cast<int64_t>(wire_bytes)));
}

}  // namespace

int64_t EstimateParseCost(absl::string_view wire, const Descriptor& type,
                          int64_t stop) {
  CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                      static_cast<int>(wire.size()));
  CostCounter counter(stop);
  counter.Message(&in, &type, 0);
  return counter.cost();
}

absl::Status CheckParseCost(absl::string_view wire, const Descriptor& type) {
  const int64_t limit = Limit(wire.size());
  if (kMostPerByte * static_cast<int64_t>(wire.size()) <= limit) {
    return absl::OkStatus();  // e.g. every stream frame's header
  }
  const int64_t cost = EstimateParseCost(wire, type, limit);
  if (cost <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      type.full_name(), " of ", wire.size(), " bytes: parsing it would take ",
      "more than ", limit,
      " bytes of memory (its embedded messages, strings, repeated numbers "
      "and unknown fields; the limit is 16 MiB or 16x the message's size, "
      "1 GiB at most): nothing was parsed; send fewer items per request"));
}

}  // namespace asyncps
