// Files are written whole or not at all (write_file_atomically): a failing writer leaves the old
// file, and a writer killed at any moment leaves the old file or the complete new one.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "edbatch/files.h"
#include "edbatch/safetensors.h"
#include "tests/cli_run.h"

using namespace edbatch;
using edbatch::test::slurp;
using edbatch::test::TempDir;
namespace fs = std::filesystem;

namespace {

// Temporary files left next to `path` (only a killed writer leaves one).
int temporaries(const std::string& path) {
  int n = 0;
  const std::string prefix = fs::path(path).filename().string() + ".tmp.";
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  return n;
}

void remove_temporaries(const std::string& path) {
  const std::string prefix = fs::path(path).filename().string() + ".tmp.";
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove(e.path());
}

// Version v of the weights file: one tensor of a size that differs per version (4 MiB and
// some), all v.
uint64_t version_size(int v) {
  return (1u << 20) + static_cast<uint64_t>(v) * 4099;
}
std::vector<NamedTensor> version(int v) {
  const uint64_t n = version_size(v);
  return {{"w", {n}, std::vector<float>(n, static_cast<float>(v))}};
}

// The version the file holds, or -1 when it is not one complete version.
int version_in(const std::string& path) {
  try {
    const std::vector<NamedTensor> t = read_safetensors(path);
    if (t.size() != 1 || t[0].name != "w" || t[0].data.empty()) return -1;
    const float v = t[0].data[0];
    if (v < 0 || v > 2 || t[0].data.size() != version_size(static_cast<int>(v))) return -1;
    for (float x : t[0].data)
      if (x != v) return -1;
    return static_cast<int>(v);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

TEST_CASE("files: a writer that fails leaves the old file and no temporary file") {
  TempDir dir("edbatch_test_files");
  const std::string path = dir / "out.txt";
  write_file_atomically(path, [](std::ostream& out) { out << "old\n"; });
  CHECK(slurp(path) == "old\n");
  CHECK_THROWS_WITH_AS(write_file_atomically(path,
                                             [](std::ostream& out) {
                                               out << "partial";
                                               throw std::invalid_argument("[writer] no");
                                             }),
                       "[writer] no", std::invalid_argument);
  CHECK(slurp(path) == "old\n");
  CHECK(temporaries(path) == 0);
  write_file_atomically(path, [](std::ostream& out) { out << "new\n"; });
  CHECK(slurp(path) == "new\n");
  CHECK(temporaries(path) == 0);
}

TEST_CASE("files: permissions, symbolic links, devices and missing folders") {
  TempDir dir("edbatch_test_files");
  const std::string path = dir / "private.txt";
  write_file_atomically(path, [](std::ostream& out) { out << "1"; });
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  write_file_atomically(path, [](std::ostream& out) { out << "2"; });
  CHECK(slurp(path) == "2");
  CHECK(fs::status(path).permissions() == (fs::perms::owner_read | fs::perms::owner_write));

  // A link is written through: it still points at the file, which holds the new contents.
  const std::string link = dir / "link.txt";
  fs::create_symlink(path, link);
  write_file_atomically(link, [](std::ostream& out) { out << "3"; });
  CHECK(fs::is_symlink(link));
  CHECK(slurp(path) == "3");

  // A device is written directly, never replaced.
  write_file_atomically("/dev/null", [](std::ostream& out) { out << "discarded"; });
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));

  const std::string missing = dir / "no_such_folder/x.txt";
  CHECK_THROWS_WITH_AS(
      write_file_atomically(missing, [](std::ostream& out) { out << "x"; }),
      doctest::Contains(("[write_file_atomically] '" + missing + "': cannot create").c_str()),
      std::runtime_error);
}

TEST_CASE("files: a writer killed at random moments never leaves a partial file") {
  TempDir dir("edbatch_test_files");
  const std::string path = dir / "weights.safetensors";
  write_safetensors(path, version(0));
  REQUIRE(version_in(path) == 0);

  // Kill moments spread over about twice the time one write takes here, counted from when the
  // child is about to write (it says so through a pipe), so that the time fork takes on a loaded
  // machine does not push every kill before the write.
  const std::vector<NamedTensor> next[2] = {version(1), version(2)};
  const auto t0 = std::chrono::steady_clock::now();
  write_safetensors(dir / "timing.safetensors", next[0]);
  const auto write_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::mt19937 rng(23);
  std::uniform_int_distribution<long> delay(0, 2 * write_us);

  // At least 40 writers; more (up to 400) until one was killed while writing its temporary file.
  int current = 0, replaced = 0, kept = 0, mid_write = 0, rounds = 0;
  for (; rounds < 40 || (mid_write == 0 && rounds < 400); ++rounds) {
    const int target = 1 + rounds % 2;
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(ready[0]);
      const char go = 1;
      if (::write(ready[1], &go, 1) != 1) ::_exit(2);
      try {
        write_safetensors(path, next[target - 1]);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    ::close(ready[1]);
    char go = 0;
    REQUIRE(::read(ready[0], &go, 1) == 1);
    ::close(ready[0]);
    ::usleep(static_cast<useconds_t>(delay(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const bool finished = WIFEXITED(status);
    if (finished) CHECK(WEXITSTATUS(status) == 0);
    const int found = version_in(path);
    INFO("round " << rounds << ": the file holds version " << found << ", expected " << current
                  << " (old) or " << target << " (new)");
    REQUIRE((found == current || found == target));
    if (finished) CHECK(found == target);
    (found == target ? replaced : kept) += 1;
    if (temporaries(path) > 0) ++mid_write;
    remove_temporaries(path);
    current = found;
  }
  MESSAGE("kill test: " << rounds << " writers (" << write_us << " us per write): " << replaced
                        << " replaced the file, " << kept << " left the old one, " << mid_write
                        << " killed while writing their temporary file");
  CHECK(mid_write > 0);
}
