// Spec for the IDX / Fashion-MNIST reader: the real Debian data set loads
// with the known shape and contents; malformed files give errors that name
// the file.

#include "data/idx_reader.h"

#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

// A fresh directory under Bazel's per-test temp dir (or /tmp).
std::string MakeTempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/idxXXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  REQUIRE(mkdtemp(buf.data()) != nullptr);
  return std::string(buf.data());
}

void PutU32(std::vector<unsigned char>& v, uint32_t x) {
  v.push_back(x >> 24);
  v.push_back(x >> 16);
  v.push_back(x >> 8);
  v.push_back(x);
}

std::vector<unsigned char> ImagesBytes(uint32_t n, uint32_t rows, uint32_t cols,
                                       const std::vector<unsigned char>& px) {
  std::vector<unsigned char> v;
  PutU32(v, 0x803);
  PutU32(v, n);
  PutU32(v, rows);
  PutU32(v, cols);
  v.insert(v.end(), px.begin(), px.end());
  return v;
}

std::vector<unsigned char> LabelsBytes(uint32_t n,
                                       const std::vector<unsigned char>& l) {
  std::vector<unsigned char> v;
  PutU32(v, 0x801);
  PutU32(v, n);
  v.insert(v.end(), l.begin(), l.end());
  return v;
}

void WriteGzip(const std::string& path,
               const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) {
    REQUIRE(gzwrite(f, bytes.data(), bytes.size()) ==
            static_cast<int>(bytes.size()));
  }
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<char> ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void WriteRaw(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
  REQUIRE(out.good());
}

bool Names(const absl::Status& s, const std::string& path) {
  return std::string(s.message()).find(path) != std::string::npos;
}

TEST_CASE("the installed Fashion-MNIST train split loads", "[idx][data]") {
  auto ds = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
  REQUIRE(ds.ok());
  CHECK(ds->n == 60000);
  CHECK(ds->dim == 784);
  REQUIRE(ds->images.size() == size_t{60000} * 784);
  REQUIRE(ds->labels.size() == 60000);
  // The first training example is an ankle boot (class 9).
  CHECK(ds->labels[0] == 9);
  std::vector<int> per_class(10, 0);
  for (int32_t l : ds->labels) {
    REQUIRE(l >= 0);
    REQUIRE(l < 10);
    ++per_class[l];
  }
  for (int c = 0; c < 10; ++c) CHECK(per_class[c] == 6000);
  auto [lo, hi] = std::minmax_element(ds->images.begin(), ds->images.end());
  CHECK(*lo == 0.0f);
  CHECK(*hi == 1.0f);
}

TEST_CASE("the installed Fashion-MNIST test split loads", "[idx][data]") {
  auto ds = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  REQUIRE(ds.ok());
  CHECK(ds->n == 10000);
  CHECK(ds->dim == 784);
  CHECK(ds->images.size() == size_t{10000} * 784);
  REQUIRE(ds->labels.size() == 10000);
  CHECK(ds->labels[0] == 9);
  CHECK(ds->labels[1] == 2);
  for (float p : ds->images) {
    REQUIRE(p >= 0.0f);
    REQUIRE(p <= 1.0f);
  }
}

TEST_CASE("a small IDX pair round-trips with pixels scaled to [0, 1]",
          "[idx]") {
  const std::string dir = MakeTempDir();
  WriteGzip(dir + "/train-images-idx3-ubyte.gz",
            ImagesBytes(2, 1, 3, {0, 255, 51, 102, 0, 255}));
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz", LabelsBytes(2, {7, 0}));
  auto ds = LoadFashionMnist(dir, Split::kTrain);
  REQUIRE(ds.ok());
  CHECK(ds->n == 2);
  CHECK(ds->dim == 3);
  REQUIRE(ds->images.size() == 6);
  CHECK(ds->images[0] == 0.0f);
  CHECK(ds->images[1] == 1.0f);
  CHECK(ds->images[2] == Approx(0.2f));
  CHECK(ds->images[3] == Approx(0.4f));
  CHECK(ds->labels == std::vector<int32_t>{7, 0});

  auto images = LoadIdxImages(dir + "/train-images-idx3-ubyte.gz");
  REQUIRE(images.ok());
  CHECK(images->rows == 1);
  CHECK(images->cols == 3);
}

