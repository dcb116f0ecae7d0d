// psctl's output document: the same values as JSON and YAML, with types by
// meaning (numbers stay numbers, incarnations are strings).
#include "tools/doc.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "proto/asyncps.pb.h"

namespace asyncps {
namespace {

TEST_CASE("JSON and YAML say the same thing", "[doc]") {
  Doc inner = Doc::Object();
  inner.Set("n", Doc::Uint(std::numeric_limits<uint64_t>::max()))
      .Set("s", Doc::String("a \"q\"\n"))
      .Set("empty", Doc::Array());
  Doc list = Doc::Array();
  list.Add(Doc::Int(-1)).Add(std::move(inner)).Add(Doc::Null());
  Doc doc = Doc::Object();
  doc.Set("list", std::move(list))
      .Set("ok", Doc::Bool(true))
      .Set("x", Doc::Double(0.5))
      .Set("nan", Doc::Double(std::numeric_limits<double>::quiet_NaN()));
  CHECK(doc.Json() ==
        "{\"list\":[-1,{\"n\":18446744073709551615,\"s\":\"a \\\"q\\\"\\n\","
        "\"empty\":[]},null],\"ok\":true,\"x\":0.5,\"nan\":null}\n");
  CHECK(doc.Yaml() ==
        "list:\n"
        "- -1\n"
        "- n: 18446744073709551615\n"
        "  s: \"a \\\"q\\\"\\n\"\n"
        "  empty: []\n"
        "- null\n"
        "ok: true\n"
        "x: 0.5\n"
        "nan: null\n");
}

TEST_CASE("messages: every field, 64-bit numbers, incarnations as strings",
          "[doc]") {
  StatusResponse st;
  st.set_shard_index(0);
  st.set_uptime_ms(int64_t{1} << 40);
  WorkerStatus* w = st.add_workers();
  w->set_worker_id(3);
  w->set_incarnation(std::numeric_limits<uint64_t>::max());
  w->set_pushes(7);
  const std::string json = DocFromMessage(st).Json();
  CHECK(json.find("\"shard_index\":0,") != std::string::npos);
  CHECK(json.find("\"uptime_ms\":1099511627776,") != std::string::npos);
  CHECK(json.find("\"incarnation\":\"18446744073709551615\"") !=
        std::string::npos);
  CHECK(json.find("\"pushes\":7,") != std::string::npos);
  CHECK(json.find("\"consistency\":\"ASP\"") != std::string::npos);
}

}  // namespace
}  // namespace asyncps
