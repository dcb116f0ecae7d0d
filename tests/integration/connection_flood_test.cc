// A flood of plain TCP connections against a real ps_server process whose
// open-files limit is small (256): more connections than it has
// descriptors. gRPC stops accepting on a port for good after one accept4()
// fails with EMFILE, and connections that take every descriptor leave the
// shard none for its checkpoints. With the accept guard
// (common/accept_guard.h) the shard keeps serving the connection it had,
// writes its checkpoint while flooded, and accepts again once the flood
// goes.

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::Subprocess;

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

// Plain TCP connections to `port` that say nothing; closed when it goes.
class Flood {
 public:
  Flood(int port, int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) break;
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(fd);
        continue;
      }
      fds_.push_back(fd);
    }
  }
  ~Flood() { Release(); }
  void Release() {
    for (int fd : fds_) close(fd);
    fds_.clear();
  }
  size_t size() const { return fds_.size(); }

 private:
  std::vector<int> fds_;
};

TEST_CASE(
    "more connections than descriptors: the shard serves what it had, "
    "checkpoints, and accepts again once they go",
    "[isolation][flood]") {
  const std::string dir = testing::MakeTmpDir("flood");
  const std::string port_file = dir + "/port";
  // ulimit -n sets both limits: the shard cannot raise its own.
  absl::StatusOr<std::unique_ptr<Subprocess>> shard = Subprocess::Start(
      "/bin/sh",
      {"-c", "ulimit -n 256 && exec \"$0\" \"$@\"",
       RunfilePath("server/ps_server"), "--port=0",
       absl::StrCat("--port_file=", port_file),
       absl::StrCat("--checkpoint_dir=", dir), "--metrics_port=0",
       absl::StrCat("--metrics_port_file=", dir, "/metrics_port")},
      dir + "/shard.log");
  REQUIRE_OK(shard.status());
  INFO("shard's log:\n" << (*shard)->LogTail());
  absl::StatusOr<int> port = testing::WaitForPortFile(
      port_file, shard->get(), absl::Seconds(30), "the shard");
  REQUIRE_OK(port.status());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  CHECK(absl::StrContains((*shard)->ReadLog(), "open files: limit 256"));

  // A client connected before the flood.
  auto stub = ParameterServer::NewStub(MakeChannel(address));
  CreateTensorRequest create;
  TensorSpec* w = create.add_tensors();
  w->set_name("w");
  w->add_shape(64);
  w->mutable_optimizer()->set_type(OPT_SGD);
  w->mutable_optimizer()->set_learning_rate(1.0f);
  CreateTensorResponse created;
  REQUIRE(stub->CreateTensor(Context(absl::Seconds(10)).get(), create, &created)
              .ok());

  Flood flood(*port, 400);
  REQUIRE(flood.size() >= 300);  // the kernel's backlog takes the rest
  // Give the shard time to accept what it will.
  absl::SleepFor(absl::Seconds(1));

  // Its descriptors are full of the flood's connections, but for the ones
  // kept: the connection it had still works, and it can write files.
  ListTensorsResponse list;
  CHECK(stub->ListTensors(Context(absl::Seconds(10)).get(),
                          ListTensorsRequest(), &list)
            .ok());
  CHECK(list.tensors_size() == 1);
  CheckpointResponse checkpoint;
  const grpc::Status wrote = stub->Checkpoint(Context(absl::Seconds(30)).get(),
                                              CheckpointRequest(), &checkpoint);
  INFO("checkpoint: " << wrote.error_message());
  CHECK(wrote.ok());
  CHECK(std::filesystem::exists(dir + "/shard-0-of-1.ckpt"));

  // The flood goes: a new client gets in (gRPC's listener used to stay
  // dead after its first EMFILE).
  flood.Release();
  auto fresh = ParameterServer::NewStub(MakeChannel(address));
  bool served = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!served && absl::Now() < deadline) {
    served = fresh
                 ->ListTensors(Context(absl::Seconds(2)).get(),
                               ListTensorsRequest(), &list)
                 .ok();
  }
  CHECK(served);
  CHECK_FALSE(absl::StrContains((*shard)->ReadLog(), "Failed accept4"));
  // What it refused is counted.
  absl::StatusOr<int> metrics_port = testing::WaitForPortFile(
      dir + "/metrics_port", shard->get(), absl::Seconds(5), "metrics");
  REQUIRE_OK(metrics_port.status());
  httplib::Client http("127.0.0.1", *metrics_port);
  httplib::Result scrape = http.Get("/metrics");
  REQUIRE(scrape);
  const std::string& text = scrape->body;
  const size_t at = text.find("\nasyncps_connections_shed_total");
  REQUIRE(at != std::string::npos);
  double shed = 0;
  const size_t space = text.find(' ', at + 1);
  REQUIRE(absl::SimpleAtod(
      text.substr(space + 1, text.find('\n', space) - space - 1), &shed));
  INFO("shed " << shed);
  CHECK(shed >= 100);  // 400 connections, at most 192 descriptors
}

}  // namespace
}  // namespace asyncps
