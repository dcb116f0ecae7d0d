#include "common/names.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

constexpr size_t kQuotedBytes = 64;

// Length of the UTF-8 sequence starting at s[i], or 0 if it is malformed.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b = byte(i);
  if (b < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((b & 0xe0) == 0xc0) {
    len = 2;
    cp = b & 0x1f;
  } else if ((b & 0xf0) == 0xe0) {
    len = 3;
    cp = b & 0x0f;
  } else if ((b & 0xf8) == 0xf0) {
    len = 4;
    cp = b & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
    return 0;
  }
  return len;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

absl::Status CheckName(absl::string_view what, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be 1..", kMaxNameBytes, " bytes, got ",
                     name.size(), name.empty() ? "" : ": ", QuoteName(name)));
  }
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid UTF-8: ", QuoteName(name)));
  }
  for (char c : name) {
    if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " contains a control character: ", QuoteName(name)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRunId(absl::string_view run_id) {
  if (run_id.size() > kMaxRunIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a run id is at most ", kMaxRunIdBytes, " bytes, got ", run_id.size()));
  }
  for (char c : run_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        absl::string_view("._:@/+-").find(c) == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("a run id holds letters, digits and ._:@/+- only; got ",
                       QuoteName(run_id)));
    }
  }
  if (run_id == "any") {
    return absl::InvalidArgumentError(
        "'any' is reserved (ps_server --adopt_run=any), not a run id");
  }
  return absl::OkStatus();
}

std::string QuoteName(absl::string_view name) {
  std::string out = "'";
  size_t i = 0;
  while (i < name.size() && i < kQuotedBytes) {
    const size_t n = Utf8SequenceLength(name, i);
    const uint8_t b = static_cast<uint8_t>(name[i]);
    if (n == 0 || i + n > kQuotedBytes || (n == 1 && (b < 0x20 || b == 0x7f))) {
      if (n != 0 && i + n > kQuotedBytes && b >= 0x80) break;  // cut here
      absl::StrAppend(&out, absl::CHexEscape(name.substr(i, 1)));
      ++i;
      continue;
    }
    out.append(name.data() + i, n);
    i += n;
  }
  out += "'";
  if (i < name.size()) absl::StrAppend(&out, "...(", name.size(), " bytes)");
  return out;
}

}  // namespace asyncps