TEST_CASE("a missing file is NOT_FOUND and names the file", "[idx]") {
  const std::string dir = MakeTempDir();
  auto ds = LoadFashionMnist(dir, Split::kTest);
  REQUIRE(absl::IsNotFound(ds.status()));
  CHECK(Names(ds.status(), dir + "/t10k-images-idx3-ubyte.gz"));
  auto labels = LoadIdxLabels(dir + "/nope.gz");
  CHECK(absl::IsNotFound(labels.status()));
}

TEST_CASE("a truncated gzip stream is DATA_LOSS naming the file", "[idx]") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/train-images-idx3-ubyte.gz";
  std::vector<unsigned char> px(20 * 28 * 28);
  for (size_t i = 0; i < px.size(); ++i) px[i] = (i * 7919) % 256;
  WriteGzip(path, ImagesBytes(20, 28, 28, px));
  std::vector<char> gz = ReadRaw(path);
  REQUIRE(gz.size() > 100);
  gz.resize(gz.size() / 2);
  WriteRaw(path, gz);
  auto images = LoadIdxImages(path);
  REQUIRE(absl::IsDataLoss(images.status()));
  CHECK(Names(images.status(), path));
}

TEST_CASE("fewer payload bytes than the header promises is DATA_LOSS",
          "[idx]") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/labels.gz";
  WriteGzip(path, LabelsBytes(100, {1, 2, 3}));
  auto labels = LoadIdxLabels(path);
  REQUIRE(absl::IsDataLoss(labels.status()));
  CHECK(Names(labels.status(), path));
  CHECK(std::string(labels.status().message()).find("truncated") !=
        std::string::npos);

  // An empty file has no header at all.
  const std::string empty = dir + "/empty.gz";
  WriteGzip(empty, {});
  CHECK(absl::IsDataLoss(LoadIdxImages(empty).status()));
}

TEST_CASE("trailing bytes after the payload are DATA_LOSS", "[idx]") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/labels.gz";
  WriteGzip(path, LabelsBytes(2, {1, 2, 3}));
  auto labels = LoadIdxLabels(path);
  REQUIRE(absl::IsDataLoss(labels.status()));
  CHECK(Names(labels.status(), path));
}

TEST_CASE("a bad magic number is DATA_LOSS naming the file", "[idx]") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/images.gz";
  // A label file where an image file is expected.
  WriteGzip(path, LabelsBytes(2, {1, 2}));
  auto images = LoadIdxImages(path);
  REQUIRE(absl::IsDataLoss(images.status()));
  CHECK(Names(images.status(), path));
  CHECK(std::string(images.status().message()).find("magic") !=
        std::string::npos);
}

TEST_CASE("an implausibly large header is rejected before allocating",
          "[idx]") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/images.gz";
  WriteGzip(path, ImagesBytes(0xffffffffu, 0xffffu, 0xffffu, {}));
  auto images = LoadIdxImages(path);
  REQUIRE(absl::IsDataLoss(images.status()));
  CHECK(Names(images.status(), path));
}

TEST_CASE("image and label counts that differ are DATA_LOSS naming both",
          "[idx]") {
  const std::string dir = MakeTempDir();
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz",
            ImagesBytes(3, 1, 2, {1, 2, 3, 4, 5, 6}));
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", LabelsBytes(4, {1, 2, 3, 4}));
  auto ds = LoadFashionMnist(dir, Split::kTest);
  REQUIRE(absl::IsDataLoss(ds.status()));
  CHECK(Names(ds.status(), dir + "/t10k-images-idx3-ubyte.gz"));
  CHECK(Names(ds.status(), dir + "/t10k-labels-idx1-ubyte.gz"));
}

TEST_CASE("a label outside 0..9 is DATA_LOSS", "[idx]") {
  const std::string dir = MakeTempDir();
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz", ImagesBytes(2, 1, 1, {1, 2}));
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", LabelsBytes(2, {3, 10}));
  auto ds = LoadFashionMnist(dir, Split::kTest);
  REQUIRE(absl::IsDataLoss(ds.status()));
  CHECK(Names(ds.status(), dir + "/t10k-labels-idx1-ubyte.gz"));
}

}  // namespace
}  // namespace asyncps
