#include "store/spec_diff.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/names.h"
#include "google/protobuf/descriptor.h"

namespace asyncps {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One value of a scalar field, as an operator reads it.
std::string Value(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(rep ? r->GetRepeatedInt32(m, f, index)
                              : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(rep ? r->GetRepeatedInt64(m, f, index)
                              : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(rep ? r->GetRepeatedUInt32(m, f, index)
                              : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(rep ? r->GetRepeatedUInt64(m, f, index)
                              : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrCat(rep ? r->GetRepeatedFloat(m, f, index)
                              : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrCat(rep ? r->GetRepeatedDouble(m, f, index)
                              : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f))
                 ? "true"
                 : "false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return std::string(
          (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name());
    case FieldDescriptor::CPPTYPE_STRING:
      return QuoteName(rep ? r->GetRepeatedString(m, f, index)
                           : r->GetString(m, f));
    default:
      return "?";
  }
}

// The whole field: a value, or [a, b, ...] for a repeated one.
std::string FieldText(const Message& m, const FieldDescriptor* f) {
  if (!f->is_repeated()) return Value(m, f, 0);
  std::vector<std::string> values;
  const int n = m.GetReflection()->FieldSize(m, f);
  for (int i = 0; i < n; ++i) values.push_back(Value(m, f, i));
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

void Compare(const Message& held, const Message& asked,
             const std::string& prefix, std::vector<std::string>* out) {
  const google::protobuf::Descriptor* d = held.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string name = absl::StrCat(prefix, f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
        !f->is_repeated()) {
      Compare(held.GetReflection()->GetMessage(held, f),
              asked.GetReflection()->GetMessage(asked, f),
              absl::StrCat(name, "."), out);
      continue;
    }
    const std::string a = FieldText(held, f), b = FieldText(asked, f);
    if (a != b) {
      out->push_back(
          absl::StrCat(name, " is ", a, " on the shard, ", b, " asked"));
    }
  }
}

}  // namespace

std::string SpecDifferences(const Message& held, const Message& asked) {
  std::vector<std::string> out;
  Compare(held, asked, "", &out);
  return absl::StrJoin(out, "; ");
}

}  // namespace asyncps
