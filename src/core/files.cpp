#include "edbatch/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
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

namespace {

// The offset of the first byte of `s` that does not belong to a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF), or npos.
size_t invalid_utf8(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + 1 >= n || b[i + 1] < lo || b[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (i + k >= n || b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string::npos;
}

}  // namespace

void prepare_text_line(std::string& line, const char* fn, const std::string& source,
                       size_t line_no) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);
  const auto fail = [&](size_t at, const std::string& what) {
    throw std::invalid_argument(
        fmt::format("[{}] {}:{}:{}: {}", fn, source, line_no, at + 1, what));
  };
  const size_t nul = line.find('\0');
  if (nul != std::string::npos)
    fail(nul,
         "a NUL byte: the file is UTF-16 or binary, not UTF-8 text (convert UTF-16 with "
         "iconv -f utf-16 -t utf-8)");
  const size_t cr = line.find('\r');
  if (cr != std::string::npos)
    fail(cr,
         "a carriage return inside a line: the file has old Mac (CR) line endings (convert them "
         "with tr '\\r' '\\n')");
  const size_t mark = line.find("\xEF\xBB\xBF");
  if (mark != std::string::npos)
    fail(mark, "a byte order mark (U+FEFF) inside a line, where it would join a word");
  const size_t bad = invalid_utf8(line);
  if (bad != std::string::npos)
    fail(bad, fmt::format("byte 0x{:02X} is not UTF-8: the file has another encoding (convert "
                          "it, e.g. from Latin-1 with iconv -f latin1 -t utf-8)",
                          static_cast<unsigned char>(line[bad])));
}

namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxFileName = 255;  // bytes of one name in a folder (NAME_MAX on Linux)

[[noreturn]] void fail(const std::string& path, const std::string& what, int err = 0) {
  throw std::runtime_error("[write_file_atomically] '" + path + "': " + what +
                           (err ? std::string(" (") + std::strerror(err) + ")" : ""));
}

// Creates a temporary file next to `target` that no one else uses (O_EXCL); returns its name.
// Its name is the target's with ".tmp.<pid>.<n>" added, the target's part shortened where the
// whole would pass the folder's limit on a name (255 bytes), which the target itself need not.
std::string create_temporary(const std::string& path, const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  const fs::path t(target);
  const std::string folder = t.has_parent_path() ? t.parent_path().string() + "/" : "";
  const std::string base = t.filename().string();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string suffix =
        ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    const size_t room = kMaxFileName > suffix.size() ? kMaxFileName - suffix.size() : 0;
    const std::string name = folder + base.substr(0, room) + suffix;
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
  errno = 0;
  write(out);
  out.flush();
  if (!out) fail(path, "error writing", errno);
}

// The whole text into an open descriptor (standard output redirected to a file or a pipe),
// where it stands: no truncation, and what the process printed to it before comes first.
void write_descriptor(const std::string& path, int fd,
                      const std::function<void(std::ostream&)>& write) {
  if (::fcntl(fd, F_GETFD) == -1)
    fail(path, "it names file descriptor " + std::to_string(fd) + ", which is not open");
  std::ostringstream text;
  write(text);
  std::fflush(stdout);
  std::fflush(stderr);
  const std::string s = text.str();
  for (size_t done = 0; done < s.size();) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, "error writing", errno);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

int path_descriptor(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  for (const std::string prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    if (path.rfind(prefix, 0) != 0) continue;
    const std::string n = path.substr(prefix.size());
    if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
      return -1;
    return std::stoi(n);
  }
  return -1;
}

std::string write_target(const std::string& path) {
  fs::path target(path);
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(target, ec); ++hops) {
    const fs::path to = fs::read_symlink(target, ec);
    if (ec) break;
    target = to.is_absolute() ? to : target.parent_path() / to;
  }
  return target.string();
}

void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write) {
  if (path.empty()) fail(path, "empty file name");
  if (const int fd = path_descriptor(path); fd >= 0) return write_descriptor(path, fd, write);
  const fs::path target(write_target(path));
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) return write_directly(path, write);

  const std::string name = create_temporary(path, target.string());
  try {
    {
      std::ofstream out(name, std::ios::binary | std::ios::trunc);
      if (!out) fail(path, "cannot open the temporary file '" + name + "'", errno);
      errno = 0;  // what a failed write leaves (ENOSPC, EIO) is named
      write(out);
      out.close();
      if (!out) fail(path, "error writing the temporary file '" + name + "'", errno);
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
