#include "server/health_listener.h"

#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<HealthListener>> HealthListener::Start(
    const std::string& host, int port, std::vector<std::string> services,
    bool serving) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("health port must be in [0, 65535], got ", port));
  }
  std::unique_ptr<HealthListener> h(new HealthListener());
  h->services_ = std::move(services);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const bool v6 = host.find(':') != std::string::npos;
  const std::string listen =
      absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           &h->port_);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxHealthRequestBytes);
  builder.RegisterService(&h->reflection_v1_);
  builder.RegisterService(&h->reflection_v1alpha_);
  h->server_ = builder.BuildAndStart();
  if (h->server_ == nullptr || h->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for health checks on ", listen,
                     " (address in use or not available?)"));
  }
  h->SetServing(serving);
  if (grpc::HealthCheckServiceInterface* health =
          h->server_->GetHealthCheckService();
      health != nullptr) {
    health->SetServingStatus(kProcessService, true);
  }
  return h;
}

void HealthListener::SetServing(bool serving) {
  if (server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  for (const std::string& s : services_) health->SetServingStatus(s, serving);
}

void HealthListener::Stop() {
  if (server_ == nullptr) return;
  SetServing(false);
  if (grpc::HealthCheckServiceInterface* health =
          server_->GetHealthCheckService();
      health != nullptr) {
    health->SetServingStatus(kProcessService, false);
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
}

HealthListener::~HealthListener() { Stop(); }

}  // namespace asyncps
