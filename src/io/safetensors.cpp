// safetensors reader and writer (F32 only), and parameter collections and optimizer states stored
// through it.
#include "edbatch/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

#include "edbatch/files.h"
#include "edbatch/optim.h"

namespace edbatch {

// Tensor data is copied to and from the file as is, which is right on little-endian hosts only.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

namespace {

constexpr const char* kMetadataKey = "__metadata__";

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Element count of a shape; false when it overflows.
bool element_count(const std::vector<uint64_t>& shape, uint64_t& count) {
  count = 1;
  for (uint64_t d : shape) {
    if (d != 0 && count > UINT64_MAX / 4 / d) return false;
    count *= d;
  }
  return true;
}

// Where one tensor's data lies, relative to the start of the data section.
struct Entry {
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t begin, end;
};

class HeaderReader {
 public:
  explicit HeaderReader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(fmt::format("[read_safetensors] '{}': {}", path_, what));
  }

  Entry entry(const std::string& name, const nlohmann::json& v, uint64_t data_size) const {
    const std::string where = fmt::format("malformed JSON header: tensor '{}'", name);
    if (!v.is_object()) fail(where + " is not an object");
    auto dtype = v.find("dtype");
    if (dtype == v.end() || !dtype->is_string()) fail(where + " has no string \"dtype\"");
    if (dtype->get<std::string>() != "F32")
      fail(fmt::format("tensor '{}' has dtype {}: only F32 (float32) is supported", name,
                       dtype->get<std::string>()));
    Entry e{name, {}, 0, 0};
    auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) fail(where + " has no \"shape\" array");
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned())
        fail(where + " has a shape entry that is not an unsigned integer");
      e.shape.push_back(d.get<uint64_t>());
    }
    auto offsets = v.find("data_offsets");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
      fail(where + " needs \"data_offsets\": [begin, end] with unsigned integers");
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    uint64_t count = 0;
    if (!element_count(e.shape, count))
      fail(fmt::format("tensor '{}' has shape {}, too large", name, shape_string(e.shape)));
    if (e.end < e.begin)
      fail(fmt::format("tensor '{}' has data_offsets [{}, {}]: expected begin <= end", name,
                       e.begin, e.end));
    if (e.end - e.begin != count * 4)
      fail(
          fmt::format("tensor '{}' has shape {} ({} bytes of F32) but data_offsets [{}, {}] "
                      "span {} bytes",
                      name, shape_string(e.shape), count * 4, e.begin, e.end, e.end - e.begin));
    if (e.end > data_size)
      fail(
          fmt::format("truncated file: tensor '{}' has data_offsets [{}, {}] but the data "
                      "section holds only {} bytes",
                      name, e.begin, e.end, data_size));
    return e;
  }

  std::map<std::string, std::string> metadata(const nlohmann::json& v) const {
    if (!v.is_object()) fail("malformed JSON header: \"__metadata__\" is not an object");
    std::map<std::string, std::string> out;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it->is_string())
        fail(fmt::format("malformed JSON header: \"__metadata__\" entry '{}' is not a string",
                         it.key()));
      out[it.key()] = it->get<std::string>();
    }
    return out;
  }

 private:
  const std::string& path_;
};

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in = open_input(path, "read_safetensors", std::ios::binary | std::ios::ate);
  const std::streamoff size = in.tellg();
  if (size < 0)
    throw std::invalid_argument(
        fmt::format("[read_safetensors] cannot read '{}': not a file "
                    "whose size can be taken",
                    path));
  std::vector<char> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (!in.read(bytes.data(), size))
    throw std::runtime_error(fmt::format("[read_safetensors] failed reading '{}'", path));
  return bytes;
}

// The tensor layout of a parameter (see safetensors.h).
std::vector<uint64_t> parameter_shape(const ParameterCollection& pc, uint32_t id) {
  const Dim d = pc.dim(id);
  if (pc.is_lookup(id)) return {d.cols, d.rows};
  if (d.cols == 1) return {d.rows};
  return {d.rows, d.cols};
}

