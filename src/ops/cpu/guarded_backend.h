// guarded_backend.h — the CPU backend with its memory locked: a test backend
// ("cpu-guarded") whose allocations the host cannot read or write except
// inside an op or an explicit transfer.
//
// Every allocation is mapped PROT_NONE.  Each op and each upload/download
// unlocks all of this backend's allocations for the call (PROT_READ|WRITE)
// and locks them again when it returns, and map() … unmap() keeps them open
// between (a counter lets an op call another, and views nest).
// And every pointer an op is given (the arrays inside a KeyValues, a Weight,
// a RouteRebuild and the routing source lists included) must lie inside one
// of the allocations: a host array passed to an op is an internal error
// naming the op.  The kernels are a CpuBackend's, so results are its bits;
// what changes is that a host access that bypasses the interface — reading
// an arena in place, handing an op a host array, as a GPU backend would not
// allow — fails in a test (SIGSEGV, or the error) instead of waiting for a
// GPU to find it.  `--device cpu-guarded` runs any command on it (slow:
// two mprotect sweeps per op).
#pragma once

#include <array>
#include <vector>

#include "ops/cpu/cpu_backend.h"
#include "ops/wrapping_backend.h"

namespace attnres {

class GuardedCpuBackend final : public WrappingBackend {
 public:
  // cpu: the kernels it runs (make_cpu_backend), at any level.  unsupported:
  // ops it declares it does not run (supports() says no), so that a
  // PartialBackend gives them to the CPU — the seam exercised on every
  // machine (`--device cpu-guarded:unsupported=OP,...`).  Its names, peaks
  // and workspaces are the CPU's (WrappingBackend); its memory is its own.
  GuardedCpuBackend(Context& ctx, std::unique_ptr<CpuBackend> cpu, std::vector<Op> unsupported = {});
  bool supports(Op op, Precision) const override { return !unsupported_[static_cast<size_t>(op)]; }
  bool host_addressable() const override { return true; }
  void host_access(bool open) override;  // opens the memory until host_access(false)
  const char* name() const override { return "cpu-guarded"; }

  Buffer alloc(size_t bytes, bool lazy) override;
  void synchronize() override {}
  void* map(void* p, size_t bytes) override;   // opens the memory until unmap
  void unmap(void* p, size_t bytes) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;

 protected:
#define ATTNRES_DECLARE(fam, ret, name, params, args) ret name##_impl params override;
  ATTNRES_BACKEND_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE

 private:
  std::unique_ptr<CpuBackend> cpu_;
  std::array<bool, kOps> unsupported_{};
};

}  // namespace attnres
