// A backup's end of the Follow stream against a primary that is only a
// gRPC server sending given bytes: an entry it sends is taken as the
// start of the feed; a message that does not read as a FollowFeed ends
// the follow with INVALID_ARGUMENT at once (the call is cancelled, not
// left open) and puts nothing in the log.

#include "server/follower.h"

#include <grpcpp/generic/async_generic_service.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/fast_frame.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

// Answers every call by reading the first message, writing `message`, and
// keeping the call open until the caller cancels it (or the server shuts
// down).
class OneMessagePrimary final : public grpc::CallbackGenericService {
 public:
  explicit OneMessagePrimary(grpc::ByteBuffer message)
      : message_(std::move(message)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    methods_.push_back(ctx->method());
    return new Call(message_);
  }

  std::vector<std::string> methods_;

 private:
  class Call final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Call(const grpc::ByteBuffer& message) : out_(message) {
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (ok && !wrote_) {
        wrote_ = true;
        StartWrite(&out_);
      }
    }
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer in_, out_;
    bool wrote_ = false;
  };

  grpc::ByteBuffer message_;
};

struct Primary {
  explicit Primary(grpc::ByteBuffer message) : service(std::move(message)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterCallbackGenericService(&service);
    // Takes the follower's keepalive pings as a shard does: a call stays
    // open until one side ends it.
    builder.AddChannelArgument(
        GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
  }
  ~Primary() { server->Shutdown(std::chrono::system_clock::now()); }

  OneMessagePrimary service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

FollowerOptions Options(int port, ReplicationLog* log) {
  FollowerOptions o;
  o.primary = absl::StrCat("127.0.0.1:", port);
  o.request.set_run_id("r");
  o.request.set_address("127.0.0.1:1");
  o.log = log;
  o.logger = std::make_shared<spdlog::logger>("follower_test");
  return o;
}

// Connect, given at most 10 s (the primary shuts down after that, which
// ends any call still open).
absl::StatusOr<std::unique_ptr<Follower>> ConnectWithin10s(
    Primary* primary, ReplicationLog* log) {
  auto connect = std::async(std::launch::async, [&] {
    return Follower::Connect(Options(primary->port, log), absl::Seconds(5));
  });
  if (connect.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    FAIL_CHECK("Connect did not return within 10 s");
    primary->server->Shutdown(std::chrono::system_clock::now());
  }
  return connect.get();
}

TEST_CASE(
    "a primary's message that does not read ends the follow at once with "
    "INVALID_ARGUMENT and logs nothing",
    "[replication][bad_input]") {
  // An entry whose length runs past the message; one whose grads field
  // (8) does: both are cut short.
  for (const std::string& bytes : {std::string("\x12\xff\xff\xff\x0f", 5),
                                   std::string("\x12\x04\x42\x09zz", 6)}) {
    grpc::Slice slice(bytes);
    Primary bad(grpc::ByteBuffer(&slice, 1));
    ReplicationLog log({});
    absl::StatusOr<std::unique_ptr<Follower>> f = ConnectWithin10s(&bad, &log);
    INFO(f.status().ToString());
    CHECK(absl::IsInvalidArgument(f.status()));
    CHECK(f.status().message().find("malformed") != std::string::npos);
    CHECK(log.last_index() == 0);
    REQUIRE(bad.service.methods_.size() == 1);
    CHECK(bad.service.methods_[0] == "/asyncps.Replication/Follow");
  }
}

TEST_CASE("an entry the primary sends first starts the feed", "[replication]") {
  FollowFeed first;
  first.mutable_entry()->set_index(1);
  first.mutable_entry()->mutable_heartbeat()->set_run_id("r");
  Primary primary(SerializeToByteBuffer(first));
  ReplicationLog log({});
  absl::StatusOr<std::unique_ptr<Follower>> f =
      ConnectWithin10s(&primary, &log);
  REQUIRE_OK(f.status());
  (*f)->Stop();  // never started: the stream ends, nothing applied
  CHECK(log.last_index() == 0);
}

}  // namespace
}  // namespace asyncps
