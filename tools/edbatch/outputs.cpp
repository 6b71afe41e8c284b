// The files a command writes, checked before any work (tools/edbatch/commands.h, OutputFiles).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "edbatch/files.h"
#include "tools/edbatch/commands.h"

namespace edbatch::cli {

namespace fs = std::filesystem;

namespace {

// Whether `output` would replace the existing file `input` (the same file by any name: a
// symbolic link, ./, another hard link).
bool same_file(const std::string& output, const std::string& input) {
  std::error_code ec;
  const fs::path target(write_target(output));
  return fs::is_regular_file(target, ec) && fs::equivalent(target, input, ec);
}

}  // namespace

void check_output_file(const std::string& option, const std::string& path) {
  if (path.empty()) return;
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error(option + ": cannot write '" + path + "': " + why);
  };
  // A file descriptor (/dev/stdout redirected to a file or a pipe) is written where it stands.
  if (const int fd = path_descriptor(path); fd >= 0) {
    if (::fcntl(fd, F_GETFD) == -1)
      fail("it names file descriptor " + std::to_string(fd) + ", which is not open");
    return;
  }
  const fs::path target(write_target(path));  // a symbolic link is written through
  if (target.filename().string().size() > 255) fail("its file name is longer than 255 bytes");
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  const auto absent = [&] {  // the file or (below) a folder above it not there: named below
    return ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory;
  };
  if (ec && !absent()) fail(ec.message());
  if (fs::is_directory(st)) fail("it is a directory");
  // A device or a pipe is written directly (write_file_atomically), not through its folder.
  if (fs::exists(st) && !fs::is_regular_file(st)) return;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : ".";
  const fs::file_status d = fs::status(dir, ec);
  if (ec && !absent()) fail("the folder '" + dir.string() + "': " + ec.message());
  if (!fs::exists(d)) fail("the folder '" + dir.string() + "' does not exist");
  if (!fs::is_directory(d)) fail("'" + dir.string() + "' is not a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail("the folder '" + dir.string() + "' is not writable (" + std::strerror(errno) + ")");
}

void OutputFiles::read(const std::string& option, const std::string& path,
                       const std::string& may_replace) {
  if (path.empty() || path_descriptor(path) >= 0) return;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return;  // a pipe is read, never replaced
  inputs_.push_back({option, path, may_replace});
  check_inputs();
}

void OutputFiles::read_data(const std::string& option, const std::string& spec) {
  if (spec.rfind("synthetic:", 0) == 0) return;
  read(option, spec);  // one file, whatever its name holds (read() skips what does not exist)
  if (spec.find(',') == std::string::npos) return;
  for (size_t start = 0; start <= spec.size();) {  // SOURCE,TARGET: two files
    const size_t comma = std::min(spec.find(',', start), spec.size());
    read(option, spec.substr(start, comma - start));
    start = comma + 1;
  }
}

void OutputFiles::check_inputs() const {
  for (const Input& in : inputs_)
    for (const auto& [option, file] : files_)
      if (option != in.may_replace && same_file(file, in.path))
        throw UsageError(option + " and " + in.option + " name one file, '" + in.path +
                         "': writing " + option + " would replace what " + in.option + " reads");
}

void OutputFiles::add(const std::string& option, const std::string& path) {
  if (path.empty()) return;
  check_output_file(option, path);
  if (path_descriptor(path) >= 0) return;
  const std::string file = fs::absolute(write_target(path)).lexically_normal().string();
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) return;  // /dev/null, a pipe
  for (const auto& [other, f] : files_)
    if (f == file)
      throw UsageError(option + " and " + other + " name one file, '" + path +
                       "': the second written would replace the first");
  files_.emplace_back(option, file);
  check_inputs();
}

void OutputFiles::write(const std::string& option, const std::function<void()>& write_file) {
  failed_.erase(std::remove(failed_.begin(), failed_.end(), option), failed_.end());
  try {
    write_file();
    written_.push_back(option);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edbatch %s: %s: %s\n", command_.c_str(), option.c_str(), e.what());
    failed_.push_back(option);
  }
}

bool OutputFiles::written(const std::string& option) const {
  return std::find(failed_.begin(), failed_.end(), option) == failed_.end();
}

void OutputFiles::finish() const {
  if (failed_.empty()) return;
  std::string names;
  for (const std::string& o : failed_) names += (names.empty() ? "" : ", ") + o;
  bool others = false;  // a file written whose last write did not fail
  for (const std::string& o : written_)
    others = others || std::find(failed_.begin(), failed_.end(), o) == failed_.end();
  throw std::runtime_error("not written: " + names + " (above)" +
                           (others ? "; the other files were" : ""));
}

}  // namespace edbatch::cli
