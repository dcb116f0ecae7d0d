#include "common/parse_refusal.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

namespace {

using grpc::experimental::InterceptionHookPoints;

// One call of a method with a single request message: a request that did
// not deserialize (the handler never ran) is answered INVALID_ARGUMENT.
class ParseRefusal final : public grpc::experimental::Interceptor {
 public:
  explicit ParseRefusal(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        m->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ &&
        m->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS) &&
        Refusal(m->GetSendStatus().error_code())) {
      m->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("request does not parse as the request message of ",
                       method_)));
    }
    m->Proceed();
  }

 private:
  // gRPC's answer to a request that did not deserialize: INTERNAL from a
  // synchronous handler, UNIMPLEMENTED from a callback one.
  static bool Refusal(grpc::StatusCode code) {
    return code == grpc::StatusCode::INTERNAL ||
           code == grpc::StatusCode::UNIMPLEMENTED;
  }

  const std::string method_;
  bool unparsed_ = false;
};

class ParseRefusalFactoryImpl final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ParseRefusalFactoryImpl(std::vector<std::string> skip)
      : skip_(std::move(skip)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    using Type = grpc::experimental::ServerRpcInfo::Type;
    const char* method = info->method();
    // A stream of requests ends with a read that gets no message: not a
    // parse failure.
    if (method == nullptr || (info->type() != Type::UNARY &&
                              info->type() != Type::SERVER_STREAMING)) {
      return nullptr;
    }
    for (const std::string& prefix : skip_) {
      if (absl::StartsWith(method, prefix)) return nullptr;
    }
    return new ParseRefusal(method);
  }

 private:
  const std::vector<std::string> skip_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ParseRefusalFactory(std::vector<std::string> skip) {
  return std::make_unique<ParseRefusalFactoryImpl>(std::move(skip));
}

}  // namespace asyncps
