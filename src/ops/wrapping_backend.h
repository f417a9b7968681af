// wrapping_backend.h — a backend over another one: its names, the precisions
// it runs, its peaks, its workspace sizes and its memory functions are the
// inner backend's, each overridable.  What the timed, guarded and partial
// backends (and the tests' backends) share; each writes its ops (from the op
// list, op_list.h) and what differs.
#pragma once

#include "ops/backend.h"

namespace attnres {

class WrappingBackend : public Backend {
 public:
  // inner must outlive this object (the derived class owns it).
  WrappingBackend(Context& ctx, Backend& inner) : Backend(ctx), wrapped_(inner) {}

  const char* name() const override { return wrapped_.name(); }
  const char* kernels() const override { return wrapped_.kernels(); }
  const char* attention_tiles() const override { return wrapped_.attention_tiles(); }
  std::string unsupported(Precision p) const override { return wrapped_.unsupported(p); }
  bool supports(Op op, Precision p) const override { return wrapped_.supports(op, p); }
  bool host_addressable() const override { return wrapped_.host_addressable(); }
  void host_access(bool open) override { wrapped_.host_access(open); }
  double peak_gflops(Precision p) const override { return wrapped_.peak_gflops(p); }
  const char* peak_name(Precision p) const override { return wrapped_.peak_name(p); }

  int64_t matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const override {
    return wrapped_.matmul_workspace(N, I, O, p);
  }
  int64_t attention_workspace(int64_t max_keys, int64_t hd, Precision p) const override {
    return wrapped_.attention_workspace(max_keys, hd, p);
  }
  int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const override {
    return wrapped_.lm_head_workspace(C, V, p);
  }
  int64_t route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const override {
    return wrapped_.route_workspace(N, d, S, H);
  }

  Buffer alloc(size_t bytes, bool lazy) override { return wrapped_.alloc(bytes, lazy); }
  void synchronize() override { wrapped_.synchronize(); }
  void* map(void* p, size_t bytes) override { return wrapped_.map(p, bytes); }
  void unmap(void* p, size_t bytes) override { wrapped_.unmap(p, bytes); }
  void upload(void* dst, const void* host_src, size_t bytes) override { wrapped_.upload(dst, host_src, bytes); }
  void download(void* host_dst, const void* src, size_t bytes) override { wrapped_.download(host_dst, src, bytes); }

 protected:
  Backend& wrapped() const { return wrapped_; }

 private:
  Backend& wrapped_;
};

}  // namespace attnres