// The JSON header of a file holding `tensors`, padded to a multiple of 8 bytes, after its 8-byte
// length. Throws std::invalid_argument naming `path` (the file) for tensors it cannot hold.
std::string header_bytes(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey)
      throw std::invalid_argument(
          fmt::format("[write_safetensors] '{}': invalid tensor name '{}'", path, t.name));
    if (header.contains(t.name))
      throw std::invalid_argument(
          fmt::format("[write_safetensors] '{}': duplicate tensor name '{}'", path, t.name));
    uint64_t count = 0;
    if (!element_count(t.shape, count) || count != t.data.size())
      throw std::invalid_argument(
          fmt::format("[write_safetensors] '{}': tensor '{}' has shape {} but {} values", path,
                      t.name, shape_string(t.shape), t.data.size()));
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * count}}};
    offset += 4 * count;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    throw std::invalid_argument(
        fmt::format("[write_safetensors] '{}': tensor names and metadata must be valid UTF-8 ({})",
                    path, e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return bytes + text;
}

void write_body(std::ostream& out, const std::string& header,
                const std::vector<NamedTensor>& tensors) {
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const NamedTensor& t : tensors)
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size() * sizeof(float)));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = header_bytes(path, tensors, metadata);
  write_file_atomically(path, [&](std::ostream& out) { write_body(out, header, tensors); });
}

void write_safetensors(std::ostream& out, const std::string& name,
                       const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = header_bytes(name, tensors, metadata);
  write_body(out, header, tensors);
  if (!out) throw std::runtime_error(fmt::format("[write_safetensors] '{}': error writing", name));
}

std::vector<NamedTensor> read_safetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata) {
  const std::vector<char> bytes = read_bytes(path);
  return parse_safetensors(bytes.data(), bytes.size(), path, metadata);
}

std::vector<NamedTensor> parse_safetensors(const char* bytes, size_t size,
                                           const std::string& source_name,
                                           std::map<std::string, std::string>* metadata) {
  const HeaderReader reader(source_name);
  if (size < 8)
    reader.fail(
        fmt::format("truncated file: {} bytes, expected at least 8 (the header length)", size));
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = (header_size << 8) | static_cast<unsigned char>(bytes[i]);
  // A length past the end without the JSON header's '{' after it: text, gzip, ..., not a file
  // cut short.
  if (header_size > size - 8 && size > 8 && bytes[8] != '{')
    reader.fail(
        "not a safetensors file: its first 8 bytes should give the header's length and a JSON "
        "header start at byte 9, which is not '{'");
  if (header_size > size - 8)
    reader.fail(
        fmt::format("truncated file: the header length is {} bytes but only {} bytes "
                    "follow it",
                    header_size, size - 8));
  const char* header_begin = bytes + 8;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_size);
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range
    reader.fail(fmt::format("malformed JSON header: {}", e.what()));
  }
  if (!header.is_object()) reader.fail("malformed JSON header: expected an object");

  const uint64_t data_size = size - 8 - header_size;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      auto m = reader.metadata(*it);
      if (metadata) *metadata = std::move(m);
    } else {
      // write_safetensors refuses empty names, so a file with one could not be written back.
      if (it.key().empty()) reader.fail("malformed JSON header: a tensor with an empty name");
      entries.push_back(reader.entry(it.key(), *it, data_size));
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      reader.fail(fmt::format("tensors '{}' and '{}' overlap: data_offsets [{}, {}] and [{}, {}]",
                              entries[i - 1].name, entries[i].name, entries[i - 1].begin,
                              entries[i - 1].end, entries[i].begin, entries[i].end));
  // The format's tensors fill the data section: bytes past the last one are a file joined with
  // something else or written by something else.
  const uint64_t end = entries.empty() ? 0 : entries.back().end;
  if (end != data_size)
    reader.fail(
        fmt::format("{} bytes follow the last tensor's data: not a safetensors file as "
                    "written (appended to, or joined with another)",
                    data_size - end));

  const char* data = header_begin + header_size;
  std::vector<NamedTensor> tensors;
  tensors.reserve(entries.size());
  for (Entry& e : entries) {
    NamedTensor t{std::move(e.name), std::move(e.shape), {}};
    t.data.resize((e.end - e.begin) / sizeof(float));
    if (!t.data.empty()) std::memcpy(t.data.data(), data + e.begin, e.end - e.begin);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

namespace {

// Parameter `id`'s floats (column-major, as the collection holds them) in the tensor layout of
// save_parameters, and back.
NamedTensor parameter_tensor(const ParameterCollection& pc, uint32_t id, std::string name,
                             const float* v) {
  const Dim d = pc.dim(id);
  NamedTensor t{std::move(name), parameter_shape(pc, id), std::vector<float>(d.size())};
  if (pc.is_lookup(id) || d.cols == 1) {
    std::copy(v, v + d.size(), t.data.begin());
  } else {
    for (uint32_t r = 0; r < d.rows; ++r)
      for (uint32_t c = 0; c < d.cols; ++c)
        t.data[size_t(r) * d.cols + c] = v[size_t(c) * d.rows + r];
  }
  return t;
}

void tensor_to_parameter(const ParameterCollection& pc, uint32_t id, const std::vector<float>& in,
                         float* v) {
  const Dim d = pc.dim(id);
  if (pc.is_lookup(id) || d.cols == 1) {
    std::copy(in.begin(), in.end(), v);
  } else {
    for (uint32_t r = 0; r < d.rows; ++r)
      for (uint32_t c = 0; c < d.cols; ++c) v[size_t(c) * d.rows + r] = in[size_t(r) * d.cols + c];
  }
}

}  // namespace

void save_parameters(const std::string& path, const ParameterCollection& pc,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<NamedTensor> tensors;
  tensors.reserve(pc.size());
  for (uint32_t id = 0; id < pc.size(); ++id) {
    if (pc.is_view(id)) continue;  // saved through its base
    tensors.push_back(parameter_tensor(pc, id, pc.name(id), pc.values(id)));
  }
  write_safetensors(path, tensors, metadata);
}

void load_parameters(const std::string& path, ParameterCollection& pc) {
  load_parameters(read_safetensors(path), path, pc);
}

void load_parameters(const std::vector<NamedTensor>& tensors, const std::string& path,
                     ParameterCollection& pc) {
  std::unordered_map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("[load_parameters] '{}': {}", path, what));
  };

  // Check everything before changing any value.
  std::vector<const NamedTensor*> source(pc.size());
  for (uint32_t id = 0; id < pc.size(); ++id) {
    if (pc.is_view(id)) continue;
    const std::vector<uint64_t> expected = parameter_shape(pc, id);
    auto it = by_name.find(pc.name(id));
    if (it == by_name.end())
      fail(fmt::format("tensor '{}' (shape {}) is missing from the file", pc.name(id),
                       shape_string(expected)));
    if (it->second->shape != expected)
      fail(fmt::format("tensor '{}': expected shape {} but found {}", pc.name(id),
                       shape_string(expected), shape_string(it->second->shape)));
    source[id] = it->second;
  }
  for (const NamedTensor& t : tensors)
    if (pc.find(t.name) == UINT32_MAX || pc.is_view(pc.find(t.name)))
      fail(fmt::format("tensor '{}' (shape {}) in the file is not a parameter of the collection",
                       t.name, shape_string(t.shape)));

  for (uint32_t id = 0; id < pc.size(); ++id)
    if (!pc.is_view(id)) tensor_to_parameter(pc, id, source[id]->data, pc.values(id));
  pc.mark_changed();
}

