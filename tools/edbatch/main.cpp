// `edbatch`: the command line. Exit codes: 0 ok, 1 runtime error, 2 usage error; errors go to
// stderr as "edbatch <command>: <message>".
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "tools/edbatch/commands.h"
#include "tools/edbatch/interrupt.h"

namespace {

// --help, its text lost (standard output on a full disk) an error as the table's is.
int help(CLI::App& app, const CLI::Error& e) {
  const int code = app.exit(e);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "edbatch: writing to standard output failed: %s\n", std::strerror(errno));
    return 1;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace edbatch::cli;
  // A standard stream left closed (2>&-, a daemon's launcher) would be the next file opened, a
  // weights file's temporary, and a message written to it (Ctrl-C's) would land inside that
  // file: /dev/null takes its place.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF &&
        ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd)
      return 1;
  // A file-size limit (ulimit -f) is an error of the write that meets it (reported, the other
  // files written, no temporary left), not a signal that ends the run without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"edbatch: dynamic batching of tree, lattice and DAG networks"};
  app.require_subcommand(1);
  std::vector<Command> commands = {add_run_command(app), add_train_command(app)};
  for (const Command& c : commands) decimal_integers(*c.app);

  auto prefix = [&]() -> std::string {
    for (const Command& c : commands)
      if (argc > 1 && c.app->check_name(argv[1])) return "edbatch " + c.app->get_name() + ": ";
    return "edbatch: ";
  };
  // CLI11 would only say that a subcommand is required.
  if (argc > 1 && argv[1][0] != '-' && prefix() == "edbatch: ") {
    std::string names;
    for (const Command& c : commands) names += (names.empty() ? "" : " or ") + c.app->get_name();
    std::fprintf(stderr,
                 "edbatch: unknown command '%s' (expected %s)\nRun with --help for more "
                 "information.\n",
                 argv[1], names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return help(app, e);
  } catch (const CLI::CallForAllHelp& e) {
    return help(app, e);
  } catch (const CLI::ConversionError& e) {
    std::fprintf(stderr, "%s%s\nRun with --help for more information.\n", prefix().c_str(),
                 conversion_message(app, e).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s%s\nRun with --help for more information.\n", prefix().c_str(),
                 e.what());
    return 2;
  }
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    try {
      refuse_empty_values(*c.app);
      InterruptScope interrupts;
      const int code = c.run();
      // A table or description redirected to a full disk is output lost.
      if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        std::fprintf(stderr, "%swriting to standard output failed: %s\n", prefix().c_str(),
                     std::strerror(errno));
        return 1;
      }
      if (code == 0 && interrupt_signal() != 0) {
        // Its files written, the process ends by the signal, so that a calling shell or script
        // stops too (it would go on after an ordinary exit).
        std::fprintf(stderr, "%sstopped by %s\n", prefix().c_str(), interrupt_name());
        std::fflush(stderr);
        const int sig = interrupt_signal();
        std::signal(sig, SIG_DFL);
        std::raise(sig);
        return interrupt_exit_code();
      }
      return code;
    } catch (const UsageError& e) {
      std::fprintf(stderr, "%s%s\nRun with --help for more information.\n", prefix().c_str(),
                   e.what());
      return 2;
    } catch (const std::bad_alloc& e) {
      // The library's own say what could not grow ("[cpu] out of memory: ...").
      const bool plain = std::strchr(e.what(), '[') == nullptr;
      std::fprintf(stderr, "%s%s%s: try a smaller --batch, --hidden or --vocab-size\n",
                   prefix().c_str(), plain ? "out of memory: " : "", e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s%s\n", prefix().c_str(), e.what());
      return 1;
    }
  }
  return 2;
}
