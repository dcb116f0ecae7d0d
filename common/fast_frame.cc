#include "common/fast_frame.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"

namespace asyncps {

namespace {

constexpr size_t kMaxVarint32Bytes = 5;

uint8_t* MutableBegin(grpc::Slice& s) {
  return const_cast<uint8_t*>(s.begin());
}

}  // namespace

grpc::ByteBuffer MakeFrame(const google::protobuf::MessageLite& header,
                           const std::vector<grpc::Slice>& payload) {
  const size_t size = header.ByteSizeLong();
  const size_t prefix = google::protobuf::io::CodedOutputStream::VarintSize32(
      static_cast<uint32_t>(size));
  std::vector<grpc::Slice> slices;
  slices.reserve(payload.size() + 1);
  slices.emplace_back(prefix + size);
  uint8_t* p = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(
      static_cast<uint32_t>(size), MutableBegin(slices.back()));
  header.SerializeWithCachedSizesToArray(p);
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
  bool ok;
  if (!buffer.Valid()) {
    ok = message->ParseFromArray(nullptr, 0);
  } else if (!buffer.Dump(&slices).ok()) {
    ok = false;
  } else if (slices.size() == 1) {
    ok = message->ParseFromArray(slices[0].begin(),
                                 static_cast<int>(slices[0].size()));
  } else {
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    ok = message->ParseFromString(bytes);
  }
  return ok ? absl::OkStatus()
            : absl::InvalidArgumentError(absl::StrCat(
                  "request does not parse as ", message->GetTypeName()));
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

absl::Status FrameReader::Open(const grpc::ByteBuffer& buffer,
                               google::protobuf::MessageLite* header) {
  slices_.clear();
  index_ = offset_ = 0;
  remaining_ = 0;
  if (buffer.Valid() && !buffer.Dump(&slices_).ok()) {
    return absl::InvalidArgumentError("frame: unreadable buffer");
  }
  for (const grpc::Slice& s : slices_) remaining_ += s.size();
  // The varint32 length prefix, byte by byte (it may span slices).
  uint64_t length = 0;
  bool done = false;
  for (size_t i = 0; i < kMaxVarint32Bytes && !done; ++i) {
    if (remaining_ == 0) break;
    uint8_t byte = 0;
    Consume(1, [&byte](absl::string_view v) { byte = v[0]; });
    length |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    done = (byte & 0x80) == 0;
  }
  if (!done || length > 0xffffffffu) {
    return absl::InvalidArgumentError("frame: malformed header length prefix");
  }
  if (length > remaining_) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame: header length ", length, " exceeds the ",
                     remaining_, " bytes after the prefix"));
  }
  std::string bytes;
  bytes.reserve(length);
  Consume(length,
          [&bytes](absl::string_view v) { bytes.append(v.data(), v.size()); });
  if (!header->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: header does not parse as ", header->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::Status FrameReader::Next(uint64_t n, FloatPayload* out) {
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

}  // namespace asyncps