// ---- Optimizer state ----

namespace {
constexpr const char* kOptimizerFormat = "edbatch-optimizer-state";

// The parameters an optimizer state belongs to, as metadata: [[name, shape], ...] in id order, so
// that a state without tensors (plain SGD's) is refused for another model too.
nlohmann::json parameter_list(const ParameterCollection& pc) {
  nlohmann::json list = nlohmann::json::array();
  for (uint32_t id = 0; id < pc.size(); ++id)
    if (!pc.is_view(id)) list.push_back({pc.name(id), parameter_shape(pc, id)});
  return list;
}
}  // namespace

void save_optimizer_state(const std::string& path, const Optimizer& opt,
                          const std::map<std::string, std::string>& extra) {
  const ParameterCollection& pc = opt.params();
  const OptimizerState& state = opt.state();
  const std::vector<std::string> slots = opt.slot_names();
  std::vector<NamedTensor> tensors;
  for (uint32_t id = 0; id < state.ids(); ++id) {
    if (state.floats(id) == 0) continue;
    for (uint32_t k = 0; k < slots.size(); ++k)
      tensors.push_back(parameter_tensor(pc, id, pc.name(id) + "." + slots[k], state.slot(k, id)));
  }
  const UpdateRule& h = opt.hyperparameters();
  std::map<std::string, std::string> meta = {
      {"format", kOptimizerFormat},
      {"version", "1"},
      {"optimizer", opt.name()},
      {"step", std::to_string(state.step())},
      {"lr", fmt::format("{}", h.lr)},
      {"momentum", fmt::format("{}", h.momentum)},
      {"beta1", fmt::format("{}", h.beta1)},
      {"beta2", fmt::format("{}", h.beta2)},
      {"eps", fmt::format("{}", h.eps)},
      {"weight_decay", fmt::format("{}", h.weight_decay)},
      {"clip_norm", fmt::format("{}", h.clip_norm)},
      {"sparse_lookups", h.sparse_lookups ? "true" : "false"},
      {"parameters", parameter_list(pc).dump()}};
  for (const auto& [key, value] : extra)
    if (!meta.emplace(key, value).second)
      throw std::invalid_argument(fmt::format(
          "[save_optimizer_state] '{}': the extra metadata key '{}' is one of the format's own",
          path, key));
  write_safetensors(path, tensors, meta);
}

