// safetensors: parse_safetensors either refuses cleanly or gives float32 tensors whose data
// matches their shapes; write_safetensors writes them (and the metadata) back to bytes that
// parse to the same tensors, bit for bit.
#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "edbatch/safetensors.h"
#include "fuzz/fuzz_check.h"

using namespace edbatch;
using edbatch::fuzz::parses;

namespace {

std::map<std::string, const NamedTensor*> by_name(const std::vector<NamedTensor>& tensors) {
  std::map<std::string, const NamedTensor*> m;
  for (const NamedTensor& t : tensors) {
    FUZZ_CHECK(m.emplace(t.name, &t).second, "duplicate tensor name " + t.name);
  }
  return m;
}

bool same(const NamedTensor& a, const NamedTensor& b) {
  return a.shape == b.shape && a.data.size() == b.data.size() &&
         (a.data.empty() ||
          std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  if (!parses([&] {
        tensors = parse_safetensors(reinterpret_cast<const char*>(data), size, "fuzz", &metadata);
      }))
    return 0;
  for (const NamedTensor& t : tensors) {
    uint64_t count = 1;
    for (uint64_t d : t.shape) count *= d;
    FUZZ_CHECK(count == t.data.size(), "tensor " + t.name + ": data does not match its shape");
  }
  const auto names = by_name(tensors);
  std::ostringstream out;
  write_safetensors(out, "written", tensors, metadata);
  const std::string bytes = out.str();
  std::map<std::string, std::string> metadata2;
  const std::vector<NamedTensor> back =
      parse_safetensors(bytes.data(), bytes.size(), "written", &metadata2);
  FUZZ_CHECK(metadata2 == metadata, "metadata read back differently");
  const auto names2 = by_name(back);
  FUZZ_CHECK(names2.size() == names.size(), "tensor count changed");
  for (const auto& [name, t] : names) {
    auto it = names2.find(name);
    FUZZ_CHECK(it != names2.end() && same(*t, *it->second), "tensor " + name + " changed");
  }
  return 0;
}
