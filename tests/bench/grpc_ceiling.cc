#include "tests/bench/grpc_ceiling.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/data_stream.h"
#include "common/net.h"
#include "common/port_file.h"
#include "tests/bench/ceiling_model.h"

namespace asyncps {
namespace bench {
namespace {

constexpr char kMethod[] = "/asyncps.bench.Ceiling/Stream";
constexpr uint32_t kPush = 1;
constexpr uint32_t kPull = 2;
constexpr float kLearningRate = 1e-6f;

struct Header {
  uint64_t id;
  uint32_t op;
  uint32_t bytes;
};

// Copies the first `n` bytes of `slices` to `out`; false if there are fewer.
bool CopyPrefix(const std::vector<grpc::Slice>& slices, void* out, size_t n) {
  char* dst = static_cast<char*>(out);
  for (const grpc::Slice& s : slices) {
    if (n == 0) break;
    const size_t take = std::min(n, s.size());
    std::memcpy(dst, s.begin(), take);
    dst += take;
    n -= take;
  }
  return n == 0;
}

// w[i] -= lr * g[i] over the floats of `slices` after the first `skip`
// bytes, wherever the slice boundaries cut them; returns the floats seen.
size_t ApplySgd(const std::vector<grpc::Slice>& slices, size_t skip, float* w,
                size_t n) {
  size_t at = 0;
  char carry[sizeof(float)];
  size_t have = 0;
  for (const grpc::Slice& s : slices) {
    const char* p = reinterpret_cast<const char*>(s.begin());
    size_t len = s.size();
    if (skip >= len) {
      skip -= len;
      continue;
    }
    p += skip;
    len -= skip;
    skip = 0;
    if (have > 0) {
      const size_t take = std::min(sizeof(float) - have, len);
      std::memcpy(carry + have, p, take);
      have += take;
      p += take;
      len -= take;
      if (have < sizeof(float)) continue;
      float g;
      std::memcpy(&g, carry, sizeof(g));
      if (at < n) w[at] -= kLearningRate * g;
      ++at;
      have = 0;
    }
    const size_t run = std::min(len / sizeof(float), n > at ? n - at : 0);
    float* __restrict wp = w + at;
    for (size_t i = 0; i < run; ++i) {
      float g;
      std::memcpy(&g, p + i * sizeof(float), sizeof(g));
      wp[i] -= kLearningRate * g;
    }
    at += run;
    p += run * sizeof(float);
    len -= run * sizeof(float);
    std::memcpy(carry, p, std::min(len, sizeof(carry)));
    have = std::min(len, sizeof(carry));
  }
  return at;
}

// One stream on the server: reads requests one after the other, answers
// each in order.
class Stream : public grpc::ServerGenericBidiReactor {
 public:
  explicit Stream(CeilingModel* model) : model_(model) { StartRead(&in_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock l(&mu_);
      reads_ended_ = true;
      FinishIfIdle();
      return;
    }
    std::vector<grpc::Slice> slices;
    Header h{};
    if (!in_.Dump(&slices).ok() || !CopyPrefix(slices, &h, sizeof(h))) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad header"));
      return;
    }
    const size_t n = h.bytes / sizeof(float);
    float* w = model_->Next(n, &own_);
    grpc::ByteBuffer answer;
    if (h.op == kPush) {
      ApplySgd(slices, sizeof(h), w, n);
      grpc::Slice id(&h.id, sizeof(h.id));
      answer = grpc::ByteBuffer(&id, 1);
    } else {
      grpc::Slice out(sizeof(h.id) + n * sizeof(float));
      char* p = const_cast<char*>(reinterpret_cast<const char*>(out.begin()));
      std::memcpy(p, &h.id, sizeof(h.id));
      std::memcpy(p + sizeof(h.id), w, n * sizeof(float));
      answer = grpc::ByteBuffer(&out, 1);
    }
    Write(std::move(answer));
    in_.Clear();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    grpc::ByteBuffer* next = nullptr;
    {
      absl::MutexLock l(&mu_);
      writes_.pop_front();
      if (!ok) {
        writes_.clear();
        failed_ = true;
      }
      if (!writes_.empty()) {
        next = &writes_.front();
      } else {
        writing_ = false;
        FinishIfIdle();
      }
    }
    if (next != nullptr) StartWrite(next);
  }

  void OnDone() override { delete this; }

 private:
  void Write(grpc::ByteBuffer answer) {
    grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock l(&mu_);
      if (failed_) return;
      writes_.push_back(std::move(answer));
      if (!writing_) {
        writing_ = true;
        start = &writes_.front();
      }
    }
    if (start != nullptr) StartWrite(start);
  }

  void FinishIfIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_ended_ && !writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  CeilingModel* const model_;
  grpc::ByteBuffer in_;     // touched only by the one read in flight
  std::vector<float> own_;  // this stream's parameters, touched by reads only
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class Service : public grpc::CallbackGenericService {
 public:
  explicit Service(size_t model_floats) : model_(model_floats) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    return new Stream(&model_);
  }