void load_optimizer_state(const std::string& path, Optimizer& opt,
                          std::map<std::string, std::string>* metadata) {
  std::map<std::string, std::string> meta;
  const std::vector<NamedTensor> tensors = read_safetensors(path, &meta);
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("[load_optimizer_state] '{}': {}", path, what));
  };
  auto field = [&](const char* key) {
    auto it = meta.find(key);
    if (it == meta.end())
      fail(fmt::format("no \"{}\" in the metadata: not an optimizer state file", key));
    return it->second;
  };
  if (field("format") != kOptimizerFormat)
    fail(fmt::format("format '{}', expected '{}'", field("format"), kOptimizerFormat));
  if (field("version") != "1") fail(fmt::format("version {}, expected 1", field("version")));
  if (field("optimizer") != opt.name())
    fail(fmt::format("the state of a '{}' optimizer, not of '{}'", field("optimizer"), opt.name()));
  const std::string step_text = field("step");
  if (step_text.empty() || step_text.find_first_not_of("0123456789") != std::string::npos ||
      step_text.size() > 19)
    fail(fmt::format("step '{}' is not a count", step_text));
  const uint64_t step = std::stoull(step_text);

  ParameterCollection& pc = opt.params();
  // Files written before the list was kept have none; their tensors are checked below.
  const nlohmann::json mine = parameter_list(pc);
  if (meta.count("parameters") && meta["parameters"] != mine.dump()) {
    nlohmann::json theirs;
    try {
      theirs = nlohmann::json::parse(meta["parameters"]);
    } catch (const nlohmann::json::exception&) {
      fail("the \"parameters\" of its metadata are not a JSON list");
    }
    const auto text = [](const nlohmann::json& list, size_t i) {
      return list.is_array() && i < list.size() ? list[i].dump() : std::string("nothing");
    };
    size_t i = 0;
    while (i < mine.size() && text(theirs, i) == text(mine, i)) ++i;
    fail(fmt::format("the state of other parameters: parameter {} is {} in the file but {} here", i,
                     text(theirs, i), text(mine, i)));
  }
  OptimizerState& state = opt.state();
  const std::vector<std::string> slots = opt.slot_names();
  state.ensure(pc, static_cast<uint32_t>(slots.size()));
  std::unordered_map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  // Check everything before changing anything.
  std::vector<const NamedTensor*> source;
  for (uint32_t id = 0; id < state.ids(); ++id) {
    if (state.floats(id) == 0) continue;
    for (const std::string& slot : slots) {
      const std::string name = pc.name(id) + "." + slot;
      const std::vector<uint64_t> expected = parameter_shape(pc, id);
      auto it = by_name.find(name);
      if (it == by_name.end())
        fail(fmt::format("tensor '{}' (shape {}) is missing from the file", name,
                         shape_string(expected)));
      if (it->second->shape != expected)
        fail(fmt::format("tensor '{}': expected shape {} but found {}", name,
                         shape_string(expected), shape_string(it->second->shape)));
      source.push_back(it->second);
    }
  }
  if (source.size() != tensors.size())
    for (const NamedTensor& t : tensors)
      if (std::find(source.begin(), source.end(), &t) == source.end())
        fail(
            fmt::format("tensor '{}' (shape {}) in the file is not a slot of this optimizer's "
                        "parameters",
                        t.name, shape_string(t.shape)));
  size_t next = 0;
  for (uint32_t id = 0; id < state.ids(); ++id) {
    if (state.floats(id) == 0) continue;
    for (uint32_t k = 0; k < slots.size(); ++k)
      tensor_to_parameter(pc, id, source[next++]->data, state.slot(k, id));
  }
  state.set_step(step);
  state.mark_changed();
  if (metadata) *metadata = std::move(meta);
}

}  // namespace edbatch
