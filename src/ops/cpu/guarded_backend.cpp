// guarded_backend.cpp — see guarded_backend.h.
#include "ops/cpu/guarded_backend.h"

#include <type_traits>

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"

namespace attnres {

namespace {

// Every live allocation of the guarded backends and whether an op is running
// (depth > 0: all of them unlocked).  Ops are called from one host thread at a
// time per Context; the mutex keeps two Contexts' calls from interleaving.
struct Guard {
  std::recursive_mutex mutex;
  std::map<void*, size_t> allocations;
  int depth = 0;
  void protect_all(int prot) {
    for (const auto& [p, n] : allocations)
      ATTNRES_CHECK(::mprotect(p, n, prot) == 0, "mprotect: ", std::strerror(errno));
  }
};
Guard& guard() {
  static Guard* g = new Guard;  // never destroyed: Buffers released at exit still find it
  return *g;
}

void open_all() {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  if (guard().depth++ == 0) guard().protect_all(PROT_READ | PROT_WRITE);
}
void close_all() {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  ATTNRES_CHECK(guard().depth > 0, "unmap without map");
  if (--guard().depth == 0) guard().protect_all(PROT_NONE);
}

// Backend memory open to the host for one op or transfer.
class Unlocked {
 public:
  Unlocked() : lock_(guard().mutex) { open_all(); }
  ~Unlocked() { close_all(); }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

void release(void* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  guard().allocations.erase(p);
  ::munmap(p, bytes);
}

}  // namespace

Buffer GuardedCpuBackend::alloc(size_t bytes, bool /*lazy: every page is backed when first touched anyway*/) {
  if (bytes == 0) return {};
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  const int prot = guard().depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;  // allocated inside an op: open
  void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot allocate ", bytes, " bytes: ", std::strerror(errno));
  guard().allocations[p] = bytes;
  return {p, bytes, &release};
}

namespace {

// ---- every pointer an op is given is backend memory ----------------------

bool inside(const void* p) {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  const auto& a = guard().allocations;
  auto it = a.upper_bound(const_cast<void*>(p));
  if (it == a.begin()) return false;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
}

void expect_inside(const char* op, const void* p, const char* what) {
  ATTNRES_CHECK(!p || inside(p), op, ": ", what, " is not memory of this backend (a host array given to an op?)");
}

// The arguments of an op, one by one: pointers, and the pointers inside the
// argument records; numbers and flags pass.
template <class T>
void check_arg(const char* op, T* p) {
  expect_inside(op, p, "a pointer argument");
}
// Numbers and flags pass; a record of any other kind is a compile error here
// until it has an overload of its own that checks the pointers it holds.
template <class T>
void check_arg(const char*, const T&) {
  static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>,
                "an op argument of a new kind: give check_arg an overload that checks its pointers");
}
void check_arg(const char*, const AdamWUpdate&) {}  // numbers only
void check_arg(const char* op, const Weight& W) {
  expect_inside(op, W.f32, "a weight");
  expect_inside(op, W.b16, "a bf16 weight");
}
void check_arg(const char* op, const Rows& r) {
  expect_inside(op, r.f32, "float32 rows");
  expect_inside(op, r.b16, "bf16 rows");
}
void check_arg(const char* op, const RowsOut& r) { check_arg(op, Rows(r)); }
void check_arg(const char* op, const KeyValues& kv) {
  expect_inside(op, kv.k, "the keys");
  expect_inside(op, kv.v, "the values");
  expect_inside(op, kv.slot, "the KV-cache slots");
  expect_inside(op, kv.pos, "the KV-cache positions");
}
void check_arg(const char* op, const RouteRebuild* r) {  // a host record: its pointers are checked
  if (!r) return;
  expect_inside(op, r->out, "rebuild.out");
  expect_inside(op, r->logits, "rebuild.logits");
  expect_inside(op, r->src, "rebuild.src");
  expect_inside(op, r->base, "rebuild.base");
  expect_inside(op, r->gate, "rebuild.gate");
  expect_inside(op, r->w, "rebuild.w");
  expect_inside(op, r->gamma, "rebuild.gamma");
}
template <class... A>
void check_args(const char* op, const A&... args) {
  (check_arg(op, args), ...);
}

}  // namespace

void* GuardedCpuBackend::map(void* p, size_t) {
  ATTNRES_CHECK(inside(p), "map: not memory of this backend");
  open_all();
  return p;
}
void GuardedCpuBackend::unmap(void*, size_t) { close_all(); }

GuardedCpuBackend::GuardedCpuBackend(Context& ctx, std::unique_ptr<CpuBackend> cpu, std::vector<Op> unsupported)
    : WrappingBackend(ctx, *cpu), cpu_(std::move(cpu)) {
  cpu_->check_memory_with(&inside);  // the routing ops' source lists: inside our allocations
  for (Op op : unsupported) unsupported_[static_cast<size_t>(op)] = true;
}

void GuardedCpuBackend::host_access(bool open) {
  if (open) open_all();
  else close_all();
}

void GuardedCpuBackend::upload(void* dst, const void* host_src, size_t bytes) {
  expect_inside("upload", dst, "the destination");
  Unlocked open;
  cpu_->upload(dst, host_src, bytes);
}
void GuardedCpuBackend::download(void* host_dst, const void* src, size_t bytes) {
  expect_inside("download", src, "the source");
  Unlocked open;
  cpu_->download(host_dst, src, bytes);
}

#define ATTNRES_GUARDED(fam, ret, name, params, args) \
  ret GuardedCpuBackend::name##_impl params {           \
    check_args(#name, ATTNRES_UNPAREN args);     \
    Unlocked open;                               \
    return name##_of(*cpu_, ATTNRES_UNPAREN args); \
  }
ATTNRES_BACKEND_OPS(ATTNRES_GUARDED)
#undef ATTNRES_GUARDED

}  // namespace attnres