 private:
  CeilingModel model_;
};

absl::StatusOr<uint64_t> AnswerId(const grpc::ByteBuffer& answer) {
  std::vector<grpc::Slice> slices;
  uint64_t id = 0;
  if (!answer.Dump(&slices).ok() || !CopyPrefix(slices, &id, sizeof(id))) {
    return absl::InternalError("short answer");
  }
  return id;
}

// Copies the payload of a pull answer (after the id) into `out`.
void CopyPayload(const grpc::ByteBuffer& answer, char* out, size_t n) {
  std::vector<grpc::Slice> slices;
  if (!answer.Dump(&slices).ok()) return;
  size_t skip = sizeof(uint64_t);
  for (const grpc::Slice& s : slices) {
    size_t len = s.size();
    const char* p = reinterpret_cast<const char*>(s.begin());
    if (skip >= len) {
      skip -= len;
      continue;
    }
    p += skip;
    len = std::min(len - skip, n);
    skip = 0;
    std::memcpy(out, p, len);
    out += len;
    n -= len;
  }
}

}  // namespace

int GrpcCeilingServerMain(const std::string& port_file, int64_t model_bytes) {
  TuneProcess();  // as ps_server does
  Service service(static_cast<size_t>(model_bytes) / sizeof(float));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  // The same transport settings as ps_server's.
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || !WritePortFile(port_file, port).ok()) {
    std::fprintf(stderr, "grpc_ceiling: cannot serve\n");
    return 1;
  }
  server->Wait();
  return 1;
}

absl::StatusOr<int64_t> RunGrpcCeilingClient(
    const GrpcCeilingLoad& load, std::chrono::steady_clock::time_point start,
    std::chrono::steady_clock::time_point until,
    const std::function<void(std::chrono::steady_clock::time_point)>&
        on_start) {
  const size_t k = load.servers.size();
  const size_t floats = static_cast<size_t>(load.bytes) / sizeof(float);
  const int slots = std::max(1, load.inflight);
  DrivenQueue queue;  // outlives the streams
  std::vector<std::vector<std::unique_ptr<DataStream>>> streams(k);
  // bufs[slot][server]: a call's share for each server.
  std::vector<std::vector<std::vector<float>>> bufs(
      slots, std::vector<std::vector<float>>(k));
  for (size_t s = 0; s < k; ++s) {
    for (int c = 0; c < std::max(1, load.connections); ++c) {
      std::shared_ptr<grpc::Channel> channel = MakeChannel(load.servers[s], c);
      if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                     std::chrono::seconds(30))) {
        return absl::UnavailableError(
            absl::StrCat("no connection to ", load.servers[s], " within 30 s"));
      }
      streams[s].push_back(
          std::make_unique<DataStream>(channel, kMethod, &AnswerId, &queue));
    }
    for (auto& slot : bufs) {
      slot[s].assign(floats / k + (s < floats % k ? 1 : 0), 0.001f);
    }
  }

  std::this_thread::sleep_until(start);
  on_start(std::max(start, std::chrono::steady_clock::now()));

  // The answers complete on `queue`, driven by this thread while it waits
  // for a free slot (as PsClient's callers do).
  std::atomic<int> outstanding{0};  // calls in flight
  std::atomic<bool> failed{false};
  std::mutex mu;
  int64_t moved = 0;     // guarded by mu
  absl::Status failure;  // guarded by mu
  uint64_t next_id = 0;
  for (uint64_t call = 0;; ++call) {
    queue.WaitUntil(absl::InfiniteDuration(), [&] {
      return outstanding.load() < slots || failed.load();
    });
    if (failed.load() || std::chrono::steady_clock::now() >= until) break;
    ++outstanding;
    auto remaining = std::make_shared<size_t>(k);  // touched by the driver
    std::vector<std::vector<float>>& slot = bufs[call % slots];
    for (size_t s = 0; s < k; ++s) {
      const Header h{next_id++, load.push ? kPush : kPull,
                     static_cast<uint32_t>(slot[s].size() * sizeof(float))};
      grpc::Slice parts[2] = {
          grpc::Slice(&h, sizeof(h)),
          grpc::Slice(slot[s].data(), h.bytes, grpc::Slice::STATIC_SLICE)};
      grpc::ByteBuffer request(parts, load.push ? 2 : 1);
      char* out = reinterpret_cast<char*>(slot[s].data());
      const bool push = load.push;
      streams[s][call % streams[s].size()]->Send(
          h.id, std::move(request),
          [&, remaining, out, push, bytes = h.bytes](absl::Status st,
                                                     grpc::ByteBuffer* answer) {
            if (st.ok() && !push) CopyPayload(*answer, out, bytes);
            std::lock_guard<std::mutex> l(mu);
            if (!st.ok() && failure.ok()) {
              failure = st;
              failed.store(true);
            }
            if (--*remaining > 0) return;
            if (failure.ok()) moved += load.bytes;
            --outstanding;
          });
    }
  }
  queue.WaitUntil(absl::Seconds(30), [&] { return outstanding.load() == 0; });
  // Ends the streams; every callback has run once this returns.
  streams.clear();
  std::lock_guard<std::mutex> l(mu);
  if (!failure.ok()) return failure;
  return moved;
}

}  // namespace bench
}  // namespace asyncps
