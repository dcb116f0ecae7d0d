#include "serving/http_coding.h"

#include <zlib.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {

const char* CodingName(ContentCoding coding) {
  switch (coding) {
    case ContentCoding::kGzip:
      return "gzip";
    case ContentCoding::kDeflate:
      return "deflate";
    case ContentCoding::kIdentity:
      break;
  }
  return "identity";
}

absl::StatusOr<ContentCoding> RequestCoding(
    absl::string_view content_encoding) {
  const std::string c =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(content_encoding));
  if (c.empty() || c == "identity") return ContentCoding::kIdentity;
  if (c == "gzip") return ContentCoding::kGzip;
  if (c == "deflate") return ContentCoding::kDeflate;
  return absl::UnimplementedError(
      absl::StrCat("Content-Encoding '", content_encoding,
                   "' is not taken (gzip, deflate or identity)"));
}

ContentCoding AnswerCoding(absl::string_view accept_encoding) {
  // q-values; -1: not named.
  double gzip = -1, deflate = -1, any = -1;
  for (absl::string_view item : absl::StrSplit(accept_encoding, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    const std::string name =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(parts[0]));
    double q = 1;
    for (size_t i = 1; i < parts.size(); ++i) {
      absl::string_view p = absl::StripAsciiWhitespace(parts[i]);
      if ((absl::ConsumePrefix(&p, "q=") || absl::ConsumePrefix(&p, "Q=")) &&
          !absl::SimpleAtod(p, &q)) {
        q = 0;
      }
    }
    if (name == "gzip" || name == "x-gzip") gzip = q;
    if (name == "deflate") deflate = q;
    if (name == "*") any = q;
  }
  // "*" covers the codings the header does not name.
  if (gzip < 0) gzip = any;
  if (deflate < 0) deflate = any;
  if (gzip > 0 && gzip >= deflate) return ContentCoding::kGzip;
  if (deflate > 0) return ContentCoding::kDeflate;
  return ContentCoding::kIdentity;
}

absl::StatusOr<std::string> Compress(absl::string_view body,
                                     ContentCoding coding) {
  if (coding == ContentCoding::kIdentity) return std::string(body);
  z_stream z{};
  // 15 window bits; +16 writes the gzip wrapper instead of zlib's.
  const int bits = coding == ContentCoding::kGzip ? 15 + 16 : 15;
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, bits, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::ResourceExhaustedError("zlib: no memory to compress");
  }
  std::string out(deflateBound(&z, body.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
  z.avail_in = static_cast<uInt>(body.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  // deflateBound leaves room for the whole stream: one call finishes it.
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return absl::InternalError(absl::StrCat("zlib deflate returned ", rc));
  }
  return out;
}

}  // namespace asyncps
