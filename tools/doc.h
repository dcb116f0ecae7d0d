#ifndef ASYNCPS_TOOLS_DOC_H_
#define ASYNCPS_TOOLS_DOC_H_

// A JSON-shaped value psctl builds once and prints as JSON or YAML, so both
// formats always say the same thing with the same types.
//
// Types are fixed by meaning, never by the width of a protobuf field:
// counts, sizes, clocks and durations are numbers (64-bit ones too, unlike
// protobuf's JSON mapping, which writes them as strings); identifiers that
// may exceed 2^53 (a worker's incarnation) are decimal strings.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/message.h"

namespace asyncps {

class Doc {
 public:
  static Doc Null() { return Doc(Kind::kNull, "null"); }
  static Doc Bool(bool v) { return Doc(Kind::kScalar, v ? "true" : "false"); }
  static Doc Int(int64_t v);
  static Doc Uint(uint64_t v);
  static Doc Double(double v);  // non-finite values become null
  static Doc String(std::string v);
  static Doc Array() { return Doc(Kind::kArray, ""); }
  static Doc Object() { return Doc(Kind::kObject, ""); }

  // Appends to an array; returns *this.
  Doc& Add(Doc v);
  // Adds a key to an object (keys keep their order); returns *this.
  Doc& Set(std::string key, Doc v);
  // Adds every entry of the object `other` to this object; returns *this.
  Doc& Merge(const Doc& other);

  // Compact JSON with a final newline.
  std::string Json() const;
  // Block-style YAML (strings double-quoted) with a final newline.
  std::string Yaml() const;

 private:
  enum class Kind { kNull, kScalar, kString, kArray, kObject };
  Doc(Kind kind, std::string text) : kind_(kind), text_(std::move(text)) {}

  void AppendJson(std::string* out) const;
  void AppendYaml(std::string* out, int indent, bool inline_start) const;

  Kind kind_;
  std::string text_;  // scalar: its literal; string: the raw value
  std::vector<std::pair<std::string, Doc>> items_;  // array: keys empty
};

// A protobuf message as a Doc, with the proto field names: every field
// (defaults included), enums by name, 64-bit integers as numbers except
// fields named "incarnation" (strings), repeated fields as arrays.
Doc DocFromMessage(const google::protobuf::Message& message);

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(const std::string& s);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_DOC_H_
