#include "common/http_listener.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {

HttpListener::HttpListener(std::string what, HttpConnectionLimits limits,
                           Routes routes)
    : what_(std::move(what)), limits_(limits), routes_(std::move(routes)) {}

HttpListener::~HttpListener() { Stop(); }

absl::StatusOr<int> HttpListener::Start(const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, " port must be in [0, 65535], got ", port));
  }
  absl::MutexLock l(&mu_);
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what_, " server already started"));
  }
  auto server = std::make_unique<GatedHttpServer>(limits_);
  // Idle keep-alive connections do not delay Stop() for long.
  server->set_keep_alive_timeout(1);
  server->set_read_timeout(5);
  server->set_write_timeout(5);
  // Bodies larger than this are refused (413) unread; routes that take
  // larger ones (REST inference) raise it. httplib's default is unlimited:
  // three 400 MB POSTs to a shard's /metrics took it to 914 MB.
  server->set_payload_max_length(kDefaultMaxBodyBytes);
  // httplib checks that limit before reading only against Content-Length;
  // a chunked body it reads whole first (three chunked 400 MB POSTs to
  // /metrics, limit set: 1.1 GB), so bodies must come with their length.
  server->set_pre_routing_handler(
      [](const httplib::Request& req, httplib::Response& res) {
        if (!req.has_header("Transfer-Encoding")) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        res.status = 411;  // Length Required
        res.set_header("Connection", "close");
        res.set_content(
            "request bodies must be sent with Content-Length (chunked "
            "transfer encoding is not accepted)\n",
            "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      });
  // httplib's default also sets SO_REUSEPORT, which would let a leftover
  // process share the port and answer half the requests; keep only
  // SO_REUSEADDR (fast restart after TIME_WAIT).
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    // An IPv6 socket on "::" takes IPv4 too (fails harmlessly on IPv4).
    int no = 0;
    setsockopt(sock, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
  });
  routes_(server.get());

  int bound = port;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
    if (bound <= 0) bound = -1;
  } else if (!server->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0 || !server->SetBacklog(SOMAXCONN)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for ", what_, " on ", host, ":", port,
                     " (address in use or not available?)"));
  }
  GatedHttpServer* raw = server.get();
  thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // stop() is a no-op until the loop runs, so Stop() could miss a server
  // still starting up; wait (bounded) for the loop before returning.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!raw->is_running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  server_ = std::move(server);
  if (!server_->is_running()) {
    // Stop() still cleans up once the loop has come up.
    return absl::UnavailableError(
        absl::StrCat(what_, " server did not start serving"));
  }
  return bound;
}

int HttpListener::active_connections() {
  absl::MutexLock l(&mu_);
  return server_ == nullptr ? 0 : server_->gate().active();
}

void HttpListener::Stop() {
  std::unique_ptr<GatedHttpServer> server;
  std::thread thread;
  {
    absl::MutexLock l(&mu_);
    server = std::move(server_);
    thread = std::move(thread_);
  }
  if (server != nullptr) server->stop();
  if (thread.joinable()) thread.join();
}

}  // namespace asyncps
