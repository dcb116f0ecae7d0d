#ifndef ASYNCPS_SERVING_HTTP_CODING_H_
#define ASYNCPS_SERVING_HTTP_CODING_H_

// Content codings of ps_serve's REST bodies (RFC 9110 section 8.4): which
// Content-Encoding a request body may carry, which one an answer takes
// from the request's Accept-Encoding, and compressing an answer with zlib.
// Request bodies are inflated while they are read, by the HTTP layer
// (cpp-httplib's zlib stream, 16 KiB of output at a time), into a reader
// that stops at the size limit (rest_endpoint.cc), so a small body that
// inflates past it is refused before it is inflated whole.
//
// Example:
//
//   ContentCoding c = AnswerCoding(req.get_header_value("Accept-Encoding"));
//   absl::StatusOr<std::string> packed = Compress(body, c);
//   if (c != ContentCoding::kIdentity && packed.ok()) {
//     res.set_header("Content-Encoding", CodingName(c));  // *packed is sent
//   }

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

enum class ContentCoding { kIdentity, kGzip, kDeflate };

// "identity", "gzip" or "deflate".
const char* CodingName(ContentCoding coding);

// The coding of a request body by its Content-Encoding header: "" or
// identity, gzip, deflate (the zlib format); anything else (a list of
// codings, br, compress, ...) is UNIMPLEMENTED, naming what is taken.
absl::StatusOr<ContentCoding> RequestCoding(absl::string_view content_encoding);

// The coding of an answer for a request's Accept-Encoding header: gzip or
// deflate, whichever has the higher q-value above 0 (gzip on a tie; "*"
// stands for both), else identity.
ContentCoding AnswerCoding(absl::string_view accept_encoding);

// `body` in `coding` (gzip: RFC 1952; deflate: the zlib format, RFC 1950);
// an error only when zlib fails (no memory).
absl::StatusOr<std::string> Compress(absl::string_view body,
                                     ContentCoding coding);

}  // namespace asyncps

#endif  // ASYNCPS_SERVING_HTTP_CODING_H_
