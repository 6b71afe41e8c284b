#include "edbatch/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace edbatch {

std::ifstream open_input(const std::string& path, const char* fn, std::ios::openmode mode) {
  const auto fail = [&](const std::string& why) {
    throw std::invalid_argument("[" + std::string(fn) + "] cannot open '" + path + "': " + why);
  };
  // An ifstream opens a directory without complaint and fails at the first read.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("it is a directory, not a file");
  errno = 0;
  std::ifstream in(path, mode | std::ios::in);
  if (!in) fail(errno ? std::strerror(errno) : "unreadable");
  return in;
}

void skip_utf8_bom(std::istream& in) {
  static const char bom[] = "\xEF\xBB\xBF";
  for (int i = 0; i < 3; ++i) {
    if (in.peek() != static_cast<unsigned char>(bom[i])) {
      for (; i > 0; --i) in.unget();
      return;
    }
    in.get();
  }
}

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what, int err = 0) {
  throw std::runtime_error("[write_file_atomically] '" + path + "': " + what +
                           (err ? std::string(" (") + std::strerror(err) + ")" : ""));
}

// Creates a temporary file next to `target` that no one else uses (O_EXCL); returns its name.
std::string create_temporary(const std::string& path, const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name =
        target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      return name;
    }
    if (errno != EEXIST) fail(path, "cannot create the temporary file '" + name + "'", errno);
  }
  fail(path, "cannot find a free temporary file name");
}

// Flushes the file's data to the disk, so that the rename never publishes an empty file after a
// system crash.
void sync_file(const std::string& path, const std::string& name) {
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot reopen the temporary file '" + name + "'", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(path, "cannot flush the temporary file '" + name + "' to disk", err);
}

void write_directly(const std::string& path, const std::function<void(std::ostream&)>& write) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, "cannot open for writing", errno);
  write(out);
  out.flush();
  if (!out) fail(path, "error writing");
}

}  // namespace

void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write) {
  if (path.empty()) fail(path, "empty file name");
  std::error_code ec;
  fs::path target(path);
  if (fs::is_symlink(target, ec)) {
    const fs::path resolved = fs::canonical(target, ec);
    if (!ec) target = resolved;
  }
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) return write_directly(path, write);

  const std::string name = create_temporary(path, target.string());
  try {
    {
      std::ofstream out(name, std::ios::binary | std::ios::trunc);
      if (!out) fail(path, "cannot open the temporary file '" + name + "'", errno);
      write(out);
      out.close();
      if (!out) fail(path, "error writing the temporary file '" + name + "'");
    }
    if (exists && ::chmod(name.c_str(), st.st_mode & 07777) != 0)
      fail(path, "cannot give the temporary file the permissions of the old one", errno);
    sync_file(path, name);
    if (::rename(name.c_str(), target.c_str()) != 0)
      fail(path, "cannot rename the temporary file '" + name + "' over it", errno);
  } catch (...) {
    ::unlink(name.c_str());
    throw;
  }
  // The rename itself reaches the disk with the folder's entry; best effort.
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace edbatch
