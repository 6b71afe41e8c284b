// safetensors files: round trips, the PyTorch layout of parameters, and corrupted files.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "edbatch/safetensors.h"

using namespace edbatch;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  auto dir = fs::temp_directory_path() / "edbatch_test_safetensors";
  fs::create_directories(dir);
  return dir / name;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file written by hand: header length (or a forged one), header text, data bytes.
std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                      uint64_t length = UINT64_MAX) {
  if (length == UINT64_MAX) length = header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  bytes += header + data;
  const fs::path path = scratch(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

std::string float_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// doctest's matchers take its own string type.
doctest::Contains contains(const std::string& s) {
  return doctest::Contains(s.c_str());
}
doctest::String exactly(const std::string& s) {
  return doctest::String(s.c_str());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector, even for 0 bytes.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> values_of(const ParameterCollection& pc, uint32_t id) {
  const float* v = pc.values(id);
  return std::vector<float>(v, v + pc.dim(id).size());
}

}  // namespace

TEST_CASE("safetensors: tensors and metadata round trip bit for bit") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float denormal = std::numeric_limits<float>::denorm_min();
  std::vector<NamedTensor> tensors = {
      {"layer.weight", {2, 3}, {1.5f, -0.0f, nan, inf, -inf, denormal}},
      {"layer.bias", {4}, {0.1f, 0.2f, 0.3f, 1e-30f}},
      {"scalar", {}, {42.0f}},
      {"empty", {0, 3}, {}},
      {"emb", {3, 1, 2}, {1, 2, 3, 4, 5, 6}},
  };
  const std::string path = scratch("round_trip.safetensors").string();
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "x\"y"}});

  std::map<std::string, std::string> meta;
  auto back = read_safetensors(path, &meta);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    CHECK(back[i].name == tensors[i].name);
    CHECK(back[i].shape == tensors[i].shape);
    CHECK(same_bits(back[i].data, tensors[i].data));
  }
  CHECK(meta == std::map<std::string, std::string>{{"format", "pt"}, {"note", "x\"y"}});

  // The header: little-endian length, space padding to a multiple of 8, contiguous offsets.
  const std::string bytes = file_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 4 * (6 + 4 + 1 + 0 + 6));
  const std::string header = bytes.substr(8, n);
  CHECK(header.front() == '{');
  const size_t json_end = header.find_last_not_of(' ') + 1;
  CHECK(header[json_end - 1] == '}');
  CHECK(n - json_end < 8);
  auto json = nlohmann::json::parse(header);
  CHECK(json["layer.weight"]["dtype"] == "F32");
  CHECK(json["layer.weight"]["data_offsets"] == nlohmann::json::array({0, 24}));
  CHECK(json["layer.bias"]["data_offsets"] == nlohmann::json::array({24, 40}));
  CHECK(json["__metadata__"]["format"] == "pt");

  // Without metadata, no "__metadata__" entry.
  write_safetensors(path, {tensors[1]});
  const std::string plain = file_bytes(path);
  CHECK(!nlohmann::json::parse(plain.substr(8, plain.size() - 8 - 16)).contains("__metadata__"));
  CHECK(read_safetensors(path).size() == 1);
}

TEST_CASE("safetensors: writing rejects bad tensors") {
  const std::string path = scratch("bad_write.safetensors").string();
  CHECK_THROWS_WITH_AS(
      write_safetensors(path, {{"a", {2, 2}, {1, 2, 3}}}),
      contains("[write_safetensors] '" + path + "': tensor 'a' has shape [2, 2] but 3 values"),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"a", {1}, {1}}, {"a", {1}, {2}}}),
                       contains("duplicate tensor name 'a'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"__metadata__", {1}, {1}}}),
                       contains("invalid tensor name '__metadata__'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"", {1}, {1}}}),
                       contains("invalid tensor name ''"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"\xff", {1}, {1}}}),
                       contains("must be valid UTF-8"), std::invalid_argument);
  const std::string no_dir = (scratch("no_dir") / "x").string();
  CHECK_THROWS_WITH_AS(write_safetensors(no_dir, {}),
                       contains("[write_file_atomically] '" + no_dir + "': cannot create"),
                       std::runtime_error);
}

