#ifndef ASYNCPS_COMMON_PARSE_REFUSAL_H_
#define ASYNCPS_COMMON_PARSE_REFUSAL_H_

// Requests whose bytes do not parse as their method's message. gRPC's
// generated services (typed messages) answer them INTERNAL with an empty
// message (synchronous handlers: grpcpp's GenericDeserialize) or
// UNIMPLEMENTED (callback handlers), which read as a bug in the server or
// a missing method; services that parse their own bytes (the ParameterServer
// data path) answer INVALID_ARGUMENT "does not parse". The interceptors of this
// factory give the generated services' unary and server-streaming methods
// the same answer: INVALID_ARGUMENT naming the method; nothing ran.
//
// Example:
//
//   interceptors.push_back(ParseRefusalFactory({"/asyncps.ParameterServer/"}));
//   builder.experimental().SetInterceptorCreators(std::move(interceptors));

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace asyncps {

// Methods whose path starts with one of `skip` get no interceptor (those
// that parse their own bytes: a hot path pays nothing).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ParseRefusalFactory(std::vector<std::string> skip);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PARSE_REFUSAL_H_
