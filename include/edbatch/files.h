// Files written whole or not at all.
#pragma once
#include <fstream>
#include <functional>
#include <istream>
#include <ostream>
#include <string>

namespace edbatch {

// Writes `path` through a temporary file in the same folder ("<path>.tmp.<pid>.<n>"), flushed to
// disk and then renamed over `path`: a reader, or a process killed mid-write, sees the old file
// or the complete new one, never a part. `write` gets a binary stream on the temporary file;
// when it throws, or anything fails, the temporary file is removed and `path` is left as it was.
// An existing `path` keeps its permissions; a symbolic link is written through; a path that
// exists and is not a regular file (a pipe, /dev/null) is written directly, and one that names a
// file descriptor (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N) is written into that
// descriptor where it stands (standard output redirected to a file with >> is appended to, not
// replaced; stdout and stderr are flushed first). Throws
// std::runtime_error "[write_file_atomically] '<path>': ..." naming the failed step.
void write_file_atomically(const std::string& path,
                           const std::function<void(std::ostream&)>& write);

// The file write_file_atomically writes for `path`: its symbolic links followed, to the file a
// link names even where that file does not exist yet.
std::string write_target(const std::string& path);

// The file descriptor `path` names (/dev/stdout 1, /dev/stderr 2, /dev/fd/N and /proc/self/fd/N
// N), else -1.
int path_descriptor(const std::string& path);

// Opens `path` for reading (`mode` adds to std::ios::in, e.g. binary). Throws
// std::invalid_argument "[<fn>] cannot open '<path>': <why>" when it does not exist, is a
// directory, or cannot be read: every loader opens its files through this one check.
std::ifstream open_input(const std::string& path, const char* fn,
                         std::ios::openmode mode = std::ios::in);

// A line of a UTF-8 text file as std::getline read it, made ready to split into words: a final
// '\r' (Windows line endings) and a byte order mark at its start (as editors on Windows write at
// the start of a file, and files joined with cat have at a line's start) are removed. Throws
// std::invalid_argument "[<fn>] <source>:<line>:<column>: ..." for a NUL byte (a UTF-16 or binary
// file), a carriage return inside the line (old Mac line endings), a byte order mark past its
// start, or bytes that are not UTF-8, so that such a file is refused instead of being read as other
// words.
void prepare_text_line(std::string& line, const char* fn, const std::string& source,
                       size_t line_no);

}  // namespace edbatch
