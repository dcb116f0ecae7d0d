// MakeBackend: chooses a compute backend by name (see kernels/backend.h).

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const std::string& device) {
  if (device == "cpu") return MakeCpuBackend();
  if (device == "cuda") return MakeCudaBackend(0);
  if (device == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeCudaBackend(0);
    if (cuda.ok()) return cuda;
    return MakeCpuBackend();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compute device \"", device,
                   "\"; expected \"cpu\", \"cuda\" or \"auto\""));
}

}  // namespace asyncps
