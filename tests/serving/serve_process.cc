#include "tests/serving/serve_process.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "tests/testing/require_ok.h"

namespace asyncps {

ServeProcess StartServe(const std::vector<std::string>& flags) {
  const std::string stem = testing::UniqueTmpPath("ps_serve");
  std::vector<std::string> args = {
      "--port=0", "--port_file=" + stem + ".port", "--http_port=0",
      "--http_port_file=" + stem + ".http", "--host=127.0.0.1"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto proc = testing::Subprocess::Start(
      testing::RunfilePath("serving/ps_serve"), args, stem + ".log");
  REQUIRE_OK(proc.status());
  absl::StatusOr<int> port = testing::WaitForPortFile(
      stem + ".port", proc->get(), absl::Seconds(60), "ps_serve");
  REQUIRE_OK(port.status());
  absl::StatusOr<int> http = testing::WaitForPortFile(
      stem + ".http", proc->get(), absl::Seconds(5), "ps_serve");
  REQUIRE_OK(http.status());
  ServeProcess s;
  s.process = *std::move(proc);
  s.address = absl::StrCat("127.0.0.1:", *port);
  s.stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(s.address, grpc::InsecureChannelCredentials()));
  s.http_port = *http;
  return s;
}

}  // namespace asyncps
