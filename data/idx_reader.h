#ifndef ASYNCPS_DATA_IDX_READER_H_
#define ASYNCPS_DATA_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace asyncps {

// Where Debian's dataset-fashion-mnist package installs the data.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";

// Images of an IDX3 file (magic 0x00000803, unsigned bytes), scaled to
// [0, 1] (byte / 255), row-major: image i is pixels[i * rows * cols, ...).
struct IdxImages {
  int64_t n = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> pixels;
};

// Reads a gzip-compressed (or, via zlib's transparent mode, uncompressed)
// IDX3 image file. Errors name the file: NOT_FOUND when it cannot be opened
// because it does not exist, DATA_LOSS for a bad magic number, a truncated
// or corrupt stream, trailing bytes, or an implausible header.
// Thread-compatible (no shared state).
absl::StatusOr<IdxImages> LoadIdxImages(const std::string& path);

// Reads an IDX1 label file (magic 0x00000801, unsigned bytes). Values are
// returned as read (0..255); range checks belong to the caller. Errors as
// for LoadIdxImages.
absl::StatusOr<std::vector<int32_t>> LoadIdxLabels(const std::string& path);

// A labelled image data set in memory.
struct Dataset {
  int64_t n = 0;                // number of examples
  int dim = 0;                  // features per example (784 for 28x28)
  std::vector<float> images;    // n x dim, row-major, in [0, 1]
  std::vector<int32_t> labels;  // n labels in [0, kFashionMnistClasses)
};

inline constexpr int kFashionMnistClasses = 10;

enum class Split { kTrain, kTest };

// Loads Fashion-MNIST from `dir`, which holds the files
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. Besides the file errors
// above: DATA_LOSS when the image and label counts differ or a label is
// outside [0, 10).
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, Split split);

}  // namespace asyncps

#endif  // ASYNCPS_DATA_IDX_READER_H_