TEST_CASE("safetensors: corrupted files give errors naming the file and tensor") {
  const std::string four = float_bytes({1, 2, 3, 4});
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  CHECK(read_safetensors(write_raw("ok.st", ok, four))[0].data == std::vector<float>{1, 2, 3, 4});

  std::string p = scratch("short.st").string();
  std::ofstream(p, std::ios::binary) << "abc";
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       exactly("[read_safetensors] '" + p +
                               "': truncated file: 3 bytes, expected at least 8 (the header "
                               "length)"),
                       std::invalid_argument);

  p = write_raw("long_header.st", ok, four, ok.size() + 100);
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       contains("'" + p + "': truncated file: the header length is " +
                                std::to_string(ok.size() + 100) + " bytes but only " +
                                std::to_string(ok.size() + 16) + " bytes follow it"),
                       std::invalid_argument);

  // Text or gzip given for weights: no file cut short, none at all.
  for (const std::string& bytes : {std::string("(3 (2 a) (4 b))\n"),
                                   std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10)}) {
    p = scratch("not_weights.st").string();
    std::ofstream(p, std::ios::binary) << bytes;
    CHECK_THROWS_WITH_AS(read_safetensors(p),
                         contains("'" + p + "': not a safetensors file: its first 8 bytes"),
                         std::invalid_argument);
  }

  // Bytes after the last tensor's data (a file appended to).
  p = write_raw("appended.st", ok, four + "junk");
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       contains("'" + p + "': 4 bytes follow the last tensor's data"),
                       std::invalid_argument);

  p = write_raw("bad_json.st", R"({"w":{"dtype":"F32",)", four);
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("'" + p + "': malformed JSON header"),
                       std::invalid_argument);
  // A number too large for a double is a JSON error too (found by fuzz/fuzz_safetensors.cpp).
  p = write_raw("huge_number.st", R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,16]}})",
                four);
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("'" + p + "': malformed JSON header"),
                       std::invalid_argument);
  p = write_raw("empty_name.st", R"({"":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", four);
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("a tensor with an empty name"),
                       std::invalid_argument);
  p = write_raw("array.st", "[1, 2]", "");
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("malformed JSON header: expected an object"),
                       std::invalid_argument);
  p = write_raw("no_offsets.st", R"({"w":{"dtype":"F32","shape":[4]}})", four);
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       contains("malformed JSON header: tensor 'w' needs \"data_offsets\""),
                       std::invalid_argument);
  p = write_raw("neg_shape.st", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})",
                four);
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("tensor 'w' has a shape entry"),
                       std::invalid_argument);
  p = write_raw("meta.st", R"({"__metadata__":{"a":1}})", "");
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("\"__metadata__\" entry 'a' is not a string"),
                       std::invalid_argument);

  p = write_raw("f16.st", R"({"half":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
                std::string(4, '\0'));
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       exactly("[read_safetensors] '" + p +
                               "': tensor 'half' has dtype F16: only F32 (float32) is supported"),
                       std::invalid_argument);

  p = write_raw("truncated.st", ok, four.substr(0, 12));
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       contains("'" + p +
                                "': truncated file: tensor 'w' has data_offsets "
                                "[0, 16] but the data section holds only 12 "
                                "bytes"),
                       std::invalid_argument);

  p = write_raw("size.st", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", four);
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       contains("tensor 'w' has shape [2, 3] (24 bytes of F32) but "
                                "data_offsets [0, 16] span 16 bytes"),
                       std::invalid_argument);
  p = write_raw("reversed.st", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", four);
  CHECK_THROWS_WITH_AS(read_safetensors(p), contains("expected begin <= end"),
                       std::invalid_argument);

  p = write_raw("overlap.st",
                R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                four);
  CHECK_THROWS_WITH_AS(read_safetensors(p),
                       contains("tensors 'a' and 'b' overlap: data_offsets [0, 12] and "
                                "[8, 16]"),
                       std::invalid_argument);

  CHECK_THROWS_WITH_AS(read_safetensors(scratch("absent.st").string()),
                       contains("[read_safetensors] cannot open"), std::invalid_argument);
  // A directory opens as a stream but has no size: named, not a huge allocation.
  fs::create_directories(scratch("a_folder.st"));
  CHECK_THROWS_WITH_AS(read_safetensors(scratch("a_folder.st").string()),
                       contains("a_folder.st': it is a directory"), std::invalid_argument);
}

TEST_CASE("safetensors: parameter collections round trip") {
  ParameterCollection pc(1);
  pc.add_parameters("W", Dim{3, 5});
  pc.add_parameters("b", Dim{3, 1});
  pc.add_parameters("row", Dim{1, 4});
  pc.add_lookup_parameters("E", 7, 4);
  const std::string path = scratch("params.safetensors").string();
  save_parameters(path, pc);

  auto raw = read_safetensors(path);
  REQUIRE(raw.size() == 4);
  CHECK(raw[0].name == "W");
  CHECK(raw[0].shape == std::vector<uint64_t>{3, 5});
  CHECK(raw[1].shape == std::vector<uint64_t>{3});
  CHECK(raw[2].shape == std::vector<uint64_t>{1, 4});
  CHECK(raw[3].name == "E");
  CHECK(raw[3].shape == std::vector<uint64_t>{7, 4});

  ParameterCollection other(2);
  other.add_lookup_parameters("E", 7, 4);  // a different order of addition is fine
  other.add_parameters("row", Dim{1, 4});
  other.add_parameters("b", Dim{3, 1});
  other.add_parameters("W", Dim{3, 5});
  CHECK(values_of(other, other.find("W")) != values_of(pc, pc.find("W")));
  load_parameters(path, other);
  for (uint32_t id = 0; id < pc.size(); ++id) {
    CAPTURE(pc.name(id));
    CHECK(same_bits(values_of(other, other.find(pc.name(id))), values_of(pc, id)));
  }
}

