#include "common/fast_frame.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/parse_cost.h"
#include "google/protobuf/message.h"

namespace asyncps {

namespace {

constexpr size_t kLengthBytes = 4;

uint8_t* MutableBegin(grpc::Slice& s) {
  return const_cast<uint8_t*>(s.begin());
}

size_t PaddedPrefix(size_t header_bytes) {
  const size_t prefix = kLengthBytes + header_bytes;
  return (prefix + kFrameAlignment - 1) / kFrameAlignment * kFrameAlignment;
}

}  // namespace

grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite& header,
                           const std::vector<grpc::Slice>& payload) {
  const size_t size = header.ByteSizeLong();
  const size_t prefix = PaddedPrefix(size);
  std::vector<grpc::Slice> slices;
  slices.reserve(payload.size() + 1);
  slices.emplace_back(prefix);
  uint8_t* p = MutableBegin(slices.back());
  const uint32_t length = static_cast<uint32_t>(size);
  for (size_t i = 0; i < kLengthBytes; ++i) p[i] = (length >> (8 * i)) & 0xff;
  header.SerializeWithCachedSizesToArray(p + kLengthBytes);
  std::memset(p + kLengthBytes + size, 0, prefix - kLengthBytes - size);
  for (const grpc::Slice& s : payload) {
    if (s.size() > 0) slices.push_back(s);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer SerializeToByteBuffer(
    const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(MutableBegin(slice));
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer,
                                 google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  std::string joined;
  absl::string_view bytes;
  if (buffer.Valid()) {
    if (!buffer.Dump(&slices).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request does not parse as ", message->GetTypeName()));
    }
    if (slices.size() == 1) {
      bytes = absl::string_view(
          reinterpret_cast<const char*>(slices[0].begin()), slices[0].size());
    } else {
      for (const grpc::Slice& s : slices) {
        joined.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      bytes = joined;
    }
  }
  return ParseBounded(bytes, message, "request");
}

absl::Status ParseBounded(absl::string_view bytes,
                          google::protobuf::MessageLite* message,
                          absl::string_view what) {
  const auto* full = dynamic_cast<const google::protobuf::Message*>(message);
  if (full != nullptr) {
    absl::Status s = CheckParseCost(bytes, *full->GetDescriptor());
    if (!s.ok()) return s;
  }
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " does not parse as ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

template <typename F>
void FrameReader::Consume(uint64_t n, F piece) {
  remaining_ -= n;
  while (n > 0) {
    const grpc::Slice& s = slices_[index_];
    const size_t take =
        static_cast<size_t>(std::min<uint64_t>(n, s.size() - offset_));
    if (take > 0) {
      piece(absl::string_view(
          reinterpret_cast<const char*>(s.begin()) + offset_, take));
    }
    offset_ += take;
    n -= take;
    if (offset_ == s.size()) {
      ++index_;
      offset_ = 0;
    }
  }
}

std::vector<grpc::Slice> FrameReader::Share(const Payload& payload) const {
  std::vector<grpc::Slice> out;
  size_t k = 0;  // pieces come in the buffer's order
  for (absl::string_view piece : payload.pieces()) {
    const char* p = piece.data();
    size_t at = k;
    while (at < slices_.size() &&
           !(reinterpret_cast<const char*>(slices_[at].begin()) <= p &&
             p + piece.size() <=
                 reinterpret_cast<const char*>(slices_[at].end()))) {
      ++at;
    }
    if (at == slices_.size()) {
      out.emplace_back(piece.data(), piece.size());  // a copy
      continue;
    }
    k = at;
    const size_t begin = static_cast<size_t>(
        p - reinterpret_cast<const char*>(slices_[k].begin()));
    out.push_back(slices_[k].sub(begin, begin + piece.size()));
  }
  return out;
}

std::vector<grpc::Slice> FrameReader::Keep(const Payload& payload) const {
  if (payload.size() >= kKeepSharedFrom) return Share(payload);
  grpc::Slice copy(payload.size());
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(copy.begin()));
  for (absl::string_view piece : payload.pieces()) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
  return {std::move(copy)};
}

absl::Status FrameReader::OpenBytes(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  index_ = offset_ = 0;
  remaining_ = 0;
  if (buffer.Valid() && !buffer.Dump(&slices_).ok()) {
    return absl::InvalidArgumentError("frame: unreadable buffer");
  }
  for (const grpc::Slice& s : slices_) remaining_ += s.size();
  return absl::OkStatus();
}

absl::Status FrameReader::Open(const grpc::ByteBuffer& buffer,
                               google::protobuf::MessageLite* header) {
  if (absl::Status s = OpenBytes(buffer); !s.ok()) return s;
  if (remaining_ < kLengthBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: ", remaining_, " bytes, too short for the length prefix"));
  }
  char prefix[kLengthBytes];
  CopyNext(kLengthBytes, prefix).IgnoreError();  // length checked above
  uint64_t length = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) {
    length |= static_cast<uint64_t>(static_cast<uint8_t>(prefix[i])) << (8 * i);
  }
  const uint64_t padding = PaddedPrefix(length) - kLengthBytes - length;
  if (length + padding > remaining_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: header of ", length, " bytes and its padding exceed the ",
        remaining_, " bytes after the prefix"));
  }
  std::string bytes;
  bytes.reserve(length);
  Consume(length,
          [&bytes](absl::string_view v) { bytes.append(v.data(), v.size()); });
  Consume(padding, [](absl::string_view) {});
  return ParseBounded(bytes, header, "frame: header");
}

absl::Status FrameReader::Next(uint64_t n, Payload* out) {
  if (n > remaining_) {
    return absl::InvalidArgumentError(absl::StrCat("frame: payload of ", n,
                                                   " bytes runs past the ",
                                                   remaining_, " bytes left"));
  }
  Consume(n, [out](absl::string_view v) { out->Append(v); });
  return absl::OkStatus();
}

absl::Status FrameReader::CopyNext(uint64_t n, char* out) {
  if (n > remaining_) {
    return absl::InvalidArgumentError(absl::StrCat("frame: payload of ", n,
                                                   " bytes runs past the ",
                                                   remaining_, " bytes left"));
  }
  Consume(n, [&out](absl::string_view v) {
    std::memcpy(out, v.data(), v.size());
    out += v.size();
  });
  return absl::OkStatus();
}

absl::Status FrameReader::DecodeNext(uint64_t n, WireDtype dtype, float* out) {
  if (dtype == WIRE_F32) return CopyNext(n, reinterpret_cast<char*>(out));
  Payload payload;
  payload.set_dtype(dtype);
  absl::Status s = Next(n, &payload);
  if (!s.ok()) return s;
  DecodePayload(payload, out);
  return absl::OkStatus();
}

}  // namespace asyncps
