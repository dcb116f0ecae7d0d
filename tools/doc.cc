#include "tools/doc.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asyncps {

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One element of a (possibly repeated) field: `index` < 0 for a singular
// field.
Doc FieldValue(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  const bool as_string = f->name() == "incarnation";
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return Doc::Int(rep ? r->GetRepeatedInt32(m, f, index)
                          : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v =
          rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
      return as_string ? Doc::String(absl::StrCat(v)) : Doc::Int(v);
    }
    case FieldDescriptor::CPPTYPE_UINT32:
      return Doc::Uint(rep ? r->GetRepeatedUInt32(m, f, index)
                           : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v =
          rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
      return as_string ? Doc::String(absl::StrCat(v)) : Doc::Uint(v);
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return Doc::Double(rep ? r->GetRepeatedDouble(m, f, index)
                             : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return Doc::Double(rep ? r->GetRepeatedFloat(m, f, index)
                             : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return Doc::Bool(rep ? r->GetRepeatedBool(m, f, index)
                           : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* e = rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f);
      return Doc::String(e->name());
    }
    case FieldDescriptor::CPPTYPE_STRING:
      return Doc::String(rep ? r->GetRepeatedString(m, f, index)
                             : r->GetString(m, f));
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return DocFromMessage(rep ? r->GetRepeatedMessage(m, f, index)
                                : r->GetMessage(m, f));
  }
  return Doc::Null();
}

// YAML needs no quotes for our keys (proto field names, fixed words).
std::string Indent(int n) { return std::string(static_cast<size_t>(n), ' '); }

}  // namespace

Doc Doc::Int(int64_t v) { return Doc(Kind::kScalar, absl::StrCat(v)); }
Doc Doc::Uint(uint64_t v) { return Doc(Kind::kScalar, absl::StrCat(v)); }

Doc Doc::Double(double v) {
  if (!std::isfinite(v)) return Null();
  return Doc(Kind::kScalar, absl::StrFormat("%.6g", v));
}

Doc Doc::String(std::string v) { return Doc(Kind::kString, std::move(v)); }

Doc& Doc::Add(Doc v) {
  items_.emplace_back(std::string(), std::move(v));
  return *this;
}

Doc& Doc::Set(std::string key, Doc v) {
  items_.emplace_back(std::move(key), std::move(v));
  return *this;
}

Doc& Doc::Merge(const Doc& other) {
  items_.insert(items_.end(), other.items_.begin(), other.items_.end());
  return *this;
}

std::string Doc::Json() const {
  std::string out;
  AppendJson(&out);
  out += "\n";
  return out;
}

void Doc::AppendJson(std::string* out) const {
  switch (kind_) {
    case Kind::kNull:
    case Kind::kScalar:
      *out += text_;
      return;
    case Kind::kString:
      *out += JsonQuote(text_);
      return;
    case Kind::kArray:
    case Kind::kObject: {
      const bool object = kind_ == Kind::kObject;
      *out += object ? '{' : '[';
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) *out += ',';
        if (object) absl::StrAppend(out, JsonQuote(items_[i].first), ":");
        items_[i].second.AppendJson(out);
      }
      *out += object ? '}' : ']';
      return;
    }
  }
}

std::string Doc::Yaml() const {
  std::string out;
  AppendYaml(&out, 0, false);
  return out;
}

// Writes this value. A scalar or an empty container goes where the cursor
// is and ends the line. A non-empty container is written as a block whose
// entries are indented by `indent`; with `first_inline` the first entry
// continues the current line (after "- ").
void Doc::AppendYaml(std::string* out, int indent, bool first_inline) const {
  const bool object = kind_ == Kind::kObject;
  if (kind_ != Kind::kArray && !object) {
    absl::StrAppend(out, kind_ == Kind::kString ? JsonQuote(text_) : text_,
                    "\n");
    return;
  }
  if (items_.empty()) {
    absl::StrAppend(out, object ? "{}" : "[]", "\n");
    return;
  }
  for (size_t i = 0; i < items_.size(); ++i) {
    const Doc& v = items_[i].second;
    if (!(first_inline && i == 0)) *out += Indent(indent);
    const bool block = (v.kind_ == Kind::kArray || v.kind_ == Kind::kObject) &&
                       !v.items_.empty();
    if (object) {
      absl::StrAppend(out, items_[i].first, ":");
      if (block) {
        *out += "\n";
        // A sequence under a key may sit at the key's indent.
        v.AppendYaml(out, v.kind_ == Kind::kArray ? indent : indent + 2, false);
      } else {
        *out += " ";
        v.AppendYaml(out, indent + 2, true);
      }
    } else {
      *out += "- ";
      v.AppendYaml(out, indent + 2, true);
    }
  }
}

Doc DocFromMessage(const Message& m) {
  Doc doc = Doc::Object();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      Doc list = Doc::Array();
      const int n = r->FieldSize(m, f);
      for (int j = 0; j < n; ++j) list.Add(FieldValue(m, f, j));
      doc.Set(f->name(), std::move(list));
    } else {
      doc.Set(f->name(), FieldValue(m, f, -1));
    }
  }
  return doc;
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace asyncps