TEST_CASE("safetensors: matrices are stored row-major, lookup tables as [vocab, dim]") {
  ParameterCollection pc;
  const uint32_t w = pc.add_parameters("W", Dim{2, 3}).id;
  const uint32_t e = pc.add_lookup_parameters("E", 3, 2).id;
  for (uint32_t r = 0; r < 2; ++r)
    for (uint32_t c = 0; c < 3; ++c) pc.values(w)[c * 2 + r] = 10.0f * r + c;
  for (uint32_t word = 0; word < 3; ++word)
    for (uint32_t i = 0; i < 2; ++i) pc.values(e)[word * 2 + i] = 100.0f * word + i;
  const std::string path = scratch("layout.safetensors").string();
  save_parameters(path, pc);
  auto raw = read_safetensors(path);
  REQUIRE(raw.size() == 2);
  CHECK(raw[0].shape == std::vector<uint64_t>{2, 3});
  CHECK(raw[0].data == std::vector<float>{0, 1, 2, 10, 11, 12});
  CHECK(raw[1].shape == std::vector<uint64_t>{3, 2});
  CHECK(raw[1].data == std::vector<float>{0, 1, 100, 101, 200, 201});

  // A file written as PyTorch would write it loads into our column-major storage.
  write_safetensors(path,
                    {{"W", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"E", {3, 2}, {7, 8, 9, 10, 11, 12}}});
  load_parameters(path, pc);
  CHECK(values_of(pc, w) == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(values_of(pc, e) == std::vector<float>{7, 8, 9, 10, 11, 12});
}

TEST_CASE("safetensors: load_parameters rejects files that do not match the collection") {
  ParameterCollection pc(3);
  pc.add_parameters("W", Dim{3, 5});
  pc.add_parameters("b", Dim{3, 1});
  pc.add_lookup_parameters("E", 7, 4);
  const std::string path = scratch("match.safetensors").string();
  save_parameters(path, pc);

  ParameterCollection more(4);
  more.add_parameters("W", Dim{3, 5});
  more.add_parameters("b", Dim{3, 1});
  more.add_lookup_parameters("E", 7, 4);
  more.add_parameters("extra", Dim{2, 1});
  const auto before = values_of(more, 0);
  CHECK_THROWS_WITH_AS(load_parameters(path, more),
                       exactly("[load_parameters] '" + path +
                               "': tensor 'extra' (shape [2]) is missing from the file"),
                       std::invalid_argument);
  CHECK(values_of(more, 0) == before);  // nothing loaded

  ParameterCollection fewer(4);
  fewer.add_parameters("W", Dim{3, 5});
  fewer.add_lookup_parameters("E", 7, 4);
  CHECK_THROWS_WITH_AS(load_parameters(path, fewer),
                       contains("'" + path +
                                "': tensor 'b' (shape [3]) in the file is "
                                "not a parameter of the collection"),
                       std::invalid_argument);

  ParameterCollection transposed(4);
  transposed.add_parameters("W", Dim{5, 3});
  transposed.add_parameters("b", Dim{3, 1});
  transposed.add_lookup_parameters("E", 7, 4);
  CHECK_THROWS_WITH_AS(load_parameters(path, transposed),
                       contains("tensor 'W': expected shape [5, 3] but found [3, 5]"),
                       std::invalid_argument);

  ParameterCollection lookup(4);
  lookup.add_parameters("W", Dim{3, 5});
  lookup.add_parameters("b", Dim{3, 1});
  lookup.add_lookup_parameters("E", 4, 7);
  CHECK_THROWS_WITH_AS(load_parameters(path, lookup),
                       contains("tensor 'E': expected shape [4, 7] but found [7, 4]"),
                       std::invalid_argument);

  ParameterCollection small(4);
  small.add_parameters("b", Dim{2, 1});
  const std::string f16 =
      write_raw("param_f16.st", R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
                std::string(4, '\0'));
  CHECK_THROWS_WITH_AS(load_parameters(f16, small),
                       contains("'" + f16 + "': tensor 'b' has dtype F16"), std::invalid_argument);
  const std::string cut =
      write_raw("param_cut.st", R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                float_bytes({1}));
  CHECK_THROWS_WITH_AS(load_parameters(cut, small),
                       contains("'" + cut + "': truncated file: tensor 'b'"),
                       std::invalid_argument);
  const std::string good =
      write_raw("param_ok.st", R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                float_bytes({1, -2}));
  load_parameters(good, small);
  CHECK(values_of(small, 0) == std::vector<float>{1, -2});
}
