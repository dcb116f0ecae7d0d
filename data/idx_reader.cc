#include "data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
// Larger payloads are rejected before anything is allocated, so a corrupt
// header cannot make the reader allocate gigabytes.
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 32;
constexpr unsigned kChunkBytes = 1 << 20;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzCloser>;

// An open gzip stream and the path it came from, for error messages.
class GzReader {
 public:
  static absl::StatusOr<GzReader> Open(const std::string& path) {
    errno = 0;
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) {
      const int err = errno;
      const std::string msg = absl::StrCat(
          path,
          ": cannot open: ", err != 0 ? std::strerror(err) : "out of memory");
      if (err == ENOENT) return absl::NotFoundError(msg);
      return absl::FailedPreconditionError(msg);
    }
    return GzReader(path, GzFilePtr(f));
  }

  // Reads exactly `len` bytes; DATA_LOSS if the stream ends early or is
  // corrupt. `what` names the part being read.
  absl::Status ReadExactly(unsigned char* dst, uint64_t len, const char* what) {
    uint64_t done = 0;
    while (done < len) {
      const unsigned want =
          static_cast<unsigned>(std::min<uint64_t>(len - done, kChunkBytes));
      const int got = gzread(file_.get(), dst + done, want);
      if (got < 0) return StreamError(what);
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(path_, ": truncated ", what,
                                                ": expected ", len,
                                                " bytes, got ", done));
      }
      done += static_cast<uint64_t>(got);
    }
    return absl::OkStatus();
  }

  // Big-endian 32-bit header field.
  absl::StatusOr<uint32_t> ReadU32(const char* what) {
    unsigned char b[4];
    absl::Status s = ReadExactly(b, 4, what);
    if (!s.ok()) return s;
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
           (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  // OK when the stream has ended cleanly (no trailing data).
  absl::Status ExpectEnd() {
    unsigned char extra;
    const int got = gzread(file_.get(), &extra, 1);
    if (got < 0) return StreamError("end of data");
    if (got > 0) {
      return absl::DataLossError(
          absl::StrCat(path_, ": unexpected bytes after the IDX payload"));
    }
    return absl::OkStatus();
  }

  const std::string& path() const { return path_; }

 private:
  GzReader(std::string path, GzFilePtr file)
      : path_(std::move(path)), file_(std::move(file)) {}

  absl::Status StreamError(const char* what) {
    int errnum = 0;
    const char* msg = gzerror(file_.get(), &errnum);
    return absl::DataLossError(
        absl::StrCat(path_, ": corrupt gzip stream while reading ", what, ": ",
                     msg ? msg : "unknown error"));
  }

  std::string path_;
  GzFilePtr file_;
};

absl::Status CheckMagic(const GzReader& r, uint32_t got, uint32_t want) {
  if (got == want) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      r.path(), ": bad IDX magic number 0x", absl::Hex(got, absl::kZeroPad8),
      ", expected 0x", absl::Hex(want, absl::kZeroPad8)));
}

}  // namespace

absl::StatusOr<IdxImages> LoadIdxImages(const std::string& path) {
  absl::StatusOr<GzReader> reader = GzReader::Open(path);
  if (!reader.ok()) return reader.status();
  GzReader& r = *reader;
  // The magic number first, so a wrong kind of file is reported as such.
  absl::StatusOr<uint32_t> magic = r.ReadU32("magic number");
  if (!magic.ok()) return magic.status();
  absl::Status s = CheckMagic(r, *magic, kImagesMagic);
  if (!s.ok()) return s;
  uint32_t header[4] = {*magic};
  const char* names[4] = {"magic number", "image count", "row count",
                          "column count"};
  for (int i = 1; i < 4; ++i) {
    absl::StatusOr<uint32_t> v = r.ReadU32(names[i]);
    if (!v.ok()) return v.status();
    header[i] = *v;
  }
  const uint64_t n = header[1], rows = header[2], cols = header[3];
  if (rows == 0 || cols == 0 || rows > 65536 || cols > 65536 ||
      n * rows * cols > kMaxPayloadBytes) {
    return absl::DataLossError(absl::StrCat(path, ": implausible IDX3 header: ",
                                            n, " images of ", rows, "x", cols));
  }
  const uint64_t bytes = n * rows * cols;
  std::vector<unsigned char> raw(bytes);
  s = r.ReadExactly(raw.data(), bytes, "pixels");
  if (!s.ok()) return s;
  s = r.ExpectEnd();
  if (!s.ok()) return s;

  IdxImages out;
  out.n = static_cast<int64_t>(n);
  out.rows = static_cast<int>(rows);
  out.cols = static_cast<int>(cols);
  out.pixels.resize(bytes);
  constexpr float kScale = 1.0f / 255.0f;
  for (uint64_t i = 0; i < bytes; ++i) out.pixels[i] = raw[i] * kScale;
  return out;
}

absl::StatusOr<std::vector<int32_t>> LoadIdxLabels(const std::string& path) {
  absl::StatusOr<GzReader> reader = GzReader::Open(path);
  if (!reader.ok()) return reader.status();
  GzReader& r = *reader;
  absl::StatusOr<uint32_t> magic = r.ReadU32("magic number");
  if (!magic.ok()) return magic.status();
  absl::Status s = CheckMagic(r, *magic, kLabelsMagic);
  if (!s.ok()) return s;
  absl::StatusOr<uint32_t> n = r.ReadU32("label count");
  if (!n.ok()) return n.status();
  if (*n > kMaxPayloadBytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": implausible IDX1 label count ", *n));
  }
  std::vector<unsigned char> raw(*n);
  s = r.ReadExactly(raw.data(), *n, "labels");
  if (!s.ok()) return s;
  s = r.ExpectEnd();
  if (!s.ok()) return s;
  return std::vector<int32_t>(raw.begin(), raw.end());
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split) {
  const char* prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path =
      absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  const std::string labels_path =
      absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");

  absl::StatusOr<IdxImages> images = LoadIdxImages(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::vector<int32_t>> labels = LoadIdxLabels(labels_path);
  if (!labels.ok()) return labels.status();

  if (static_cast<int64_t>(labels->size()) != images->n) {
    return absl::DataLossError(
        absl::StrCat(images_path, " holds ", images->n, " images but ",
                     labels_path, " holds ", labels->size(), " labels"));
  }
  for (size_t i = 0; i < labels->size(); ++i) {
    const int32_t label = (*labels)[i];
    if (label < 0 || label >= kFashionMnistClasses) {
      return absl::DataLossError(
          absl::StrCat(labels_path, ": label ", label, " of example ", i,
                       " is outside [0, ", kFashionMnistClasses, ")"));
    }
  }
  Dataset ds;
  ds.n = images->n;
  ds.dim = images->rows * images->cols;
  ds.images = std::move(images->pixels);
  ds.labels = std::move(*labels);
  return ds;
}

}  // namespace asyncps
