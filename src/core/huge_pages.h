// Advice to the kernel about large buffers (Linux; elsewhere nothing).
#pragma once

#include <cstddef>

namespace edbatch {

// Asks for transparent huge pages over the whole pages of [p, p + bytes) when it spans at least
// 8 MiB, before its first touch: filling a large weight, a stacked copy of weights or a grown
// arena then page-faults once per 2 MiB instead of once per 4 KiB, which dominates a large model's
// setup where faults are slow (virtual machines). Advice only: ignored where huge pages are off.
void advise_huge_pages(const void* p, size_t bytes);

}  // namespace edbatch
