#include "base/json.h"

#include <gtest/gtest.h>

namespace ufab {
namespace {

TEST(JsonWriter, NestsObjectsAndArraysWithCommas) {
  JsonWriter w;
  w.begin_object().field("a", 1).key("list").begin_array().value("x").value(true).null().end_array();
  w.key("o").begin_object().field("n", uint64_t{18446744073709551615ull}).end_object().end_object();
  EXPECT_EQ(w.str(), R"({"a":1,"list":["x",true,null],"o":{"n":18446744073709551615}})");
}

TEST(JsonWriter, DoublesAreFiniteOrNull) {
  JsonWriter w;
  w.begin_array().value(1.5).value(123456789.0).value(0.0 / 0.0).end_array();
  EXPECT_EQ(w.str(), "[1.5,1.23457e+08,null]");
}

TEST(JsonWriter, EscapesControlCharactersAndQuotes) {
  EXPECT_EQ(json_escape("a\"b\\c\n\x01"), R"("a\"b\\c\n\u0001")");
}

}  // namespace
}  // namespace ufab
