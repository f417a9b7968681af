// mapped_file.cpp — see mapped_file.h.
#include "io/mapped_file.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace attnres {

namespace {

// The registry the handler reads: fixed slots, published by `state`, so that
// reading it from a signal handler needs no lock and no allocation.
constexpr int kSlots = 4096;
constexpr size_t kPathBytes = 512;
struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being written or cleared, 2 live
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> bytes{0};
  char path[kPathBytes] = {};
};
Slot g_slots[kSlots];
struct sigaction g_previous;

void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t k = ::write(2, s, n);
    if (k <= 0) return;
    s += k;
    n -= static_cast<size_t>(k);
  }
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != 2 || a < s.begin || a >= s.begin + s.bytes) continue;
    write_str("attnres: error: ");
    write_str(s.path);
    write_str(": the file changed while in use (truncated or unreadable): reading it raised SIGBUS\n");
    ::_exit(1);
  }
  // Not ours: what would have happened without us.
  ::sigaction(SIGBUS, &g_previous, nullptr);
  ::raise(sig);
}

void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

void* map_file(const std::string& path, int fd, size_t bytes, int flags) {
  static std::once_flag once;
  std::call_once(once, install_handler);
  void* p = ::mmap(nullptr, bytes, PROT_READ, flags, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  for (Slot& s : g_slots) {
    int free = 0;
    if (!s.state.compare_exchange_strong(free, 1)) continue;
    s.begin = reinterpret_cast<uintptr_t>(p);
    s.bytes = bytes;
    std::strncpy(s.path, path.c_str(), kPathBytes - 1);
    s.path[kPathBytes - 1] = '\0';
    s.state.store(2, std::memory_order_release);
    break;
  }  // (all slots taken: mapped unregistered; a SIGBUS there is the default crash)
  return p;
}

void unmap_file(void* p, size_t bytes) {
  if (!p) return;
  for (Slot& s : g_slots) {
    int live = 2;
    if (s.begin != reinterpret_cast<uintptr_t>(p) || !s.state.compare_exchange_strong(live, 1)) continue;
    s.begin = 0;
    s.bytes = 0;
    s.state.store(0, std::memory_order_release);
    break;
  }
  ::munmap(p, bytes);
}

}  // namespace attnres
