// A Vocabulary as a weights file's metadata and back: data read to use saved weights gives every
// word and tag the id it had when the weights were trained.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "edbatch/data.h"

namespace edbatch {

namespace {

constexpr const char* kWords = "edbatch.words";
constexpr const char* kTags = "edbatch.tags";

// A map's keys in the order of their ids, which are 0..size-1 (ids by first appearance).
std::vector<std::string> by_id(const std::unordered_map<std::string, uint32_t>& ids) {
  std::vector<std::string> out(ids.size());
  for (const auto& [name, id] : ids) out.at(id) = name;
  return out;
}

std::vector<std::string> names_of(const std::map<std::string, std::string>& metadata,
                                  const char* key, const std::string& source) {
  const auto it = metadata.find(key);
  if (it == metadata.end()) return {};
  try {
    return nlohmann::json::parse(it->second).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format(
        "[vocabulary_from_metadata] '{}': metadata '{}' is not a JSON list of strings ({})", source,
        key, e.what()));
  }
}

}  // namespace

std::map<std::string, std::string> vocabulary_metadata(const Vocabulary& vocabulary) {
  std::map<std::string, std::string> metadata;
  if (!vocabulary.words.empty()) metadata[kWords] = nlohmann::json(by_id(vocabulary.words)).dump();
  if (!vocabulary.tags.empty()) metadata[kTags] = nlohmann::json(by_id(vocabulary.tags)).dump();
  return metadata;
}

Vocabulary vocabulary_from_metadata(const std::map<std::string, std::string>& metadata,
                                    uint32_t vocab_size, const std::string& source) {
  Vocabulary v;
  const std::vector<std::string> words = names_of(metadata, kWords, source),
                                 tags = names_of(metadata, kTags, source);
  auto twice = [&](const char* what, const std::string& name) {
    return std::invalid_argument(
        fmt::format("[vocabulary_from_metadata] '{}': the {} '{}' is "
                    "listed twice",
                    source, what, name));
  };
  for (uint32_t i = 0; i < words.size(); ++i) {
    if (!v.words.emplace(words[i], i).second) throw twice("word", words[i]);
    // The first word on each row spells it, as the loaders record it.
    if ((vocab_size ? i % vocab_size : i) == v.spellings.size()) v.spellings.push_back(words[i]);
  }
  for (uint32_t i = 0; i < tags.size(); ++i) {
    if (!v.tags.emplace(tags[i], i).second) throw twice("tag", tags[i]);
    v.tag_names.push_back(tags[i]);
  }
  return v;
}

}  // namespace edbatch
