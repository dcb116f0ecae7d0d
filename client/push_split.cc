#include "client/push_split.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace asyncps {

namespace {

// Reads a payload held in pieces, in order, as sub-slices of the pieces.
class PayloadCursor {
 public:
  explicit PayloadCursor(const std::vector<grpc::Slice>& pieces)
      : pieces_(pieces) {}

  // The next `n` bytes, appended to `out` as pieces; false when fewer are
  // left.
  bool Take(size_t n, std::vector<grpc::Slice>* out) {
    while (n > 0) {
      if (piece_ == pieces_.size()) return false;
      const grpc::Slice& p = pieces_[piece_];
      const size_t take = std::min(n, p.size() - offset_);
      if (take > 0) out->push_back(p.sub(offset_, offset_ + take));
      offset_ += take;
      n -= take;
      if (offset_ == p.size()) {
        ++piece_;
        offset_ = 0;
      }
    }
    return true;
  }

  bool done() const {
    size_t piece = piece_, offset = offset_;
    while (piece < pieces_.size() && offset == pieces_[piece].size()) {
      ++piece;
      offset = 0;
    }
    return piece == pieces_.size();
  }

 private:
  const std::vector<grpc::Slice>& pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
};

// One destination's part while it is built: slices' and rows' payloads
// apart (a frame carries every slice before any row).
struct Building {
  bool used = false;
  PushRequest header;
  std::vector<grpc::Slice> grads, rows;
  // Per table name: its entry in header.rows.
  std::vector<std::pair<std::string, int>> tables;
};

RowsGradient* TableEntry(Building* b, const std::string& table) {
  for (const auto& [name, k] : b->tables) {
    if (name == table) return b->header.mutable_rows(k);
  }
  b->tables.emplace_back(table, b->header.rows_size());
  RowsGradient* out = b->header.add_rows();
  out->set_table(table);
  return out;
}

absl::Status SplitOne(const PushPart& part, const ShardMap& map,
                      std::vector<Building>* out) {
  PayloadCursor cursor(part.payload);
  const PushRequest& h = part.header;
  for (const SliceGradient& g : h.grads()) {
    Building& b = (*out)[map.SliceHome(g.tensor(), g.slice())];
    b.used = true;
    if (!cursor.Take(g.grad_bytes(), &b.grads)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the payload ends within slice ", g.slice(), " of tensor ",
          QuoteName(g.tensor()), " (grad_bytes ", g.grad_bytes(), ")"));
    }
    *b.header.add_grads() = g;
  }
  for (const RowsGradient& r : h.rows()) {
    const int ids = r.ids_size();
    if (ids == 0) continue;
    if (r.grad_bytes() % ids != 0 || r.read_versions_size() > ids) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows of table ", QuoteName(r.table()), ": grad_bytes ",
                       r.grad_bytes(), " for ", ids, " ids and ",
                       r.read_versions_size(), " read versions"));
    }
    const size_t row_bytes = r.grad_bytes() / ids;
    const ShardMap::TableKey key = ShardMap::KeyOf(r.table());
    for (int i = 0; i < ids; ++i) {
      Building& b = (*out)[map.RowHome(key, r.ids(i))];
      b.used = true;
      RowsGradient* to = TableEntry(&b, r.table());
      to->add_ids(r.ids(i));
      if (r.read_versions_size() > 0) {
        to->add_read_versions(i < r.read_versions_size() ? r.read_versions(i)
                                                         : 0);
      }
      to->set_grad_bytes(to->grad_bytes() + row_bytes);
      if (!cursor.Take(row_bytes, &b.rows)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the payload ends within row ", r.ids(i), " of table ",
                         QuoteName(r.table())));
      }
    }
  }
  if (!cursor.done()) {
    return absl::InvalidArgumentError(
        "the payload holds bytes beyond the gradients' grad_bytes");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PushPart>> SplitPushParts(
    absl::Span<const PushPart> parts, const ShardMap& map) {
  std::vector<PushPart> result;
  if (parts.empty()) return result;
  const int n = map.num_shards();
  std::vector<Building> out(n);
  PushRequest base = parts[0].header;
  base.clear_grads();
  base.clear_rows();
  base.set_read_epoch(0);
  for (Building& b : out) b.header = base;
  for (const PushPart& part : parts) {
    if (part.shard < 0 || part.shard >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a part of shard ", part.shard, " for a map of ", n, " shards"));
    }
    // A refused shard that still owns slots gets its (maybe empty) part
    // again, so that it sees the clock; one that owns none any more (psctl
    // scale drained it, and it may be stopped) gets only what goes to it.
    Building& own = out[part.shard];
    const std::vector<int>& serving = map.serving_shards();
    own.used = std::binary_search(serving.begin(), serving.end(), part.shard);
    own.header.set_read_epoch(part.header.read_epoch());
  }
  for (const PushPart& part : parts) {
    absl::Status s = SplitOne(part, map, &out);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the push part of shard ", part.shard, ": ", s.message()));
    }
  }
  for (int s = 0; s < n; ++s) {
    Building& b = out[s];
    if (!b.used) continue;
    PushPart part;
    part.shard = s;
    part.header = std::move(b.header);
    part.payload = std::move(b.grads);
    for (grpc::Slice& piece : b.rows) part.payload.push_back(std::move(piece));
    result.push_back(std::move(part));
  }
  return result;
}

}  // namespace asyncps
