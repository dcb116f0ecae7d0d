// MakeCudaBackend for builds without --config=cuda: there is no CUDA backend.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int /*device*/) {
  return absl::UnavailableError(
      "asyncps was built without CUDA support (build with --config=cuda)");
}

}  // namespace asyncps
