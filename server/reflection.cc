#include "server/reflection.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fast_frame.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace asyncps {

namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// Adds `file` and, before it, everything it imports (each once).
void AddFileWithImports(const FileDescriptor* file,
                        std::set<const FileDescriptor*>* seen,
                        ServerReflectionResponse* response) {
  if (!seen->insert(file).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  response->mutable_file_descriptor_response()->add_file_descriptor_proto(
      proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileWithImports(file->dependency(i), seen, response);
  }
}

void NotFound(const std::string& what, ServerReflectionResponse* response) {
  auto* e = response->mutable_error_response();
  e->set_error_code(static_cast<int>(grpc::StatusCode::NOT_FOUND));
  e->set_error_message(what);
}

// One stream: each request read as bytes, answered in order.
class Reactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Reactor(const ReflectionAnswers* answers) : answers_(answers) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side
      Finish(grpc::Status::OK);
      return;
    }
    if (in_.Length() > ReflectionAnswers::kMaxRequestBytes) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("a reflection request of ", in_.Length(),
                                       " bytes: the limit is ",
                                       ReflectionAnswers::kMaxRequestBytes)));
      return;
    }
    ServerReflectionRequest request;
    if (absl::Status s = ParseFromByteBuffer(in_, &request); !s.ok()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          std::string(s.message())));
      return;
    }
    ServerReflectionResponse response;
    answers_->Answer(request, &response);
    out_ = SerializeToByteBuffer(response);
    StartWrite(&out_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      return;
    }
    StartRead(&in_);
  }

  void OnDone() override { delete this; }

 private:
  const ReflectionAnswers* const answers_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
};

}  // namespace

ReflectionAnswers::ReflectionAnswers(std::vector<std::string> services)
    : services_(std::move(services)) {}

template <typename Generated>
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReflectionService<Generated>::ServerReflectionInfo(
    grpc::CallbackServerContext* /*context*/) {
  return new Reactor(answers_);
}

template class ReflectionService<grpc::reflection::v1::ServerReflection>;
template class ReflectionService<grpc::reflection::v1alpha::ServerReflection>;

void ReflectionAnswers::Answer(const ServerReflectionRequest& request,
                               ServerReflectionResponse* response) const {
  response->set_valid_host(request.host());
  *response->mutable_original_request() = request;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  std::set<const FileDescriptor*> seen;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response->mutable_list_services_response()->add_service()->set_name(
            name);
      }
      return;
    case ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* f =
          pool->FindFileByName(request.file_by_filename());
      if (f == nullptr) {
        return NotFound(
            absl::StrCat("file '", request.file_by_filename(), "' not found"),
            response);
      }
      return AddFileWithImports(f, &seen, response);
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* f =
          pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (f == nullptr) {
        return NotFound(
            absl::StrCat("symbol '", request.file_containing_symbol(),
                         "' not found"),
            response);
      }
      return AddFileWithImports(f, &seen, response);
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const google::protobuf::Descriptor* type =
          pool->FindMessageTypeByName(ext.containing_type());
      const google::protobuf::FieldDescriptor* field =
          type == nullptr
              ? nullptr
              : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr) {
        return NotFound(
            absl::StrCat("extension ", ext.extension_number(), " of '",
                         ext.containing_type(), "' not found"),
            response);
      }
      return AddFileWithImports(field->file(), &seen, response);
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const google::protobuf::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        return NotFound(
            absl::StrCat("type '", request.all_extension_numbers_of_type(),
                         "' not found"),
            response);
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* numbers = response->mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const auto* e : extensions)
        numbers->add_extension_number(e->number());
      return;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      break;
  }
  auto* e = response->mutable_error_response();
  e->set_error_code(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  e->set_error_message("empty reflection request");
}

}  // namespace asyncps
