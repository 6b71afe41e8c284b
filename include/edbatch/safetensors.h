// Reading and writing safetensors files (float32 only), and saving and loading parameter
// collections through them.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the
// header) plus an optional "__metadata__" string map, then the raw little-endian data.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "edbatch/params.h"

namespace edbatch {

class Optimizer;

struct NamedTensor {
  std::string name;
  std::vector<uint64_t> shape;  // row-major, as in PyTorch; empty for a scalar
  std::vector<float> data;
};

// Writes the tensors in the given order. Throws std::invalid_argument for an empty, duplicate or
// reserved name, or data whose size does not match the shape.
// The file goes to a temporary file renamed over `path` once complete (write_file_atomically).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same into a stream; `name` names it in errors.
void write_safetensors(std::ostream& out, const std::string& name,
                       const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Returns the tensors in file order (by data offset). Throws std::invalid_argument naming the
// file (and tensor) for a dtype other than F32, a malformed header, or a truncated file.
std::vector<NamedTensor> read_safetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata = nullptr);
// The same for a file's bytes in memory; `source_name` names it in errors.
std::vector<NamedTensor> parse_safetensors(const char* bytes, size_t size,
                                           const std::string& source_name,
                                           std::map<std::string, std::string>* metadata = nullptr);

// One tensor per parameter, under its name, laid out as PyTorch would hold it: a rows x cols
// matrix as shape [rows, cols] (row-major, so transposed from our column-major storage), a
// vector as [rows], and a lookup table of vocab embeddings of size dim as [vocab, dim].
// `metadata` goes into the file's "__metadata__" (e.g. vocabulary_metadata, edbatch/data.h).
void save_parameters(const std::string& path, const ParameterCollection& pc,
                     const std::map<std::string, std::string>& metadata = {});
// Fills pc's values from the file. The file must hold exactly pc's parameters with the same
// shapes; nothing is changed when it does not.
void load_parameters(const std::string& path, ParameterCollection& pc);
// The same from tensors read before (read_safetensors: one read gives the metadata and the
// values, so they come from one version of the file); `source_name` names them in errors.
void load_parameters(const std::vector<NamedTensor>& tensors, const std::string& source_name,
                     ParameterCollection& pc);

// An optimizer's state (edbatch/optim.h) in the layout of save_parameters: a tensor
// "<parameter>.<slot>" per parameter and slot (Optimizer::slot_names: "exp_avg", "exp_avg_sq",
// "sum", "momentum_buffer"), and metadata: "format" edbatch-optimizer-state, "version" 1,
// "optimizer" (its name), "step" (steps taken), "parameters" (a JSON list of [name, shape] of the
// collection's parameters, which loading compares when present) and the hyperparameters (for the
// record: loading keeps the optimizer's own). Written atomically, like every safetensors file.
// `extra` adds the caller's own entries (e.g. where in its data a training loop stands); a key
// the format itself uses is refused with std::invalid_argument.
void save_optimizer_state(const std::string& path, const Optimizer& opt,
                          const std::map<std::string, std::string>& extra = {});
// Restores the step count and every slot. The file must come from an optimizer of the same name
// over parameters of the same names and shapes; otherwise it throws std::invalid_argument naming
// the file and the difference, and nothing changes. `metadata`, when given, receives the file's
// metadata (the caller's `extra` entries among them).
void load_optimizer_state(const std::string& path, Optimizer& opt,
                          std::map<std::string, std::string>* metadata = nullptr);

}  // namespace edbatch
