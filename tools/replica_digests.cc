#include "tools/replica_digests.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/net.h"
#include "proto/asyncps.grpc.pb.h"

namespace asyncps {
namespace {

std::string Hex(uint64_t digest) { return absl::StrFormat("%016x", digest); }

// A backup's own answer, asked for its digest.
ReplicaDigest AskBackup(int shard, const std::string& address,
                        const SecurityOptions& security,
                        absl::Duration timeout) {
  ReplicaDigest d;
  d.shard = shard;
  d.address = address;
  auto stub = ParameterServer::NewStub(MakeChannel(address, 0, security));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  StatusRequest request;
  request.set_state_digest(true);
  StatusResponse response;
  const grpc::Status st = stub->Status(&ctx, request, &response);
  if (!st.ok()) {
    d.error = absl::StrCat(st.error_code(), ": ", st.error_message());
    return d;
  }
  d.role = response.replica().role();
  d.log_index = response.replica().log_index();
  d.digest = response.replica().state_digest();
  return d;
}

}  // namespace

std::vector<ReplicaDigest> GatherDigests(
    const std::vector<ShardResult>& primaries, const SecurityOptions& security,
    absl::Duration timeout) {
  std::vector<ReplicaDigest> out;
  for (const ShardResult& r : primaries) {
    if (!r.up || !r.status.has_replica()) continue;
    const ReplicaStatus& rs = r.status.replica();
    ReplicaDigest own;
    own.shard = r.index;
    own.address = r.address;
    own.role = rs.role();
    own.log_index = rs.log_index();
    own.digest = rs.state_digest();
    out.push_back(own);
    for (const ReplicaStatus::Backup& b : rs.backups()) {
      out.push_back(AskBackup(r.index, b.address(), security, timeout));
    }
  }
  return out;
}

std::vector<std::string> DigestProblems(
    const std::vector<ReplicaDigest>& digests) {
  std::vector<std::string> problems;
  // Per (shard, entry): the first replica seen there.
  std::map<std::pair<int, uint64_t>, const ReplicaDigest*> first;
  for (const ReplicaDigest& d : digests) {
    if (!d.error.empty()) continue;
    auto [it, inserted] = first.try_emplace({d.shard, d.log_index}, &d);
    if (inserted || it->second->digest == d.digest) continue;
    problems.push_back(absl::StrCat(
        "shard ", d.shard, ": replicas at entry ", d.log_index,
        " differ: ", it->second->address, " ", Hex(it->second->digest),
        " against ", d.address, " ", Hex(d.digest)));
  }
  return problems;
}

std::string DigestsText(const std::vector<ReplicaDigest>& digests) {
  TextTable t({"SHARD", "ROLE", "ADDRESS", "ENTRY", "DIGEST"},
              /*left_columns=*/3);
  for (const ReplicaDigest& d : digests) {
    if (!d.error.empty()) {
      t.AddRow({absl::StrCat(d.shard), "DOWN", d.address, "", d.error});
      continue;
    }
    t.AddRow({absl::StrCat(d.shard), d.role, d.address,
              absl::StrCat(d.log_index), Hex(d.digest)});
  }
  std::string text = absl::StrCat("\n", t.Render());
  for (const std::string& p : DigestProblems(digests)) {
    absl::StrAppend(&text, "WARNING: ", p, "\n");
  }
  return text;
}

Doc DigestsDoc(const std::vector<ReplicaDigest>& digests) {
  Doc rows = Doc::Array();
  for (const ReplicaDigest& d : digests) {
    Doc row = Doc::Object();
    row.Set("shard", Doc::Int(d.shard)).Set("address", Doc::String(d.address));
    if (!d.error.empty()) {
      row.Set("error", Doc::String(d.error));
    } else {
      row.Set("role", Doc::String(d.role))
          .Set("entry", Doc::Uint(d.log_index))
          .Set("digest", Doc::String(Hex(d.digest)));
    }
    rows.Add(std::move(row));
  }
  Doc problems = Doc::Array();
  for (std::string& p : DigestProblems(digests)) {
    problems.Add(Doc::String(std::move(p)));
  }
  Doc doc = Doc::Object();
  doc.Set("replicas", std::move(rows)).Set("problems", std::move(problems));
  return doc;
}

}  // namespace asyncps
