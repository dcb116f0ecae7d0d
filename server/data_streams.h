#ifndef ASYNCPS_SERVER_DATA_STREAMS_H_
#define ASYNCPS_SERVER_DATA_STREAMS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

namespace asyncps {

class PsService;

using ByteBidiReactor =
    grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// The server side of the data streams (PullStream / PushStream / StepStream in
// proto/asyncps.proto, frames as in common/fast_frame.h): one reactor per
// call, which reads requests one after the other, runs each through the
// service's steps (the same as the unary Pull and Push) and writes each
// answer, tagged with its request_id, as soon as it is ready. A request
// that fails gets an answer whose `status` says why; the stream goes on.
// The stream ends once the client is done sending and every answer is
// written.
//
//   ByteBidiReactor* PsService::PushStream(grpc::CallbackServerContext*) {
//     return NewPushStreamReactor(this);
//   }
//
// Each reactor deletes itself when its call is done; `service` must
// outlive every call.

// PushStream: each frame is applied on the thread that read it
// (PsService::DoPush), reads continue meanwhile; an assign is answered
// once a checkpoint holds it, without holding up the stream.
ByteBidiReactor* NewPushStreamReactor(PsService* service);

// PullStream: each pull waits (without a thread) as the consistency model
// says, then its frame is copied and written; answers go out in the order
// they become ready, and the caller going away cancels every wait.
ByteBidiReactor* NewPullStreamReactor(PsService* service);

// StepStream: each request's push is applied as on PushStream; once it is
// acknowledged, the pull it carries (then_pull) is served as on PullStream,
// and one frame answers both (PullResponse.push).
ByteBidiReactor* NewStepStreamReactor(PsService* service);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_DATA_STREAMS_H_
